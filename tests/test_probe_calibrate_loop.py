"""A probe's findings on ``calibrate``, ``dashboard`` and ``loop``: options a mode does not use are refused (never
silently ignored), an explicit ``--bind`` wins over the name-prefix match, an empty records file is named,
SIGTERM ends the dashboard with 143, ``loop --ground cpu`` refuses ``--cluster``, and the loop numbers its
iterations from 0 on stderr as in its JSON and files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hetpart.costmodel.profile_import import import_metis
from hetpart.errors import SpecError
from tests._cli import forbid, run_cli

UNITS = 14  # gpt2-small: embedding, 12 blocks, head


def _one_line_exit_2(code: int, err: str, *parts: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def _metis(folder: Path, *kinds: str) -> Path:
    folder.mkdir(exist_ok=True)
    for kind in kinds:
        data = {"model": {"model_name": "GPT", "num_layers": UNITS},
                "execution_time": {"layer_compute_total_ms": [1.0] * UNITS, "optimizer_time_ms": 5.0}}
        (folder / f"DeviceType.{kind}_tp1_bs1.json").write_text(json.dumps(data))
    return folder


def _no_work(monkeypatch) -> None:
    """A refusal comes before anything is measured, imported or read."""
    import importlib

    calibrate = importlib.import_module("hetpart.runtime.calibrate")
    from hetpart.costmodel import profile_import
    from hetpart.runtime import speeds

    forbid(monkeypatch, "refused options must stop calibrate before it works",
           (calibrate, "calibrate_profile"), (profile_import, "import_metis"), (speeds, "speed_factors"))


# ------------------------------------------------------------------------------------ 1: options per mode
def test_speeds_from_refuses_the_options_it_does_not_use(capsys, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    records = tmp_path / "runs.jsonl"
    records.write_text("")
    out = tmp_path / "sp.yaml"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", str(records), "--out",
                           str(out), "--model", "llama2-70b", "--micro-batches", "garbage", "--scale", "huge",
                           "--import-metis", str(tmp_path), "--precision", "fp99")
    line = _one_line_exit_2(code, err, "--model, --micro-batches, --precision, --scale, --import-metis",
                            "do not apply to calibrate --speeds-from", "leave them out")
    assert "--tolerance" not in line and not out.exists()


def test_import_metis_refuses_the_measuring_options(capsys, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--model", "gpt2-small",
                           "--import-metis", str(_metis(tmp_path / "metis", "A100")), "--out", str(out),
                           "--scale", "huge", "--device", "tpu", "--micro-batches", "x", "--repeats", "-5",
                           "--tp-degrees", "y", "--no-links", "--tolerance", "0.2")
    _one_line_exit_2(code, err, "--tolerance, --micro-batches, --scale, --repeats, --no-links, --tp-degrees, --device",
                     "do not apply to calibrate --import-metis")
    assert not out.exists()


def test_an_option_given_at_its_default_value_is_still_refused(capsys, tmp_path, monkeypatch):
    """Given is given: ``--micro-batches 1,2,4,8`` (the default) with --import-metis is refused too."""
    _no_work(monkeypatch)
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--model", "gpt2-small",
                           "--import-metis", str(_metis(tmp_path / "metis", "A100")), "--out",
                           str(tmp_path / "p.json"), "--micro-batches", "1,2,4,8", "--device", "auto")
    line = _one_line_exit_2(code, err, "--micro-batches, --device: do not apply to calibrate --import-metis")
    assert "--model" not in line and not (tmp_path / "p.json").exists()  # the options the mode uses are not named


def test_measuring_refuses_speeds_and_metis_options(capsys, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--model", "gpt2-small", "--out",
                           str(tmp_path / "p.json"), "--tolerance", "0.2", "--bind", "A100=A100-40GB")
    line = _one_line_exit_2(code, err, "--tolerance, --bind: do not apply to calibrate measuring")
    assert "--model" not in line and not (tmp_path / "p.json").exists()


def test_the_values_a_mode_uses_are_still_checked(capsys, tmp_path, monkeypatch):
    _no_work(monkeypatch)
    metis = str(_metis(tmp_path / "metis", "A100"))
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--model", "gpt2-small",
                           "--import-metis", metis, "--out", str(tmp_path / "p.json"), "--precision", "fp99")
    assert "do not apply" not in _one_line_exit_2(code, err, "--precision: 'fp99'")  # a bad value, not a bad mode
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", metis, "--out",
                           str(tmp_path / "m.yaml"), "--tolerance", "2")
    assert "do not apply" not in _one_line_exit_2(code, err, "--tolerance: 2")
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "m.yaml").exists()


def test_help_keeps_the_documented_defaults():
    from typer.testing import CliRunner

    from hetpart.cli.app import app

    text = " ".join(CliRunner().invoke(app, ["calibrate", "--help"], env={"COLUMNS": "200"}).output.split())
    for default in ("[default: 0.1]", "[default: 1,2,4,8]", "[default: auto]", "[default: links]"):
        assert default in text, default


# ------------------------------------------------------------------------------------------- 2: --bind
def _tiny_mixed():
    from hetpart import load_cluster, load_model

    return load_cluster("tiny-mixed"), load_model("gpt2-small", seq_len=64, precision="bf16")


def test_an_explicit_bind_wins_over_another_types_name_prefix(tmp_path):
    cluster, model = _tiny_mixed()  # A100-40GB and V100-16GB
    folder = _metis(tmp_path / "metis", "A100", "H100", "V100")
    profile = import_metis(folder, model, cluster, "bf16", {"H100": ["A100-40GB"]})
    assert {t: b.device for t, b in profile.device_types.items()} == {"A100-40GB": "H100", "V100-16GB": "V100"}
    with pytest.raises(SpecError, match="A100-40GB is bound to both A100 and H100"):
        import_metis(folder, model, cluster, "bf16", {"H100": ["A100-40GB"], "A100": ["A100-40GB"]})


def test_a_bind_of_a_type_with_no_metis_file_is_refused_naming_the_types_found(tmp_path):
    cluster, model = _tiny_mixed()
    folder = _metis(tmp_path / "metis", "A100", "H100", "V100")
    with pytest.raises(SpecError, match=r"--bind: Z100: no Metis file of that type in .*metis \(it holds A100, "
                                        r"H100, V100\)"):
        import_metis(folder, model, cluster, "bf16", {"H100": ["A100-40GB"], "Z100": ["V100-16GB"]})


def test_the_probes_bind_through_the_cli(capsys, tmp_path):
    folder = str(_metis(tmp_path / "metis", "A100", "H100", "V100"))
    base = ("calibrate", "--cluster", "tiny-mixed", "--model", "gpt2-small", "--seq-len", "64", "--import-metis",
            folder, "--out", str(tmp_path / "p.json"))
    code, _, err = run_cli(capsys, *base, "--bind", "H100=A100-40GB,Z100=V100-16GB")
    _one_line_exit_2(code, err, "--bind: Z100: no Metis file", "A100, H100, V100")
    code, text, err = run_cli(capsys, *base, "--bind", "H100=A100-40GB", "--json")
    assert code == 0, err
    assert json.loads(text)["device_types"] == {"A100-40GB": "H100", "V100-16GB": "V100"}


# --------------------------------------------------------------------------------- 3: empty records file
def test_an_empty_records_file_is_named(capsys, tmp_path):
    records = tmp_path / "empty.jsonl"
    records.write_text("")
    out = tmp_path / "m.yaml"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", str(records), "--out",
                           str(out))
    _one_line_exit_2(code, err, f"--speeds-from: {records}: the run records hold no record", "hetpart run --out")
    assert not out.exists()


# ------------------------------------------------------------------------------------ 4: dashboard SIGTERM
def test_dashboard_ends_on_sigterm_with_143(tmp_path):
    hetpart = Path(sys.executable).with_name("hetpart")
    proc = subprocess.Popen([str(hetpart), "dashboard", "--logdir", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert re.search(r"http://127\.0\.0\.1:\d+/", line), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
        err = proc.stderr.read()
        assert "hetpart: interrupted: stopped by SIGTERM" in err and "Ctrl-C" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ------------------------------------------------------------------------------ 5: loop --ground cpu --cluster
def test_loop_on_the_cpu_ground_refuses_a_cluster(capsys, tmp_path, monkeypatch):
    from hetpart.experiments import loop

    forbid(monkeypatch, "refused before the loop starts", (loop, "run_loop"), (loop, "cpu_cluster"))
    out = tmp_path / "loop"
    code, _, err = run_cli(capsys, "loop", "--ground", "cpu", "--cluster", "h100-a100-two-zones", "--model",
                           "gpt2-small", "--out", str(out))
    _one_line_exit_2(code, err, "--cluster: h100-a100-two-zones is not used by --ground cpu",
                     "this machine's own cluster", "leave --cluster out")
    assert not out.exists()


# --------------------------------------------------------------------------------- 6: iteration numbering
def test_an_iteration_is_numbered_alike_on_stderr_in_the_json_and_in_the_files(tmp_path, monkeypatch):
    """One iteration step with the runs, fits and training stubbed out: what it says and what it writes."""
    from types import SimpleNamespace

    from hetpart.experiments import loop as loop_mod

    said: list[str] = []

    class Correction:
        r, linear, ridge = [], None, None

        def save(self, path):
            Path(path).write_text("{}")

    state = {"iterations": []}
    fake = SimpleNamespace(
        cfg=SimpleNamespace(iterations=1, policy_timesteps=0), say=said.append, out=tmp_path,
        state=SimpleNamespace(data=state, save=lambda: None), records=lambda: [], correction=lambda r: Correction(),
        predictor=lambda c: None, proposals=lambda *a: [], roles=lambda i: [],
        train_policy=lambda c, p, i, t: tmp_path / f"policy-{i}.zip")
    monkeypatch.setattr(loop_mod, "_held_out_errors", lambda *a: {"simulator_error_pct": 0.0,
                                                                   "learned_error_pct": 0.0, "held_out_runs": 0})
    tracker = SimpleNamespace(log=lambda *a, **k: None)
    path = loop_mod._iteration_step(fake, 0, None, None, tracker)
    assert state["iterations"][0]["iteration"] == 0 and path.name == "policy-0.zip"
    assert (tmp_path / "correction-0.json").exists()
    assert said[0].startswith("iteration 0 (1 of 1):"), said[0]
