"""Run records (hetpart.records) and the lossless cluster writer they rest on.

The records of real runs (written by ``hetpart run --out``, reloaded, re-predicted exactly) are tested
in tests/test_runtime_run.py beside the run that writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hetpart.cluster import cluster_catalog, cluster_to_dict, load_cluster, parse_cluster
from hetpart.records import EXAMPLE_LINE, SCHEMA, RecordError, RunRecord, load_records
from tests._cli import run_cli

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = [d for d in (REPO / "shared" / "scenarios", REPO.parent / "shared" / "scenarios",
                         REPO / "experiments" / "suites" / "public") if d.is_dir()]  # the repo's copy: a fresh clone

INLINE = """
name: inline-everything
nodes:
  - count: 2
    gpus_per_node: 4
    gpu: {name: X1, tflops_bf16: 123.5, memory_gb: 40, hbm_gbyte_s: 1555, vendor: amd, supports_bf16: false}
    intra_node: {bandwidth_gbyte_s: 64, latency_us: 3.5}
    nic: {bandwidth_gbit_s: 25, latency_us: 12, rdma: true, name: my-nic}
    nics_per_node: 2
    zone: east
  - {count: 1, gpus_per_node: 8, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR, zone: west}
links:
  - {zones: [east, west], bandwidth_gbit_s: 10, latency_us: 750}
"""


def _roundtrip(cluster):
    """The cluster read back from its dict through YAML and JSON (each equal to it, provenance included)."""
    data = cluster_to_dict(cluster)
    again = parse_cluster(yaml.safe_load(yaml.safe_dump(data)), "<yaml>")  # through YAML text, too
    assert again == cluster
    assert parse_cluster(json.loads(json.dumps(data)), "<json>") == cluster
    for a, b in zip(again.groups, cluster.groups):  # provenance included (dataclass equality checks it)
        assert (a.gpu.source, a.intra_node.source, a.nic.source) == (b.gpu.source, b.intra_node.source, b.nic.source)
    return again


@pytest.mark.parametrize("name", sorted(cluster_catalog()))
def test_every_catalog_cluster_round_trips(name: str) -> None:
    _roundtrip(load_cluster(name))
    assert isinstance(cluster_to_dict(load_cluster(name))["nodes"][0]["gpu"], str)  # catalog parts by name


def test_inline_parts_zones_and_links_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(INLINE)
    cluster = load_cluster(path)
    _roundtrip(cluster)
    data = cluster_to_dict(cluster)
    assert data["nodes"][0]["gpu"]["tflops_fp32"] == pytest.approx(123.5 / 8)
    assert data["nodes"][0]["gpu"]["source"] == f"inline in {path}" and data["nodes"][1]["gpu"] == "H100-80GB"
    assert data["links"] == [{"zones": ["east", "west"], "bandwidth_gbit_s": 10.0, "latency_us": 750.0}]


def test_an_emulated_cluster_round_trips_with_its_gpus_inline() -> None:
    from hetpart.plan import Plan, Replica, Stage
    from hetpart.runtime.emulation import emulated_cluster

    real = load_cluster("a100-v100-16")
    plan = Plan(global_batch=2, micro_batch=1, seq_len=32, replicas=(
        Replica(1.0, (Stage((0, 3), ("0/0/0", "0/0/1"), 2), Stage((3, 14), ("1/0/0",)))),))
    emu = emulated_cluster(real, plan, 0.0123456789, 31234.5, 1.7)
    _roundtrip(emu)
    assert cluster_to_dict(emu)["nodes"][1]["gpu"]["name"] == "emu-V100-16GB"


@pytest.mark.skipif(not SCENARIOS, reason="shared/scenarios is not next to this checkout")
def test_every_public_scenario_round_trips() -> None:
    files = sorted(p for p in SCENARIOS[0].glob("*.yaml") if p.name != "suite.yaml")
    assert files
    for path in files:
        _roundtrip(load_cluster(path))


# ----------------------------------------------------------------------------------- records
def _example() -> dict:
    return json.loads(EXAMPLE_LINE)


def test_a_record_round_trips_through_json() -> None:
    rec = RunRecord.from_dict(_example(), "<x>")
    assert RunRecord.from_dict(json.loads(rec.to_json()), "<x>") == rec
    assert rec.schema == SCHEMA and rec.measured.step_times_s == (1.5,) and rec.environment.devices == ("cpu",)


def test_load_records_reads_every_line_and_skips_blank_ones(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(EXAMPLE_LINE + "\n\n" + EXAMPLE_LINE + "\n")
    assert len(load_records(path)) == 2


@pytest.mark.parametrize("edit,match", [
    (lambda d: d["measured"].update(step_time_s="x"),
     r"runs\.jsonl:2: measured\.step_time_s: expected a number, got 'x'"),
    (lambda d: d["measured"].pop("losses"), r"runs\.jsonl:2: measured\.losses: missing required field"),
    (lambda d: d.update(schema="hetpart.run/1"), r"runs\.jsonl:2: schema: 'hetpart.run/1' is not 'hetpart.run/2'"),
    (lambda d: d["measured"]["ranks"].append({"rank": 0}), r"runs\.jsonl:2: measured\.ranks\[0\]\.device: missing"),
    (lambda d: d.update(emulated="yes"), r"runs\.jsonl:2: emulated: expected true or false, got 'yes'"),
    (lambda d: d.update(colour=1), r"runs\.jsonl:2: colour: unknown key"),
    (lambda d: d["environment"].update(devices="cpu"), r"runs\.jsonl:2: environment\.devices: expected a list"),
])
def test_a_bad_record_names_the_file_line_and_field(tmp_path: Path, edit, match: str) -> None:
    bad = _example()
    edit(bad)
    path = tmp_path / "runs.jsonl"
    path.write_text(EXAMPLE_LINE + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=match):
        load_records(path)


def test_unreadable_record_files_give_one_clear_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(EXAMPLE_LINE + "\n{not json\n")
    with pytest.raises(RecordError, match=r"runs\.jsonl:2: invalid JSON at column 2"):
        load_records(path)
    with pytest.raises(RecordError, match=r"missing\.jsonl: cannot read the run records: no such file"):
        load_records(tmp_path / "missing.jsonl")
    with pytest.raises(RecordError, match="is a directory"):
        load_records(tmp_path)
    code, out, err = run_cli(capsys, "predict", "--records", str(path), "--json")
    assert code == 2 and "runs.jsonl:2: invalid JSON" in err and "Traceback" not in err


# ----------------------------------------------------------------------------------- properties
from hypothesis import given  # noqa: E402

from tests.test_bad_input import FUZZ, VALID_CLUSTER, _one_line, mutated  # noqa: E402


@FUZZ
@given(mutated(VALID_CLUSTER))
def test_every_cluster_the_loader_accepts_round_trips(data) -> None:
    from hetpart.errors import SpecError

    try:
        cluster = parse_cluster(data, "<fuzz>")
    except SpecError as err:
        _one_line(err)
        assert "\n" not in str(err)  # refused in one line
        return
    assert _roundtrip(cluster) == cluster


@FUZZ
@given(mutated(json.loads(EXAMPLE_LINE)))
def test_a_mutated_record_loads_or_names_its_field(data) -> None:
    try:
        rec = RunRecord.from_dict(data, "runs.jsonl:1")
    except RecordError as err:
        _one_line(err)
        assert str(err).startswith("runs.jsonl:1")
        return
    text = rec.to_json()
    again = RunRecord.from_dict(json.loads(text))
    assert again == rec or "NaN" in text  # NaN != NaN: such a record round-trips, but compares unequal


def test_docstring_examples_run() -> None:
    import doctest

    import hetpart.records

    result = doctest.testmod(hetpart.records)
    assert result.attempted >= 2 and result.failed == 0
