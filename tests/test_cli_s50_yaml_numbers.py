"""Training configs read by YAML 1.1 (PyYAML): ``1e-3`` (a float without a dot) arrives as a string and is taken
as the number it reads as; anything else in a float setting is one line naming the file and key (exit 2);
train-policy's ``tracker: null`` is the null tracker."""

from __future__ import annotations

import pytest

from tests._cli import cli_json, forbid, run_cli, one_line_exit_2 as _one_line_exit_2




@pytest.fixture
def fake_policy_training(monkeypatch):
    """train-policy returns the settings it was given instead of training."""
    import hetpart.experiments.train_policy as tp

    def train_policy(cfg, replace_shipped=False):
        return {"learning_rate": cfg.learning_rate, "ent_coef": cfg.ent_coef, "tracker": cfg.tracker}

    monkeypatch.setattr(tp, "train_policy", train_policy)


@pytest.fixture
def fake_surrogate_training(monkeypatch):
    """costmodel train records the config it was given; no data set is read and nothing is trained."""
    import hetpart.costmodel.learned.dataset as dataset
    import hetpart.costmodel.learned.train as train

    seen = []
    monkeypatch.setattr(dataset, "load_dataset", lambda path: ({}, []))
    monkeypatch.setattr(train, "train", lambda cfg, records, **_: seen.append(cfg) or (None, {}))
    return seen


def _policy_config(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(f"out: {tmp_path / 'pol.zip'}\nruns_dir: {tmp_path / 'runs'}\n{text}")
    return path


@pytest.mark.parametrize("text, rate", [("1e-3", 0.001), ("3E-4", 0.0003), ("0.002", 0.002), ("1", 1.0)])
def test_train_policy_takes_a_learning_rate_yaml_reads_as_text(capsys, tmp_path, fake_policy_training, text, rate):
    config = _policy_config(tmp_path, f"learning_rate: {text}\n")
    got = cli_json(capsys, "train-policy", "--config", str(config), "--json")
    assert got["learning_rate"] == rate


def test_train_policy_takes_tracker_null(capsys, tmp_path, fake_policy_training):
    config = _policy_config(tmp_path, "tracker: null\n")
    got = cli_json(capsys, "train-policy", "--config", str(config), "--json")
    assert got["tracker"] == "null"


@pytest.mark.parametrize("text", ["fast", "nan", "true", "[0.1]", "1e999"])
def test_train_policy_refuses_a_float_setting_that_is_no_number(capsys, tmp_path, monkeypatch, text):
    import hetpart.experiments.train_policy as tp

    forbid(monkeypatch, "training started", (tp, "train_policy"))
    config = _policy_config(tmp_path, f"ent_coef: {text}\n")
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    assert _one_line_exit_2(code, err, f"{config}: ent_coef: expected a number, got", "the default is ent_coef: 0.01").startswith("hetpart: error: ")


def test_train_policy_still_refuses_a_non_positive_learning_rate_in_text(capsys, tmp_path, monkeypatch):
    import hetpart.experiments.train_policy as tp

    forbid(monkeypatch, "training started", (tp, "train_policy"))
    config = _policy_config(tmp_path, "learning_rate: -1e-3\n")
    code, _, err = run_cli(capsys, "train-policy", "--config", str(config))
    assert _one_line_exit_2(code, err, f"{config}: learning_rate: must be > 0, got -0.001").startswith("hetpart: error: ")


@pytest.mark.parametrize("text, lr", [("3e-3", 0.003), ("1E-2", 0.01), ("0.5", 0.5), ("2", 2.0)])
def test_costmodel_train_takes_an_lr_yaml_reads_as_text(capsys, tmp_path, fake_surrogate_training, text, lr):
    config = tmp_path / "tc.yaml"
    config.write_text(f"lr: {text}\nrank_weight: 1e-1\nout: {tmp_path / 's.pt'}\n")
    cli_json(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null", "--device", "cpu", "--json")
    assert [cfg.lr for cfg in fake_surrogate_training] == [lr]
    assert fake_surrogate_training[0].rank_weight == 0.1


@pytest.mark.parametrize("text", ["fast", "null", "true", "inf-ish"])
def test_costmodel_train_refuses_an_lr_that_is_no_number_naming_file_and_key(capsys, tmp_path,
                                                                            fake_surrogate_training, text):
    config = tmp_path / "tc.yaml"
    config.write_text(f"lr: {text}\nout: {tmp_path / 's.pt'}\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null")
    assert _one_line_exit_2(code, err, f"{config}: lr: expected a number, got", "the default is lr: 0.003").startswith("hetpart: error: ")
    assert fake_surrogate_training == []


def test_costmodel_train_range_errors_name_the_config_file(capsys, tmp_path, fake_surrogate_training):
    config = tmp_path / "tc.yaml"
    config.write_text(f"lr: -3e-3\nout: {tmp_path / 's.pt'}\n")
    code, _, err = run_cli(capsys, "costmodel", "train", "--config", str(config), "--tracker", "null")
    assert _one_line_exit_2(code, err, f"{config}: lr: expected a positive number, got -0.003").startswith("hetpart: error: ")
    assert "train config:" not in err and fake_surrogate_training == []
