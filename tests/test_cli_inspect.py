"""`hetpart models`, `clusters`, `inspect model|cluster` and the CLI's error behaviour."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetpart import load_cluster, load_model
from hetpart.catalog.models import MODEL_CATALOG
from hetpart.cli.app import main
from hetpart.cluster import cluster_catalog

REPO = Path(__file__).resolve().parents[1]


from tests._cli import cli_json as _json, run_cli as _run  # noqa: E402


def test_models_lists_the_catalog(capsys) -> None:
    data = _json(capsys, "models", "--json")
    names = [m["name"] for m in data["models"]]
    assert names == list(MODEL_CATALOG)
    llama = next(m for m in data["models"] if m["name"] == "llama2-7b")
    assert llama["num_params"] == load_model("llama2-7b").num_params and llama["num_units"] == 34
    code, out, _ = _run(capsys, "models")
    assert code == 0 and "gpt3-175b" in out and "175B" in out and "G " not in out


def test_clusters_lists_bundled_clusters_and_hardware(capsys) -> None:
    data = _json(capsys, "clusters", "--json")
    assert sorted(c["name"] for c in data["clusters"]) == sorted(cluster_catalog())
    assert data["gpus"]["H100-80GB"]["tflops_bf16"] == 989
    assert "NVLink4" in data["intra_node_links"] and "IB-NDR" in data["nics"]
    code, out, _ = _run(capsys, "clusters")
    assert code == 0 and "tiny-mixed" in out and "MI300X-192GB" in out and "Ethernet-10" in out


def test_inspect_model_json(capsys) -> None:
    data = _json(capsys, "inspect", "model", "gpt2-small", "--json", "--seq-len", "512")
    graph = load_model("gpt2-small", seq_len=512)
    assert data["num_params"] == graph.num_params == 124439808
    assert data["num_units"] == 14 == len(data["units"])
    assert [u["name"] for u in data["units"]] == ["embedding"] + [f"block_{i}" for i in range(12)] + ["head"]
    for row, unit in zip(data["units"], graph.units):
        assert row["fwd_flops"] == unit.fwd_flops and row["params"] == unit.params
    assert data["seq_len"] == 512 and sum(u["params"] for u in data["units"]) == data["num_params"]


def test_inspect_model_from_config_json(capsys, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 128}))
    data = _json(capsys, "inspect", "model", str(path), "--json")
    assert data["num_units"] == 4 and data["seq_len"] == 128 and data["source"] == str(path)


def test_inspect_model_table_groups_identical_blocks(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps at 80 columns when it sees no terminal
    code, out, _ = _run(capsys, "inspect", "model", "llama2-7b", "--seq-len", "1024")
    assert code == 0
    assert "llama2-7b: 6.74B parameters, 34 units, seq_len 1024" in out
    assert "block_0 .. block_31 (x32)" in out


def test_inspect_cluster_json_in_file_order(capsys, tmp_path: Path) -> None:
    path = tmp_path / "order.yaml"
    path.write_text("name: order\nnodes:\n"
                    "  - {count: 1, gpus_per_node: 4, gpu: V100-16GB, intra_node: NVLink2, nic: IB-EDR}\n"
                    "  - {count: 2, gpus_per_node: 8, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR}\n"
                    "  - {count: 1, gpus_per_node: 2, gpu: A100-40GB, intra_node: PCIe4, nic: IB-HDR}\n")
    data = _json(capsys, "inspect", "cluster", str(path), "--json")
    assert data["num_devices"] == 4 + 16 + 2
    groups = data["node_groups"]
    assert [(g["gpu"], g["count"], g["gpus_per_node"]) for g in groups] == \
        [("V100-16GB", 1, 4), ("H100-80GB", 2, 8), ("A100-40GB", 1, 2)]
    assert [g["device_ids"] for g in groups] == ["0/0/0 .. 0/0/3", "1/0/0 .. 1/1/7", "2/0/0 .. 2/0/1"]
    cluster = load_cluster(path)
    assert cluster.device("1/1/7").gpu.name == "H100-80GB"


def test_inspect_cluster_table(capsys) -> None:
    code, out, _ = _run(capsys, "inspect", "cluster", "h100-a100-two-zones")
    assert code == 0
    assert "32 devices" in out and "H100-80GB" in out and "A100-80GB" in out
    assert "link east <-> west: 100 Gbit/s, 2000 us" in out


@pytest.mark.parametrize("argv, match", [
    (["inspect", "model", "gpt2-smal"], "hetpart: error: --model: unknown model 'gpt2-smal'; did you mean 'gpt2-small'?"),
    (["inspect", "cluster", "nowhere.yaml"], "hetpart: error: --cluster: 'nowhere.yaml': no such file; check the path"),
    (["inspect", "cluster", "nowhere"], "hetpart: error: --cluster: unknown cluster 'nowhere'"),
    (["inspect", "model", "gpt2-small", "--seq-len", "0"], "hetpart: error: --seq-len: must be a whole number"),
    (["inspect", "model", "gpt2-small", "--seq-len", "x"], "hetpart: error: hetpart inspect model: Invalid value for '--seq-len'"),
    (["inspect", "model", "gpt2-small", "--precision", "fp4"], "hetpart: error: --precision: unknown precision 'fp4'"),
    (["inspect", "model"], "hetpart: error: hetpart inspect model: Missing argument 'model'"),
    (["frobnicate"], "hetpart: error: No such command 'frobnicate'"),
])
def test_errors_are_one_line_and_exit_2(capsys, argv: list[str], match: str) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert err.startswith(match), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_bad_cluster_file_names_file_and_field(capsys, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes:\n  - {count: 2, gpus_per_node: 8, gpu: A100-90GB, intra_node: NVLink3, nic: IB-HDR}\n")
    code, _, err = _run(capsys, "inspect", "cluster", str(path), "--json")
    assert code == 2
    assert err.strip() == (f"hetpart: error: {path}: nodes[0].gpu: unknown GPU 'A100-90GB'; did you mean "
                           "'A100-80GB'? known: " + err.split("known: ", 1)[1].strip())
    assert "(or give it inline)" in err


def test_no_command_prints_help_and_exits_2(capsys) -> None:
    code, out, err = _run(capsys)
    assert code == 2 and "inspect" in out and err == ""


def test_debug_shows_the_exception_in_process() -> None:
    from hetpart import ModelError

    with pytest.raises(ModelError, match="unknown model 'nope'"):
        main(["--debug", "inspect", "model", "nope"])
    with pytest.raises(ModelError, match="unknown model 'nope'"):
        main(["inspect", "model", "nope", "--debug"])  # accepted anywhere on the line


@pytest.mark.parametrize("debug", [False, True])
def test_traceback_only_with_debug(debug: bool) -> None:
    argv = [sys.executable, "-m", "hetpart"] + (["--debug"] if debug else []) + ["inspect", "cluster", "nope"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert ("Traceback (most recent call last)" in proc.stderr) == debug
    assert "unknown cluster 'nope'" in proc.stderr
    if debug:
        assert proc.returncode == 1
    else:
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
