"""``hetpart/Partition-v0``: build a plan's structure one decision at a time.

Each episode is one planning problem (drawn from a :class:`~hetpart.envs.scenarios.ScenarioDistribution`
or fixed by the caller). The decisions are those of :class:`hetpart.policies.structure.StructureState`
(family; pipeline pools by pointer, tensor-parallel degrees, replicas, micro-batch, recompute; or
per-pool typed replicas); :meth:`PartitionEnv.action_masks` gives the hard masks. The episode ends
when the structure is complete: the exact layer split and batch shares fill in the numbers and the
reward is the plan's throughput over the scenario's ceiling (``normalise``): a number in (0, 1]
comparable across scenarios. Intermediate steps give 0.

An action the mask rules out is never penalised: it is replaced by the first allowed action (SB3's
``check_env`` sends unmasked random actions; a masked policy never does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import gymnasium as gym
import numpy as np

from hetpart.policies.observation import StaticFeatures, observation_space, observe
from hetpart.envs.scenarios import ScenarioDistribution, sample_scenario
from hetpart.errors import SpecError, WorkloadError
from hetpart.policies.structure import NUM_ACTIONS, Scenario, StructureState

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["PartitionEnv", "Normalise", "ceiling_tokens_per_s"]

Normalise = Literal["roofline", "memory_lifted"]


def ceiling_tokens_per_s(model, cluster, workload, normalise: str) -> float:
    """The per-scenario ceiling a reward divides by: the compute roofline (every device at its best
    matrix efficiency) or the memory-lifted upper bound (search per device type, memory lifted)."""
    if normalise == "roofline":
        from hetpart.costmodel.roofline import roofline_tokens_per_s

        return roofline_tokens_per_s(model, cluster, workload.precision)
    if normalise == "memory_lifted":
        from hetpart.policies.upper_bound import upper_bound

        return upper_bound(model, cluster, workload)["memory_lifted_tokens_per_s"]
    raise SpecError(f"normalise: unknown ceiling {normalise!r}; use roofline or memory_lifted")


def _checked_scenario(scenario: Any) -> "tuple[ModelGraph, Cluster, Workload] | None":
    """A fixed scenario of the three built objects, refused here (not at ``reset()``) when it is anything else."""
    if scenario is None:
        return None
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

    kinds = (ModelGraph, Cluster, Workload)
    if isinstance(scenario, (tuple, list)) and len(scenario) == 3 and all(map(isinstance, scenario, kinds)):
        return tuple(scenario)
    got = repr(scenario) if len(repr(scenario)) <= 120 else f"a {type(scenario).__name__}"
    raise SpecError(f"scenario: expected (ModelGraph, Cluster, Workload), got {got}; build them with "
                    "hetpart.load_model(NAME, seq_len=...), hetpart.load_cluster(NAME_OR_YAML) and "
                    "hetpart.workload.Workload(global_batch, seq_len), or pass scenario=None to draw scenarios")


class PartitionEnv(gym.Env):
    """The planning MDP as a gymnasium environment.

    Args:
        scenario: a fixed ``(model, cluster, workload)``; None draws one per episode from ``distribution``.
        distribution: what to draw (default: the training distribution, which holds out
            :data:`hetpart.envs.scenarios.HELD_OUT`).
        reward: the predictor (registry name, :mod:`hetpart.costmodel.predictor`) that prices the
            finished plan: ``simulator`` (the analytical simulator) or ``learned`` (the learned cost
            model, once registered).
        normalise: the ceiling the throughput is divided by (:func:`ceiling_tokens_per_s`).
        reward_options: options of the reward's predictor factory (``corrected``: its ``correction``).
    """

    metadata = {"render_modes": []}

    def __init__(self, scenario: "tuple[ModelGraph, Cluster, Workload] | None" = None,
                 distribution: ScenarioDistribution | None = None, reward: str = "simulator",
                 normalise: Normalise = "roofline", reward_options: dict[str, Any] | None = None) -> None:
        from hetpart.costmodel.predictor import available_predictors

        if reward not in available_predictors():
            raise SpecError(f"reward: unknown predictor {reward!r}; use one of {', '.join(available_predictors())}")
        if normalise not in ("roofline", "memory_lifted"):
            raise SpecError(f"normalise: unknown ceiling {normalise!r}; use roofline or memory_lifted")
        self.fixed = _checked_scenario(scenario)
        self.distribution = distribution or ScenarioDistribution()
        self.reward_kind, self.normalise = reward, normalise
        self.reward_options = dict(reward_options or {})
        self.observation_space = observation_space()
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self._fixed_built: tuple | None = None
        self._completed: dict[tuple, float] = {}
        """Fixed scenario: throughput per finished structure (the same structure always completes the same)."""
        self.state: StructureState | None = None

    # ----------------------------------------------------------------------------------------- episode
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        scenario, static, ceiling = self._scenario()
        self.state, self.static, self.ceiling = StructureState(scenario), static, ceiling
        return observe(self.state, static), {}

    def _scenario(self) -> tuple[Scenario, StaticFeatures, float]:
        if self.fixed is not None:
            if self._fixed_built is None:
                scenario = Scenario(*self.fixed, evaluator=self._evaluator(*self.fixed))
                if not scenario.feasible:
                    raise WorkloadError(f"{scenario.model.name} on {scenario.cluster.name}: no structure of the "
                                        "search space fits in memory; the environment has nothing to learn")
                self._fixed_built = (scenario, StaticFeatures(scenario),
                                     ceiling_tokens_per_s(*self.fixed, self.normalise))
            scenario, static, ceiling = self._fixed_built
            scenario.evaluator.simulations = 0
            return scenario, static, ceiling
        for _ in range(100):
            model, cluster, workload = sample_scenario(self.np_random, self.distribution)
            scenario = Scenario(model, cluster, workload, evaluator=self._evaluator(model, cluster, workload))
            if scenario.feasible:
                return scenario, StaticFeatures(scenario), ceiling_tokens_per_s(model, cluster, workload,
                                                                                self.normalise)
        raise WorkloadError("environment: 100 scenarios drawn in a row had no fitting plan; widen the distribution "
                            "(more devices, larger memory, smaller models)")

    def step(self, action):
        if self.state is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        mask = self.state.action_mask()
        action = int(action)
        if not (0 <= action < NUM_ACTIONS and mask[action]):
            action = int(np.flatnonzero(mask)[0])
        self.state.step(action, mask)
        reward, info = 0.0, {}
        if self.state.done:
            tokens_per_s = self._tokens_per_s()
            reward = tokens_per_s / self.ceiling
            info = {"tokens_per_s": tokens_per_s, "ceiling_tokens_per_s": self.ceiling, "structure": self.state.key()}
        return observe(self.state, self.static), float(reward), self.state.done, False, info

    def _tokens_per_s(self) -> float:
        key = self.state.key()
        if self.fixed is not None and key in self._completed:
            return self._completed[key]
        found = self.state.complete()
        value = 0.0 if found is None else float(found.tokens_per_s)
        if self.fixed is not None:
            self._completed[key] = value
        return value

    def _evaluator(self, model, cluster, workload):
        from hetpart.costmodel.evaluator import Evaluator
        from hetpart.costmodel.predictor import get_predictor

        return Evaluator(model, cluster, workload, predictor=get_predictor(self.reward_kind, model, cluster, workload,
                                                                    **self.reward_options))

    def action_masks(self) -> np.ndarray:
        """``[NUM_ACTIONS]`` booleans for sb3-contrib's MaskablePPO (all False once the episode is over)."""
        if self.state is None or self.state.done:
            return np.zeros(NUM_ACTIONS, dtype=bool) | (np.arange(NUM_ACTIONS) == 0)
        return self.state.action_mask()
