"""One call handed to a forked child on another core, its value read back through a pipe.

The planners have work that depends on nothing the caller computes meanwhile: the ``proportional``
baseline beside the policy's decode, a second sharding level beside the first in ``search``. On Linux
with a second core, :class:`Forked` runs such a call in a forked child (the child inherits the model,
the cluster and the predictor's caches as they are, and sends the value back pickled) while the parent
goes on; :meth:`Forked.result` waits for it. Where no child can run (not Linux, one core, a predictor
that is not fork-safe: the learned model's torch thread pools do not survive a fork) or the child
fails, :meth:`Forked.result` makes the call in the process instead, so the value is the same either
way: only the wall time differs.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
from typing import Any, Callable

__all__ = ["Forked", "can_fork"]

ENABLED = True
"""Whether :class:`Forked` may fork at all (tests turn it off to compare the two ways)."""


def can_fork(predictor: Any) -> bool:
    """A child may run a planner's call: Linux (fork without exec is safe there for code that does not touch
    torch), a second core to run it on, and a predictor that says it is fork-safe (``fork_safe``: the
    simulator, NumPy only)."""
    if not (ENABLED and sys.platform.startswith("linux") and hasattr(os, "fork")):
        return False
    return len(os.sched_getaffinity(0)) >= 2 and bool(getattr(predictor, "fork_safe", False))


_FAILED = object()


class Forked:
    """``call(*args)`` in a forked child where :func:`can_fork` allows (``fork``: False runs it in the
    process, at :meth:`result`). Use :meth:`close` (or ``with``) so that a child whose value is no longer
    wanted (the caller raised) is killed and reaped."""

    def __init__(self, call: Callable[..., Any], *args: Any, fork: bool = True) -> None:
        self.call, self.args = call, args
        self.pid: int | None = None
        self.forked = False
        if not fork:
            return
        read, write = os.pipe()
        pid = -1
        gc.freeze()  # the child must never collect the parent's garbage (a torch process group left in a
        try:         # cycle blocks in its destructor there): frozen objects are outside every collection
            pid = os.fork()
        finally:
            if pid != 0:
                gc.unfreeze()
        if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
            try:
                os.close(read)
                try:
                    payload = pickle.dumps(("ok", call(*args)), protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException as exc:  # noqa: BLE001 (any failure: the parent computes it itself)
                    payload = pickle.dumps(("failed", repr(exc)))
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(payload)
            finally:
                os._exit(0)
        os.close(write)
        self.pid, self.read, self.forked = pid, read, True

    def result(self, fallback: Callable[[], Any] | None = None) -> Any:
        """The call's value: the child's, or (no child, or it failed) ``fallback()`` (default: the call)
        computed here."""
        value = self._collect()
        if value is _FAILED:
            return fallback() if fallback is not None else self.call(*self.args)
        return value

    def _collect(self) -> Any:
        if self.pid is None:
            return _FAILED
        with os.fdopen(self.read, "rb") as pipe:
            data = pipe.read()  # until the child closes its end
        os.waitpid(self.pid, 0)
        self.pid = None
        try:
            status, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 (a child killed mid-write: compute it here)
            return _FAILED
        return value if status == "ok" else _FAILED

    def close(self) -> None:
        """Stop and reap a child whose value is no longer wanted."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self.read)
            self.pid = None

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
