"""Communication as real engines pay it: achieved link rates, blocking pipeline sends, gradient buckets,
flows sharing a node's NICs, rank order of the Megatron grid."""

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.catalog.hardware import LINK_CATALOG, NIC_CATALOG
from hetpart.cluster import cluster_to_dict, parse_cluster
from hetpart.costmodel import Simulator, allreduce_time_s, megatron_plan, ring_allreduce_time_s, simulate
from hetpart.costmodel.collectives import nic_flows
from hetpart.costmodel.links import RDMA_EFFICIENCY, STAGED_DUPLEX_GBYTE_S, TCP_FRAMING_EFFICIENCY, TCP_SOCKET_GBYTE_S, \
    achieved_link, nic_gbyte_s
from hetpart.costmodel.simulator import grad_reduce_bytes
from hetpart.errors import SpecError
from hetpart.workload import Workload

S = 128
STAGED_PCIE4 = STAGED_DUPLEX_GBYTE_S["PCIe4-host"]
"""What a GPU with its own PCIe 4 port stages through host memory each way while receiving (9.24 GB/s: below the
10 GB/s socket link and 150 / 16 GB/s of host memory for 8 GPUs; hetpart.costmodel.links)."""


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S)


def _cluster(nodes=2, gpus=1, gpu="A100-40GB", intra="NVLink3", nic="IB-HDR", nics=1):
    return parse_cluster({"name": "c", "nodes": [{"count": nodes, "gpus_per_node": gpus, "gpu": gpu,
                                                  "intra_node": intra, "nic": nic, "nics_per_node": nics}]})


def test_nics_carry_what_their_transport_reaches():
    assert nic_gbyte_s(NIC_CATALOG["IB-HDR"]) == pytest.approx(25.0 * RDMA_EFFICIENCY) == pytest.approx(24.0)
    assert nic_gbyte_s(NIC_CATALOG["Ethernet-10"]) == pytest.approx(1.25 * TCP_FRAMING_EFFICIENCY)
    # NCCL's socket transport stops well below a 100 GbE wire (nccl issue 398)
    assert nic_gbyte_s(NIC_CATALOG["Ethernet-100"]) == TCP_SOCKET_GBYTE_S
    assert nic_gbyte_s(NIC_CATALOG["RoCE-100"]) > 2 * nic_gbyte_s(NIC_CATALOG["Ethernet-100"])


def test_links_inside_a_node_run_at_their_catalog_efficiency():
    assert LINK_CATALOG["NVLink3"].achieved_gbyte_s == pytest.approx(12 * 20.0)  # NCCL: 20 GB/s per brick
    assert LINK_CATALOG["NVLink4"].achieved_gbyte_s == pytest.approx(18 * 20.6)
    assert LINK_CATALOG["PCIe3"].achieved_gbyte_s == pytest.approx(12.0)
    assert LINK_CATALOG["PCIe4-host"].achieved_gbyte_s == pytest.approx(10.0)  # the CPU socket link
    c = _cluster(nodes=1, gpus=8, intra="PCIe4-host")
    assert achieved_link(c, "0/0/0", "0/0/1").bandwidth_gbyte_s == pytest.approx(STAGED_PCIE4)  # staged both ways
    assert c.link_between("0/0/0", "0/0/1").bandwidth_gbyte_s == 31.5  # the hardware keeps its line rate


def test_an_all_reduce_over_pcie_without_peer_to_peer_is_paced_by_host_staging():
    ids = [f"0/0/{i}" for i in range(8)]
    p2p = allreduce_time_s(1e9, ids, _cluster(nodes=1, gpus=8, intra="PCIe4"))
    host = allreduce_time_s(1e9, ids, _cluster(nodes=1, gpus=8, intra="PCIe4-host"))
    # NCCL's ring under Simple: 8.4 us once, then 14 steps of 5.7 us over PCIe, 3.4 over NVLink (tuning.cc);
    # through host memory a step takes the link's own 20 us
    assert p2p == pytest.approx(ring_allreduce_time_s(1e9, 8, 24.0, 5.7) + 8.4e-6)
    assert host == pytest.approx(ring_allreduce_time_s(1e9, 8, STAGED_PCIE4, 20.0) + 8.4e-6)
    nvswitch = allreduce_time_s(1e9, ids, _cluster(nodes=1, gpus=8, intra="NVLink3"))
    assert nvswitch == pytest.approx(ring_allreduce_time_s(1e9, 8, 240.0, 3.4) + 8.4e-6)


def test_inline_links_take_an_efficiency_and_round_trip():
    data = {"name": "c", "nodes": [{"count": 1, "gpus_per_node": 2, "gpu": "A100-40GB", "nic": "IB-HDR",
                                    "intra_node": {"bandwidth_gbyte_s": 30, "efficiency": 0.5}}]}
    c = parse_cluster(data)
    assert c.groups[0].intra_node.achieved_gbyte_s == 15.0
    assert parse_cluster(cluster_to_dict(c)) == c
    assert parse_cluster({**data, "nodes": [{**data["nodes"][0], "intra_node": {"bandwidth_gbyte_s": 30}}]}
                         ).groups[0].intra_node.efficiency == 1.0  # a measured figure is taken as it is
    bad = {**data, "nodes": [{**data["nodes"][0], "intra_node": {"bandwidth_gbyte_s": 30, "efficiency": 1.5}}]}
    with pytest.raises(SpecError, match=r"nodes\[0\]\.intra_node\.efficiency"):
        parse_cluster(bad)


def _pipeline(first="0/0/0", second="0/1/0", batch=8, micro=1):
    return Plan(global_batch=batch, micro_batch=micro, seq_len=S,
                replicas=(Replica(1.0, (Stage((0, 7), (first,)), Stage((7, 14), (second,)))),))


def test_blocking_sends_keep_the_sender_busy_and_overlapped_ones_do_not(gpt2):
    plan = _pipeline()
    rdma = _cluster(nic="IB-EDR")
    blocking = simulate(gpt2, rdma, plan, trace=True)
    overlapped = simulate(gpt2, rdma, plan, trace=True, overlap_p2p=True)
    b0 = blocking.breakdown[0]
    assert b0["pp_blocked_s"] > 0 and overlapped.breakdown[0]["pp_blocked_s"] == 0
    # each device waits for every send it makes: stage 0 its 8 activations, stage 1 its 8 gradients
    assert b0["pp_blocked_s"] == pytest.approx(b0["pp_comm_s"])
    assert blocking.breakdown[1]["pp_blocked_s"] == pytest.approx(blocking.breakdown[1]["pp_comm_s"])
    assert blocking.step_time_s > overlapped.step_time_s
    # in the timeline a device starts its next operation only after its blocking send ended
    for pred, waits in ((blocking, True), (overlapped, False)):
        ops = sorted((e for e in pred.timeline if e["stage"] == 0 and e["kind"] in ("fwd", "bwd", "send")),
                     key=lambda e: (e["start_s"], e["kind"] != "send"))
        sends = [e for e in ops if e["kind"] == "send"]
        nxt = [min((o["start_s"] for o in ops if o["kind"] != "send" and o["start_s"] >= s["start_s"]),
                   default=float("inf")) for s in sends]
        assert all(n >= s["end_s"] - 1e-12 for s, n in zip(sends, nxt)) == waits


def test_tcp_sends_block_even_in_an_engine_that_overlaps_them(gpt2):
    tcp = _cluster(nic="Ethernet-25")
    plan = _pipeline()
    assert simulate(gpt2, tcp, plan, overlap_p2p=True).step_time_s == pytest.approx(
        simulate(gpt2, tcp, plan).step_time_s)


def test_gradients_reduce_in_fp32_under_bf16_as_megatron_does():
    assert grad_reduce_bytes("bf16") == 4 and grad_reduce_bytes("fp16") == 2 and grad_reduce_bytes("fp32") == 4


def _replicas(n, devices):
    return Plan(global_batch=2 * n, micro_batch=2, seq_len=S,
                replicas=tuple(Replica(1.0 / n, (Stage((0, 14), (d,)),)) for d in devices))


def test_the_last_bucket_is_exposed_and_a_small_model_is_one_bucket(gpt2):
    cluster = _cluster(nic="Ethernet-10")
    plan = _replicas(2, ["0/0/0", "0/1/0"])
    megatron = simulate(gpt2, cluster, plan).breakdown[0]  # 124M parameters: one 40M-parameter bucket per unit
    # every bucket here is at most a bucket: the embedding (unit 0, 38.6M) goes last, after the backward
    nbytes = gpt2.units[0].params * 4
    assert megatron["sync_wait_s"] >= allreduce_time_s(nbytes, ["0/0/0", "0/1/0"], cluster) * 0.999
    fine = Simulator(gpt2, cluster, grad_bucket_params=1).simulate(plan).breakdown[0]
    assert fine["sync_wait_s"] <= megatron["sync_wait_s"]
    one_bucket = Simulator(gpt2, cluster, grad_bucket_params=1e9).simulate(plan).breakdown[0]
    assert one_bucket["sync_wait_s"] == pytest.approx(one_bucket["dp_comm_s"])  # nothing hides


def test_pipeline_flows_leaving_one_node_share_its_nics(gpt2):
    # 8 replicas of a 2-stage pipeline, stage 0 on node 0 and stage 1 on node 1 (Megatron order):
    # 8 transfers cross each boundary at once
    def pp_comm(nics):
        cluster = _cluster(nodes=2, gpus=8, nic="Ethernet-25", nics=nics)
        plan = megatron_plan(gpt2, cluster, Workload(16, S), tp=1, pp=2, dp=8, micro_batch=1)
        assert {s.devices[0].split("/")[1] for s in (r.stages[0] for r in plan.replicas)} == {"0"}
        return simulate(gpt2, cluster, plan).breakdown[0]["pp_comm_s"]

    latency = 2 * 25e-6  # two micro-batches per replica, 25 us each over Ethernet-25
    one, eight = pp_comm(1) - latency, pp_comm(8) - latency
    assert one == pytest.approx(8 * eight, rel=1e-6)  # 1/8 of the one NIC each


def test_data_parallel_rings_of_stages_on_one_node_share_its_nics(gpt2):
    # tp-pp-dp: node n holds the 2 stages of replica n; both stages' rings cross every node's NIC
    cluster = _cluster(nodes=2, gpus=2, nic="Ethernet-25")
    plan = megatron_plan(gpt2, cluster, Workload(8, S), tp=1, pp=2, dp=2, micro_batch=1, order="tp-pp-dp")
    sim = Simulator(gpt2, cluster)
    segments = sim._dp_segments_small(plan)
    shared = [sim._ring_small(plan, seg.holders, nic_flows(
        [(sim._node_id(plan.replicas[r].stages[k].devices[0]), (r, k), 1) for r, k in s.holders]
        for s in segments))[2] for seg in segments if seg.a >= 0]  # the two stages' rings (tied copies aside)
    assert shared == [(2, None), (2, None)]  # (NIC concurrency, zone-link concurrency: one zone, none)


def test_geforce_boards_on_pcie_have_no_peer_to_peer():
    ids = [f"0/0/{i}" for i in range(8)]
    geforce = allreduce_time_s(1e9, ids, _cluster(nodes=1, gpus=8, gpu="RTX3090-24GB", intra="PCIe4"))
    assert geforce == pytest.approx(ring_allreduce_time_s(1e9, 8, STAGED_PCIE4, 20.0) + 8.4e-6)  # as PCIe4-host
    workstation = allreduce_time_s(1e9, ids, _cluster(nodes=1, gpus=8, gpu="A6000-48GB", intra="PCIe4"))
    assert workstation == pytest.approx(ring_allreduce_time_s(1e9, 8, 24.0, 5.7) + 8.4e-6)


def test_a_hybrid_cube_mesh_rings_small_groups_over_few_bricks():
    from hetpart.costmodel.device_group import device_group_facts
    from hetpart.costmodel.links import cube_mesh_ring_gbyte_s

    # NCCL packs rings onto the bricks: all 8 GPUs fill 6 rings (as an NVSwitch board), a quad 4
    assert cube_mesh_ring_gbyte_s(frozenset(range(8))) == 120.0
    assert cube_mesh_ring_gbyte_s(frozenset(range(4))) == 80.0
    assert cube_mesh_ring_gbyte_s(frozenset({0, 1})) == 20.0 and cube_mesh_ring_gbyte_s(frozenset({0, 3})) == 40.0
    assert cube_mesh_ring_gbyte_s(frozenset({0, 5})) == 0.0  # no NVLink between them
    mesh = _cluster(nodes=1, gpus=8, gpu="V100-32GB", intra="NVLink2-cube-mesh")
    switch = _cluster(nodes=1, gpus=8, gpu="V100-32GB", intra="NVLink2")
    pair = ("0/0/0", "0/0/1")
    assert device_group_facts(mesh, pair).tp_bandwidth_gbyte_s == 20.0
    assert device_group_facts(switch, pair).tp_bandwidth_gbyte_s == 120.0
    assert device_group_facts(mesh, ("0/0/0", "0/0/5")).tp_bandwidth_gbyte_s == 10.0  # through PCIe and the CPUs
    eight = [f"0/0/{i}" for i in range(8)]
    assert allreduce_time_s(1e9, eight, mesh) == pytest.approx(allreduce_time_s(1e9, eight, switch))


def test_gradient_all_reduces_over_tcp_wait_for_the_backward(gpt2):
    plan = _replicas(2, ["0/0/0", "0/1/0"])
    fine = dict(grad_bucket_params=1)  # a bucket per unit: over RDMA part of the all-reduce hides
    rdma = Simulator(gpt2, _cluster(nic="RoCE-100"), **fine).simulate(plan).breakdown[0]
    tcp = Simulator(gpt2, _cluster(nic="Ethernet-100"), **fine).simulate(plan).breakdown[0]
    assert rdma["sync_wait_s"] < 0.99 * rdma["dp_comm_s"]  # (the 154 MB embedding goes last)
    assert tcp["sync_wait_s"] == pytest.approx(tcp["dp_comm_s"])  # nothing hides behind the backward
    vector = Simulator(gpt2, _cluster(nodes=16, nic="Ethernet-100"), **fine)  # 16 replicas: the numpy path
    wide = vector.simulate(_replicas(16, [f"0/{n}/0" for n in range(16)])).breakdown[0]
    assert wide["sync_wait_s"] == pytest.approx(wide["dp_comm_s"])
