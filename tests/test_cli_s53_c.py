"""User-journey defects of the CLI found by the probe of 2026-12-01 (helper c of session s53): ``plan --out`` and
``export --out`` replacing a file they did not write (a run-records store, a cluster YAML); a plan of a ``python:``
model found only from the directory it was planned in, and ``python:/path/file.py:FUNCTION`` refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hetpart.records import EXAMPLE_LINE
from tests._cli import cli_json, one_line_exit_2, run_cli

SMALL = ["--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch", "8", "--seq-len", "128",
         "--planner", "uniform", "--no-bound"]
TOY_SOURCE = (Path(__file__).parent / "fixtures" / "toy.py").read_text()
"""A small traced model (tests/fixtures/toy.py), copied into a test's own folder."""


def PY_SMALL(spec: str) -> list[str]:  # noqa: N802 - SMALL's counterpart for a python: model
    return ["--model", spec, "--cluster", "tiny-mixed", "--global-batch", "8", "--planner", "uniform", "--no-bound"]


def _plan(capsys, tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(path))
    assert code == 0, err
    return path


# ----------------------------------------------------------------------------- 1. --out over another file
def test_plan_out_refuses_a_records_store_and_an_unrelated_file(capsys, tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    records.write_text(EXAMPLE_LINE + "\n")
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(records))
    one_line_exit_2(code, err, f"--out: {records} holds hetpart run records", "choose another path")
    assert records.read_text() == EXAMPLE_LINE + "\n"
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("name: mine\nnodes: []\n")
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(cluster))
    one_line_exit_2(code, err, f"--out: {cluster} exists and is not a plan JSON", "move that file away")
    assert cluster.read_text() == "name: mine\nnodes: []\n"


def test_plan_out_replaces_an_earlier_plan_and_an_empty_file(capsys, tmp_path: Path) -> None:
    path = _plan(capsys, tmp_path)
    before = json.loads(path.read_text())
    code, _, err = run_cli(capsys, "plan", *[a if a != "8" else "16" for a in SMALL], "--out", str(path))
    assert code == 0, err
    assert (before["global_batch"], json.loads(path.read_text())["global_batch"]) == (8, 16)
    empty = tmp_path / "empty.json"
    empty.touch()
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(empty))
    assert code == 0 and json.loads(empty.read_text())["global_batch"] == 8, err


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_export_out_replaces_its_own_export_only(capsys, tmp_path: Path, target: str) -> None:
    plan = _plan(capsys, tmp_path)
    out = tmp_path / f"out.{target}"
    code, printed, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(out))
    assert code == 0 and out.read_text() and printed.startswith(out.read_text()), err
    code, _, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(out))  # a rerun replaces it
    assert code == 0, err
    other = {"megatron": "deepspeed", "torchtitan": "megatron", "deepspeed": "torchtitan"}[target]
    code, _, err = run_cli(capsys, "export", str(plan), "--to", other, "--out", str(out))
    one_line_exit_2(code, err, f"--out: {out} exists and is not a {other} export")
    records = tmp_path / "runs.jsonl"
    records.write_text(EXAMPLE_LINE + "\n")
    code, _, err = run_cli(capsys, "export", str(plan), "--to", target, "--out", str(records))
    one_line_exit_2(code, err, f"--out: {records} holds hetpart run records")
    assert records.read_text() == EXAMPLE_LINE + "\n"


# ----------------------------------------------------------------------------- 2. python: models' place
@pytest.fixture
def forget_modules():
    """Names of modules a test imports from its own folder, taken out of ``sys.modules`` after it."""
    names: list[str] = []
    yield names
    for name in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[name]


def test_a_plan_of_a_module_in_the_current_directory_works_from_another(capsys, tmp_path: Path, monkeypatch,
                                                                        forget_modules) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir(), elsewhere.mkdir()
    (here / "s53c_here.py").write_text(TOY_SOURCE)
    forget_modules.append("s53c_here")
    monkeypatch.chdir(here)
    code, _, err = run_cli(capsys, "plan", *PY_SMALL("python:s53c_here:build"), "--out", "plan.json")
    assert code == 0, err
    assert json.loads((here / "plan.json").read_text())["meta"]["model"] == f"python:{here / 's53c_here.py'}:build"
    monkeypatch.chdir(elsewhere)
    del sys.modules["s53c_here"]  # a new process: found again through the plan's path alone
    assert cli_json(capsys, "predict", "--plan", str(here / "plan.json"), "--json")["metrics"]["step_time_s"] > 0
    code, out, err = run_cli(capsys, "show", str(here / "plan.json"))
    assert code == 0 and "replica" in out, err


def test_a_file_spec_imports_the_file_with_its_package(capsys, tmp_path: Path, monkeypatch, forget_modules) -> None:
    package = tmp_path / "proj" / "s53c_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text(TOY_SOURCE)
    (package / "model.py").write_text("from .layers import build  # a relative import: needs the package\n")
    forget_modules.append("s53c_pkg")
    monkeypatch.chdir(tmp_path)
    spec = f"python:{package / 'model.py'}:build"
    code, out, err = run_cli(capsys, "inspect", "model", spec)
    assert code == 0 and "block_1" in out, err
    code, _, err = run_cli(capsys, "plan", *PY_SMALL("python:proj/s53c_pkg/model.py:build"), "--out", "p.json")
    assert code == 0, err  # a relative path is kept absolute
    assert json.loads((tmp_path / "p.json").read_text())["meta"]["model"] == spec


def test_a_file_spec_that_is_missing_or_shadowed_is_one_line(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "inspect", "model", f"python:{tmp_path / 'nope.py'}:build")
    one_line_exit_2(code, err, f"{tmp_path / 'nope.py'}: no such file", "give the .py file")
    code, _, err = run_cli(capsys, "inspect", "model", "python:s53c_nope.py:build")  # no such file: a module name
    one_line_exit_2(code, err, "no module named 's53c_nope'", "or give the file: python:/path/to/file.py:FUNCTION")
    shadowed = tmp_path / "json.py"  # the standard library's json would be imported in its place
    shadowed.write_text(TOY_SOURCE)
    code, _, err = run_cli(capsys, "inspect", "model", f"python:{shadowed}:build")
    one_line_exit_2(code, err, "its module name 'json' is taken by", "rename the file")


# ----------------------------------------------------------------------------- 3. vision-language configs
GEMMA3_TEXT = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
               "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
               "max_position_embeddings": 131072, "sliding_window": 1024, "hidden_activation": "gelu_pytorch_tanh",
               "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
"""google/gemma-3-4b-it's language model (Gemma3TextConfig field names)."""
GEMMA3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
          "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
          "text_config": GEMMA3_TEXT,
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                            "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896,
                            "patch_size": 14, "vision_use_head": False}}
"""Gemma3Config's fields, written by hand after google/gemma-3-4b-it."""
LLAVA_TEXT = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "architectures": ["LlamaForCausalLM"]}
"""llava-1.5-7b's Vicuna language model, with no model_type: LlavaConfig's text_config default is llama."""
LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
         "image_seq_length": 576, "projector_hidden_act": "gelu", "tie_word_embeddings": False,
         "text_config": LLAVA_TEXT,
         "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096,
                           "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336,
                           "patch_size": 14, "projection_dim": 768}}
"""LlavaConfig's fields, written by hand after llava-hf/llava-1.5-7b-hf."""


@pytest.mark.parametrize("whole, text", [(GEMMA3, GEMMA3_TEXT), (LLAVA, LLAVA_TEXT | {"model_type": "llama"})],
                         ids=["gemma3", "llava"])
def test_a_vision_language_config_is_its_text_model(capsys, tmp_path: Path, whole: dict, text: dict) -> None:
    from hetpart.graph.hf_config import hf_config_to_transformer

    with pytest.warns(Warning, match="the vision tower .* and its projector are left out"):
        assert hf_config_to_transformer(whole, "vl.json") == hf_config_to_transformer(text, "text.json")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(whole))
    code, out, err = run_cli(capsys, "inspect", "model", str(path))
    tower = whole["vision_config"]
    assert code == 0 and "block_0" in out, err
    assert (f"hetpart: note: {path}: model_type {whole['model_type']} " in err
            and f"the vision tower ({tower['model_type']}, {tower['num_hidden_layers']} layers)" in err), err


def test_a_vision_language_config_ties_as_the_whole_model_says(capsys) -> None:
    from hetpart.graph.hf_config import hf_config_to_transformer

    with pytest.warns(Warning):
        assert hf_config_to_transformer(LLAVA, "llava.json").tied_embeddings is False  # LlamaConfig's default
        assert hf_config_to_transformer(LLAVA | {"tie_word_embeddings": True}, "llava.json").tied_embeddings is True
        assert hf_config_to_transformer(GEMMA3 | {"tie_word_embeddings": False}, "g.json").tied_embeddings is False


def test_a_vision_language_config_without_its_text_model_is_one_line(capsys, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in GEMMA3.items() if k != "text_config"}))
    code, _, err = run_cli(capsys, "inspect", "model", str(path))
    one_line_exit_2(code, err, f"{path}: text_config: missing: a gemma3 config (Gemma3Config) holds its language "
                               "model there")
    path.write_text(json.dumps(LLAVA | {"text_config": LLAVA_TEXT | {"model_type": "mixtral",
                                                                     "num_local_experts": 8}}))
    code, _, err = run_cli(capsys, "inspect", "model", str(path))
    one_line_exit_2(code, err, f"{path}: text_config: num_local_experts: mixture-of-experts models")


# ----------------------------------------------------------------------------- 4. export warnings, grouped
def _uneven_plan(tmp_path: Path, **fields) -> Path:
    """Four one-GPU replicas of gpt2-small on tiny-mixed, the A100s given 3 of the 8 sequences each."""
    from hetpart.plan import Plan, Replica, Stage

    replicas = tuple(Replica(share, (Stage((0, 14), (device,), 1),))
                     for share, device in ((0.375, "0/0/0"), (0.375, "0/0/1"), (0.125, "1/0/0"), (0.125, "1/0/1")))
    plan = Plan(global_batch=8, micro_batch=1, seq_len=128, replicas=replicas, precision="fp16",
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"}, **fields)
    path = tmp_path / "uneven.json"
    plan.save(path)
    return path


def test_export_warnings_group_equal_shares(capsys, tmp_path: Path) -> None:
    plan = _uneven_plan(tmp_path, zero=1, shard_fractions=(0.375, 0.375, 0.125, 0.125))
    code, _, err = run_cli(capsys, "export", str(plan), "--to", "megatron")
    assert code == 0, err
    assert ("megatron cannot express uneven data-parallel replicas (batch shares 0.375 x2, 0.125 x2): every replica "
            "gets global_batch / dp there") in err
    assert "uneven shards (shard_fractions 0.375 x2, 0.125 x2)" in err
    from hetpart.export import _runs

    assert _runs([0.5, 0.25, 0.25, 0.5, 0.0234, 0.0234]) == "0.500, 0.250 x2, 0.500, 0.023 x2"  # runs keep the order


# ----------------------------------------------------------------------------- 5. DeepSpeed under fp8
def test_deepspeed_export_of_an_fp8_plan_enables_bf16_and_says_why() -> None:
    from hetpart.export import export_plan
    from hetpart.graph import load_model
    from hetpart.plan import Plan, Replica, Stage

    plan = Plan(global_batch=8, micro_batch=1, seq_len=128, precision="fp8",
                replicas=(Replica(1.0, (Stage((0, 14), ("0/0/0",), 1),)),))
    result = export_plan(plan, load_model("gpt2-small", seq_len=128), "deepspeed")
    config = json.loads(result.text)
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert not any("fp8" in p for p in result.cannot_express)
    assert any(n.startswith("precision fp8: the engine runs in bf16 (bf16.enabled) and the matrix multiplies in fp8 "
                            "under Transformer Engine") and "te.fp8_autocast" in n for n in result.notes)


# ----------------------------------------------------------------------------- 6. show --html and cp
def test_show_html_states_the_context_parallel_degree(capsys, tmp_path: Path) -> None:
    from hetpart.plan import Plan, Replica, Stage

    plan = Plan(global_batch=8, micro_batch=1, seq_len=128, cp=2, precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 14), ("0/0/0", "0/0/1"), 1),)),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    path = tmp_path / "cp.json"
    plan.save(path)
    code, out, err = run_cli(capsys, "show", str(path))
    assert code == 0 and "cp=2" in out, err  # what the text view says
    html = tmp_path / "cp.html"
    code, _, err = run_cli(capsys, "show", str(path), "--html", str(html))
    assert code == 0, err
    page = html.read_text()
    assert "precision fp16, context parallel cp 2" in page
    stages = page[page.index('id="stages-table"'):]
    assert "<th>tp</th><th>cp</th></tr>" in stages and "<td class=num>1</td><td class=num>2</td></tr>" in stages


def test_show_outputs_replace_only_their_own_files(capsys, tmp_path: Path) -> None:
    plan = _plan(capsys, tmp_path)
    records = tmp_path / "runs.jsonl"
    records.write_text(EXAMPLE_LINE + "\n")
    code, _, err = run_cli(capsys, "show", str(plan), "--html", str(records))
    one_line_exit_2(code, err, f"--html: {records} holds hetpart run records")
    assert records.read_text() == EXAMPLE_LINE + "\n"
    photo = tmp_path / "photo.png"  # a PNG that matplotlib did not draw (--gantt takes .png, .svg, .pdf only)
    photo.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    code, _, err = run_cli(capsys, "show", str(plan), "--gantt", str(photo))
    one_line_exit_2(code, err, f"--gantt: {photo} exists and is not a chart image")
    assert photo.read_bytes() == b"\x89PNG\r\n\x1a\n" + bytes(64)
    chart, page = tmp_path / "g.svg", tmp_path / "r.html"
    for _ in range(2):  # the second time each replaces its own file
        code, _, err = run_cli(capsys, "show", str(plan), "--gantt", str(chart), "--html", str(page))
        assert code == 0, err
    notes = tmp_path / "notes.html"
    notes.write_text("<!DOCTYPE html>\n<title>my notes</title>\n")
    code, _, err = run_cli(capsys, "show", str(plan), "--html", str(notes))
    one_line_exit_2(code, err, f"--html: {notes} exists and is not an HTML report")


def test_show_gantt_refuses_a_users_own_matplotlib_chart_and_replaces_whitespace(capsys, tmp_path: Path) -> None:
    # Every matplotlib image names matplotlib in its metadata; only hetpart's carry plotting.CHART_MARK (reviewer
    # of s53): a user's own figure is refused, an earlier Gantt chart or a whitespace-only file replaced.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = _plan(capsys, tmp_path)
    for ext in ("png", "svg", "pdf"):
        mine = tmp_path / f"mine.{ext}"
        fig = plt.figure()
        fig.savefig(mine)
        plt.close(fig)
        before = mine.read_bytes()
        assert b"atplotlib" in before  # matplotlib named it: the old test took it for a chart of ours
        code, _, err = run_cli(capsys, "show", str(plan), "--gantt", str(mine))
        one_line_exit_2(code, err, f"--gantt: {mine} exists and is not a chart image")
        assert mine.read_bytes() == before
        blank = tmp_path / f"blank.{ext}"
        blank.write_text(" \n\t\n")
        for _ in range(2):  # whitespace first, then the chart it wrote there
            code, _, err = run_cli(capsys, "show", str(plan), "--gantt", str(blank))
            assert code == 0, err
        assert blank.stat().st_size > 100
    notes = tmp_path / "notes.json"
    notes.write_text("   \n")
    code, _, err = run_cli(capsys, "plan", *SMALL, "--out", str(notes))
    assert code == 0 and json.loads(notes.read_text())["global_batch"] == 8, err
