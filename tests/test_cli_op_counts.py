"""`--op-counts measured|engine`: which operator counts pay the host's fixed cost per operator."""

from __future__ import annotations

from tests._cli import cli_json as _json, run_cli as _run

GRID = ["--model", "llama2-7b", "--cluster", "a100-8", "--global-batch", "16", "--seq-len", "2048",
        "--tp", "8", "--pp", "1", "--dp", "1", "--micro-batch", "1"]


def test_engine_counts_make_small_work_per_gpu_far_less_host_bound(capsys) -> None:
    engine = _json(capsys, "predict", *GRID, "--json")["metrics"]["step_time_s"]  # the default since 2026-12-01
    measured = _json(capsys, "predict", *GRID, "--op-counts", "measured", "--json")["metrics"]["step_time_s"]
    assert engine < 0.7 * measured  # a Llama block dispatches 12/20 operators under TE, 66/138 as eager modules
    again = _json(capsys, "predict", *GRID, "--op-counts", "engine", "--json")["metrics"]["step_time_s"]
    assert again == engine


def test_an_unknown_count_set_is_one_line_and_exit_2(capsys) -> None:
    code, out, err = _run(capsys, "predict", *GRID, "--op-counts", "fused")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--op-counts" in err and "measured or engine" in err
