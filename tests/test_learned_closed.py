"""The closed-form learned surrogate (``--predictor learned``): its own composition of leaf costs
stays near the simulator's step, it is the same under relabelled devices, it defers what it does not
compose to the simulator, and its head trains, saves and loads."""

import dataclasses
import math
import random

import numpy as np
import pytest

from hetpart import Workload, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.learned.closed import (ClosedContext, ClosedHead, ClosedTrainConfig, compose, load_head,
                                              record_examples, save_head, train_closed)
from hetpart.costmodel.learned.sampling import random_plan
from hetpart.costmodel.predictor import get_predictor
from hetpart.costmodel.simulator import Simulator
from hetpart.plan import Plan

TCP_CLUSTER = {"name": "tcp-mix", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "Ethernet-100"},
    {"count": 2, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "PCIe3", "nic": "Ethernet-25"}]}
IB_CLUSTER = {"name": "ib-mix", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-HDR"},
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"}]}


def _scenario(spec, n=40, seed=0):
    model, cluster = load_model("gpt2-small", seq_len=256), parse_cluster(spec)
    rng = random.Random(seed)
    plans = [p for p in (random_plan(rng, model, cluster, 64) for _ in range(n)) if p is not None
             and not p.validate(model, cluster)]
    return model, cluster, plans


@pytest.mark.parametrize("spec", [TCP_CLUSTER, IB_CLUSTER])
def test_the_composition_follows_the_simulator(spec):
    model, cluster, plans = _scenario(spec)
    out = compose(ClosedContext(model, cluster), plans)
    sim = Simulator(model, cluster)
    want = np.array([sim.estimate(plans[i]).step_time_s for i in out.batch.rows])
    err = np.abs(out.step / want - 1)
    assert len(want) >= 20 and np.isfinite(out.features).all()
    assert err.mean() < 0.03 and err.max() < 0.15, (err.mean(), err.max())
    assert (out.dp_end > 0).any() and (out.opt > 0).all()


def test_relabelling_devices_inside_a_node_changes_nothing():
    model, cluster, plans = _scenario(IB_CLUSTER, n=20, seed=3)
    swap = {"0/0/0": "0/0/3", "0/0/3": "0/0/0", "1/1/1": "1/1/2", "1/1/2": "1/1/1"}

    def relabel(plan: Plan) -> Plan:
        reps = [dataclasses.replace(r, stages=[dataclasses.replace(s, devices=tuple(swap.get(d, d) for d in s.devices))
                                               for s in r.stages]) for r in plan.replicas]
        return dataclasses.replace(plan, replicas=reps)

    a = compose(ClosedContext(model, cluster), plans).step
    b = compose(ClosedContext(model, cluster), [relabel(p) for p in plans]).step
    np.testing.assert_allclose(a, b, rtol=1e-9)


def test_the_predictor_answers_batches_and_defers_sharded_plans(tmp_path):
    model, cluster, plans = _scenario(IB_CLUSTER, n=12, seed=1)
    pred = get_predictor("learned", model, cluster)
    est = pred.estimate_batch(plans)
    assert len(est) == len(plans) and all(e.step_time_s > 0 and e.relative_std >= 0 for e in est)
    one = pred.predict(plans[0])
    assert one.step_time_s == pytest.approx(est[0].step_time_s, rel=1e-12)
    assert one.metrics["priced_by"] == "learned" and "uncertainty" in one.metrics
    sharded = megatron_plan(model, cluster, Workload(64, 256), tp=1, pp=2, dp=4, micro_batch=2, zero=2)
    got = pred.predict(sharded)
    assert got.metrics["priced_by"] == "simulator"
    assert got.step_time_s == pytest.approx(Simulator(model, cluster).estimate(sharded).step_time_s, rel=1e-9)


def test_the_head_trains_saves_and_loads(tmp_path):
    records = []
    for split, (spec, seed) in zip(("train", "val", "test"), ((IB_CLUSTER, 0), (TCP_CLUSTER, 1), (IB_CLUSTER, 2))):
        model, cluster, plans = _scenario(spec, n=16, seed=seed)
        sim = Simulator(model, cluster)
        records.append({"name": split, "split": split, "plans": [p.to_dict() for p in plans],
                        "log_step_s": [math.log(sim.estimate(p).step_time_s) for p in plans],
                        "_model": model, "_cluster": cluster})
    examples = []
    for r in records:  # record_examples rebuilds stored specs; these scenarios are built here
        out = compose(ClosedContext(r["_model"], r["_cluster"]), [Plan.from_dict(p) for p in r["plans"]])
        examples.append({"name": r["name"], "split": r["split"], "x": out.features.astype(np.float32),
                         "base": np.log(out.step), "y": np.asarray(r["log_step_s"])[out.batch.rows]})
    head, report = train_closed(examples, ClosedTrainConfig(epochs=3))
    assert set(report) >= {"train", "val", "test", "composition_only"}
    assert report["test"]["plans"] == len(examples[2]["y"]) and report["test"]["error_pct_mean"] < 5
    save_head(head, tmp_path / "h.npz", {"epochs": 3})
    loaded, meta = load_head(tmp_path / "h.npz")
    x = examples[0]["x"]
    np.testing.assert_allclose(loaded(x)[0], head(x)[0])
    assert meta["epochs"] == 3 and ClosedHead()(x)[0].tolist() == [0.0] * len(x)
    assert record_examples([]) == []


def test_the_shipped_head_is_small_and_answers_the_cli_one_plan_and_a_batch(capsys, tmp_path, monkeypatch):
    import json

    from tests._cli import cli_json, run_cli
    from hetpart.costmodel.learned.closed import default_head

    monkeypatch.delenv("HETPART_CLOSED_HEAD", raising=False)
    assert default_head().is_file() and default_head().stat().st_size < 5e6
    small = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128"]
    out = tmp_path / "p.json"
    cli_json(capsys, "plan", *small, "--planner", "uniform", "--out", str(out), "--json")
    one = cli_json(capsys, "predict", *small, "--plan", str(out), "--predictor", "learned", "--json")
    sim = cli_json(capsys, "predict", *small, "--plan", str(out), "--predictor", "simulator", "--json")
    assert one["predictor"] == "learned" and "out_of_distribution" in one["metrics"]["uncertainty"]
    assert one["metrics"]["step_time_s"] == pytest.approx(sim["metrics"]["step_time_s"], rel=0.05)
    good, bad = json.loads(out.read_text()), json.loads(out.read_text())
    bad["replicas"][0]["stages"][0]["devices"] = ["7/0/0"]
    plans = tmp_path / "plans.jsonl"
    plans.write_text("\n".join([json.dumps(good), json.dumps(bad), json.dumps(good)]) + "\n")
    code, stdout, err = run_cli(capsys, "predict", *small, "--plans", str(plans), "--predictor", "learned", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert len(lines) == 3 and "'7/0/0' does not exist" in lines[1]["error"]
    assert lines[0]["metrics"]["step_time_s"] == pytest.approx(one["metrics"]["step_time_s"], rel=1e-9)
