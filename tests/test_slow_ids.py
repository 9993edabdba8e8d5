"""Throttled devices (``slow:``) anywhere in a node group: the views the planners search (the speed-typed view,
each device type alone) renumber devices, and their candidates are priced on the real devices they stand for.

Found by a probe: ``slow: {"0/1/1": 0.5}`` on a group of two nodes made every planner exit 2 with
``device '1/0/1' does not exist in cluster ...``, blaming the user's file: the view's search priced its own ids
with the real cluster's predictor (``1/0/1`` of the view is ``0/1/1`` of the cluster). On one node the ids
existed and named other devices, so the view's candidates were priced at the wrong speeds, silently."""

from __future__ import annotations

import importlib
import json

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.pools import speed_typed, type_view
from hetpart.plan import Plan
from tests._cli import cli_json

ps = importlib.import_module("hetpart.policies.plan_search")  # the package exports the function of that name

PLANNERS = ("search", "uniform", "proportional", "policy")

LATER_NODE = """name: slow-later-node
nodes:
  - {count: 2, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
slow: {"0/1/1": 0.5}
"""

TWO_GROUPS = """name: slow-two-groups
nodes:
  - {count: 2, gpus_per_node: 2, gpu: RTX4090-24GB, intra_node: PCIe4, nic: Ethernet-25}
  - {count: 2, gpus_per_node: 2, gpu: RTX3090-24GB, intra_node: PCIe4, nic: Ethernet-25}
slow: {"1/1/0": 0.6}
"""

MIXED_NODES = """name: slow-mixed-nodes
nodes:
  - count: 2
    gpus: [{gpu: RTX4090-24GB, count: 2}, {gpu: RTX3090-24GB, count: 2}]
    intra_node: PCIe4
    nic: Ethernet-25
slow: {"0/1/3": 0.5}
"""


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("text", [LATER_NODE, TWO_GROUPS, MIXED_NODES], ids=["later-node", "two-groups", "mixed-nodes"])
def test_every_planner_plans_a_slow_device_on_a_later_node(capsys, tmp_path, planner: str, text: str) -> None:
    """The plan (upper bound included: it searches each type's view) names real devices and ``predict --plan``
    prices it on the real cluster as the planner did."""
    cluster_path = _write(tmp_path, text)
    out = tmp_path / "plan.json"
    got = cli_json(capsys, "plan", "--planner", planner, "--model", "gpt2-small", "--cluster", cluster_path,
                   "--global-batch", "16", "--json", "--out", str(out))
    cluster = load_cluster(cluster_path)
    plan = Plan.from_dict(json.loads(out.read_text()))
    assert plan.validate(load_model("gpt2-small"), cluster) == []
    used = {d for r in plan.replicas for s in r.stages for d in s.devices}
    assert used and all(cluster.has_device(d) for d in used)
    again = cli_json(capsys, "predict", "--plan", str(out), "--model", "gpt2-small", "--cluster", cluster_path, "--json")
    assert again["metrics"]["tokens_per_s"] == pytest.approx(got["metrics"]["tokens_per_s"], rel=1e-9)


def test_the_throttled_replica_is_the_device_the_file_named(tmp_path) -> None:
    """Four one-GPU replicas on two nodes, ``0/1/1`` at half speed: the speed-typed view's plan gives the
    smallest batch share to ``0/1/1`` itself, and the view maps each of its devices to a distinct real one."""
    cluster = load_cluster(_write(tmp_path, LATER_NODE))
    typed, to_real = speed_typed(cluster)
    assert sorted(to_real.values()) == sorted(d.id for d in cluster.devices)
    slow_view = [d.id for d in typed.devices if "@0.5x" in d.gpu.name]
    assert [to_real[d] for d in slow_view] == ["0/1/1"]
    model = load_model("gpt2-large")
    workload = Workload(64, model.seq_len)
    evaluate = Evaluator(model, cluster, workload)
    found = ps.speed_typed_best(model, cluster, workload, evaluate,
                                ps._view_search(model, workload, ps.SearchOptions(), speed_types=False, refine_steps=0))
    assert found is not None and found.plan.validate(model, cluster) == []
    # the throttled one runs the fewest blocks' work (batch share x blocks held) of the devices that run blocks:
    # data parallel with the smallest share (57,087 tokens/s under eager operator counts), or since Megatron's
    # counts are the default the first pipeline stage with 6 blocks against 15, 15 and the head (71,710)
    blocks = {i for i, u in enumerate(model.units) if u.kind == "block"}
    work: dict[str, float] = {}
    for r in found.plan.replicas:
        for s in r.stages:
            for d in s.devices:
                work[d] = work.get(d, 0.0) + r.batch_share * len(blocks & set(range(*s.layers))) / s.tp
    running = {d: w for d, w in work.items() if w > 0}
    assert len(work) == 4 and min(running, key=running.get) == "0/1/1", work
    assert evaluate(found.plan).tokens_per_s == pytest.approx(found.tokens_per_s, rel=1e-9)


def _view_prices(view, to_real, cluster, model, workload, evaluator: Evaluator):
    """Each single view device's one-stage plan: (view's price, the same plan's price on the real devices)."""
    real = Evaluator(model, cluster, workload)
    pairs = []
    for device in view.devices:
        plan = _one_device_plan(model, workload, device.id, view.name)
        on_view, on_real = evaluator(plan, split=False), real(ps._on_real(plan, to_real, cluster), split=False)
        pairs.append((device.id, on_view and on_view.tokens_per_s, on_real and on_real.tokens_per_s))
    return pairs


def _one_device_plan(model, workload, device: str, cluster_name: str) -> Plan:
    return Plan.from_dict({
        "global_batch": workload.global_batch, "micro_batch": 1, "seq_len": workload.seq_len,
        "replicas": [{"batch_share": 1.0, "stages": [{"devices": [device], "layers": [0, model.num_units]}]}],
        "meta": {"cluster": cluster_name}})


def test_the_speed_typed_view_prices_its_candidates_on_the_real_devices() -> None:
    """One node of four, ``0/0/0`` at half speed: the view puts it last (``0/0/3`` there). Its search once priced
    the view's ``0/0/3`` as the real ``0/0/3`` (full speed) and the view's ``0/0/0`` as the real throttled one."""
    from hetpart.cluster import parse_cluster

    cluster = parse_cluster({"name": "one-slow", "slow": {"0/0/0": 0.5}, "nodes": [
        {"count": 1, "gpus_per_node": 4, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"}]}, "<test>")
    model = load_model("gpt2-small")
    workload = Workload(8, model.seq_len)
    typed, to_real = speed_typed(cluster)
    seen = []

    def planner(view, evaluator):
        seen.extend(_view_prices(view, to_real, cluster, model, workload, evaluator))
        raise ps.PlanError("only looking")

    assert ps.speed_typed_best(model, cluster, workload, Evaluator(model, cluster, workload), planner) is None
    assert [to_real[d] for d, _, _ in seen] == ["0/0/1", "0/0/2", "0/0/3", "0/0/0"]  # the throttled GPU last
    assert typed.device("0/0/3").gpu.name == "A100-80GB@0.5x"
    for device, on_view, on_real in seen:
        assert on_view == pytest.approx(on_real, rel=1e-9), device


def test_each_type_alone_is_priced_on_its_real_devices(monkeypatch) -> None:
    """The V100s alone are ``0/*/*`` of their view and ``1/*/*`` of the cluster: priced as V100s, not as the
    A100s the cluster calls ``0/0/*`` (and ``0/1/*`` of the view, a V100 of the second node, exists nowhere)."""
    from hetpart.cluster import parse_cluster

    cluster = parse_cluster({"name": "two-types", "slow": {"1/1/1": 0.5}, "nodes": [
        {"count": 1, "gpus_per_node": 2, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
        {"count": 2, "gpus_per_node": 2, "gpu": "V100-32GB", "intra_node": "NVLink2", "nic": "IB-HDR"}]}, "<test>")
    model = load_model("gpt2-small")
    workload = Workload(8, model.seq_len)
    monkeypatch.setattr(ps, "searches_level_one", lambda workload, cluster: False)
    seen = []

    def planner(view, evaluator):
        _, to_real = type_view(cluster, view.devices[0].gpu.name)
        seen.extend(_view_prices(view, to_real, cluster, model, workload, evaluator))
        raise ps.PlanError("only looking")

    ps.single_types_best(model, cluster, workload, Evaluator(model, cluster, workload), None, planner)
    assert len(seen) == 6 and {d for d, _, _ in seen} >= {"0/0/0", "0/1/1"}
    for device, on_view, on_real in seen:
        assert on_view == pytest.approx(on_real, rel=1e-9), device
