"""Benchmark: sharded data parallelism (issue 10) -- Llama 3 405B's published layout, catalog reach,
uneven shard fractions on mixed-memory clusters.

1. Llama 3 405B on 16,384 H100-80GB with its published layout (TP 8, PP 16 interleaved x4, DP 128,
   sequence 8192, global batch 2048, micro-batch 1) at every ZeRO level: fits, peak memory, predicted
   model TFLOPS per GPU against the published 400.
2. Catalog reach: every catalog model up to 405B planned on 1,024 and on 16,384 H100 with ``uniform``
   (Megatron's grid, falling back to sharding where nothing fits; the search over every catalog model
   at 16,384 GPUs takes longer than this benchmark's budget), global batch 2048 / 4096, each model's own
   sequence length (at most 8192): fits, the level chosen, TFLOPS, planning time.
3. Mixed-memory clusters (80 GB next to 16-24 GB devices, :data:`MIXED`): the best plan search finds
   without sharding (``--zero 0``), with even shards (levels 1-3, ``uneven_shards=False``), and with
   uneven shard fractions allowed (levels 1-2, the search's default): tokens/s, level, fractions.
4. Where uneven fractions win (:data:`SWEEP`): one of those clusters (2 A100-80GB + 4 RTX 4090-24GB,
   gpt3-6.7b) with its precision, NIC and global batch varied.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_sharded`` (``make bench BENCH=sharded``).
"""

from __future__ import annotations

import argparse
import os
import time

__all__ = ["published_405b", "catalog_reach", "mixed_memory", "uneven_sweep", "section", "main"]

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


MIXED = (  # (label, model, global batch, seq, nodes: (count, gpus/node, gpu, intra-node link[, NICs/node]), nic)
    ("A100-80GB x8 + RTX4090-24GB x8, Ethernet-100", "llama2-13b", 64, 2048,
     ((1, 8, "A100-80GB", "NVLink3"), (1, 8, "RTX4090-24GB", "PCIe4")), "Ethernet-100"),
    ("H100-80GB x8 + T4-16GB x8, Ethernet-100", "llama2-13b", 64, 2048,
     ((1, 8, "H100-80GB", "NVLink4"), (1, 8, "T4-16GB", "PCIe3")), "Ethernet-100"),
    ("H100-80GB x8 + RTX4090-24GB x8, IB-NDR", "llama2-7b", 64, 2048,
     ((1, 8, "H100-80GB", "NVLink4"), (1, 8, "RTX4090-24GB", "PCIe4")), "IB-NDR"),
    ("A100-80GB x8 + V100-16GB x16, IB-HDR", "llama2-13b", 64, 2048,
     ((1, 8, "A100-80GB", "NVLink3"), (2, 8, "V100-16GB", "NVLink2")), "IB-HDR"),
    ("A100-80GB x4 + L4-24GB x8 (1 per node), Ethernet-100", "gpt3-6.7b", 32, 2048,
     ((1, 4, "A100-80GB", "NVLink3"), (8, 1, "L4-24GB", "PCIe4")), "Ethernet-100"),
    ("H100-80GB x2 + A10-24GB x8, Ethernet-100", "llama2-7b", 32, 2048,
     ((1, 2, "H100-80GB", "NVLink4"), (1, 8, "A10-24GB", "PCIe4")), "Ethernet-100"),
    # small clusters where every device is a data-parallel replica (Cephalo's regime: the model fits each
    # device's compute, not its share of even states)
    ("A100-80GB x2 + V100-16GB x2, IB-HDR", "gpt3-1.3b", 32, 2048,
     ((1, 2, "A100-80GB", "NVLink3"), (1, 2, "V100-16GB", "NVLink2")), "IB-HDR"),
    ("A100-80GB x4 + T4-16GB x4, IB-HDR", "gpt3-1.3b", 64, 2048,
     ((1, 4, "A100-80GB", "NVLink3"), (1, 4, "T4-16GB", "PCIe3")), "IB-HDR"),
    ("H100-80GB x2 + A10-24GB x2, Ethernet-100", "gpt3-2.7b", 32, 2048,
     ((1, 2, "H100-80GB", "NVLink4"), (1, 2, "A10-24GB", "PCIe4")), "Ethernet-100"),
    # the small device compute-fast for its memory (RTX 4090: 165 TFLOPS in 24 GB, half an A100's compute in
    # 30% of its memory; A10 and V100: 40% in 30% and 20%), data parallelism over IB (issue 10's regime)
    ("A100-80GB x2 + RTX4090-24GB x4, IB-NDR, batch 64", "gpt3-6.7b", 64, 2048,
     ((1, 2, "A100-80GB", "NVLink3"), (1, 4, "RTX4090-24GB", "PCIe4-host")), "IB-NDR"),
    ("A100-80GB x2 + RTX4090-24GB x4, 2 x IB-HDR per node, batch 128", "gpt3-6.7b", 128, 2048,
     ((1, 2, "A100-80GB", "NVLink3", 2), (1, 4, "RTX4090-24GB", "PCIe4-host", 2)), "IB-HDR"),
    ("A100-80GB x4 + V100-16GB x4, IB-NDR", "gpt3-1.3b", 32, 2048,
     ((1, 4, "A100-80GB", "NVLink3"), (1, 4, "V100-16GB", "NVLink2")), "IB-NDR"),
    ("A100-80GB x2 + A10-24GB x2, IB-NDR", "gpt3-2.7b", 32, 2048,
     ((1, 2, "A100-80GB", "NVLink3"), (1, 2, "A10-24GB", "PCIe4")), "IB-NDR"),
    # the same shape where the small device is slow for its partner: an H100 is 6x a 4090, an L4 0.4x an A100
    # with 15% of its memory bandwidth
    ("H100-80GB x2 + RTX4090-24GB x4, IB-NDR, batch 128", "gpt3-6.7b", 128, 2048,
     ((1, 2, "H100-80GB", "NVLink4"), (1, 4, "RTX4090-24GB", "PCIe4-host")), "IB-NDR"),
    ("A100-80GB x2 + L4-24GB x4, IB-NDR, batch 128", "gpt3-6.7b", 128, 2048,
     ((1, 2, "A100-80GB", "NVLink3"), (1, 4, "L4-24GB", "PCIe4")), "IB-NDR"),
)
"""The mixed-memory suite: 80 GB devices next to 16-24 GB ones."""

HOW = (("no sharding", (0,), False), ("even shards", (1, 2, 3), False), ("uneven shards", (1, 2), True))
"""Per row: the levels searched (the best of them is reported) and whether uneven fractions are allowed."""


def mixed_memory(suite=MIXED, precision: str | None = None) -> list[dict]:
    """Per cluster: the best plan search finds without sharding, with even shards (levels 1-3), and with
    uneven shard fractions allowed (levels 1-2, where the runtime runs them). ``precision``: the training
    precision (default: what ``hetpart plan`` defaults to on the cluster)."""
    from hetpart import Workload, load_model
    from hetpart.errors import HetpartError
    from hetpart.policies import plan

    from hetpart.workload import cluster_precision

    rows = []
    for label, model_name, batch, seq, nodes, nic in suite:
        graph = load_model(model_name, seq_len=seq)
        cluster = _cluster(label, nodes, nic)
        prec = precision or cluster_precision(cluster)  # as `hetpart plan` defaults it
        for how, levels, uneven in HOW:
            best, start, error = None, time.perf_counter(), ""
            for zero in levels:
                try:
                    result = plan(graph, cluster, Workload(batch, seq, zero=zero, precision=prec), "search",
                                  uneven_shards=uneven)
                except HetpartError as exc:
                    error = str(exc)[:100]
                    continue
                m = result.prediction.metrics
                if m["fits_in_memory"] and (best is None or m["tokens_per_s"] > best[1]["tokens_per_s"]):
                    best = (result.plan, m)
            row = {"cluster": label, "model": model_name, "how": how, "plan_s": time.perf_counter() - start,
                   "precision": prec}
            if best is None:
                rows.append(row | {"tokens_per_s": 0.0, "fits": False, "zero": None, "fractions": None, "layout": error})
                continue
            p, m = best
            rows.append(row | {"tokens_per_s": m["tokens_per_s"], "fits": True, "zero": p.zero,
                               "fractions": p.shard_fractions, "layout": _layout(p)})
    return rows


def _cluster(label: str, nodes, nic: str):
    """A :data:`MIXED` entry's cluster (node tuples ``(count, gpus/node, gpu, intra-node link[, NICs/node])``)."""
    from hetpart.cluster import parse_cluster

    return parse_cluster({"name": label, "nodes": [
        {"count": n[0], "gpus_per_node": n[1], "gpu": n[2], "intra_node": n[3], "nic": nic,
         **({"nics_per_node": n[4]} if len(n) > 4 else {})} for n in nodes]})


SWEEP = ("gpt3-6.7b", ((1, 2, "A100-80GB", "NVLink3"), (1, 4, "RTX4090-24GB", "PCIe4-host")),
         ("IB-NDR", "IB-HDR", "RoCE-100", "Ethernet-100"), (32, 64, 128), ("bf16", "fp16"))
"""The sweep of :func:`uneven_sweep`: one model and cluster, its NIC, the global batch and the precision
varied (bf16 keeps fp32 gradients, which level 1 does not shard; fp16 keeps 16-bit ones)."""


def uneven_sweep(sweep=SWEEP) -> list[dict]:
    """Where uneven fractions win: :func:`mixed_memory` on one cluster for every precision, NIC and global
    batch of ``sweep`` (one NIC per node, sequence 2048)."""
    model, nodes, nics, batches, precisions = sweep
    rows = []
    for precision in precisions:
        suite = tuple((f"{precision}, {nic}, batch {b}", model, b, 2048, nodes, nic) for nic in nics for b in batches)
        rows += mixed_memory(suite, precision)
    return rows


def sweep_table(rows: list[dict]) -> list[str]:
    """:func:`uneven_sweep`'s rows, one line per NIC and batch: tokens/s of the three rows, the gain of
    uneven fractions over the best other (0 where the search keeps them even), the fractions."""
    lines = ["| precision, NIC, global batch | no sharding | even shards | uneven shards | gain | zero | fractions |",
             "|---|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r["cluster"] for r in rows):
        by = {r["how"]: r for r in rows if r["cluster"] == label}
        u, other = by["uneven shards"], max(by["no sharding"]["tokens_per_s"], by["even shards"]["tokens_per_s"])
        fr = "even" if u["fractions"] is None else "/".join(f"{f:.2f}" for f in u["fractions"])
        gain = (u["tokens_per_s"] / other - 1) * 100 if other > 0 and u["fits"] else float("nan")
        lines.append(f"| {label} | {by['no sharding']['tokens_per_s']:,.0f} | {by['even shards']['tokens_per_s']:,.0f} | "
                     f"{u['tokens_per_s']:,.0f} | {gain:+.1f}% | {u['zero']} | {fr if u['fits'] else '-'} |")
    return lines


def _layout(plan) -> str:
    """``dp x [pp stages of tp]`` per distinct replica shape, e.g. ``2 x pp8 tp1 + 4 x pp2 tp1``."""
    from collections import Counter

    shapes = Counter((len(r.stages), max(s.tp for s in r.stages)) for r in plan.replicas)
    return " + ".join(f"{n} x pp{pp} tp{tp}" for (pp, tp), n in shapes.items())


def mixed_table(mixed: list[dict]) -> list[str]:
    """The mixed-memory suite as a markdown table (gain: against the best other row of the cluster)."""
    lines = ["### Mixed-memory clusters: search without sharding, with even shards, with uneven fractions", "",
             "Best plan found per row (even: the best of levels 1-3; uneven: levels 1-2, where the runtime runs "
             "uneven fractions, search free to keep them even). Precision: what `hetpart plan` defaults to on the "
             "cluster (bf16 where every device has it, else fp16: V100 and T4 have no bf16 units).", "",
             "| cluster | model | precision | sharding | tokens/s | vs best other | zero | fractions | replicas | plan s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in mixed:
        others = [o["tokens_per_s"] for o in mixed if o["cluster"] == r["cluster"] and o["how"] != r["how"]]
        gain = (r["tokens_per_s"] / max(others) - 1) * 100 if others and max(others) > 0 and r["fits"] else float("nan")
        fr = "even" if r["fractions"] is None else "/".join(f"{f:.2f}" for f in r["fractions"])
        lines.append(f"| {r['cluster']} | {r['model']} | {r['precision']} | {r['how']} | {r['tokens_per_s']:,.0f} | {gain:+.1f}% | "
                     f"{r['zero']} | {fr if r['fits'] else '-'} | {r['layout']} | {r['plan_s']:.1f} |")
    return lines


def section(reach: bool = True):
    from hetpart.experiments.benchdoc import Section, machine

    host = machine()
    pub = published_405b()
    lines = ["### Llama 3 405B, published layout, 16,384 H100 (TP 8, PP 16 interleaved x4, DP 128, seq 8192)", "",
             "| zero | fits | peak GB/GPU | model TFLOPS/GPU | vs published 400 | step s |", "|---|---|---|---|---|---|"]
    for r in pub:
        lines.append(f"| {r['zero']} | {r['fits']} | {r['peak_gb']:.1f} | {r['tflops']:.0f} | "
                     f"{(r['tflops'] - 400) / 400 * 100:+.1f}% | {r['step_s']:.2f} |")
    lines += [""] + mixed_table(mixed_memory())
    lines += ["", "### Uneven fractions against the precision, the network and the batch (2 A100-80GB + 4 RTX4090-24GB, gpt3-6.7b, "
              "seq 2048, one NIC per node)", "", "Gain: uneven shards against the better of the other two rows.", "",
              *sweep_table(uneven_sweep())]
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
    parser.add_argument("--mixed-only", action="store_true", help="print only the mixed-memory suite")
    parser.add_argument("--uneven-sweep", action="store_true",
                        help="print only the NIC x global batch sweep of uneven fractions (SWEEP)")
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.uneven_sweep:
        print(f"load {os.getloadavg()[0]:.1f}")
        print("\n".join(sweep_table(uneven_sweep())))
        print(f"load after {os.getloadavg()[0]:.1f}")
        return 0
    if args.mixed_only:
        print(f"load {os.getloadavg()[0]:.1f}")
        print("\n".join(mixed_table(mixed_memory())))
        print(f"load after {os.getloadavg()[0]:.1f}")
        return 0
    sec = section(reach=not args.no_reach)
    if args.write:
        from hetpart.experiments.benchdoc import write_section

        print(write_section(sec))
    else:
        print(sec.body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
