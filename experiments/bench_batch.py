"""Benchmark: `hetpart predict --plans` on random valid plans of a 1,024-GPU, three-type cluster.

Scoring many candidate plans must not pay a process start each: this writes ``--plans`` seeded random
valid plans (tensor-parallel degree 1-8 inside a node, 1-32 pipeline stages over shuffled or
speed-sorted device groups, random or speed-proportional layer cuts, even or speed-proportional batch
shares, any recompute mode) of llama2-70b to one JSONL file and times ONE ``hetpart predict --plans
FILE --json`` process, start included, and its CPU time (the shared machine's load moves the wall time),
its forked workers' included (``--jobs``: what the process is given; 0, the default, is one per core).

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_batch [--plans 1000] [--jobs 0]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["CLUSTER_YAML", "random_plan", "main"]

CLUSTER_YAML = """name: mixed-1024
nodes:
  - {count: 48, gpus_per_node: 8, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR, nics_per_node: 8, zone: north}
  - {count: 64, gpus_per_node: 8, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR, nics_per_node: 8, zone: north}
  - {count: 16, gpus_per_node: 8, gpu: MI250X-GCD-64GB, intra_node: xGMI, nic: RoCE-200, nics_per_node: 4, zone: south}
links:
  - {zones: [north, south], bandwidth_gbit_s: 400, latency_us: 30}
"""
"""1,024 GPUs of three types in two zones (128 nodes of 8)."""
_SPEED = {0: 989.0, 1: 312.0, 2: 191.0}
"""Dense bf16 TFLOPS of each node group's GPU (to bias some plans toward sensible layouts)."""
_NODES = [(0, 48), (1, 64), (2, 16)]


def _cuts(rng: random.Random, units: int, speeds: list[float]) -> list[int]:
    pp = len(speeds)
    if pp == 1:
        return [0, units]
    if rng.random() < 0.5:  # in proportion to stage speed
        bounds, acc = [0], 0.0
        for i in range(pp - 1):
            acc += speeds[i] / sum(speeds)
            bounds.append(min(max(round(acc * units), bounds[-1] + 1), units - (pp - 1 - i)))
        return bounds + [units]
    return [0] + sorted(rng.sample(range(1, units), pp - 1)) + [units]


def random_plan(rng: random.Random, units: int, global_batch: int, seq_len: int) -> dict:
    """One random valid plan in the plan JSON format."""
    tp = rng.choice([1, 2, 4, 8])
    slots = [[f"{g}/{n}/{s * tp + i}" for i in range(tp)] for g, count in _NODES for n in range(count)
             for s in range(8 // tp)]
    speed = {slot[0]: _SPEED[int(slot[0].split("/")[0])] * tp for slot in slots}
    order = rng.random()
    if order < 0.3:
        rng.shuffle(slots)
    elif order < 0.6:
        slots.sort(key=lambda s: -speed[s[0]])
    pp = rng.choice([p for p in (1, 2, 4, 8, 16, 32) if p <= min(len(slots), units)])
    dp = len(slots) // pp
    if rng.random() < 0.3 and dp > 1:
        dp = rng.randint(1, dp)
    micro_batch = rng.choice([1, 1, 2, 4])
    total = max(1, global_batch // micro_batch)
    dp = min(dp, total)
    groups = [slots[i * pp:(i + 1) * pp] for i in range(dp)]
    counts = [total // dp + (1 if i < total % dp else 0) for i in range(dp)]
    if dp > 1 and rng.random() < 0.5:  # batch in proportion to replica speed
        rates = [min(speed[s[0]] for s in g) for g in groups]
        counts = [max(1, int(total * r / sum(rates))) for r in rates]
        counts[rates.index(max(rates))] += total - sum(counts)
    replicas = []
    for stages, count in zip(groups, counts):
        b = _cuts(rng, units, [speed[s[0]] for s in stages])
        replicas.append({"batch_share": count * micro_batch / global_batch,
                         "stages": [{"layers": [b[i], b[i + 1]], "devices": stages[i], "tp": tp} for i in range(pp)]})
    return {"global_batch": global_batch, "micro_batch": micro_batch, "seq_len": seq_len, "schedule": "1f1b",
            "recompute": rng.choice(["none", "selective", "full"]), "replicas": replicas}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=0, help="predict --jobs (0: one process per core)")
    args = parser.parse_args(argv)
    from hetpart import load_model

    model, global_batch, seq_len = "llama2-70b", 1024, 4096
    units = load_model(model, seq_len=seq_len).num_units
    rng = random.Random(args.seed)
    hetpart = str(Path(sys.executable).with_name("hetpart"))
    with tempfile.TemporaryDirectory() as tmp:
        cluster, plans = Path(tmp, "mixed-1024.yaml"), Path(tmp, "plans.jsonl")
        cluster.write_text(CLUSTER_YAML)
        plans.write_text("".join(json.dumps(random_plan(rng, units, global_batch, seq_len)) + "\n"
                                 for _ in range(args.plans)))
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run([hetpart, "predict", "--model", model, "--cluster", str(cluster), "--global-batch",
                               str(global_batch), "--seq-len", str(seq_len), "--plans", str(plans), "--json",
                               "--jobs", str(args.jobs)],
                              capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - start
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"predict --plans failed: {proc.stderr.strip()[-300:]}")
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    valid = sum("metrics" in a for a in answers)
    print(f"{len(answers)} plans of {model} on mixed-1024 ({valid} valid) in one predict call, --jobs {args.jobs} "
          f"({os.cpu_count()} cores): wall {wall:.1f} s "
          f"({len(answers) / wall:.0f} plans/s, start included), CPU {cpu.ru_utime + cpu.ru_stime:.1f} s "
          f"({len(answers) / (cpu.ru_utime + cpu.ru_stime):.0f} plans per CPU-second); load average before "
          f"{load:.1f}, after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
