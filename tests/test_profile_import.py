"""Metis' per-layer profiles read as a hetpart profile (``hetpart calibrate --import-metis``): the differential
test (files holding the simulator's own per-unit times predict the same step), the shard and size points, the
bindings, and one clear line for each thing a folder can get wrong."""

from __future__ import annotations

import json

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel import Simulator, megatron_plan
from hetpart.costmodel.compute import unit_compute_s
from hetpart.costmodel.profile import load_profile
from hetpart.costmodel.profile_import import import_metis
from hetpart.errors import SpecError
from hetpart.workload import Workload
from tests._cli import run_cli

CLUSTER = """name: a100-pair
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
  - {count: 1, gpus_per_node: 2, gpu: A100-40GB, intra_node: NVLink3, nic: Ethernet-10}
"""


@pytest.fixture()
def cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    return load_cluster(str(path))


def _model():
    return load_model("gpt2-small", seq_len=64, precision="bf16")


def _write(folder, name, times_ms, optimizer_ms=10.0):
    folder.mkdir(exist_ok=True)
    data = {"model": {"model_name": "GPT", "num_layers": len(times_ms)},
            "execution_time": {"layer_compute_total_ms": list(times_ms), "optimizer_time_ms": optimizer_ms},
            "execution_memory": {"layer_memory_total_mb": [1] * len(times_ms)}}
    (folder / name).write_text(json.dumps(data))


def _analytic_files(folder, model, cluster, sizes=(1, 2, 4)):
    """Metis files holding the simulator's own forward + backward per unit on the A100-80GB, tp 1."""
    gpu = cluster.groups[0].gpu
    for b in sizes:
        fwd, bwd = unit_compute_s(model, gpu, 1, b, "bf16", "none", kernels="fused")  # the simulator's default counts
        _write(folder, f"DeviceType.A100_tp1_bs{b}.json", [(f + w) * 1e3 for f, w in zip(fwd, bwd)])


def test_files_of_the_analytic_times_predict_the_same_step(tmp_path, cluster):
    model = _model()
    _analytic_files(tmp_path / "metis", model, cluster)
    profile = import_metis(tmp_path / "metis", model, cluster, "bf16", {"A100": ["A100-80GB"]})
    assert set(profile.device_types) == {"A100-80GB"} and profile.devices["A100"].kind == "imported"
    plan = megatron_plan(model, cluster, Workload(16, 64, precision="bf16", recompute="none"), tp=1, pp=2, dp=1,
                         micro_batch=2, recompute="none")
    plain = Simulator(model, cluster).simulate(plan)
    imported = Simulator(model, cluster, profile=profile).simulate(plan)
    a100 = [b for b in plain.breakdown if b["gpu"] == "A100-80GB"]
    assert a100, "the plan must use the profiled device type"
    assert [b["compute_s"] for b in imported.breakdown if b["gpu"] == "A100-80GB"] == pytest.approx(
        [b["compute_s"] for b in a100])
    assert imported.provenance["device_types"]["A100-80GB"]["compute"] == "measured"


def test_every_file_is_a_point_of_its_units_curve(tmp_path, cluster):
    model = _model()
    folder = tmp_path / "metis"
    n = model.num_units
    _write(folder, "DeviceType.A100_tp1_bs2.json", [0.6] + [9.0] * (n - 2) + [3.0], optimizer_ms=40.0)
    _write(folder, "DeviceType.A100_tp2_bs2.json", [0.6] + [5.0] * (n - 2) + [0.0], optimizer_ms=20.0)
    profile = import_metis(folder, model, cluster)  # bf16; A100 binds both A100 types by name
    assert set(profile.device_types) == {"A100-80GB", "A100-40GB"}
    blocks = sorted((e for e in profile.compute if e.unit == "block" and e.params == model.units[1].params),
                    key=lambda e: e.fwd_flops)
    half = model.units[1].fwd_flops * 2 / 2  # the tp-2 shard of two sequences
    assert [e.fwd_flops for e in blocks[:1]] == pytest.approx([half])
    tp2 = [e for e in blocks if e.fwd_flops == pytest.approx(half)]
    assert tp2[0].fwd_s + tp2[0].bwd_s == pytest.approx(5e-3) and tp2[0].fwd_s == pytest.approx(5e-3 / 3)
    # the head's 0 ms at tp 2 is not a measurement
    assert len([e for e in profile.compute if e.unit == "head"]) == 1
    # optimizer: 40 ms over every parameter, 20 ms over half of them: 4e-2 / N per parameter either way
    assert profile.devices["A100"].adam_s_per_param == pytest.approx(4e-2 / model.num_params, rel=0.01)


@pytest.mark.parametrize("setup, bind, match", [
    (lambda f: None, None, r"no Metis profile files \(DeviceType.NAME_tpT_bsB.json\) in it"),
    (lambda f: _write(f, "DeviceType.A100_tp1_bs1.json", [1.0] * 5), None,
     r"DeviceType.A100_tp1_bs1.json: execution_time.layer_compute_total_ms: 5 layers, but gpt2-small has 14 units"),
    (lambda f: _write(f, "DeviceType.A100_tp1_bs1.json", [1.0] * 13 + ["x"]), None,
     r"layer_compute_total_ms\[13\]: expected a number"),
    (lambda f: (f / "DeviceType.A100_tp1_bs1.json").write_text("{"), None, r"DeviceType.A100_tp1_bs1.json: invalid JSON"),
    (lambda f: _write(f, "DeviceType.H20_tp1_bs1.json", [1.0] * 14), None,
     r"its device types \(H20\) match none of cluster 'a100-pair'.*--bind H20=A100-40GB"),
    (lambda f: _write(f, "DeviceType.A100_tp1_bs1.json", [1.0] * 14), {"A100": ["V100-16GB"]},
     r"--bind: A100=V100-16GB: 'V100-16GB' is not a device type of cluster 'a100-pair'"),
])
def test_a_bad_folder_is_one_line_naming_the_file_and_field(tmp_path, cluster, setup, bind, match):
    folder = tmp_path / "metis"
    folder.mkdir()
    setup(folder)
    with pytest.raises(SpecError, match=match) as info:
        import_metis(folder, _model(), cluster, "bf16", bind)
    assert "\n" not in str(info.value)


def test_calibrate_imports_a_folder_and_predict_uses_it(tmp_path, cluster, capsys):
    model = _model()
    _analytic_files(tmp_path / "metis", model, cluster, sizes=(2,))
    (tmp_path / "c.yaml").write_text(CLUSTER)
    out = tmp_path / "p.json"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2-small",
                           "--seq-len", "64", "--import-metis", str(tmp_path / "metis"), "--bind", "A100=A100-80GB",
                           "--out", str(out))
    assert code == 0, err
    assert load_profile(out).meta["imported_from"] == "metis"
    code, _, err = run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"),
                           "--global-batch", "8", "--seq-len", "64", "--tp", "1", "--pp", "2", "--dp", "1",
                           "--micro-batch", "2", "--profile", str(out))
    assert code == 0, err
    code, _, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2-small",
                           "--import-metis", str(tmp_path / "metis"), "--bind", "A100", "--out", str(out))
    assert code == 2 and "--bind: 'A100'; give METIS_TYPE=CLUSTER_TYPE pairs" in err
