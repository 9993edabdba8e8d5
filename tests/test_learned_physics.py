"""The surrogate's composition: with its corrections at zero it composes the analytic leaf terms into the
simulator's step (blocking pipeline sends, NICs shared by concurrent transfers and rings, the exposed last
gradient bucket, all-reduces over TCP that wait for the backward, per-operator host costs, schedules)."""

import random

import numpy as np
import pytest
import torch

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.learned import surrogate as surrogate_module
from hetpart.costmodel.learned.encode import ScenarioContext, encode_plans
from hetpart.costmodel.learned.sampling import random_plan, random_scenario
from hetpart.costmodel.learned.surrogate import Surrogate, _exact_pipelines, to_tensors
from hetpart.costmodel.schedule import pipeline_summary
from hetpart.costmodel.simulator import Simulator

TCP_CLUSTER = {"name": "tcp-mix", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "Ethernet-100"},
    {"count": 2, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "PCIe3", "nic": "Ethernet-25"}]}


def _composed(model, cluster, plans):
    net = Surrogate().eval()  # the last layers start at zero: every correction is x1, the head adds 0
    batch = encode_plans(ScenarioContext(model, cluster), plans)
    with torch.no_grad():
        out = net.details(to_tensors(batch))
    return batch, np.exp(out["log_step_s"].double().numpy())


def _check(model, cluster, plans):
    sim = Simulator(model, cluster)
    batch, got = _composed(model, cluster, plans)
    want = np.array([sim.estimate(plans[i]).step_time_s for i in batch.rows])
    np.testing.assert_allclose(got, want, rtol=2e-4)
    return batch


def test_zero_corrections_compose_the_simulators_step_over_tcp_nics_and_pcie():
    model, cluster = load_model("gpt2-small", seq_len=256), parse_cluster(TCP_CLUSTER)
    rng = random.Random(0)
    plans = [p for p in (random_plan(rng, model, cluster, 64) for _ in range(40)) if p is not None
             and not p.validate(model, cluster)]
    batch = _check(model, cluster, plans)
    assert batch.seg_tcp.any() and (batch.p2p_exact > 0).any()  # the TCP and blocking-send terms were used


@pytest.mark.parametrize("seed", [1, 2])
def test_zero_corrections_compose_the_simulators_step_on_random_scenarios(seed):
    rng = random.Random(seed)
    checked = 0
    for _ in range(2):
        sc = random_scenario(rng, max_devices=48)
        plans = [p for p in (random_plan(rng, sc.model, sc.cluster, sc.global_batch, 8) for _ in range(12))
                 if p is not None and not p.validate(sc.model, sc.cluster)]
        if plans:
            _check(sc.model, sc.cluster, plans)
            checked += len(plans)
    assert checked > 0  # the seed drew scenarios with valid plans: the comparison ran


@pytest.mark.parametrize("wavefront", [1, 10 ** 9])
def test_batched_pipeline_passes_equal_the_schedule(monkeypatch, wavefront):
    monkeypatch.setattr(surrogate_module, "_WAVEFRONT_MIN_STAGE_ROWS", wavefront)
    rng = np.random.default_rng(0)
    shapes = [(1, 6, 1, 0), (2, 5, 1, 0), (4, 8, 1, 0), (3, 4, 1, 1), (4, 4, 2, 2), (6, 6, 3, 2), (4, 3, 1, 0)]
    rows = [shapes[i % len(shapes)] for i in range(20)]
    K = max(k for k, _, _, _ in rows)
    F = rng.uniform(0.1, 2.0, (len(rows), K))
    B = F * rng.uniform(1.5, 3.0, (len(rows), K))
    F[1], B[1] = F[8], B[8]  # equal replicas of one shape run once
    depth, m, v, sched = (np.array(c) for c in zip(*rows))
    ms, last = _exact_pipelines(F, B, depth, m, v, sched)
    for r, (k, mm, vv, sc) in enumerate(rows):
        ref = pipeline_summary(F[r, :k].tolist(), B[r, :k].tolist(), [0.0] * (k - 1),
                               ("1f1b", "gpipe", "interleaved")[sc], mm, vv)
        assert ms[r] == pytest.approx(ref[0], rel=1e-12)
        np.testing.assert_allclose(last[r, :k], ref[1], rtol=1e-12)


@pytest.mark.parametrize("zero,shard_group", [(1, 0), (2, 0), (3, 0), (2, 2), (1, 2)])
def test_sharded_plans_are_composed_with_the_sharded_collective_terms(zero, shard_group):
    from dataclasses import replace

    model, cluster = load_model("gpt2-small", seq_len=256), parse_cluster(TCP_CLUSTER)
    rng = random.Random(5)
    plans = []
    for _ in range(60):
        p = random_plan(rng, model, cluster, 64)
        if p is not None and p.dp >= 2 and p.schedule != "interleaved":
            q = replace(p, zero=zero, shard_group=shard_group if p.dp > shard_group else 0)
            if not q.validate(model, cluster):
                plans.append(q)
    assert len(plans) >= 5
    batch = _check(model, cluster, plans)
    sim = Simulator(model, cluster)
    for row, i in enumerate(batch.rows):  # the sharded states' memory, as the simulator accounts it
        est = sim.estimate(plans[i])
        assert batch.fits[row] == est.fits_in_memory
        assert batch.headroom_gb[row] == pytest.approx(est.memory_headroom_gb, rel=1e-9, abs=1e-9)
    if zero >= 2 and not shard_group:
        assert batch.seg_skip.any()  # reduced inside the backward: no once-per-step ring
