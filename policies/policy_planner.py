"""The ``policy`` planner: the trained GNN decodes plan structures; exact completion fills in the numbers.

One pass of the network per decision, batched over ``1 + samples`` decodes (the greedy one and
``samples`` sampled ones, all masked). Every distinct finished structure is completed exactly (the
search's layer split and batch shares), the completions are ordered by the search's estimate and
the best few are simulated together (branch and bound, :meth:`Evaluator.best`): that is the
policy alone. Optionally (on by default) a refinement follows: from the decoded structures a walk
over structures (:mod:`hetpart.policies.neighbourhood`: one pool's TP, a pool added, dropped or
moved, replicas, micro-batch, recompute, the other family) prices its way to better points with
the search's estimate, never simulating; the best few are simulated, and the winner and the
``proportional`` baseline are hill-climbed as ``search`` refines its own
(:func:`hetpart.policies.refine.refine`: layer boundaries, micro-batches, interleaving).

:func:`decode` returns what each stage contributes (greedy alone, best of K, refined), so benchmarks
can say what the network itself is worth.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of
from hetpart.policies.clock import planning_clock
from hetpart.policies.common import no_plan_error, offload_level
from hetpart.errors import SpecError, WorkloadError
from hetpart.policies.observation import SHAPES, StaticFeatures, observe
from hetpart.policies.structure import NUM_ACTIONS, Scenario, StructureState

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["DEFAULT_CHECKPOINT", "Decoded", "decode", "sample_plans", "plan_policy", "load_policy", "PolicyPlanner", "POLICY",
           "OPTIONS"]

DEFAULT_CHECKPOINT = Path(__file__).with_name("checkpoints") / "policy.zip"
"""The shipped checkpoint (``hetpart train-policy --config experiments/configs/policy.yaml``)."""


@dataclass
class Decoded:
    """What the policy planner found, stage by stage."""

    greedy: Evaluated | None
    """The greedy decode, completed exactly (the network alone)."""
    sampled: Evaluated | None
    """The best of the greedy and sampled decodes."""
    refined: Evaluated | None
    """``sampled`` after the search's refinement (None when refinement is off)."""
    structures: int
    """Distinct structures decoded."""
    timings_s: dict[str, float] = field(default_factory=dict)
    baseline: Evaluated | None = None
    """The ``proportional`` planner's plan, which refinement also starts from (None when off or when
    none of its layouts fits): the policy never returns a plan slower than that baseline."""

    @property
    def best(self) -> Evaluated | None:
        return self.refined or self.sampled


@lru_cache(maxsize=4)
def load_policy(path: str):
    """The decoding network (:class:`~hetpart.policies.gnn.PlanGNN`) of a MaskablePPO checkpoint (cached).

    Read from the plain state-dict file beside the checkpoint (:func:`~hetpart.policies.gnn.network_path`) when it
    was taken from this checkpoint (its SHA-256), without SB3: loading SB3 and rebuilding the whole algorithm took
    about 5 of the 9 s a planning process spent loading the policy. Otherwise the checkpoint is loaded with SB3, its
    actor's network taken (the same weights: the same actions) and the file written for the next process, where the
    folder allows."""
    from hetpart.policies.gnn import (check_features, checkpoint_digest, load_network, network_of, network_path,
                                      save_network)

    if not Path(path).is_file():
        raise SpecError(f"policy checkpoint: {path} does not exist; train one with "
                        "'hetpart train-policy --config experiments/configs/policy.yaml' or use --planner search")
    check_features(path)  # trained on the features this code observes (a same-width change would load silently)
    digest = checkpoint_digest(path)
    net = load_network(network_path(path), digest)
    if net is not None:
        return net
    from sb3_contrib import MaskablePPO

    from hetpart.policies.gnn import PointerPolicy

    model = MaskablePPO.load(path, device="cpu", custom_objects={"policy_class": PointerPolicy})
    try:
        net = network_of(model.policy.eval())
    except ValueError as exc:
        raise SpecError(f"policy checkpoint: {path} was not trained with the GNN pointer policy (PointerPolicy): "
                        f"{exc}") from None
    try:
        save_network(net, network_path(path), digest)
    except OSError:  # a read-only folder: the next process loads it with SB3 again
        pass
    return net


class _Deadline(Evaluator):
    """An evaluator that stops simulating (returns None) once its deadline has passed, and simulates each
    plan once: the decodes' shortlist, the walk's shortlist and the climbs from the walk's best, level 1's
    best and the baseline meet the same plans (gpt3-6.7b on 6 RTX 3090 + 120 Ascend 910B: 164 simulations
    asked for, 119 distinct plans)."""

    deadline = math.inf
    asked = 0
    """Plans asked for one at a time (calls: what the hill-climb asks), simulated before or not."""
    allowance = math.inf
    """The count of :attr:`asked` from which every plan asked for is None, as past the deadline: the near basins'
    shared budget (:func:`_climb_near`). It counts what is asked, not what is simulated (plans met before are free
    to simulate, and which were met depends on whether level 1's walk ran in a child), nor seconds: the same
    plans come out on any machine."""

    def __call__(self, plan, **options):
        if planning_clock() > self.deadline:
            return None
        self.asked += 1
        if self.asked > self.allowance:
            return None
        return super().__call__(plan, **options)

    def _one(self, plan):
        memo = self.__dict__.setdefault("_simulated", {})
        if plan not in memo:  # plans compare without their meta
            memo[plan] = super()._one(plan)
        found = memo[plan]
        return found if found is None or found.plan is plan else Evaluated(plan, found.estimate)

    def with_splits(self, plan):
        """The LP-split version of ``plan``, each distinct plan's once: :meth:`Evaluator.best` splits every plan
        it is given before it bounds them, and the walk's shortlist, its near basins (:func:`_near_groups`) and
        the climbs hand it the same plans again (llama2-13b on four device types: 1,540 splits asked for, 257
        LPs solved, about a quarter of the planning time)."""
        memo = self.__dict__.setdefault("_splits", {})
        filled = memo.get(plan)
        if filled is None:
            filled = super().with_splits(plan)
            memo[plan] = _UNSPLIT if filled is plan else filled
            return filled
        if filled is _UNSPLIT:
            return plan
        return filled if filled.meta == plan.meta else replace(filled, meta=plan.meta)


_UNSPLIT = object()
"""In :meth:`_Deadline.with_splits`' memo: the plan needs no split (it is its own split version)."""


def _run_network(net, states: list[StructureState], static: StaticFeatures, rng: np.random.Generator,
                 memo: dict | None = None) -> None:
    """Advance every unfinished state by one decision (state 0 greedy, the others sampled) with ``net`` (a
    :class:`~hetpart.policies.gnn.PlanGNN`: its logits are the pointer policy's action logits). ``memo`` keeps the
    model's embedding across the decode's passes (every state plans the same model) and each distinct state's
    observation and mask (:func:`_signature`: the greedy and sampled decodes share their first decisions)."""
    import torch

    from hetpart.policies.gnn import logits_and_context, model_embedding

    active = [i for i, s in enumerate(states) if not s.done]
    seen = memo.setdefault("observed", {}) if memo is not None else {}
    observed = []
    for i in active:  # the decodes share their first decisions: each state's observation and mask once
        key = _signature(states[i])
        if key not in seen:
            seen[key] = (observe(states[i], static), states[i].action_mask())
        observed.append(seen[key])
    obs = [o for o, _ in observed]
    batch = {k: torch.as_tensor(np.stack([o[k] for o in obs])) for k in obs[0]}
    masks = np.stack([m for _, m in observed])
    with torch.no_grad():
        model = None
        if memo is not None:
            if "model" not in memo:
                memo["model"] = model_embedding(net, batch["units"][:1].reshape(1, *SHAPES["units"]),
                                                batch["unit_mask"][:1])
            model = memo["model"]
        logits = logits_and_context(net, batch, model)[0].numpy().astype(float)
    logits = np.where(masks, logits, -np.inf)
    for row, i in enumerate(active):
        if i == 0:
            action = int(np.argmax(logits[row]))
        else:
            p = np.exp(logits[row] - logits[row].max())
            action = int(rng.choice(NUM_ACTIONS, p=p / p.sum()))
        states[i].step(action, masks[row])


def _signature(state: StructureState) -> tuple:
    """Everything a state's observation and mask depend on besides its scenario (states of one decode share it)."""
    return (state.phase, state.family, state.order, state.tps, state.dp, state.mb, state.rc, state.pool,
            tuple(state.typed), state.pending_tp)


def decode(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, samples: int = 16,
           simulate_top: int = 6, refine: bool = True, refine_steps: int = 40, walk_points: int = 600,
           time_budget_s: float = 10.0,
           seed: int = 0, checkpoint: str | Path | None = None, evaluator: Evaluator | None = None,
           baseline: bool = True, network_alone: bool = True) -> Decoded:
    """Greedy + ``samples`` sampled decodes, exact completion, batch simulation, optional refinement.

    Args:
        samples: sampled decodes beside the greedy one.
        simulate_top: points (best estimates first, plus the best of every family and set of pools)
            whose plans are simulated, for the decodes and again after the structure walk.
        refine: walk from the decoded structures to better ones under the search's estimate
            (:mod:`hetpart.policies.neighbourhood`, at most ``walk_points`` points priced), simulate the
            best points, then hill-climb the winner and the baseline as ``search`` does (at most
            ``refine_steps`` simulations per climb, fewer beyond 128 GPUs: :func:`_climb_steps`).
        time_budget_s: a safety net, not the budget that shapes the answer (that is ``walk_points`` and
            ``refine_steps``, so a busy machine gives the same plan): planning stops starting new work
            this many CPU seconds after it began (:func:`~hetpart.policies.clock.planning_clock`: a busy
            machine takes longer in wall time, not fewer steps; loading the network excluded): the walk by 45% of it,
            simulating candidates by 60%, the climb at 100%; the greedy structure, the walk's best
            point, the baseline and the final report are always completed.
        evaluator: its predictor prices the plans (default: the default predictor).
        baseline: also plan with ``proportional`` (Holmes/HAP layouts: layers and batch in proportion
            to speed) and hill-climb from its plan too, so the result is never below that baseline.
            ``greedy`` and ``sampled`` stay the network's own contribution.
        network_alone: also simulate the greedy decode and the best of the decodes by themselves
            (``greedy``, ``sampled``: what the network contributes, for reports); the walk starts from
            the same structures either way, so the planner skips this when it refines.
    """
    loading = time.perf_counter()
    policy = load_policy(str(checkpoint or DEFAULT_CHECKPOINT))
    start = time.perf_counter()  # the budget is for planning; loading the network happens once per process
    clock = planning_clock()  # where the budget counts from (CPU seconds: hetpart.policies.clock)
    evaluator = _Deadline(model, cluster, workload, predictor=evaluator.predictor if evaluator else None)
    scenario = Scenario(model, cluster, workload, evaluator=evaluator)
    timings = {"load_s": start - loading}
    if not scenario.feasible:  # nothing fits unsharded: the first level that fits, as search goes up
        scenario = _sharded_scenario(scenario, evaluator)
        workload = scenario.workload
    if not scenario.feasible:
        raise no_plan_error(model, cluster, workload, "policy", "no structure of the search space fits in memory")
    pending = _PendingBaseline(model, cluster, workload, evaluator, scenario,
                               _walk_points(walk_points, cluster.num_devices) if refine else 0) if baseline else None
    try:
        return _decode(policy, scenario, evaluator, pending, start, timings, samples, simulate_top, refine,
                       refine_steps, walk_points, time_budget_s, seed, network_alone, clock)
    finally:
        if pending is not None:
            pending.close()


def _sharded_scenario(scenario: Scenario, evaluator: Evaluator) -> Scenario:
    """Where no structure fits at level 0 and the workload leaves the sharding level open, the scenario at the first
    higher level (1 to 3, :func:`~hetpart.policies.common.sharding_levels`) where one does, as ``search`` goes on
    to the next level while nothing fits (:func:`~hetpart.policies.plan_search._next_level_wanted`); else
    ``scenario`` itself. Gemma-3-27B on 4 A100-80GB + 32 RTX 4090 (heldout-12-01c): a pipeline over the desktops
    holds its 1.4B-parameter tied head only when data parallelism shards its states; search plans it at level 1,
    the policy said no structure fits."""
    from dataclasses import replace

    from hetpart.policies.common import sharding_levels

    workload = scenario.workload
    if workload.zero is not None:
        return scenario
    for level in sharding_levels(workload)[1:]:
        upper = Scenario(scenario.model, scenario.cluster, replace(workload, zero=level), evaluator=evaluator)
        if upper.feasible:
            return upper
    return scenario


def _decode(policy, scenario: Scenario, evaluator: "_Deadline", pending: "_PendingBaseline | None", start: float,
            timings: dict, samples: int, simulate_top: int, refine: bool, refine_steps: int, walk_points: int,
            time_budget_s: float, seed: int, network_alone: bool, clock: float) -> Decoded:
    """:func:`decode`'s work; ``start`` (wall) times it, ``clock`` (:func:`planning_clock`) is where its budget
    counts from."""
    cluster = scenario.cluster
    states = _decode_structures(policy, scenario, samples, seed)
    timings["decode_s"] = time.perf_counter() - start
    distinct: dict[tuple, StructureState] = {}
    for s in states:
        distinct.setdefault(s.key(), s)
    greedy = sampled = refined = base = lifted = None
    near: list[Evaluated] = []
    if network_alone or not refine:
        greedy = _complete(evaluator, states[0])  # the network's own answer is always completed
        evaluator.deadline = clock + 0.6 * time_budget_s
        scored = sorted(sc for s in distinct.values() if (sc := s.scored()) is not None)
        sampled = evaluator.best(_plans([sc for _, sc in _shortlist([(None, sc) for sc in scored], simulate_top)]),
                                 incumbent=greedy)
        timings["sample_s"] = time.perf_counter() - start - timings["decode_s"]
    if refine:
        from hetpart.policies.forked import Forked, can_fork
        from hetpart.policies.neighbourhood import Neighbourhood, improve, point_of

        upper = None
        if _level_one_wanted(scenario):  # level 1 walked from the same decodes, in a child where one can run
            upper = Forked(_walk_level_one, scenario, evaluator, [point_of(s) for s in distinct.values()],
                           clock + 0.45 * time_budget_s, clock + 0.6 * time_budget_s,
                           _walk_points(walk_points, cluster.num_devices), simulate_top,
                           fork=PARALLEL_LEVEL_ONE and can_fork(evaluator.predictor))
        try:
            walk = time.perf_counter()
            hood = Neighbourhood(scenario, warm=pending.warm if pending is not None else None)
            found = improve(hood, [point_of(s) for s in distinct.values()], clock + 0.45 * time_budget_s,
                            limit=_walk_points(walk_points, cluster.num_devices))
            timings["walk_s"] = time.perf_counter() - walk
            timings["walk_points"] = hood.priced
            evaluator.deadline = clock + 0.6 * time_budget_s
            ranked = sorted(found.items(), key=lambda pair: pair[1])
            exact = sorted(sc for point, _ in _shortlist(ranked, simulate_top,
                                                         basins=cluster.num_devices <= FEWER_NODES_MAX_DEVICES)
                           if (sc := hood.exact(point)) is not None)
            deadline, evaluator.deadline = evaluator.deadline, math.inf  # the walk's best is always simulated
            refined = evaluator.best(_plans(exact[:1]), incumbent=sampled)
            evaluator.deadline = deadline
            refined = evaluator.best(_plans(exact[1:]), incumbent=refined)
            near = _near_groups(evaluator, exact, refined, cluster.num_devices)
            if upper is not None:  # level 1's walk, forked beside level 0's or run now
                began = time.perf_counter()
                (lifted, near_lifted), timings["walk_level1_s"] = upper.result()
                near += near_lifted
                timings["level1_wait_s"] = time.perf_counter() - began
        finally:
            if upper is not None:
                upper.close()  # a child left running by an error
    incumbent = best_of([refined, lifted])

    def baseline() -> Evaluated | None:
        began = time.perf_counter()
        found = pending.result(incumbent=incumbent)
        timings["baseline_s"] = time.perf_counter() - began  # the wait for it, where a child computed it
        timings["baseline_forked"] = pending.forked and not pending.redone
        return found

    # a child's baseline is taken after the climbs that come before its own: it prices nothing here, and the child
    # may still be at it (it computes the walk's warm start first)
    late = refine and pending is not None and pending.forked
    if pending is not None and not late:
        base = baseline()
    if refine:
        from hetpart.policies.refine import refine as hill_climb

        evaluator.deadline = clock + time_budget_s
        steps = _climb_steps(refine_steps, cluster.num_devices)
        # level 1's best climbs on its own, as in search (the level whose start is slower may climb higher), and
        # so does level 0's best at level 1, as it is and split again (the memory it frees lets layers move)
        resharded = level_one_starts(scenario, evaluator, refined) if upper is not None else []
        starts = [e for e in (refined, lifted, *resharded) if e is not None]
        climbed = [hill_climb(evaluator, e, steps) for e in starts]
        if late:
            base = baseline()
        if base is not None:
            starts.append(base)
            climbed.append(hill_climb(evaluator, base, steps))
        climbed += _climb_near(hill_climb, evaluator, near, starts, steps)
        refined = max(climbed, key=lambda e: e.tokens_per_s, default=None)
    elif base is not None and (sampled is None or base.tokens_per_s > sampled.tokens_per_s):
        refined = base
    timings["total_s"] = time.perf_counter() - start
    return Decoded(greedy, sampled, refined, len(distinct), timings, base)


def level_one_starts(scenario: Scenario, evaluator: Evaluator, found: Evaluated | None) -> list[Evaluated]:
    """``found``'s plan with its optimizer states sharded (level 1), priced, and the same structure split
    again under level 1's memory (the search's exact split of that point at level 1), each where it fits:
    both climb, because the faster start need not climb higher (llama2-7b on the public consumer cluster:
    31,886 -> 31,984 tokens/s from the same split, 31,828 -> 32,381 from level 1's). Empty where ``found`` is
    not a level-0 plan of several replicas. ``search`` climbs them too (:func:`~hetpart.policies.plan_search.plan_search`)."""
    from dataclasses import replace

    from hetpart.policies.neighbourhood import Neighbourhood

    if found is None or found.plan.zero != 0 or found.plan.dp < 2:
        return []
    starts = [evaluator(replace(found.plan, zero=1))]
    point = _mixed_point(scenario, found.plan)
    if point is not None:
        upper = Scenario(scenario.model, scenario.cluster, replace(scenario.workload, zero=1), evaluator=evaluator)
        split = Neighbourhood(upper).exact(point) if upper.feasible else None
        if split is not None:
            starts.append(evaluator.best(split.build()))
    distinct: list[Evaluated] = []
    for e in starts:
        if e is not None and all(e.plan != o.plan for o in distinct):
            distinct.append(e)
    return distinct


def _mixed_point(scenario: Scenario, plan) -> tuple | None:
    """The walk's point of a plan of identical mixed pipelines (:func:`~hetpart.policies.neighbourhood.point_of`'s
    form): pools in pipeline order with their TP degrees, replicas, micro-batch, recompute; None for any
    other plan (typed replicas, a stage over two pools, a pool's stages at unlike TP degrees, uneven shares)."""
    owner = {d: i for i, pool in enumerate(scenario.pools) for d in pool.devices}
    order: list[int] = []
    tps: list[int] = []
    for replica in plan.replicas:
        pools = []
        for stage in replica.stages:
            held = {owner.get(d) for d in stage.devices}
            if len(held) != 1 or None in held:
                return None
            pools.append((held.pop(), stage.tp))
        runs = [pt for i, pt in enumerate(pools) if i == 0 or pools[i - 1] != pt]
        if not order:
            order, tps = [p for p, _ in runs], [t for _, t in runs]
        if [p for p, _ in runs] != order or [t for _, t in runs] != tps:
            return None
    if len(set(order)) != len(order) or len({r.batch_share for r in plan.replicas}) > 1:
        return None  # (a pool's replicas with uneven shares are typed replicas of one pool)
    return ("mixed", tuple(order), tuple(tps), plan.dp, plan.micro_batch, plan.recompute)


PARALLEL_LEVEL_ONE = True
"""Walk sharding level 1 in a forked child beside level 0 where one can run (tests turn it off to compare)."""


def _level_one_wanted(scenario: Scenario) -> bool:
    """Whether the policy walks sharding level 1 too: where ``search`` searches it beside level 0 (the
    workload leaves the level open, at most :data:`~hetpart.policies.plan_search.LEVEL_ONE_MAX_DEVICES`
    devices; :func:`~hetpart.policies.plan_search._next_level_wanted`), so that the policy looks where
    search looks."""
    from hetpart.policies.plan_search import searches_level_one

    return scenario.ctx.zero == 0 and searches_level_one(scenario.workload, scenario.cluster)


def _walk_level_one(scenario: Scenario, evaluator: "_Deadline", starts: list, walk_deadline: float,
                    deadline: float, limit: int, top: int) -> tuple[tuple[Evaluated | None, list[Evaluated]], float]:
    """The structure walk at sharding level 1 from ``starts`` (the decoded points), its shortlist priced
    exactly and simulated: the best plan (None: nothing fits) with the near groups' bests (:func:`_near_groups`),
    and the seconds it took. It depends on nothing the level-0 walk finds, so a child runs it beside that walk
    (:class:`~hetpart.policies.forked.Forked`)."""
    from dataclasses import replace

    from hetpart.policies.neighbourhood import Neighbourhood, improve

    began = time.perf_counter()
    upper = Scenario(scenario.model, scenario.cluster, replace(scenario.workload, zero=1), evaluator=evaluator)
    if not upper.feasible:
        return (None, []), time.perf_counter() - began
    hood = Neighbourhood(upper)
    found = improve(hood, starts, walk_deadline, limit=limit)
    ranked = sorted(found.items(), key=lambda pair: pair[1])
    basins = scenario.cluster.num_devices <= FEWER_NODES_MAX_DEVICES
    exact = sorted(sc for point, _ in _shortlist(ranked, top, basins) if (sc := hood.exact(point)) is not None)
    kept, evaluator.deadline = evaluator.deadline, deadline
    try:
        best = evaluator.best(_plans(exact))
        return (best, _near_groups(evaluator, exact, best, scenario.cluster.num_devices)), time.perf_counter() - began
    finally:
        evaluator.deadline = kept


def walk_starts(scenario: Scenario, evaluator: Evaluator, plans: list, walk_points: int = 600, simulate_top: int = 6
                ) -> list[Evaluated]:
    """The policy's structure walk without its network, for ``search``: walked from the points of ``plans`` (mixed
    pipelines; :func:`_mixed_point`) and the walk's own seeds, its shortlist (basins included) simulated; the best
    plan and the near basins' (:func:`_near_groups`), where the hill-climb starts. Empty where nothing fits."""
    from hetpart.policies.neighbourhood import Neighbourhood, improve

    if not scenario.feasible:
        return []
    devices = scenario.cluster.num_devices
    points = list(dict.fromkeys(p for e in plans if e is not None and (p := _mixed_point(scenario, e.plan)) is not None))
    hood = Neighbourhood(scenario)
    found = improve(hood, points, planning_clock() + 4.5, limit=_walk_points(walk_points, devices))
    ranked = sorted(found.items(), key=lambda pair: pair[1])
    exact = sorted(sc for point, _ in _shortlist(ranked, simulate_top, devices <= FEWER_NODES_MAX_DEVICES)
                   if (sc := hood.exact(point)) is not None)
    best = evaluator.best(_plans(exact))
    return [e for e in (best, *_near_groups(evaluator, exact, best, devices)) if e is not None]


NEAR_GROUP = 0.02
"""How close (in simulated tokens/s) another group's best must come to the walk's best for the
hill-climb to start from it too (:func:`_near_groups`)."""


def _near_groups(evaluator: Evaluator, exact: list, best: Evaluated | None, devices: int) -> list[Evaluated]:
    """The best simulated plan of each basin (:func:`_basin`) of the shortlist ``exact`` that comes within
    :data:`NEAR_GROUP` of ``best``'s throughput, up to
    :data:`FEWER_NODES_MAX_DEVICES` devices: the hill-climb is local, and two structures a hair apart may climb
    to very different heights. falcon-7b (one key/value head: tensor parallelism 1) on 2 x 8 A100 + 2 x 8 V100:
    the A100s alone (75,785 tokens/s) and an A100-V100 pipeline (75,770) came out of the walk neck and neck; the first
    climbs nowhere, the second to 84,821 through interleaving the V100 stages."""
    if best is None or not exact or devices > FEWER_NODES_MAX_DEVICES:
        return []
    # each group's branch and bound starts from the threshold (_Threshold): a plan whose lower bound cannot come
    # within it is not simulated, and the same groups come out (a four-type cluster's shortlist holds dozens of
    # basins far behind the best)
    threshold = _Threshold(best, 1 - NEAR_GROUP)
    groups: dict[tuple, Evaluated | None] = {}
    for sc in exact:
        group = _basin(sc.key)
        found = evaluator.best(sc.build(), incumbent=groups.get(group) or threshold)
        groups[group] = None if found is threshold else found
    return [e for e in groups.values() if e is not None and e.plan != best.plan
            and e.tokens_per_s >= (1 - NEAR_GROUP) * best.tokens_per_s]


NEAR_CLIMBS = 3
"""The climbs from the near basins (:func:`_near_groups`, both sharding levels) share one budget: this many
climbs' worth of plans asked for (:func:`_climb_steps` each). Each basin climbed with a budget of its own before:
llama2-13b on four device types (40 GPUs, held out) had 21 near starts over its views and climbed 30 times."""


def _climb_near(hill_climb, evaluator: "_Deadline", near: list[Evaluated], starts: list[Evaluated], steps: int
                ) -> list[Evaluated]:
    """The near basins' bests climbed (``hill_climb``: :func:`~hetpart.policies.refine.refine`), fastest first, each
    plan once and none that ``starts`` (climbed already) holds, until together they have asked for
    :data:`NEAR_CLIMBS` ``x steps`` plans (:attr:`_Deadline.allowance`; each climb also at most ``steps`` per climb,
    as every other). Deterministic: the budget is a count of the plans the climbs ask for."""
    seen = {e.plan for e in starts}
    order: list[Evaluated] = []
    for e in sorted(near, key=lambda e: -e.tokens_per_s):  # stable: ties keep their order
        if e.plan not in seen:
            seen.add(e.plan)
            order.append(e)
    kept, evaluator.allowance = evaluator.allowance, evaluator.asked + NEAR_CLIMBS * steps
    try:
        climbed = []
        for e in order:
            if evaluator.asked >= evaluator.allowance:
                break
            climbed.append(hill_climb(evaluator, e, steps))
        return climbed
    finally:
        evaluator.allowance = kept


@dataclass(frozen=True)
class _Threshold:
    """A pseudo-incumbent for :meth:`Evaluator.best` a hair slower than ``share`` of ``best``'s throughput: every
    plan at least that fast beats it (:func:`best_of`), and the branch and bound stops at the first plan whose lower
    bound is slower (none after it can reach the threshold). Never a plan of its own: :func:`_near_groups` drops it."""

    best: Evaluated
    share: float

    @property
    def plan(self):
        return self.best.plan

    @property
    def tokens_per_s(self) -> float:
        return self.share * self.best.tokens_per_s * (1 - 1e-9)

    @property
    def step_time_s(self) -> float:
        return self.best.step_time_s * self.best.tokens_per_s / self.tokens_per_s


WALK_DEVICE_POINTS = 400 * 256
"""The walk's budget in points x devices beyond the smallest clusters: pricing a point costs about in
proportion to the cluster's devices (pools, replicas, stages), so this keeps the walk's time flat."""


def _walk_points(walk_points: int, devices: int) -> int:
    """Points the walk prices: ``walk_points`` on small clusters, ``WALK_DEVICE_POINTS / devices`` beyond
    (400 at 256 GPUs), at least 100 (and never more than ``walk_points``). On the 1,024-GPU public entry
    100 points reach 0.996 of what 400 reach, in 0.2 s instead of 0.5 s. Small clusters of four device
    types need more than 400: a random 4-type, 100-GPU held-out scenario (gpt3-2.7b) reached 0.56 of
    search's throughput with 400 points and 0.98 with 600 (+0.13 s)."""
    return min(walk_points, max(100, WALK_DEVICE_POINTS // max(devices, 1)))


def _climb_steps(refine_steps: int, devices: int) -> int:
    """Simulations per climb: ``refine_steps`` up to 128 GPUs, fewer beyond (a simulation costs in
    proportion to the plan's devices, and at that scale the walk's exact split leaves little to move),
    at least 4."""
    return max(min(refine_steps, 4), refine_steps * 128 // max(devices, 128))


def _decode_structures(policy, scenario: Scenario, samples: int, seed: int) -> list[StructureState]:
    """The greedy decode and ``samples`` sampled ones, finished (one network pass per decision)."""
    import torch

    static = StaticFeatures(scenario)
    states = [StructureState(scenario) for _ in range(1 + samples)]
    rng = np.random.default_rng(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batches of a few dozen rows: more threads only spin on a busy machine
    try:
        memo: dict = {}
        while not all(s.done for s in states):
            _run_network(policy, states, static, rng, memo)
    finally:
        torch.set_num_threads(threads)
    return states


def _shortlist(ranked: list, top: int, basins: bool = False) -> list:
    """The ``top`` best of ``ranked`` (pairs of anything and a :class:`Scored`, best first) plus the
    best of every family and set of pools (the estimate is a model: as in ``search``, the simulator
    decides between groups); with ``basins``, also the best of every basin (:func:`_basin`) within
    :data:`BASIN_ESTIMATE` of the best estimate."""
    from hetpart.policies.plan_search import _group

    chosen = dict.fromkeys(range(min(top, len(ranked))))
    groups: dict[tuple, int] = {}
    for i, (_, sc) in enumerate(ranked):
        groups.setdefault(_group(sc.key), i)
        if basins and sc.estimate_s <= (1 + BASIN_ESTIMATE) * ranked[0][1].estimate_s:
            groups.setdefault(("basin", *_basin(sc.key)), i)
    return [ranked[i] for i in sorted(chosen.keys() | groups.values())]


def _basin(key: tuple) -> tuple:
    """What the hill-climb cannot change about a point: a mixed pipeline's pools in pipeline order and their
    tensor-parallel degrees (A100s then V100s and V100s then A100s, TP 2 or TP 1, climb apart: :func:`_near_groups`);
    a typed plan's family and pools."""
    from hetpart.policies.plan_search import _group

    return ("mixed", key[1], key[2]) if key[0] == "mixed" else _group(key)


BASIN_ESTIMATE = 0.05
"""Up to :data:`FEWER_NODES_MAX_DEVICES` devices the walk's shortlist also holds the best estimate of every basin
(:func:`_basin`) within this share of the best estimate: about the estimate's error against the simulator. phi3-mini
(config.json) on 2 x 8 A100 + 2 x 8 V100 at level 1: A100-V100 pipelines at TP 1 ranked 12th of 121 points by
estimate (2.2% behind) and simulated best of all (129,267 tokens/s), climbing to 146,709; the shortlist had kept
only TP 2 of that pool set, which climbs to 133,617."""


def _plans(shortlist: list) -> list:
    return [p for sc in shortlist for p in sc.build()]


def _baseline(model, cluster, workload, evaluator: Evaluator, incumbent: Evaluated | None = None
              ) -> Evaluated | None:
    """The ``proportional`` planner's plan priced by ``evaluator`` (None when none of its layouts fits,
    or, given an ``incumbent``, when none beats it: then its layouts are pruned by their bounds)."""
    from hetpart.errors import WorkloadError
    from hetpart.policies.plan_proportional import plan_proportional

    deadline, evaluator.deadline = evaluator.deadline, math.inf  # a baseline is never cut short
    try:
        found = plan_proportional(model, cluster, workload, evaluator=evaluator, incumbent=incumbent)
    except WorkloadError:
        return None
    finally:
        evaluator.deadline = deadline
    return None if incumbent is not None and found is incumbent else found


PARALLEL_BASELINE = True
"""Compute the baseline in a forked child beside the decode where :func:`_can_fork` allows (tests turn it
off to compare the two ways)."""


def _can_fork(evaluator: Evaluator) -> bool:
    """A child may compute the baseline (:func:`hetpart.policies.forked.can_fork`: Linux, a second core, a
    fork-safe predictor)."""
    from hetpart.policies.forked import can_fork

    return PARALLEL_BASELINE and can_fork(evaluator.predictor)


def _proportional(model, cluster, workload, evaluator: Evaluator) -> Evaluated | None:
    """``proportional``'s plan without an incumbent; None where nothing fits."""
    import importlib

    from hetpart.errors import WorkloadError

    module = importlib.import_module("hetpart.policies.plan_proportional")  # the module: tests replace its function
    try:
        return module.plan_proportional(model, cluster, workload, evaluator=evaluator)
    except WorkloadError:
        return None


class _PendingBaseline:
    """The ``proportional`` baseline of :func:`_baseline`, computed while the network decodes and the walk
    runs. It does not depend on them: ``proportional`` plans from speeds and memory alone, so a forked
    child plans it on the second core (:class:`~hetpart.policies.forked.Staged`; 1,024 GPUs: 0.5 s of a
    2 s plan on a 2-core machine), after the structure walk's warm start (:meth:`warm`, sent first while the
    network decodes), and :meth:`result` applies the incumbent afterwards, which gives what
    the sequential call gives (it returns the baseline only when it beats the incumbent; ties as
    :func:`best_of` breaks them). Without an incumbent to prune with, the child prices more layouts, on
    the core that would otherwise idle. Where no child can run, or one fails, :meth:`result` computes it
    here, as before."""

    def __init__(self, model, cluster, workload, evaluator: Evaluator, scenario: Scenario | None = None,
                 walk_limit: int = 0) -> None:
        from hetpart.policies.forked import Staged

        self.args = (model, cluster, workload, evaluator)
        self.job = Staged(_child_stages, scenario if walk_limit else None, walk_limit, *self.args,
                          fork=_can_fork(evaluator))
        self.forked = self.job.forked
        self.warm_taken = False
        self.redone = False
        """Whether a forked child failed and the baseline was computed here instead."""

    def warm(self) -> dict | None:
        """The structure walk's warm start the child computed first (:func:`~hetpart.policies.neighbourhood.warm_up`;
        waits for it), once; None where no child runs (the walk computes it all itself)."""
        if self.warm_taken:
            return None
        self.warm_taken = True
        return self.job.next(fallback=lambda: None)

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs unreaped."""
        return self.job.pid

    def result(self, incumbent: Evaluated | None) -> Evaluated | None:
        """The baseline when it beats ``incumbent`` (or there is none), else None."""
        if not self.job.forked:
            return _baseline(*self.args, incumbent=incumbent)
        self.warm()  # the child sends the warm start first (unused where the walk did not run)
        if incumbent is not None and not self.job.ready():
            left = _layouts_beating(*self.args, incumbent)
            if left == 0:
                self.close()  # no layout's bound beats the incumbent: what the child would find is not wanted
                return None
            if left is not None and left <= FEW_LAYOUTS:  # priced here in less time than the child's
                self.close()  # every layout, priced there without the incumbent, would take
                return _baseline(*self.args, incumbent=incumbent)
        found = self.job.next(fallback=lambda: _FAILED)
        if found is _FAILED:
            self.redone = True
            return _baseline(*self.args, incumbent=incumbent)
        if found is None or (incumbent is not None and best_of([incumbent, found]) is incumbent):
            return None
        return found

    def close(self) -> None:
        """Stop and reap a child whose result is no longer wanted (the decode raised)."""
        self.job.close()


_FAILED = object()


FEW_LAYOUTS = 8
"""At most this many of the baseline's layouts left to price against the incumbent (:func:`_layouts_beating`): the
parent prices them itself rather than wait for the child, which prices every layout whose bound is below its own
best (it has no incumbent). A choice: 8 whole plans at 1,024 GPUs are about 0.1 s of CPU, the child's whole
baseline there about a second."""


def _layouts_beating(model, cluster, workload, evaluator: Evaluator, incumbent: Evaluated) -> int | None:
    """:func:`~hetpart.policies.plan_proportional.layouts_beating`: the baseline's layouts whose bound is not above
    the incumbent's step (a tenth of a second at 1,024 GPUs, where the child pricing them whole without an
    incumbent took a second); None where the bounds cannot tell."""
    from hetpart.policies.plan_proportional import layouts_beating

    return layouts_beating(model, cluster, workload, evaluator, incumbent)


def _child_stages(scenario: Scenario | None, walk_limit: int, model, cluster, workload, evaluator: Evaluator):
    """What the baseline's child computes, in order: the structure walk's warm start while the parent decodes
    (:func:`~hetpart.policies.neighbourhood.warm_up`; None without a ``scenario`` or where it fails: the walk
    then computes it all itself), then the baseline (:func:`_proportional`)."""
    from hetpart.policies.neighbourhood import warm_up

    try:
        warm = warm_up(scenario, walk_limit) if scenario is not None else None
    except Exception:  # noqa: BLE001 (a warm start is only ever a head start: the parent does without)
        warm = None
    yield warm
    yield _proportional(model, cluster, workload, evaluator)


def sample_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, samples: int = 16, seed: int = 0,
                 checkpoint: str | Path | None = None, evaluator: Evaluator | None = None) -> list[Evaluated]:
    """The policy's own proposals: greedy + ``samples`` sampled decodes, each distinct structure completed
    exactly and priced by ``evaluator`` (no refinement; what ``hetpart loop`` runs and learns from)."""
    policy = load_policy(str(checkpoint or DEFAULT_CHECKPOINT))
    evaluator = Evaluator(model, cluster, workload, predictor=evaluator.predictor if evaluator else None)
    scenario = Scenario(model, cluster, workload, evaluator=evaluator)
    if not scenario.feasible:
        raise no_plan_error(model, cluster, workload, "policy", "no structure of the search space fits in memory")
    states = _decode_structures(policy, scenario, samples, seed)
    distinct: dict[tuple, StructureState] = {}
    for s in states:
        distinct.setdefault(s.key(), s)
    found = [_complete(evaluator, s) for s in distinct.values()]
    return [f for f in found if f is not None]


def _complete(evaluator: Evaluator, state: StructureState) -> Evaluated | None:
    scored = state.scored()
    return None if scored is None else evaluator.best(scored.build())


def plan_policy(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: Evaluator | None = None,
                **options: Any) -> Evaluated:
    """The ``policy`` planner (the signature every planner has): the best plan :func:`decode` finds on the
    whole cluster and on the views ``search`` also plans (fewer nodes, one device type, throttled devices
    as types of their own), all sharing one :class:`_Views`: one deadline, one incumbent, one cache.

    Raises:
        WorkloadError: no structure fits in memory.
    """
    options.setdefault("network_alone", not options.get("refine", True))
    workload = offload_level(workload)  # an offloaded optimizer is sharded from level 1 (policies/common.py)
    views = _Views(model, workload, planning_clock() + VIEWS_BUDGET_SHARE * options.get("time_budget_s", 10.0))
    return _plan_views(model, cluster, workload, evaluator, options, views)


def _plan_views(model, cluster, workload, evaluator: Evaluator | None, options: dict, views: "_Views") -> Evaluated:
    """:func:`plan_policy` on ``cluster`` (the whole cluster, or a view of it, whose ``evaluator`` prices
    its plans on the real devices), its views planned through ``views``."""
    from hetpart.policies.plan_search import fewer_nodes_best, single_types_best, speed_typed_best

    failed = None
    try:
        found = decode(model, cluster, workload, evaluator=evaluator, **options).best
    except WorkloadError as exc:  # nothing fits on every node: fewer may still hold it (a small batch)
        found, failed = None, exc
    views.offer(found)
    # as search does, fewer nodes: up to FEWER_NODES_MAX_DEVICES devices, and beyond where the batch has fewer
    # sequences than the cluster has devices (or nothing fit): a decode per view costs what the first did
    # (1 s at 1,024 GPUs), which there only a small batch repays
    evaluate = evaluator if evaluator is not None else Evaluator(model, cluster, workload)
    if found is None or workload.global_batch < cluster.num_devices or cluster.num_devices <= FEWER_NODES_MAX_DEVICES:
        found = views.offer(best_of([found, fewer_nodes_best(
            model, cluster, workload, evaluate, found,
            views.planner("decode", lambda view, ev: decode(model, view, workload, evaluator=ev, **options).best))]))
    # as search does where the cluster is too large for level 1, one device type alone: each type of at most
    # FEWER_NODES_MAX_DEVICES devices whose compute floor the plan found does not already beat (gpt3-6.7b on 1,024
    # GPUs of four types: the 256 H100s alone, at level 1)
    nested = views.planner("policy", lambda view, ev: _plan_views(model, view, workload, ev, options, views))
    found = views.offer(best_of([found, single_types_best(model, cluster, workload, evaluate, found, nested,
                                                          max_devices=FEWER_NODES_MAX_DEVICES)]))
    # as search does, the view where each throttled device is a type of its own: only there can a structure leave
    # it out (gpt2-medium on 4 A100, one at 0.01 of its speed, + 4 V100: 63,098 tokens/s through it, search 153,571)
    if cluster.slow:
        found = views.offer(best_of([found, speed_typed_best(model, cluster, workload, evaluate, nested)]))
    if found is None:
        raise failed or no_plan_error(model, cluster, workload, "policy", "no decoded structure fits in memory")
    return found


VIEWS_BUDGET_SHARE = 3.0
"""The policy planner's overall safety net, in ``time_budget_s``: no view (fewer nodes, one type, the
speed-typed cluster) is started once the planning process has spent this many CPU seconds (``3 x 10``);
the whole cluster's decode always runs, and a view started runs to its own ``time_budget_s``. Before it,
each decode had its own 10 s and nothing bounded their sum: a random 264-GPU cluster of three types with a
throttled device ran 16 decodes, 35-97 s wall on a busy 2-core machine. CPU seconds, not wall seconds, so
that a busy machine gives the same plan (the rule :func:`decode`'s budgets follow): on that machine, at load
5.5, the slowest generated scenarios found their plan at 8, 14 and 7 s of the parent's CPU and finished at
15, 18 and 7 s (wall 64, 58 and 25 s); a wall-clock limit of 20 s there cost two of them 0.9% and 4.4%."""


class _Views:
    """What every view of one :func:`plan_policy` call shares: the overall deadline (``deadline``, in
    :func:`~hetpart.policies.clock.planning_clock` seconds: :data:`VIEWS_BUDGET_SHARE`), the best plan so far
    (every plan is priced on the real devices, so their tokens/s compare), and the answers of views already
    planned.

    A view is not planned when its compute floor (:func:`~hetpart.policies.plan_search._compute_floor_s`:
    a step time no plan on its devices can beat) is no faster than the best plan so far, wherever it was found:
    ``search``'s view loops prune with the best of their own level, and a nested one (a type alone inside the
    speed-typed view) did not know the better plan the outer level already had. A view asked for again with the
    same devices, the same real devices behind them and the same predictor (the A6000s alone, planned as a type
    of the cluster and again as a type of its speed-typed view) gets the first answer: planning is deterministic
    (the budgets that shape it are counts of points and simulations, not seconds)."""

    def __init__(self, model, workload, deadline: float) -> None:
        self.model, self.workload, self.deadline = model, workload, deadline
        self.best: Evaluated | None = None
        self.answers: dict[tuple, Any] = {}
        self.skipped = {"floor": 0, "deadline": 0, "repeated": 0}
        """Views not planned, by reason (tests and benchmarks read it)."""

    def offer(self, found: Evaluated | None) -> Evaluated | None:
        """Note ``found`` (priced on the real devices) as a candidate for the best so far; returns it."""
        if found is not None:
            self.best = best_of([self.best, found])
        return found

    def planner(self, kind: str, plan_view):
        """``plan_view(view, evaluator)`` (``kind`` names it in the cache) guarded as the class says: it raises
        ``WorkloadError`` (a view the callers of ``search``'s view loops skip) for a view past the deadline or
        whose floor cannot win."""
        from hetpart.policies.plan_search import _compute_floor_s

        def guarded(view, evaluator: Evaluator) -> Evaluated | None:
            tokens = self.workload.global_batch * self.workload.seq_len
            best_s = math.inf if self.best is None else tokens / self.best.tokens_per_s
            if _compute_floor_s(self.model, view, self.workload) >= best_s:
                self.skipped["floor"] += 1
                raise WorkloadError(f"{view.name}: its compute floor cannot beat the plan found")
            if planning_clock() > self.deadline:
                self.skipped["deadline"] += 1
                raise WorkloadError(f"{view.name}: the policy planner's overall deadline has passed")
            key = (kind, *_view_key(view, evaluator))
            if key in self.answers:
                self.skipped["repeated"] += 1
                found = self.answers[key]
            else:
                try:
                    found = plan_view(view, evaluator)
                except WorkloadError as exc:
                    found = exc
                self.answers[key] = found
            if isinstance(found, WorkloadError):
                raise found
            return self.offer(found)

        return guarded


def _view_key(view: "Cluster", evaluator: Evaluator) -> tuple:
    """What a view's plan depends on besides the model and workload: its devices and links (not its name), the
    real device each of its devices stands for (through every ``_OnReal`` a view of a view wraps its predictor
    in), the predictor that prices them there, and whether memory is ignored."""
    import json

    from hetpart.cluster import cluster_to_dict
    from hetpart.policies.plan_search import _OnReal

    spec = cluster_to_dict(view)
    spec.pop("name", None)
    ids = [d.id for d in view.devices]
    predictor = evaluator.predictor
    if isinstance(predictor, _OnReal):
        ids, predictor = predictor.on_real(ids)
    return json.dumps(spec, sort_keys=True, default=str), tuple(ids), id(predictor), evaluator.ignore_memory


FEWER_NODES_MAX_DEVICES = 256
"""Up to this many devices the policy always tries fewer nodes where the compute floor allows
(:func:`~hetpart.policies.plan_search.fewer_nodes_best`), as search does (gpt2-medium on 8 RTX 3090 + 4 Titan RTX +
8 RTX 2080 Ti, held out: search leaves one 2080 Ti node idle, +2.0%)."""

OPTIONS = frozenset({"samples", "simulate_top", "refine", "refine_steps", "walk_points", "time_budget_s", "seed",
                     "checkpoint", "baseline"})


@dataclass(frozen=True)
class PolicyPlanner:
    """The registry's ``policy`` planner (a :class:`~hetpart.policies.common.Planner`)."""

    name: str = "policy"
    options: frozenset = OPTIONS
    description: str = "the trained GNN policy: greedy + best-of-K structures, exact completion, search's refinement"

    def prepare(self, checkpoint: str | Path | None = None) -> None:
        """Load the network once (``plan`` times planning, not reading the checkpoint), and import what decoding
        imports on first use (once per process, as loading is: SB3's load imported NumPy's random module, which
        the decode's sampling needs, before the network came without it). Modules only: nothing of a plan is
        computed here. ``numpy.ma``: NumPy imports it on a process's first ``np.unique`` (the layer split's
        candidate bottlenecks), about 0.05 s of a quiet machine's first plan; the final report's provenance
        module likewise."""
        import numpy.ma  # noqa: F401
        import numpy.random  # noqa: F401

        import hetpart.costmodel.provenance  # noqa: F401
        import hetpart.policies.forked  # noqa: F401
        import hetpart.policies.neighbourhood  # noqa: F401
        import hetpart.policies.refine  # noqa: F401

        load_policy(str(checkpoint or DEFAULT_CHECKPOINT))

    def plan(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: Evaluator,
             **options: Any) -> Evaluated:
        return plan_policy(model, cluster, workload, evaluator=evaluator, **options)


POLICY = PolicyPlanner()
"""The registry's ``policy`` planner."""
