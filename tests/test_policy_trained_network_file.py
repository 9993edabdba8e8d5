"""train-policy writes the decoding network beside its checkpoint, so planning with a fresh checkpoint needs no SB3."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from hetpart.cli.app import main
from hetpart.policies.gnn import checkpoint_digest, load_network, network_path

TINY = {"experiment": "policy/tiny", "runs_dir": "runs", "tracker": "tensorboard", "imitation_scenarios": 1,
        "imitation_epochs": 1, "imitation_max_devices": 8, "timesteps": 8, "n_envs": 1, "n_steps": 4,
        "batch_size": 4, "max_devices": 8, "checkpoint_every": 4, "progress_bar": False, "hidden": 8}


def test_train_policy_writes_the_network_file_of_its_checkpoint(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY | {"out": "out/mine.zip"}))
    assert main(["train-policy", "--config", "tiny.yaml", "--json"]) == 0
    checkpoint = tmp_path / "out" / "mine.zip"
    assert network_path(checkpoint) == tmp_path / "out" / "mine.net.pt"
    net = load_network(network_path(checkpoint), checkpoint_digest(checkpoint))
    assert net is not None and net.hidden == 8  # taken from this very checkpoint (its SHA-256)

    from sb3_contrib import MaskablePPO

    from hetpart.policies.gnn import PointerPolicy, network_of

    sb3 = network_of(MaskablePPO.load(checkpoint, device="cpu", custom_objects={"policy_class": PointerPolicy})
                     .policy.eval())
    mine, theirs = net.state_dict(), sb3.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_every_checkpoint_of_a_run_has_its_network_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """The warm start (imitation.zip) and SB3's periodic checkpoints too, as the README says (probe of 2026-11-30:
    only the final checkpoint had one, so planning with the others loaded SB3 first)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY | {"out": "out/mine.zip"}))
    assert main(["train-policy", "--config", "tiny.yaml", "--json"]) == 0
    err = capsys.readouterr().err  # progress on stderr without a terminal too (the probe saw none for 47 s)
    assert "train-policy: imitation: search's decisions on 1 scenarios" in err and "train-policy: PPO, 8 timesteps" in err
    zips = sorted((tmp_path / "runs").rglob("checkpoints/*.zip"))
    names = [z.name for z in zips]
    assert "imitation.zip" in names and any(n.startswith("policy_") for n in names)
    for z in zips:
        net = load_network(network_path(z), checkpoint_digest(z))
        assert net is not None and net.hidden == 8, z
