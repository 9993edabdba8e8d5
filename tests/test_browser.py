"""The HTML reports and the dashboard in a real browser (headless Chromium): what a person sees.

Checks come from the rendered page: the DOM after the page's scripts ran (the report marks each
figure it saw drawn, TensorBoard fetches and lists the run's scalars) and screenshots that are not
blank. ``HETPART_SCREENSHOTS=docs/screenshots pytest tests/test_browser.py`` refreshes the README's
images from these same tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._browser import colour_bins, dom_and_screenshot, dump_dom
from tests._cli import run_cli

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

# the README's example (16 GPUs of two types): a heterogeneous plan is what the report is for
DEMO = ["--model", "gpt2-xl", "--cluster", "a100-v100-16", "--global-batch", "256", "--seq-len", "1024"]


def _attr(dom: str, name: str) -> str:
    body = re.search(r"<body[^>]*>", dom)
    assert body, "no <body> in the DOM"
    found = re.search(rf'{name}="([^"]*)"', body.group(0))
    return found.group(1) if found else ""


@pytest.fixture(scope="module")
def plan_report(tmp_path_factory) -> Path:
    from hetpart.cli.app import main

    tmp = tmp_path_factory.mktemp("report")
    plan, page = tmp / "plan.json", tmp / "report.html"

    assert main(["plan", *DEMO, "--out", str(plan), "--json"]) == 0
    assert main(["show", str(plan), "--html", str(page), "--compare", "uniform,proportional", "--json"]) == 0
    return page


def test_plan_report_renders_every_figure_without_the_network(plan_report: Path) -> None:
    text = plan_report.read_text()
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)="(https?:)?//', text)
    shot = plan_report.parent / "report.png"
    dom = dom_and_screenshot(plan_report.as_uri(), shot, size=(1300, 1900))
    assert _attr(dom, "data-figures") == "3"
    assert _attr(dom, "data-figures-rendered") == "3", "a figure did not draw in the browser"
    for section in ("summary", "metrics", "cluster", "gantt", "memory", "comparison", "stages"):
        assert f'id="{section}"' in dom
    assert "tokens/s" in dom and "HETHUB upper bound" in dom and "predictor" in dom
    comparison = dom[dom.index('id="comparison-table"'):]
    assert "uniform" in comparison and "proportional" in comparison and "(this plan)" in comparison
    assert colour_bins(shot) >= 30


def test_bench_report_and_tracked_run_render(capsys, tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text("entries:\n  - {name: tiny, cluster: tiny-mixed, model: gpt2-small, global_batch: 8, "
                     "seq_len: 256}\n")
    code, _, err = run_cli(capsys, "bench", "--suite", str(suite), "--planners", "uniform,search",
                           "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"))
    assert code == 0, err
    dom = dump_dom((tmp_path / "out" / "report.html").as_uri())
    figures = int(_attr(dom, "data-figures"))
    assert figures == 4 and _attr(dom, "data-figures-rendered") == str(figures)
    assert 'id="results-table"' in dom and ">search<" in dom


def test_dashboard_shows_a_runs_scalars(tmp_path: Path) -> None:
    from hetpart.experiments.dashboard import Dashboard
    from hetpart.experiments.tracking import make_tracker

    for seed, scale in ((3, 1.0), (4, 1.3)):
        with make_tracker("tensorboard", "costmodel/train", seed=seed, config={"lr": 0.01}, root=tmp_path) as run:
            for step, err in enumerate((40.0, 22.5, 12.25, 8.5, 7.0, 6.25)):
                run.log({"costmodel/val_mape": err * scale, "costmodel/train_loss": err / 40 * scale}, step=step)
    with Dashboard(tmp_path, port=0) as board:
        assert board.url.startswith("http://127.0.0.1:")
        dom = dom_and_screenshot(board.url + "#timeseries", tmp_path / "dashboard.png", size=(1300, 800),
                                 budget_ms=12000)
        assert run.name in dom, "the run is not listed on the page"
        assert "costmodel/val_mape" in dom, "the scalar's card is not on the page"
    assert colour_bins(tmp_path / "dashboard.png") >= 30
