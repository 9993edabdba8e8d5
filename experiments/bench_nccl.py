"""NCCL's all-reduce algorithm and protocol choice: what the cost model picks, and what it moved.

docs/BENCHMARKS.md's ``nccl-choice`` block (``make bench BENCH=nccl-choice``, about a minute). Three parts:

* the line NCCL's tuner model (``hetpart.costmodel.nccl``) runs for all-reduces of 1 KB to 1 GB on
  clusters of 8 to 10,752 GPUs, its time and the bus bandwidth it reaches, beside the time the
  simulator of :data:`BEFORE_COMMIT` (rings and the hierarchical all-reduce only) gave;
* published nccl-tests bus bandwidths (fair sources: users' and NCCL's maintainers' posts) beside the
  model's at the same size;
* the validation rows (``experiments/data/published_runs.csv``, fitting and held out, and the H100 runs)
  before and after, per group.

"Before" runs this file against :data:`BEFORE_COMMIT` checked out into a temporary git worktree (as
``bench_nic`` does). Run alone: ``python experiments/bench_nccl.py`` prints its rows as JSON lines.
"""

from __future__ import annotations

import json
import sys

__all__ = ["BEFORE_COMMIT", "GRID", "SIZES", "PUBLISHED", "rows", "section"]

BEFORE_COMMIT = "2ded7e3"
"""main before NCCL's algorithm x protocol choice (rings and the hierarchical all-reduce only)."""

GRID = (
    # (name, nodes, gpus per node, gpu, intra-node link, nic, nics per node, members: "all" or "one per node")
    ("8 x A100, one node (NVLink3)", 1, 8, "A100-80GB", "NVLink3", "IB-HDR", 8, "all"),
    ("8 x H100, one node (NVLink4, NVSwitch)", 1, 8, "H100-80GB", "NVLink4", "IB-NDR", 8, "all"),
    ("8 x RTX 3090, one node (PCIe 4, no P2P)", 1, 8, "RTX3090-24GB", "PCIe4", "Ethernet-10", 1, "all"),
    ("2 x 8 A100 (8 x IB HDR per node)", 2, 8, "A100-80GB", "NVLink3", "IB-HDR", 8, "all"),
    ("16 x 8 A100 (8 x IB HDR per node)", 16, 8, "A100-80GB", "NVLink3", "IB-HDR", 8, "all"),
    ("128 x 8 A100 (8 x IB HDR per node)", 128, 8, "A100-80GB", "NVLink3", "IB-HDR", 8, "all"),
    ("1,344 x 8 H100 = 10,752 GPUs (8 x IB NDR per node)", 1344, 8, "H100-80GB", "NVLink4", "IB-NDR", 8, "all"),
    ("32 nodes, one GPU each (A100, 1 x 100 GbE TCP)", 32, 8, "A100-80GB", "NVLink3", "Ethernet-100", 1, "one"),
    ("3 x 8 A100-40GB (4 x IB HDR per node)", 3, 8, "A100-40GB", "NVLink3", "IB-HDR", 4, "all"),
)
SIZES = (1e3, 1e5, 1e6, 1e7, 1e8, 1e9)
"""All-reduce sizes, bytes per member."""

PUBLISHED = (
    # (what, grid row, bytes, published bus bandwidth GB/s, source)
    ("8 x A100 SXM, one node", 0, 4e9, 208.0, "nccl-tests issue 178: all_reduce_perf up to 12 GB, bus bandwidth 208 GB/s"),
    ("8 x H100 SXM, one node", 1, 8e9, 480.0, "nccl-tests issue 212 (NCCL's maintainer): peak ~480 GB/s with NVLS "
     "(370 GB/s of NVLink bandwidth with the ring)"),
    ("3 x 8 A100-40GB, 4 x IB HDR per node", 8, 128e6, 96.0, "nccl-tests issue 119: peak ~96 GB/s at 128 MB "
     "(84.8 averaged over 8 B-128 MB)"),
)


def _cluster(nodes, gpn, gpu, intra, nic, nics):
    from hetpart.cluster import parse_cluster

    return parse_cluster({"name": "bench", "nodes": [{"count": nodes, "gpus_per_node": gpn, "gpu": gpu,
                                                       "intra_node": intra, "nic": nic, "nics_per_node": nics}]})


def _grid_rows() -> list[dict]:
    from hetpart.costmodel.collectives import allreduce_time_s

    try:  # absent before the change
        from hetpart.costmodel.collectives import allreduce_choice
    except ImportError:
        allreduce_choice = None
    out = []
    for i, (_name, nodes, gpn, gpu, intra, nic, nics, members) in enumerate(GRID):
        c = _cluster(nodes, gpn, gpu, intra, nic, nics)
        ids = [d.id for d in c.devices if members == "all" or d.local == 0]
        for nbytes in SIZES + tuple(p[2] for p in PUBLISHED if p[1] == i and p[2] not in SIZES):
            line = allreduce_choice(nbytes, ids, c) if allreduce_choice else None
            out.append({"kind": "grid", "row": i, "bytes": nbytes, "members": len(ids),
                        "time_s": allreduce_time_s(nbytes, ids, c), "line": line.name if line else ""})
    return out


def _validation_rows() -> list[dict]:
    from hetpart.experiments.bench_validation import h100_run_rows, load_published, predict_published

    results = [predict_published(r) for r in load_published()] + h100_run_rows()
    return [{"kind": "validation", "id": r.id, "predicted": r.predicted, "error_pct": r.error_pct} for r in results]


def rows() -> list[dict]:
    """The grid and the validation rows under the simulator this process imports."""
    return _grid_rows() + _validation_rows()


def _before_rows() -> list[dict] | None:
    """:func:`rows` under :data:`BEFORE_COMMIT` (None when git cannot check it out)."""
    from hetpart.experiments.bench_nic import rows_at_commit

    return rows_at_commit(BEFORE_COMMIT, __file__)


def _bus(nbytes: float, members: int, time_s: float) -> float:
    return 2 * (members - 1) / members * nbytes / time_s / 1e9 if time_s > 0 else float("nan")


def _fmt_bytes(nbytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes:g} B"


def _validation_table(now: list[dict], before: list[dict] | None) -> list[str]:
    old = {r["id"]: r for r in before or [] if r["kind"] == "validation"}
    groups = [("fitting: Korthikanti et al. 2022, Table 5", "k22"), ("fitting: Narayanan et al. 2021, Table 1", "n21"),
              ("fitting (anchor): Shoeybi et al. 2019, 1.2B on one V100", "s19-1.2b"),
              ("held out: Shoeybi et al. 2019, 8.3B on 8 and 512 V100", "s19-8.3b"),
              ("held out: Llama 3 405B on H100", "l24"), ("held out: hetpart runtime on one H100", "h100-run")]

    def mean(rows):
        errs = [abs(r["error_pct"]) for r in rows if r.get("error_pct") is not None]
        return f"{sum(errs) / len(errs):.2f}%" if errs else "-"

    lines = ["| rows | before: mean abs error | now | largest change of one row |", "|---|---|---|---|"]
    for name, prefix in groups:
        picked = [r for r in now if r["kind"] == "validation" and r["id"].startswith(prefix)]
        was = [old[r["id"]] for r in picked if r["id"] in old]
        moves = [abs(r["predicted"] / old[r["id"]]["predicted"] - 1) * 100 for r in picked
                 if r["id"] in old and r["predicted"] and old[r["id"]]["predicted"]]
        change = f"{max(moves):.2f}%" if moves else "-"
        lines.append(f"| {name} ({len(picked)}) | {mean(was)} | {mean(picked)} | {change} |")
    return lines


def section():
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    now = rows()
    before = _before_rows()
    old = {(r["row"], r["bytes"]): r for r in before or [] if r["kind"] == "grid"}
    grid = ["| cluster | members | bytes | NCCL's choice | time (us) | bus bandwidth (GB/s) | before: time (us) |",
            "|---|---|---|---|---|---|---|"]
    for r in now:
        if r["kind"] != "grid" or r["bytes"] not in SIZES:
            continue
        was = old.get((r["row"], r["bytes"]))
        then = f"{was['time_s'] * 1e6:,.1f}" if was else "-"
        grid.append(f"| {GRID[r['row']][0]} | {r['members']:,} | {_fmt_bytes(r['bytes'])} | {r['line']} | "
                    f"{r['time_s'] * 1e6:,.1f} | {_bus(r['bytes'], r['members'], r['time_s']):.1f} | {then} |")
    published = ["| setup | bytes | published bus bandwidth (GB/s) | model (GB/s) | model's choice | source |",
                 "|---|---|---|---|---|---|"]
    for what, i, nbytes, bus, source in PUBLISHED:
        r = next(x for x in now if x["kind"] == "grid" and x["row"] == i and x["bytes"] == nbytes)
        published.append(f"| {what} | {_fmt_bytes(nbytes)} | {bus:g} | {_bus(nbytes, r['members'], r['time_s']):.0f} | "
                         f"{r['line']} | {source} |")
    body = (
        "Each all-reduce is priced as NCCL's tuner prices it: per algorithm (ring, double binary tree, NVLS) "
        "and protocol (LL, LL128, Simple) `latency + bytes / algorithm bandwidth`, the minimum taken "
        "(`hetpart/costmodel/nccl.py`; constants from NVIDIA/nccl `src/graph/tuning.cc` v2.19, NVLS from "
        "nccl-tests issue 212). Bus bandwidth = `2 (n-1)/n x bytes / time`, as nccl-tests reports it. "
        f"\"Before\" is the simulator of commit `{BEFORE_COMMIT}` (one flat ring on one NIC, or the hierarchical "
        "all-reduce; one catalog latency per ring step), run from a temporary git worktree.\n\n"
        "#### What is chosen\n\n" + "\n".join(grid) + "\n\n"
        "#### Against published nccl-tests figures (one number each; nothing fitted to them)\n\n"
        + "\n".join(published) + "\n\n"
        "#### Validation rows before and after (`experiments/data/published_runs.csv`, `h100_runs.jsonl`)\n\n"
        "Mean absolute error per group, as in *Validation against published and measured runs*; nothing was "
        "refit for this change.\n\n" + "\n".join(_validation_table(now, before)))
    return Section("nccl-choice", "NCCL's all-reduce algorithm and protocol choice (issue 9)", body,
                   "python -m hetpart.experiments.run_all nccl-choice", where, load_after=load())


if __name__ == "__main__":
    for row in rows():
        print(json.dumps(row))
    sys.exit(0)
