"""NCCL's algorithm x protocol choice for all-reduces (``costmodel/nccl.py``, ``collectives.allreduce_lines``)."""

import math

import pytest

from hetpart import Plan, Replica, Stage, Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel import Simulator, allreduce_time_s, megatron_plan
from hetpart.costmodel.collectives import allreduce_choice, allreduce_lines
from hetpart.costmodel.nccl import BASE_LAT_US, HW_LAT_US, RingShape, nccl_lines
from hetpart.graph.transformer import TransformerConfig, transformer_graph


def _cluster(nodes, gpn=8, gpu="A100-80GB", intra="NVLink3", nic="IB-HDR", nics=8):
    return parse_cluster({"name": "c", "nodes": [{"count": nodes, "gpus_per_node": gpn, "gpu": gpu,
                                                   "intra_node": intra, "nic": nic, "nics_per_node": nics}]})


def _all(c):
    return [d.id for d in c.devices]


def _one_per_node(c):
    return [d.id for d in c.devices if d.local == 0]


def _choice(nbytes, ids, c, concurrent=1):
    return allreduce_choice(nbytes, ids, c, concurrent).name


def test_tree_beats_ring_across_many_nodes_for_small_messages():
    many = _cluster(128)
    for nbytes in (1e3, 1e5, 1e6, 1e7):
        assert _choice(nbytes, _all(many), many).startswith("tree/")
    lines = {line.name: line for line in allreduce_lines(_all(many), many)}
    # the ring's latency grows with its 1,024 members, the tree's with log2 of its 128 nodes
    assert lines["ring/LL"].fixed_s > 10 * lines["tree/LL"].fixed_s
    assert allreduce_time_s(1e6, _all(many), many) == pytest.approx(lines[_choice(1e6, _all(many), many)].time_s(1e6))


def test_ring_wins_large_messages_on_few_nodes():
    two = _cluster(2)
    assert _choice(1e9, _all(two), two) == "ring/Simple"
    assert _choice(1e9, _one_per_node(two), two, 8) == "ring/Simple"
    one = _cluster(1)
    assert _choice(1e9, _all(one), one) == "ring/Simple"
    assert _choice(1e3, _all(one), one) == "ring/LL"  # tiny: the lowest-latency protocol


def test_latency_linear_for_rings_logarithmic_for_trees():
    def fixed(nodes, algorithm):
        return {line.algorithm: line.fixed_s for line in nccl_lines(RingShape(nodes, nodes, 1, 24.0, "nvlink"))
                if line.protocol == "Simple"}[algorithm]

    ring = [fixed(n, "ring") for n in (2, 4, 8, 16, 32)]
    tree = [fixed(n, "tree") for n in (2, 4, 8, 16, 32)]
    steps = [(ring[i + 1] - ring[i]) / (2 * n) for i, n in enumerate((2, 4, 8, 16))]
    assert steps == pytest.approx([HW_LAT_US["net"][("ring", "Simple")] * 1e-6] * 4)  # per added node, 2 steps
    depth = [(tree[i + 1] - tree[i]) for i in range(4)]  # one level more per doubling
    assert depth == pytest.approx([2 * HW_LAT_US["net"][("tree", "Simple")] * 1e-6] * 4)
    assert tree[0] == pytest.approx((BASE_LAT_US[("tree", "Simple")] + 2 * HW_LAT_US["net"][("tree", "Simple")]) * 1e-6)


def test_the_time_rises_with_bytes_and_with_members():
    sizes = [10 ** e for e in range(2, 11)]
    for nodes in (1, 2, 16, 128):
        c = _cluster(nodes)
        times = [allreduce_time_s(b, _all(c), c) for b in sizes]
        assert times == sorted(times) and times[0] > 0
    for nbytes in (1e4, 1e6, 1e8, 1e10):
        by_nodes = []
        for nodes in (2, 4, 8, 32, 128):
            c = _cluster(nodes)
            by_nodes.append(allreduce_time_s(nbytes, _all(c), c))
        assert by_nodes == sorted(by_nodes)


def test_protocols_follow_what_nccl_enables():
    def names(c, ids):
        return {line.name for line in allreduce_lines(ids, c)}

    a100 = _cluster(1)
    assert names(a100, _all(a100)) == {"ring/LL", "ring/LL128", "ring/Simple"}
    # LL128 only on V100 / A100 / H100-class GPUs over NVLink (NCCL's default), never over PCIe
    pcie = _cluster(1, gpu="A6000-48GB", intra="PCIe4")
    assert names(pcie, _all(pcie)) == {"ring/LL", "ring/Simple"}
    consumer = _cluster(1, gpu="RTX3090-24GB", intra="PCIe4")
    assert "ring/LL128" not in names(consumer, _all(consumer))
    # NVLink SHARP on an H100 NVSwitch board: chosen for large buffers of all 8 GPUs
    h100 = _cluster(1, gpu="H100-80GB", intra="NVLink4", nic="IB-NDR")
    assert "nvls/Simple" in names(h100, _all(h100))
    assert _choice(1e9, _all(h100), h100) == "nvls/Simple"
    assert _choice(1e9, _all(h100)[:2], h100) == "ring/Simple"  # two GPUs: the ring moves each byte once
    # across nodes over TCP: no LL128 (NCCL's socket transport), trees and rings
    tcp = _cluster(4, nic="Ethernet-100", nics=1)
    assert names(tcp, _one_per_node(tcp)) == {"ring/LL", "ring/Simple", "tree/LL", "tree/Simple"}


def test_slow_hops_pay_their_own_latency():
    # 20 us per step through host memory, 20 us per TCP hop (the catalog's): a protocol saves no wire time
    host = _cluster(1, gpu="RTX3090-24GB", intra="PCIe4-host")
    ll = {line.name: line for line in allreduce_lines(_all(host), host)}["ring/LL"]
    assert ll.fixed_s == pytest.approx((BASE_LAT_US[("ring", "LL")] + 14 * 20.0) * 1e-6)
    tcp = _cluster(4, nic="Ethernet-100", nics=1)
    ring = {line.name: line for line in allreduce_lines(_one_per_node(tcp), tcp)}["ring/Simple"]
    assert ring.fixed_s == pytest.approx((BASE_LAT_US[("ring", "Simple")] + 6 * tcp.groups[0].nic.latency_us) * 1e-6)


def test_the_hierarchical_all_reduce_is_still_a_candidate_and_shares_the_nics():
    c = _cluster(4, nics=1)
    names = {line.name for line in allreduce_lines(_all(c), c)}
    assert "hierarchical/Simple" in names and "tree/Simple" in names
    alone, shared = allreduce_time_s(1e9, _one_per_node(c), c), allreduce_time_s(1e9, _one_per_node(c), c, 4)
    assert shared == pytest.approx(4 * alone, rel=0.01)  # four rings through one NIC per node


def test_the_breakdown_names_the_chosen_collective():
    cfg = TransformerConfig("gpt2", 4, 256, 4, 1000, 128)
    model = transformer_graph(cfg, "tiny", 128, 2)
    c = _cluster(2, gpn=2, nics=1)
    plan = Plan(global_batch=8, micro_batch=2, seq_len=128, replicas=(
        Replica(0.5, (Stage((0, model.num_units), ("0/0/0",)),)),
        Replica(0.5, (Stage((0, model.num_units), ("0/1/0",)),))))
    pred = Simulator(model, c).simulate(plan)
    # 14 MB of fp32 gradients between two GPUs: a ring of two moves each byte once, under Simple
    assert [b["dp_collective"] for b in pred.breakdown] == ["ring/Simple"] * 2
    assert pred.to_dict()["breakdown"][0]["dp_collective"] == "ring/Simple"  # in the JSON too
    # the same buffer among 256 GPUs on 32 nodes: the tree's log2(32) latency, LL128 on A100 + NVLink + IB
    wide = _cluster(32, gpn=8)
    big = megatron_plan(model, wide, Workload(256, 128, precision="bf16"), 1, 1, 256, 1)
    assert {b["dp_collective"] for b in Simulator(model, wide).simulate(big).breakdown} == {"tree/LL128"}
    single = Plan(global_batch=8, micro_batch=2, seq_len=128, replicas=(
        Replica(1.0, (Stage((0, model.num_units), ("0/0/0",)),)),))
    assert Simulator(model, c).simulate(single).breakdown[0]["dp_collective"] == ""  # nothing to reduce


def test_bucketed_reduction_pays_the_latency_once_per_bucket():
    cfg = TransformerConfig("gpt2", 4, 1024, 16, 1000, 128)
    model = transformer_graph(cfg, "mid", 128, 2)
    wide = _cluster(64, gpn=8)
    plan = megatron_plan(model, wide, Workload(512, 128, precision="bf16"), 1, 1, 512, 1)
    one = Simulator(model, wide, overlap_grad_reduce=False).simulate(plan).breakdown[0]["dp_comm_s"]
    many = Simulator(model, wide, overlap_grad_reduce=False, grad_bucket_params=1e6).simulate(plan).breakdown[0]["dp_comm_s"]
    assert many > one  # each of the many small calls pays NCCL's latency
    params = sum(u.params for u in model.units)
    assert math.ceil(params / 1e6) > 10


def test_reduce_scatter_and_all_gather_take_rings_only():
    from hetpart.costmodel.collectives import reduce_scatter_time_s

    many = _cluster(64)
    lines = allreduce_lines(_all(many), many, collective="reduce_scatter")
    assert {line.name for line in lines} == {"ring/LL", "ring/LL128", "ring/Simple"}  # no tree in NCCL's tuner
    ring = {line.protocol: line for line in allreduce_lines(_all(many), many) if line.algorithm == "ring"}
    for line in lines:  # one trip around the ring: half the all-reduce's bytes; its steps but the base latency
        assert line.per_byte_s == pytest.approx(ring[line.protocol].per_byte_s / 2)
        base = BASE_LAT_US[("ring", line.protocol)] * 1e-6
        assert line.fixed_s - base == pytest.approx((ring[line.protocol].fixed_s - base) / 2)
    # small buffers across 512 GPUs: the ring's 511 steps cost more than half a tree all-reduce
    assert reduce_scatter_time_s(1e5, _all(many), many) > allreduce_time_s(1e5, _all(many), many) / 2
    one = _cluster(1)  # large buffers inside a node: exactly half the ring all-reduce's time, less half its base
    assert reduce_scatter_time_s(1e9, _all(one), one) == pytest.approx(
        allreduce_time_s(1e9, _all(one), one) / 2 + BASE_LAT_US[("ring", "Simple")] * 1e-6 / 2)
