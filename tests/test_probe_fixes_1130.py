"""Fixes of the 2026-11-30 planner probe: errors that name what really fails."""

from __future__ import annotations

import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.errors import WorkloadError
from hetpart.policies import plan
from hetpart.policies.common import no_plan_error


def test_uniform_says_no_grid_covers_the_devices_not_that_memory_binds() -> None:
    # 17 one-GPU nodes: pp 17 is more than gpt2-small's 14 units, and dp 17 does not divide 18 sequences (no more
    # devices than sequences: fewer nodes are not tried)
    cluster = parse_cluster({"name": "seventeen", "nodes": [
        {"count": 17, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"}]})
    model = load_model("gpt2-small", seq_len=512)
    with pytest.raises(WorkloadError) as err:
        plan(model, cluster, Workload(18, 512), "uniform")
    text = str(err.value)
    assert "no tp x pp x dp grid covers its 17 devices" in text and "14 units" in text
    assert "memory" not in text and "\n" not in text
    assert plan(model, cluster, Workload(18, 512), "search").prediction.fits_in_memory


def test_memory_advice_does_not_offer_the_recompute_already_chosen() -> None:
    cluster = parse_cluster({"name": "one", "nodes": [
        {"count": 1, "gpus_per_node": 1, "gpu": "T4-16GB", "intra_node": "PCIe3", "nic": "Ethernet-10"}]})
    model = load_model("gpt2-small", seq_len=512)
    auto = str(no_plan_error(model, cluster, Workload(16, 512), "uniform", "x"))
    none = str(no_plan_error(model, cluster, Workload(16, 512, recompute="none"), "uniform", "x"))
    assert "--recompute" not in auto
    assert "--recompute full (or auto)" in none


def test_the_bound_keeps_the_time_limit_and_says_when_cut_short() -> None:
    from hetpart import load_cluster
    from hetpart.policies.upper_bound import upper_bound

    model, cluster, workload = load_model("gpt2-small", seq_len=512), load_cluster("tiny-mixed"), Workload(16, 512)
    whole = upper_bound(model, cluster, workload)
    cut = upper_bound(model, cluster, workload, time_limit_s=1e-9)
    assert whole["complete"] is True and all(t["complete"] for t in whole["per_type"].values())
    assert cut["complete"] is False and not any(t["complete"] for t in cut["per_type"].values())
    assert 0 < cut["tokens_per_s"] <= whole["tokens_per_s"] * (1 + 1e-9)
