"""Faults: a rank that dies or hangs stops every rank with one error naming it, and leaves no process.

Two real torchrun jobs (a dead rank, a hung rank); the watchdog's blame rules on synthetic files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hetpart.errors import RuntimeFault
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.faults import FaultSpec, Watchdog, heartbeat_path, error_path, read_rank_state
from hetpart.runtime.launch import RunOptions, run_plan

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _plan() -> Plan:
    return Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})


def _worker_pids(run_dir) -> list[int]:
    return [json.loads(heartbeat_path(run_dir, r).read_text())["pid"] for r in range(2)]


def _assert_all_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone
        assert state in ("Z", "X"), f"worker {pid} still running (state {state})"


@pytest.mark.parametrize("kind, rank, pattern", [
    ("die", 1, r"rank 1 \(device 1/0/0, replica 0 stage 1\) died .* during step 1; all 2 ranks were stopped"),
    ("hang", 0, r"rank 0 \(device 0/0/0, replica 0 stage 0\) hung: no progress .* stuck at step 1 in faults.py"),
])
def test_a_faulty_rank_stops_every_rank_and_is_named(tmp_path, kind, rank, pattern):
    run_dir = tmp_path / "run"
    options = RunOptions(steps=3, warmup=0, emulate=False, hang_timeout_s=2.0,
                         fault=FaultSpec(rank=rank, kind=kind, step=1))
    with pytest.raises(RuntimeFault, match=pattern):
        run_plan(_plan(), options=options, run_dir=run_dir)
    _assert_all_gone(_worker_pids(run_dir))


def test_fault_spec_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="fault kind must be die, hang or raise"):
        FaultSpec(rank=0, kind="explode")


# ------------------------------------------------------------------------------------ blame rules
def _heartbeat(run_dir, rank, pid, *, step=2, progress=None, waiting=False, where="x.py:1 in f"):
    heartbeat_path(run_dir, rank).write_text(json.dumps(
        {"rank": rank, "pid": pid, "step": step, "last_progress": progress or time.time(), "written": time.time(),
         "where": where, "waiting_in_comm": waiting}))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _watchdog(run_dir, log=None, hang=60.0):
    return Watchdog(run_dir, lambda r: f"device {r}", 3, hang_timeout_s=hang, startup_timeout_s=60.0, launcher_log=log)


def test_a_vanished_rank_is_blamed_not_its_peers_with_lost_connections(tmp_path):
    me = os.getpid()
    _heartbeat(tmp_path, 0, me)
    _heartbeat(tmp_path, 1, _dead_pid())
    _heartbeat(tmp_path, 2, me)
    error_path(tmp_path, 0).write_text(json.dumps({"message": "DistBackendError: Connection closed by peer",
                                                    "comm": True}))
    fault = _watchdog(tmp_path).check()
    assert fault is not None and "rank 1 (device 1) died" in str(fault)


def test_ranks_torchrun_terminated_are_victims(tmp_path):
    victim, culprit = _dead_pid(), _dead_pid()
    _heartbeat(tmp_path, 0, victim)
    _heartbeat(tmp_path, 1, os.getpid())
    _heartbeat(tmp_path, 2, culprit)
    log = tmp_path / "torchrun.log"
    log.write_text(f"W1122 api.py:1028] Sending process {victim} closing signal SIGTERM\n")
    assert "rank 2 (device 2) died" in str(_watchdog(tmp_path, log).check())


def test_a_hang_blames_the_rank_outside_communication(tmp_path):
    old = time.time() - 100
    me = os.getpid()
    _heartbeat(tmp_path, 0, me, progress=old, waiting=True, where="c10d.py:9 in wait")
    _heartbeat(tmp_path, 1, me, progress=old + 5, waiting=False, where="loop.py:3 in spin")
    _heartbeat(tmp_path, 2, me, progress=old + 1, waiting=True, where="schedules.py:7 in _wait_batch_p2p")
    fault = _watchdog(tmp_path, hang=30).check()
    assert "rank 1 (device 1) hung" in str(fault) and "loop.py:3 in spin" in str(fault)
    assert _watchdog(tmp_path, hang=1000).check() is None  # within the limit: healthy


def test_startup_is_not_a_hang(tmp_path):
    me = os.getpid()
    for rank in range(3):
        _heartbeat(tmp_path, rank, me, step=-1, progress=time.time() - 100)
    assert _watchdog(tmp_path, hang=1).check() is None
    late = Watchdog(tmp_path, str, 3, hang_timeout_s=1, startup_timeout_s=0.0)
    time.sleep(0.01)
    assert "did not join the run within 0 s" in str(late.check())
    assert read_rank_state(tmp_path, 0).alive
