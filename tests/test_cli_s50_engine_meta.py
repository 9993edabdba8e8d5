"""A plan file keeps the engine options that priced it (``meta.engine``), and ``show`` and ``predict --plan`` price it
with them: a plan made with ``--overlap-p2p --no-overlap-grad-reduce --op-counts measured`` was shown 3% faster
than ``plan`` had printed (the user-journey probe of 2026-12-01)."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cli import cli_json, run_cli

CLUSTER = """name: pair
nodes:
  - {count: 2, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
"""
OPTIONS = ["--overlap-p2p", "--no-overlap-grad-reduce", "--op-counts", "measured"]


def _plan(capsys, tmp_path: Path, *extra: str) -> tuple[Path, float]:
    (tmp_path / "c.yaml").write_text(CLUSTER)
    out = tmp_path / "p.json"
    got = cli_json(capsys, "plan", "--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"), "--global-batch", "16",
                   "--seq-len", "256", "--no-bound", "--out", str(out), *extra, "--json")
    return out, got["metrics"]["tokens_per_s"]


def test_show_and_predict_price_a_plan_with_the_options_that_made_it(capsys, tmp_path: Path) -> None:
    out, planned = _plan(capsys, tmp_path, *OPTIONS)
    assert json.loads(out.read_text())["meta"]["engine"] == {"op_counts": "measured", "overlap_p2p": True,
                                                             "overlap_grad_reduce": False}
    shown = cli_json(capsys, "show", str(out), "--json")["metrics"]["tokens_per_s"]
    predicted = cli_json(capsys, "predict", "--plan", str(out), "--json")["metrics"]["tokens_per_s"]
    assert shown == predicted == planned
    plain = cli_json(capsys, "predict", "--plan", str(out), "--op-counts", "engine", "--json")["metrics"]
    assert plain["tokens_per_s"] != planned  # a flag given prices it over the recorded option (the others stay)


def test_a_plan_made_with_the_defaults_records_none(capsys, tmp_path: Path) -> None:
    out, planned = _plan(capsys, tmp_path)
    assert "engine" not in json.loads(out.read_text())["meta"]
    assert cli_json(capsys, "show", str(out), "--json")["metrics"]["tokens_per_s"] == planned


def test_a_hand_edited_engine_entry_is_one_line(capsys, tmp_path: Path) -> None:
    out, _ = _plan(capsys, tmp_path, *OPTIONS)
    plan = json.loads(out.read_text())
    plan["meta"]["engine"] = {"op_counts": "fast"}
    out.write_text(json.dumps(plan))
    code, stdout, err = run_cli(capsys, "show", str(out))
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert "meta.engine.op_counts: 'fast' is not an engine option hetpart plan writes" in err


def test_a_plan_on_an_edited_cluster_file_is_priced_with_a_note(capsys, tmp_path: Path) -> None:
    """The plan names its cluster by path; an edit to that file re-prices the plan on the new cluster (a what-if),
    now with one note that it differs from the one planned on (it was silent: A100s turned T4s, 114,733 -> 25,003)."""
    out, planned = _plan(capsys, tmp_path)
    code, _, err = run_cli(capsys, "show", str(out))
    assert code == 0 and "note" not in err
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("A100-80GB", "A100-40GB"))
    for argv in (["show", str(out)], ["predict", "--plan", str(out)], ["export", str(out), "--to", "megatron"]):
        code, _, err = run_cli(capsys, *argv)
        assert code == 0 and err.count(f"{out} was planned on cluster") == 1, (argv, err)


def test_a_sharding_level_a_one_replica_plan_cannot_keep_is_noted(capsys, tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("name: one\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: A100-80GB, "
                                       "intra_node: NVLink3, nic: Ethernet-10}\n")
    code, out, err = run_cli(capsys, "plan", "--model", "gpt2-small", "--cluster", str(tmp_path / "one.yaml"),
                             "--global-batch", "8", "--seq-len", "256", "--no-bound", "--zero", "3", "--json")
    assert code == 0 and json.loads(out)["plan"]["zero"] == 0
    assert "--zero 3: the plan has one replica, nothing to shard the states over; it keeps zero: 0" in err
