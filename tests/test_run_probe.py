"""Probe of ``hetpart run`` (2026-11-29): what it refused too late, ignored silently or counted twice.

1-2. A ``--checkpoint`` written for another scale or another model: the ranks started and calibrated, then
     DCP's CheckpointException (a BaseException, past ``except Exception``) surfaced as a raw traceback
     (exit 3); another model of the same unit count "resumed" silently. Now hetpart_checkpoint.json names
     the model that ran and a mismatch is refused before any rank starts (exit 2, one line).
3.   ``--out`` naming a directory ran every step, then died with IsADirectoryError (exit 1, record lost).
4.   An interleaved run's per-stage rows repeated each rank's whole figures once per chunk.
5.   ``--no-emulation`` silently ignored ``--time-factor``/``--links``/``--netem`` and still said
     "calibrating the emulation".
6.   A resumed run said "saving a checkpoint after step 3" of a checkpoint whose next_step is 6.

Everything but one test fails before any process starts (``launch`` is forbidden there).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetpart.errors import PlanError, RuntimeFault
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime import launch as launch_module
from hetpart.runtime.launch import RunOptions, prepare_run
from tests._cli import forbid, run_cli

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _plan(schedule: str = "1f1b", **kw) -> Plan:
    return Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule=schedule, precision="fp16",  # V100: no bf16
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"}, **kw)


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan().to_dict()))
    return path


@pytest.fixture
def no_launch(monkeypatch):
    forbid(monkeypatch, "a process started before the refusal", (launch_module, "launch"),
           (launch_module, "_netem_setup"))


def _identity(scale="tiny", model="gpt2-small") -> dict:
    return prepare_run(_plan(), model, "tiny-mixed", RunOptions(steps=1, warmup=0, scale=scale)).checkpoint_identity


def _checkpoint(directory: Path, meta: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hetpart_checkpoint.json").write_text(json.dumps(meta))
    return directory


def _other_model(tmp_path: Path) -> Path:
    """A GPT-2 config.json of another width (its shrunken run has gpt2-small's unit count)."""
    path = tmp_path / "other" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1024,
                                "n_layer": 12, "n_head": 16, "n_positions": 1024, "vocab_size": 50257}))
    return path


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hetpart: error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ 1-2: checkpoints of another scale or model
def test_a_checkpoint_of_another_scale_is_refused_before_any_rank_starts(tmp_path, plan_file, no_launch, capsys):
    ckpt = _checkpoint(tmp_path / "ck", {"next_step": 6, **_identity("tiny")})
    code, out, err = run_cli(capsys, "run", str(plan_file), "--steps", "1", "--warmup", "0", "--scale", "small",
                             "--checkpoint", str(ckpt), "--run-dir", str(tmp_path / "run"), "--json")
    line = _one_line_error(err)
    assert code == 2 and json.loads(out)["kind"] == "bad_input"
    assert f"--checkpoint: {ckpt} holds a checkpoint of another size of the model" in line
    assert "hidden_size" in line and "hidden 64" in line and "hidden 256" in line and "--scale tiny" in line
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_of_another_model_is_refused_before_any_rank_starts(tmp_path, plan_file, no_launch, capsys):
    ckpt = _checkpoint(tmp_path / "ck", {"next_step": 6, **_identity("tiny")})
    other = _other_model(tmp_path)
    code, _, err = run_cli(capsys, "run", str(plan_file), "--model", str(other), "--steps", "1", "--warmup", "0",
                           "--checkpoint", str(ckpt))
    line = _one_line_error(err)
    assert code == 2 and "holds a checkpoint of another model (gpt2-small" in line and "differs in model" in line
    assert "--model gpt2-small" in line
    assert json.loads((ckpt / "hetpart_checkpoint.json").read_text())["model"] == "gpt2-small"  # not rewritten


def test_an_old_checkpoint_is_compared_on_what_it_keeps(tmp_path) -> None:
    from hetpart.runtime.checkpoint import identity_mismatch

    ident = _identity("tiny")
    old = {"next_step": 3, "model": "gpt2-small", "num_units": 14}  # written before the identity was kept
    assert identity_mismatch("ck", old, ident) is None
    prepare_run(_plan(), "gpt2-small", "tiny-mixed",
                RunOptions(steps=1, checkpoint_dir=str(_checkpoint(tmp_path / "old", old))))  # accepted
    assert "differs in model" in identity_mismatch("ck", dict(old, model="other"), ident)
    assert "differs in num_units" in identity_mismatch("ck", dict(old, num_units=5), ident)
    with pytest.raises(PlanError, match="differs in model"):
        prepare_run(_plan(), "gpt2-small", "tiny-mixed", RunOptions(
            steps=1, checkpoint_dir=str(_checkpoint(tmp_path / "foreign", dict(old, model="other")))))


def test_checkpoint_metadata_that_is_not_hetparts_is_bad_input(tmp_path) -> None:
    bad = tmp_path / "ck"
    bad.mkdir()
    (bad / "hetpart_checkpoint.json").write_text("{not json")
    with pytest.raises(PlanError, match="--checkpoint: .*unreadable checkpoint metadata"):
        prepare_run(_plan(), "gpt2-small", "tiny-mixed", RunOptions(steps=1, checkpoint_dir=str(bad)))
    (bad / "hetpart_checkpoint.json").write_text("[1]")
    with pytest.raises(PlanError, match="not a hetpart checkpoint's metadata"):
        prepare_run(_plan(), "gpt2-small", "tiny-mixed", RunOptions(steps=1, checkpoint_dir=str(bad)))


def test_dcps_checkpoint_exception_becomes_one_clean_line(tmp_path, monkeypatch) -> None:
    """CheckpointException derives from BaseException: ``except Exception`` let its tracebacks through."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from hetpart.runtime.checkpoint import load_checkpoint

    assert not issubclass(CheckpointException, Exception)  # why the old handler missed it

    def fails(*_a, **_k):
        try:
            raise ValueError("Size mismatch between saved torch.Size([64]) and current: torch.Size([256]) for x")
        except ValueError as exc:
            raise CheckpointException("load failed", {0: (exc, traceback.extract_tb(exc.__traceback__))}) from None

    monkeypatch.setattr(dcp, "load", fails)
    ckpt = _checkpoint(tmp_path / "ck", {"next_step": 2, "model": "gpt2-small", "num_units": 1})
    (ckpt / ".metadata").write_bytes(b"")  # a complete save's marker: the load reaches DCP (patched above)
    executor = SimpleNamespace(params={}, infos=[None], optimizer=SimpleNamespace(state={}), sharded_keys=set(),
                               dist_optimizer=None, _slices={})
    with pytest.raises(RuntimeFault) as info:
        load_checkpoint(ckpt, executor)
    text = str(info.value)
    assert "cannot resume from this checkpoint (Size mismatch between saved torch.Size([64])" in text
    assert "Traceback" not in text and "\n" not in text and "give another --checkpoint" in text
    with pytest.raises(RuntimeFault, match="differs in model"):  # a rank refuses another model before DCP, too
        load_checkpoint(ckpt, executor, dict(_identity("tiny"), model="other", num_units=1))


# The workers' side (they write the identity the launcher checks) runs in tests/test_runtime_run.py's
# test_checkpoint_resume_continues_the_same_losses, on the checkpoint that test writes anyway.


# ------------------------------------------------------------------ 3: --out checked before the run
def test_out_that_is_a_directory_is_refused_before_any_process(tmp_path, plan_file, no_launch, capsys):
    folder = tmp_path / "cm"
    folder.mkdir()
    code, out, err = run_cli(capsys, "run", str(plan_file), "--steps", "1", "--warmup", "0", "--out", str(folder),
                             "--json")
    assert code == 2 and json.loads(out)["kind"] == "bad_input"
    assert f"--out: {folder} is a directory" in _one_line_error(err)


@pytest.mark.parametrize("content", [b'{"a": 1}\n', b"\x80\x81 binary", b"not json\n"])
def test_out_that_holds_no_run_records_is_refused(tmp_path, plan_file, no_launch, capsys, content):
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_bytes(content)
    code, _, err = run_cli(capsys, "run", str(plan_file), "--steps", "1", "--out", str(foreign))
    assert code == 2 and "does not hold hetpart run records" in _one_line_error(err)
    assert foreign.read_bytes() == content


def test_out_under_a_file_is_refused(tmp_path, plan_file, no_launch, capsys):
    (tmp_path / "afile").write_text("")
    code, _, err = run_cli(capsys, "run", str(plan_file), "--steps", "1", "--out", str(tmp_path / "afile" / "r.jsonl"))
    assert code == 2 and "is not a directory" in _one_line_error(err)


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_out_that_is_not_writable_is_refused(tmp_path):
    from hetpart.records import RecordError, check_records_target

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(RecordError, match="is not writable"):
            check_records_target(locked / "r.jsonl")
    finally:
        locked.chmod(0o700)


def test_out_accepts_run_records_new_files_and_appends_on_a_line_of_its_own(tmp_path):
    from hetpart.records import EXAMPLE_LINE, RunRecord, append_record, check_records_target, load_records

    check_records_target(tmp_path / "new" / "deeper" / "r.jsonl")
    assert not (tmp_path / "new").exists()  # the check creates nothing
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    check_records_target(empty)
    runs = tmp_path / "runs.jsonl"
    runs.write_text(EXAMPLE_LINE)  # no newline after the last record
    check_records_target(runs)
    append_record(runs, RunRecord.from_dict(json.loads(EXAMPLE_LINE)))
    assert len(load_records(runs)) == 2


# ------------------------------------------------------------------ 4: interleaved rows
def _ranks(times: dict[str, tuple[float, float, float, float]]) -> list[dict]:
    return [{"rank": i, "device": d, "compute_s": c, "comm_s": m, "optimizer_s": o, "idle_s": w}
            for i, (d, (c, m, o, w)) in enumerate(times.items())]


def test_an_interleaved_ranks_chunks_are_one_row_not_counted_twice() -> None:
    from hetpart.runtime.measure import _stage_summary

    plan = Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="interleaved", interleave=2, precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 4), ("0/0/0",)), Stage((4, 7), ("1/0/0",)),
                                        Stage((7, 11), ("0/0/0",)), Stage((11, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    ranks = _ranks({"0/0/0": (0.5, 0.2, 0.1, 0.2), "1/0/0": (0.6, 0.1, 0.1, 0.2)})
    rows = _stage_summary(ranks, plan)
    assert [(r["stage"], r["stages"], r["chunks"], r["layers"], r["ranks"]) for r in rows] == [
        (0, [0, 2], [[0, 4], [7, 11]], [0, 4], [0]), (1, [1, 3], [[4, 7], [11, 14]], [4, 7], [1])]
    for row, rank in zip(rows, ranks):  # each rank's step once: the rows add up to the ranks, not twice them
        assert sum(row[k] for k in ("compute_s", "comm_s", "optimizer_s", "idle_s")) == pytest.approx(1.0)
        assert row["compute_s"] == rank["compute_s"]
    plain = _stage_summary(ranks, _plan())  # without interleaving: one row per stage, as before
    assert [(r["stage"], r["stages"], r["chunks"], r["layers"]) for r in plain] == [
        (0, [0], [[0, 8]], [0, 8]), (1, [1], [[8, 14]], [8, 14])]


def test_the_run_table_lists_an_interleaved_rows_chunks(capsys) -> None:
    from hetpart.cli import run_cmd

    rows = [{"replica": 0, "stage": 0, "stages": [0, 2], "chunks": [[0, 4], [7, 11]], "layers": [0, 4],
             "devices": ["0/0/0"], "ranks": [0], "compute_s": 0.5, "comm_s": 0.2, "optimizer_s": 0.1, "idle_s": 0.2}]
    summary = {"measured": {"step_time_s": 1.0, "tokens_per_s": 1.0, "samples_per_s": 1.0, "stages": rows,
                            "losses": [5.0], "peak_memory_gb": {}, "memory_method": "x"},
               "predicted": None, "steps": 1, "warmup": 0, "run_dir": None, "resumed_from": None,
               "model": {"name": "m", "shrunken": False, "num_units": 14, "num_params": 10},
               "emulation": {"enabled": False}}
    run_cmd._show(SimpleNamespace(summary=lambda: summary))
    out = capsys.readouterr().out
    assert "0+2" in out and "0-3,7-10" in out and "its chunks together" in out


# ------------------------------------------------------------------ 5: emulation-only options
@pytest.mark.parametrize("flags,named", [(["--time-factor", "1000", "--links", "compute"], "--time-factor, --links"),
                                         (["--netem"], "--netem"), (["--links", "balanced"], "--links")])
def test_emulation_options_with_no_emulation_are_refused(plan_file, no_launch, capsys, flags, named):
    code, _, err = run_cli(capsys, "run", str(plan_file), "--steps", "1", "--no-emulation", *flags)
    line = _one_line_error(err)
    assert code == 2 and line.startswith(f"hetpart: error: {named}: only shape the emulation") and "--no-emulation" in line


def test_run_options_refuse_emulation_settings_without_emulation() -> None:
    with pytest.raises(PlanError, match="--time-factor: only shape the emulation"):
        RunOptions(emulate=False, time_factor=10.0)
    with pytest.raises(PlanError, match="--netem: only shape the emulation"):
        RunOptions(emulate=False, netem=True)
    RunOptions(emulate=False)  # still fine


def _progress_lines(capsys, emulate: bool, *reports) -> list[str]:
    from hetpart.cli.run_cmd import _Progress
    from hetpart.experiments.tracking import NullTracker

    progress = _Progress(1, NullTracker(), emulate=emulate)
    for report in reports:
        progress(report)
    return capsys.readouterr().err.splitlines()


def test_no_emulation_does_not_say_it_calibrates_the_emulation(capsys) -> None:
    from hetpart.runtime.launch import RunProgress

    lines = _progress_lines(capsys, False, RunProgress(phase="calibrate", done=0, total=1))
    assert lines == ["hetpart run: preparing the steps (no emulation)"]
    assert _progress_lines(capsys, True, RunProgress(phase="calibrate", done=0, total=1)) == [
        "hetpart run: calibrating the emulation"]


# ------------------------------------------------------------------ 6: the checkpoint line's step
def test_a_resumed_run_names_the_global_step_it_checkpoints(capsys) -> None:
    from hetpart.runtime.launch import RunProgress

    # resumed from step 3, three steps run: step index 5 finished, the checkpoint's next_step is 6
    lines = _progress_lines(capsys, True, RunProgress(phase="checkpoint", done=3, total=3, step=5, resumed_from=3))
    assert lines == ["hetpart run: saving a checkpoint after step 6"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
