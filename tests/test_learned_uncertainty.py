"""The learned predictors' uncertainty: a spread per plan (the closed head's variance model), one
device test of what they never saw shared by ``learned`` and ``learned-graph``, and no learned spread
claimed for a plan the simulator priced."""

import math
import random

import numpy as np
import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.learned.closed import ClosedHead, fit_variance
from hetpart.costmodel.learned.coverage import unseen_device_types
from hetpart.costmodel.learned.sampling import random_plan
from hetpart.costmodel.predictor import get_predictor

IB_CLUSTER = {"name": "ib-mix", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-HDR"},
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"}]}
INLINE_GPU = {"name": "Alien-X", "tflops_bf16": 312, "memory_gb": 80, "hbm_gbyte_s": 2039}
"""An A100-80GB's figures under a name no catalog has: only the device test can tell."""


def _setup(spec=IB_CLUSTER):
    return load_model("gpt2-small", seq_len=256), parse_cluster(spec)


def test_the_variance_model_follows_the_error_and_leaves_the_step_alone():
    rng = np.random.default_rng(0)
    examples = []
    for split in ("train", "val", "test"):
        x = rng.normal(size=(400, 3))
        sd = np.where(x[:, 0] > 0, 0.05, 0.005)  # plans with a large first feature are priced worse
        examples.append({"split": split, "x": x, "base": np.zeros(400), "y": rng.normal(size=400) * sd})
    head = ClosedHead({"mean": np.zeros(3), "std": np.ones(3), "layers": np.array(1),
                       "W0": np.zeros((3, 2)), "b0": np.array([0.0, -6.0])})
    before = head(examples[2]["x"])[0]
    report = fit_variance(head, examples)
    mu, log_var = head(np.array([[2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]))
    assert math.exp(0.5 * log_var[0]) > 4 * math.exp(0.5 * log_var[1])
    assert np.array_equal(head(examples[2]["x"])[0], before)
    assert sorted(report) == ["test", "train", "val"]
    assert 0.9 < report["test"]["within_2std"] <= 1.0 and report["test"]["spearman"] > 0.3


def test_two_different_plans_get_different_relative_std():
    model, cluster = _setup()
    pred = get_predictor("learned", model, cluster)
    flat = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=1, dp=16, micro_batch=1)
    piped = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=4, dp=4, micro_batch=1)
    a, b = pred.predict(flat).metrics, pred.predict(piped).metrics
    assert a["priced_by"] == "learned" and b["priced_by"] == "learned"
    assert a["uncertainty"]["out_of_distribution"] is False and b["uncertainty"]["out_of_distribution"] is False
    assert a["uncertainty"]["relative_std"] != b["uncertainty"]["relative_std"]
    rng = random.Random(0)
    plans = [p for p in (random_plan(rng, model, cluster, 64) for _ in range(30)) if p is not None
             and not p.validate(model, cluster) and not p.zero]
    spreads = {round(e.relative_std, 9) for e in pred.estimate_batch(plans)}
    assert len(plans) >= 10 and len(spreads) >= len(plans) // 2


@pytest.mark.parametrize("name", ["learned", "learned-graph"])
def test_an_inline_gpu_is_out_of_distribution_for_both_learned_predictors(name):
    spec = {"name": "inline", "nodes": [
        {"count": 2, "gpus_per_node": 4, "gpu": INLINE_GPU, "intra_node": "NVLink3", "nic": "IB-HDR"}]}
    model, cluster = _setup(spec)
    plan = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=2, dp=4, micro_batch=1)
    pred = get_predictor(name, model, cluster)
    est = pred.estimate_batch([plan])[0]
    assert est.out_of_distribution is True and est.relative_std >= 0.5
    got = pred.predict(plan).metrics["uncertainty"]
    assert got["out_of_distribution"] is True
    assert got["out_of_distribution_reasons"][0] == ("Alien-X: inline device type (not in the catalog the training "
                                                     "data was drawn from)")
    # no measured step of an inline type: the simulator behind the labels has no step band, so neither has this
    assert got["step_time_s_low"] is None and got["step_time_s_high"] is None
    assert "no step-level error band for Alien-X (compute assumed)" in got["band"]


def test_the_device_test_names_inline_and_assumed_types_and_passes_catalog_ones():
    spec = {"name": "four", "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-HDR"},
        {"count": 1, "gpus_per_node": 2, "gpu": "P100-16GB", "intra_node": "PCIe3", "nic": "Ethernet-10"},
        {"count": 1, "gpus_per_node": 2, "gpu": INLINE_GPU, "intra_node": "NVLink3", "nic": "IB-HDR"},
        {"count": 1, "gpus_per_node": 2, "gpu": {**INLINE_GPU, "name": "A100-80GB", "tflops_fp32": 19.5,
                                                         "vendor": "nvidia", "arch": "ampere", "tflops_tf32": 156},
         "intra_node": "NVLink3", "nic": "IB-HDR"}]}
    cluster = parse_cluster(spec)
    got = unseen_device_types(cluster, [d.id for d in cluster.devices])
    assert sorted(got) == ["Alien-X", "P100-16GB"]  # the catalog A100 restated inline is the catalog's
    assert got["P100-16GB"].startswith("compute assumed") and got["Alien-X"].startswith("inline device type")
    assert unseen_device_types(cluster, ["0/0/0", "0/0/1"]) == {}
    assert unseen_device_types(cluster, ["0/0/0"], known=["A100-80GB"]) == {
        "H100-80GB": "device type absent from the training data"}


def test_a_plan_the_simulator_priced_carries_the_simulators_band_not_a_learned_spread():
    model, cluster = _setup()
    pred = get_predictor("learned", model, cluster)
    sharded = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=2, dp=8, micro_batch=1, zero=1)
    got = pred.predict(sharded)
    u = got.metrics["uncertainty"]
    assert got.metrics["priced_by"] == "simulator" and u["source"] == "simulator"
    assert u["relative_std"] is None and u["out_of_distribution"] is False
    # H100 (fitted:hopper, -13.2% to +15.6%) and A100 (fitted:ampere, -4.0% to +4.9%): the wider ends
    assert u["step_time_s_low"] == pytest.approx(got.step_time_s / 1.156, rel=1e-9)
    assert u["step_time_s_high"] == pytest.approx(got.step_time_s / 0.868, rel=1e-9)
    assert pred.estimate_batch([sharded])[0].relative_std == 0.0


def test_a_device_without_a_step_level_band_leaves_the_step_band_open():
    """A per-unit band is not a step's: an assumed-curve device (single units' times -65% to +77%) gives no step
    low/high instead of a 56x range (probe of 2026-11-30: 0.14 s to 7.89 s for a 0.98 s step on an L40S)."""
    from hetpart.costmodel.provenance import ERROR_BANDS, prediction_provenance, step_band

    model, cluster = _setup()
    pred = get_predictor("learned", model, cluster)
    sharded = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=2, dp=8, micro_batch=1, zero=1)
    provenance = prediction_provenance(cluster, sharded, None)
    assert step_band(provenance) == (-13.2, 15.6, [])  # H100 and A100: fitted, step-level rows
    assumed = {"device_types": {**provenance["device_types"],
                                "P100-16GB": {"compute": "assumed", "error_band": dict(ERROR_BANDS["assumed"])}}}
    assert ERROR_BANDS["assumed"]["scope"] == "unit"
    assert step_band(assumed) == (None, None, ["P100-16GB"])
    got = pred.predict(sharded).metrics["uncertainty"]
    assert got["band"].startswith("the simulator's compute error band -13.2% to +15.6%")
