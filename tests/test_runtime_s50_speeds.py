"""``calibrate --speeds-from`` rates a device only against devices of its type that ran the same work.

Probe B item 11: two runs of a pipeline whose healthy RTX 4090s held different stages (blocks only, and
blocks with the head) wrote ``slow: {0/0/0: 0.55}``: the stages' efficiencies differ, not the GPUs. The
rates here are chosen; the arithmetic and the grouping are what is pinned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hetpart.plan import Plan, Replica, Stage, TPSplit
from hetpart.runtime import speeds
from tests._cli import run_cli

LAB = """name: lab
nodes:
  - count: 1
    gpus: [{gpu: RTX4090-24GB, count: 2}, {gpu: RTX3090-24GB, count: 2}]
    intra_node: PCIe4
    nic: Ethernet-10
slow: {"0/0/3": 0.6}
"""

# probe B's p4 shape: 3090s in an uneven TP-2 stage, then one 4090 per stage
PIPELINE = Plan(global_batch=16, micro_batch=1, seq_len=32, schedule="1f1b", replicas=(Replica(1.0, (
    Stage((0, 5), ("0/0/2", "0/0/3"), 2, TPSplit(heads=(5, 3), ffn=(162, 94))),
    Stage((5, 13), ("0/0/0",)), Stage((13, 18), ("0/0/1",)))),))
# every device a data-parallel replica of the whole model, uneven shares
REPLICAS = Plan(global_batch=16, micro_batch=1, seq_len=32, schedule="1f1b", replicas=tuple(
    Replica(share, (Stage((0, 18), (d,)),)) for share, d in
    ((0.3, "0/0/0"), (0.3, "0/0/1"), (0.2, "0/0/2"), (0.2, "0/0/3"))))


@dataclass(frozen=True)
class _Record:
    """What speed_factors reads of a run record, besides the rates."""

    plan: Plan
    rates: dict[str, float]
    cluster: dict = None  # type: ignore[assignment]

    def run_plan(self, source: str = "") -> Plan:
        return self.plan


@pytest.fixture
def fake_rates(monkeypatch):
    monkeypatch.setattr(speeds, "_rank_rates", lambda record, plan, source: record.rates)


def _rec(plan: Plan, **rates: float) -> _Record:
    return _Record(plan, {k.replace("_", "/"): v for k, v in rates.items()}, yaml.safe_load(LAB))


def test_pipeline_stages_of_one_type_rate_nobody(fake_rates) -> None:
    recs = [(f"r:{i}", _rec(PIPELINE, **{"0_0_0": a, "0_0_1": 1.0, "0_0_2": 0.5, "0_0_3": b}))
            for i, (a, b) in enumerate(((0.52, 0.19), (0.57, 0.18)))]
    est = speeds.speed_factors(recs)
    assert est.slow == {}
    assert [(d.device, d.compared_with, d.unrated) for d in est.devices] == [
        ("0/0/0", 0, "unlike_work"), ("0/0/1", 0, "unlike_work"), ("0/0/2", 0, "unlike_work"),
        ("0/0/3", 0, "unlike_work")]


def test_replicas_rate_each_device_against_its_type(fake_rates) -> None:
    recs = [("r:1", _rec(REPLICAS, **{"0_0_0": 1.0, "0_0_1": 0.98, "0_0_2": 0.5, "0_0_3": 0.3}))]
    est = speeds.speed_factors(recs)
    assert est.slow == {"0/0/3": 0.6}
    assert [(d.device, d.compared_with, d.unrated) for d in est.devices] == [
        ("0/0/0", 1, ""), ("0/0/1", 1, ""), ("0/0/2", 1, ""), ("0/0/3", 1, "")]


def test_only_the_records_that_rate_a_device_count(fake_rates) -> None:
    # the pipeline record would give 0/0/0 0.5; only the replicas record rates it (0.95: healthy)
    recs = [("r:1", _rec(PIPELINE, **{"0_0_0": 0.5, "0_0_1": 1.0, "0_0_2": 0.5, "0_0_3": 0.2})),
            ("r:2", _rec(REPLICAS, **{"0_0_0": 0.95, "0_0_1": 1.0, "0_0_2": 0.5, "0_0_3": 0.3}))]
    est = speeds.speed_factors(recs)
    by = {d.device: d for d in est.devices}
    assert by["0/0/0"].factor == pytest.approx(0.95) and by["0/0/0"].runs == 1
    assert by["0/0/3"].factor == pytest.approx(0.6) and est.slow == {"0/0/3": 0.6}


def test_an_even_tp_group_rates_but_an_uneven_one_does_not(fake_rates) -> None:
    even = Plan(global_batch=4, micro_batch=1, seq_len=32, schedule="1f1b", replicas=(Replica(1.0, (
        Stage((0, 18), ("0/0/2", "0/0/3"), 2),)),))
    uneven = Plan(global_batch=4, micro_batch=1, seq_len=32, schedule="1f1b", replicas=(Replica(1.0, (
        Stage((0, 18), ("0/0/2", "0/0/3"), 2, TPSplit(heads=(5, 3), ffn=(162, 94))),)),))
    assert speeds.speed_factors([("r:1", _rec(even, **{"0_0_2": 1.0, "0_0_3": 0.5}))]).slow == {"0/0/3": 0.5}
    assert speeds.speed_factors([("r:1", _rec(uneven, **{"0_0_2": 1.0, "0_0_3": 0.5}))]).slow == {}


def test_calibrate_writes_no_factor_it_cannot_support_and_says_so(fake_rates, monkeypatch, capsys,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(LAB)
    (tmp_path / "runs.jsonl").write_text("{}\n")
    recs = [_rec(PIPELINE, **{"0_0_0": 0.55, "0_0_1": 1.0, "0_0_2": 0.5, "0_0_3": 0.18}) for _ in range(2)]
    monkeypatch.setattr("hetpart.records.iter_records", lambda path: iter(enumerate(recs, 1)))
    out = tmp_path / "measured.yaml"
    code, text, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "lab.yaml"), "--speeds-from",
                              str(tmp_path / "runs.jsonl"), "--out", str(out))
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["slow"] == {"0/0/3": 0.6}  # the cluster's own entry, nothing measured
    notes = [line for line in err.splitlines() if line.startswith("hetpart: note:")]
    assert len(notes) == 1 and "0/0/0, 0/0/1, 0/0/2, 0/0/3: in every record the other devices of their type ran " \
        "other work" in notes[0] and "not rated, no factor written" in notes[0]
    assert "0/0/0 RTX4090-24GB" in text and "ran other work than its type's other devices: no factor" in text
