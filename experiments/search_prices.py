"""How many plans search simulates per suite entry, its CPU seconds, and which plan it returns.

Run: ``python -m hetpart.experiments.search_prices SUITE.yaml [ENTRY ...]`` (one JSON line per entry). Branch and
bound's work is the plans it simulates (:attr:`hetpart.costmodel.evaluator.Evaluator.simulations`, the parent's:
a forked level's count does not reach it); a change to the lower bound should lower the count and leave the plan
(``plan``: a hash of its JSON) as it was. Before/after a change: run it from a ``git worktree`` of the older commit
with ``PYTHONPATH=<worktree>`` (docs/BENCHMARKS.md, session of 2026-12-01, eleventh and twelfth).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from pathlib import Path

__all__ = ["entry_prices", "main"]


def entry_prices(suite: str | Path, names: list[str] | None = None) -> list[dict]:
    """Per entry of ``suite`` (all, or those ``names``): simulations, CPU seconds, step and the plan's hash."""
    import yaml

    from hetpart import Workload, load_cluster, load_model
    from hetpart.costmodel.evaluator import Evaluator

    search = importlib.import_module("hetpart.policies.plan_search")  # the package's name is the function
    suite = Path(suite).resolve()
    out = []
    for entry in yaml.safe_load(suite.read_text())["entries"]:
        if names and entry["name"] not in names:
            continue
        model_ref = entry["model"]
        model_ref = str(suite.parent / model_ref) if model_ref.endswith(".json") else model_ref
        model = load_model(model_ref, seq_len=entry["seq_len"])
        cluster = load_cluster(str(suite.parent / entry["cluster"]))
        workload = Workload(global_batch=entry["global_batch"], seq_len=entry["seq_len"])
        evaluator = Evaluator(model, cluster, workload)
        began = time.process_time()
        best = search.plan_search(model, cluster, workload, evaluator=evaluator)
        plan = json.dumps(best.plan.to_dict(), sort_keys=True, default=str).encode()
        out.append({"entry": entry["name"], "simulations": evaluator.simulations,
                    "cpu_s": round(time.process_time() - began, 2), "step_s": best.step_time_s,
                    "plan": hashlib.sha256(plan).hexdigest()[:12]})
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m hetpart.experiments.search_prices SUITE.yaml [ENTRY ...]")
    for row in entry_prices(args[0], args[1:]):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
