"""The search's estimate against the simulator, on the points the search simulates.

Run: ``python -m hetpart.experiments.bench_search_estimate`` (prints the table) or ``python -m
hetpart.experiments.run_all search-estimate`` (rewrites its block of docs/BENCHMARKS.md); about two and
a half minutes on one core.

The search (:mod:`hetpart.policies.plan_search`) ranks every structure by an estimate and simulates only
its ``top_k`` best and each group's best; the policy walks structures by the same estimate. Per scenario
of the public suite (``shared/scenarios/suite.yaml``) and the held-out suite of 2026-11-29
(``experiments/suites/heldout-11-29``), at sharding levels 0 and 1: those points, each simulated in the
placement the estimate prices, and how far apart the two are.
"""

from __future__ import annotations

import importlib
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EstimateRow", "rows", "section", "main"]

_REPO = Path(__file__).resolve().parents[1]
SUITES = (_REPO.parent / "shared" / "scenarios" / "suite.yaml", _REPO / "experiments" / "suites" / "heldout-11-29" /
          "suite.yaml")


@dataclass(frozen=True)
class EstimateRow:
    scenario: str
    level: int
    points: int
    """Points the search simulates (its ``top_k`` and each group's best) that fit."""
    median: float
    """Median of simulated / estimated step time over those points."""
    low: float
    high: float
    chosen: float
    """The simulated step of the best-estimated point over the best simulated one (1: the estimate's
    favourite is the simulator's)."""


def rows(suites=SUITES, levels=(0, 1)) -> list[EstimateRow]:
    import yaml

    from hetpart import Workload, load_cluster, load_model
    from hetpart.workload import cluster_precision
    from hetpart.costmodel.evaluator import Evaluator

    search = importlib.import_module("hetpart.policies.plan_search")
    out = []
    for suite in suites:
        suite = Path(suite)
        if not suite.is_file():
            continue
        for entry in yaml.safe_load(suite.read_text())["entries"]:
            model = load_model(entry["model"], seq_len=entry["seq_len"])
            cluster = load_cluster(str(suite.parent / entry["cluster"]))
            workload = Workload(entry["global_batch"], entry["seq_len"], precision=cluster_precision(cluster))
            evaluator = Evaluator(model, cluster, workload)
            for level in levels:
                ctx = search.make_context(model, cluster, workload, search.SearchOptions(), zero=level)
                pairs = []
                for scored in search._top_scored(ctx):
                    got = evaluator(scored.build()[0])  # the placement the estimate prices comes first
                    if got is not None:
                        pairs.append((scored.estimate_s, got.step_time_s))
                if not pairs:
                    continue
                ratios = [s / e for e, s in pairs]
                favourite = min(pairs)[1]
                out.append(EstimateRow(entry["name"], level, len(pairs), statistics.median(ratios), min(ratios),
                                       max(ratios), favourite / min(s for _, s in pairs)))
    return out


def _table(found: list[EstimateRow]) -> list[str]:
    lines = ["| scenario | level | points | simulated / estimated: median | range | best-estimated point, "
             "simulated, over the best simulated |", "|---|---|---|---|---|---|"]
    for r in found:
        lines.append(f"| {r.scenario} | {r.level} | {r.points} | {r.median:.2f} | {r.low:.2f}-{r.high:.2f} | "
                     f"{r.chosen:.3f} |")
    return lines


def section():
    """The ``search-estimate`` block of docs/BENCHMARKS.md."""
    from hetpart.experiments.benchdoc import Section, load, machine

    where = machine()
    found = rows()
    body = (
        "Per scenario and sharding level, the points the search simulates after ranking every structure by its "
        "estimate (its 16 best and each group's best), each simulated in the device placement the estimate "
        "prices. 1.00 is exact; above 1 the estimate is too fast. The last column is what ranking by the "
        "estimate costs among those points: the simulated step of the best-estimated point over the best "
        "simulated one. Public suite first, then the held-out suite of 2026-11-29.\n\n"
        + "\n".join(_table(found)))
    return Section("search-estimate", "The search's estimate against the simulator (issues 9, 12)", body,
                   "python -m hetpart.experiments.run_all search-estimate", where, load_after=load())


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print("\n".join(_table(rows())))


if __name__ == "__main__":
    main()
