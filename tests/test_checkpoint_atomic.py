"""A checkpoint save cut short leaves the last complete checkpoint in force (probe of 2026-11-30: Ctrl-C while
``hetpart run --checkpoint-every 1`` saved left three of four shard files half written over the previous
checkpoint, and the resume then failed with "written for another model or plan").

Single process, no process group: ``torch.distributed.checkpoint`` saves and loads without one, and the
save's folder switch is the same code every rank runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hetpart.errors import RuntimeFault
from hetpart.runtime.checkpoint import META_FILE, checkpoint_info, load_checkpoint, save_checkpoint


def _executor(value: float) -> SimpleNamespace:
    weight = torch.nn.Parameter(torch.full((4, 3), value))
    optimizer = torch.optim.Adam([weight], lr=1e-3)
    weight.grad = torch.ones_like(weight)
    optimizer.step()  # Adam's step and moments exist, as after a training step
    return SimpleNamespace(params={"block_0.weight": weight}, optimizer=optimizer, spec=SimpleNamespace(name="toy"),
                           infos=[object()], dist_optimizer=None, sharded_keys=set())


def test_each_save_has_its_own_folder_and_older_ones_are_removed(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _executor(1.0), next_step=1)
    save_checkpoint(tmp_path, _executor(2.0), next_step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_FILE, "step-2"]
    assert checkpoint_info(tmp_path)["data"] == "step-2"
    assert list((tmp_path / "step-2").glob("*.distcp")) and (tmp_path / "step-2" / ".metadata").is_file()
    fresh = _executor(0.0)
    assert load_checkpoint(tmp_path, fresh) == 2
    assert torch.equal(fresh.params["block_0.weight"].detach(), _executor(2.0).params["block_0.weight"].detach())


def test_a_save_cut_short_leaves_the_previous_checkpoint_in_force(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _executor(1.0), next_step=1)
    # what an interrupted save of step 2 leaves: a folder with a truncated shard file and no metadata yet
    partial = tmp_path / "step-2"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0" * 17)
    fresh = _executor(0.0)
    assert load_checkpoint(tmp_path, fresh) == 1  # the pointer still names step-1
    assert torch.equal(fresh.params["block_0.weight"].detach(), _executor(1.0).params["block_0.weight"].detach())
    # the next save of step 2 starts from a clean folder and removes step-1 once it is complete
    save_checkpoint(tmp_path, _executor(2.0), next_step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_FILE, "step-2"]
    again = _executor(0.0)
    assert load_checkpoint(tmp_path, again) == 2
    assert torch.equal(again.params["block_0.weight"].detach(), _executor(2.0).params["block_0.weight"].detach())


def test_an_incomplete_or_damaged_checkpoint_says_so(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _executor(1.0), next_step=1)
    (tmp_path / "step-1" / ".metadata").unlink()
    with pytest.raises(RuntimeFault, match=r"the checkpoint is incomplete \(step-1/.metadata is missing"):
        load_checkpoint(tmp_path, _executor(0.0))
    save_checkpoint(tmp_path, _executor(1.0), next_step=3)
    for shard in (tmp_path / "step-3").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(RuntimeFault, match="its files are damaged or it was written for another model or plan"):
        load_checkpoint(tmp_path, _executor(0.0))


def test_a_checkpoint_written_before_the_folders_still_loads(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    old = _executor(5.0)
    dcp.save({"model.block_0.weight": old.params["block_0.weight"],
              **{f"optim.block_0.weight.{k}": v for k, v in old.optimizer.state[old.params["block_0.weight"]].items()}},
             checkpoint_id=str(tmp_path))
    (tmp_path / META_FILE).write_text(json.dumps({"next_step": 4, "model": "toy", "num_units": 1}))
    fresh = _executor(0.0)
    assert load_checkpoint(tmp_path, fresh) == 4
    assert float(fresh.params["block_0.weight"].detach()[0, 0]) == pytest.approx(float(old.params["block_0.weight"].detach()[0, 0]))
    save_checkpoint(tmp_path, fresh, next_step=5)  # the next save moves it into a folder and drops the old files
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_FILE, "step-5"]
