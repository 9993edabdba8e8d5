"""Issue 15, the runtime: progress, honest exit codes, no orphans, hangs caught in every phase, restarts.

Real torchrun jobs of a 2-rank plan (no emulation unless said: they only need to be alive). Every test
that starts a launcher kills its whole session in ``finally``, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hetpart.errors import PlanError, WorkerFault
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.faults import FaultSpec, heartbeat_path, process_alive
from hetpart.runtime.launch import RunOptions, run_plan
from tests._cli import run_cli

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")
HETPART = str(Path(sys.executable).with_name("hetpart"))


def _plan() -> Plan:
    return Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b", precision="fp16",  # V100: no bf16
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.time() + seconds
    while time.time() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if process_alive(p)]


def _start_cli_run(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    plan = tmp_path / "plan.json"
    _plan().save(plan)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([HETPART, "run", str(plan), "--steps", "500", "--warmup", "0", "--no-emulation",
                             "--run-dir", str(run_dir), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    return proc, run_dir


def _wait_for_step(run_dir: Path, proc: subprocess.Popen, timeout: float = 240.0) -> list[int]:
    """Wait until both ranks report a finished step; their pids."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            beats = [json.loads(heartbeat_path(run_dir, r).read_text()) for r in range(2)]
            if all(b.get("done_step", -1) >= 0 for b in beats):
                return [b["pid"] for b in beats]
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError("the ranks did not finish a step in time")


def _kill_session(proc: subprocess.Popen, pids: list[int]) -> None:
    for target in [proc.pid, *pids]:
        try:
            os.killpg(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait(timeout=30)


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_exits_130_with_a_json_error(tmp_path: Path) -> None:
    proc, run_dir = _start_cli_run(tmp_path, "--json")
    pids: list[int] = []
    try:
        pids = _wait_for_step(run_dir, proc) + _children(proc.pid)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends (to the launcher: torchrun has its own session)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        error = json.loads(out)  # stdout: exactly one JSON object
        assert error["kind"] == "interrupted" and "all 2 ranks were stopped" in error["error"]
        assert "hetpart: interrupted:" in err and "hetpart run: step 1/500" in err  # progress went to stderr
        assert _gone_within(pids, 10) == []
    finally:
        _kill_session(proc, pids)


@pytest.mark.slow
def test_kill_9_of_the_launcher_leaves_no_process(tmp_path: Path) -> None:
    proc, run_dir = _start_cli_run(tmp_path)
    pids: list[int] = []
    try:
        pids = _wait_for_step(run_dir, proc) + _children(proc.pid)  # torchrun and its workers
        assert len(pids) >= 3
        proc.kill()
        proc.wait(timeout=30)
        assert _gone_within(pids, 10) == []
    finally:
        _kill_session(proc, pids)


@pytest.mark.slow
@pytest.mark.parametrize("phase, pattern", [
    ("calibrate", r"rank 1 \(device 1/0/0, replica 0 stage 1\) hung: .* stuck at phase calibrate in faults.py"),
    ("checkpoint", r"rank 0 \(device 0/0/0, replica 0 stage 0\) hung: .* stuck at phase checkpoint after step 0"),
])
def test_a_hang_in_any_phase_is_caught_by_hetparts_timeout(tmp_path: Path, phase: str, pattern: str) -> None:
    # Before, a hang outside the steps waited for gloo's own timeout, which blamed a peer in gloo's words.
    options = RunOptions(steps=1, warmup=0, emulate=False, hang_timeout_s=5.0, checkpoint_dir=str(tmp_path / "ckpt"),
                         fault=FaultSpec(rank=1 if phase == "calibrate" else 0, kind="hang", phase=phase))
    with pytest.raises(WorkerFault, match=pattern) as info:
        run_plan(_plan(), options=options, run_dir=tmp_path / "run")
    assert info.value.exit_code == 3


@pytest.mark.slow
def test_progress_restarts_from_the_last_checkpoint_and_no_temporary_folder_left(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    reports = []
    options = RunOptions(steps=3, warmup=1, emulate=False, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=1,
                         max_restarts=1, fault=FaultSpec(rank=1, kind="die", step=2))
    result = run_plan(_plan(), options=options, on_progress=reports.append)
    restart = [r for r in reports if r.phase == "restart"]
    assert len(restart) == 1 and restart[0].resumed_from == 2 and "rank 1" in restart[0].message
    steps = [r for r in reports if r.step is not None and r.phase == "steps"]
    assert [r.done for r in steps] == [1, 2, 3, 4] and all(r.total == 4 for r in steps)  # each step once
    assert [r.warmup for r in steps] == [True, False, False, False]
    assert [r.resumed_from for r in steps] == [None, None, 2, 2] and [r.attempt for r in steps] == [0, 0, 1, 1]
    assert all(r.loss > 0 and r.step_time_s > 0 and r.tokens_per_s > 0 for r in steps)
    assert steps[0].eta_s > 0 and steps[-1].eta_s == 0
    assert result.resumed_from == 2 and result.measured.steps == 2
    assert result.run_dir is None and not list(tmp_path.glob("hetpart-run-*"))  # every run used to leave one


def test_a_bad_checkpoint_path_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    afile = tmp_path / "ckpt"
    afile.write_text("not a directory")
    with pytest.raises(PlanError, match=r"--checkpoint: .*ckpt is a file; give a directory"):
        run_plan(_plan(), options=RunOptions(steps=1, checkpoint_dir=str(afile)), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(PlanError, match=r"--checkpoint-every: needs --checkpoint DIR"):
        RunOptions(steps=1, checkpoint_every=2)


def test_exit_codes_and_json_errors(capsys, monkeypatch, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    _plan().save(plan)

    def failing(*args, **kwargs):
        raise WorkerFault("runtime: rank 1 (device 1/0/0) died during step 3; all 2 ranks were stopped")

    monkeypatch.setattr("hetpart.runtime.launch.run_plan", failing)
    code, out, err = run_cli(capsys, "run", str(plan), "--json")
    assert code == 3 and json.loads(out) == {"error": "runtime: rank 1 (device 1/0/0) died during step 3; all 2 ranks "
                                                      "were stopped", "kind": "run_failed", "exit_code": 3}
    assert err.startswith("hetpart: error: runtime: rank 1")
    code, out, err = run_cli(capsys, "plan", "-m", "nope-model", "-c", "tiny-mixed", "--json")
    assert code == 2 and json.loads(out)["kind"] == "bad_input" and err.count("\n") == 1
    code, out, _ = run_cli(capsys, "plan", "--bogus-flag", "--json")
    assert code == 2 and json.loads(out)["kind"] == "usage"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("hetpart.runtime.launch.run_plan", interrupted)
    code, out, err = run_cli(capsys, "run", str(plan), "--json")
    assert code == 130 and json.loads(out)["kind"] == "interrupted" and "interrupted" in err


def test_the_run_cli_prints_progress_lines_on_stderr(capsys) -> None:
    from hetpart.cli.run_cmd import _Progress
    from hetpart.experiments.tracking import NullTracker
    from hetpart.runtime.launch import RunProgress

    class Recording(NullTracker):
        logged: list = []

        def log(self, metrics, step):
            self.logged.append((step, dict(metrics)))

    tracker = Recording()
    progress = _Progress(2, tracker)
    progress(RunProgress(phase="calibrate", done=0, total=4))
    for done in (1, 2):
        progress(RunProgress(phase="steps", done=done, total=4, step=done - 1, warmup=done == 1, loss=5.5, step_time_s=1.5,
                             tokens_per_s=1234.0, eta_s=3.0 * (4 - done)))
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["hetpart run: calibrating the emulation",
                                "hetpart run: step 2/4, loss 5.5000, 1.50 s/step, 1,234 tokens/s, ETA 6s"]
    assert tracker.logged == [(s, {"run/loss": 5.5, "run/step_time_s": 1.5, "run/tokens_per_s": 1234.0}) for s in (0, 1)]


def test_a_hang_before_the_rendezvous_blames_the_rank_that_did_not_join(tmp_path: Path) -> None:
    from hetpart.runtime.faults import Watchdog

    now, me = time.time(), os.getpid()
    beats = [{"phase": "rendezvous", "waiting_in_comm": True, "where": "rendezvous.py:9 in _wait"},
             {"phase": "start", "waiting_in_comm": False, "where": "spin.py:3 in loop"},
             {"phase": "build", "waiting_in_comm": False, "where": "engine.py:5 in build"}]
    for rank, beat in enumerate(beats):
        heartbeat_path(tmp_path, rank).write_text(json.dumps(
            {"rank": rank, "pid": me, "step": -1, "last_progress": now - 100, "written": now, **beat}))
    assert Watchdog(tmp_path, str, 3, hang_timeout_s=1, startup_timeout_s=1000).check() is None  # building: start-up
    fault = Watchdog(tmp_path, lambda r: f"device {r}", 3, hang_timeout_s=1, startup_timeout_s=0.0).check()
    assert isinstance(fault, WorkerFault) and fault.exit_code == 3
    assert "ranks [1] did not join the run within 0 s (rank 1, device 1, is in phase start at spin.py:3" in str(fault)


def test_run_tracks_to_tensorboard_through_the_experiments_tracker(tmp_path: Path) -> None:
    from hetpart.cli.run_cmd import _Progress, _tracker
    from hetpart.runtime.launch import RunProgress

    tracker = _tracker("tensorboard", str(tmp_path / "runs"), 0, {"plan": "p.json"})
    _Progress(0, tracker)(RunProgress(phase="steps", done=1, total=2, step=0, loss=5.0, step_time_s=2.0,
                                      tokens_per_s=100.0))
    tracker.finish()
    assert tracker.run_dir is not None and tracker.run_dir.name.startswith("run__0__")
    assert list(tracker.run_dir.glob("events.out.tfevents.*"))
