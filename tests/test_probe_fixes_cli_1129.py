"""Regression tests for a probe of ``loop``, ``calibrate`` and ``costmodel``: bad input is one line naming the
file, field or flag and the fix, exit code 2, refused before anything starts and with no folder left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import forbid, run_cli, one_line_exit_2 as _one_line_exit_2

MIXED = ("name: mix2\nnodes:\n"
         "  - {count: 1, gpus_per_node: 1, gpu: A100-40GB, intra_node: NVLink3, nic: Ethernet-25}\n"
         "  - {count: 1, gpus_per_node: 1, gpu: V100-16GB, intra_node: NVLink2, nic: Ethernet-25}\n")
REWARD = {"architectures": ["LlamaForSequenceClassification"], "model_type": "llama", "hidden_size": 1024,
          "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
          "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "num_labels": 1}
RUNS = Path(__file__).resolve().parents[1] / "experiments" / "data" / "cpu_memory_runs_mmap.jsonl"
"""Stored emulated runs of the catalog's tiny-mixed cluster whose ranks carry their own compute times."""




@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "c3.yaml"
    path.write_text(MIXED)
    return path


@pytest.fixture
def no_loop_run(monkeypatch):
    """Fails the test if the loop gets as far as planning or running anything."""
    import hetpart.runtime.launch as launch
    from hetpart import policies

    forbid(monkeypatch, "the loop started", (launch, "run_plan"), (policies, "plan"))


# ---------------------------------------------------------------------------------------------- loop
def test_loop_ground_real_without_the_clusters_gpus_is_refused(capsys, tmp_path, cluster, monkeypatch, no_loop_run):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    code, _, err = run_cli(capsys, "loop", "--cluster", str(cluster), "--model", "gpt2-small", "--ground", "real",
                           "--out", str(tmp_path / "loop"))
    _one_line_exit_2(code, err, "--ground real", "A100-40GB, V100-16GB", "no CUDA device", "--ground emulated")
    assert not (tmp_path / "loop").exists()


def test_loop_ground_real_checks_the_gpu_types_and_lets_a_cluster_of_cpu_processes_pass(cluster, monkeypatch):
    import torch

    from hetpart.cluster import load_cluster, parse_cluster
    from hetpart.errors import RuntimeFault
    from hetpart.experiments.loop import _check_real_ground

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    with pytest.raises(RuntimeFault, match=r"has 2 CUDA device\(s\) \(NVIDIA H200\); use the default --ground emulated"):
        _check_real_ground(load_cluster(cluster), str(cluster))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: ["NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB"][i])
    _check_real_ground(load_cluster(cluster), str(cluster))  # the cluster's own GPUs: accepted
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cpu = {"name": "cpus", "nodes": [{"count": 1, "gpus_per_node": 2, "intra_node": "NVLink3", "nic": "Ethernet-25",
                                      "gpu": {"name": "cpu-process", "tflops_bf16": 0.1, "tflops_fp32": 0.1,
                                              "memory_gb": 4, "hbm_gbyte_s": 10, "vendor": "other"}}]}
    _check_real_ground(parse_cluster(cpu, source="cpus"), "cpus")  # no GPU named: nothing to refuse


def test_loop_out_that_is_a_file_is_refused(capsys, cluster, no_loop_run):
    code, _, err = run_cli(capsys, "loop", "--cluster", str(cluster), "--model", "gpt2-small", "--out", str(cluster))
    _one_line_exit_2(code, err, f"--out: {cluster} is a file; give a directory")
    assert cluster.read_text() == MIXED


@pytest.mark.parametrize("flags, said", [(("--policy-timesteps", "-1"), "--policy-timesteps: must be a whole number >= 0"),
                                         (("--seq-len", "0"), "--seq-len: must be a whole number >= 1, got 0"),
                                         (("--tracker", "foo"), "--tracker: unknown kind 'foo'"),
                                         (("--model", "REWARD"), "sequence-classification head"),
                                         (("--model", "llama2-7b"), "the loop's runs use hetpart's own GPT")])
def test_loop_bad_input_is_refused_before_any_folder_is_made(capsys, tmp_path, cluster, monkeypatch, no_loop_run,
                                                             flags, said):
    (tmp_path / "reward.json").write_text(json.dumps(REWARD))
    flags = tuple(str(tmp_path / "reward.json") if f == "REWARD" else f for f in flags)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in ((), ("--out", str(tmp_path / "given"))):  # the default runs/loop/... and a given --out
        code, _, err = run_cli(capsys, "loop", "--cluster", str(cluster), "--model", "gpt2-small", *out, *flags)
        _one_line_exit_2(code, err, said)
        assert not any(work.iterdir()) and not (tmp_path / "given").exists()


# ----------------------------------------------------------------------------------------- calibrate
def test_calibrate_refuses_run_records_of_another_cluster(capsys, tmp_path):
    records = tmp_path / "runs.jsonl"
    records.write_text(RUNS.read_text().splitlines()[0] + "\n")
    other = tmp_path / "other.yaml"
    other.write_text("name: othercluster\nnodes:\n"
                     "  - {count: 2, gpus_per_node: 2, gpu: T4-16GB, intra_node: PCIe4, nic: Ethernet-25}\n")
    out = tmp_path / "x.yaml"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", str(other), "--speeds-from", str(records), "--out", str(out))
    _one_line_exit_2(code, err, f"--speeds-from: {records}", "cluster 'tiny-mixed'", f"--cluster {other}",
                     "'othercluster'", "T4-16GB", "A100-40GB")
    assert not out.exists()


def test_calibrate_refuses_records_of_two_clusters(capsys, tmp_path):
    first, second = RUNS.read_text().splitlines()[:2]
    renamed = json.loads(second)
    renamed["cluster"]["name"] = "mix3"
    records = tmp_path / "runs.jsonl"
    records.write_text(first + "\n" + json.dumps(renamed) + "\n")
    out = tmp_path / "x.yaml"
    code, _, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", str(records), "--out",
                           str(out))
    line = _one_line_exit_2(code, err, f"{records}:2: a run of cluster 'mix3'", f"{records}:1 is one of 'tiny-mixed'",
                            "give the records of one cluster")
    assert line.startswith("hetpart: error: ") and not out.exists()


def test_calibrate_says_when_a_factor_rests_on_a_single_record(capsys, tmp_path):
    records = tmp_path / "runs.jsonl"
    # records 4 and 5 are data-parallel (1-3 a pipeline, whose stages' different work rates no device)
    records.write_text(RUNS.read_text().splitlines()[3] + "\n")
    out = tmp_path / "x.yaml"
    code, text, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", str(records), "--out",
                              str(out), "--json")
    assert code == 0, err
    got = json.loads(text)
    assert got["records_cluster"] == "tiny-mixed" and all(d["runs"] == 1 for d in got["devices"])
    assert got["notes"] and "single run record" in got["notes"][0]
    assert "hetpart: note:" in err and "can mark a healthy GPU slow" in err
    records.write_text("".join(RUNS.read_text().splitlines(keepends=True)[3:5]))  # two runs: no note
    code, text, err = run_cli(capsys, "calibrate", "--cluster", "tiny-mixed", "--speeds-from", str(records), "--out",
                              str(out), "--json")
    assert code == 0, err
    assert json.loads(text)["notes"] == [] and "note" not in err


@pytest.mark.parametrize("scale", ["3", "70000"])
def test_calibrate_scale_out_of_range_names_scale(capsys, tmp_path, cluster, scale):
    code, _, err = run_cli(capsys, "calibrate", "--cluster", str(cluster), "--model", "gpt2-small", "--out",
                           str(tmp_path / "p.json"), "--scale", scale)
    line = _one_line_exit_2(code, err, f"--scale: {scale} is outside 8..65536; give tiny, small or a hidden size")
    assert "--hidden-size" not in line and not (tmp_path / "p.json").exists()


# ----------------------------------------------------------------------------------------- costmodel
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A real data set (no val scenario), a head trained on it and a file of another kind."""
    from tests._cli import main

    tmp = tmp_path_factory.mktemp("costmodel")
    assert main(["costmodel", "dataset", "--out", str(tmp / "ds.pt"), "--scenarios", "4", "--plans-per-scenario", "4",
                 "--max-devices", "8", "--json"]) == 0
    assert main(["costmodel", "train-closed", "--dataset", str(tmp / "ds.pt"), "--out", str(tmp / "head.npz"),
                 "--epochs", "1", "--json"]) == 0
    (tmp / "some.json").write_text('{"a": 1}\n')
    (tmp / "tr.yaml").write_text("epochs: 1\n")
    return {"ds": tmp / "ds.pt", "head": tmp / "head.npz", "json": tmp / "some.json", "config": tmp / "tr.yaml"}


@pytest.mark.parametrize("args, said", [
    ("evaluate --dataset {json}", "{json}: not a data set written by 'hetpart costmodel dataset'"),
    ("evaluate --dataset {head}", "{head}: not a data set written by 'hetpart costmodel dataset'"),
    ("evaluate --dataset {ds} --checkpoint {json}", "--checkpoint: {json}: not a checkpoint written by 'hetpart costmodel train'"),
    ("evaluate --dataset {ds} --checkpoint {head}", "--checkpoint: {head}: not a checkpoint written by 'hetpart costmodel train'"),
    ("train-closed --dataset {json} --out {new}", "{json}: not a data set written by 'hetpart costmodel dataset'"),
    ("train --config {config} --dataset {json} --out {new}", "{json}: not a data set written by"),
    ("train --config {config} --dataset {ds} --out {json}",
     "--out: {json} exists and is not a checkpoint written by 'hetpart costmodel train'")])
def test_costmodel_wrong_files_are_named(capsys, tmp_path, files, args, said):
    names = {k: str(v) for k, v in files.items()} | {"new": str(tmp_path / "new.out")}
    code, _, err = run_cli(capsys, "costmodel", *args.format(**names).split())
    _one_line_exit_2(code, err, said.format(**names))
    assert not (tmp_path / "new.out").exists()


def test_closed_head_loader_names_a_wrong_file(files):
    from hetpart.costmodel.learned.closed import load_head
    from hetpart.errors import SpecError

    for wrong in (files["json"], files["ds"]):
        with pytest.raises(SpecError, match="not a head written by 'hetpart costmodel train-closed'"):
            load_head(wrong)
    head, meta = load_head(files["head"])
    assert head.w and meta["epochs"] == 1


def _strict(text: str) -> dict:
    def refuse(constant: str):
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _empty(split: dict) -> None:
    assert split["scenarios"] == 0 and split["plans"] == 0
    assert all(split[k] is None for k in ("error_pct_mean", "error_pct_p90", "tau_mean", "tau_std", "top1_regret_pct"))


def test_costmodel_reports_are_json_and_an_empty_split_shows_nothing(capsys, tmp_path, files):
    code, text, err = run_cli(capsys, "costmodel", "train-closed", "--dataset", str(files["ds"]), "--out",
                              str(tmp_path / "h.npz"), "--epochs", "1", "--json")
    assert code == 0, err
    got = _strict(text)
    _empty(got["report"]["val"])
    _empty(got["report"]["composition_only"]["val"])
    code, text, err = run_cli(capsys, "costmodel", "evaluate", "--dataset", str(files["ds"]), "--json")
    assert code == 0, err
    got = _strict(text)
    _empty(got["report"]["val"])
    assert got["report"]["train"]["plans"] > 0 and got["report"]["train"]["error_pct_mean"] is not None
    code, text, err = run_cli(capsys, "costmodel", "evaluate", "--dataset", str(files["ds"]))
    assert code == 0, err
    val = next(line for line in text.splitlines() if " val " in line)
    assert [c.strip() for c in val.strip("│ ").split("│")][:4] == ["val", "0", "0", "-"]
    code, text, err = run_cli(capsys, "costmodel", "train", "--config", str(files["config"]), "--dataset",
                              str(files["ds"]), "--out", str(tmp_path / "s.pt"), "--tracker", "null", "--device",
                              "cpu", "--json")
    assert code == 0, err
    _empty(_strict(text)["report"]["val"])


@pytest.mark.parametrize("planners, bad", [("foo", "foo"), ("uniform,bogus,proportional", "bogus")])
def test_costmodel_dataset_refuses_unknown_planners(capsys, tmp_path, planners, bad):
    out = tmp_path / "ds.pt"
    code, _, err = run_cli(capsys, "costmodel", "dataset", "--out", str(out), "--scenarios", "2", "--planners", planners)
    _one_line_exit_2(code, err, f"--planners: unknown planner {bad!r}", "uniform, proportional, search")
    assert not out.exists()
