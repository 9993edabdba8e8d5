"""The structural decisions of a plan, made one at a time, with exact masks and an exact completion.

The policy decides the *structure* of a plan, the same space the ``search`` planner walks:

* **mixed pipelines**: which device pools form the pipeline and in which order (a pointer over the
  pools, zones kept contiguous), each pool's tensor-parallel degree, the number of identical
  data-parallel replicas, the micro-batch size and the recompute mode;
* **typed replicas**: the micro-batch size, the recompute mode, then per pool either "unused" or its
  tensor-parallel degree and pipeline depth (each pool then runs its own replicas of that pipeline).

The numbers are filled in exactly by the search's own building blocks: the layer split
(dynamic program, memory as a mask) and the integer batch shares. So every finished structure is
one point of the search space, and :meth:`StructureState.complete` returns the plans search would
build for it.

Actions are one flat index space: ``MAX_POOLS`` pointer slots (pools, padded) followed by
``NUM_OPTIONS`` option slots whose meaning depends on the phase (``option_values`` says what each
slot stands for). :meth:`StructureState.action_mask` rules out every choice after which no plan of
the finished structure could fit in memory (a choice is kept only when a completion that fits
exists), every invalid one (more stages than units, a batch that does not divide), zone-splitting
pipeline orders, and whatever the runtime's rules (:mod:`hetpart.rules`) refuse: tensor-parallel
degrees come from :func:`~hetpart.costmodel.pools.tp_options` (``allowed_tp_degrees``), and stages of
one pipeline, or replicas, may differ in TP only where ``RULES`` says so. Memory feasibility of a pipeline
is decided by a greedy farthest-reach split, exact because a stage that holds units ``[a, b)``
also holds any sub-range (memory only grows with the range); it agrees with the dynamic program's
memory mask at a fraction of its cost. The simulator's memory check runs on the finished plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import Pool, tp_options, zone_path_ok, zones_linked
from hetpart.policies.common import microbatch_options, recompute_modes
from hetpart.policies.partition import minimax_split, split_layers
from hetpart.rules import RULES
from hetpart.policies.plan_search import (SearchOptions, Scored, _lower_bound_s, _mixed_scorer, _PoolConfig,
                                          _typed_scorer, make_context, pipeline_depths, pool_config_of, pool_split,
                                          replica_counts)

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.evaluator import Evaluated
    from hetpart.policies.search_costs import StageCosts
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["MAX_POOLS", "NUM_OPTIONS", "NUM_ACTIONS", "PHASES", "Scenario", "StructureState", "Phase",
           "greedy_fits"]

MAX_POOLS = 16
"""Pointer slots: the most device pools (node types) a cluster may have."""
NUM_OPTIONS = 16
"""Option slots: the most choices of one non-pointer decision."""
NUM_ACTIONS = MAX_POOLS + NUM_OPTIONS
STOP = MAX_POOLS  # option slot 0 in the pick phase: the pipeline is complete

Phase = Literal["family", "pick", "tp", "dp", "mb", "rc", "ttp", "tpp", "done"]
PHASES: tuple[str, ...] = ("family", "pick", "tp", "dp", "mb", "rc", "ttp", "tpp", "done")
RECOMPUTE = ("none", "selective", "full")


def greedy_fits(costs: "list[StageCosts]", num_microbatches: int, zero: int = 0, fraction: float = 1.0) -> bool:
    """Whether the chain of units splits into ``len(costs)`` non-empty stages that each fit in memory,
    stage ``j`` holding ``min(pp - j, m)`` micro-batches in flight (1F1B), its states sharded at level
    ``zero`` with ``fraction`` of them held, as the layer split's mask says (:meth:`StageCosts.masked`).

    Farthest reach is optimal: memory of ``[a, b)`` grows with ``b`` and shrinks with ``a``, so a
    stage that ends later never leaves the next stages a harder problem.
    """
    pp, a = len(costs), 0
    n = costs[0].states_gb.shape[0] - 1
    if pp > n:
        return False
    for j, c in enumerate(costs):
        last = n - (pp - 1 - j)  # leave one unit to every later stage
        end = c.first_unfit(a, last + 1, min(pp - j, num_microbatches), zero, fraction)
        if end == a + 1:  # not even one unit fits
            return False
        a = end - 1  # as far as it reaches
    return a == n


def _typed_in_flight(pp: int) -> int:
    """The micro-batches a typed replica's ``pp``-stage pipeline is fitted for (``greedy_fits``' count): a
    full 1F1B pipeline, stage ``j`` holding ``pp - j``, as search's typed configurations are masked
    (:func:`~hetpart.policies.plan_search.pool_config`), whatever share of the batch the replica gets.
    :meth:`Scenario.pool_fits` (the masks) and :meth:`Scenario._pool_split` (the scorer) both use it."""
    return pp


class Scenario:
    """One planning problem and the search context its decisions are priced in (built once).

    Args:
        model, cluster, workload: what to plan.
        evaluator: prices finished plans (default: the default predictor's :class:`Evaluator`).
    """

    def __init__(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload",
                 evaluator: Evaluator | None = None) -> None:
        self.model, self.cluster, self.workload = model, cluster, workload
        self.evaluator = evaluator or Evaluator(model, cluster, workload)
        self.ctx = make_context(model, cluster, workload, SearchOptions(), evaluator=self.evaluator)
        self.pools: list[Pool] = self.ctx.pools
        if len(self.pools) > MAX_POOLS:
            from hetpart.errors import PlanError

            raise PlanError(f"{cluster.source or cluster.name}: {len(self.pools)} node types; the policy handles "
                            f"at most {MAX_POOLS} (use --planner search)")
        self.tps = [tp_options(p, model)[:NUM_OPTIONS - 1] for p in self.pools]
        self.modes = recompute_modes(workload)
        self.lenient = "full" if "full" in self.modes else self.modes[0]
        self._cache: dict[tuple, object] = {}

    def _memo(self, key: tuple, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # --------------------------------------------------------------------------------- mixed pipelines
    def groups(self, order: tuple[int, ...], tps: tuple[int, ...]) -> list[int]:
        return [self.pools[p].num_devices // t for p, t in zip(order, tps)]

    def dp_options(self, order: tuple[int, ...], tps: tuple[int, ...]) -> list[int]:
        """Valid replica counts of a mixed pipeline (before memory), as search counts them
        (:func:`~hetpart.policies.plan_search.replica_counts`: the groups a count leaves over sit out)."""
        groups = self.groups(order, tps)
        out = [dp for dp in replica_counts(groups, self.workload.global_batch)
               if sum(g // dp for g in groups) <= self.model.num_units]
        return out[:NUM_OPTIONS]

    def mb_options(self, dp: int) -> list[int]:
        return microbatch_options(self.workload.global_batch // dp, 16)[:NUM_OPTIONS]

    def _mixed_costs(self, order, tps, dp: int, mb: int, rc: str) -> list:
        return [self.ctx.table.get(self.pools[p], t, mb, rc)
                for p, t in zip(order, tps) for _ in range((self.pools[p].num_devices // t) // dp)]

    def mixed_scored(self, order, tps, dp: int, mb: int, rc: str, threshold: float = math.inf,
                     quick: bool = False) -> Scored | None:
        """The search's point for this mixed structure (exact layer split), None when nothing fits
        or (with ``threshold``) when its estimate cannot go below it. ``quick``: the greedy
        smallest-bottleneck split instead (:func:`~hetpart.policies.partition.minimax_split`: never
        below the exact estimate, far cheaper for long pipelines)."""
        pools = tuple(self.pools[p] for p in order)
        if not self.path_ok(order):
            return None
        costs = self._mixed_costs(order, tps, dp, mb, rc)
        m = self.workload.global_batch // (dp * mb)
        key = ("mixed", tuple(p.key for p in pools), tuple(tps), dp, mb, rc)
        splitter = minimax_split if quick else split_layers
        return _mixed_scorer(self.ctx, pools, tuple(tps), dp, mb, rc, costs, m, key, splitter)(threshold)

    def mixed_bound_s(self, order, tps, dp: int, mb: int, rc: str) -> float:
        """The search's lower bound on this mixed structure's estimate."""
        return _lower_bound_s(self.ctx, self._mixed_costs(order, tps, dp, mb, rc),
                              self.workload.global_batch // (dp * mb))

    def mixed_fits(self, order, tps, dp: int, mb: int, rc: str) -> bool:
        return self._memo(("fit", order, tps, dp, mb, rc), lambda: greedy_fits(
            self._mixed_costs(order, tps, dp, mb, rc), self.workload.global_batch // (dp * mb), self.ctx.zero,
            1.0 / dp))

    def path_ok(self, order: tuple[int, ...]) -> bool:
        """The pipeline crosses zones only over links, each zone once, and (tied embeddings) its first and
        last zones are linked (:func:`~hetpart.costmodel.pools.zone_path_ok`)."""
        return zone_path_ok(self.cluster, [self.pools[p].zone for p in order], self.model.tied_owner_index >= 0)

    def stop_ok(self, order, tps) -> bool:
        """The pipeline may end here (:meth:`path_ok`) and some replica count fits with the most lenient
        micro-batch (1) and recompute mode."""
        return self.path_ok(order) and any(self.mixed_fits(order, tps, dp, 1, self.lenient) for dp in self.dp_options(order, tps))

    def can_finish(self, order: tuple[int, ...], tps: tuple[int, ...]) -> bool:
        """Whether some completion of this partial pipeline (stop now, or add pools) fits."""
        def compute() -> bool:
            if order and self.stop_ok(order, tps):
                return True
            return any(self.can_finish(order + (p,), tps + (t,)) for p in self.pickable(order)
                       for t in self.tp_choices(p, tps))

        return self._memo(("finish", order, tps), compute)

    def tp_choices(self, pool: int, chosen: tuple[int, ...]) -> list[int]:
        """TP degrees the pool may take next to the degrees already ``chosen`` (the runtime's rules)."""
        if chosen and not RULES.stages_may_differ_in_tp("1f1b"):
            return [t for t in self.tps[pool] if t == chosen[0]]
        return list(self.tps[pool])

    def pickable(self, order: tuple[int, ...]) -> list[int]:
        """Pools that may come next: unused, not in a zone the pipeline already left, and in the last pool's
        zone or one linked to it."""
        if not order:
            return list(range(len(self.pools)))
        here = self.pools[order[-1]].zone
        left = {self.pools[p].zone for p in order[:-1]} - {here}
        return [p for p in range(len(self.pools)) if p not in order and self.pools[p].zone not in left
                and self.cluster.zones_connected(here, self.pools[p].zone)]

    # --------------------------------------------------------------------------------- typed replicas
    def total_microbatches(self, mb: int) -> int:
        return self.workload.global_batch // mb

    def pp_options(self, pool: int, tp: int) -> list[int]:
        """Pipeline depths of a pool's typed replicas, as search takes them
        (:func:`~hetpart.policies.plan_search.pipeline_depths`: each the deepest its replica count fits, the groups
        left over sitting out)."""
        return pipeline_depths(self.pools[pool].num_devices // tp, self.model.num_units)[:NUM_OPTIONS]

    def _m_est(self, pool: int, tp: int, pp: int, mb: int) -> int:
        dp = self.pools[pool].num_devices // (tp * pp)
        return max(1, self.total_microbatches(mb) // (dp * len(self.pools)))  # as the search estimates it

    def _fractions(self, pool: int, tp: int, pp: int) -> tuple[float, ...]:
        """The shard fractions a pool's replicas are fitted under, as search fits them
        (:func:`~hetpart.policies.plan_search._mask_fractions`): its own replicas' share first, then, when
        sharding, none (the other pools' replicas hold the states)."""
        from hetpart.policies.plan_search import _mask_fractions

        return _mask_fractions(self.ctx, self.pools[pool].num_devices // (tp * pp))

    def pool_fits(self, pool: int, tp: int, pp: int, mb: int, rc: str) -> bool:
        """Whether :meth:`pool_config` finds a split: the same memory test as :meth:`_pool_split`, decided by
        :func:`greedy_fits` (the sends it adds to the ranges are finite, so they never change what fits).
        Stage ``j`` holds :func:`_typed_in_flight` micro-batches, however few the replica's share of the batch
        (``m_est``) is, as the typed scorer fits it."""
        def compute() -> bool:
            costs = self.ctx.table.get(self.pools[pool], tp, mb, rc)
            return any(greedy_fits([costs] * pp, _typed_in_flight(pp), self.ctx.zero, f)
                       for f in self._fractions(pool, tp, pp))

        return self._memo(("pool", pool, tp, pp, mb, rc), compute)

    def min_dp(self, pool: int, mb: int, rc: str) -> int | None:
        """The fewest replicas of any fitting (tp, pp) of the pool (None: nothing fits)."""
        def compute():  # the widest replica that fits has the fewest replicas: try the widest first
            shapes = sorted(((t * pp, t, pp) for t in self.tps[pool] for pp in self.pp_options(pool, t)), reverse=True)
            width = next((w for w, t, pp in shapes if self.pool_fits(pool, t, pp, mb, rc)), None)
            return None if width is None else self.pools[pool].num_devices // width

        return self._memo(("min_dp", pool, mb, rc), compute)

    def typed_can_finish(self, used: int, chosen: int, first: int, mb: int, rc: str,
                         zones: frozenset = frozenset()) -> bool:
        """Whether pools ``first..`` can complete typed replicas already holding ``used`` replicas over
        ``chosen`` pools in ``zones``: at least two pools in all, every replica with at least one micro-batch,
        every pool in a zone linked to the zones of all the others (replicas sync gradients with every other)."""
        later = sorted((d, self.pools[p].zone) for p in range(first, len(self.pools))
                       if (d := self.min_dp(p, mb, rc)) is not None and self.typed_zone_ok(zones, p))
        need, budget = max(0, 2 - chosen), self.total_microbatches(mb) - used
        if need < 2:
            return len(later) >= need and sum(d for d, _ in later[:need]) <= budget
        # two pools still to come (none chosen): the cheapest pair whose zones are linked
        return any(da + db <= budget for i, (da, za) in enumerate(later) for db, zb in later[i + 1:]
                   if self.cluster.zones_connected(za, zb))

    def typed_zone_ok(self, zones: frozenset, pool: int) -> bool:
        """Whether ``pool``'s replicas may join typed replicas in ``zones``."""
        return zones_linked(self.cluster, zones | {self.pools[pool].zone})

    def typed_ok(self, mb: int, rc: str) -> bool:
        return len(self.pools) >= 2 and self.typed_can_finish(0, 0, 0, mb, rc)

    def pool_config(self, pool: int, tp: int, pp: int, mb: int, rc: str, quick: bool = False) -> _PoolConfig | None:
        """One pool's replicas of a ``pp``-stage, ``tp``-wide pipeline, priced as the search prices them
        (``quick``: with :func:`~hetpart.policies.partition.minimax_split`, as :meth:`mixed_scored`)."""
        def compute():
            split = self._pool_split(pool, tp, pp, mb, rc, quick)
            if split is None:
                return None
            costs = self.ctx.table.get(self.pools[pool], tp, mb, rc)
            return pool_config_of(self.ctx, self.pools[pool], tp, pp, costs, self._m_est(pool, tp, pp, mb), *split)

        return self._memo(("config", pool, tp, pp, mb, rc, quick), compute)

    def pool_rate(self, pool: int, tp: int, pp: int, mb: int, rc: str, quick: bool = False) -> float | None:
        """:attr:`pool_config`'s rate (micro-batches per second of the pool's replicas; None: nothing fits),
        without its gradient sync: comparing pipeline depths needs only the split."""
        split = self._pool_split(pool, tp, pp, mb, rc, quick)
        return None if split is None else (self.pools[pool].num_devices // (tp * pp)) / split[0].bottleneck_s

    def pool_rate_ceiling(self, pool: int, tp: int, pp: int, mb: int, rc: str) -> float:
        """A rate :meth:`pool_rate` never exceeds: the replicas over a bottleneck no split of ``pp`` stages goes
        below, the largest of an even share of the units' time, the slowest unit, and the least time of any
        ``ceil(n / pp)`` consecutive units (some stage holds that many; memory masks and sends only add), with a
        relative margin of 1e-6 for the rounding of the sends added to the ranges."""
        unit_s = self.ctx.table.get(self.pools[pool], tp, mb, rc).unit_time_s
        prefix = np.concatenate(([0.0], np.cumsum(unit_s)))  # as the stage matrices sum ranges
        width = -(-len(unit_s) // pp)
        least = max(float(prefix[-1]) / pp, float(unit_s.max()), float((prefix[width:] - prefix[:-width]).min()))
        least *= 1 - 1e-6
        return math.inf if least <= 0 else (self.pools[pool].num_devices // (tp * pp)) / least

    def _pool_split(self, pool: int, tp: int, pp: int, mb: int, rc: str, quick: bool):
        """:func:`~hetpart.policies.plan_search.pool_split` of :meth:`pool_config`."""
        def compute():  # under the first memory assumption that fits (sharded states: search's two)
            p = self.pools[pool]
            costs = self.ctx.table.get(p, tp, mb, rc)
            for f in self._fractions(pool, tp, pp):
                m = _typed_in_flight(pp)  # as greedy_fits counts the stages' micro-batches in flight
                masks = [costs.masked(min(pp - j, m), False, self.ctx.zero, f) for j in range(pp)]
                split = pool_split(self.ctx, p, tp, pp, mb, masks, self._m_est(pool, tp, pp, mb),
                                   minimax_split if quick else split_layers)
                if split is not None:
                    return split
            return None

        return self._memo(("split", pool, tp, pp, mb, rc, quick), compute)

    def typed_scored(self, chosen: list[tuple[int, int, int]], mb: int, rc: str, quick: int = 0) -> Scored | None:
        """The search's point for these typed replicas; pools deeper than ``quick`` stages (0: none)
        are split with :func:`~hetpart.policies.partition.minimax_split`."""
        if not zones_linked(self.cluster, (self.pools[p].zone for p, _, _ in chosen)):
            return None
        configs = [self.pool_config(p, tp, pp, mb, rc, bool(quick) and pp > quick) for p, tp, pp in chosen]
        if any(c is None for c in configs) or sum(c.dp for c in configs) > self.total_microbatches(mb):
            return None
        key = ("typed", tuple((c.pool.key, c.tp, c.pp) for c in configs), mb, rc)
        return _typed_scorer(self.ctx, configs, mb, rc, self.total_microbatches(mb), key)(math.inf)

    # --------------------------------------------------------------------------------- families
    @property
    def mixed_ok(self) -> bool:
        return self.can_finish((), ())

    @property
    def any_typed_ok(self) -> bool:
        return self.typed_ok(1, self.lenient)

    @property
    def feasible(self) -> bool:
        """Whether any structure fits (a scenario without one cannot be planned in search's space)."""
        return self.mixed_ok or self.any_typed_ok


@dataclass
class StructureState:
    """The decisions made so far for one scenario, and the rules for the next one."""

    scenario: Scenario
    phase: str = "family"
    family: str | None = None
    order: tuple[int, ...] = ()
    tps: tuple[int, ...] = ()
    dp: int | None = None
    mb: int | None = None
    rc: str | None = None
    pool: int = 0
    """Typed replicas: the pool being decided."""
    typed: list = field(default_factory=list)
    """Typed replicas: ``(pool, tp, pp)`` of every pool chosen so far."""
    pending_tp: int | None = None

    # ------------------------------------------------------------------------------------- options
    def option_values(self) -> list:
        """What each option slot of the current phase stands for (the slot's index is the action)."""
        s = self.scenario
        if self.phase == "family":
            return ["mixed", "typed"]
        if self.phase == "pick":
            return ["stop"]
        if self.phase == "tp":
            return s.tp_choices(self.order[-1], self.tps)
        if self.phase == "dp":
            return s.dp_options(self.order, self.tps)
        if self.phase == "mb":
            return s.mb_options(self.dp or 1)
        if self.phase == "rc":
            return list(s.modes)
        if self.phase == "ttp":
            first = (self.typed[0][1],) if self.typed and not RULES.replicas_may_differ_in_tp else ()
            return [0] + s.tp_choices(self.pool, first)  # 0: the pool stays unused
        if self.phase == "tpp":
            return s.pp_options(self.pool, self.pending_tp)
        return []

    def action_mask(self) -> np.ndarray:
        """``[NUM_ACTIONS]`` booleans: the choices that keep a fitting, valid plan reachable."""
        mask = np.zeros(NUM_ACTIONS, dtype=bool)
        s = self.scenario
        values = self.option_values()
        opt = mask[MAX_POOLS:]
        if self.phase == "family":
            opt[0], opt[1] = s.mixed_ok, s.any_typed_ok
        elif self.phase == "pick":
            for p in s.pickable(self.order):
                mask[p] = any(s.can_finish(self.order + (p,), self.tps + (t,)) for t in s.tp_choices(p, self.tps))
            opt[0] = bool(self.order) and s.stop_ok(self.order, self.tps)
        elif self.phase == "tp":
            for i, t in enumerate(values):
                opt[i] = s.can_finish(self.order, self.tps + (t,))
        elif self.phase == "dp":
            for i, dp in enumerate(values):
                opt[i] = s.mixed_fits(self.order, self.tps, dp, 1, s.lenient)
        elif self.phase == "mb":
            for i, mb in enumerate(values):
                opt[i] = (s.mixed_fits(self.order, self.tps, self.dp, mb, s.lenient) if self.family == "mixed"
                          else s.typed_ok(mb, s.lenient))
        elif self.phase == "rc":
            for i, rc in enumerate(values):
                opt[i] = (s.mixed_fits(self.order, self.tps, self.dp, self.mb, rc) if self.family == "mixed"
                          else s.typed_ok(self.mb, rc))
        elif self.phase == "ttp":
            opt[0] = self._typed_next_ok(0)
            if s.typed_zone_ok(self._typed_zones(), self.pool):
                for i, t in enumerate(values[1:], start=1):
                    opt[i] = any(self._pp_ok(t, pp) for pp in s.pp_options(self.pool, t))
        elif self.phase == "tpp":
            for i, pp in enumerate(values):
                opt[i] = self._pp_ok(self.pending_tp, pp)
        return mask

    def _typed_next_ok(self, dp: int) -> bool:
        """After this pool takes ``dp`` replicas (0: unused), the later pools can still finish."""
        s = self.scenario
        used = sum(s.pools[p].num_devices // (t * q) for p, t, q in self.typed)
        zones = self._typed_zones() | ({s.pools[self.pool].zone} if dp > 0 else set())
        return s.typed_can_finish(used + dp, len(self.typed) + (dp > 0), self.pool + 1, self.mb, self.rc, zones)

    def _typed_zones(self) -> frozenset:
        """Zones of the typed pools chosen so far."""
        return frozenset(self.scenario.pools[p].zone for p, _, _ in self.typed)

    def _pp_ok(self, tp: int, pp: int) -> bool:
        """The pool's replicas fit and the typed replicas can still be completed."""
        s = self.scenario
        dp = s.pools[self.pool].num_devices // (tp * pp)
        return s.pool_fits(self.pool, tp, pp, self.mb, self.rc) and self._typed_next_ok(dp)

    # ------------------------------------------------------------------------------------- stepping
    def step(self, action: int, mask: np.ndarray | None = None) -> None:
        """Apply a choice that :meth:`action_mask` allows (raises ``ValueError`` otherwise); ``mask`` is
        the state's current mask when the caller has it already."""
        mask = self.action_mask() if mask is None else mask
        if self.phase == "done" or not 0 <= action < NUM_ACTIONS or not mask[action]:
            raise ValueError(f"action {action} is not allowed in phase {self.phase}")
        value = None if action < MAX_POOLS else self.option_values()[action - MAX_POOLS]
        phase = self.phase
        if phase == "family":
            self.family = value
            self.phase = "pick" if value == "mixed" else "mb"
        elif phase == "pick":
            if action == STOP:
                self.phase = "dp"
            else:
                self.order += (action,)
                self.phase = "tp"
        elif phase == "tp":
            self.tps += (value,)
            self.phase = "pick"
        elif phase == "dp":
            self.dp, self.phase = value, "mb"
        elif phase == "mb":
            self.mb, self.phase = value, "rc"
        elif phase == "rc":
            self.rc = value
            self.phase = "done" if self.family == "mixed" else "ttp"
        elif phase == "ttp":
            if value == 0:
                self.pool += 1
            else:
                self.pending_tp, self.phase = value, "tpp"
        elif phase == "tpp":
            self.typed.append((self.pool, self.pending_tp, value))
            self.pool, self.pending_tp, self.phase = self.pool + 1, None, "ttp"
        if self.phase == "ttp":
            self._skip_pools()

    def _skip_pools(self) -> None:
        """Pools with no fitting configuration have nothing to decide: they stay unused."""
        s = self.scenario
        while self.pool < len(s.pools) and s.min_dp(self.pool, self.mb, self.rc) is None:
            self.pool += 1
        if self.pool >= len(s.pools):
            self.phase = "done"

    @property
    def done(self) -> bool:
        return self.phase == "done"

    # ------------------------------------------------------------------------------------- completion
    def bound_s(self) -> float:
        """A lower bound on the finished structure's estimate (orders candidates; 0 for typed replicas)."""
        if self.family == "mixed":
            return self.scenario.mixed_bound_s(self.order, self.tps, self.dp, self.mb, self.rc)
        return 0.0

    def scored(self, threshold: float = math.inf) -> Scored | None:
        """The finished structure as a point of the search space (exact layer split and batch shares)."""
        if not self.done:
            raise ValueError("the structure is not finished")
        s = self.scenario
        if self.family == "mixed":
            return s.mixed_scored(self.order, self.tps, self.dp, self.mb, self.rc, threshold)
        return s.typed_scored(self.typed, self.mb, self.rc)

    def complete(self) -> "Evaluated | None":
        """The best simulated plan of the finished structure (None when the simulator says none fits)."""
        scored = self.scored()
        return None if scored is None else self.scenario.evaluator.best(scored.build())

    def key(self) -> tuple:
        """What the finished structure is (equal keys build equal plans)."""
        return (self.family, self.order, self.tps, self.dp, self.mb, self.rc, tuple(self.typed))
