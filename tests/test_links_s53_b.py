"""A GH200 quad node has no NVSwitch: its GPUs are wired to each other (``NVLink4-mesh``), a pair talks over
its own 150 GB/s, a ring over all four over 3 peers' links, and no all-reduce runs as NVLS (NVLink SHARP needs
the switch). An HGX H100 board and a larger GH200 node keep the switched ``NVLink4`` and NVLS."""

from __future__ import annotations

import pytest

from hetpart.catalog.hardware import LINK_CATALOG
from hetpart.cluster import parse_cluster
from hetpart.costmodel.collectives import allreduce_choice, allreduce_lines, allreduce_time_s
from hetpart.costmodel.device_group import device_group_facts
from hetpart.costmodel.links import achieved_link, intra_node_link, intra_node_ring_gbyte_s
from hetpart.costmodel.nccl import NVLS_ALG_FRACTION


def _node(gpu: str, gpus: int, link: str | dict = "NVLink4"):
    return parse_cluster({"name": "n", "nodes": [{"count": 1, "gpus_per_node": gpus, "gpu": gpu, "intra_node": link,
                                                  "nic": "IB-NDR", "nics_per_node": gpus}]})


def _ids(n: int) -> list[str]:
    return [f"0/0/{i}" for i in range(n)]


def _algorithms(cluster, n: int) -> set[str]:
    return {line.algorithm for line in allreduce_lines(_ids(n), cluster)}


def test_a_gh200_quad_is_a_mesh_without_nvls_and_an_hgx_h100_keeps_its_switch() -> None:
    quad = _node("GH200-96GB", 4)
    assert intra_node_link(quad.groups[0]).name == "NVLink4-mesh"
    assert "nvls" not in _algorithms(quad, 4) and "nvls" not in _algorithms(quad, 2)
    hgx = _node("H100-80GB", 8)
    assert intra_node_link(hgx.groups[0]).name == "NVLink4"
    assert "nvls" in _algorithms(hgx, 8)
    assert allreduce_choice(8e9, _ids(8), hgx).algorithm == "nvls"  # nccl-tests issue 212: NVLS wins at 8 GB


def test_only_gh200_boards_of_two_or_four_are_switchless() -> None:
    assert intra_node_link(_node("GH200-96GB", 2).groups[0]).name == "NVLink4-mesh"
    big = _node("GH200-96GB", 8)  # an NVLink Switch System node keeps the switch and its SHARP
    assert intra_node_link(big.groups[0]).name == "NVLink4"
    assert "nvls" in _algorithms(big, 8)
    inline = {"name": "NVLink4", "bandwidth_gbyte_s": 300, "latency_us": 2}  # the file's own figures stand
    assert intra_node_link(_node("GH200-96GB", 4, inline).groups[0]).bandwidth_gbyte_s == 300
    hgx4 = _node("H100-80GB", 4, "NVLink4-mesh")  # a switchless board of another GPU, said in the file
    pair = LINK_CATALOG["NVLink4-mesh"].achieved_gbyte_s
    assert intra_node_ring_gbyte_s(hgx4.groups[0], [0, 1]) == pytest.approx(pair)
    assert "nvls" not in _algorithms(hgx4, 4)


def test_quad_pair_and_ring_rates_follow_the_links_each_member_has() -> None:
    quad = _node("GH200-96GB", 4)
    group = quad.groups[0]
    pair = LINK_CATALOG["NVLink4-mesh"].achieved_gbyte_s
    assert pair == pytest.approx(150.0 * LINK_CATALOG["NVLink4"].efficiency)
    assert achieved_link(quad, "0/0/1", "0/0/3").bandwidth_gbyte_s == pytest.approx(pair)
    assert intra_node_ring_gbyte_s(group, [0, 2]) == pytest.approx(pair)
    assert intra_node_ring_gbyte_s(group, [0, 1, 2]) == pytest.approx(2 * pair)
    # all four: the switch's per-GPU rate (450 GB/s line rate), now as 3 peers' links
    assert intra_node_ring_gbyte_s(group, [0, 1, 2, 3]) == pytest.approx(LINK_CATALOG["NVLink4"].achieved_gbyte_s)
    assert device_group_facts(quad, _ids(4)).tp_bandwidth_gbyte_s == pytest.approx(3 * pair)
    assert device_group_facts(quad, _ids(2)).tp_bandwidth_gbyte_s == pytest.approx(pair)


def test_tp4_all_reduce_on_a_quad_pays_the_ring_where_a_switched_quad_has_nvls() -> None:
    quad, switched = _node("GH200-96GB", 4), _node("H100-80GB", 4)
    nbytes = 1e9
    bus = LINK_CATALOG["NVLink4"].achieved_gbyte_s * 1e9  # equal ring bus bandwidth on both
    ring = allreduce_choice(nbytes, _ids(4), quad)
    assert (ring.algorithm, ring.protocol) == ("ring", "Simple")
    assert ring.per_byte_s == pytest.approx(2 * 3 / 4 / bus)  # nccl-tests' bus bandwidth factor 2(n-1)/n
    nvls = allreduce_choice(nbytes, _ids(4), switched)
    assert nvls.algorithm == "nvls" and nvls.per_byte_s == pytest.approx(1 / (NVLS_ALG_FRACTION * bus))
    slower = allreduce_time_s(nbytes, _ids(4), quad) / allreduce_time_s(nbytes, _ids(4), switched)
    assert slower == pytest.approx(1.5 * NVLS_ALG_FRACTION, rel=0.01)  # 1.11: 4.07 ms against 3.65
    # a TP2 pair on the quad has one peer's links, a third of the switch's rate
    assert allreduce_time_s(nbytes, _ids(2), quad) / allreduce_time_s(nbytes, _ids(2), switched) == \
        pytest.approx(3.0, rel=0.02)


def test_inspect_cluster_says_a_gh200_quad_is_priced_as_the_mesh(capsys, tmp_path) -> None:
    from tests._cli import run_cli

    path = tmp_path / "quad.yaml"
    path.write_text("name: quad\nnodes:\n  - {count: 1, gpus_per_node: 4, gpu: GH200-96GB, intra_node: NVLink4, "
                    "nic: IB-NDR}\n  - {count: 1, gpus_per_node: 8, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR}\n")
    code, out, _ = run_cli(capsys, "inspect", "cluster", str(path))
    assert code == 0
    assert "group 0: intra-node NVLink4 priced as NVLink4-mesh (150 GB/s between two GPUs" in " ".join(out.split())
    assert "group 1:" not in out  # the HGX H100 board is what its file says
