"""A plan file that names no precision is priced, exported and run in the devices' default (bf16 where every device
has it, else fp16), as ``--precision`` left out; one that names a precision its devices lack is refused by all."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cli import run_cli

MIXED = ("name: a100-v100\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}\n"
         "  - {count: 1, gpus_per_node: 1, gpu: V100-16GB, intra_node: NVLink2, nic: Ethernet-10}\n")


def _plan(tmp_path: Path, **extra) -> Path:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(MIXED)
    data = {"global_batch": 8, "micro_batch": 2, "seq_len": 128, "recompute": "none",
            "meta": {"model": "gpt2-small", "cluster": str(cluster)},
            "replicas": [{"batch_share": 0.75, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]},
                         {"batch_share": 0.25, "stages": [{"layers": [0, 14], "devices": ["1/0/0"], "tp": 1}]}]}
    data.update(extra)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_a_plan_without_precision_takes_the_devices_default(capsys, tmp_path: Path) -> None:
    """The shape of the issue-10 acceptance's ZeRO-3 plan (A100 + V100, no precision key): it ran before run checked
    precision; the check must not refuse it as bf16 (the Plan's own default), but run it in fp16."""
    path = _plan(tmp_path, zero=3)
    code, out, err = run_cli(capsys, "predict", "--plan", str(path), "--json")
    assert code == 0, err
    code, out, err = run_cli(capsys, "export", str(path), "--to", "deepspeed")
    assert code == 0, err
    assert '"fp16"' in out and "bf16" not in out
    # --time-factor 200: the emulation's own factor (fastest peak / CPU rate, ~3,000 here) slows the ZeRO-3 step's
    # Ethernet-10 collectives to ~45 s of sleep; the precision the run takes does not depend on it
    code, out, err = run_cli(capsys, "run", str(path), "--steps", "1", "--warmup", "0", "--scale", "tiny",
                             "--time-factor", "200", "--json")
    assert code == 0, err
    ran = json.loads(out)
    assert ran["measured"]["steps"] == 1 and ran["emulation"]["precision"] == "fp16"
    stated = _plan(tmp_path, precision="bf16")
    for argv in (("predict", "--plan", str(stated), "--json"), ("run", str(stated), "--steps", "1", "--json")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and "bf16 is not supported by V100-16GB" in json.loads(out)["error"], argv
