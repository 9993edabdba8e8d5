"""wandb gets SB3's keys (``rollout/``, ``train/``) and the ``plan/`` metrics, and series logged with unrelated steps
into one run (the loop's iterations, SB3's timesteps) all survive (probe e, finding 1)."""

from __future__ import annotations

import json
import struct
import time

import pytest

from hetpart.experiments.tracking import make_tracker, sb3_logger


def _wandb_history(run_dir) -> list[dict]:
    """The history rows of the run's offline ``.wandb`` file, decoded with wandb's own ``Record`` protobuf.

    wandb 0.31 ships no Python reader of the file (its Go core writes it); the framing is LevelDB's log format
    as wandb writes it: a 7-byte ``:W&B`` header, 32 KiB blocks, records of a 7-byte header (crc32c, length,
    type: 1 full, 2 first, 3 middle, 4 last), a block's tail under 7 bytes left as padding.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    kinds, rows = [], []
    for _ in range(600):  # finish() returns before wandb's service process has written the file: wait for its exit
        kinds, rows = _records(path.read_bytes(), pb)
        if "exit" in kinds:
            break
        time.sleep(0.1)
    assert "exit" in kinds, f"{path}: wandb never finished writing it ({kinds})"
    return rows


def _records(data: bytes, pb) -> tuple[list[str], list[dict]]:
    """The record kinds of a ``.wandb`` file's bytes, and its history rows."""
    pos, buf, kinds, rows = 7, b"", [], []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # padding, or a record still being written
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            kinds.append(record.WhichOneof("record_type"))
            if kinds[-1] == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return kinds, rows


class _Spy:
    run_dir = None
    name = "spy"

    def __init__(self) -> None:
        self.calls: list[tuple[dict, int]] = []

    def log(self, metrics, step):
        self.calls.append((dict(metrics), step))


def test_the_forwarding_writer_is_an_sb3_kvwriter_that_sb3s_dump_reaches():
    from stable_baselines3.common.logger import KVWriter, Logger

    from hetpart.experiments.tracking import _forward_writer

    spy = _Spy()
    writer = _forward_writer(spy)
    assert isinstance(writer, KVWriter)
    logger = Logger(folder=None, output_formats=[writer])
    logger.record("rollout/ep_rew_mean", 0.75)
    logger.record("plan/ratio_mean", 0.5)
    logger.record("train/note", "text is not a metric")
    logger.record("train/hidden", 3.0, exclude="wandb")
    logger.dump(step=128)
    assert spy.calls == [({"rollout/ep_rew_mean": 0.75, "plan/ratio_mean": 0.5}, 128)]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_loop_and_sb3_series_with_unrelated_steps_both_survive_in_one_wandb_run(tmp_path, offline):
    """The loop's shape: SB3 dumps at its timesteps (64, 128, then 1064, 1128 after a resumed learn), the loop logs
    ``loop/*`` at its iteration (0, 1) between them; wandb's step would go backwards, so each namespace has its own."""
    tracker = make_tracker("wandb", "loop", seed=0, root=tmp_path)
    logger = sb3_logger(tracker, formats=())
    for iteration in range(2):
        for timestep in (64, 128):
            logger.record("rollout/ep_rew_mean", float(timestep))
            logger.record("plan/ratio_mean", 0.5)
            logger.dump(step=1000 * iteration + timestep)
        tracker.log({"loop/trained_on": 2.0 + iteration}, step=iteration)
    tracker.finish()
    rows = _wandb_history(tracker.run_dir)
    loop = [(r["loop/step"], r["loop/trained_on"]) for r in rows if "loop/trained_on" in r]
    rollout = [(r["rollout/step"], r["rollout/ep_rew_mean"]) for r in rows if "rollout/ep_rew_mean" in r]
    assert loop == [(0, 2), (1, 3)]
    assert rollout == [(64, 64), (128, 128), (1064, 64), (1128, 128)]
    assert [r["_step"] for r in rows] == [0, 1, 2, 3, 4, 5]


def test_a_bare_key_is_plotted_against_step_and_a_namespace_step_key_is_refused(tmp_path, offline):
    from hetpart.errors import SpecError

    with make_tracker("wandb", "x", seed=0, root=tmp_path) as tracker:
        tracker.log({"loss": 0.5}, step=7)
        with pytest.raises(SpecError, match=r"metric 'loop/step' is the step wandb plots its namespace against"):
            tracker.log({"loop/step": 1.0}, step=1)
    rows = _wandb_history(tracker.run_dir)
    assert [(r["step"], r["loss"]) for r in rows] == [(7, 0.5)]


def test_a_tiny_train_policy_run_sends_rollout_train_and_plan_keys_to_wandb(tmp_path, offline):
    from hetpart.experiments.train_policy import PolicyTrainConfig, train_policy

    cfg = PolicyTrainConfig(experiment="policy/wandb", out=str(tmp_path / "p.zip"), tracker="wandb",
                            runs_dir=str(tmp_path / "runs"), imitation_scenarios=0, timesteps=128, n_envs=1,
                            n_steps=64, batch_size=64, n_epochs=1, max_devices=8, checkpoint_every=10**6,
                            progress_bar=False)
    summary = train_policy(cfg)
    rows = _wandb_history(tmp_path / "runs" / summary["run"])
    keys = {k for r in rows for k in r}
    assert "rollout/ep_rew_mean" in keys and "plan/ratio_mean" in keys and "train/approx_kl" in keys
    assert [r["time/step"] for r in rows if "time/step" in r] == [64, 128]


def test_the_loops_policy_training_sends_train_keys_to_wandb_at_64_ppo_steps(tmp_path, offline):
    """SB3 dumps before each update, so one rollout of 64 steps per iteration never dumped its update's ``train/*``
    (the probe's TensorBoard had none either); the loop dumps what the last update left."""
    from types import SimpleNamespace

    from hetpart import load_cluster, load_model
    from hetpart.costmodel.learned.corrected import fit_records
    from hetpart.experiments.loop import _Loop
    from hetpart.workload import Workload

    cluster = tmp_path / "mix.yaml"
    cluster.write_text("name: mix\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, "
                       "nic: IB-HDR}\n  - {count: 1, gpus_per_node: 2, gpu: V100-32GB, intra_node: NVLink2, "
                       "nic: Ethernet-100}\n")
    model = load_model("gpt2-small", seq_len=256, precision="fp16")
    loop = SimpleNamespace(model=model, cluster=load_cluster(str(cluster)), out=tmp_path,
                           workload=Workload(global_batch=8, seq_len=256, precision="fp16", recompute="auto"),
                           cfg=SimpleNamespace(seed=0, policy_timesteps=64))
    tracker = make_tracker("wandb", "loop", seed=0, root=tmp_path / "tracked")
    path = _Loop.train_policy(loop, fit_records([], "plan"), None, 0, tracker)
    tracker.finish()
    assert path == tmp_path / "policy-0.zip" and path.is_file()
    keys = {k for r in _wandb_history(tracker.run_dir) for k in r}
    assert "rollout/ep_rew_mean" in keys and "train/approx_kl" in keys and "train/step" in keys
