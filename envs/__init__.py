"""Gymnasium environments in which a policy learns to plan.

``hetpart/Partition-v0`` (:class:`~hetpart.envs.partition_env.PartitionEnv`) is registered on import.
"""

import gymnasium as gym

from hetpart.envs.partition_env import PartitionEnv
from hetpart.envs.scenarios import HELD_OUT, ScenarioDistribution, sample_scenario

__all__ = ["PartitionEnv", "ScenarioDistribution", "sample_scenario", "HELD_OUT", "ENV_ID"]

ENV_ID = "hetpart/Partition-v0"
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="hetpart.envs.partition_env:PartitionEnv")
