"""Re-deciding the numbers of a decoded structure exactly: replicas, micro-batch and recompute mode.

The policy's structural choice (family, which pools in which order, each pool's TP degree, and for
typed replicas each pool's pipeline depth) is kept; the replica count, micro-batch size and
recompute mode are searched exactly around it, as the search does for its own points: every
combination ordered by the search's lower bound, each priced by the exact layer split (pruned once
its bound cannot beat the best estimate so far). This is part of "policy + refinement", never of
"policy alone" (benchmarks report both).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from hetpart.policies.structure import StructureState

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.policies.plan_search import Scored

__all__ = ["renumber"]


def _mixed_variants(state: StructureState) -> list[tuple[float, tuple]]:
    s = state.scenario
    out = []
    for dp in s.dp_options(state.order, state.tps):
        for mb in s.mb_options(dp):
            for rc in s.modes:
                if s.mixed_fits(state.order, state.tps, dp, mb, rc):
                    out.append((s.mixed_bound_s(state.order, state.tps, dp, mb, rc), (dp, mb, rc)))
    return sorted(out)


def renumber(state: StructureState, deadline: float = math.inf, keep: int = 2) -> list["Scored"]:
    """The ``keep`` best-estimated points that share ``state``'s structural choices (it included)."""
    s = state.scenario
    found: list = []
    best = math.inf
    if state.family == "mixed":
        for bound, (dp, mb, rc) in _mixed_variants(state):
            if bound >= best or time.perf_counter() > deadline:
                break
            scored = s.mixed_scored(state.order, state.tps, dp, mb, rc, threshold=best * 1.25)
            if scored is not None:
                found.append(scored)
                best = min(best, scored.estimate_s)
    else:
        for mb in s.mb_options(1):
            for rc in s.modes:
                if time.perf_counter() > deadline:
                    break
                if all(s.pool_fits(p, tp, pp, mb, rc) for p, tp, pp in state.typed):
                    scored = s.typed_scored(state.typed, mb, rc)
                    if scored is not None:
                        found.append(scored)
    return sorted(found)[:keep]
