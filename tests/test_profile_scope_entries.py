"""A profile's entries price only what they were measured on: a stand-in (this CPU measured for A100s) prices
running the model it measured, all of it or nothing; a device's own entries apply entry by entry; predict and
plan say in one line which applied."""

import json

import pytest

from hetpart import load_cluster
from hetpart.costmodel import Simulator, megatron_plan
from hetpart.costmodel.profile import ComputeEntry, DeviceBinding, DeviceClass, LinkEntry, Profile
from hetpart.workload import Workload
from tests._cli import run_cli
from tests.test_profile_model import CLUSTER, _model, analytic_profile


@pytest.fixture()
def cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    return load_cluster(str(path))


def _cpu(profile: Profile, params_shift: int = 0) -> Profile:
    """``profile`` as this CPU standing in for A100-80GB (slow gloo links, a slow Adam step); its units of
    another model when ``params_shift`` is not 0 (a --scale tiny calibration against the full model)."""
    return Profile(devices={"cpu": DeviceClass("cpu", "cpu", "cpu: test", 1e-8, 1e-3)},
                   device_types={"A100-80GB": DeviceBinding("cpu", stand_in=True)},
                   compute=tuple(ComputeEntry(**{**e.__dict__, "device": "cpu", "precision": "fp32",
                                                 "params": e.params + params_shift, "fwd_s": e.fwd_s * 50,
                                                 "bwd_s": e.bwd_s * 50}) for e in profile.compute),
                   links=tuple(LinkEntry(e.kind, ("cpu", "cpu"), "any", 500.0, 0.2, backend="gloo")
                               for e in profile.links if e.scope == "intra_node"),
                   model={"name": "gpt2-small", "scale": "tiny", "hidden_size": 64, "precision": "fp32"})


def _dp_plan(model, cluster):
    return megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=1, pp=1, dp=4,
                         micro_batch=2, recompute="none")


def test_a_stand_in_of_another_model_prices_nothing(cluster):
    model = _model()
    plan = _dp_plan(model, cluster)
    plain = Simulator(model, cluster).simulate(plan)
    other = Simulator(model, cluster, profile=_cpu(analytic_profile(model, cluster), params_shift=1)).simulate(plan)
    # neither its links (gradient all-reduce) nor its Adam step, beside the A100's analytic compute
    assert other.step_time_s == pytest.approx(plain.step_time_s, rel=1e-12)
    for key in ("compute_s", "dp_comm_s", "optimizer_s"):
        assert other.breakdown[0][key] == pytest.approx(plain.breakdown[0][key], rel=1e-12)
    used = other.provenance["profile"]
    assert used["units"] == {} and used["links"] == [] and used["optimizer"] == []
    assert "measured none of this model's 14 units (it measured gpt2-small, scale tiny, hidden 64, fp32)" \
        in used["not_applied"]["A100-80GB"]
    assert used["summary"].startswith("not used, every term analytic: A100-80GB: cpu stands in for A100-80GB")
    assert other.provenance["links"].endswith("no link entry of the profile applies")
    assert other.provenance["device_types"]["A100-80GB"]["compute"] == "fitted"


def test_a_stand_in_of_this_model_prices_units_links_and_optimizer(cluster):
    model = _model()
    plan = _dp_plan(model, cluster)
    plain = Simulator(model, cluster).simulate(plan)
    same = Simulator(model, cluster, profile=_cpu(analytic_profile(model, cluster))).simulate(plan)
    assert same.breakdown[0]["compute_s"] == pytest.approx(50 * plain.breakdown[0]["compute_s"])
    assert same.breakdown[0]["dp_comm_s"] > 5 * plain.breakdown[0]["dp_comm_s"]  # gloo at 0.2 GB/s
    assert same.breakdown[0]["optimizer_s"] > 10 * plain.breakdown[0]["optimizer_s"]
    used = same.provenance["profile"]
    assert used["units"] == {"A100-80GB": "14 of 14"} and used["links"] == ["A100-80GB"]
    assert used["optimizer"] == ["A100-80GB"] and used["not_applied"] == {}
    assert used["summary"] == ("measured units for A100-80GB (14 of 14); measured links for A100-80GB; "
                               "measured optimizer step for A100-80GB")


def test_a_devices_own_entries_apply_entry_by_entry(cluster):
    """Measured on A100s themselves, of another model: its links and Adam step hold there, its units do not."""
    model = _model()
    plan = _dp_plan(model, cluster)
    base = analytic_profile(model, cluster)
    slow = Profile(devices={"A100": DeviceClass("A100", "imported", "A100 measured", 1e-8, 1e-3)},
                   device_types=base.device_types, links=base.links,
                   compute=tuple(ComputeEntry(**{**e.__dict__, "params": e.params + 1}) for e in base.compute))
    plain = Simulator(model, cluster).simulate(plan)
    got = Simulator(model, cluster, profile=slow).simulate(plan)
    assert got.breakdown[0]["compute_s"] == pytest.approx(plain.breakdown[0]["compute_s"])
    assert got.breakdown[0]["optimizer_s"] > 10 * plain.breakdown[0]["optimizer_s"]
    used = got.provenance["profile"]
    assert used["units"] == {"A100-80GB": "0 of 14"} and used["links"] == ["A100-80GB"]
    assert used["optimizer"] == ["A100-80GB"]
    assert used["summary"] == ("measured links for A100-80GB; measured optimizer step for A100-80GB; analytic "
                               "elsewhere (A100-80GB: no unit of this model measured at bf16)")


def test_predict_and_plan_print_one_line_about_the_profile(tmp_path, capsys, cluster):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    _cpu(analytic_profile(_model(), cluster), params_shift=1).save(tmp_path / "p.json")
    common = ["--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"), "--global-batch", "8", "--seq-len", "64"]
    grid = ["--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "2", "--recompute", "none"]
    code, plain, err = run_cli(capsys, "predict", *common, *grid, "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "predict", *common, *grid, "--profile", str(tmp_path / "p.json"), "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"]["tokens_per_s"] == json.loads(plain)["metrics"]["tokens_per_s"]
    for command in (["predict", *common, *grid], ["plan", *common, "--planner", "uniform"]):
        code, out, err = run_cli(capsys, *command, "--profile", str(tmp_path / "p.json"))
        assert code == 0, err
        lines = [line for line in out.splitlines() if "profile" in line]
        assert len(lines) == 1, out
        assert lines[0].startswith(f"  profile {tmp_path / 'p.json'}: not used, every term analytic: A100-80GB:")
