"""The stored-loop benchmark of the closed loop's correction (experiments/bench_correction.py)."""

from hetpart.experiments.bench_correction import DATA, evaluate_loop, render_body


def test_a_stored_loop_is_refitted_and_judged_on_the_runs_it_never_trained_on():
    path = sorted(DATA.glob("acceptance-loop-*.jsonl.gz"))[0]
    row = evaluate_loop(path)
    assert row["cluster"] == "acceptance-loop" and row["model"] == "gpt2-small"
    assert row["train"] >= 3 and row["test"] >= 2  # held-out and final runs, never trained on
    assert row["simulator"] > 0 and row["kernel"] > 0 and row["semi"] > 0
    body = render_body([row])
    assert "| acceptance-loop-01 |" in body and "acceptance cluster (1 loops)" in body
