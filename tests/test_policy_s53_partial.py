"""The policy's structures use part of a pool as search's do (8984da6): a mixed pipeline's replica counts are
:func:`~hetpart.policies.plan_search.replica_counts` (the groups left over sit out) and a pool's typed depths
:func:`~hetpart.policies.plan_search.pipeline_depths`. With whole pools only, the policy missed search's plan on
heldout-12-01b's 1,024 GPUs (64 replicas of 7 TP-2 stages on 896 of 960 A100s, 1,621,615 tokens/s against the
policy's 1,501,458: 0.926 of search)."""

from __future__ import annotations

from hetpart import Workload, load_cluster, load_model
from hetpart.policies.plan_search import pipeline_depths, replica_counts
from hetpart.policies.structure import Scenario

CLUSTER = """name: six
nodes:
  - {count: 3, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
"""


def test_replica_counts_and_depths_leave_groups_out(tmp_path) -> None:
    (tmp_path / "six.yaml").write_text(CLUSTER)
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster(str(tmp_path / "six.yaml"))
    scenario = Scenario(model, cluster, Workload(8, 1024))
    assert len(scenario.pools) == 1
    # 6 groups of TP 1, batch 8: whole pools allowed 1 and 2 replicas; 4 replicas of one GPU leave 2 out
    assert scenario.dp_options((0,), (1,)) == replica_counts([6], 8) == [1, 2, 4]
    # 3 groups of TP 2: 1 replica (3 stages) or 2 of one stage (1 group out)
    assert scenario.dp_options((0,), (2,)) == [1, 2]
    # typed depths: every depth the deepest for its replica count (5 groups: 2 replicas of 2, 1 group out)
    assert scenario.pp_options(0, 1) == pipeline_depths(6, model.num_units) == [1, 2, 3, 6]
    assert pipeline_depths(5, model.num_units) == [1, 2, 5]


def test_a_partial_mixed_point_is_priced_on_the_groups_it_takes(tmp_path) -> None:
    (tmp_path / "six.yaml").write_text(CLUSTER)
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster(str(tmp_path / "six.yaml"))
    scenario = Scenario(model, cluster, Workload(8, 1024))
    scored = scenario.mixed_scored((0,), (1,), 4, 1, scenario.modes[0])
    assert scored is not None
    plans = scored.build()
    assert plans and all(p.dp == 4 and p.num_devices == 4 for p in plans)  # two devices sit out
    assert all(not p.validate(model, cluster) for p in plans)
