"""Benchmark: sharded data parallelism (issue 10) -- Llama 3 405B's published layout, catalog reach,
uneven shard fractions on mixed-memory clusters.

1. Llama 3 405B on 16,384 H100-80GB with its published layout (TP 8, PP 16 interleaved x4, DP 128,
   sequence 8192, global batch 2048, micro-batch 1) at every ZeRO level: fits, peak memory, predicted
   model TFLOPS per GPU against the published 400.
2. Catalog reach: every catalog model up to 405B planned on 1,024 and on 16,384 H100 with ``uniform``
   (Megatron's grid, falling back to sharding where nothing fits; the search over every catalog model
   at 16,384 GPUs takes longer than this benchmark's budget), global batch 2048 / 4096, each model's own
   sequence length (at most 8192): fits, the level chosen, TFLOPS, planning time.
3. Mixed-memory clusters (80 GB next to 16-24 GB devices): search without sharding (``--zero 0``), with
   even shards (``--zero 1``), and with uneven shard fractions (``uneven_shards``): tokens/s and fit.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_sharded`` (``make bench BENCH=sharded``).
"""

from __future__ import annotations

import argparse
import os
import time

__all__ = ["published_405b", "catalog_reach", "mixed_memory", "section", "main"]

CATALOG = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b",
           "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "opt-350m",
           "bert-large")


def _h100(gpus: int, nic: str = "IB-NDR"):
    from hetpart.cluster import parse_cluster

    return parse_cluster({"name": f"h100-{gpus}", "nodes": [{"count": gpus // 8, "gpus_per_node": 8, "gpu": "H100-80GB",
                                                            "intra_node": "NVLink4", "nic": nic, "nics_per_node": 8}]})


def published_405b() -> list[dict]:
    """Per ZeRO level: the published layout's prediction."""
    from hetpart import Workload, load_model
    from hetpart.costmodel import Simulator, megatron_plan

    model, cluster = load_model("llama3-405b", seq_len=8192), _h100(16384, "RoCE-400")
    sim = Simulator(model, cluster)
    rows = []
    for zero in (0, 1, 2, 3):
        plan = megatron_plan(model, cluster, Workload(2048, 8192, zero=zero), tp=8, pp=16, dp=128, micro_batch=1,
                             schedule="interleaved", interleave=4)
        m = sim.simulate(plan).metrics
        rows.append({"zero": zero, "fits": m["fits_in_memory"], "peak_gb": m["peak_memory_gb"]["H100-80GB"],
                     "tflops": m["model_tflops_per_device"], "step_s": m["step_time_s"]})
    return rows


def catalog_reach(models=CATALOG, sizes=((1024, "uniform", 2048), (16384, "uniform", 4096))) -> list[dict]:
    """Every model on every cluster size: plan, fit, level, model TFLOPS per GPU, planning time."""
    from hetpart import Workload, load_model
    from hetpart.errors import HetpartError
    from hetpart.policies import plan

    rows = []
    for gpus, planner, batch in sizes:
        cluster = _h100(gpus)
        for name in models:
            seq = min(8192, _positions(name))
            graph = load_model(name, seq_len=seq)
            start = time.perf_counter()
            try:
                result = plan(graph, cluster, Workload(batch, seq), planner)
                m = result.prediction.metrics
                rows.append({"model": name, "gpus": gpus, "planner": planner, "seq": seq, "fits": m["fits_in_memory"],
                             "zero": result.plan.zero, "tflops": m["model_tflops_per_device"],
                             "plan_s": time.perf_counter() - start, "error": ""})
            except HetpartError as exc:
                rows.append({"model": name, "gpus": gpus, "planner": planner, "seq": seq, "fits": False, "zero": None,
                             "tflops": 0.0, "plan_s": time.perf_counter() - start, "error": str(exc)[:120]})
    return rows


def _positions(name: str) -> int:
    from hetpart.catalog.models import MODEL_CATALOG

    return int(MODEL_CATALOG[name].max_positions)


MIXED = {
    "A100-80GB x8 + RTX4090-24GB x8": ("A100-80GB", "NVLink3", "RTX4090-24GB", "PCIe4"),
    "H100-80GB x8 + T4-16GB x8": ("H100-80GB", "NVLink4", "T4-16GB", "PCIe3"),
}


def mixed_memory(model_name: str = "llama2-13b", batch: int = 64, seq: int = 2048) -> list[dict]:
    """Search without sharding, with even shards and with uneven fractions on mixed-memory clusters."""
    from hetpart import Workload, load_model
    from hetpart.cluster import parse_cluster
    from hetpart.errors import HetpartError
    from hetpart.policies import plan

    graph = load_model(model_name, seq_len=seq)
    rows = []
    for label, (big, big_link, small, small_link) in MIXED.items():
        cluster = parse_cluster({"name": label, "nodes": [
            {"count": 1, "gpus_per_node": 8, "gpu": big, "intra_node": big_link, "nic": "Ethernet-100"},
            {"count": 1, "gpus_per_node": 8, "gpu": small, "intra_node": small_link, "nic": "Ethernet-100"}]})
        for how, zero, options in (("no sharding", 0, {}), ("even shards", 1, {}),
                                   ("uneven shards", 1, {"uneven_shards": True})):
            start = time.perf_counter()
            try:
                result = plan(graph, cluster, Workload(batch, seq, zero=zero), "search", **options)
                m = result.prediction.metrics
                rows.append({"cluster": label, "how": how, "tokens_per_s": m["tokens_per_s"],
                             "fits": m["fits_in_memory"], "uneven": result.plan.shard_fractions is not None,
                             "devices": result.plan.num_devices, "plan_s": time.perf_counter() - start})
            except HetpartError as exc:
                rows.append({"cluster": label, "how": how, "tokens_per_s": 0.0, "fits": False, "uneven": False,
                             "devices": 0, "plan_s": time.perf_counter() - start, "error": str(exc)[:100]})
    return rows


def section(reach: bool = True):
    from hetpart.experiments.benchdoc import Section, machine

    host = machine()
    pub = published_405b()
    lines = ["### Llama 3 405B, published layout, 16,384 H100 (TP 8, PP 16 interleaved x4, DP 128, seq 8192)", "",
             "| zero | fits | peak GB/GPU | model TFLOPS/GPU | vs published 400 | step s |", "|---|---|---|---|---|---|"]
    for r in pub:
        lines.append(f"| {r['zero']} | {r['fits']} | {r['peak_gb']:.1f} | {r['tflops']:.0f} | "
                     f"{(r['tflops'] - 400) / 400 * 100:+.1f}% | {r['step_s']:.2f} |")
    mixed = mixed_memory()
    lines += ["", "### Mixed-memory clusters: llama2-13b, global batch 64 x 2048, search", "",
              "| cluster | sharding | tokens/s | fits | uneven fractions | devices used | plan s |",
              "|---|---|---|---|---|---|---|"]
    for r in mixed:
        lines.append(f"| {r['cluster']} | {r['how']} | {r['tokens_per_s']:,.0f} | {r['fits']} | {r['uneven']} | "
                     f"{r['devices']} | {r['plan_s']:.1f} |")
    if reach:
        rows = catalog_reach()
        lines += ["", "### Catalog reach on H100 (global batch 2,048 on 1,024 GPUs, 4,096 on 16,384)", "",
                  "| model | GPUs | planner | seq | fits | zero | model TFLOPS/GPU | plan s |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['model']} | {r['gpus']:,} | {r['planner']} | {r['seq']} | {r['fits']} | {r['zero']} | "
                         f"{r['tflops']:.0f} | {r['plan_s']:.1f} |" + (f" {r['error']}" if r["error"] else ""))
    from hetpart.experiments.benchdoc import load

    return Section(key="sharded", title="Sharded data parallelism (issue 10)", body="\n".join(lines) + "\n",
                   command="OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_sharded", machine=host,
                   load_after=load())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-reach", action="store_true", help="skip the catalog reach (the slow part)")
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sec = section(reach=not args.no_reach)
    if args.write:
        from hetpart.experiments.benchdoc import write_section

        print(write_section(sec))
    else:
        print(sec.body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
