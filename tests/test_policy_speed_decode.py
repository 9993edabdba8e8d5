"""The policy's decode observes each distinct state once per pass (states of one decode share their first
decisions): the same decodes as observing and masking every state, on small scenarios."""

from __future__ import annotations

import itertools

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.policies import policy_planner
from hetpart.policies.structure import Scenario


@pytest.mark.parametrize("cluster, batch", [("tiny-mixed", 16), ("consumer-mix", 32)])
def test_shared_observations_decode_as_every_state_observed(cluster: str, batch: int, monkeypatch) -> None:
    net = policy_planner.load_policy(str(policy_planner.DEFAULT_CHECKPOINT))
    model, cl = load_model("gpt2-small", seq_len=256), load_cluster(cluster)
    shared = policy_planner._decode_structures(net, Scenario(model, cl, Workload(batch, 256)), 16, 3)
    unique = itertools.count()
    monkeypatch.setattr(policy_planner, "_signature", lambda state: next(unique))  # no two states share
    alone = policy_planner._decode_structures(net, Scenario(model, cl, Workload(batch, 256)), 16, 3)
    assert [s.key() for s in shared] == [s.key() for s in alone]
    assert all(s.done for s in shared) and len({s.key() for s in shared}) >= 1
    assert next(unique) > len(alone)  # the reference observed every state of every pass
