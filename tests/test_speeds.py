"""``hetpart calibrate --speeds-from``: a throttled device found from the runtime's own timings (issue 17).

An emulated run slows one CPU rank with the emulation's slow-rank mechanism (the run's cluster says
``slow: {"0/0/1": 0.4}``: the rank sleeps 1.5x every compute it measured); calibrate reads only the
record's per-rank timings and FLOPs (never its ``slow:``) and must recover the factor within 0.1,
writing it into a clean copy of the cluster file. The arithmetic is pinned on the same record with
chosen timings.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetpart.plan import Plan, Replica, Stage
from tests._cli import run_cli

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

CLUSTER = """name: pair
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
"""
TRUE_FACTOR = 0.4


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    """One emulated run of an even TP-2 stage whose second device runs at 0.4x."""
    tmp = tmp_path_factory.mktemp("speeds")
    (tmp / "slow.yaml").write_text(CLUSTER + f'slow: {{"0/0/1": {TRUE_FACTOR}}}\n')
    plan = Plan(global_batch=4, micro_batch=2, seq_len=32, schedule="1f1b", replicas=(
        Replica(1.0, (Stage((0, 14), ("0/0/0", "0/0/1"), 2),)),))
    plan.save(tmp / "plan.json")
    # --time-factor 200 dilates only the links (the default, fastest peak / CPU rate, made the TP all-reduces sleep
    # ~3 s a step); the slow rank's compute sleep, which calibrate measures, follows the speed ratio either way
    proc = subprocess.run([sys.executable, "-m", "hetpart.cli.app", "run", str(tmp / "plan.json"), "--model",
                           "gpt2-small", "--cluster", str(tmp / "slow.yaml"), "--steps", "3", "--warmup", "1",
                           "--time-factor", "200",
                           "--out", str(tmp / "runs.jsonl"), "--log-every", "0", "--run-dir", str(tmp / "ranks")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp / "pair.yaml").write_text(CLUSTER)
    return tmp / "runs.jsonl"


@pytest.mark.slow
def test_calibrate_recovers_the_slowed_rank_and_writes_it_into_the_cluster(record: Path, capsys) -> None:
    out = record.parent / "measured.yaml"
    code, text, err = run_cli(capsys, "calibrate", "--cluster", str(record.parent / "pair.yaml"), "--speeds-from",
                              str(record), "--out", str(out), "--json")
    assert code == 0, err
    got = json.loads(text)
    factors = {d["device"]: d["factor"] for d in got["devices"]}
    assert factors["0/0/0"] == 1.0 and factors["0/0/1"] == pytest.approx(TRUE_FACTOR, abs=0.1)
    written = yaml.safe_load(out.read_text())
    assert set(written["slow"]) == {"0/0/1"} and written["nodes"] == yaml.safe_load(CLUSTER)["nodes"]
    from hetpart.cluster import load_cluster

    assert load_cluster(out).device("0/0/1").speed == pytest.approx(TRUE_FACTOR, abs=0.1)


@pytest.mark.slow
def test_factors_are_rates_against_the_fastest_device_of_the_type(record: Path) -> None:
    from hetpart.records import load_records
    from hetpart.runtime.speeds import speed_factors

    rec = load_records(record)[0]
    ranks = rec.measured.ranks
    timed = [dataclasses.replace(ranks[0], measured_compute_s=1.0, emulated_slowdown_s=0.0),
             dataclasses.replace(ranks[1], measured_compute_s=1.0, emulated_slowdown_s=0.25)]
    rec = dataclasses.replace(rec, measured=dataclasses.replace(rec.measured, ranks=tuple(timed)))
    est = speed_factors([("r", rec)], tolerance=0.1)
    assert [d.factor for d in est.devices] == [1.0, pytest.approx(0.8)] and est.slow == {"0/0/1": 0.8}
    assert speed_factors([("r", rec)], tolerance=0.25).slow == {}  # within the noise band: no entry
    old = dataclasses.replace(rec, measured=dataclasses.replace(rec.measured, ranks=tuple(
        dataclasses.replace(r, measured_compute_s=0.0) for r in timed)))
    from hetpart.records import RecordError

    with pytest.raises(RecordError, match=r"measured_compute_s: missing; the record was written before"):
        speed_factors([("old.jsonl:1", old)])


@pytest.mark.slow
def test_a_cluster_without_the_measured_devices_is_refused(record: Path, tmp_path: Path, capsys) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(CLUSTER.replace("gpus_per_node: 2", "gpus_per_node: 1"))
    code, _, err = run_cli(capsys, "calibrate", "--cluster", str(one), "--speeds-from", str(record), "--out",
                           str(tmp_path / "m.yaml"))
    assert code == 2 and "has no device 0/0/1 that the run records measured" in err and len(err.strip().splitlines()) == 1


def test_bad_speeds_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "pair.yaml").write_text(CLUSTER)
    base = ("calibrate", "--cluster", str(tmp_path / "pair.yaml"), "--out", str(tmp_path / "m.yaml"))
    cases = [((*base, "--speeds-from", str(tmp_path / "none.jsonl")), "cannot read the run records: no such file"),
             ((*base, "--speeds-from", str(tmp_path / "pair.yaml"), "--tolerance", "1.5"), "--tolerance: 1.5"),
             (base, "--model: missing")]
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    cases.append(((*base, "--speeds-from", str(tmp_path / "bad.jsonl")), "bad.jsonl:1: invalid JSON"))
    for argv, message in cases:
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not (tmp_path / "m.yaml").exists()
