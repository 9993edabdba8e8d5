"""The ``policy`` planner: the trained GNN decodes plan structures; exact completion fills in the numbers.

One pass of the network per decision, batched over ``1 + samples`` decodes (the greedy one and
``samples`` sampled ones, all masked). Every distinct finished structure is completed exactly (the
search's layer split and batch shares), the completions are ordered by the search's estimate and
the best few are simulated together (branch and bound, :meth:`Evaluator.best`): that is the
policy alone. Optionally (on by default) a refinement follows, under a time budget: for the best
few structures, replicas, micro-batch and recompute are re-decided exactly with their pools, order
and TP kept (:mod:`hetpart.policies.renumber`), and the winner is hill-climbed as ``search`` refines
its own (:func:`hetpart.policies.refine.refine`: layer boundaries, micro-batches, interleaving).

:func:`decode` returns what each stage contributes (greedy alone, best of K, refined), so benchmarks
can say what the network itself is worth.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetpart.costmodel.evaluator import Evaluated, Evaluator
from hetpart.policies.common import no_plan_error
from hetpart.errors import SpecError
from hetpart.policies.observation import StaticFeatures, observe
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
    """The trained :class:`~hetpart.policies.gnn.PointerPolicy` of a MaskablePPO checkpoint (cached)."""
    from hetpart.policies.gnn import PlanGNNExtractor, PointerPolicy

    if not Path(path).is_file():
        raise SpecError(f"policy checkpoint: {path} does not exist; train one with "
                        "'hetpart train-policy --config experiments/configs/policy.yaml' or use --planner search")
    from sb3_contrib import MaskablePPO

    model = MaskablePPO.load(path, device="cpu", custom_objects={"policy_class": PointerPolicy})
    policy = model.policy.eval()
    if not isinstance(policy.features_extractor, PlanGNNExtractor):
        raise SpecError(f"policy checkpoint: {path} was not trained with the GNN policy (PlanGNNExtractor)")
    return policy


class _Deadline(Evaluator):
    """An evaluator that stops simulating (returns None) once its deadline has passed."""

    deadline = math.inf

    def __call__(self, plan, **options):
        if time.perf_counter() > self.deadline:
            return None
        return super().__call__(plan, **options)


def _run_network(policy, states: list[StructureState], static: StaticFeatures, rng: np.random.Generator) -> None:
    """Advance every unfinished state by one decision (state 0 greedy, the others sampled)."""
    import torch

    active = [i for i, s in enumerate(states) if not s.done]
    obs = [observe(states[i], static) for i in active]
    batch = {k: torch.as_tensor(np.stack([o[k] for o in obs])) for k in obs[0]}
    masks = np.stack([states[i].action_mask() for i in active])
    with torch.no_grad():
        features = policy.extract_features(batch, policy.pi_features_extractor)
        logits = policy.action_net(policy.mlp_extractor.forward_actor(features)).numpy().astype(float)
    logits = np.where(masks, logits, -np.inf)
    for row, i in enumerate(active):
        if i == 0:
            action = int(np.argmax(logits[row]))
        else:
            p = np.exp(logits[row] - logits[row].max())
            action = int(rng.choice(NUM_ACTIONS, p=p / p.sum()))
        states[i].step(action, masks[row])


def decode(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, samples: int = 16,
           simulate_top: int = 4, refine: bool = True, refine_steps: int = 40, time_budget_s: float = 1.5,
           seed: int = 0, checkpoint: str | Path | None = None, evaluator: Evaluator | None = None,
           renumber_top: int = 3, baseline: bool = True) -> Decoded:
    """Greedy + ``samples`` sampled decodes, exact completion, batch simulation, optional refinement.

    Args:
        samples: sampled decodes beside the greedy one.
        simulate_top: structures (best estimates first) whose plans are simulated.
        refine: re-decide replicas, micro-batch and recompute exactly for the ``renumber_top`` best
            structures (their pools, order and TP kept), then hill-climb the winner as ``search``
            does (within the time budget).
        time_budget_s: completion and refinement stop starting new work this many seconds after
            decoding ends (the greedy structure is always completed).
        evaluator: its predictor prices the plans (default: the default predictor).
        baseline: also plan with ``proportional`` (Holmes/HAP layouts: layers and batch in proportion
            to speed) and hill-climb from its plan too, so the result is never below that baseline.
            ``greedy`` and ``sampled`` stay the network's own contribution.
    """
    loading = time.perf_counter()
    policy = load_policy(str(checkpoint or DEFAULT_CHECKPOINT))
    start = time.perf_counter()  # the budget is for planning; loading the network happens once per process
    evaluator = _Deadline(model, cluster, workload, predictor=evaluator.predictor if evaluator else None)
    scenario = Scenario(model, cluster, workload, evaluator=evaluator)
    timings = {"load_s": start - loading}
    if not scenario.feasible:
        raise no_plan_error(model, cluster, workload, "policy", "no structure of the search space fits in memory")
    static = StaticFeatures(scenario)
    states = [StructureState(scenario) for _ in range(1 + samples)]
    rng = np.random.default_rng(seed)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # batches of a few dozen rows: more threads only spin on a busy machine
    try:
        while not all(s.done for s in states):
            _run_network(policy, states, static, rng)
    finally:
        torch.set_num_threads(threads)
    timings["decode_s"] = time.perf_counter() - start
    start = time.perf_counter()  # the budget below is for completion and refinement
    distinct: dict[tuple, StructureState] = {}
    for s in states:
        distinct.setdefault(s.key(), s)
    greedy = _complete(evaluator, states[0])
    deadline = start + time_budget_s / 3  # a third for completing samples, the rest for refinement
    scored = [(greedy_scored, states[0])] if (greedy_scored := states[0].scored()) is not None else []
    best_estimate = scored[0][0].estimate_s if scored else math.inf
    for s in sorted(distinct.values(), key=StructureState.bound_s):
        if s is states[0] or time.perf_counter() > deadline:
            continue
        found = s.scored(threshold=best_estimate * 1.25)  # the estimate is a model: keep near misses
        if found is not None:
            scored.append((found, s))
            best_estimate = min(best_estimate, found.estimate_s)
    scored.sort(key=lambda pair: pair[0])
    evaluator.deadline = start + time_budget_s
    sampled = evaluator.best([p for sc, _ in scored[:simulate_top] for p in sc.build()], incumbent=greedy)
    timings["sample_s"] = time.perf_counter() - start
    base = _baseline(model, cluster, workload, evaluator) if baseline else None
    timings["baseline_s"] = time.perf_counter() - start - timings["sample_s"]
    refined = None
    if refine and (sampled is not None or base is not None):
        refined = _refine(evaluator, sampled, [s for _, s in scored[:renumber_top]], start + 2 * time_budget_s / 3,
                          refine_steps, simulate_top, base)
    elif base is not None and (sampled is None or base.tokens_per_s > sampled.tokens_per_s):
        refined = base
    timings["total_s"] = time.perf_counter() - start
    return Decoded(greedy, sampled, refined, len(distinct), timings, base)


def _baseline(model, cluster, workload, evaluator: Evaluator) -> Evaluated | None:
    """The ``proportional`` planner's plan priced by ``evaluator`` (None when none of its layouts fits)."""
    from hetpart.errors import WorkloadError
    from hetpart.policies.plan_proportional import plan_proportional

    deadline, evaluator.deadline = evaluator.deadline, math.inf  # a baseline is never cut short
    try:
        return plan_proportional(model, cluster, workload, evaluator=evaluator)
    except WorkloadError:
        return None
    finally:
        evaluator.deadline = deadline


def sample_plans(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, samples: int = 16, seed: int = 0,
                 checkpoint: str | Path | None = None, evaluator: Evaluator | None = None) -> list[Evaluated]:
    """The policy's own proposals: greedy + ``samples`` sampled decodes, each distinct structure completed
    exactly and priced by ``evaluator`` (no refinement; what ``hetpart loop`` runs and learns from)."""
    policy = load_policy(str(checkpoint or DEFAULT_CHECKPOINT))
    evaluator = Evaluator(model, cluster, workload, predictor=evaluator.predictor if evaluator else None)
    scenario = Scenario(model, cluster, workload, evaluator=evaluator)
    if not scenario.feasible:
        raise no_plan_error(model, cluster, workload, "policy", "no structure of the search space fits in memory")
    static = StaticFeatures(scenario)
    states = [StructureState(scenario) for _ in range(1 + samples)]
    rng = np.random.default_rng(seed)
    while not all(s.done for s in states):
        _run_network(policy, states, static, rng)
    distinct: dict[tuple, StructureState] = {}
    for s in states:
        distinct.setdefault(s.key(), s)
    found = [_complete(evaluator, s) for s in distinct.values()]
    return [f for f in found if f is not None]


def _refine(evaluator: Evaluator, sampled: Evaluated | None, states: list[StructureState], deadline: float,
            refine_steps: int, simulate_top: int, base: Evaluated | None = None) -> Evaluated:
    """Re-decide replicas, micro-batch and recompute of the best structures exactly
    (:func:`~hetpart.policies.renumber.renumber`), then hill-climb the winner as ``search`` does, and
    the baseline's plan too when it is given; the faster of the two climbs."""
    from hetpart.policies.refine import refine as hill_climb
    from hetpart.policies.renumber import renumber

    points = sorted(p for s in states for p in renumber(s, deadline))
    best = evaluator.best([plan for p in points[:simulate_top] for plan in p.build()], incumbent=sampled)
    starts = [e for e in (best, base) if e is not None]
    climbed = [hill_climb(evaluator, e, refine_steps) for e in starts]
    return max(climbed, key=lambda e: e.tokens_per_s)


def _complete(evaluator: Evaluator, state: StructureState) -> Evaluated | None:
    scored = state.scored()
    return None if scored is None else evaluator.best(scored.build())


def plan_policy(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: Evaluator | None = None,
                **options: Any) -> Evaluated:
    """The ``policy`` planner (the signature every planner has): the best plan :func:`decode` finds.

    Raises:
        WorkloadError: no structure fits in memory.
    """
    found = decode(model, cluster, workload, evaluator=evaluator, **options).best
    if found is None:
        raise no_plan_error(model, cluster, workload, "policy", "no decoded structure fits in memory")
    return found


OPTIONS = frozenset({"samples", "simulate_top", "refine", "refine_steps", "time_budget_s", "seed", "checkpoint",
                     "renumber_top", "baseline"})


@dataclass(frozen=True)
class PolicyPlanner:
    """The registry's ``policy`` planner (a :class:`~hetpart.policies.common.Planner`)."""

    name: str = "policy"
    options: frozenset = OPTIONS
    description: str = "the trained GNN policy: greedy + best-of-K structures, exact completion, search's refinement"

    def prepare(self, checkpoint: str | Path | None = None) -> None:
        """Load the network once (``plan`` times planning, not reading the checkpoint)."""
        load_policy(str(checkpoint or DEFAULT_CHECKPOINT))

    def plan(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: Evaluator,
             **options: Any) -> Evaluated:
        return plan_policy(model, cluster, workload, evaluator=evaluator, **options)


POLICY = PolicyPlanner()
"""The registry's ``policy`` planner."""
