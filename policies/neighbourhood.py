"""Local search over plan structures, priced by the search's estimate, from the policy's proposals.

The network proposes structures (:mod:`hetpart.policies.structure`); this walks from them to better
ones one structural move at a time, every point priced exactly as ``search`` prices its own (exact
layer split, integer batch shares), never simulated. A point is the structure with its numbers:

* ``("mixed", order, tps, dp, mb, rc)``: pools in pipeline order, each pool's TP degree, replicas,
  micro-batch and recompute mode;
* ``("typed", ((pool, tp, pp), ...), mb, rc)``: each used pool's own replicas.

Moves: one pool's TP degree (typed: its ``(tp, pp)``), a pool added (at every place its zone allows),
dropped or swapped with its neighbour (each structural move under every replica count), the replica count, micro-batch and recompute mode one option
up or down, and the family switched over the same pools. Every move keeps the runtime's rules and
the zone order (:class:`~hetpart.policies.structure.Scenario` says which are allowed) and must fit in
memory. A neighbour is skipped when the search's lower bound says it cannot beat the best point so
far, and the walk is first-improvement with a deadline, so it always returns what it has.

Where no single move helps, a step tries the compound moves (:meth:`Neighbourhood.compound`) before it
gives up (variable neighbourhood descent: the small neighbourhood first, the wider one only at its
local optimum, so the walk's path and budget are unchanged wherever a single move still pays). The
compound move changes one pool's TP degree and moves that pool to another place in the pipeline at
once: a TP change changes the pool's stage count and its memory per stage, and under 1F1B the first
stages hold the most micro-batches in flight, so the pool often belongs elsewhere afterwards; each
half alone can be worse than where the walk stands. (llama2-70b on 32 A100-80GB + 16 MI250X: from
MI250X TP 8 first, A100 TP 2 after, 238.2 s estimated, MI250X TP 4 in the same place is 238.5 s and
the swap 241.9 s, while MI250X TP 4 after the A100s is 223.6 s.) A compound move also changes one
pool's TP degree, in place or moved, with the micro-batch rescaled so that each replica keeps its
number of micro-batches (half the replicas, twice the micro-batch), where a single structural move
keeps the micro-batch or drops it to 1; and every pool's TP doubled or halved at once, so rescaled
(llama2-7b on 336 GPUs of 3 types, held out: from TP 2 on both pools, 8 replicas, micro-batch 2 to
TP 1, 16 replicas, micro-batch 1, search's plan, which no single move reached: 0.940 -> 1.000). With three
or more pools, two or more of them scaled by one factor (x2, x4, /2, /4) at once, the others kept, under
every replica count (gpt2-medium over RTX 2080 Ti + RTX 3090 + Titan RTX, held out: the slow pools at TP 4
around eight one-GPU 3090 stages, one replica instead of four, where either pool widened alone is 42% or more worse
than the start: 0.985 -> 1.000).

After the walks, every group of fewer pools than the best point uses (one pool dropped at a time) gets
its best point by a walk within the group (:func:`_fewer_pools`): the estimate can prefer adding a slow
pool where the simulator does not, and ``search`` simulates the best of every group, so the policy's
shortlist must have them too.

Neighbours are priced in order of the search's lower bound (the same for every order of the same
stages); a mixed point that no layer split fits in memory is refused by a cheap exact check and
costs the walk no budget.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator

from hetpart.policies.clock import planning_clock
from hetpart.rules import RULES
from hetpart.costmodel.pools import zones_linked

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.policies.plan_search import Scored
    from hetpart.policies.structure import Scenario, StructureState

__all__ = ["point_of", "improve", "warm_up", "Neighbourhood"]

Point = tuple
QUICK_STAGES = 8
"""Pipelines with more stages are priced during the walk with the greedy smallest-bottleneck
split (:func:`~hetpart.policies.partition.minimax_split`: the estimate of a real split, never below
the exact one, at a fraction of the dynamic program's cost); :meth:`Neighbourhood.exact` prices the
walk's best points exactly before they are built."""


def point_of(state: "StructureState") -> Point:
    """The point a finished decode stands for."""
    if state.family == "mixed":
        return ("mixed", state.order, state.tps, state.dp, state.mb, state.rc)
    return ("typed", tuple(state.typed), state.mb, state.rc)


class Neighbourhood:
    """Moves and prices of points of one scenario (prices memoised)."""

    def __init__(self, scenario: "Scenario", warm: Callable[[], dict | None] | None = None) -> None:
        self.s = scenario
        self._priced: dict[Point, tuple[float, "Scored | None"]] = {}
        self._valid: dict[Point, bool] = {}
        self._bounds: dict[Point, float] = {}
        self._ready: dict[Point, tuple | None] = {}
        """Prices a child computed (:func:`warm_up`), taken by :meth:`price` in place of its own."""
        self._warm = warm
        self.priced = 0
        """Points priced (layer splits run)."""

    # ------------------------------------------------------------------------------------- warm start
    def take_warm(self) -> None:
        """Absorb the warm-up a child computed (:func:`warm_up`; waits for it), once; nothing without one."""
        if self._warm is not None:
            warm, self._warm = self._warm, None
            self.absorb(warm())

    def absorb(self, data: dict | None) -> None:
        """Take :func:`warm_up`'s memos: the scenario's and the search context's pure caches, validity and bounds
        of points, and prices, which :meth:`price` uses where it would price the same point the same way (counted
        in :attr:`priced` as before), so the walk visits and returns what it would without them."""
        if not data:
            return
        s = self.s
        for key, value in data["cache"].items():
            if key[0] == "config" and value is not None:
                value = replace(value, pool=s.pools[key[1]])  # pools compare by identity: this process's own
            s._cache.setdefault(key, value)
        for key, value in data["sync"].items():
            s.ctx.sync_cache.setdefault(key, value)
        for mine, theirs in ((self._valid, data["valid"]), (self._bounds, data["bounds"])):
            for key, value in theirs.items():
                mine.setdefault(key, value)
        for point, value in data["priced"].items():
            if point not in self._priced:
                self._ready.setdefault(point, value)

    def _rebuilt(self, point: Point) -> list:
        """The plans of a point whose price came from :func:`warm_up` (priced again here, as :meth:`price` would)."""
        if point[0] == "mixed":
            scored = self.s.mixed_scored(*point[1:], quick=self.stages(point) > QUICK_STAGES)
        else:
            scored = self.s.typed_scored(sorted(point[1]), point[2], point[3], quick=QUICK_STAGES)
        return scored.build()

    def export(self, cache_before: set, sync_before: set) -> dict[str, Any]:
        """What :meth:`absorb` takes, as plain data (prices without their build functions, which do not pickle):
        every price, validity and bound found here, and the caches' entries made since ``cache_before`` and
        ``sync_before`` (their keys then) whose keys and values are plain."""
        s = self.s
        return {"priced": {p: None if sc is None else (sc.estimate_s, sc.key)
                           for p, (threshold, sc) in self._priced.items() if threshold == math.inf},
                "valid": dict(self._valid), "bounds": dict(self._bounds),
                "cache": {k: v for k, v in s._cache.items() if k not in cache_before},
                "sync": {k: v for k, v in s.ctx.sync_cache.items() if k not in sync_before and _plain((k, v))}}

    # ------------------------------------------------------------------------------------- pricing
    def valid(self, point: Point) -> bool:
        """Allowed by the rules and the zone order (typed replicas: and fits in memory; a mixed point's
        pricing finds whether it fits). Memoised, as :meth:`bound_s` is: a walk step checks every neighbour,
        and the next step's neighbours are mostly the same points."""
        known = self._valid.get(point)
        if known is None:
            known = self._valid[point] = self._check(point)
        return known

    def _check(self, point: Point) -> bool:
        s = self.s
        if point[0] == "mixed":
            _, order, tps, dp, mb, rc = point
            if not order or len(set(order)) != len(order) or not s.path_ok(order):
                return False
            if any(t not in s.tps[p] for p, t in zip(order, tps)):
                return False
            if not RULES.stages_may_differ_in_tp("1f1b") and len(set(tps)) > 1:
                return False
            return dp in s.dp_options(order, tps) and mb in s.mb_options(dp) and rc in s.modes  # pricing checks memory
        _, typed, mb, rc = point
        pools = [p for p, _, _ in typed]
        if not typed or len(set(pools)) != len(pools) or rc not in s.modes or mb not in s.mb_options(1):
            return False
        if not RULES.replicas_may_differ_in_tp and len({t for _, t, _ in typed}) > 1:
            return False
        if not zones_linked(s.cluster, (s.pools[p].zone for p in pools)):
            return False  # replicas in zones without a link cannot sync gradients
        if any(t not in s.tps[p] or pp not in s.pp_options(p, t) for p, t, pp in typed):
            return False
        replicas = sum(s.pools[p].num_devices // (t * pp) for p, t, pp in typed)
        if len(typed) == 1 and s.total_microbatches(mb) % replicas == 0:
            return False  # one pool's replicas that split the batch evenly: a mixed pipeline of one pool
        return replicas <= s.total_microbatches(mb) and all(s.pool_fits(p, t, pp, mb, rc) for p, t, pp in typed)

    def bound_s(self, point: Point) -> float:
        """A lower bound on the point's estimate (0 for typed replicas: their pricing is cheap)."""
        if point[0] != "mixed":
            return 0.0
        known = self._bounds.get(point)
        if known is None:
            known = self._bounds[point] = self.s.mixed_bound_s(*point[1:])
        return known

    def fits(self, point: Point) -> bool:
        """Whether some layer split of a mixed point fits in memory (the structure's exact greedy check,
        far cheaper than pricing); typed points: :meth:`valid` checks their memory."""
        return point[0] != "mixed" or self.s.mixed_fits(*point[1:])

    def price(self, point: Point, threshold: float = math.inf) -> "Scored | None":
        """The point's estimate (None: does not fit, or cannot go below ``threshold``). A mixed point
        that cannot fit is refused before pricing and not counted in :attr:`priced`, so the walk's
        budget goes to points that can become plans (on the public suite 15% of the priced points
        did not fit before, 36 of 76 on llama2-70b-nvidia-amd)."""
        done = self._priced.get(point)
        if done is not None and (done[1] is not None or done[0] >= threshold):
            return done[1]
        if not self.fits(point):
            self._priced[point] = (math.inf, None)
            return None
        self.priced += 1
        if point in self._ready and (threshold == math.inf or point[0] != "mixed"):  # typed: priced in full
            from hetpart.policies.plan_search import Scored

            ready = self._ready.pop(point)
            found = None if ready is None else Scored(ready[0], ready[1], partial(self._rebuilt, point))
            threshold = math.inf
        elif point[0] == "mixed":
            found = self.s.mixed_scored(*point[1:], threshold=threshold, quick=self.stages(point) > QUICK_STAGES)
        else:
            typed = sorted(point[1])  # the search's own order: pools in cluster order
            found = self.s.typed_scored(typed, point[2], point[3], quick=QUICK_STAGES)
            threshold = math.inf
        self._priced[point] = (threshold, found)
        return found

    def stages(self, point: Point) -> int:
        """Pipeline stages of a mixed point (0 for typed replicas)."""
        if point[0] != "mixed":
            return 0
        return sum(g // point[3] for g in self.s.groups(point[1], point[2]))

    def exact(self, point: Point) -> "Scored | None":
        """The point priced with the exact layer split, whatever the walk used."""
        if point[0] == "mixed":
            return self.s.mixed_scored(*point[1:]) if self.stages(point) > QUICK_STAGES else self.price(point)
        return self.s.typed_scored(sorted(point[1]), point[2], point[3])

    def switched(self, point: Point) -> Iterator[Point]:
        """The same pools and TP degrees in the other family (mixed: every replica count and order)."""
        s = self.s
        if point[0] == "mixed":
            _, order, tps, _, mb, rc = point
            typed = tuple(sorted((p, t, self._best_pp(p, t, mb, rc)) for p, t in zip(order, tps)))
            if all(q is not None for _, _, q in typed):  # one pool: uneven shares where its replicas need them
                yield ("typed", typed, mb, rc)
            return
        _, typed, mb, rc = point
        tp_of = {p: t for p, t, _ in typed}
        for order in itertools.permutations(sorted(tp_of)):
            if s.path_ok(order):
                yield from self._renumbered(order, tuple(tp_of[p] for p in order), 1, mb, rc)

    # ------------------------------------------------------------------------------------- moves
    def neighbours(self, point: Point) -> Iterator[Point]:
        """Every point one move away (not yet checked for validity)."""
        if point[0] == "mixed":
            yield from self._mixed_moves(*point[1:])
        else:
            yield from self._typed_moves(*point[1:])

    def _near(self, options: list[int], value: int) -> list[int]:
        """The options next to ``value`` (one below and one above, or the nearest when it is gone)."""
        if not options:
            return []
        if value in options:
            i = options.index(value)
            return options[max(0, i - 1):i] + options[i + 1:i + 2]
        return [min(options, key=lambda o: abs(math.log(o) - math.log(value)))]

    def _renumbered(self, order, tps, dp: int, mb: int, rc: str) -> Iterator[Point]:
        """A new structure under every replica count it allows, the micro-batch kept (or the nearest)
        and 1: a structural move rarely pays off at the old numbers (TP 2 -> 1 wants twice the stages)."""
        for d in self.s.dp_options(order, tps):
            for b in self._kept_mbs(d, mb):
                yield ("mixed", order, tps, d, b, rc)

    def _kept_mbs(self, dp: int, mb: int) -> list[int]:
        """The micro-batches a structural move tries at ``dp`` replicas: ``mb`` (or the nearest) and 1."""
        mbs = self.s.mb_options(dp)
        return list(dict.fromkeys(([mb] if mb in mbs else self._near(mbs, mb)) + [1]))

    def _mixed_moves(self, order, tps, dp, mb, rc) -> Iterator[Point]:
        s = self.s
        for i, p in enumerate(order):  # one pool's TP degree
            for t in s.tps[p]:
                if t != tps[i]:
                    yield from self._renumbered(order, tps[:i] + (t,) + tps[i + 1:], dp, mb, rc)
        for p in range(len(s.pools)):  # a pool added, at every place
            if p in order:
                continue
            for t in s.tps[p]:
                for i in range(len(order) + 1):
                    yield from self._renumbered(order[:i] + (p,) + order[i:], tps[:i] + (t,) + tps[i:], dp, mb, rc)
        if len(order) > 1:
            for i in range(len(order)):  # a pool dropped
                yield from self._renumbered(order[:i] + order[i + 1:], tps[:i] + tps[i + 1:], dp, mb, rc)
            for i in range(len(order) - 1):  # neighbours swapped
                o, t = list(order), list(tps)
                o[i], o[i + 1], t[i], t[i + 1] = o[i + 1], o[i], t[i + 1], t[i]
                yield ("mixed", tuple(o), tuple(t), dp, mb, rc)
        for d in self._near(s.dp_options(order, tps), dp):
            for b in ([mb] if mb in s.mb_options(d) else self._near(s.mb_options(d), mb)):
                yield ("mixed", order, tps, d, b, rc)
        for b in self._near(s.mb_options(dp), mb):
            yield ("mixed", order, tps, dp, b, rc)
        for r in s.modes:
            if r != rc:
                yield ("mixed", order, tps, dp, mb, r)
        yield from self.switched(("mixed", order, tps, dp, mb, rc))

    def compound(self, point: Point) -> Iterator[Point]:
        """Two moves at once (not yet checked for validity): one pool's TP degree changed and the pool
        moved to every other place in the pipeline, under every replica count (as any structural
        move); and the TP change in place or moved with the micro-batch rescaled to keep the number
        of micro-batches per replica (half the replicas, twice the micro-batch: the pipeline fills as
        before); and every pool's TP doubled or halved at once with the micro-batch rescaled the same way
(the pipeline's shape kept, TP traded for replicas); with three or more pools, two or more of them
        scaled alike, the rest kept, under every replica count. Typed replicas have no pipeline order: none."""
        if point[0] != "mixed":
            return
        _, order, tps, dp, mb, rc = point
        for i, p in enumerate(order):
            rest, rest_tps = order[:i] + order[i + 1:], tps[:i] + tps[i + 1:]
            for t in self.s.tps[p]:
                if t == tps[i]:
                    continue
                for j in range(len(order)):
                    moved, moved_tps = rest[:j] + (p,) + rest[j:], rest_tps[:j] + (t,) + rest_tps[j:]
                    if j != i:
                        yield from self._renumbered(moved, moved_tps, dp, mb, rc)
                    else:  # in place under another recompute mode: a wider TP frees the memory recompute held
                        for r in self.s.modes:
                            if r != rc:
                                yield from self._renumbered(moved, moved_tps, dp, mb, r)
                    for d in self.s.dp_options(moved, moved_tps):
                        b = mb * dp // d
                        if mb * dp % d == 0 and b in self.s.mb_options(d) and (j != i or b not in self._kept_mbs(d, mb)):
                            yield ("mixed", moved, moved_tps, d, b, rc)
        # the replica count and the recompute mode at once, in every order of up to three pools: shorter
        # pipelines hold more layers each, which may fit only with the memory recompute frees, and which pool
        # goes first (holding the most micro-batches in flight) changes with it
        orders = [order] if len(order) > 3 else [o for o in itertools.permutations(order) if self.s.path_ok(o)]
        tp_of = dict(zip(order, tps))
        for o in orders:
            o_tps = tuple(tp_of[p] for p in o)
            for d in self.s.dp_options(o, o_tps):
                if d == dp:
                    continue
                for r in self.s.modes:
                    if r != rc:
                        for b in dict.fromkeys(self._kept_mbs(d, mb) + ([mb * dp // d] if mb * dp % d == 0 else [])):
                            if b in self.s.mb_options(d):
                                yield ("mixed", o, o_tps, d, b, r)
        if len(order) > 1:  # every pool's TP doubled or halved: TP traded for replicas, the same stages
            for scaled in (tuple(t * 2 for t in tps), tuple(t // 2 for t in tps if t % 2 == 0)):
                if len(scaled) != len(tps) or any(t not in self.s.tps[p] for p, t in zip(order, scaled)):
                    continue
                for d in self.s.dp_options(order, scaled):
                    b = mb * dp // d
                    if mb * dp % d == 0 and b in self.s.mb_options(d):
                        for r in (rc, *(r for r in self.s.modes if r != rc)):  # wider TP frees memory recompute held
                            yield ("mixed", order, scaled, d, b, r)
        if len(order) > 2:  # two or more pools' TP scaled alike (x2, x4, /2, /4), the others kept, under every
            # replica count: a slow pool's stages widened while a fast one keeps its many narrow stages
            for size in range(2, len(order)):
                for chosen in itertools.combinations(range(len(order)), size):
                    for num, den in ((2, 1), (4, 1), (1, 2), (1, 4)):
                        scaled = tuple(t * num // den if i in chosen else t for i, t in enumerate(tps))
                        if any(i in chosen and (t * num) % den for i, t in enumerate(tps)) \
                                or any(t not in self.s.tps[p] for p, t in zip(order, scaled)):
                            continue
                        yield from self._renumbered(order, scaled, dp, mb, rc)

    def _typed_moves(self, typed, mb, rc) -> Iterator[Point]:
        s = self.s
        used = {p for p, _, _ in typed}
        for i, (p, t0, pp0) in enumerate(typed):  # one pool's (tp, pp)
            for t in s.tps[p]:
                for pp in s.pp_options(p, t):
                    if (t, pp) != (t0, pp0):
                        yield ("typed", typed[:i] + ((p, t, pp),) + typed[i + 1:], mb, rc)
        for p in range(len(s.pools)):  # a pool added at its best depth
            if p not in used:
                for t in s.tps[p]:
                    pp = self._best_pp(p, t, mb, rc)
                    if pp is not None:
                        yield ("typed", tuple(sorted(typed + ((p, t, pp),))), mb, rc)
        if len(typed) > 1:
            for i in range(len(typed)):
                yield ("typed", typed[:i] + typed[i + 1:], mb, rc)
        for b in s.mb_options(1):  # every micro-batch (typed points price cheaply; their estimate is not convex in it)
            if b != mb:
                yield ("typed", typed, b, rc)
        for r in s.modes:
            if r != rc:
                yield ("typed", typed, mb, r)
        yield from self.switched(("typed", typed, mb, rc))

    def _best_pp(self, pool: int, tp: int, mb: int, rc: str) -> int | None:
        """The pool's pipeline depth whose replicas run the most micro-batches per second (ties: the first of
        :meth:`~hetpart.policies.structure.Scenario.pp_options`). Depths are split in order of their ceiling
        (:meth:`~hetpart.policies.structure.Scenario.pool_rate_ceiling`), and none whose ceiling is below the
        best rate found: a deep pipeline's stages hold whole units, so its ceiling is low, and its split (one
        mask and one row walk per stage) costs the most."""
        s = self.s
        fitting = [pp for pp in s.pp_options(pool, tp) if s.pool_fits(pool, tp, pp, mb, rc)]
        ceilings = {pp: s.pool_rate_ceiling(pool, tp, pp, mb, rc) for pp in fitting}
        paces, top = {}, 0.0
        for pp in sorted(fitting, key=lambda q: -ceilings[q]):  # stable: equal ceilings in depth order
            if ceilings[pp] < top:
                break  # this depth and every one after it cannot reach the best rate found
            pace = paces[pp] = s.pool_rate(pool, tp, pp, mb, rc, pp > QUICK_STAGES)
            if pace is not None:
                top = max(top, pace)
        best, rate = None, 0.0
        for pp in fitting:  # the first depth of the highest rate, as they come
            pace = paces.get(pp)
            if pace is not None and pace > rate:
                best, rate = pp, pace
        return best


def improve(hood: Neighbourhood, starts: list[Point], deadline: float, walks: int = 4, seeds: int = 8,
            limit: int = 400) -> dict[Point, "Scored"]:
    """First-improvement walks from the best-priced starts until no move helps, ``limit`` points have
    been priced (the budget that makes the answer the same on a busy machine) or the deadline passes
    (a safety net, in :func:`~hetpart.policies.clock.planning_clock` seconds: CPU, so that load does not move
    it); every point priced on the way with its price.

    The starts are joined by their counterparts in the other family (the same pools and TP degrees:
    a network that favours one family still seeds the other), the ``seeds`` of lowest bound priced;
    the ``walks / 2`` best points of each family are walked from. Neighbours are priced in order of
    their lower bound, so a walk step stops at the first bound that cannot beat the point it is at.
    """
    found: dict[Point, "Scored"] = {}
    for p in starts:  # the decoded points first: a child may still be pricing the seeds (warm_up)
        if hood.valid(p) and (scored := hood.price(p)) is not None:
            found[p] = scored
    hood.take_warm()
    seeded = [q for q in narrow_seeds(hood) if q not in starts]
    for p in seeded:
        if hood.valid(p) and (scored := hood.price(p)) is not None:
            found[p] = scored
    # a seed's micro-batch (1) is only where it fits for sure: its other sizes too, within a share of the budget,
    # so a seed the walks never start from still enters at its best (gpt3-2.7b, 64 sequences, on A100-40GB in
    # zones a and b and 16 A100-80GB in zone c linked only to b: c alone, 16 replicas, is best at micro-batch 4)
    budget = max(SUBSET_POINTS_MIN, limit // SUBSET_SHARE)  # points tried, priced before or not (deterministic)
    sweep = [("mixed", order, tps, dp, mb, rc) for _, order, tps, dp, _, rc in (p for p in seeded if p in found)
             for mb in hood.s.mb_options(dp)[1:]]
    for q in sweep[:budget]:
        if planning_clock() > deadline or hood.priced >= limit:
            break
        if hood.valid(q) and hood.fits(q) and (scored := hood.price(q)) is not None:
            found[q] = scored
    others = {q for p in found for q in hood.switched(p) if q not in found and hood.valid(q)}
    tried = 0
    for q in sorted(others, key=lambda q: (hood.bound_s(q), q)):
        if tried >= seeds or planning_clock() > deadline or hood.priced >= limit:
            break
        if hood.fits(q):  # the ``seeds`` of lowest bound that can fit
            tried += 1
            if (scored := hood.price(q)) is not None:
                found[q] = scored
    ranked = sorted(found, key=lambda p: found[p].estimate_s)
    chosen = [p for p in ranked if p[0] == "mixed"][:walks // 2] + [p for p in ranked if p[0] == "typed"][:walks // 2]
    walked: set[Point] = set()
    for start in sorted(chosen, key=lambda p: found[p].estimate_s):
        point = start
        while point not in walked and planning_clock() < deadline and hood.priced < limit:
            walked.add(point)
            point = _step(hood, point, found, deadline, limit)
            if point is None:
                break
    if found:
        _fewer_pools(hood, min(found, key=lambda p: found[p].estimate_s), found, deadline,
                     hood.priced + max(SUBSET_POINTS_MIN, limit // SUBSET_SHARE))
    return found


def warm_up(scenario: "Scenario", limit: int = 400) -> dict[str, Any]:
    """What :func:`improve` computes before it needs the network's proposals, as plain data for
    :meth:`Neighbourhood.absorb`: the narrow seeds (:func:`narrow_seeds`) priced, their micro-batch sweep
    (within the share of ``limit`` the walk gives it), and the validity and bounds of their counterparts in the
    other family (:meth:`Neighbourhood.switched`, whose typed depths take layer splits). A forked child computes
    it while the parent decodes (1,024 GPUs: about a fifth of the walk). Every value is a pure function of the
    scenario, so the walk that takes it visits and returns what it would without it, sooner."""
    cache_before, sync_before = set(scenario._cache), set(scenario.ctx.sync_cache)
    hood = Neighbourhood(scenario)
    found = {}
    seeds = narrow_seeds(hood)
    for p in seeds:
        if hood.valid(p) and (scored := hood.price(p)) is not None:
            found[p] = scored
    sweep = [("mixed", order, tps, dp, mb, rc) for _, order, tps, dp, _, rc in (p for p in seeds if p in found)
             for mb in scenario.mb_options(dp)[1:]]
    for q in sweep[:max(SUBSET_POINTS_MIN, limit // SUBSET_SHARE)]:
        if hood.valid(q) and hood.fits(q) and (scored := hood.price(q)) is not None:
            found[q] = scored
    for q in {q for p in found for q in hood.switched(p)}:
        if hood.valid(q):
            hood.bound_s(q)
    return hood.export(cache_before, sync_before)


def _plain(value: Any) -> bool:
    """Whether ``value`` is built of numbers, strings and containers of them only (a copy equals the original)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list, frozenset)):
        return all(_plain(v) for v in value)
    return False


def narrow_seeds(hood: Neighbourhood) -> list[Point]:
    """Starts beside the network's: mixed pipelines over each pool alone and over the two and three fastest
    pools (fastest first, where the zones allow that order), each pool at its narrowest TP degree, with the most replicas
    that fit, micro-batch 1 and the lightest recompute mode that fits: data parallelism as wide as memory
    allows. A walk from wide tensor parallelism over every pool can spend its budget before it gets there
    (gpt3-6.7b on 1,024 GPUs of four types, held out: the network proposed all four pools at TP 4-8 and
    the walk ended at 0.70 of search's throughput)."""
    s = hood.s
    # fastest first; among equally fast pools, the larger memory and the more devices (A100-80GB before -40GB)
    fastest = sorted(range(len(s.pools)), key=lambda p: (-s.pools[p].gpu.tflops_bf16, -s.pools[p].gpu.memory_gb,
                                                         -s.pools[p].num_devices, p))
    orders = [(p,) for p in fastest] + [tuple(fastest[:k]) for k in range(2, min(3, len(fastest)) + 1)]
    out = []
    for order in orders:  # every pool alone (a zone's pool may be all a linked-in-part cluster can use well)
        if not s.path_ok(order):
            continue
        for notch in range(max(len(s.tps[p]) for p in order)):  # the narrowest degrees where anything fits
            tps = tuple(s.tps[p][min(notch, len(s.tps[p]) - 1)] for p in order)
            point = next((q for d in reversed(s.dp_options(order, tps)) for r in s.modes
                          if hood.valid(q := ("mixed", order, tps, d, 1, r)) and hood.fits(q)), None)
            if point is not None:
                out.append(point)
                break
    return out


SUBSET_POINTS_MIN, SUBSET_SHARE = 12, 5
""":func:`_fewer_pools` prices at most ``max(SUBSET_POINTS_MIN, limit // SUBSET_SHARE)`` points beyond the walk's
own budget (20 on the 1,024-GPU public entry, 120 at the walk's 600)."""


def group_of(point: Point) -> tuple:
    """Family and set of pools of a point (the groups whose best ``search`` simulates one by one)."""
    return point[0], frozenset(point[1] if point[0] == "mixed" else (p for p, _, _ in point[1]))


def _fewer_pools(hood: Neighbourhood, best: Point, found: dict, deadline: float, limit: int) -> None:
    """The best point of every group of fewer pools than ``best`` uses, one pool dropped at a time: each
    dropped structure under every replica count (the micro-batch kept and 1), then walked within its
    group by single moves. The walk follows the search's estimate, which can prefer adding a slow pool where the
    simulator does not (llama3-8b on 8 H200 + 16 L4, held out: the estimate puts the L4s in as a last
    stage, 10.3 s against 11.3 s for the H200s alone, the simulator has the H200s alone 2.9% faster);
    ``search`` simulates the best of every group, and so does the policy's shortlist, given a point
    there. Fills ``found``; stops at ``limit`` priced points or the deadline."""
    queue, seen = [best], {group_of(best)}
    while queue:
        point = queue.pop(0)
        for drop in _dropped(hood, point):
            group = group_of(drop[0])
            if group in seen:
                continue
            seen.add(group)
            priced = {}
            for q in drop:
                if planning_clock() > deadline or hood.priced >= limit:
                    return
                if q not in found and hood.valid(q) and (scored := hood.price(q)) is not None:
                    found[q] = scored
                if q in found:
                    priced[q] = found[q]
            if not priced:
                continue
            at = min(priced, key=lambda q: priced[q].estimate_s)
            walked: set[Point] = set()
            while at is not None and at not in walked:
                walked.add(at)
                at = _step(hood, at, found, deadline, limit, keep=lambda q, g=group: group_of(q) == g, compound=False)
            queue.append(min((q for q in found if group_of(q) == group), key=lambda q: found[q].estimate_s))


def _dropped(hood: Neighbourhood, point: Point) -> list[list[Point]]:
    """Per pool of ``point`` (when it uses two or more), slowest device type first (the likeliest to cost
    more than it adds: the walk's budget may end after the first), the structures without it: mixed
    pipelines renumbered under every replica count; typed replicas of three or more pools without it, of
    two pools the other pool's mixed pipeline."""
    out = []
    pools = hood.s.pools

    def slowest_first(indices, pool_of):
        return sorted(indices, key=lambda i: (pools[pool_of(i)].gpu.tflops_bf16, i))

    if point[0] == "mixed":
        _, order, tps, dp, mb, rc = point
        for i in slowest_first(range(len(order)), lambda i: order[i]) if len(order) > 1 else ():
            out.append(list(hood._renumbered(order[:i] + order[i + 1:], tps[:i] + tps[i + 1:], dp, mb, rc)))
        return out
    _, typed, mb, rc = point
    for i in slowest_first(range(len(typed)), lambda i: typed[i][0]) if len(typed) > 1 else ():
        rest = typed[:i] + typed[i + 1:]
        if len(rest) >= 2:
            out.append([("typed", rest, mb, rc)])
        else:
            (p, t, _), = rest
            out.append(list(hood._renumbered((p,), (t,), 1, mb, rc)))
            out.append([("typed", rest, mb, rc)])  # one pool with uneven shares, where its replicas need them
    return out


def _step(hood: Neighbourhood, point: Point, found: dict, deadline: float, limit: int = 400, gain: float = 1e-3,
          keep=None, compound: bool = True) -> Point | None:
    """The first neighbour of ``point``, in order of bound, that beats it by ``gain``: one move away,
    else (at a local optimum of single moves, where ``compound``) a compound move away; None when none
    does. Priced points go to ``found``. ``keep``: only neighbours it accepts."""
    best_s = found[point].estimate_s * (1 - gain)
    for moves in (hood.neighbours(point), hood.compound(point) if compound else ()):
        queue = sorted((hood.bound_s(nb), i, nb) for i, nb in enumerate(dict.fromkeys(moves))
                       if nb not in found and (keep is None or keep(nb)) and hood.valid(nb))
        for bound, _, nb in queue:
            if planning_clock() > deadline or hood.priced >= limit:
                return None
            if bound >= best_s:
                break
            scored = hood.price(nb, threshold=best_s)
            if scored is not None:
                found[nb] = scored
                if scored.estimate_s < best_s:
                    return nb
    return None
