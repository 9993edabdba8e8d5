"""The learned-graph predictor's all-reduce leaves share the zone links as the simulator shares them: sixteen
pipelines H100 (east) -> A100 (west) each sum their tied embedding over the 100 Gbit/s zone link, all at once
(Megatron's pairs). Its rings were priced with the NICs' sharing only, every pair taking the whole link: 0.617 s
against the simulator's 1.137 s."""

from __future__ import annotations

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.costmodel.predictor import get_predictor
from hetpart.costmodel.megatron import megatron_plan


def test_learned_graph_shares_the_zone_link_among_the_tied_pairs():
    model, cluster = load_model("gpt3-1.3b", seq_len=1024), load_cluster("h100-a100-two-zones")
    workload = Workload(256, 1024)
    plan = megatron_plan(model, cluster, workload, tp=1, pp=2, dp=16, micro_batch=1)
    simulated = get_predictor("simulator", model, cluster, workload).estimate_batch([plan])[0].step_time_s
    learned = get_predictor("learned-graph", model, cluster, workload).estimate_batch([plan])[0].step_time_s
    assert simulated > 1.0  # sixteen 412 MB pair all-reduces share the 12.5 GB/s link
    assert learned == pytest.approx(simulated, rel=0.01)
