"""The learned predictors count recomputed FLOPs as the simulator does: under fused attention selective
recomputation re-runs nothing beyond the flash backward, so hardware TFLOPS = model TFLOPS there."""

from dataclasses import replace

import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.predictor import get_predictor

A100 = {"name": "a100s", "nodes": [{"count": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node": "NVLink3",
                                    "nic": "IB-HDR"}]}


@pytest.mark.parametrize("name", ["learned", "learned-graph"])
@pytest.mark.parametrize("recompute, attention", [("selective", "fused"), ("full", "fused"), ("selective", "eager")])
def test_hardware_over_model_flops_matches_the_simulator(name, recompute, attention):
    model, cluster = load_model("gpt2-small", seq_len=512), parse_cluster(A100)
    plan = megatron_plan(model, cluster, Workload(64, 512), tp=1, pp=2, dp=4, micro_batch=2)
    plan = replace(plan, recompute=recompute, attention=attention)
    sim = get_predictor("simulator", model, cluster).predict(plan).metrics
    learned = get_predictor(name, model, cluster).predict(plan).metrics
    ratio = lambda m: m["hardware_tflops_per_device"] / m["model_tflops_per_device"]  # noqa: E731
    assert ratio(learned) == pytest.approx(ratio(sim), rel=1e-9)
    assert (ratio(sim) == pytest.approx(1.0)) == (recompute == "selective" and attention == "fused")
