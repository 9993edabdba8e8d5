"""Rings of GPUs without PCIe peer-to-peer, staged through host memory (hetpart.costmodel.links,
host_staged_ring_gbyte_s): each member sends and receives through its root port at once, GPUs behind one PCIe
switch share its uplink, a ring over both sockets crosses the socket link, and every staged byte is written to
and read from the host memory all members share."""

import pytest

from hetpart.catalog.hardware import LINK_CATALOG
from hetpart.cluster import parse_cluster
from hetpart.costmodel import allreduce_time_s, ring_allreduce_time_s
from hetpart.costmodel.links import HOST_DRAM_GBYTE_S, STAGED_DUPLEX_GBYTE_S, achieved_link, \
    host_staged_ring_gbyte_s, intra_node_ring_gbyte_s


def _group(gpus: int, gpu: str = "TitanRTX-24GB", intra: str = "PCIe3", **host):
    cluster = parse_cluster({"name": "c", "nodes": [{"count": 1, "gpus_per_node": gpus, "gpu": gpu,
                                                     "intra_node": intra, "nic": "Ethernet-10", **host}]})
    return cluster, cluster.groups[0]


def test_gpus_behind_one_switch_share_its_uplink() -> None:
    # 8 GPUs of a PCIe 3 server: 4 a socket, 2 on each x16 port, staging in both directions through it
    _, group = _group(8)
    alone = STAGED_DUPLEX_GBYTE_S["PCIe3-host"]
    assert intra_node_ring_gbyte_s(group, [0, 2]) == pytest.approx(alone)  # two ports
    assert intra_node_ring_gbyte_s(group, [0, 1]) == pytest.approx(alone / 2)  # one switch: twice the load
    assert intra_node_ring_gbyte_s(group, list(range(8))) == pytest.approx(alone / 2)
    # PCIe 4 hosts give each of 4 GPUs a socket its own port
    _, gen4 = _group(8, "RTX3090-24GB", "PCIe4")
    assert intra_node_ring_gbyte_s(gen4, [0, 1]) == pytest.approx(STAGED_DUPLEX_GBYTE_S["PCIe4-host"])


def test_the_socket_link_binds_only_rings_that_span_two_sockets() -> None:
    socket_link = LINK_CATALOG["PCIe5-host"].achieved_gbyte_s  # NCCL topo.h SRP_QPI_BW, 22 GB/s
    _, server = _group(8, "RTX4090-24GB", "PCIe5-host")
    across = intra_node_ring_gbyte_s(server, [2, 3, 4, 5])
    assert across == pytest.approx(socket_link)
    assert socket_link < STAGED_DUPLEX_GBYTE_S["PCIe5-host"]
    # the same 4 GPUs on one socket: that socket's half of host memory, written and read by 4 members
    one_socket = intra_node_ring_gbyte_s(server, [0, 1, 2, 3])
    assert one_socket == pytest.approx(HOST_DRAM_GBYTE_S["PCIe5-host"] / 2 / (2 * 4))
    assert one_socket > socket_link
    # a 4-GPU workstation has one socket: no socket link, the port's staging rate binds
    _, workstation = _group(4, "RTX4090-24GB", "PCIe5-host")
    assert intra_node_ring_gbyte_s(workstation, [0, 1, 2, 3]) == pytest.approx(STAGED_DUPLEX_GBYTE_S["PCIe5-host"])


@pytest.mark.parametrize("members", [2, 3, 4])
def test_host_memory_is_shared_by_every_member_staging_at_once(members: int) -> None:
    # each staged byte is written to host memory and read back: 2 k times the ring's rate comes out of it
    _, group = _group(4, "RTX3090-24GB", "PCIe4", host_memory_gbyte_s=40.0)
    expected = min(STAGED_DUPLEX_GBYTE_S["PCIe4-host"], 40.0 / (2 * members))
    assert intra_node_ring_gbyte_s(group, list(range(members))) == pytest.approx(expected)
    _, roomy = _group(4, "RTX3090-24GB", "PCIe4", host_memory_gbyte_s=400.0)
    assert intra_node_ring_gbyte_s(roomy, list(range(members))) == pytest.approx(STAGED_DUPLEX_GBYTE_S["PCIe4-host"])


def test_an_all_reduce_over_eight_turing_boards_runs_at_the_shared_uplinks_rate() -> None:
    cluster, _ = _group(8)
    ids = [f"0/0/{i}" for i in range(8)]
    bus = STAGED_DUPLEX_GBYTE_S["PCIe3-host"] / 2  # 2.85 GB/s, where the socket link alone allowed 10
    assert allreduce_time_s(1e9, ids, cluster) == pytest.approx(ring_allreduce_time_s(1e9, 8, bus, 20.0) + 8.4e-6)
    # a pipeline send between two of them is priced as a ring of the pair
    assert achieved_link(cluster, "0/0/0", "0/0/1").bandwidth_gbyte_s == pytest.approx(bus)
    assert achieved_link(cluster, "0/0/0", "0/0/2").bandwidth_gbyte_s == pytest.approx(2 * bus)


def test_links_with_peer_to_peer_and_inline_host_links_keep_their_rate() -> None:
    _, workstation = _group(8, "A6000-48GB", "PCIe4")  # peer-to-peer: NCCL's PCI rate, no staging
    assert intra_node_ring_gbyte_s(workstation, list(range(8))) == pytest.approx(24.0)
    inline = {"name": "PCIe4-host", "bandwidth_gbyte_s": 31.5, "latency_us": 20.0, "efficiency": 0.5}
    _, measured = _group(8, "RTX3090-24GB", inline)  # the user's own figures are taken as given
    assert intra_node_ring_gbyte_s(measured, list(range(8))) == pytest.approx(15.75)


def test_a_single_member_stages_nothing() -> None:
    _, group = _group(8)
    assert host_staged_ring_gbyte_s(group, (3,)) == float("inf")
