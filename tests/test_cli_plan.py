"""`hetpart plan`, `predict`, `show`, `demo` and `bench`: the CONTRACT's JSON and one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest


SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "256"]


from tests._cli import cli_json as _json, run_cli as _run  # noqa: E402


def _error(capsys, *argv: str) -> str:
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("hetpart: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_plan_json_follows_the_contract_and_round_trips_through_predict_and_show(capsys, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    data = _json(capsys, "plan", *SMALL, "--out", str(out), "--json")
    assert set(data) >= {"plan", "metrics", "upper_bound", "planner"}
    assert data["planner"]["name"] == "search" and data["planner"]["wall_time_s"] > 0
    for key in ("global_batch", "micro_batch", "seq_len", "schedule", "recompute", "replicas"):
        assert key in data["plan"]
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "hardware_tflops_per_device",
                "model_tflops_per_device", "mfu", "bubble_fraction", "peak_memory_gb", "fits_in_memory"):
        assert key in data["metrics"]
    assert data["metrics"]["fits_in_memory"] is True
    assert data["upper_bound"]["tokens_per_s"] > 0 and data["upper_bound"]["definition"]
    saved = json.loads(out.read_text())
    assert saved["meta"]["model"] == "gpt2-small" and saved["meta"]["cluster"] == "tiny-mixed"

    again = _json(capsys, "predict", *SMALL, "--plan", str(out), "--json")
    assert again["metrics"]["tokens_per_s"] == pytest.approx(data["metrics"]["tokens_per_s"], rel=1e-9)
    bare = _json(capsys, "predict", "--plan", str(out), "--json")  # model and cluster from the plan's meta
    assert bare["metrics"]["step_time_s"] == pytest.approx(data["metrics"]["step_time_s"], rel=1e-9)
    code, _, err = _run(capsys, "predict", "--plan", str(out), "--seq-len", "64")  # a CLI user's fix, not an API's
    assert code == 2 and f"--seq-len: 64 but {out} was planned for" in err and "drop --seq-len" in err
    # an explicit --recompute overrides the plan's (it was ignored without a word)
    other = "full" if data["plan"]["recompute"] != "full" else "none"
    redone = _json(capsys, "predict", *SMALL, "--plan", str(out), "--recompute", other, "--json")
    assert redone["metrics"]["step_time_s"] != pytest.approx(data["metrics"]["step_time_s"], rel=1e-6)

    png = tmp_path / "gantt.png"
    code, text, err = _run(capsys, "show", str(out), "--gantt", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "Gantt chart in" in " ".join(text.split())


@pytest.mark.parametrize("planner", ["uniform", "proportional"])
def test_plan_with_each_baseline(capsys, planner: str) -> None:
    data = _json(capsys, "plan", *SMALL, "--planner", planner, "--json")
    assert data["planner"]["name"] == planner and data["metrics"]["fits_in_memory"]


def test_predict_flag_form_is_the_megatron_grid(capsys) -> None:
    data = _json(capsys, "predict", *SMALL, "--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "2", "--json")
    assert data["metrics"]["tokens_per_s"] > 0 and data["predictor"] == "simulator"
    # Megatron-LM's rank order (TP, then DP, then PP outermost): stage 0 of both replicas on the A100s
    assert data["order"] == "tp-dp-pp"
    assert {(row["stage"], row["gpu"]) for row in data["breakdown"]} == {(0, "A100-40GB"), (1, "V100-16GB")}
    other = _json(capsys, "predict", *SMALL, "--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "2",
                  "--order", "tp-pp-dp", "--json")
    assert other["order"] == "tp-pp-dp"  # each pipeline on one node: replica 0 on the A100s
    assert {(row["replica"], row["gpu"]) for row in other["breakdown"]} == {(0, "A100-40GB"), (1, "V100-16GB")}
    assert "--order: unknown rank order 'dp-tp'" in _error(capsys, "predict", *SMALL, "--tp", "1", "--pp", "2",
                                                            "--dp", "2", "--micro-batch", "2", "--order", "dp-tp")
    err = _error(capsys, "predict", *SMALL, "--tp", "1", "--pp", "1", "--dp", "3", "--micro-batch", "1")
    assert "--tp/--pp/--dp" in err or "not divisible" in err
    err = _error(capsys, "predict", *SMALL, "--tp", "1", "--pp", "2", "--dp", "2", "--micro-batch", "3")
    assert "--global-batch: 8 is not divisible by dp x micro_batch = 2 x 3" in err
    err = _error(capsys, "predict", *SMALL, "--tp", "1", "--pp", "2")
    assert "--dp, --micro-batch missing" in err


def test_clear_errors_for_unbuilt_and_impossible_requests(capsys, tmp_path: Path) -> None:
    assert "--planner: unknown planner 'oracle'" in _error(capsys, "plan", *SMALL, "--planner", "oracle")
    assert "--predictor: unknown predictor 'oracle'" in _error(
        capsys, "predict", *SMALL, "--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "1", "--predictor", "oracle")
    err = _error(capsys, "plan", "--model", "llama2-13b", "--cluster", "tiny-mixed", "--global-batch", "8",
                 "--seq-len", "512")
    assert "no plan for llama2-13b" in err and "use a smaller model" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "bad.json: invalid JSON" in _error(capsys, "predict", *SMALL, "--plan", str(bad))
    assert "--model missing" in _error(capsys, "show", str(_plan_without_meta(tmp_path)))


def _plan_without_meta(tmp_path: Path) -> Path:
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"global_batch": 8, "micro_batch": 1, "seq_len": 256, "replicas": [
        {"batch_share": 1.0, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]}]}))
    return path


def test_demo_compares_search_with_the_bound_and_megatron(capsys) -> None:
    code, out, err = _run(capsys, "demo")
    assert code == 0, err
    out = " ".join(out.split())  # rich wraps long lines at the terminal width
    assert "upper bound" in out and "x faster" in out and "tokens/s" in out
    data = _json(capsys, "demo", "--json")
    assert data["speedup_vs_uniform"] > 1.0
    assert data["pct_upper_bound"] > 0
    assert data["tokens_per_s"] == pytest.approx(data["speedup_vs_uniform"] * data["uniform_tokens_per_s"])


def test_bench_writes_results_csv_and_plots(capsys, tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    (tmp_path / "c.yaml").write_text((Path(__file__).resolve().parents[1] / "hetpart" / "catalog" / "clusters" /
                                      "tiny-mixed.yaml").read_text())
    suite.write_text("entries:\n"
                     "  - {name: small, cluster: c.yaml, model: gpt2-small, global_batch: 8, seq_len: 256}\n"
                     "  - {name: too-big, cluster: tiny-mixed, model: llama2-13b, global_batch: 8, seq_len: 256}\n")
    out = tmp_path / "out"
    code, text, err = _run(capsys, "bench", "--suite", str(suite), "--planners", "uniform,search", "--out", str(out))
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    for col in ("scenario", "planner", "tokens_per_s", "pct_upper_bound", "speedup_vs_uniform", "plan_time_s",
                "fits_in_memory"):
        assert col in rows[0]
    small = {r["planner"]: r for r in rows if r["scenario"] == "small"}
    assert set(small) == {"uniform", "search"}
    assert float(small["search"]["speedup_vs_uniform"]) >= 1.0 and small["search"]["fits_in_memory"] == "True"
    big = [r for r in rows if r["scenario"] == "too-big"]
    assert big and all(r["tokens_per_s"] == "" and "no plan" in r["error"] for r in big)
    assert (out / "throughput.png").stat().st_size > 0 and (out / "pct_upper_bound.png").stat().st_size > 0
    assert "unknown planner 'oracle'" in _error(capsys, "bench", "--suite", str(suite), "--planners", "oracle",
                                                "--out", str(out))


def test_predict_plans_answers_every_line_in_order_in_one_process(capsys, tmp_path: Path) -> None:
    """`--plans`: one JSON line per plan, metrics as `--plan` gives them, an error line for a bad plan."""
    out = tmp_path / "p.json"
    _json(capsys, "plan", *SMALL, "--planner", "uniform", "--out", str(out), "--json")
    good = json.loads(out.read_text())
    missing = json.loads(out.read_text())
    missing["replicas"][0]["stages"][0]["devices"] = ["7/0/0"]
    plans = tmp_path / "plans.jsonl"
    plans.write_text("\n".join([json.dumps(good), "{not json", json.dumps(missing), "", json.dumps(good)]) + "\n")
    code, stdout, err = _run(capsys, "predict", *SMALL, "--plans", str(plans), "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert len(lines) == 4  # the blank line is no plan
    one = _json(capsys, "predict", *SMALL, "--plan", str(out), "--json")
    assert lines[0] == {"line": 1, "metrics": one["metrics"]} and lines[3] == lines[0] | {"line": 5}
    assert lines[1]["error"].startswith(f"{plans}:2: invalid JSON")
    assert "'7/0/0' does not exist" in lines[2]["error"] and set(lines[2]) == {"line", "error"}
    code, stdout, err = _run(capsys, "predict", *SMALL, "--plans", str(plans))
    assert code == 0 and stdout.count("tokens/s") == 2 and "2: " in stdout
    many = tmp_path / "many.jsonl"  # enough lines for two forked workers: the same lines, in order
    many.write_text(plans.read_text() * 6)
    by_jobs = [_run(capsys, "predict", *SMALL, "--plans", str(many), "--json", "--jobs", jobs) for jobs in ("1", "2")]
    assert by_jobs[0][0] == by_jobs[1][0] == 0 and by_jobs[0][1] == by_jobs[1][1]
    forked = [json.loads(line) for line in by_jobs[1][1].splitlines()]
    assert [a.get("metrics") for a in forked] == [a.get("metrics") for a in lines] * 6
    assert forked[-3]["error"].startswith(f"{many}:27: invalid JSON")  # numbered as in the file
    assert "--jobs" in _error(capsys, "predict", *SMALL, "--plans", str(plans), "--jobs", "-1")
    assert "give --plan or --plans, not both" in _error(capsys, "predict", *SMALL, "--plans", str(plans),
                                                         "--plan", str(out))
    assert f"--plans: cannot read {tmp_path / 'none.jsonl'}" in _error(capsys, "predict", *SMALL, "--plans",
                                                                      str(tmp_path / "none.jsonl"))


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_predict_plans_of_an_empty_file_says_so(capsys, tmp_path: Path, text: str) -> None:
    plans = tmp_path / "empty.jsonl"
    plans.write_text(text)
    code, out, err = _run(capsys, "predict", *SMALL, "--plans", str(plans), "--json")
    assert code == 2 and err.count("\n") == 1
    assert json.loads(out)["error"] == (f"--plans: {plans} holds no plans (it is empty or blank); give a JSONL file "
                                        "with one plan per line")


def test_predict_plans_without_a_precision_follow_the_devices(capsys, tmp_path: Path) -> None:
    """A plan that states no precision (as the contract's minimal plan) is priced on a V100 cluster, as
    `--precision` left out is: the devices choose (fp16 there), not a bf16 refusal."""
    small = ["--model", "gpt2-small", "--cluster", "a100-v100-16", "--global-batch", "8", "--seq-len", "128"]
    out = tmp_path / "p.json"
    _json(capsys, "plan", *small, "--planner", "uniform", "--out", str(out), "--json")
    plan = json.loads(out.read_text())
    plan.pop("precision", None)
    plans = tmp_path / "plans.jsonl"
    plans.write_text(json.dumps(plan) + "\n")
    code, stdout, err = _run(capsys, "predict", *small, "--plans", str(plans), "--json")
    assert code == 0, err
    assert "metrics" in json.loads(stdout.splitlines()[0])


def test_the_suite_runner_trains_in_what_plan_picks(capsys) -> None:
    """`hetpart bench` plans each entry in the precision `hetpart plan` defaults to on its cluster (fp16
    beside V100s, which have no bf16 units; it planned bf16 there before, other gradient bytes than the
    plan users get)."""
    from hetpart import load_cluster
    from hetpart.experiments.suite import SuiteEntry, solve_entry
    from hetpart.workload import cluster_precision

    assert cluster_precision(load_cluster("a100-v100-16")) == "fp16"
    assert cluster_precision(load_cluster("a100-8")) == "bf16"
    entry = SuiteEntry("v100", "a100-v100-16", "gpt2-small", 8, 128)
    got = solve_entry(entry, ["uniform"]).best
    planned = _json(capsys, "plan", "--model", "gpt2-small", "--cluster", "a100-v100-16", "--global-batch", "8",
                    "--seq-len", "128", "--planner", "uniform", "--json")
    assert got.plan.precision == "fp16"
    assert got.prediction.metrics["step_time_s"] == pytest.approx(planned["metrics"]["step_time_s"], rel=1e-9)


def test_engine_options_reach_the_simulator_and_a_predictor_without_them_refuses(capsys):
    grid = ("predict", "--model", "gpt3-6.7b", "--cluster", "ib-roce-ethernet", "--global-batch", "256", "--seq-len",
            "2048", "--tp", "8", "--pp", "2", "--dp", "2", "--micro-batch", "1", "--json")
    base = _json(capsys, *grid)
    overlapped = _json(capsys, *grid, "--overlap-p2p")  # the inter-node pipeline sends (RDMA) leave the sender free
    after = _json(capsys, *grid, "--no-overlap-grad-reduce")  # gradients all-reduced after the whole backward
    assert overlapped["metrics"]["step_time_s"] < base["metrics"]["step_time_s"] < after["metrics"]["step_time_s"]
    assert overlapped["predictor_version"].endswith("+overlap-p2p")
    assert after["predictor_version"].endswith("+no-overlap-grad-reduce")
    planned = _json(capsys, "plan", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8",
                       "--seq-len", "128", "--overlap-p2p", "--json")
    assert planned["metrics"]["step_time_s"] > 0
    code, out, err = _run(capsys, "predict", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--tp", "1", "--pp",
                             "2", "--dp", "2", "--micro-batch", "1", "--predictor", "learned", "--overlap-p2p", "--json")
    assert code == 2 and "does not take --overlap-p2p" in json.loads(out)["error"]
