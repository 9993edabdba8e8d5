"""Property tests: malformed input at every loader and at the CLI gives one clear HetpartError.

Never another exception, never a traceback, never a hang: every example must finish well inside
the hypothesis deadline. Loading never executes code (``yaml.safe_load`` only).
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpart import (HetpartError, ModelError, Plan, PlanError, SpecError, Workload, WorkloadError, load_cluster,
                     load_model, load_plan)
from hetpart.cli.app import main
from hetpart.cluster import parse_cluster
from hetpart.graph.hf_config import hf_config_to_transformer, read_hf_config
from hetpart.graph.transformer import TransformerConfig, transformer_graph

FUZZ = settings(max_examples=60, deadline=timedelta(seconds=5),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

VALID_CLUSTER = {"name": "ok", "nodes": [
    {"count": 2, "gpus_per_node": 2, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR", "zone": "a"},
    {"count": 1, "gpus_per_node": 2, "gpu": {"name": "X", "tflops_bf16": 100, "memory_gb": 24, "hbm_gbyte_s": 900},
     "intra_node": {"bandwidth_gbyte_s": 32, "latency_us": 5}, "nic": {"bandwidth_gbit_s": 25}, "zone": "b"}],
    "links": [{"zones": ["a", "b"], "bandwidth_gbit_s": 10, "latency_us": 500}]}
VALID_PLAN = {"global_batch": 8, "micro_batch": 2, "seq_len": 32, "schedule": "1f1b", "recompute": "none",
              "replicas": [{"batch_share": 0.5, "stages": [{"layers": [0, 3], "devices": ["0/0/0"], "tp": 1},
                                                           {"layers": [3, 6], "devices": ["0/1/0"], "tp": 1}]},
                           {"batch_share": 0.5, "stages": [{"layers": [0, 6], "devices": ["1/0/0", "1/0/1"]}]}]}
VALID_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 256}
TINY = transformer_graph(TransformerConfig("gpt2", 4, 64, 4, 1000, 128), "tiny", 32)

# Values of every JSON/YAML type, the nasty ones over-represented.
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-10**30, max_value=10**30),
    st.sampled_from([0, -1, 1, 2**63, 10**400, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", " ", "A100-80GB", "NVLink3", "IB-HDR", "0/0/0", "gpipe", "1e3", "\x00", "nan"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=12), inner, max_size=4)),
                      max_leaves=12)


def _paths(data, prefix=()):
    """Every (path, container) position in a nested structure."""
    yield prefix
    if isinstance(data, dict):
        for k, val in data.items():
            yield from _paths(val, prefix + (k,))
    elif isinstance(data, list):
        for i, val in enumerate(data):
            yield from _paths(val, prefix + (i,))


@st.composite
def mutated(draw, valid: dict):
    """``valid`` with one position replaced by junk, deleted, or given an unknown sibling key."""
    data = copy.deepcopy(valid)
    path = draw(st.sampled_from(list(_paths(data))[1:]))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(values)
    else:
        parent.append(draw(values))
    return data


def _one_line(err: HetpartError) -> None:
    text = str(err)
    assert text and "\n" not in text and len(text) < 2000, text


def _expect_clean(fn, *args, errors=HetpartError):
    """Run ``fn``: success, or exactly one clear error of type ``errors``; nothing else escapes."""
    try:
        return fn(*args)
    except errors as err:
        _one_line(err)
        return None


# ------------------------------------------------------------------------------------ clusters


@FUZZ
@given(mutated(VALID_CLUSTER))
def test_parse_cluster_mutations(data) -> None:
    cluster = _expect_clean(parse_cluster, data, "fuzz.yaml", errors=SpecError)
    if cluster is not None:
        assert cluster.num_devices == len(cluster.devices) >= 1


@FUZZ
@given(values)
def test_parse_cluster_any_structure(data) -> None:
    _expect_clean(parse_cluster, data, "fuzz.yaml", errors=SpecError)


@FUZZ
@given(st.one_of(mutated(VALID_CLUSTER).map(yaml.safe_dump), st.text(max_size=200)))
def test_load_cluster_yaml_text(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("c") / "c.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    _expect_clean(load_cluster, path, errors=SpecError)


@FUZZ
@given(st.binary(max_size=300))
def test_load_cluster_binary_garbage(tmp_path_factory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("b") / "garbage.yaml"
    path.write_bytes(blob)
    _expect_clean(load_cluster, path, errors=SpecError)


@FUZZ
@given(st.text(max_size=300).filter(lambda s: not s.startswith("python:")))
def test_load_cluster_any_name(name: str) -> None:
    _expect_clean(load_cluster, name, errors=SpecError)


def test_yaml_never_executes_code(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    for tag in ("!!python/object/apply:os.system", "!!python/object/apply:subprocess.call"):
        path = tmp_path / "evil.yaml"
        path.write_text(f"name: {tag} [['touch', '{marker}']]\nnodes: []\n")
        with pytest.raises(SpecError, match=r"evil.yaml: invalid YAML at line 1.*python/object"):
            load_cluster(path)
    path.write_text("name: !!python/name:os.system\nnodes: []\n")
    with pytest.raises(SpecError, match=r"python/name"):
        load_cluster(path)
    assert not marker.exists()


@pytest.mark.parametrize("text, match", [
    ("[" * 5000 + "]" * 5000, r"(nested too deeply|invalid YAML|expected a mapping \(key: value\), got a list)"),
    ("name: x\nnodes:\n  - count: " + "9" * 5000 + "\n", r"(unreadable value|absurdly large)"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nname: *c\nnodes: *c\n", r"YAML alias at line 2, column \d+: aliases"),
    ("name: x\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: A100-40GB, intra_node: NVLink3, nic: IB-HDR, "
     "nics_per_node: 1e3}\n", r"nics_per_node: expected a whole number, got '1e3'"),
    ("", r"expected a mapping \(key: value\), got an empty value"),
    ("name: x\nnodes:\n  - {count: .inf, gpus_per_node: 1, gpu: A100-40GB, intra_node: NVLink3, nic: IB-HDR}\n",
     r"count: expected a whole number, got inf"),
    ("name: x\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: {name: Y, tflops_bf16: " + "9" * 500
     + ", memory_gb: 8, hbm_gbyte_s: 900}, intra_node: NVLink3, nic: IB-HDR}\n", r"tflops_bf16: 999.*absurdly large"),
])
def test_nasty_yaml_files(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "nasty.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=match) as info:
        load_cluster(path)
    _one_line(info.value)


# --------------------------------------------------------------------------------------- plans


@FUZZ
@given(mutated(VALID_PLAN))
def test_plan_mutations_parse_and_validate_cleanly(data) -> None:
    plan = _expect_clean(Plan.from_dict, data, "fuzz.json", errors=PlanError)
    if plan is not None:
        cluster = parse_cluster(VALID_CLUSTER, "c.yaml")
        problems = plan.validate(TINY, cluster)
        assert all(isinstance(p, str) and "\n" not in p for p in problems)
        assert Plan.from_dict(plan.to_dict()) == plan


@FUZZ
@given(values)
def test_plan_from_dict_any_structure(data) -> None:
    _expect_clean(Plan.from_dict, data, "fuzz.json", errors=PlanError)


@FUZZ
@given(st.one_of(mutated(VALID_PLAN).map(json.dumps), st.text(max_size=200)))
def test_plan_from_json_text(text: str) -> None:
    _expect_clean(Plan.from_json, text, "fuzz.json", errors=PlanError)


@FUZZ
@given(st.binary(max_size=300))
def test_load_plan_binary_garbage(tmp_path_factory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("p") / "plan.json"
    path.write_bytes(blob)
    _expect_clean(load_plan, path, errors=PlanError)


@st.composite
def structurally_valid_plans(draw):
    """Plans that parse but break rules at random: layers, devices, tp, shares, schedules."""
    device = st.sampled_from(["0/0/0", "0/0/1", "0/1/0", "0/1/1", "1/0/0", "1/0/1", "9/9/9", "x"])
    stage = st.fixed_dictionaries({"layers": st.lists(st.integers(0, 10), min_size=2, max_size=2),
                                   "devices": st.lists(device, min_size=1, max_size=3),
                                   "tp": st.integers(1, 4)})
    replica = st.fixed_dictionaries({"batch_share": st.floats(0.01, 1.0),
                                     "stages": st.lists(stage, min_size=1, max_size=4)})
    return {"global_batch": draw(st.integers(1, 64)), "micro_batch": draw(st.integers(1, 8)), "seq_len": 32,
            "schedule": draw(st.sampled_from(["gpipe", "1f1b", "interleaved"])),
            "interleave": draw(st.integers(1, 5)), "allow_cross_node_tp": draw(st.booleans()),
            "replicas": draw(st.lists(replica, min_size=1, max_size=3))}


@FUZZ
@given(structurally_valid_plans())
def test_validate_never_raises(data) -> None:
    plan = Plan.from_dict(data)
    cluster = parse_cluster(VALID_CLUSTER, "c.yaml")
    problems = plan.validate(TINY, cluster)
    assert all(isinstance(p, str) and p and "\n" not in p for p in problems)
    if problems:
        with pytest.raises(PlanError) as info:
            plan.check(TINY, cluster)
        _one_line(info.value)
    else:
        plan.check(TINY, cluster)


def test_huge_and_deep_plans_do_not_hang() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(PlanError, match=r"nested too deeply|invalid JSON"):
        Plan.from_json(deep)
    with pytest.raises(PlanError, match=r"unreadable JSON value"):
        Plan.from_json('{"global_batch": ' + "1" * 5000 + "}")
    wide = {"layers": [0, 10**6], "devices": ["0/0/0"]}
    plan = Plan.from_dict({"global_batch": 2, "micro_batch": 1, "seq_len": 8, "replicas": [
        {"batch_share": 0.5, "stages": [wide] * 200}, {"batch_share": 0.5, "stages": [wide] * 200}]})
    assert len(plan.validate(TINY, parse_cluster(VALID_CLUSTER, "c"))) > 1


# --------------------------------------------------------------------------------------- models


@FUZZ
@given(mutated(VALID_HF))
def test_hf_config_mutations(data) -> None:
    cfg = _expect_clean(hf_config_to_transformer, data, "config.json", errors=ModelError)
    if cfg is not None:
        graph = transformer_graph(cfg, "fuzz", 16)
        assert graph.num_params > 0 and graph.num_units == cfg.num_layers + 2


@FUZZ
@given(values)
def test_hf_config_any_structure(data) -> None:
    _expect_clean(hf_config_to_transformer, data, "config.json", errors=ModelError)


@FUZZ
@given(st.binary(max_size=300))
def test_read_hf_config_binary_garbage(tmp_path_factory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("m") / "config.json"
    path.write_bytes(blob)
    _expect_clean(read_hf_config, path, errors=ModelError)


@FUZZ
@given(st.one_of(st.text(max_size=300), st.sampled_from(["gpt2-small", "llama2-7b", "", ".", "/", "/dev/null"])),
       st.one_of(st.none(), st.integers(-5, 10**8), st.sampled_from([1.5, "128", True])),
       st.sampled_from(["bf16", "fp16", "fp32", "fp8", "", None]))
def test_load_model_arguments(spec: str, seq_len, precision) -> None:
    if isinstance(spec, str) and spec.startswith("python:"):
        return  # user code: an explicit opt-in, tested with the tracer
    graph = _expect_clean(load_model, spec, seq_len, precision, errors=ModelError)
    if graph is not None:
        assert graph.num_units >= 3 and graph.seq_len == (seq_len or graph.seq_len)


def test_absurd_model_sizes_are_refused_quickly() -> None:
    for key, value in (("num_hidden_layers", 10**7), ("hidden_size", 10**8), ("vocab_size", 10**9)):
        with pytest.raises(ModelError, match=rf"{key}: {value} is absurdly large"):
            hf_config_to_transformer(VALID_HF | {key: value}, "big.json")


# ------------------------------------------------------------------------------------- workload


@FUZZ
@given(st.one_of(st.integers(1, 10**4), values), st.one_of(st.integers(1, 10**4), values),
       st.one_of(values, st.sampled_from(["bf16", "fp16", "fp32"])),
       st.one_of(values, st.sampled_from(["none", "selective", "full", "auto"])))
def test_workload_arguments(global_batch, seq_len, precision, recompute) -> None:
    wl = _expect_clean(Workload, global_batch, seq_len, precision, recompute, errors=WorkloadError)
    if wl is not None:
        assert wl.tokens_per_step == global_batch * seq_len >= 1


@pytest.mark.parametrize("kwargs, match", [
    ({"global_batch": 0, "seq_len": 8}, r"--global-batch: must be a whole number >= 1, got 0"),
    ({"global_batch": 8, "seq_len": 10**9}, r"--seq-len: 1000000000 is absurdly large"),
    ({"global_batch": 8, "seq_len": 8, "precision": "int8"}, r"--precision: unknown precision 'int8'"),
    ({"global_batch": 8, "seq_len": 8, "precision": ["bf16"]}, r"--precision: unknown precision \['bf16'\]"),
    ({"global_batch": 8, "seq_len": 8, "recompute": "half"}, r"--recompute: unknown mode 'half'"),
    ({"global_batch": 8, "seq_len": 8, "optimizer": "lamb"}, r"--optimizer: unknown optimizer 'lamb'; use adam, sgd, adam8bit"),
    ({"global_batch": 8, "seq_len": 8, "attention": 1}, r"--attention: unknown attention kernel 1; use fused, eager"),
])
def test_workload_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        Workload(**kwargs)


# ------------------------------------------------------------------------------------------ CLI


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.count("\n") <= 1, err
        assert err == "" or err.startswith("hetpart: error: "), err
    return code, out, err


@FUZZ
@given(st.one_of(mutated(VALID_CLUSTER).map(yaml.safe_dump), st.text(max_size=200)))
def test_cli_inspect_cluster_bad_files(tmp_path_factory, capsys, text: str) -> None:
    path = tmp_path_factory.mktemp("cli") / "cluster.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    code, out, err = _cli(capsys, ["inspect", "cluster", str(path), "--json"])
    if code == 0:
        assert json.loads(out)["num_devices"] >= 1
    else:
        assert str(path) in err


@FUZZ
@given(st.one_of(mutated(VALID_HF).map(json.dumps), st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_cli_inspect_model_bad_configs(tmp_path_factory, capsys, text: str) -> None:
    path = tmp_path_factory.mktemp("cli") / "config.json"
    path.write_bytes(text.encode("utf-8", "replace"))
    code, out, err = _cli(capsys, ["inspect", "model", str(path), "--json", "--seq-len", "64"])
    if code == 0:
        assert json.loads(out)["num_units"] >= 3
    else:
        assert str(path) in err


arg = st.one_of(st.sampled_from(["inspect", "model", "cluster", "models", "clusters", "--json", "--seq-len",
                                 "--precision", "gpt2-small", "tiny-mixed", "0", "-1", "fp8", "bf16", "--", "-x"]),
                st.text(max_size=20).filter(lambda s: not s.startswith("python:") and s not in ("--help", "-h", "--debug")))


@FUZZ
@given(st.lists(arg, max_size=6).filter(lambda a: "--help" not in a))
def test_cli_random_argv(capsys, argv: list[str]) -> None:
    _cli(capsys, argv)


@FUZZ
@given(st.one_of(mutated(VALID_PLAN).map(json.dumps), st.text(max_size=100)))
def test_cli_predict_bad_plans(tmp_path_factory, capsys, text: str) -> None:
    folder = tmp_path_factory.mktemp("predict")
    (folder / "config.json").write_text(json.dumps({"n_embd": 64, "n_layer": 4, "n_head": 4, "vocab_size": 1000,
                                                    "n_positions": 128}))
    (folder / "cluster.yaml").write_text(yaml.safe_dump(VALID_CLUSTER))
    (folder / "plan.json").write_bytes(text.encode("utf-8", "replace"))
    code, out, err = _cli(capsys, ["predict", "--model", str(folder / "config.json"), "--cluster",
                                   str(folder / "cluster.yaml"), "--plan", str(folder / "plan.json"),
                                   "--seq-len", "32", "--global-batch", "8", "--json"])
    if code == 0:
        assert json.loads(out)["metrics"]["step_time_s"] > 0
