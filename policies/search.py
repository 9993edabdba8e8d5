"""The ``search`` planner's climbs: each start of its own with a budget of its own, the near basins sharing one.

:func:`~hetpart.policies.plan_search.plan_search` hill-climbs (:func:`~hetpart.policies.refine.refine`) from the best
plan of each kind of candidate (family, shard fractions, level), level 0's best at level 1, the walk's best and the
speed-typed view's best, and from every basin (pools in pipeline order, tensor-parallel degrees) whose best comes
within :data:`~hetpart.policies.policy_planner.NEAR_GROUP` of a level's or the walk's best. Those near basins are many
on clusters of many device types (the policy met 21 near starts on llama2-13b over four types), so, as the policy's
(:func:`~hetpart.policies.policy_planner._climb_near`), their climbs share one budget:
:data:`~hetpart.policies.policy_planner.NEAR_CLIMBS` climbs' worth of plans asked for, fastest basin first. A basin
the budget leaves unclimbed still stands as the plan it is, so the answer is never below the best start.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of

__all__ = ["climb_starts", "is_near_start", "Asked"]


def is_near_start(kind: tuple) -> bool:
    """Whether a start of :func:`~hetpart.policies.plan_search.plan_search` (keyed by its kind) is a near basin: a
    level's (``("near basin", zero, i)``, :func:`~hetpart.policies.plan_search._near_basins`) or the walk's after its
    best (``("walk", zero, i)``, ``i > 0``: :func:`~hetpart.policies.policy_planner.walk_starts` returns the walk's best
    first, then its near basins)."""
    return bool(kind) and (kind[0] == "near basin" or (kind[0] == "walk" and len(kind) == 3 and kind[2] > 0))


class Asked:
    """``evaluate`` counting the plans asked of it (calls, as the hill-climb asks them); from ``allowance`` on every
    plan asked for is None, as past a deadline. The count, not seconds, so the same plans come out on any machine."""

    def __init__(self, evaluate: Evaluator, allowance: float = math.inf) -> None:
        self._evaluate = evaluate
        self.allowance = allowance
        self.asked = 0

    def __call__(self, plan, **options) -> Evaluated | None:
        self.asked += 1
        if self.asked > self.allowance:
            return None
        return self._evaluate(plan, **options)

    def __getattr__(self, name: str) -> Any:  # cluster, predictor, ...: the evaluator's own
        return getattr(self._evaluate, name)


def climb_starts(climb: Callable[..., Evaluated], evaluate: Evaluator, starts: dict[tuple, Evaluated | None],
                 steps: int, near_climbs: int, deadline: float = math.inf,
                 near: Callable[[tuple], bool] = is_near_start) -> Evaluated | None:
    """The best plan climbed (``climb(evaluate, start, steps, deadline)``: :func:`~hetpart.policies.refine.refine`) from
    ``starts``: each start that is no near basin (``near``) climbs on a budget of its own, ``steps`` simulations per
    climb; then the near basins, fastest first, each plan once and none climbed already, until together they have
    asked for ``near_climbs * steps`` plans. Unclimbed near basins stay candidates as they are. None without starts."""
    own = _distinct(e for kind, e in starts.items() if not near(kind))
    seen = {e.plan for e in own}
    # stable sort: basins of equal throughput keep their order
    rest = sorted((e for e in _distinct(e for kind, e in starts.items() if near(kind)) if e.plan not in seen),
                  key=lambda e: -e.tokens_per_s)
    climbed = [climb(evaluate, e, steps, deadline) for e in own]
    asked = Asked(evaluate, near_climbs * steps)
    for e in rest:
        if asked.asked >= asked.allowance:
            climbed.append(e)
            continue
        climbed.append(climb(asked, e, steps, deadline))
    return best_of(climbed)


def _distinct(found: Iterable[Evaluated | None]) -> list[Evaluated]:
    """Each plan once (the first of equal plans), Nones dropped: the same plan climbs the same way."""
    out: dict = {}
    for e in found:
        if e is not None:
            out.setdefault(e.plan, e)
    return list(out.values())
