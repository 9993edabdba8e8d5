"""`calibrate --speeds-from` keeps the cluster's own factor of a device the runs cannot rate (the only one of its
type), and re-measures the others."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hetpart.runtime import speeds
from hetpart.runtime.speeds import DeviceSpeed, SpeedEstimate
from tests._cli import run_cli

LAB = """name: lab
nodes:
  - count: 1
    gpus: [{gpu: RTX4090-24GB, count: 2}, {gpu: RTX3090-24GB, count: 1}]
    intra_node: PCIe4
    nic: Ethernet-10
slow: {"0/0/1": 0.7, "0/0/2": 0.6}
"""


def test_an_unrated_device_keeps_its_factor_and_a_rated_one_is_remeasured(capsys, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "lab.yaml").write_text(LAB)
    (tmp_path / "runs.jsonl").write_text("{}\n")
    estimate = SpeedEstimate(devices=(DeviceSpeed("0/0/0", "RTX4090-24GB", 0.5, 1.0, 1, 2),
                                      DeviceSpeed("0/0/1", "RTX4090-24GB", 0.49, 0.98, 1, 2),
                                      DeviceSpeed("0/0/2", "RTX3090-24GB", 0.2, 1.0, 0, 2)),
                             records=2, tolerance=0.1, slow={}, cluster="lab")
    monkeypatch.setattr(speeds, "speed_factors", lambda records, tolerance, source: estimate)
    monkeypatch.setattr("hetpart.records.iter_records", lambda path: iter([(1, {})]))
    code, out, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "lab.yaml"), "--speeds-from",
                             str(tmp_path / "runs.jsonl"), "--out", str(tmp_path / "measured.yaml"), "--json")
    assert code == 0, err
    written = yaml.safe_load((tmp_path / "measured.yaml").read_text())
    assert written["slow"] == {"0/0/2": 0.6}  # 0/0/1 measured healthy (0.98): its 0.7 goes; 0/0/2 unrated: kept
    assert json.loads(out)["written_slow"] == {"0/0/2": 0.6}
    code, out, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "lab.yaml"), "--speeds-from",
                             str(tmp_path / "runs.jsonl"), "--out", str(tmp_path / "again.yaml"))
    assert code == 0 and "keeps the cluster's 0.6" in out
