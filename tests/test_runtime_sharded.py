"""The runtime's gradient gate for sharded data parallelism (FSDP2 per unit, under the pipeline).

ZeRO levels 1-3 and hybrid sharding, with uneven batch shares (levels 2-3 pad the smaller replica with
zero-weighted micro-batches), pipelines (GPipe, 1F1B, interleaved), replicas cut at different places
(level 1), tied embeddings across stages: after one step the loss and every gradient equal the
single-process reference; a few Adam steps on sharded states follow the reference's losses. Host offload
(FSDP2's ``CPUOffloadPolicy``) passes the same gate.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hetpart.errors import PlanError
from hetpart.plan import Plan, Replica
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed
from tests.test_runtime_gate import SEQ, _check_against_reference, _gpt2, _llama, _one_step, _st, _two_cuts

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

GPT2 = RunnableSpec("gpt2", _gpt2(), impl="transformers")
LLAMA = RunnableSpec("llama", _llama(), impl="transformers")
GPT = RunnableSpec("gpt", _gpt2(), impl="hetpart")


def _tp2(zero: int, global_batch: int = 6, micro_batch: int = 1, schedule: str = "gpipe") -> Plan:
    """Two TP=2 replicas (shares 2/3, 1/3): FSDP on the 2-D (dp, tp) mesh."""
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=SEQ, schedule=schedule, zero=zero,
                replicas=(Replica(2 / 3, (_st(0, 6, "0/0/0", "0/0/1"),)), Replica(1 / 3, (_st(0, 6, "1/0/0", "1/0/1"),))))


def _alike(zero: int, schedule: str, global_batch: int, micro_batch: int, **kw) -> Plan:
    """Two 2-stage replicas cut alike, shares 2/3 and 1/3."""
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=SEQ, schedule=schedule, zero=zero,
                replicas=(Replica(2 / 3, (_st(0, 4, "0/0/0"), _st(4, 6, "0/0/1"))),
                          Replica(1 / 3, (_st(0, 4, "1/0/0"), _st(4, 6, "1/0/1")))), **kw)


def _four_single(zero: int, shares: tuple[float, ...], global_batch: int, **kw) -> Plan:
    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")
    return Plan(global_batch=global_batch, micro_batch=1, seq_len=SEQ, schedule="gpipe", zero=zero,
                replicas=tuple(Replica(s, (_st(0, 6, d),)) for s, d in zip(shares, devices)), **kw)


CASES: dict[str, tuple[RunnableSpec, Plan]] = {
    # Level 1: replicas cut at different places; the tied embedding / LM head keeps its all-reduce.
    "z1_two_cuts_gpt2": (GPT2, dataclasses.replace(_two_cuts("gpipe"), zero=1)),
    "z2_1f1b_llama": (LLAMA, _alike(2, "1f1b", 12, 2)),
    # Level 3, 1F1B: the 1/3 replica runs 2 padding micro-batches to match the other's 4.
    "z3_1f1b_gpt2": (GPT2, _alike(3, "1f1b", 12, 2)),
    "z3_interleaved_llama": (LLAMA, Plan(
        global_batch=8, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, zero=3, replicas=(
            Replica(3 / 4, (_st(0, 2, "0/0/0"), _st(2, 3, "0/0/1"), _st(3, 4, "0/0/0"), _st(4, 6, "0/0/1"))),
            Replica(1 / 4, (_st(0, 2, "1/0/0"), _st(2, 3, "1/0/1"), _st(3, 4, "1/0/0"), _st(4, 6, "1/0/1")))))),
    # Hybrid sharding: shard inside pairs of replicas, replicate across the pairs (FSDP2's 2-D HSDP mesh).
    "hsdp_z3_gpt2": (GPT2, _four_single(3, (1 / 3, 1 / 6, 1 / 3, 1 / 6), 12, shard_group=2)),
    "hsdp_z1_llama": (LLAMA, _four_single(1, (1 / 4, 1 / 4, 3 / 8, 1 / 8), 8, shard_group=2)),
    # Tensor parallelism composed with FSDP (torchtitan's 2-D mesh), every level.
    "z1_tp2_gpt": (GPT, _tp2(1)),
    "z2_tp2_gpt2": (GPT2, _tp2(2, 12, 2, "1f1b")),
    "z3_tp2_llama": (LLAMA, _tp2(3)),
    # Host offload: FSDP2's CPUOffloadPolicy (full), and the optimizer's states on the host (on a CPU device the
    # same memory, so the plan runs as it is).
    "z3_offload_full_llama": (LLAMA, dataclasses.replace(_alike(3, "1f1b", 12, 2), offload="full")),
    "z2_offload_optimizer_gpt2": (GPT2, dataclasses.replace(_alike(2, "1f1b", 12, 2), offload="optimizer")),
}
TRAIN_STEPS = 3


def _train(rank: int, world: int, out: str, spec: RunnableSpec, plan: Plan) -> None:
    from hetpart.runtime.engine import Executor

    ex = Executor(plan, spec, rank, world, lr=3e-3)
    torch.save([ex.step(s).loss for s in range(TRAIN_STEPS)], Path(out, f"train_{rank}.pt"))


def _job(rank: int, world: int, out: str) -> None:
    _one_step(rank, world, out, CASES)
    _train(rank, world, out, *CASES["z3_1f1b_gpt2"])


@pytest.fixture(scope="module")
def out_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_distributed(_job, 4, timeout_s=300, out_dir=str(tmp_path_factory.mktemp("sharded4")))


@pytest.mark.parametrize("name", list(CASES))
def test_sharded_step_matches_reference(out_4: Path, name: str) -> None:
    spec, plan = CASES[name]
    from hetpart.runtime.engine import check_runnable

    assert check_runnable(plan, spec) == []
    _check_against_reference(out_4, name, spec, plan, 4)


def test_sharded_training_follows_the_reference(out_4: Path) -> None:
    from hetpart.runtime.reference import Reference

    spec, plan = CASES["z3_1f1b_gpt2"]
    ref = Reference(spec, plan.global_batch, plan.seq_len, lr=3e-3)
    want = [ref.step(s) for s in range(TRAIN_STEPS)]
    for rank in range(4):
        assert torch.load(out_4 / f"train_{rank}.pt", weights_only=False) == pytest.approx(want, rel=1e-4)
    assert want[-1] < want[0]


def test_runtime_refuses_what_fsdp2_cannot_run() -> None:
    from hetpart.runtime.engine import require_runnable

    uneven = dataclasses.replace(_four_single(3, (0.25,) * 4, 8), shard_fractions=(0.4, 0.3, 0.2, 0.1))
    with pytest.raises(PlanError, match=r"shard_fractions: uneven shards do not run at zero 3: torch FSDP2 splits "
                                        r"each parameter into equal torch.chunk pieces"):
        require_runnable(uneven, GPT2)
    hybrid_tp = Plan(global_batch=8, micro_batch=1, seq_len=SEQ, zero=1, shard_group=2, replicas=tuple(
        Replica(0.25, (_st(0, 6, f"{g}/0/{i}", f"{g}/0/{i + 1}"),)) for g in (0, 1) for i in (0, 2)))
    with pytest.raises(PlanError, match=r"shard_group: hybrid sharding with tensor parallelism \(a 3-D mesh\) "
                                        "does not run"):
        require_runnable(hybrid_tp, GPT2)


def test_levels_two_and_three_need_replicas_cut_alike() -> None:
    from hetpart.rules import sharding_problems

    assert sharding_problems(dataclasses.replace(_two_cuts("gpipe"), zero=1)) == []
    problems = sharding_problems(dataclasses.replace(_two_cuts("gpipe"), zero=3))
    assert len(problems) == 1 and "replicas[1].stages: cut unlike replicas[0] of its shard group" in problems[0]
    mixed_tp = Plan(global_batch=4, micro_batch=1, seq_len=SEQ, zero=1, replicas=(
        Replica(0.5, (_st(0, 6, "0/0/0", "0/0/1"),)), Replica(0.5, (_st(0, 6, "1/0/0"),))))
    assert "sharding with tensor parallelism runs on one (dp, tp) mesh per stage" in sharding_problems(mixed_tp)[0]


def test_the_launcher_runs_the_plans_sharding_and_refuses_uneven_shards_at_level_3() -> None:
    """``hetpart run`` shrinks the model and rebuilds the plan for it: the sharding must survive."""
    from hetpart.runtime.launch import RunOptions, prepare_run

    plan = Plan(global_batch=8, micro_batch=2, seq_len=128, zero=3, replicas=(
        Replica(0.75, (_st(0, 14, "0/0/0"),)), Replica(0.25, (_st(0, 14, "1/0/0"),))))
    prep = prepare_run(plan, "gpt2-small", "tiny-mixed", RunOptions(scale="tiny"))
    assert prep.run_plan.zero == 3
    prep = prepare_run(dataclasses.replace(plan, offload="full"), "gpt2-small", "tiny-mixed", RunOptions(scale="tiny"))
    assert (prep.run_plan.zero, prep.run_plan.offload) == (3, "full")
    uneven = dataclasses.replace(plan, shard_fractions=(0.8, 0.2))
    with pytest.raises(PlanError, match=r"plan \(the gpt2-small that runs\): shard_fractions: uneven shards do not run at zero 3"):
        prepare_run(uneven, "gpt2-small", "tiny-mixed", RunOptions(scale="tiny"))
    for zero in (1, 2):  # hetpart's distributed optimizer runs them
        prep = prepare_run(dataclasses.replace(uneven, zero=zero), "gpt2-small", "tiny-mixed", RunOptions(scale="tiny"))
        assert (prep.run_plan.zero, prep.run_plan.shard_fractions) == (zero, (0.8, 0.2))


@pytest.mark.slow
@pytest.mark.parametrize("offload", ["none", "full"])
def test_a_sharded_run_resumes_from_its_checkpoint_with_the_same_losses(tmp_path: Path, offload: str) -> None:
    """Sharded weights and Adam states (FSDP2 DTensors at level 3, in host memory with ``offload: full``) go
    through ``torch.distributed.checkpoint`` as shards: one step, a checkpoint, one more step resumed equals two
    steps uninterrupted, here of the single-process reference (the same initialisation and data; an
    uninterrupted run matched it within 1e-7)."""
    zero = 3
    from hetpart.runtime.launch import RunOptions, prepare_run, run_plan
    from hetpart.runtime.reference import Reference

    plan = Plan(global_batch=8, micro_batch=2, seq_len=128, zero=zero, offload=offload, replicas=(
        Replica(0.75, (_st(0, 14, "0/0/0"),)), Replica(0.25, (_st(0, 14, "1/0/0"),))),
        meta={"model": "gpt2-small", "cluster": "tiny-mixed"})

    def run(steps: int, name: str, ckpt: Path | None):
        options = RunOptions(steps=steps, warmup=0, emulate=False, scale="tiny",
                             checkpoint_dir=None if ckpt is None else str(ckpt))
        return run_plan(plan, options=options, run_dir=tmp_path / name)

    prep = prepare_run(plan, "gpt2-small", "tiny-mixed", RunOptions(steps=1, emulate=False, scale="tiny"))
    ref = Reference(prep.runnable, plan.global_batch, prep.run_plan.seq_len)  # the executor's lr, 1e-3
    whole = [ref.step(s) for s in range(2)]
    ckpt = tmp_path / "ckpt"
    first = run(1, "first", ckpt)
    assert len(list(ckpt.glob("step-*/*.distcp"))) == 2  # one file of shards per rank, in the save's folder
    resumed = run(1, "resumed", ckpt)
    assert first.measured.losses == pytest.approx(whole[:1], rel=1e-6)
    assert resumed.measured.losses == pytest.approx(whole[1:2], rel=1e-6)
    assert whole[1] != pytest.approx(whole[0], rel=1e-4)  # the step moved the weights: the resume is not a no-op
