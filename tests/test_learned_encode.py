"""The vectorised plan encoder against the first (plan-at-a-time) encoder, and the surrogate's fast
paths (deduplicated transfers, wavefront pipeline passes, the numpy ring scan) against its plain ones."""

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.learned import surrogate as surrogate_module
from hetpart.costmodel.learned.encode import ScenarioContext, encode_plans, teacher_labels
from hetpart.costmodel.learned.encode_reference import encode_plans_reference
from hetpart.costmodel.memory import state_bytes_per_param
from hetpart.costmodel.learned.sampling import neighbour, random_plan, random_scenario
from hetpart.costmodel.learned.surrogate import Surrogate, to_tensors
from hetpart.costmodel.memory import PrefixTables
from hetpart.plan import Replica, Stage

OLD_FIELDS = ("unit_x", "unit_base", "stage_cfg", "stage_a", "stage_z", "rep_stages", "rep_plan", "rep_m", "rep_v",
              "rep_gpipe", "p2p_x", "p2p_base", "opt_base", "seg_x", "seg_base", "seg_plan", "hold_seg", "hold_rep",
              "hold_k", "hold_first", "hold_hi", "hold_lo", "hold_cfg", "hold_group", "seg_groups", "num_groups",
              "plan_x", "plan_tokens", "memory_gb", "fits", "errors", "rows", "num_plans")


def _assert_same(new, old):
    for name in OLD_FIELDS:
        a, b = getattr(new, name), getattr(old, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert a == b, name


def _plans(rng, sc, n):
    plans = [p for p in (random_plan(rng, sc.model, sc.cluster, sc.global_batch, 8) for _ in range(n)) if p]
    plans += [q for q in (neighbour(rng, p, sc.model.num_units) for p in plans[:4]) if q is not None]
    return plans


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_encoder_gives_the_reference_arrays_on_random_plans(seed):
    rng = random.Random(seed)
    for _ in range(3):
        sc = random_scenario(rng, max_devices=48)
        plans = _plans(rng, sc, 12)
        new = encode_plans(ScenarioContext(sc.model, sc.cluster), plans, physics=False)
        _assert_same(new, encode_plans_reference(ScenarioContext(sc.model, sc.cluster), plans))
        # the headroom the predictor used to compute from the plan's devices
        from hetpart.costmodel.memory import memory_capacity_gb
        for row, i in enumerate(new.rows):
            caps = {}
            for d in plans[i].devices:
                gpu = sc.cluster.device(d).gpu
                caps[gpu.name] = min(caps.get(gpu.name, np.inf), memory_capacity_gb(gpu))
            assert new.headroom_gb[row] == min(caps[k] - v for k, v in new.memory_gb[row].items())


MIXED_NODE = {"name": "ws", "nodes": [{"count": 2, "gpus": [{"gpu": "RTX4090-24GB", "count": 2},
                                                            {"gpu": "RTX3090-24GB", "count": 2}],
                                      "intra_node": "PCIe4", "nic": "Ethernet-10"}], "slow": {"0/1/2": 0.5}}


def test_vectorised_encoder_gives_the_reference_arrays_on_mixed_card_nodes():
    model, cluster = load_model("gpt2-small", seq_len=128), parse_cluster(MIXED_NODE)
    rng = random.Random(9)
    plans = [p for p in (random_plan(rng, model, cluster, 32, 4) for _ in range(30)) if p]
    assert plans
    _assert_same(encode_plans(ScenarioContext(model, cluster), plans, physics=False),
                 encode_plans_reference(ScenarioContext(model, cluster), plans))


TWO_ZONES = {"name": "two-zones-no-link", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
    {"count": 2, "gpus_per_node": 4, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-100", "zone": "b"}]}


def test_plans_the_encoder_cannot_price_are_left_out_with_the_reference_messages():
    model = load_model("gpt2-small", seq_len=128)  # tied embeddings: the tied-copy segments too
    cluster = parse_cluster(TWO_ZONES)
    rng = random.Random(5)
    plans = [p for p in (random_plan(rng, model, cluster, 32, 4) for _ in range(40)) if p][:12]
    unknown = replace(plans[0], replicas=(Replica(1.0, (Stage((0, 14), ("7/0/0",), 1),)),))
    starved = replace(plans[1], global_batch=1, micro_batch=4)
    batch = [plans[0], unknown, *plans[1:6], starved, *plans[6:]]
    new = encode_plans(ScenarioContext(model, cluster), batch, physics=False)
    old = encode_plans_reference(ScenarioContext(model, cluster), batch)
    assert set(new.errors) == set(old.errors) and {1, 7} <= set(new.errors)
    assert any("zones without a link" in m for m in new.errors.values())
    assert new.errors == old.errors and new.rows == old.rows
    ok = [p for i, p in enumerate(batch) if i not in new.errors]
    _assert_same(encode_plans(ScenarioContext(model, cluster), ok, physics=False), encode_plans_reference(ScenarioContext(model, cluster), ok))


def test_teacher_labels_keep_the_reference_members():
    rng = random.Random(7)
    sc = random_scenario(rng, max_devices=32)
    plans = [p for p in _plans(rng, sc, 10) if not p.validate(sc.model, sc.cluster)]
    batch = teacher_labels(ScenarioContext(sc.model, sc.cluster), plans)
    assert batch.unit_label.shape == batch.unit_base.shape[:2] + (2,)
    assert batch.seg_label.shape == (batch.seg_x.shape[0],) and (batch.seg_label > 0).all()
    assert len(batch.seg_members) == batch.seg_x.shape[0]


def test_prefix_tables_many_equal_one_at_a_time():
    model = load_model("gpt2-small", seq_len=128)
    t = PrefixTables(model)
    rng = np.random.default_rng(0)
    n = model.num_units
    a = rng.integers(0, n, 300)
    z = np.minimum(a + rng.integers(1, n, 300), n)
    tp = rng.choice([1, 2, 4, 8], 300)
    mb = rng.choice([1, 2, 4], 300)
    flight = rng.choice([1.0, 2.5, 4.0], 300)
    rc = rng.integers(0, 3, 300)
    modes = ("none", "selective", "full")
    many = t.memory_gb_many(a, z, tp, mb, flight, rc, state_bytes=state_bytes_per_param("adam", "bf16"))
    one = [t.memory_gb(int(x), int(y), int(k), int(m), float(f), modes[r], precision="bf16") for x, y, k, m, f, r in
           zip(a, z, tp, mb, flight, rc)]
    assert many.tolist() == one
    assert t.params_per_device_many(a, z, tp).tolist() == [t.params_per_device(int(x), int(y), int(k))
                                                           for x, y, k in zip(a, z, tp)]


def test_surrogate_fast_paths_agree_with_the_plain_ones(monkeypatch):
    from hetpart.experiments.bench_costmodel import _cluster

    model, cluster = load_model("gpt2-small", seq_len=128), _cluster(32)
    rng = random.Random(3)
    plans = [p for p in (random_plan(rng, model, cluster, 128) for _ in range(30)) if p]
    tb = to_tensors(encode_plans(ScenarioContext(model, cluster), plans))
    torch.manual_seed(0)
    net = Surrogate()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    monkeypatch.setattr(surrogate_module, "_WAVEFRONT_MIN_STAGE_ROWS", 1)  # wavefront pipeline passes on
    with torch.no_grad():
        fast = net.details(tb)
    with torch.enable_grad():
        scan = net.details(tb)  # the torch ring scan
    plain = dict(tb)
    plain.pop("p2p_uid")
    monkeypatch.setattr(surrogate_module, "_WAVEFRONT_MIN_STAGE_ROWS", 10 ** 9)
    surrogate_module._WAVE_CACHE.clear()
    with torch.no_grad():
        slow = net.details(surrogate_module.TensorBatch(plain))
    for k in fast:
        torch.testing.assert_close(fast[k], scan[k].detach(), rtol=0, atol=0)
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-5, atol=1e-6)


def test_dataset_is_the_same_for_any_number_of_workers():
    from hetpart.costmodel.learned.dataset import DatasetConfig, build_dataset

    cfg = DatasetConfig(seed=4, scenarios=3, plans_per_scenario=5, max_devices=16)
    one, two = build_dataset(cfg), build_dataset(cfg, workers=2)
    assert [r["plans"] for r in one] == [r["plans"] for r in two] and one
    assert [r["log_step_s"] for r in one] == [r["log_step_s"] for r in two]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a["batch"].unit_label, b["batch"].unit_label)
        np.testing.assert_array_equal(a["batch"].seg_x, b["batch"].seg_x)


def test_training_device_choice():
    from hetpart.costmodel.learned.train import resolve_device
    from hetpart.errors import SpecError

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(SpecError, match="use auto, cuda or cpu"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="no CUDA device"):
            resolve_device("cuda")


def test_a_precision_the_learned_predictor_cannot_price_is_one_plans_error():
    from hetpart.costmodel.learned.predictor import LearnedPredictor

    model, cluster = load_model("gpt2-small", seq_len=128), parse_cluster(TWO_ZONES)
    rng = random.Random(11)
    plans = [p for p in (random_plan(rng, model, cluster, 32, 4) for _ in range(40)) if p and
             not p.validate(model, cluster)][:3]
    odd = replace(plans[1], precision="fp6")
    pred = LearnedPredictor(model, cluster)
    out = pred.estimate_many([plans[0], odd, plans[2]])
    assert isinstance(out[1], str) and "fp6" in out[1]
    assert not isinstance(out[0], str) and not isinstance(out[2], str) and out[0].step_time_s > 0


def test_out_of_distribution_flags_from_distinct_rows_equal_the_full_check(tmp_path):
    """The predictor checks each distinct transfer and configuration once; the flags are those of
    checking every padded row."""
    from hetpart.costmodel.learned.predictor import LearnedPredictor
    from hetpart.costmodel.learned.train import save_checkpoint
    from hetpart.experiments.bench_costmodel import _cluster

    model, cluster = load_model("gpt2-small", seq_len=128), _cluster(32)
    rng = random.Random(12)
    plans = [p for p in (random_plan(rng, model, cluster, 128) for _ in range(30)) if p]
    batch = encode_plans(ScenarioContext(model, cluster), plans)
    ranges = {}
    for key in ("unit_x", "p2p_x", "seg_x", "plan_x"):  # narrow ranges: some rows fall outside
        x = getattr(batch, key).reshape(-1, getattr(batch, key).shape[-1])
        lo, hi = np.quantile(x, 0.2, axis=0), np.quantile(x, 0.8, axis=0)
        ranges[key] = [np.minimum(lo, 0).tolist(), np.maximum(hi, 0).tolist()]
    path = tmp_path / "s.pt"
    save_checkpoint(path, Surrogate(), {"epoch": 1, "input_ranges": ranges})
    pred = LearnedPredictor(model, cluster, checkpoint=path)
    fast = pred._ood(batch)
    full = replace(batch, p2p_uid=None, configs=None)
    np.testing.assert_array_equal(fast, pred._ood(full))
    assert fast.any()
