"""The learned cost model: encoding invariances, training, the Predictor protocol, uncertainty and OOD."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.learned.dataset import DatasetConfig, build_dataset
from hetpart.costmodel.learned.encode import ScenarioContext, encode_plans
from hetpart.costmodel.learned.predictor import OOD_RELATIVE_STD, LearnedPredictor
from hetpart.costmodel.learned.sampling import Scenario
from hetpart.costmodel.learned.surrogate import Surrogate, to_tensors
from hetpart.costmodel.learned.train import TrainConfig, _loss, _prepare, input_ranges, load_train_config, \
    save_checkpoint, train
from hetpart.costmodel.predictor import Predictor, get_predictor
from hetpart.errors import SpecError
from hetpart.plan import Plan, Replica, Stage

CLUSTER = {"name": "two-by-two", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
    {"count": 2, "gpus_per_node": 4, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "Ethernet-100"}]}


def _setup():
    return load_model("gpt2-small", seq_len=128), parse_cluster(CLUSTER)


def _random_net(seed: int = 0) -> Surrogate:
    """A surrogate with every weight random (the shipped init zeroes the last layers)."""
    torch.manual_seed(seed)
    net = Surrogate()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return net.eval()


def _plan(ids):
    """Two replicas of two TP-2 stages over the device ids (8 of them), uneven cuts."""
    return Plan(global_batch=16, micro_batch=2, seq_len=128, recompute="selective", replicas=(
        Replica(0.5, (Stage((0, 6), ids[0:2], 2), Stage((6, 14), ids[2:4], 2))),
        Replica(0.5, (Stage((0, 8), ids[4:6], 2), Stage((8, 14), ids[6:8], 2)))))


def _predict(net, model, cluster, plans):
    with torch.no_grad():
        mu, var = net(to_tensors(encode_plans(ScenarioContext(model, cluster), plans)))
    return mu.numpy(), var.numpy()


def test_prediction_invariant_to_permuting_devices_in_a_node_and_nodes_in_a_group():
    model, cluster = _setup()
    net = _random_net()
    base = ("0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "1/1/0", "1/1/1")
    in_node = ("0/0/3", "0/0/2", "0/1/2", "0/1/3", "1/0/2", "1/0/3", "1/1/3", "1/1/2")
    swap_nodes = ("0/1/0", "0/1/1", "0/0/0", "0/0/1", "1/1/0", "1/1/1", "1/0/0", "1/0/1")
    other_pool = ("1/0/0", "1/0/1", "0/1/0", "0/1/1", "1/1/0", "1/1/1", "0/0/0", "0/0/1")
    mu, _ = _predict(net, model, cluster, [_plan(base), _plan(in_node), _plan(swap_nodes), _plan(other_pool)])
    np.testing.assert_allclose(mu[1:3], [mu[0], mu[0]], rtol=1e-6)
    assert abs(mu[3] - mu[0]) > 1e-4  # a V100 stage where an A100 was is a different plan


def test_batch_and_single_predictions_agree_and_invalid_plans_are_left_out():
    model, cluster = _setup()
    net = _random_net(1)
    rng = random.Random(0)
    from hetpart.costmodel.learned.sampling import random_plan

    plans = [p for p in (random_plan(rng, model, cluster, 32) for _ in range(12)) if p is not None]
    together, _ = _predict(net, model, cluster, plans)
    alone = [_predict(net, model, cluster, [p])[0][0] for p in plans]
    np.testing.assert_allclose(together, alone, rtol=1e-5)
    bad = replace(plans[0], replicas=(Replica(1.0, (Stage((0, 14), ("7/0/0",), 1),)),))
    batch = encode_plans(ScenarioContext(model, cluster), [plans[0], bad, plans[1]])
    assert batch.num_plans == 2 and batch.rows == [0, 2] and "7/0/0" in batch.errors[1]


@pytest.fixture(scope="module")
def tiny_records():
    cfg = DatasetConfig(seed=3, scenarios=6, plans_per_scenario=8, max_devices=16, heldout_families=(),
                        heldout_shapes=(), val_share=0.0)
    return build_dataset(cfg)


def test_tiny_training_run_reduces_the_loss(tiny_records, tmp_path):
    # the untrained surrogate composes the analytic leaf terms as the simulator does; labels 25% slower on
    # GPipe plans and 10% faster elsewhere (as measurements might be) leave a residual its corrections learn
    shifted = []
    for r in tiny_records:
        bias = [math.log(1.25) if p.get("schedule") == "gpipe" else math.log(0.9) for p in r["plans"]]
        shifted.append({**r, "log_step_s": [y + b for y, b in zip(r["log_step_s"], bias)]})
    cfg = TrainConfig(out=str(tmp_path / "s.pt"), epochs=6, threads=1, resume=False, lr=0.01)
    data = _prepare(shifted)

    def loss_of(net):
        with torch.no_grad():
            return sum(_loss(net, tb, y, cfg)[1]["mse"] for _, tb, y in data)

    torch.manual_seed(0)
    before = loss_of(Surrogate())
    net, report = train(cfg, shifted)
    assert loss_of(net) < 0.5 * before
    assert report["train"]["plans"] == sum(len(r["plans"]) for r in tiny_records)
    assert (tmp_path / "s.pt").is_file()
    # a split of no record has no figure (it reported 1 plan at 0.00 error and NaN taus), in the stored report too
    empty = [k for k, v in report.items() if v["scenarios"] == 0]
    assert empty and all(report[k] == {"error_pct_mean": None, "error_pct_p90": None, "tau_mean": None,
                                       "tau_std": None, "top1_regret_pct": None, "scenarios": 0, "plans": 0}
                         for k in empty)
    assert torch.load(tmp_path / "s.pt", weights_only=False)["report"] == report


def test_train_config_refuses_unknown_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 3\nlearning_rate: 0.1\n")
    with pytest.raises(SpecError, match=r"bad.yaml: learning_rate: unknown setting; known: dataset"):
        load_train_config(bad)


@pytest.fixture(scope="module")
def checkpoint(tiny_records, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "surrogate.pt"
    save_checkpoint(path, _random_net(2), {"epoch": 1, "input_ranges": input_ranges(tiny_records)})
    return path


def test_learned_predictor_follows_the_protocol(checkpoint):
    model, cluster = _setup()
    pred = get_predictor("learned-graph", model, cluster, checkpoint=checkpoint)
    assert isinstance(pred, Predictor) and isinstance(pred, LearnedPredictor)
    assert pred.name == "learned-graph" and "surrogate.pt" in pred.version
    assert getattr(pred, "lower_bound_s", None) is None  # search must not prune with it
    plan = _plan(("0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "1/1/0", "1/1/1"))
    est = pred.estimate_batch([plan, plan])
    assert len(est) == 2 and est[0].step_time_s == pytest.approx(est[1].step_time_s) and est[0].step_time_s > 0
    m = pred.predict(plan).metrics
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "hardware_tflops_per_device",
                "model_tflops_per_device", "mfu", "bubble_fraction", "peak_memory_gb", "fits_in_memory"):
        assert key in m
    assert m["tokens_per_s"] == pytest.approx(16 * 128 / m["step_time_s"])
    assert set(m["peak_memory_gb"]) == {"A100-40GB", "V100-16GB"}
    assert m["uncertainty"]["relative_std"] > 0


def test_learned_predictor_answers_sharded_plans(checkpoint):
    model, cluster = _setup()
    pred = LearnedPredictor(model, cluster, checkpoint=checkpoint)
    plan = _plan(("0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "1/1/0", "1/1/1"))
    plain, sharded = pred.estimate_batch([plan, replace(plan, zero=3)])
    assert math.isfinite(sharded.step_time_s) and sharded.step_time_s > 0
    assert sharded.memory_headroom_gb > plain.memory_headroom_gb  # the states are sharded


def test_out_of_distribution_input_is_flagged_not_refused(checkpoint, tiny_records):
    model = load_model("gpt2-small", seq_len=128)
    odd = {"name": "odd", "nodes": [{"count": 2, "gpus_per_node": 2, "intra_node": "PCIe4", "nic": "Ethernet-10",
                                     "gpu": {"name": "X", "tflops_bf16": 50000, "memory_gb": 4000, "hbm_gbyte_s": 90000}}]}
    cluster = parse_cluster(odd)
    pred = LearnedPredictor(model, cluster, checkpoint=checkpoint)
    plan = Plan(global_batch=8, micro_batch=1, seq_len=128, replicas=(
        Replica(1.0, (Stage((0, 7), ("0/0/0",), 1), Stage((7, 14), ("0/1/0",), 1))),))
    est = pred.estimate_batch([plan])[0]
    assert est.out_of_distribution and est.relative_std >= OOD_RELATIVE_STD
    assert math.isfinite(est.step_time_s) and est.step_time_s > 0
    seen = tiny_records[0]
    model, cluster = Scenario.rebuild(seen["model_spec"], seen["cluster_spec"])
    usual = LearnedPredictor(model, cluster, checkpoint=checkpoint).estimate_batch(
        [Plan.from_dict(p) for p in seen["plans"]])
    # a scenario it trained on has no feature out of range; its P100 (compute assumed) is flagged as such alone
    assert not any("plan features outside the training range" in e.ood_reasons for e in usual)
    assert {r for e in usual for r in e.ood_reasons} <= {"P100-16GB: compute assumed (the simulator's labels "
                                                         "there: single units' times -65% to +77%)"}


def test_pyg_graph_has_units_pools_stages_and_no_device_nodes():
    from hetpart.costmodel.learned.graph import to_pyg

    model, cluster = _setup()
    ids = ("0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "1/1/0", "1/1/1")
    data = to_pyg(model, cluster, _plan(ids))
    assert data["unit"].x.shape[0] == model.num_units and data["pool"].x.shape[0] == 2
    assert data["stage"].x.shape[0] == 4
    assert data["unit", "runs_on", "stage"].edge_index.shape[1] == 2 * model.num_units
    assert data["stage", "sends_to", "stage"].edge_attr.shape == (2, 3)
    assert data["stage", "syncs_with", "stage"].edge_index.shape[1] == 6  # 0<->2, 1<->2 (units 6-7), 1<->3
    relabelled = to_pyg(model, cluster, _plan(("0/1/3", "0/1/2", "0/0/2", "0/0/3", "1/1/2", "1/1/3", "1/0/3",
                                               "1/0/2")))
    for kind in ("unit", "pool", "stage"):
        torch.testing.assert_close(data[kind].x, relabelled[kind].x)


def test_corrected_model_follows_measurements_near_them_and_the_simulator_far_away():
    from hetpart.costmodel.learned.corrected import CorrectedPredictor, correction_features, fit_correction
    from hetpart.costmodel.simulator import simulate

    model, cluster = _setup()
    ids = ("0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "1/1/0", "1/1/1")
    plan = _plan(ids)
    x = correction_features(simulate(model, cluster, plan), plan)
    rng = np.random.default_rng(0)
    near = [x + rng.normal(0, 0.01, x.shape) for _ in range(20)]  # 20 runs like this one, 40% slower
    correction = fit_correction(near, [math.log(1.4)] * 20)
    c, std, ood = correction.apply(x)
    assert c == pytest.approx(math.log(1.4) * 20 / 21, rel=0.05) and not ood
    far, _, far_ood = correction.apply(x + 3.0)
    assert far == pytest.approx(0.0, abs=1e-6) and far_ood  # the kernel's weight ~0, the linear term faded
    pred = CorrectedPredictor(model, cluster, correction=correction)
    sim = simulate(model, cluster, plan).step_time_s
    got = pred.predict(plan).metrics
    assert got["step_time_s"] == pytest.approx(sim * math.exp(c), rel=1e-6)
    assert got["uncertainty"]["out_of_distribution"] is False


def test_cli_predict_learned_one_plan_and_a_batch_with_a_bad_line(capsys, tmp_path, checkpoint, monkeypatch):
    import json

    from tests._cli import cli_json, run_cli

    monkeypatch.setenv("HETPART_SURROGATE", str(checkpoint))
    small = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128"]
    out = tmp_path / "p.json"
    cli_json(capsys, "plan", *small, "--planner", "uniform", "--out", str(out), "--json")
    one = cli_json(capsys, "predict", *small, "--plan", str(out), "--predictor", "learned-graph", "--json")
    assert one["predictor"] == "learned-graph" and one["metrics"]["step_time_s"] > 0
    assert "out_of_distribution" in one["metrics"]["uncertainty"]
    good = json.loads(out.read_text())
    bad = json.loads(out.read_text())
    bad["replicas"][0]["stages"][0]["devices"] = ["7/0/0"]
    plans = tmp_path / "plans.jsonl"
    plans.write_text("\n".join([json.dumps(good), json.dumps(bad), json.dumps(good)]) + "\n")
    code, stdout, err = run_cli(capsys, "predict", *small, "--plans", str(plans), "--predictor", "learned-graph",
                                "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert len(lines) == 3 and "'7/0/0' does not exist" in lines[1]["error"]
    assert lines[0]["metrics"]["step_time_s"] == pytest.approx(one["metrics"]["step_time_s"], rel=1e-6)
    assert lines[2] == lines[0] | {"line": 3}


def test_shipped_checkpoint_loads_and_agrees_with_the_simulator_on_a_small_plan(monkeypatch):
    from hetpart import load_cluster
    from hetpart.costmodel.learned.predictor import default_checkpoint
    from hetpart.costmodel.simulator import simulate

    monkeypatch.delenv("HETPART_SURROGATE", raising=False)
    assert default_checkpoint().is_file() and default_checkpoint().stat().st_size < 5e6
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-v100-16")
    ids = tuple(f"0/0/{i}" for i in range(4)) + tuple(f"1/0/{i}" for i in range(4))
    plan = Plan(global_batch=32, micro_batch=2, seq_len=1024, recompute="selective", replicas=(
        Replica(0.5, (Stage((0, 14), ids[0:2], 2), Stage((14, 26), ids[4:6], 2))),
        Replica(0.5, (Stage((0, 14), ids[2:4], 2), Stage((14, 26), ids[6:8], 2)))))
    got = get_predictor("learned-graph", model, cluster).predict(plan).metrics["step_time_s"]
    assert got == pytest.approx(simulate(model, cluster, plan).step_time_s, rel=0.15)


def test_costmodel_cli_dataset_train_evaluate(capsys, tmp_path):
    from tests._cli import cli_json, run_cli

    data = tmp_path / "d.pt"
    built = cli_json(capsys, "costmodel", "dataset", "--out", str(data), "--scenarios", "3", "--plans-per-scenario",
                     "6", "--max-devices", "8", "--seed", "1", "--planners", "uniform", "--json")
    assert built["scenarios"] >= 1 and built["plans"] >= 4 and data.is_file()
    config = tmp_path / "train.yaml"
    config.write_text(f"dataset: {data}\nout: {tmp_path / 's.pt'}\nepochs: 1\nthreads: 1\n")
    trained = cli_json(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null", "--json")
    assert trained["report"]["train"]["plans"] + trained["report"]["val"]["plans"] >= 0
    scored = cli_json(capsys, "costmodel", "evaluate", "--dataset", str(data), "--checkpoint", str(tmp_path / "s.pt"),
                      "--json")
    assert set(scored["report"]) == {"train", "val", "test"}
    code, _, err = run_cli(capsys, "costmodel", "evaluate", "--dataset", str(tmp_path / "none.pt"), "--checkpoint",
                           str(tmp_path / "s.pt"))
    assert code == 2 and "no such data set" in err
