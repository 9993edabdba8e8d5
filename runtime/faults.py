"""Faults: per-rank heartbeats, a watchdog that names the rank that died or hung, and fault injection.

Every worker runs a :class:`Heartbeat` thread that writes a small JSON file (pid, step, last progress,
where its main thread is) twice a second. The launcher's :class:`Watchdog` reads those files: a rank
whose process is gone without a result is dead; when no rank has made progress for ``hang_timeout_s``
the run hangs, and the rank to blame is the one whose main thread is NOT waiting inside
``torch.distributed`` (the others wait on it). Either way the launcher kills every worker and raises
one :class:`~hetpart.errors.WorkerFault` (exit code 3) naming the rank.

Faults are injected for tests with :class:`FaultSpec` (a job-file field, not a user option).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from hetpart.errors import WorkerFault

__all__ = ["FaultSpec", "Heartbeat", "RankState", "Watchdog", "read_rank_state", "kill_pid_tree", "process_alive",
           "heartbeat_path", "error_path", "result_path", "die_with_parent", "PHASES", "LAUNCHER_PID_ENV"]

PHASES = ("start", "rendezvous", "build", "calibrate", "steps", "checkpoint", "done")
"""A rank's phases in order: importing (``start``), joining the process group (``rendezvous``), building
its model (``build``), calibrating the emulation (``calibrate``), training (``steps``), saving
(``checkpoint``). The first three count against the start-up limit, the others against the hang limit."""
_STARTING = ("start", "rendezvous", "build")
LAUNCHER_PID_ENV = "HETPART_LAUNCHER_PID"
"""The launcher's pid, given to the workers: a worker whose launcher is gone kills itself."""
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``); a no-op
    elsewhere. The launcher sets it in torchrun, torchrun's workers set it in themselves, so a
    ``kill -9`` of the launcher takes torchrun and every worker with it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the heartbeat's launcher check remains
        pass

_HEARTBEAT_PERIOD_S = 0.5
HISTORY_STEPS = 64
"""Finished steps a heartbeat file remembers (the launcher reports each, even between two polls)."""
_COMM_MARKERS = (os.sep + "torch" + os.sep + "distributed" + os.sep,)


def heartbeat_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.heartbeat.json"


def error_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.error.json"


def result_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.result.json"


@dataclass(frozen=True)
class FaultSpec:
    """A fault to inject into one rank (tests and drills only)."""

    rank: int
    """The rank that misbehaves."""
    kind: Literal["die", "hang", "raise"]
    """``die``: SIGKILL itself; ``hang``: sleep forever; ``raise``: raise an exception."""
    step: int = 1
    """The (0-based, warm-up included) step during whose first compute the fault fires (phase ``steps``)."""
    phase: Literal["start", "calibrate", "steps", "checkpoint"] = "steps"
    """When: before joining the process group, while calibrating, in a step, or before a checkpoint."""

    def __post_init__(self) -> None:
        if self.kind not in ("die", "hang", "raise"):
            raise ValueError(f"fault kind must be die, hang or raise, got {self.kind!r}")
        if self.phase not in ("start", "calibrate", "steps", "checkpoint"):
            raise ValueError(f"fault phase must be start, calibrate, steps or checkpoint, got {self.phase!r}")

    def fire_in(self, phase: str, rank: int) -> None:
        """Misbehave now if this is the fault's rank and ``phase`` (``steps`` faults fire from the hooks)."""
        if rank == self.rank and phase == self.phase and phase != "steps":
            self.fire()

    def to_dict(self) -> dict:
        return asdict(self)

    def fire(self) -> None:
        """Misbehave now (called in the faulty rank's main thread)."""
        if self.kind == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            while True:  # pragma: no branch - a hang never ends; the watchdog kills us
                time.sleep(3600)
        at = f"step {self.step}" if self.phase == "steps" else f"phase {self.phase}"
        raise RuntimeError(f"injected fault in rank {self.rank} at {at}")


class Heartbeat:
    """A daemon thread in a worker that reports progress to ``rank{r}.heartbeat.json``.

    ``progress()`` is called by the worker on every hook event and step boundary (cheap: two
    attribute writes). ``busy(seconds)`` marks a deliberate emulation sleep as progress.
    """

    def __init__(self, run_dir: str | Path, rank: int, launcher_pid: int | None = None) -> None:
        self.path = heartbeat_path(run_dir, rank)
        self.rank = rank
        self.step = -1
        self.phase = "start"
        self.done_step = -1
        """The last step this rank finished (-1: none yet)."""
        self.loss: float | None = None
        self.step_s: float | None = None
        self.resumed_from: int | None = None
        self.history: list[list[float]] = []
        """``[step, loss, seconds]`` of the last finished steps."""
        self.launcher_pid = launcher_pid
        self._last_progress = time.time()
        self._busy_until = 0.0
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hetpart-heartbeat-{rank}", daemon=True)

    def start(self) -> "Heartbeat":
        self._write()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._write()

    def progress(self, step: int | None = None) -> None:
        self._last_progress = time.time()
        if step is not None and step != self.step:
            self.step = step
            self._write()  # the launcher should name the right step even right after a fault

    def enter(self, phase: str) -> None:
        """This rank starts ``phase`` (one of :data:`PHASES`); entering a phase is progress."""
        self.phase = phase
        self._last_progress = time.time()
        self._write()

    def finished_step(self, step: int, loss: float, seconds: float) -> None:
        """Step ``step`` is done: its loss and wall time go to the launcher at once (progress output);
        the last few stay in the file, so that a launcher polling slower than the steps misses none."""
        self.done_step, self.loss, self.step_s = step, loss, seconds
        self.history = (self.history + [[step, loss, seconds]])[-HISTORY_STEPS:]
        self._last_progress = time.time()
        self._write()

    def busy(self, seconds: float) -> None:
        self._busy_until = max(self._busy_until, time.time() + seconds)
        self._last_progress = time.time()

    def _run(self) -> None:
        while not self._stop.wait(_HEARTBEAT_PERIOD_S):
            if self.launcher_pid is not None and not process_alive(self.launcher_pid):
                os.kill(os.getpid(), signal.SIGKILL)  # the launcher is gone (kill -9): nobody will stop us
            self._write()

    def _where(self) -> tuple[str, bool]:
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return "", False
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
        waiting = any(m in frame.f_code.co_filename for m in _COMM_MARKERS)
        return where, waiting

    def _write(self) -> None:
        now = time.time()
        where, waiting = self._where()
        last = now if now < self._busy_until else self._last_progress
        state = {"rank": self.rank, "pid": os.getpid(), "step": self.step, "last_progress": last,
                 "written": now, "where": where, "waiting_in_comm": waiting, "phase": self.phase,
                 "done_step": self.done_step, "loss": self.loss, "step_s": self.step_s,
                 "resumed_from": self.resumed_from, "history": self.history}
        tmp = self.path.with_suffix(f".{threading.get_ident()}.tmp")  # main and heartbeat thread both write
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class RankState:
    """What the launcher knows about one rank."""

    rank: int
    pid: int | None
    step: int
    last_progress: float
    where: str
    waiting_in_comm: bool
    alive: bool
    finished: bool
    error: str | None
    error_is_comm: bool
    phase: str = "start"
    done_step: int = -1
    loss: float | None = None
    step_s: float | None = None
    resumed_from: int | None = None
    history: tuple = ()
    """``(step, loss, seconds)`` of the rank's last finished steps."""


def read_rank_state(run_dir: str | Path, rank: int) -> RankState:
    """The current state of ``rank`` from its heartbeat, result and error files."""
    hb = _read_json(heartbeat_path(run_dir, rank)) or {}
    err = _read_json(error_path(run_dir, rank))
    pid = hb.get("pid")
    return RankState(rank=rank, pid=pid, step=int(hb.get("step", -1)), last_progress=float(hb.get("last_progress", 0.0)),
                     where=str(hb.get("where", "")), waiting_in_comm=bool(hb.get("waiting_in_comm", False)),
                     alive=pid is not None and process_alive(pid), finished=result_path(run_dir, rank).exists(),
                     error=err.get("message") if err else None, error_is_comm=bool(err and err.get("comm")),
                     phase=str(hb.get("phase") or ("steps" if int(hb.get("step", -1)) >= 0 else "start")), done_step=int(hb.get("done_step", -1)),
                     loss=hb.get("loss"), step_s=hb.get("step_s"), resumed_from=hb.get("resumed_from"),
                     history=tuple(tuple(h) for h in hb.get("history") or ()))


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def kill_pid_tree(pid: int) -> None:
    """SIGKILL a worker we started and its session (torchrun starts each worker in its own session)."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


class Watchdog:
    """Decides, from the ranks' files, whether a run failed and which rank to blame.

    Args:
        run_dir: the directory of the ranks' heartbeat/result/error files.
        describe: ``rank -> str`` naming a rank's device and stage for messages.
        world_size: number of ranks.
        hang_timeout_s: seconds without progress on every rank that count as a hang.
        startup_timeout_s: seconds a rank may take to reach its first step.
        launcher_log: torchrun's log: the ranks it terminated after a failure are victims, not causes.
        ranks: the ranks this machine runs and watches (default: all ``world_size``; ``hetpart run --nnodes``
            watches each machine's own).
    """

    def __init__(self, run_dir: str | Path, describe, world_size: int, hang_timeout_s: float,
                 startup_timeout_s: float, launcher_log: str | Path | None = None,
                 ranks: "list[int] | None" = None) -> None:
        self.run_dir = Path(run_dir)
        self.launcher_log = Path(launcher_log) if launcher_log else None
        self.describe = describe
        self.world_size = world_size
        self.ranks = list(range(world_size)) if ranks is None else list(ranks)
        self.scope = (f"all {world_size} ranks" if len(self.ranks) == world_size else
                      f"this machine's {len(self.ranks)} ranks (of {world_size})")
        self.hang_timeout_s = hang_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.started = time.time()

    def states(self) -> list[RankState]:
        return [read_rank_state(self.run_dir, r) for r in self.ranks]

    def check(self, states: list[RankState] | None = None) -> WorkerFault | None:
        """A fault when one rank died, raised or hung; None while the run is healthy."""
        states = self.states() if states is None else states
        failed = [s for s in states if s.error or (s.pid is not None and not s.alive and not s.finished)]
        if failed:
            return self._blame_failure(failed)
        now = time.time()
        running = [s for s in states if not s.finished]
        # Until every rank joined the process group (imports, model building, rendezvous) the
        # startup limit applies; from then on (calibration, steps, checkpoints) the hang limit.
        starting = [s for s in running if s.phase in _STARTING]
        if starting:
            if now - self.started > self.startup_timeout_s:
                stuck = ([s for s in starting if s.phase == "start" and not s.waiting_in_comm]
                         or [s for s in starting if not s.waiting_in_comm] or starting)
                return WorkerFault(f"runtime: ranks {[s.rank for s in stuck]} did not join the run within "
                                   f"{self.startup_timeout_s:.0f} s (rank {stuck[0].rank}, "
                                   f"{self.describe(stuck[0].rank)}, is in phase {stuck[0].phase} at "
                                   f"{stuck[0].where or 'unknown code'}); {self.scope} were stopped; "
                                   f"see the worker logs in {self.run_dir / 'logs'}")
            return None
        if running and now - max(s.last_progress for s in running) > self.hang_timeout_s:
            return self._blame_hang(running, now)
        return None

    def _blame_failure(self, failed: list[RankState]) -> WorkerFault:
        # A rank that vanished or raised its own error is the cause; peers that lost their
        # connection to it (comm errors) or that torchrun terminated after it are its victims.
        victims = self._terminated_by_torchrun()
        primary = ([s for s in failed if not s.error_is_comm and s.pid not in victims]
                   or [s for s in failed if not s.error_is_comm] or failed)
        s = primary[0]
        what = f"failed: {s.error}" if s.error else "died (its process is gone without a result)"
        when = f"during step {s.step}" if s.step >= 0 else "before its first step"
        return WorkerFault(f"runtime: rank {s.rank} ({self.describe(s.rank)}) {what} {when}; "
                           f"{self.scope} were stopped; logs in {self.run_dir / 'logs'}")

    def _terminated_by_torchrun(self) -> set[int]:
        """Pids that torchrun's agent sent a closing signal (it logs each before sending it)."""
        if self.launcher_log is None:
            return set()
        try:
            text = self.launcher_log.read_text(errors="replace")
        except OSError:
            return set()
        return {int(m) for m in re.findall(r"Sending process (\d+) closing signal", text)}

    def _blame_hang(self, running: list[RankState], now: float) -> WorkerFault:
        stuck = [s for s in running if not s.waiting_in_comm] or running
        s = min(stuck, key=lambda x: x.last_progress)
        at = f"step {max(s.step, 0)}" if s.phase == "steps" else f"phase {s.phase}"
        if s.phase == "checkpoint":
            at += f" after step {s.done_step}"
        return WorkerFault(f"runtime: rank {s.rank} ({self.describe(s.rank)}) hung: no progress on any rank for "
                           f"{now - max(x.last_progress for x in running):.0f} s (limit {self.hang_timeout_s:g} s); "
                           f"rank {s.rank} is stuck at {at} in {s.where or 'unknown code'} while the "
                           f"others wait on it; {self.scope} were stopped")
