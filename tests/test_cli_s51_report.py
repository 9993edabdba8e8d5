"""``show --html`` prices its upper bound and its ``--compare`` planners on the plan's own input: the workload
the plan was made for (optimizer, attention, zero, offload) and the engine options that priced it (the
user-journey probe of 2026-12-01: an sgd/eager plan was set against the adam/fused bound, 51.1% where plan said
75.9%, and uniform was priced with the default engine options)."""

from __future__ import annotations

from pathlib import Path

from tests._cli import cli_json

SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128"]
INPUT = ["--optimizer", "sgd", "--attention", "eager", "--overlap-p2p", "--op-counts", "measured"]


def test_the_report_bound_and_comparison_are_those_of_the_plans_input(capsys, tmp_path: Path) -> None:
    out, page = tmp_path / "p.json", tmp_path / "r.html"
    planned = cli_json(capsys, "plan", *SMALL, *INPUT, "--out", str(out), "--json")
    bound = planned["upper_bound"]["tokens_per_s"]
    uniform = cli_json(capsys, "plan", *SMALL, *INPUT, "--planner", "uniform", "--no-bound", "--json")
    default_uniform = cli_json(capsys, "plan", *SMALL, "--planner", "uniform", "--no-bound", "--json")
    assert uniform["metrics"]["tokens_per_s"] != default_uniform["metrics"]["tokens_per_s"]
    shown = cli_json(capsys, "show", str(out), "--html", str(page), "--compare", "uniform", "--json")
    assert shown["metrics"]["tokens_per_s"] == planned["metrics"]["tokens_per_s"]
    html = page.read_text()
    assert f"{bound:,.0f} tokens/s" in html
    assert f"{planned['metrics']['tokens_per_s'] / bound * 100:.1f}%" in html
    assert f"{uniform['metrics']['tokens_per_s']:,.0f}" in html
    assert f"{default_uniform['metrics']['tokens_per_s']:,.0f}" not in html


def test_the_report_workload_is_the_recorded_one() -> None:
    from dataclasses import replace

    from hetpart import load_cluster, load_model
    from hetpart.cli.report_cmd import _workload
    from hetpart.policies import plan as run_planner
    from hetpart.workload import Workload

    graph = load_model("gpt2-small", seq_len=128, precision="fp16")
    workload = Workload(global_batch=8, seq_len=128, precision="fp16", recompute="none", optimizer="sgd",
                        attention="eager", zero=1, offload="optimizer")
    plan = run_planner(graph, load_cluster("tiny-mixed"), workload, "uniform").plan
    plan = replace(plan, meta=plan.meta | {"workload": workload.to_dict()})
    got = _workload(plan)
    assert (got.optimizer, got.attention, got.zero, got.offload) == ("sgd", "eager", 1, "optimizer")
    bare = _workload(replace(plan, meta={}))  # an older file without the record: the plan's own choices
    assert (bare.optimizer, bare.attention, bare.offload) == ("sgd", "eager", "optimizer")
