"""The clock the planners' time budgets read: CPU seconds, not wall seconds.

A wall-clock budget cut the policy's walk and climbs wherever the machine was busy, so the same call gave
different plans under load (seven answers in seven runs, 61,941 to 72,224 tokens/s, for llama2-13b on four
device types at load 5-17). CPU time stretches with the load in wall terms but not in the work it allows, so a
busy machine gives the same plan, later. A forked child's CPU time starts again at zero; the clock adds what the
parent had used at the fork, so deadlines set before a fork mean the same in the child.
"""

from __future__ import annotations

import os
import time

__all__ = ["planning_clock"]

_offset = 0.0
"""CPU seconds of the parent at the last fork (0 in a process that was not forked)."""


def planning_clock() -> float:
    """Seconds of CPU this process (and, in a forked child, its parent up to the fork) has used: what the
    planners' deadlines are set in and compared with."""
    return _offset + time.process_time()


def _at_fork_in_child(parent_clock: list[float]) -> None:
    global _offset
    _offset = parent_clock[0]


_at_fork: list[float] = [0.0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _at_fork.__setitem__(0, planning_clock()),
                        after_in_child=lambda: _at_fork_in_child(_at_fork))
