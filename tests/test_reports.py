"""Figures, the HTML reports, `hetpart bench`'s outputs and tracked run, and `hetpart dashboard`'s lifecycle."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests._cli import cli_json, run_cli

SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "256"]


def test_gantt_of_a_large_plan_draws_identical_replicas_once_with_a_bounded_height() -> None:
    from hetpart import Workload, load_model, plotting
    from hetpart.costmodel.megatron import megatron_plan
    from hetpart.costmodel.simulator import simulate
    from hetpart.experiments.bench_search import synthetic_cluster

    model, cluster = load_model("gpt2-small", seq_len=256), synthetic_cluster(512, 1)
    plan = megatron_plan(model, cluster, Workload(512, 256), tp=1, pp=4, dp=128, micro_batch=1)
    prediction = simulate(model, cluster, plan, trace=True)
    groups = plotting.replica_groups(plan, cluster)
    assert len(groups) == 1 and groups[0].label == "r0-r127 (x128)"
    fig = plotting.gantt_figure(prediction.timeline, plan, cluster, max_rows=24)
    ax = fig.axes[0]
    assert [t.get_text().split()[0] for t in ax.get_yticklabels()] == ["r0-r127"] * 4
    assert fig.get_size_inches()[1] <= 11.0
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["forward", "backward"]
    plotting.save_png(fig, os.devnull)
    big = plotting.cluster_figure(plan, cluster, max_nodes=16)
    assert big.get_size_inches()[1] <= 11.0 and "first 16 of 64 nodes" in big.axes[0].get_title()
    plotting.save_png(big, os.devnull)


def test_show_html_is_one_self_contained_page(capsys, tmp_path: Path) -> None:
    plan, page = tmp_path / "plan.json", tmp_path / "r.html"
    cli_json(capsys, "plan", *SMALL, "--out", str(plan), "--json")
    data = cli_json(capsys, "show", str(plan), "--html", str(page), "--json")
    assert data["html"] == str(page)
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "data:image/png;base64," in text
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert 'id="comparison"' not in text  # only with --compare
    code, _, err = run_cli(capsys, "show", str(plan), "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert code == 2 and "--html: cannot write" in err


def test_show_refuses_a_bad_row_count_and_names_compare_for_an_unknown_planner(capsys, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    cli_json(capsys, "plan", *SMALL, "--planner", "uniform", "--out", str(plan), "--json")
    for rows in ("0", "-3"):
        code, out, err = run_cli(capsys, "show", str(plan), "--max-rows", rows, "--gantt", str(tmp_path / "g.png"),
                                 "--json")
        assert code == 2 and err == f"hetpart: error: --max-rows: must be >= 1, got {rows}; give the number of Gantt " \
                                    "rows to draw\n"
        assert json.loads(out)["error"].startswith("--max-rows: must be >= 1") and not (tmp_path / "g.png").exists()
    code, out, err = run_cli(capsys, "show", str(plan), "--compare", "uniform,bogus", "--html", str(tmp_path / "r.html"),
                             "--json")
    assert code == 2 and err.count("\n") == 1 and "--planner" not in err
    assert json.loads(out)["error"].startswith("--compare: unknown planner 'bogus'; use one of ")


def test_bench_writes_table_plots_html_and_a_tracked_run(capsys, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    suite = tmp_path / "suite.yaml"
    suite.write_text("entries:\n  - {name: tiny, cluster: tiny-mixed, model: gpt2-small, global_batch: 8, seq_len: 256}\n")
    out, runs = tmp_path / "out", tmp_path / "runs"
    data = cli_json(capsys, "bench", "--suite", str(suite), "--planners", "uniform,proportional,search",
                    "--out", str(out), "--runs-dir", str(runs), "--json")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["gantt_tiny.png", "pct_upper_bound.png", "plan_time_vs_gpus.png", "report.html", "results.csv",
                     "results.md", "throughput.png"]
    rows = {r["planner"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert float(rows["search"]["pct_of_search"]) == 100.0
    assert float(rows["uniform"]["pct_memory_lifted"]) <= float(rows["search"]["pct_memory_lifted"])
    md = (out / "results.md").read_text()
    assert "| tiny | 4 | search |" in md and "% ceiling" in md and "peak memory / capacity" in md
    run_dir = Path(data["run_dir"])
    assert run_dir.parent == runs and run_dir.name.startswith("bench-suite__0__")
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tps = acc.Scalars("bench/tokens_per_s/search")
    assert [(e.step, round(e.value)) for e in tps] == [(0, round(float(rows["search"]["tokens_per_s"])))]
    assert (run_dir / "config.yaml").exists() and (run_dir / "results.csv").exists()


def _ctrl_c_as_in_a_terminal() -> None:
    """A shell without job control starts background commands with SIGINT ignored, and a Python started so
    keeps ignoring it; a terminal's foreground command has it at its default (the test's premise)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_dashboard_cli_prints_its_url_and_ends_on_ctrl_c_or_sigterm(tmp_path: Path, stop) -> None:
    """Ctrl-C, and kill or timeout (SIGTERM) alike, end the dashboard with 130: TensorBoard goes with it."""
    hetpart = Path(sys.executable).with_name("hetpart")
    proc = subprocess.Popen([str(hetpart), "dashboard", "--logdir", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, f"no URL in {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        with urllib.request.urlopen(url.group(0), timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(stop)
        assert proc.wait(timeout=30) == (130 if stop == signal.SIGINT else 143)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with pytest.raises(urllib.error.URLError):  # TensorBoard went with it
        urllib.request.urlopen(url.group(0), timeout=3)


def test_dashboard_bad_input_is_one_line(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "dashboard", "--port", "70000")
    assert code == 2 and "--port: 70000 is not a TCP port" in err
    (tmp_path / "f").write_text("x")
    code, _, err = run_cli(capsys, "dashboard", "--logdir", str(tmp_path / "f"))
    assert code == 2 and "is a file; give the runs folder" in err
    missing = tmp_path / "no" / "runs"  # a mistyped folder is not created and served empty
    code, _, err = run_cli(capsys, "dashboard", "--logdir", str(missing))
    assert code == 2 and err == f"hetpart: error: --logdir: {missing}: no such directory; give the runs folder " \
                                "('hetpart run' and 'hetpart bench' write to runs/)\n"
    assert not (tmp_path / "no").exists()


def test_scaling_study_skips_a_planner_over_its_budget_and_tracks_the_points(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hetpart.experiments.scaling import markdown, run_study, synthetic_cluster
    from hetpart.experiments.tracking import make_tracker

    assert [g.gpus_per_node for g in synthetic_cluster(16, 4).groups] == [4, 4, 4, 4]
    with make_tracker("tensorboard", "plan/scaling", seed=0, root=tmp_path) as run:
        points = run_study("gpt2-small", [16, 64], [2], ["uniform", "proportional"], tracker=run, budget_s=0.0,
                           seq_len=256)
    assert [(p.gpus, p.planner, p.error.split(":")[0]) for p in points] == [
        (16, "uniform", ""), (16, "proportional", ""), (64, "uniform", "skipped"), (64, "proportional", "skipped")]
    assert all(p.tokens_per_s > 0 and p.pct_upper_bound > 0 for p in points[:2])
    assert "| 64 | 2 | 128 | skipped |" in markdown(points, ["uniform", "proportional"])
    acc = EventAccumulator(str(run.run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("plan/pct_upper_bound/uniform/2types")] == [16]
