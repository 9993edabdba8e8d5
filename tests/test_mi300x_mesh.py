"""An MI300X node is a full xGMI mesh: a pair talks over one link, a ring over k GPUs over k - 1 links each."""

from __future__ import annotations

import pytest

from hetpart.catalog.hardware import LINK_CATALOG
from hetpart.cluster import parse_cluster
from hetpart.costmodel.device_group import device_group_facts
from hetpart.costmodel.links import achieved_link, intra_node_link, intra_node_ring_gbyte_s


def _node(gpu: str, link: str = "xGMI"):
    return parse_cluster({"name": "n", "nodes": [{"count": 1, "gpus_per_node": 8, "gpu": gpu, "intra_node": link,
                                                  "nic": "RoCE-400", "nics_per_node": 8}]})


def test_a_cdna3_node_naming_xgmi_gets_the_mesh_and_mi250x_keeps_its_pairs() -> None:
    mi300 = _node("MI300X-192GB")
    assert intra_node_link(mi300.groups[0]).name == "xGMI-mesh"
    assert intra_node_link(_node("MI250X-GCD-64GB").groups[0]).name == "xGMI"
    per_link = LINK_CATALOG["xGMI-mesh"].achieved_gbyte_s
    assert per_link == pytest.approx(48.0)


def test_ring_bandwidth_grows_with_the_links_each_member_has_to_the_others() -> None:
    group = _node("MI300X-192GB").groups[0]
    per_link = LINK_CATALOG["xGMI-mesh"].achieved_gbyte_s
    assert intra_node_ring_gbyte_s(group, [0, 1]) == pytest.approx(per_link)
    assert intra_node_ring_gbyte_s(group, [0, 1, 2, 3]) == pytest.approx(3 * per_link)
    assert intra_node_ring_gbyte_s(group, list(range(8))) == pytest.approx(7 * per_link)  # 336 GB/s


def test_a_send_between_two_mi300x_uses_one_link_and_tp8_rings_all_seven() -> None:
    cluster = _node("MI300X-192GB")
    per_link = LINK_CATALOG["xGMI-mesh"].achieved_gbyte_s
    assert achieved_link(cluster, "0/0/0", "0/0/5").bandwidth_gbyte_s == pytest.approx(per_link)
    facts = device_group_facts(cluster, [f"0/0/{i}" for i in range(8)])
    assert facts.tp_bandwidth_gbyte_s == pytest.approx(7 * per_link)
