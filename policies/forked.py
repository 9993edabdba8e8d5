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
import select
import signal
import struct
import sys
from typing import Any, Callable, Iterator

__all__ = ["Forked", "Staged", "can_fork"]

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


class Staged:
    """``call(*args)``, a generator, in a forked child where ``fork`` allows: each value it yields comes back
    on its own, in order (:meth:`next`), as soon as the child has it, so the parent can take an early value
    (the structure walk's first prices) long before the last (the ``proportional`` baseline). Where no child
    runs, or it failed before sending a value, :meth:`next` returns its ``fallback()``: the caller computes
    that value itself, as it would without a child. Use :meth:`close` (or ``with``)."""

    def __init__(self, call: Callable[..., Iterator[Any]], *args: Any, fork: bool = True) -> None:
        self.pid: int | None = None
        self.forked = False
        self.failed = False
        """Whether the child ended before sending every value asked for (they are computed here)."""
        if not fork:
            return
        read, write = os.pipe()
        pid = -1
        gc.freeze()  # as Forked: the child never collects the parent's garbage
        try:
            pid = os.fork()
        finally:
            if pid != 0:
                gc.unfreeze()
        if pid == 0:
            try:
                os.close(read)
                with os.fdopen(write, "wb") as pipe:
                    try:
                        for value in call(*args):
                            _send(pipe, value)
                    except BaseException:  # noqa: BLE001 (the values not sent are computed by the parent)
                        pass
            finally:
                os._exit(0)
        os.close(write)
        self.pid, self.pipe, self.forked = pid, os.fdopen(read, "rb", buffering=0), True

    def ready(self) -> bool:
        """Whether :meth:`next` would return without waiting for the child (True where there is none)."""
        if self.pid is None:
            return True
        return bool(select.select([self.pipe], [], [], 0)[0])

    def next(self, fallback: Callable[[], Any]) -> Any:
        """The child's next value (waiting for it), or ``fallback()`` where it has none to send."""
        if self.pid is None:
            return fallback()
        head = _read(self.pipe, 8)
        data = _read(self.pipe, struct.unpack("<Q", head)[0]) if len(head) == 8 else b""
        try:
            return pickle.loads(data)
        except Exception:  # noqa: BLE001 (the child ended or was killed mid-write)
            self.failed = True
            self.close()
            return fallback()

    def close(self) -> None:
        """Stop and reap the child (its remaining values are no longer wanted)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pipe.close()
            self.pid = None

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(pipe, size: int) -> bytes:
    """``size`` bytes from an unbuffered pipe, fewer where the child closed it first."""
    parts, left = [], size
    while left:
        part = pipe.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _send(pipe, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()
