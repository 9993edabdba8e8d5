"""The planning environment and its masks: checkers, determinism, masks against the exact split."""

import copy
import math
import warnings

import numpy as np
import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.policies.partition import split_layers
from hetpart.envs import ENV_ID, PartitionEnv, ScenarioDistribution, sample_scenario
from hetpart.policies.structure import NUM_ACTIONS, Scenario, StructureState, greedy_fits

SMALL = ScenarioDistribution(max_devices=16, max_layers=8, catalog_models=("gpt2-small",))


def _tiny():
    return load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"), Workload(16, 256)


def test_env_passes_gymnasium_and_sb3_checkers_without_warnings():
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(ENV_ID, distribution=SMALL).unwrapped)
        sb3_check_env(PartitionEnv(distribution=SMALL), warn=True)
        sb3_check_env(PartitionEnv(scenario=_tiny()), warn=True)


def _rollout(seed: int, episodes: int = 3):
    env = PartitionEnv(distribution=SMALL)
    rng = np.random.default_rng(seed)
    out = []
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        done = False
        while not done:
            action = int(rng.choice(np.flatnonzero(env.action_masks())))
            obs, reward, done, _, info = env.step(action)
            out.append((action, reward, {k: v.copy() for k, v in obs.items()}))
        obs, _ = env.reset()
    return out


def test_identically_seeded_rollouts_are_equal():
    a, b = _rollout(3), _rollout(3)
    assert len(a) == len(b)
    for (xa, ra, oa), (xb, rb, ob) in zip(a, b):
        assert xa == xb and ra == rb
        for k in oa:
            np.testing.assert_array_equal(oa[k], ob[k])


def test_unmasked_action_is_replaced_not_penalised():
    env = PartitionEnv(scenario=_tiny())
    env.reset(seed=0)
    masked = int(np.flatnonzero(~env.action_masks())[0])
    env.step(masked)  # what SB3's check_env does: must not crash
    assert env.state.phase != "family"


def _leaves(state):
    if state.done:
        yield state
        return
    for action in np.flatnonzero(state.action_mask()):
        nxt = copy.copy(state)
        nxt.typed = list(state.typed)
        nxt.step(int(action))
        yield from _leaves(nxt)


def test_every_masked_path_ends_in_a_structure_that_fits():
    # Hard masks: no dead end, and every finished structure has a layer split that fits.
    scenario = Scenario(*_tiny())
    leaves = list(_leaves(StructureState(scenario)))
    assert len(leaves) > 50
    for leaf in leaves:
        assert leaf.scored() is not None, leaf.key()


@pytest.mark.parametrize("seed", range(6))
def test_random_scenarios_never_dead_end(seed):
    rng = np.random.default_rng(seed)
    scenario = Scenario(*sample_scenario(rng, ScenarioDistribution(max_devices=64)))
    if not scenario.feasible:
        pytest.skip("drawn scenario has no fitting plan")
    for _ in range(5):
        state = StructureState(scenario)
        while not state.done:
            allowed = np.flatnonzero(state.action_mask())
            assert len(allowed), (state.phase, state.key())
            state.step(int(rng.choice(allowed)))
        assert state.scored() is not None


@pytest.mark.parametrize("seed", range(20))
def test_greedy_memory_check_agrees_with_the_exact_split(seed):
    rng = np.random.default_rng(seed)
    scenario = Scenario(*_tiny())
    pool = scenario.pools[int(rng.integers(len(scenario.pools)))]
    mb = int(rng.choice([1, 4, 16]))
    costs = [scenario.ctx.table.get(pool, 1, mb, str(rng.choice(["none", "full"])))] * int(rng.integers(1, 4))
    m = int(rng.integers(1, 8))
    exact = split_layers([c.masked(min(len(costs) - j, m)) for j, c in enumerate(costs)], m)
    assert greedy_fits(costs, m) == (exact is not None)


def test_mask_rejects_unknown_action():
    state = StructureState(Scenario(*_tiny()))
    with pytest.raises(ValueError, match="not allowed in phase family"):
        state.step(NUM_ACTIONS + 3)


def test_reward_is_throughput_over_roofline():
    env = PartitionEnv(scenario=_tiny())
    env.reset(seed=0)
    done, reward, info = False, 0.0, {}
    while not done:
        _, reward, done, _, info = env.step(int(np.flatnonzero(env.action_masks())[0]))
    assert 0 < reward <= 1
    assert math.isclose(reward, info["tokens_per_s"] / info["ceiling_tokens_per_s"])


def test_bad_reward_name_is_refused():
    from hetpart.errors import SpecError

    with pytest.raises(SpecError, match="reward: unknown predictor 'oracle'"):
        PartitionEnv(reward="oracle")


def test_reward_from_the_learned_cost_model_through_the_predictor_registry():
    env = PartitionEnv(scenario=_tiny(), reward="learned")
    env.reset(seed=0)
    done, reward, info = False, 0.0, {}
    while not done:
        _, reward, done, _, info = env.step(int(np.flatnonzero(env.action_masks())[0]))
    assert reward > 0 and info["tokens_per_s"] > 0
