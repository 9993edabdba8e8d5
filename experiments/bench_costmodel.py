"""Benchmark: the learned surrogate's batched speed and its agreement with the simulator.

* ``speed``: plan predictions per second of a learned predictor's ``estimate_batch`` (encoding and the
  forward pass, one call per batch; wall time and this process's CPU time, which a shared machine's
  load does not inflate) on seeded random valid plans, for clusters of 8 to 512 devices
  and models of 26 to 82 units; the simulator's ``estimate`` on the same plans beside it.
* ``train-step``: seconds per training step of the surrogate (one scenario of a data set: forward,
  loss, backward, Adam) on the CPU with 1 and 4 threads and on CUDA when torch sees one (the second
  pass over 40 training scenarios; the first warms up).
* ``accuracy``: per suite entry (the public scenarios), step-time error and Kendall tau of the
  learned predictor against the simulator on seeded random valid plans, and the simulator's own
  value of the plan the surrogate ranks first against the best one (top-1 regret), over seeds.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_costmodel speed``
     ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_costmodel train-step --dataset runs/costmodel/dataset.pt``
     ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_costmodel accuracy --suite SUITE.yaml [...]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import numpy as np

__all__ = ["speed", "train_step", "accuracy", "main"]


def _cluster(devices: int):
    from hetpart.cluster import parse_cluster

    nodes = max(1, devices // 16)
    node = {"gpus_per_node": 8, "nic": "IB-HDR", "nics_per_node": 4}
    return parse_cluster({"name": f"mixed-{devices}", "nodes": [
        {"count": nodes, "gpu": "H100-80GB", "intra_node": "NVLink4", **node},
        {"count": nodes, "gpu": "A100-80GB", "intra_node": "NVLink3", **node}]})


def _plans(model, cluster, n: int, seed: int, batch: int = 512):
    from hetpart.costmodel.learned.sampling import random_plan

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p = random_plan(rng, model, cluster, batch)
        if p is not None and p.num_devices == cluster.num_devices and not p.validate(model, cluster):
            out.append(p)
    return out


def _predictor(name: str, model, cluster):
    from hetpart.costmodel.predictor import get_predictor

    return get_predictor(name, model, cluster)


def speed(devices=(16, 64, 256), models=("gpt3-1.3b", "llama2-7b", "llama2-70b"), plans: int = 1000,
          batch: int = 1000, predictor: str = "learned") -> list[dict]:
    """Predictions per second, learned (batched) and simulator, per (devices, model): ``cold`` on
    plans the predictor has not seen (new leaf costs, new ring shapes), ``warm`` a second pass over
    the same plans (what a planner's loop over one scenario reaches once its caches fill)."""
    from hetpart import load_model
    from hetpart.costmodel.simulator import Simulator

    if predictor == "learned":
        import torch

        torch.set_num_threads(1)
    rows = []
    for d in devices:
        cluster = _cluster(d)
        for name in models:
            model = load_model(name, seq_len=2048)
            ps = _plans(model, cluster, plans, seed=d)
            pred = _predictor(predictor, model, cluster)
            pred.estimate_batch(ps[:8])  # warm the caches (unit features) as a planner's loop would
            t, c = time.perf_counter(), time.process_time()
            for i in range(0, len(ps), batch):
                pred.estimate_batch(ps[i:i + batch])
            learned = len(ps) / (time.perf_counter() - t)
            learned_cpu = len(ps) / (time.process_time() - c)
            t, c = time.perf_counter(), time.process_time()
            for i in range(0, len(ps), batch):
                pred.estimate_batch(ps[i:i + batch])
            warm = len(ps) / (time.perf_counter() - t)
            warm_cpu = len(ps) / (time.process_time() - c)  # per second of this process's CPU time (one thread)
            sim = Simulator(model, cluster)
            some = ps[:200]
            t, c = time.perf_counter(), time.process_time()
            for p in some:
                sim.estimate(p)
            simulated = len(some) / (time.perf_counter() - t)
            simulated_cpu = len(some) / (time.process_time() - c)
            stages = sum(len(r.stages) for p in ps for r in p.replicas) / len(ps)
            rows.append({"predictor": predictor, "devices": d, "model": name, "units": model.num_units,
                         "stages_per_plan": round(stages, 1), "learned_plans_per_s": round(learned),
                         "learned_plans_per_cpu_s": round(learned_cpu), "warm_plans_per_s": round(warm),
                         "warm_plans_per_cpu_s": round(warm_cpu), "simulator_plans_per_s": round(simulated),
                         "simulator_plans_per_cpu_s": round(simulated_cpu)})
            print(rows[-1], flush=True)
    return rows


def train_step(dataset: str, scenarios: int = 40) -> dict[str, float]:
    """Seconds per training step on the CPU (1 and 4 threads) and on CUDA (when available)."""
    import torch

    from hetpart.costmodel.learned.dataset import load_dataset
    from hetpart.costmodel.learned.surrogate import Surrogate
    from hetpart.costmodel.learned.train import TrainConfig, _loss, _prepare

    _, records = load_dataset(dataset)
    recs = [r for r in records if r["split"] == "train"][:scenarios]
    out = {}
    for dev, threads in (("cpu", 1), ("cpu", 4), ("cuda", 1)):
        if dev == "cuda" and not torch.cuda.is_available():
            continue
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        data = _prepare(recs, dev)
        model = Surrogate().to(dev)
        opt = torch.optim.Adam(model.parameters(), 3e-3)
        cfg = TrainConfig()
        for _ in range(2):  # the first pass warms up (kernels, allocator)
            t = time.perf_counter()
            for _, tb, y in data:
                loss, _ = _loss(model, tb, y, cfg)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if dev == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
        out[f"{dev}_threads{threads}_s_per_step"] = dt / len(data)
        print(dev, threads, f"{dt / len(data) * 1e3:.1f} ms/step", flush=True)
    return out


def accuracy(suites: list[str], plans: int = 200, seeds: int = 5, predictor: str = "learned") -> list[dict]:
    """Per suite entry: error and Kendall tau of the learned predictor against the simulator."""
    import yaml

    from hetpart import load_cluster, load_model
    from hetpart.costmodel.learned.closed import kendall_tau
    from hetpart.costmodel.simulator import Simulator

    rows = []
    for suite in suites:
        base = Path(suite).parent
        for e in yaml.safe_load(Path(suite).read_text())["entries"]:
            if e["name"].startswith("scale"):
                continue
            cl = e["cluster"] if not str(e["cluster"]).endswith(".yaml") else str(base / e["cluster"])
            mdl = e["model"] if not str(e["model"]).endswith(".json") else str(base / e["model"])
            model, cluster = load_model(mdl, seq_len=e["seq_len"]), load_cluster(cl)
            sim, pred = Simulator(model, cluster), _predictor(predictor, model, cluster)
            errs, taus, regrets = [], [], []
            for seed in range(seeds):
                ps = _any_plans(model, cluster, plans, seed, e["global_batch"])
                y = np.array([sim.estimate(p).step_time_s for p in ps])
                yh = np.array([x.step_time_s for x in pred.estimate_batch(ps)])
                errs.append(float(np.mean(np.abs(yh / y - 1)) * 100))
                taus.append(kendall_tau(yh, y))
                regrets.append(float(y[int(np.argmin(yh))] / y.min() - 1) * 100)
            rows.append({"entry": e["name"], "plans": len(ps), "error_pct": statistics.mean(errs),
                         "error_std": statistics.pstdev(errs), "tau_mean": statistics.mean(taus),
                         "tau_std": statistics.pstdev(taus), "top1_regret_pct": statistics.mean(regrets)})
            print(rows[-1], flush=True)
    return rows


def _any_plans(model, cluster, n: int, seed: int, batch: int):
    """Random valid plans (any number of devices)."""
    from hetpart.costmodel.learned.sampling import random_plan

    rng = random.Random(1000 + seed)
    out = []
    while len(out) < n:
        p = random_plan(rng, model, cluster, batch)
        if p is not None and not p.validate(model, cluster):
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["speed", "train-step", "accuracy"])
    ap.add_argument("--dataset", default="runs/costmodel/dataset.pt")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--plans", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--predictor", default="learned", help="learned (closed form) or learned-graph")
    ap.add_argument("--devices", default="16,64,256")
    args = ap.parse_args(argv)
    if args.what == "speed":
        speed(tuple(int(d) for d in args.devices.split(",")), plans=args.plans or 1000, predictor=args.predictor)
    elif args.what == "train-step":
        train_step(args.dataset)
    else:
        rows = accuracy(args.suite, plans=args.plans or 200, seeds=args.seeds, predictor=args.predictor)
        if rows:
            print({"mean_error_pct": statistics.mean(r["error_pct"] for r in rows),
                   "mean_tau": statistics.mean(r["tau_mean"] for r in rows),
                   "min_tau": min(r["tau_mean"] for r in rows),
                   "mean_top1_regret_pct": statistics.mean(r["top1_regret_pct"] for r in rows)}, flush=True)


if __name__ == "__main__":
    main()
