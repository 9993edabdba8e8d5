"""Issue 15, inputs and defaults: hardened YAML, unsupported architectures, hub ids, defaults that follow
the model and the devices, errors that name the real source of a value, ``--version``."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
import yaml

from hetpart import _yaml
from hetpart.cluster import load_cluster
from hetpart.errors import ModelError, SpecError
from hetpart.graph import load_model
from tests._cli import cli_json, run_cli

NODE = "{count: 1, gpus_per_node: 1, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}"
BOMB = "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, k in zip([None, "a", "b", "c", "d", "e", "f", "g"], "abcdefgh")) + f"name: *h\nnodes: [{NODE}]\n"


def _error(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("hetpart: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_an_alias_bomb_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # 9^8 = 43 million strings once expanded; its repr took 50-64 s and 3.1 GB
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match=r"bomb.yaml: YAML alias at line 2, column \d+: aliases .* not accepted"):
            load_cluster(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100e6


def test_merge_keys_and_duplicate_keys_are_refused(tmp_path: Path) -> None:
    dup = tmp_path / "dup.yaml"
    dup.write_text(f"name: first\nnodes: [{NODE}]\nname: second\n")
    with pytest.raises(SpecError, match=r"dup.yaml: duplicate key 'name' at line 3, column 1 \(first at line 1"):
        load_cluster(dup)
    nested = tmp_path / "nested.yaml"
    nested.write_text("name: x\nnodes:\n  - {count: 1, count: 2, gpus_per_node: 1, gpu: A100-80GB, intra_node: NVLink3, nic: IB-HDR}\n")
    with pytest.raises(SpecError, match=r"duplicate key 'count'"):
        load_cluster(nested)
    with pytest.raises(SpecError, match=r"merge key '<<'"):
        _yaml.load_yaml_text(SpecError, "base: {count: 1}\nnode:\n  <<: {count: 2}\n", "m.yaml")


def test_size_limits_on_files_and_strings(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: big\nnodes:\n" + f"  - {NODE}\n" * 20_000)  # 1.6 MB: pure-Python parsing ran > 60 s at 10 MB
    with pytest.raises(SpecError, match=r"big.yaml: the cluster YAML is [\d,]+ bytes, more than the 1,048,576 byte limit"):
        load_cluster(big)
    long_name = tmp_path / "name.yaml"
    long_name.write_text("name: " + "x" * 100_000 + f"\nnodes: [{NODE}]\n")
    with pytest.raises(SpecError, match=r"name.yaml: name: 'xxx+\.\.\. has 100,000 characters, more than 256") as info:
        load_cluster(long_name)
    assert len(str(info.value)) < 300  # the value is never echoed whole


def test_the_c_yaml_parser_is_used_where_pyyaml_has_it() -> None:
    assert _yaml._Loader is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert _yaml.load_yaml_text(SpecError, "a: [1, 2]\nb: {c: d}\n", "x") == {"a": [1, 2], "b": {"c": "d"}}


def test_a_mamba_config_is_refused_with_the_supported_types(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 768,
                                "num_hidden_layers": 24, "vocab_size": 50280, "state_size": 16}))
    with pytest.raises(ModelError, match=r"config.json: model_type: 'mamba' \(MambaForCausalLM\) is not supported; "
                                         r"supported model types: gpt2, llama, .*opt, bert"):
        load_model(str(path))
    path.write_text(json.dumps({"hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280, "state_size": 16}))
    with pytest.raises(ModelError, match=r"state_size: a state-space model config is not supported"):
        load_model(str(path))


def test_a_hub_id_says_how_to_point_at_a_config_or_uses_the_local_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelError, match=r"--model: 'acme/tiny-llama' looks like a Hugging Face hub id.*"
                                         r"huggingface-cli download acme/tiny-llama config.json.*--model path/to/config.json"):
        load_model("acme/tiny-llama")
    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256}))
    (tmp_path / "hub" / "models--acme--tiny-llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-llama" / "refs" / "main").write_text("abc123")
    graph = load_model("acme/tiny-llama")
    assert graph.num_units == 4 and graph.seq_len == 256 and graph.source.endswith("abc123/config.json")


def test_a_config_file_names_the_model_by_its_folder_or_its_own_name(tmp_path: Path) -> None:
    cfg = json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256})
    (tmp_path / "tiny-llama").mkdir()
    (tmp_path / "tiny-llama" / "config.json").write_text(cfg)
    (tmp_path / "llama-2.4b.config.json").write_text(cfg)
    (tmp_path / "mine.json").write_text(cfg)
    assert load_model(str(tmp_path / "tiny-llama" / "config.json")).name == "tiny-llama"
    assert load_model(str(tmp_path / "tiny-llama")).name == "tiny-llama"
    assert load_model(str(tmp_path / "llama-2.4b.config.json")).name == "llama-2.4b"
    assert load_model(str(tmp_path / "mine.json")).name == "mine"


def test_a_missing_file_is_not_called_an_unknown_model(capsys, tmp_path: Path) -> None:
    err = _error(capsys, "inspect", "model", str(tmp_path / "nope" / "config.json"))
    assert "no such file" in err and "unknown model" not in err


def test_a_directory_without_config_json_is_not_called_an_unknown_model(capsys, tmp_path: Path) -> None:
    (tmp_path / "emptydir").mkdir()
    err = _error(capsys, "inspect", "model", str(tmp_path / "emptydir"))
    assert f"--model: '{tmp_path / 'emptydir'}': no config.json in this directory; give the directory of a " \
           "Hugging Face model" in err and "unknown model" not in err


def test_plan_with_defaults_follows_the_model_and_the_devices(capsys, tmp_path: Path) -> None:
    # The first thing a newcomer types: --seq-len 2048 used to exceed GPT-2's 1024 positions (exit 2).
    code, out, err = run_cli(capsys, "plan", "-m", "gpt2-small", "-c", "tiny-mixed", "--global-batch", "8")
    assert code == 0, err
    assert "seq 1024 (gpt2-small's own maximum" in out and "fp16 (V100-16GB lack bf16)" in out
    data = cli_json(capsys, "plan", "-m", "gpt2-small", "-c", "a100-8", "--global-batch", "8", "--json")
    assert data["plan"]["seq_len"] == 1024 and data["plan"]["precision"] == "bf16"


def test_precision_defaults_to_what_every_device_supports(capsys, tmp_path: Path) -> None:
    v100 = tmp_path / "v100.yaml"
    v100.write_text("name: v100s\nnodes: [{count: 1, gpus_per_node: 2, gpu: V100-32GB, intra_node: NVLink2, nic: IB-EDR}]\n")
    data = cli_json(capsys, "plan", "-m", "gpt2-small", "-c", str(v100), "--global-batch", "8", "--json")
    assert data["plan"]["precision"] == "fp16"  # bf16 stayed the default on a V100-only cluster
    err = _error(capsys, "plan", "-m", "gpt2-small", "-c", str(v100), "--global-batch", "8", "--precision", "bf16")
    assert "--precision: bf16 is not supported by V100-32GB" in err and "use --precision fp16" in err


def test_errors_name_the_real_source_of_the_value(capsys, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    cli_json(capsys, "plan", "-m", "gpt2-small", "-c", "tiny-mixed", "--global-batch", "8", "--out", str(plan), "--json")
    data = json.loads(plan.read_text())
    data["seq_len"] = 4096
    plan.write_text(json.dumps(data))
    err = _error(capsys, "predict", "--plan", str(plan))
    assert "plan.json: seq_len: 4096 exceeds the 1024 learned positions" in err and "--seq-len" not in err
    err = _error(capsys, "predict", "-m", "gpt2-small", "-c", "tiny-mixed", "--global-batch", "8", "--tp", "1",
                 "--pp", "2", "--dp", "1", "--micro-batch", "1", "--schedule", "interleaved", "--interleave", "-2")
    assert "--interleave: must be a whole number >= 1, got -2" in err and "--pp" not in err
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    err = _error(capsys, "inspect", "cluster", str(empty))
    assert "got an empty value" in err and "NoneType" not in err


def test_version_and_completion(capsys) -> None:
    from hetpart import __version__

    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"hetpart {__version__}"
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "--install-completion" in out


def test_tables_collapse_identical_replicas_and_never_cut_identifiers(capsys) -> None:
    code, out, err = run_cli(capsys, "predict", "-m", "gpt2-small", "-c", "a100-8", "--global-batch", "64", "--tp", "1",
                             "--pp", "1", "--dp", "8", "--micro-batch", "1")
    assert code == 0, err
    rows = [line for line in out.splitlines() if "embedding..head" in line]
    assert len(rows) == 1 and "0-7 (x8)" in rows[0] and "0/0/0-7" in rows[0]  # was 8 rows, one per replica
    assert "8 replicas in 1 group of identical ones (--full lists each)" in out
    code, out, _ = run_cli(capsys, "predict", "-m", "gpt2-small", "-c", "a100-8", "--global-batch", "64", "--tp", "1",
                           "--pp", "1", "--dp", "8", "--micro-batch", "1", "--full")
    assert code == 0 and len([line for line in out.splitlines() if "embedding..head" in line]) == 8
    # Piped output was 80 columns wide and cut names with an ellipsis ("…").
    code, out, _ = run_cli(capsys, "inspect", "model", "llama3-405b")
    assert code == 0 and "…" not in out and "saved bytes/seq (none/sel/full)" in out and "block_0 .. block_125" in out
