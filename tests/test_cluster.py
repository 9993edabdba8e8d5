"""Cluster YAML (shared/CONTRACT.md), devices, the network view and effective bandwidth."""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import pytest
import yaml

from hetpart import SpecError, load_cluster
from hetpart.catalog.hardware import GPU_CATALOG, LINK_CATALOG, NIC_CATALOG
from hetpart.cluster import cluster_catalog, parse_cluster

REPO = Path(__file__).resolve().parents[1]
SCENARIO_DIRS = [d for d in (REPO / "shared" / "scenarios", REPO.parent / "shared" / "scenarios",
                             REPO / "experiments" / "suites" / "public") if d.is_dir()]  # the repo's copy: a fresh clone

CONTRACT_EXAMPLE = """
name: two-zones                  # required
nodes:                           # required: groups of identical nodes
  - count: 4                     # nodes in this group
    gpus_per_node: 8
    gpu: A100-80GB
    intra_node: NVLink3
    nic: IB-HDR
    nics_per_node: 8
    zone: dc1
  - count: 2
    gpus_per_node: 4
    gpu: {name: X, tflops_bf16: 312, memory_gb: 80, hbm_gbyte_s: 2039, vendor: nvidia}
    intra_node: {bandwidth_gbyte_s: 300, latency_us: 2}
    nic: {bandwidth_gbit_s: 200, latency_us: 2}
    zone: dc2
links:
  - zones: [dc1, dc2]
    bandwidth_gbit_s: 10
    latency_us: 500
"""


def _mini(**group) -> dict:
    base = {"count": 2, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR"}
    return {"name": "mini", "nodes": [base | group]}


@pytest.fixture
def two_zones(tmp_path: Path):
    path = tmp_path / "two.yaml"
    path.write_text(CONTRACT_EXAMPLE)
    return load_cluster(path)


def test_contract_example_loads_with_catalog_and_inline_hardware(two_zones) -> None:
    c = two_zones
    assert c.name == "two-zones"
    assert c.num_devices == 4 * 8 + 2 * 4 == len(c.devices)
    g0, g1 = c.groups
    assert g0.gpu is GPU_CATALOG["A100-80GB"] and g0.intra_node is LINK_CATALOG["NVLink3"]
    assert g0.nic is NIC_CATALOG["IB-HDR"] and g0.nics_per_node == 8 and g0.zone == "dc1"
    assert (g1.gpu.name, g1.gpu.tflops_bf16, g1.gpu.memory_gb, g1.gpu.hbm_gbyte_s, g1.gpu.vendor) == \
        ("X", 312, 80, 2039, "nvidia")
    assert (g1.intra_node.bandwidth_gbyte_s, g1.intra_node.latency_us) == (300, 2)
    assert (g1.nic.bandwidth_gbit_s, g1.nic.bandwidth_gbyte_s, g1.nic.latency_us) == (200, 25, 2)
    assert g1.nics_per_node == 1  # default
    assert c.zones == ["dc1", "dc2"]
    assert c.gpu_types == ["A100-80GB", "X"]
    (link,) = c.zone_links
    assert link.zones == ("dc1", "dc2") and link.bandwidth_gbit_s == 10 and link.latency_us == 500


def test_defaults_zone_and_nics(tmp_path: Path) -> None:
    c = parse_cluster(_mini(), "mini.yaml")
    assert c.groups[0].zone == "default" and c.groups[0].nics_per_node == 1
    assert c.groups[0].node_bandwidth_gbyte_s == 25.0
    assert parse_cluster(_mini(nics_per_node=4), "m").groups[0].node_bandwidth_gbyte_s == 100.0


def test_device_ids_are_group_node_gpu_in_file_order(two_zones) -> None:
    ids = [d.id for d in two_zones.devices]
    assert ids[:9] == [f"0/0/{i}" for i in range(8)] + ["0/1/0"]
    assert ids[32:36] == ["1/0/0", "1/0/1", "1/0/2", "1/0/3"]
    assert ids[-1] == "1/1/3"
    assert [d.index for d in two_zones.devices] == list(range(40))
    d = two_zones.device("1/1/2")
    assert (d.group, d.node, d.local, d.zone, d.gpu.name, d.node_key) == (1, 1, 2, "dc2", "X", (1, 1))
    assert two_zones.has_device("0/3/7") and not two_zones.has_device("0/4/0")
    assert two_zones.group_of("0/2/5") is two_zones.groups[0]


def test_unknown_device_id_is_a_clear_error(two_zones) -> None:
    with pytest.raises(SpecError, match=r"device '0/9/0' does not exist in cluster 'two-zones' \(40 devices"):
        two_zones.device("0/9/0")


def test_link_between_same_node_is_intra_node(two_zones) -> None:
    link = two_zones.link_between("0/0/0", "0/0/7")
    assert (link.kind, link.bandwidth_gbyte_s, link.latency_us) == ("intra_node", 300, 2)
    me = two_zones.link_between("0/0/0", "0/0/0")
    assert me.kind == "self" and math.isinf(me.bandwidth_gbyte_s) and me.transfer_time_s(1e9) == 0.0


def test_link_between_nodes_uses_one_nic_per_flow(two_zones) -> None:
    link = two_zones.link_between("0/0/0", "0/1/0")
    # One flow uses one 200 Gbit/s NIC on each side (25 GB/s), not the node's 8 NICs.
    assert (link.kind, link.bandwidth_gbyte_s, link.latency_us) == ("nic", 25.0, 1.5)
    assert link.transfer_time_s(25e9) == pytest.approx(1.0 + 1.5e-6)


def test_link_between_zones_is_the_slowest_hop(two_zones) -> None:
    link = two_zones.link_between("0/0/0", "1/0/0")
    # 10 Gbit/s inter-zone link (1.25 GB/s) is slower than both NICs; latencies add up.
    assert link.kind == "inter_zone"
    assert link.bandwidth_gbyte_s == pytest.approx(1.25)
    assert link.latency_us == pytest.approx(max(1.5, 2.0) + 500)
    assert two_zones.link_between("1/0/0", "0/0/0") == link


def test_inter_zone_link_faster_than_nic_keeps_nic_as_bottleneck() -> None:
    data = {"name": "fast-wan", "nodes": [
        {"count": 1, "gpus_per_node": 1, "gpu": "A100-40GB", "intra_node": "PCIe4", "nic": "Ethernet-10", "zone": "a"},
        {"count": 1, "gpus_per_node": 1, "gpu": "V100-16GB", "intra_node": "PCIe3", "nic": "IB-HDR", "zone": "b"}],
        "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 400, "latency_us": 100}]}
    link = parse_cluster(data, "fast.yaml").link_between("0/0/0", "1/0/0")
    assert link.kind == "nic" and link.bandwidth_gbyte_s == pytest.approx(10 / 8)
    assert link.latency_us == pytest.approx(30 + 100)


def test_zones_without_link_have_no_path() -> None:
    data = _mini(zone="a")
    data["nodes"].append(dict(data["nodes"][0], zone="b"))
    c = parse_cluster(data, "nolink.yaml")
    assert c.link_between("0/0/0", "1/0/0") is None
    assert not c.zones_connected("a", "b") and c.zones_connected("a", "a")
    assert c.zone_link("a", "b") is None
    assert c.link_between("0/0/0", "0/1/0").kind == "nic"


def test_networkx_view(two_zones) -> None:
    g = two_zones.graph
    assert isinstance(g, nx.Graph)
    devices = [n for n, d in g.nodes(data=True) if d["kind"] == "device"]
    assert len(devices) == 40
    assert g.nodes["1/0/0"]["gpu"] == "X" and g.nodes["1/0/0"]["zone"] == "dc2"
    kinds = {d["kind"] for _, _, d in g.edges(data=True)}
    assert kinds == {"intra_node", "nic", "inter_zone"}
    assert g.edges["zone:dc1", "zone:dc2"]["bandwidth_gbyte_s"] == pytest.approx(1.25)
    # The node's uplink carries all its NICs: 8 x 200 Gbit/s = 200 GB/s.
    assert g.edges["node:0/0", "zone:dc1"]["bandwidth_gbyte_s"] == pytest.approx(200)
    assert nx.is_connected(g)
    path = nx.shortest_path(g, "0/0/0", "1/1/3")
    assert path == ["0/0/0", "node:0/0", "zone:dc1", "zone:dc2", "node:1/1", "1/1/3"]
    # The slowest hop of the graph path is the effective bandwidth of link_between.
    slowest = min(g.edges[a, b]["bandwidth_gbyte_s"] for a, b in zip(path, path[1:]))
    assert slowest == pytest.approx(two_zones.link_between("0/0/0", "1/1/3").bandwidth_gbyte_s)


def test_networkx_view_without_zone_links_is_disconnected() -> None:
    data = _mini(zone="a")
    data["nodes"].append(dict(data["nodes"][0], zone="b"))
    g = parse_cluster(data, "x").graph
    assert nx.number_connected_components(g) == 2


def test_summary_lists_groups_in_file_order(two_zones) -> None:
    s = two_zones.summary()
    assert s["num_devices"] == 40
    assert [g["gpu"] for g in s["node_groups"]] == ["A100-80GB", "X"]
    assert s["node_groups"][0]["device_ids"] == "0/0/0 .. 0/3/7"
    assert s["node_groups"][0]["node_bandwidth_gbit_s"] == 1600
    assert s["links"] == [{"zones": ["dc1", "dc2"], "bandwidth_gbit_s": 10, "latency_us": 500}]
    assert s["peak_tflops_bf16"] == pytest.approx(40 * 312)


@pytest.mark.parametrize("name", sorted(cluster_catalog()))
def test_bundled_cluster_loads(name: str) -> None:
    c = load_cluster(name)
    assert c.name == name and c.source == f"catalog:{name}"
    for a in c.zones:
        for b in c.zones:
            assert c.zones_connected(a, b), f"{name}: zones {a} and {b} have no link"


def _scenario_files() -> list[Path]:
    return sorted(p for d in SCENARIO_DIRS for p in d.glob("*.yaml") if p.name != "suite.yaml")


@pytest.mark.skipif(not SCENARIO_DIRS, reason="shared/scenarios is not next to this checkout")
def test_every_shared_scenario_loads_and_matches_the_bundled_copy() -> None:
    files = _scenario_files()
    assert files
    bundled = cluster_catalog()
    for path in files:
        c = load_cluster(path)
        assert c.source == str(path) and c.num_devices > 0
        if path.stem in bundled:
            assert load_cluster(path.stem) == c, path


@pytest.mark.skipif(not SCENARIO_DIRS, reason="shared/scenarios is not next to this checkout")
def test_suite_entries_name_loadable_clusters_and_models() -> None:
    from hetpart import load_model

    for d in SCENARIO_DIRS:
        suite = d / "suite.yaml"
        if not suite.exists():
            continue
        for entry in yaml.safe_load(suite.read_text())["entries"]:
            assert load_cluster(d / entry["cluster"]).num_devices > 0
            assert load_model(entry["model"], seq_len=entry["seq_len"]).num_params > 0


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("data, match", [
    ({"nodes": []}, r"x.yaml: name: missing required field"),
    ({"name": "a", "nodes": []}, r"x.yaml: nodes: expected a non-empty list"),
    ({"name": "a", "nodes": [{}], "extra": 1}, r"x.yaml: extra: unknown key"),
    (_mini(gpu="A100-90GB"), r"x.yaml: nodes\[0\].gpu: unknown GPU 'A100-90GB'; did you mean 'A100-80GB'\?.*inline"),
    (_mini(gpu="a100-80gb"), r"x.yaml: nodes\[0\].gpu: unknown GPU 'a100-80gb'; did you mean 'A100-80GB'\?"),
    (_mini(nic="ib-hdr"), r"nodes\[0\].nic: unknown NIC 'ib-hdr'; did you mean 'IB-HDR'\?"),
    (_mini(intra_node="nvlink3"), r"nodes\[0\].intra_node: unknown intra-node link 'nvlink3'; did you mean 'NVLink3'\?"),
    (_mini(nic="IB-XDR"), r"nodes\[0\].nic: unknown NIC 'IB-XDR'"),
    (_mini(intra_node="NVLink9"), r"nodes\[0\].intra_node: unknown intra-node link 'NVLink9'"),
    (_mini(count=0), r"nodes\[0\].count: must be >= 1, got 0"),
    (_mini(count=-3), r"nodes\[0\].count: must be >= 1, got -3"),
    (_mini(count=2.5), r"nodes\[0\].count: expected a whole number, got 2.5"),
    (_mini(count="4"), r"nodes\[0\].count: expected a whole number, got '4'"),
    (_mini(count=True), r"nodes\[0\].count: expected a whole number, got True"),
    (_mini(gpus_per_node=1000), r"nodes\[0\].gpus_per_node: 1000 is absurdly large"),
    (_mini(gpu={"name": "X", "tflops_bf16": 100}), r"nodes\[0\].gpu.memory_gb: missing required field"),
    (_mini(gpu={"name": "X", "tflops_bf16": 100, "memory_gb": 8}), r"nodes\[0\].gpu.hbm_gbyte_s: missing required field"),
    (_mini(gpu={"name": "X", "tflops_bf16": -1, "memory_gb": 8, "hbm_gbyte_s": 900}), r"gpu.tflops_bf16: must be > 0, got -1"),
    (_mini(gpu={"name": "X", "tflops_bf16": 1e9, "memory_gb": 8, "hbm_gbyte_s": 900}), r"gpu.tflops_bf16: .*absurdly large.*unit"),
    (_mini(gpu={"name": "X", "tflops_bf16": 10, "memory_gb": 8, "hbm_gbyte_s": 900, "vendor": "acme"}), r"gpu.vendor: unknown vendor"),
    (_mini(gpu={"name": "X", "tflops": 10, "memory_gb": 8, "hbm_gbyte_s": 900}), r"gpu.tflops: unknown key; did you mean 'tflops_bf16'"),
    (_mini(nic={"bandwidth_gbyte_s": 25}), r"nic.bandwidth_gbyte_s: unknown key; did you mean 'bandwidth_gbit_s'"),
    (_mini(intra_node={"bandwidth_gbyte_s": float("nan")}), r"intra_node.bandwidth_gbyte_s: expected a number"),
    (_mini(zone=["a"]), r"nodes\[0\].zone: expected a zone name"),
    (_mini(gpu={"name": "X", "tflops_bf16": 10, "memory_gb": 8, "hbm_gbyte_s": 900, "supports_bf16": "no"}),
     r"gpu.supports_bf16: expected true or false, got 'no'"),
    (_mini(nic={"bandwidth_gbit_s": 25, "rdma": "yes"}), r"nic.rdma: expected true or false, got 'yes'"),
    (_mini() | {"links": [{"zones": ["default"], "bandwidth_gbit_s": 1}]}, r"links\[0\].zones: expected a list of two"),
    (_mini() | {"links": [{"zones": ["default", "default"], "bandwidth_gbit_s": 1}]}, r"two different zones"),
    (_mini() | {"links": {"zones": 1}}, r"x.yaml: links: expected a list"),
    ([1, 2], r"x.yaml: expected a mapping"),
])
def test_bad_cluster_is_one_clear_line(data, match: str) -> None:
    with pytest.raises(SpecError, match=match) as info:
        parse_cluster(data, "x.yaml")
    assert "\n" not in str(info.value)


def test_an_inline_gpu_named_like_a_catalog_gpu_must_have_its_specs() -> None:
    """Outputs per GPU type are keyed by name: an inline 'A100-80GB' with other figures would merge with the
    catalog's. The catalog's own figures inline (another provenance) are the same type and load."""
    other = {"name": "A100-80GB", "tflops_bf16": 1, "memory_gb": 1, "hbm_gbyte_s": 1, "vendor": "nvidia"}
    with pytest.raises(SpecError, match=r"^x.yaml: nodes\[0\].gpu.name: 'A100-80GB' is a catalog GPU with other "
                                        r"specs; rename it or drop the inline specs to use the catalog's$"):
        parse_cluster(_mini(gpu=other), "x.yaml")
    with pytest.raises(SpecError, match=r"nodes\[0\].gpus\[1\].gpu.name: 'A100-80GB' is a catalog GPU"):
        parse_cluster({"name": "mixed", "nodes": [
            {"count": 1, "gpus": [{"gpu": "A100-80GB", "count": 1}, {"gpu": other, "count": 1}],
             "intra_node": "NVLink3", "nic": "IB-HDR"}]}, "x.yaml")
    same = {f: getattr(GPU_CATALOG["A100-80GB"], f) for f in ("name", "tflops_bf16", "tflops_fp32", "memory_gb",
                                                                "hbm_gbyte_s", "vendor", "arch", "tflops_tf32")}
    assert parse_cluster(_mini(gpu=same | {"source": "my notes"}), "x.yaml").devices[0].gpu.memory_gb == 80
    assert parse_cluster(_mini(gpu=other | {"name": "A100-slow"}), "x.yaml").gpu_types == ["A100-slow"]


@pytest.mark.parametrize("text, value", [("1e2", 100.0), ("4.0e+2", 400.0), ("2E1", 20.0), ("25", 25.0)])
def test_numbers_yaml_reads_as_text_are_numbers(tmp_path: Path, text: str, value: float) -> None:
    """YAML 1.1 (PyYAML) reads 1e2 as text; a number field takes any text that is one finite number."""
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nnodes:\n"
                    f"  - {{count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, zone: a, "
                    f"nic: {{bandwidth_gbit_s: {text}}}}}\n"
                    "  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR, zone: b}\n"
                    f"links:\n  - {{zones: [a, b], bandwidth_gbit_s: {text}, latency_us: 500}}\n")
    cluster = load_cluster(path)
    assert cluster.zone_links[0].bandwidth_gbit_s == value and cluster.groups[0].nic.bandwidth_gbit_s == value


@pytest.mark.parametrize("text", ["1e2x", "nan", "inf", "'1e999'", "ten"])
def test_text_that_is_not_one_finite_number_stays_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"name: x\nnodes:\n  - {{count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, "
                    f"nic: {{bandwidth_gbit_s: {text}}}}}\n")
    with pytest.raises(SpecError, match=r"c.yaml: nodes\[0\].nic.bandwidth_gbit_s: expected a number, got '"):
        load_cluster(path)


def test_duplicate_zone_link_is_refused() -> None:
    data = _mini(zone="a")
    data["nodes"].append(dict(data["nodes"][0], zone="b"))
    data["links"] = [{"zones": ["a", "b"], "bandwidth_gbit_s": 1}, {"zones": ["b", "a"], "bandwidth_gbit_s": 2}]
    with pytest.raises(SpecError, match=r"links\[1\]: zones \['b', 'a'\] are linked twice"):
        parse_cluster(data, "x.yaml")


def test_too_many_devices_is_refused() -> None:
    with pytest.raises(SpecError, match=r"nodes: 6400000 devices is more than hetpart handles"):
        parse_cluster(_mini(count=100_000, gpus_per_node=64), "x.yaml")


def test_load_cluster_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"--cluster: unknown cluster 'tiny-mixd'; did you mean 'tiny-mixed'\?"):
        load_cluster("tiny-mixd")
    for path_like in ("nothere.yaml", "nothere.yml", str(tmp_path / "nothere")):
        with pytest.raises(SpecError, match=r"--cluster: '.*nothere(.yaml|.yml)?': no such file; check the path "
                                            r"\(or give a catalog cluster: .*tiny-mixed"):
            load_cluster(path_like)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [\n")
    with pytest.raises(SpecError, match=r"bad.yaml: invalid YAML at line \d+, column \d+"):
        load_cluster(bad)
    with pytest.raises(SpecError, match=r"cannot read the cluster YAML: is a directory"):
        load_cluster(tmp_path)
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo hacked']\nnodes: []\n")
    with pytest.raises(SpecError, match=r"evil.yaml: invalid YAML.*python/object"):
        load_cluster(evil)


def test_module_examples_run() -> None:
    import doctest

    import hetpart.cluster

    assert doctest.testmod(hetpart.cluster).failed == 0


def test_a_link_to_a_zone_without_nodes_is_left_out_with_a_note() -> None:
    """CONTRACT.md's own example links dc1 to dc2, where no group is: it loads; the link carries nothing."""
    from hetpart.costmodel.pools import check_zones_connected
    from hetpart.errors import WorkloadError

    data = _mini(zone="dc1") | {"links": [{"zones": ["dc1", "dc2"], "bandwidth_gbit_s": 10, "latency_us": 500}]}
    cluster = parse_cluster(data, "x.yaml")
    assert cluster.zone_links == () and cluster.zones == ["dc1"] and cluster.num_devices == 4
    assert cluster.unused_links == ("links[0] names zone 'dc2', which no node group is in (did you mean 'dc1'?)",)
    check_zones_connected(cluster)  # one zone: nothing to link
    # a misspelt zone leaves the zones it meant unlinked: the error that says so quotes the left-out link
    typo = {"name": "t", "nodes": [_mini()["nodes"][0] | {"zone": "a"}, _mini()["nodes"][0] | {"zone": "bb"}],
            "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 10}]}
    with pytest.raises(WorkloadError, match=r"zones 'a' and 'bb' have no link.*links\[0\] names zone 'b', which no "
                                            r"node group is in \(did you mean 'bb'\?\)$"):
        check_zones_connected(parse_cluster(typo, "x.yaml"))
