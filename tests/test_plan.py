"""Plans: JSON round trip, every rule of validate(), interleaved schedules, rendering."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from hetpart import Plan, PlanError, Replica, Stage, load_plan
from hetpart.cluster import parse_cluster
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import compress_device_ids

# 4 blocks -> 6 units (embedding, block_0..3, head); 4 heads.
MODEL = transformer_graph(TransformerConfig("gpt2", 4, 64, 4, 1000, 128), "tiny", seq_len=32)
CLUSTER = parse_cluster({"name": "zoned", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "IB-EDR", "zone": "b"},
    {"count": 1, "gpus_per_node": 2, "gpu": "T4-16GB", "intra_node": "PCIe3", "nic": "Ethernet-10", "zone": "c"},
], "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 10, "latency_us": 500}]}, "zoned.yaml")


def _plan(*replicas: Replica, **kw) -> Plan:
    return Plan(**({"global_batch": 8, "micro_batch": 2, "seq_len": 32, "replicas": replicas} | kw))


def _pipe(share: float, *stages: tuple[tuple[int, int], tuple[str, ...]]) -> Replica:
    return Replica(share, tuple(Stage(layers, devs, len(devs)) for layers, devs in stages))


GOOD = _plan(
    _pipe(0.5, ((0, 3), ("0/0/0", "0/0/1")), ((3, 6), ("0/1/0", "0/1/1"))),
    _pipe(0.5, ((0, 2), ("0/0/2",)), ((2, 6), ("1/0/0",))),
    schedule="1f1b", recompute="selective", meta={"planner": "hand", "model": "tiny"},
)


def _one(problems: list[str], needle: str) -> str:
    hits = [p for p in problems if needle in p]
    assert len(hits) == 1, (needle, problems)
    return hits[0]


def test_good_plan_is_valid() -> None:
    assert GOOD.validate(MODEL, CLUSTER) == []
    GOOD.check(MODEL, CLUSTER)
    assert GOOD.dp == 2 and GOOD.num_devices == 6
    assert GOOD.replica_samples() == [4, 4] and GOOD.num_microbatches(0) == 2
    assert GOOD.replicas[0].pp == 2 and GOOD.replicas[1].devices == ["0/0/2", "1/0/0"]


def test_json_round_trip(tmp_path: Path) -> None:
    data = json.loads(GOOD.to_json())
    for key in ("global_batch", "micro_batch", "seq_len", "schedule", "recompute", "replicas"):
        assert key in data
    assert data["replicas"][0] == {"batch_share": 0.5, "stages": [
        {"layers": [0, 3], "devices": ["0/0/0", "0/0/1"], "tp": 2},
        {"layers": [3, 6], "devices": ["0/1/0", "0/1/1"], "tp": 2}]}
    again = Plan.from_json(GOOD.to_json())
    assert again == GOOD and again.meta == GOOD.meta
    assert Plan.from_dict(GOOD.to_dict()) == GOOD
    path = tmp_path / "plan.json"
    GOOD.save(path)
    assert load_plan(path) == GOOD
    assert load_plan(path).to_dict() == GOOD.to_dict()


def test_minimal_contract_plan_gets_defaults() -> None:
    plan = Plan.from_dict({"global_batch": 4, "micro_batch": 1, "seq_len": 32, "replicas": [
        {"batch_share": 1.0, "stages": [{"layers": [0, 6], "devices": ["0/0/0"]}]}]})
    assert (plan.schedule, plan.recompute, plan.interleave, plan.precision) == ("1f1b", "none", 1, "bf16")
    assert plan.replicas[0].stages[0].tp == 1 and not plan.allow_cross_node_tp
    assert plan.validate(MODEL, CLUSTER) == []


def test_layer_gap_and_overlap_and_short_cover() -> None:
    gap = _plan(_pipe(1.0, ((0, 2), ("0/0/0",)), ((3, 6), ("0/0/1",))))
    assert "leaves a gap" in _one(gap.validate(MODEL, CLUSTER), "stages[1].layers: starts at 3, expected 2")
    overlap = _plan(_pipe(1.0, ((0, 4), ("0/0/0",)), ((2, 6), ("0/0/1",))))
    assert "overlaps the previous stage" in _one(overlap.validate(MODEL, CLUSTER), "starts at 2, expected 4")
    short = _plan(_pipe(1.0, ((0, 5), ("0/0/0",))))
    assert _one(short.validate(MODEL, CLUSTER), "stages cover units [0, 5), but the model has 6 units") == (
        "replicas[0]: stages cover units [0, 5), but the model has 6 units (tiny); every unit must be covered "
        "exactly once")
    empty = _plan(_pipe(1.0, ((0, 0), ("0/0/0",)), ((0, 6), ("0/0/1",))))
    assert _one(empty.validate(MODEL, CLUSTER), "[0, 0) is empty") == "replicas[0].stages[0].layers: [0, 0) is empty"


def test_device_reused_across_replicas_and_stages() -> None:
    plan = _plan(_pipe(0.5, ((0, 6), ("0/0/0",))), _pipe(0.5, ((0, 6), ("0/0/0",))))
    assert _one(plan.validate(MODEL, CLUSTER), "devices 0/0/0 are used more than once") == (
        "devices 0/0/0 are used more than once; a device serves one stage of one replica")
    within = _plan(_pipe(1.0, ((0, 3), ("0/0/0",)), ((3, 6), ("0/0/0",))))
    assert _one(within.validate(MODEL, CLUSTER), "two stages share devices; use schedule 'interleaved'") == (
        "replicas[0].stages: two stages share devices; use schedule 'interleaved' for that")
    twice = _plan(_pipe(1.0, ((0, 6), ("0/0/0", "0/0/0"))))
    assert _one(twice.validate(MODEL, CLUSTER), "stages[0].devices: a device is listed twice") == (
        "replicas[0].stages[0].devices: a device is listed twice")


def test_unknown_device_does_not_hide_other_rules() -> None:
    plan = _plan(_pipe(1.0, ((0, 3), ("0/0/0", "7/0/0")), ((3, 6), ("2/0/0",))))
    problems = plan.validate(MODEL, CLUSTER)
    assert _one(problems, "'7/0/0' does not exist in cluster 'zoned' (12 devices)") == (
        "replicas[0].stages[0].devices: '7/0/0' does not exist in cluster 'zoned' (12 devices)")
    assert _one(problems, "zones 'a' and 'c' have no link") == (
        "replicas[0].stages[1]: zones 'a' and 'c' have no link; add one under 'links'")


def test_tp_must_equal_the_number_of_devices() -> None:
    plan = _plan(Replica(1.0, (Stage((0, 6), ("0/0/0", "0/0/1"), tp=4),)))
    assert _one(plan.validate(MODEL, CLUSTER), "tp: 4 but 2 devices listed; tp must equal the number of devices") == (
        "replicas[0].stages[0].tp: 4 but 2 devices listed; tp must equal the number of devices")


def test_tp_group_across_nodes_unless_allowed() -> None:
    plan = _plan(_pipe(1.0, ((0, 6), ("0/0/0", "0/1/0"))))
    assert _one(plan.validate(MODEL, CLUSTER), "tensor-parallel group spans 2 nodes") == (
        "replicas[0].stages[0].devices: tensor-parallel group spans 2 nodes; keep it inside one node or set "
        "allow_cross_node_tp")
    assert replace(plan, allow_cross_node_tp=True).validate(MODEL, CLUSTER) == []


def test_heads_not_divisible_by_tp() -> None:
    plan = _plan(_pipe(1.0, ((0, 6), ("0/0/0", "0/0/1", "0/0/2"))))
    assert _one(plan.validate(MODEL, CLUSTER), "tp: 3 does not divide the 4 attention heads") == (
        "replicas[0].stages[0].tp: 3 does not divide the 4 attention heads")


def test_shares_must_sum_to_one() -> None:
    plan = _plan(_pipe(0.5, ((0, 6), ("0/0/0",))), _pipe(0.25, ((0, 6), ("0/0/1",))))
    assert _one(plan.validate(MODEL, CLUSTER), "shares sum to 0.75, not 1; rescale them") == (
        "replicas[*].batch_share: shares sum to 0.75, not 1; rescale them")


def test_shares_must_give_whole_micro_batches() -> None:
    # 0.75 x 8 = 6 sequences = 3 micro-batches of 2: fine; 0.25 x 8 = 2: fine; 0.375 x 8 = 3: not.
    assert _plan(_pipe(0.75, ((0, 6), ("0/0/0",))), _pipe(0.25, ((0, 6), ("0/0/1",)))).validate(MODEL, CLUSTER) == []
    odd = _plan(_pipe(0.375, ((0, 6), ("0/0/0",))), _pipe(0.625, ((0, 6), ("0/0/1",))))
    problems = odd.validate(MODEL, CLUSTER)
    assert _one(problems, "3 sequences") == (
        "replicas[0].batch_share: 3 sequences is not a positive multiple of micro_batch 2")
    assert _one(problems, "5 sequences") == (
        "replicas[1].batch_share: 5 sequences is not a positive multiple of micro_batch 2")
    frac = _plan(_pipe(0.3, ((0, 6), ("0/0/0",))), _pipe(0.7, ((0, 6), ("0/0/1",))))
    assert _one(frac.validate(MODEL, CLUSTER), "0.3 x global_batch 8 = 2.4 is not a whole number of sequences") == (
        "replicas[0].batch_share: 0.3 x global_batch 8 = 2.4 is not a whole number of sequences")


def test_zones_without_link_for_pipeline_and_data_parallel() -> None:
    pp = _plan(_pipe(1.0, ((0, 3), ("0/0/0",)), ((3, 6), ("2/0/0",))))
    problems = pp.validate(MODEL, CLUSTER)
    assert _one(problems, "zones 'a' and 'c' have no link") == (
        "replicas[0].stages[1]: zones 'a' and 'c' have no link; add one under 'links'")
    dp = _plan(_pipe(0.5, ((0, 6), ("0/0/0",))), _pipe(0.5, ((0, 6), ("2/0/0",))))
    assert _one(dp.validate(MODEL, CLUSTER), "data-parallel copies in zones 'a' and 'c' must sync gradients") == (
        "replicas: data-parallel copies in zones 'a' and 'c' must sync gradients but the zones have no link; "
        "add one under 'links'")
    # Linked zones a and b are fine for both.
    ok = _plan(_pipe(0.5, ((0, 3), ("0/0/0",)), ((3, 6), ("1/0/0",))), _pipe(0.5, ((0, 6), ("1/0/1",))))
    assert ok.validate(MODEL, CLUSTER) == []


def test_zone_rules_ignore_zones_the_plan_does_not_use() -> None:
    # Zone c has no link at all; a pipeline from b to a never touches it.
    plan = _plan(_pipe(1.0, ((0, 3), ("1/0/0",)), ((3, 6), ("0/0/0",))))
    assert plan.validate(MODEL, CLUSTER) == []


def test_tp_group_across_unlinked_zones_is_reported() -> None:
    plan = _plan(_pipe(1.0, ((0, 6), ("1/0/0", "2/0/0"))), allow_cross_node_tp=True)
    assert _one(plan.validate(MODEL, CLUSTER), "zones 'b' and 'c' must sync gradients but the zones have no link") == (
        "replicas: data-parallel copies in zones 'b' and 'c' must sync gradients but the zones have no link; "
        "add one under 'links'")


def test_validate_lists_every_broken_rule_at_once() -> None:
    bad = _plan(
        Replica(0.5, (Stage((0, 2), ("0/0/0", "0/1/0"), 3), Stage((3, 6), ("2/0/0",), 1))),
        Replica(0.3, (Stage((0, 6), ("0/0/0",), 1),)),
    )
    problems, hits = bad.validate(MODEL, CLUSTER), set()
    for needle in ("shares sum to 0.8", "2.4 is not a whole number", "leaves a gap", "tp: 3 but 2 devices",
                   "used more than once", "spans 2 nodes", "does not divide the 4 attention heads",
                   "zones 'a' and 'c' have no link", "must sync gradients"):
        hits.add(_one(problems, needle))
    assert len(hits) == 9  # nine rules broken, each reported once, none hiding another
    with pytest.raises(PlanError, match=r"^plan.json: replicas\[\*\].batch_share: shares sum to 0.8.*\(\+\d+ more: "):
        bad.check(MODEL, CLUSTER, source="plan.json")


def test_interleaved_rules() -> None:
    a, b = ("0/0/0",), ("0/0/1",)
    stages = [((0, 2), a), ((2, 3), b), ((3, 5), a), ((5, 6), b)]
    good = _plan(_pipe(1.0, *stages), schedule="interleaved", interleave=2)
    assert good.validate(MODEL, CLUSTER) == []
    assert good.replicas[0].pp == 4 and good.num_devices == 2
    wrong = _plan(_pipe(1.0, *stages[:2], ((3, 5), b), ((5, 6), a)), schedule="interleaved", interleave=2)
    assert _one(wrong.validate(MODEL, CLUSTER), "interleaved stage k must run on the devices of stage k mod 2") == (
        "replicas[0].stages: interleaved stage k must run on the devices of stage k mod 2")
    odd = _plan(_pipe(1.0, ((0, 2), a), ((2, 4), b), ((4, 6), a)), schedule="interleaved", interleave=2)
    assert _one(odd.validate(MODEL, CLUSTER), "3 stages is not a multiple of interleave 2") == (
        "replicas[0].stages: 3 stages is not a multiple of interleave 2")
    not_inter = _plan(_pipe(1.0, ((0, 6), a)), interleave=2)
    assert _one(not_inter.validate(MODEL, CLUSTER), "interleave: 2 needs schedule 'interleaved'") == (
        "interleave: 2 needs schedule 'interleaved'")
    # More virtual chunks than stages must be reported, not crash.
    deep = _plan(_pipe(1.0, ((0, 3), a), ((3, 6), b)), schedule="interleaved", interleave=4)
    assert _one(deep.validate(MODEL, CLUSTER), "2 stages is not a multiple of interleave 4") == (
        "replicas[0].stages: 2 stages is not a multiple of interleave 4")


def test_table_renders_every_stage() -> None:
    console = Console(record=True, width=200)
    console.print(GOOD.table(CLUSTER, MODEL))
    text = console.export_text()
    assert "dp=2, micro_batch=2, schedule=1f1b, recompute=selective" in text
    assert "0/0/0-1" in text and "0/1/0-1" in text
    assert "0-2 (embedding..block_1)" in text and "2-5 (block_1..head)" in text
    assert "A100-40GB" in text and "V100-16GB" in text
    assert "0.500" in text
    console = Console(record=True, width=200)
    console.print(GOOD.table())  # without cluster and model
    assert "0/0/2" in console.export_text()


def test_compress_device_ids() -> None:
    assert compress_device_ids(["0/0/0", "0/0/1", "0/0/2", "0/1/0", "1/0/3", "1/0/5"]) == "0/0/0-2,0/1/0,1/0/3,1/0/5"
    assert compress_device_ids([]) == ""
    assert compress_device_ids(["weird"]) == "weird"


@pytest.mark.parametrize("patch, match", [
    ({"schedule": "zigzag"}, r"p.json: schedule: unknown schedule 'zigzag'; use gpipe, 1f1b, interleaved"),
    ({"recompute": "some"}, r"recompute: unknown mode 'some'"),
    ({"precision": "fp4"}, r"precision: unknown precision 'fp4'"),
    ({"optimizer": "lion"}, r"optimizer: unknown optimizer 'lion'; use adam, sgd, adam8bit"),
    ({"attention": "flash"}, r"attention: unknown attention kernel 'flash'; use fused, eager"),
    ({"micro_batch": 0}, r"micro_batch: must be >= 1, got 0"),
    ({"global_batch": "8"}, r"global_batch: expected a whole number, got '8'"),
    ({"replicas": []}, r"replicas: expected a non-empty list"),
    ({"allow_cross_node_tp": "no"}, r"allow_cross_node_tp: expected true or false, got 'no'"),
    ({"interleave": 0}, r"interleave: must be >= 1"),
    ({"colour": 1}, r"p.json: colour: unknown key"),
])
def test_from_dict_errors_name_the_field(patch: dict, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        Plan.from_dict(GOOD.to_dict() | patch, source="p.json")


@pytest.mark.parametrize("stage, match", [
    ({"layers": [0], "devices": ["0/0/0"]}, r"replicas\[0\].stages\[0\].layers: expected \[first, last_exclusive\]"),
    ({"layers": [0, -1], "devices": ["0/0/0"]}, r"layers: expected"),
    ({"layers": [0, 10**9], "devices": ["0/0/0"]}, r"layers: expected .*0 to 1000000"),
    ({"layers": [0, 6], "devices": []}, r"stages\[0\].devices: expected a non-empty list of device ids"),
    ({"layers": [0, 6], "devices": [0]}, r"devices: expected a non-empty list"),
    ({"layers": [0, 6], "devices": ["0/0/0"], "tp": 0}, r"stages\[0\].tp: must be >= 1, got 0"),
    ({"layers": [0, 6]}, r"stages\[0\].devices: missing required field"),
])
def test_stage_errors_name_the_field(stage: dict, match: str) -> None:
    data = {"global_batch": 4, "micro_batch": 1, "seq_len": 32,
            "replicas": [{"batch_share": 1.0, "stages": [stage]}]}
    with pytest.raises(PlanError, match=match):
        Plan.from_dict(data)


def test_batch_share_errors() -> None:
    base = {"global_batch": 4, "micro_batch": 1, "seq_len": 32}
    stage = {"layers": [0, 6], "devices": ["0/0/0"]}
    with pytest.raises(PlanError, match=r"replicas\[0\].batch_share: must be > 0, got 0"):
        Plan.from_dict(base | {"replicas": [{"batch_share": 0, "stages": [stage]}]})
    with pytest.raises(PlanError, match=r"replicas\[0\].batch_share: 1.5 is absurdly large"):
        Plan.from_dict(base | {"replicas": [{"batch_share": 1.5, "stages": [stage]}]})


def test_load_plan_errors(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"missing.json: cannot read the plan: no such file; check the path"):
        load_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"global_batch": 8,')
    with pytest.raises(PlanError, match=r"bad.json: invalid JSON at line 1, column \d+: .*hetpart plan --out"):
        load_plan(bad)


def test_module_examples_run() -> None:
    import doctest

    import hetpart.plan

    result = doctest.testmod(hetpart.plan)
    assert result.attempted > 0 and result.failed == 0


def test_range_overlap_matches_unit_by_unit_reference() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from hetpart.plan import _ranges_overlap

    ranges = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=5)

    @settings(max_examples=200, deadline=None)
    @given(ranges, ranges)
    def check(a, b) -> None:
        units = lambda rs: {u for first, last in rs for u in range(first, last)}  # noqa: E731
        assert _ranges_overlap(a, b) == bool(units(a) & units(b))

    check()
