"""A policy checkpoint records the feature version and names it was trained on; one of other features, or one that
records none, is refused in one line naming the file, what differs and the fix (probe e, finding 7: a width change was
refused with a cut torch message, a same-width change loaded silently)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from hetpart.errors import SpecError
from hetpart.policies.gnn import check_features, checkpoint_features, checkpoint_digest, load_network, network_path
from hetpart.policies.observation import CONTEXT_FEATURES, FEATURE_VERSION, feature_record
from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT, load_policy


def _with_features(tmp_path: Path, change) -> Path:
    """A copy of the shipped checkpoint (its weights unchanged) whose recorded features ``change(record)`` edits
    (returning None removes the record, as a checkpoint written before 2026-12-01 has none)."""
    path = tmp_path / "policy.zip"
    with zipfile.ZipFile(DEFAULT_CHECKPOINT) as z, zipfile.ZipFile(path, "w") as out:
        for info in z.infolist():
            raw = z.read(info.filename)
            if info.filename == "data":
                data = json.loads(raw)
                extractor = data["policy_kwargs"]["features_extractor_kwargs"]
                record = change(json.loads(json.dumps(extractor["features"])))
                if record is None:
                    del extractor["features"]
                else:
                    extractor["features"] = record
                raw = json.dumps(data, indent=4).encode()
            out.writestr(info, raw, compress_type=info.compress_type)
    return path


def test_the_shipped_checkpoint_and_its_network_file_record_todays_features():
    assert feature_record()["version"] == FEATURE_VERSION == 1
    assert feature_record()["context"] == list(CONTEXT_FEATURES) and len(feature_record()["units"]) > 0
    assert checkpoint_features(DEFAULT_CHECKPOINT) == (True, feature_record())
    net = load_network(network_path(DEFAULT_CHECKPOINT), checkpoint_digest(DEFAULT_CHECKPOINT))
    assert net is not None and net.features == feature_record()
    check_features(DEFAULT_CHECKPOINT)  # passes: no exception


def test_the_same_width_with_features_in_another_order_is_refused(tmp_path):
    def swap(record):
        record["context"][0], record["context"][1] = record["context"][1], record["context"][0]
        return record

    path = _with_features(tmp_path, swap)
    with pytest.raises(SpecError, match=r"^policy checkpoint: .*policy.zip was trained on other features than this "
                                        r"hetpart's \(context features \(the same names in another order\)\); retrain "
                                        r"with 'hetpart train-policy --config experiments/configs/policy.yaml'"):
        load_policy(str(path))


def test_a_renamed_feature_and_another_version_are_named(tmp_path):
    def rename(record):
        record["version"] = 0
        record["units"][0] = "old_name"
        return record

    path = _with_features(tmp_path, rename)
    new = feature_record()["units"][0]
    with pytest.raises(SpecError) as info:
        check_features(path)
    message = str(info.value)
    assert "feature version 0, this hetpart's is 1" in message
    assert f"units features (trained with old_name, gone here; new here: {new})" in message
    assert "\n" not in message


def test_a_checkpoint_that_records_no_features_is_refused_and_says_why(tmp_path):
    path = _with_features(tmp_path, lambda record: None)
    assert checkpoint_features(path) == (True, None)
    with pytest.raises(SpecError, match=r"policy.zip records no feature version or names \(written before policy "
                                        r"checkpoints recorded them, 2026-12-01\).*retrain with 'hetpart train-policy"):
        load_policy(str(path))


def test_the_cli_refuses_it_in_one_line_with_exit_code_2(tmp_path, capsys):
    from hetpart.cli.app import main

    def widen(record):
        record["units"].append("new_feature")
        return record

    path = _with_features(tmp_path, widen)
    code = main(["plan", "-m", "gpt2-small", "-c", "tiny-mixed", "--planner", "policy",
                 "--policy-checkpoint", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "was trained on other features than this hetpart's (units features (trained with new_feature, gone " \
           "here)); retrain with 'hetpart train-policy" in err


def test_resuming_training_from_a_checkpoint_of_other_features_is_refused(tmp_path):
    from hetpart.experiments.train_policy import checkpoint_settings

    path = _with_features(tmp_path, lambda record: None)
    with pytest.raises(SpecError, match=r"^resume: .*policy.zip records no feature version or names .*; train a new "
                                        r"policy \(leave resume out\)$"):
        checkpoint_settings(str(path))
    shutil.copy(DEFAULT_CHECKPOINT, tmp_path / "ok.zip")
    assert checkpoint_settings(str(tmp_path / "ok.zip"))["hidden"] == 64


def test_a_new_training_run_records_the_features_in_both_files(tmp_path):
    from hetpart.experiments.train_policy import PolicyTrainConfig, train_policy

    cfg = PolicyTrainConfig(experiment="policy/features", out=str(tmp_path / "p.zip"), tracker="null",
                            runs_dir=str(tmp_path / "runs"), imitation_scenarios=0, timesteps=8, n_envs=1, n_steps=4,
                            batch_size=4, n_epochs=1, hidden=8, max_devices=8, checkpoint_every=10**6,
                            progress_bar=False)
    out = Path(train_policy(cfg)["checkpoint"])
    assert checkpoint_features(out) == (True, feature_record())
    net = load_network(network_path(out), checkpoint_digest(out))
    assert net is not None and net.features == feature_record()
    assert load_policy(str(out)).hidden == 8


def test_a_network_file_whose_weights_do_not_fit_is_ignored_and_rewritten_from_the_checkpoint(tmp_path):
    """The probe's case: ``unit_in.weight`` widened in the network file (its digest still the checkpoint's) failed
    with torch's size-mismatch text, cut mid-shape; the file is a cache of the checkpoint, so it is read instead."""
    import torch

    checkpoint = tmp_path / "policy.zip"
    shutil.copy(DEFAULT_CHECKPOINT, checkpoint)
    shutil.copy(network_path(DEFAULT_CHECKPOINT), network_path(checkpoint))
    data = torch.load(network_path(checkpoint), weights_only=True)
    weight = data["state_dict"]["unit_in.weight"]
    data["state_dict"]["unit_in.weight"] = torch.cat([weight, weight[:, :1]], dim=1)
    torch.save(data, network_path(checkpoint))
    assert load_network(network_path(checkpoint), checkpoint_digest(checkpoint)) is None
    net = load_policy(str(checkpoint))
    assert tuple(net.unit_in.weight.shape) == tuple(weight.shape)
    again = load_network(network_path(checkpoint), checkpoint_digest(checkpoint))  # rewritten by load_policy
    assert again is not None and torch.equal(again.unit_in.weight, weight)
