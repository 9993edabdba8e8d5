"""predict --predictor learned says in its text which model priced the plan: the learned one with its spread,
or the simulator and why (the JSON's metrics.priced_by and priced_by_reason)."""

import json

from hetpart.cli.plan_cmd import _priced_by_line
from tests._cli import run_cli

CLUSTER = """name: two-nodes
nodes:
  - {count: 2, gpus_per_node: 4, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}
"""


def _predict(capsys, tmp_path, *extra):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    return run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"),
                   "--global-batch", "32", "--seq-len", "256", "--tp", "1", "--pp", "2", "--dp", "4",
                   "--micro-batch", "2", "--predictor", "learned", *extra)


def test_a_zero_plan_says_the_simulator_priced_it_and_why(tmp_path, capsys):
    code, out, err = _predict(capsys, tmp_path, "--zero", "1", "--json")
    assert code == 0, err
    metrics = json.loads(out)["metrics"]
    assert metrics["priced_by"] == "simulator"
    assert metrics["priced_by_reason"] == "the learned model does not compose ZeRO 1 sharding"
    code, out, err = _predict(capsys, tmp_path, "--zero", "1")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "priced by" in line]
    assert len(lines) == 1
    assert lines[0].startswith("  priced by: the simulator (the learned model does not compose ZeRO 1 sharding); "
                               "the simulator's compute error band -4.0% to +4.9%")


def test_a_plan_the_learned_model_priced_shows_its_spread(tmp_path, capsys):
    code, out, err = _predict(capsys, tmp_path, "--json")
    assert code == 0, err
    metrics = json.loads(out)["metrics"]
    assert metrics["priced_by"] == "learned" and "priced_by_reason" not in metrics
    std = metrics["uncertainty"]["relative_std"]
    code, out, err = _predict(capsys, tmp_path)
    assert code == 0, err
    lines = [line for line in out.splitlines() if "priced by" in line]
    u = metrics["uncertainty"]
    assert lines == [f"  priced by: learned (relative std {std * 100:.2f}%); measured step likely "
                     f"{u['step_time_s_low']:.3f}-{u['step_time_s_high']:.3f} s"]


def test_out_of_distribution_names_its_reasons():
    metrics = {"priced_by": "learned", "uncertainty": {
        "relative_std": 0.25, "out_of_distribution": True,
        "out_of_distribution_reasons": ["P100-16GB: device type absent from the training data"]}}
    assert _priced_by_line(metrics, "learned") == ("  priced by: learned (relative std 25.00%); out of distribution: "
                                                   "P100-16GB: device type absent from the training data")
    assert _priced_by_line({"step_time_s": 1.0}, "simulator") is None  # the simulator's own answer
