"""The gradient gate for uneven shard fractions (levels 1-2 on :mod:`hetpart.runtime.dist_optimizer`).

Replicas hold 0.75/0.25 or 0.5/0.3/0.2 of the optimizer states (and at level 2 the gradients), alone
and inside 2-stage pipelines, with uneven batch shares: after one step the loss is the single-process
reference's and every gradient (all-gathered whole from the uneven shards) equals the reference's;
after 3 Adam steps every parameter equals the reference's; a checkpoint written with uneven ranges
resumes to the same parameters and optimizer state.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from hetpart.plan import Plan, Replica
from hetpart.runtime.dist_optimizer import uneven_ranges
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed
from tests.test_runtime_gate import SEQ, _gpt2, _llama, _one_step, _st

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

GPT2 = RunnableSpec("gpt2", _gpt2(), impl="transformers")
LLAMA = RunnableSpec("llama", _llama(), impl="transformers")
GPT = RunnableSpec("gpt", _gpt2(), impl="hetpart")
STEPS = 3
LR = 3e-3
ATOL_PARAMS = 1e-5
"""Parameters after 3 Adam steps: Adam divides each gradient by its own running size, so a gradient that
is zero in exact arithmetic (attention's key bias: softmax ignores what adds the same to every score)
but float noise in both runs moves by noise / (|noise| + eps) * lr. That noise depends on the CPU's kernels
(1.5e-5 apart on one machine, under 1e-5 on another), so the key bias is held to Adam's bound instead
(:data:`KEY_BIAS`) and every other parameter to 1e-5, 0.3% of one step's lr."""
KEY_BIAS = re.compile(r"(^|\.)k(_proj)?\.bias$")
"""Parameters whose gradient is zero in exact arithmetic (the attention keys' bias)."""


def _pipelines(zero: int, fractions: tuple[float, ...], schedule: str = "1f1b", global_batch: int = 12,
               micro_batch: int = 2, cut: int = 4) -> Plan:
    """Two 2-stage replicas cut alike, batch shares 2/3 and 1/3."""
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=SEQ, schedule=schedule, zero=zero,
                shard_fractions=fractions, replicas=(
                    Replica(2 / 3, (_st(0, cut, "0/0/0"), _st(cut, 6, "0/0/1"))),
                    Replica(1 / 3, (_st(0, cut, "1/0/0"), _st(cut, 6, "1/0/1")))))


def _tp2(zero: int, fractions: tuple[float, ...], schedule: str = "gpipe") -> Plan:
    """Two TP=2 replicas (shares 2/3, 1/3)."""
    return Plan(global_batch=12, micro_batch=2, seq_len=SEQ, schedule=schedule, zero=zero, shard_fractions=fractions,
                replicas=(Replica(2 / 3, (_st(0, 6, "0/0/0", "0/0/1"),)), Replica(1 / 3, (_st(0, 6, "1/0/0", "1/0/1"),))))


def _alone(zero: int, fractions: tuple[float, ...], shares: tuple[float, ...], global_batch: int) -> Plan:
    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")
    return Plan(global_batch=global_batch, micro_batch=1, seq_len=SEQ, schedule="gpipe", zero=zero,
                shard_fractions=fractions, replicas=tuple(Replica(s, (_st(0, 6, d),)) for s, d in zip(shares, devices)))


CASES_4: dict[str, tuple[RunnableSpec, Plan]] = {
    "u1_pipe_gpt2": (GPT2, _pipelines(1, (0.75, 0.25))),
    "u2_pipe_llama": (LLAMA, _pipelines(2, (0.75, 0.25), "gpipe", 12, 1)),
    # Level 1 with replicas cut at different places: each unit's holders differ; the tied embedding keeps
    # its all-reduce.
    "u1_two_cuts_gpt2": (GPT2, Plan(global_batch=6, micro_batch=1, seq_len=SEQ, schedule="gpipe", zero=1,
                                    shard_fractions=(0.25, 0.75), replicas=(
                                        Replica(2 / 3, (_st(0, 2, "0/0/0"), _st(2, 6, "0/0/1"))),
                                        Replica(1 / 3, (_st(0, 4, "1/0/0"), _st(4, 6, "1/0/1")))))),
    "u2_interleaved_llama": (LLAMA, Plan(
        global_batch=8, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, zero=2,
        shard_fractions=(0.75, 0.25), replicas=(
            Replica(3 / 4, (_st(0, 2, "0/0/0"), _st(2, 3, "0/0/1"), _st(3, 4, "0/0/0"), _st(4, 6, "0/0/1"))),
            Replica(1 / 4, (_st(0, 2, "1/0/0"), _st(2, 3, "1/0/1"), _st(3, 4, "1/0/0"), _st(4, 6, "1/0/1")))))),
    "u2_alone_4_gpt2": (GPT2, _alone(2, (0.4, 0.3, 0.2, 0.1), (0.25, 0.25, 3 / 8, 1 / 8), 8)),
    # Tensor parallelism: each TP column's shards are uneven ranges of its local slices.
    "u1_tp2_gpt": (GPT, _tp2(1, (0.75, 0.25))),
    "u2_tp2_gpt2": (GPT2, _tp2(2, (0.25, 0.75), "1f1b")),
}
CASES_3: dict[str, tuple[RunnableSpec, Plan]] = {
    "u1_alone_3_gpt2": (GPT2, _alone(1, (0.5, 0.3, 0.2), (0.5, 1 / 6, 1 / 3), 6)),
    "u2_alone_3_llama": (LLAMA, _alone(2, (0.5, 0.3, 0.2), (0.5, 1 / 6, 1 / 3), 6)),
}
CASES_2: dict[str, tuple[RunnableSpec, Plan]] = {
    "u1_alone_2_gpt": (GPT, _alone(1, (0.75, 0.25), (0.75, 0.25), 8)),
    "u2_alone_2_gpt2": (GPT2, _alone(2, (0.75, 0.25), (0.25, 0.75), 8)),
}
RESUMED = "u2_pipe_llama"
TRAINED = {4: ("u1_pipe_gpt2", "u2_pipe_llama", "u2_tp2_gpt2"), 3: ("u1_alone_3_gpt2", "u2_alone_3_llama"),
           2: ("u1_alone_2_gpt", "u2_alone_2_gpt2")}


def _train(rank: int, world: int, out: str, name: str, spec: RunnableSpec, plan: Plan) -> None:
    from hetpart.runtime.engine import Executor

    ex = Executor(plan, spec, rank, world, lr=LR)
    losses = [ex.step(s).loss for s in range(STEPS)]
    from hetpart._torch_compat import local_tensor

    params = {k: (local_tensor(p).detach().clone(), (ex.role.tp, ex.role.tp_index, ex._shard(k).tp_dim))
              for k, p in ex.params.items()}
    torch.save({"losses": losses, "params": params}, Path(out, f"train_{name}_{rank}.pt"))


def _states(ex) -> dict[str, torch.Tensor]:
    from hetpart._torch_compat import local_tensor

    return {**{f"model.{k}": local_tensor(p).detach().clone() for k, p in ex.params.items()},
            **{k: local_tensor(t).clone() for k, t in ex.dist_optimizer.whole_states().items()}}


def _resume(rank: int, world: int, out: str, spec: RunnableSpec, plan: Plan) -> None:
    """One step, a checkpoint, one more step; a fresh executor resumed from the checkpoint takes the same
    second step."""
    from hetpart.runtime.checkpoint import load_checkpoint, save_checkpoint
    from hetpart.runtime.engine import Executor

    ckpt = Path(out, "ckpt")
    ex = Executor(plan, spec, rank, world, lr=LR)
    ex.step(0)
    save_checkpoint(ckpt, ex, next_step=1)
    saved = _states(ex)
    ex.step(1)
    again = Executor(plan, spec, rank, world, lr=LR)
    start = load_checkpoint(ckpt, again)
    loaded = _states(again)
    again.step(start)
    torch.save({"saved": saved, "loaded": loaded, "whole": _states(ex), "resumed": _states(again), "start": start},
               Path(out, f"resume_{rank}.pt"))


def _methods(rank: int, world: int, out: str, spec: RunnableSpec, plan: Plan) -> None:
    """The same step's gradients through each way of moving uneven pieces."""
    from hetpart.runtime.engine import Executor

    ex = Executor(plan, spec, rank, world)
    grads = {}
    for method in ("padded", "all_to_all", "all_reduce"):
        ex.dist_optimizer.method = method
        ex.forward_backward(0)
        ex.sync_gradients()
        grads[method] = {k: g.grad for k, g in ex.local_gradients().items()}
    torch.save(grads, Path(out, f"methods_{rank}.pt"))


def _job(rank: int, world: int, out: str, cases: dict) -> None:
    _one_step(rank, world, out, cases)
    if world == 3:
        _methods(rank, world, out, *cases["u2_alone_3_llama"])
    for name in TRAINED[world]:
        _train(rank, world, out, name, *cases[name])
    if world == 4:
        _resume(rank, world, out, *cases[RESUMED])


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return {n: run_distributed(_job, n, cases, timeout_s=300, out_dir=str(tmp_path_factory.mktemp(f"uneven{n}")))
            for n, cases in ((4, CASES_4), (3, CASES_3), (2, CASES_2))}


ALL = {**{n: (4, c) for n, c in CASES_4.items()}, **{n: (3, c) for n, c in CASES_3.items()},
       **{n: (2, c) for n, c in CASES_2.items()}}


@pytest.mark.parametrize("name", list(ALL))
def test_uneven_shards_step_matches_reference(outs: dict[int, Path], name: str) -> None:
    from hetpart.runtime.engine import check_runnable
    from hetpart.runtime.reference import Reference

    world, (spec, plan) = ALL[name]
    assert check_runnable(plan, spec) == []
    ref = Reference(spec, plan.global_batch, plan.seq_len)
    ref_loss = ref.forward_backward(0)
    expected = ref.gradients()
    seen: set[str] = set()
    for rank in range(world):
        got = torch.load(outs[world] / f"{name}_{rank}.pt", weights_only=False)
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-6), f"{name}: rank {rank} loss"
        for key, g in got["grads"].items():
            want = expected[key] if g.tp_dim is None else expected[key].chunk(g.tp, g.tp_dim)[g.tp_index]
            torch.testing.assert_close(g.grad, want, rtol=1e-4, atol=1e-6,
                                       msg=lambda m, where=f"{name} rank {rank} {key}": f"{where}: {m}")
            seen.add(key)
    assert seen == set(expected)


@pytest.mark.parametrize("name", [n for names in TRAINED.values() for n in names])
def test_uneven_shards_follow_the_reference_for_three_adam_steps(outs: dict[int, Path], name: str) -> None:
    from hetpart.runtime.reference import Reference

    world, (spec, plan) = ALL[name]
    ref = Reference(spec, plan.global_batch, plan.seq_len, lr=LR)
    want = [ref.step(s) for s in range(STEPS)]
    for rank in range(world):
        got = torch.load(outs[world] / f"train_{name}_{rank}.pt", weights_only=False)
        assert got["losses"] == pytest.approx(want, rel=1e-5)
        for key, (p, (tp, tp_index, tp_dim)) in got["params"].items():
            whole = ref.params[key].detach()
            want_p = whole if tp_dim is None else whole.chunk(tp, tp_dim)[tp_index]
            if KEY_BIAS.search(key):
                # its gradient is float noise in both runs, which Adam scales up to as much as lr a step: both
                # runs only have to stay within Adam's bound of each other
                assert (p - want_p).abs().max().item() <= 2 * STEPS * LR, f"{name} rank {rank} {key}"
                continue
            torch.testing.assert_close(p, want_p, rtol=1e-5, atol=ATOL_PARAMS,
                                       msg=lambda m, where=f"{name} rank {rank} {key}": f"{where}: {m}")
    assert want[-1] < want[0]


def test_uneven_ranges_cover_the_flat_space_in_proportion() -> None:
    assert uneven_ranges(10, [0.5, 0.3, 0.2]) == [(0, 5), (5, 3), (8, 2)]
    assert uneven_ranges(7, [0.75, 0.25]) == [(0, 5), (5, 2)]
    ranges = uneven_ranges(1001, [0.4, 0.3, 0.2, 0.1])
    assert [length for _, length in ranges] == [400, 301, 200, 100]
    assert sum(length for _, length in ranges) == 1001 and ranges[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:]))


def test_what_runs_with_uneven_fractions() -> None:
    from hetpart.errors import PlanError
    from hetpart.rules import uneven_shard_problems
    from hetpart.runtime.engine import require_runnable

    assert uneven_shard_problems(_pipelines(1, (0.75, 0.25))) == []
    assert uneven_shard_problems(_pipelines(2, (0.75, 0.25))) == []
    with pytest.raises(PlanError, match=r"shard_fractions: uneven shards do not run at zero 3: torch FSDP2 splits "
                                        r"each parameter into equal torch.chunk pieces"):
        require_runnable(_pipelines(3, (0.75, 0.25)), GPT2)
    hybrid = dataclasses.replace(_alone(1, (0.3, 0.2, 0.1, 0.4), (0.25,) * 4, 8), shard_group=2,
                                 shard_fractions=(0.6, 0.4, 0.2, 0.8))
    with pytest.raises(PlanError, match=r"shard_fractions: uneven shards with hybrid sharding \(shard_group\) "
                                        "do not run"):
        require_runnable(hybrid, GPT2)


def test_a_checkpoint_with_uneven_ranges_resumes_to_the_same_parameters_and_optimizer_state(outs) -> None:
    """torch.distributed.checkpoint with uneven shards: Adam's states all-gathered whole on save and cut
    back into each rank's ranges on load; the resumed step equals the uninterrupted one."""
    for rank in range(4):
        got = torch.load(outs[4] / f"resume_{rank}.pt", weights_only=False)
        assert got["start"] == 1 and set(got["loaded"]) == set(got["saved"])
        assert any(k.endswith(".exp_avg_sq") and v.abs().sum() > 0 for k, v in got["saved"].items())
        for name in got["saved"]:
            torch.testing.assert_close(got["loaded"][name], got["saved"][name], rtol=0, atol=0)
            torch.testing.assert_close(got["resumed"][name], got["whole"][name], rtol=0, atol=0)


def test_every_way_of_moving_uneven_pieces_gives_the_reference_gradient(outs) -> None:
    from hetpart.runtime.reference import Reference

    spec, plan = CASES_3["u2_alone_3_llama"]
    ref = Reference(spec, plan.global_batch, plan.seq_len)
    ref.forward_backward(0)
    expected = ref.gradients()
    for rank in range(3):
        got = torch.load(outs[3] / f"methods_{rank}.pt", weights_only=False)
        assert set(got) == {"padded", "all_to_all", "all_reduce"}
        for method, grads in got.items():
            assert set(grads) == set(expected)
            for key, g in grads.items():
                torch.testing.assert_close(g, expected[key], rtol=1e-4, atol=1e-6,
                                           msg=lambda m, where=f"{method} rank {rank} {key}": f"{where}: {m}")


class _FakeTime:
    """``time.perf_counter`` that moves only when told (no timing on a shared machine)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_level_2_reduce_scatter_inside_the_backward_is_communication_not_compute(monkeypatch) -> None:
    """Level 2 reduce-scatters from the backward's hooks, inside a compute chunk. Its seconds (the collective
    and the emulated link's sleep) are communication: the chunk's compute, which an emulated slow device
    stretches by its slowdown, leaves them out (they were stretched before: +81% on the emulated run)."""
    from types import SimpleNamespace

    from hetpart.runtime import dist_optimizer, engine
    from hetpart.runtime.dist_optimizer import ShardedAdam

    fake = _FakeTime()
    monkeypatch.setattr(engine.time, "perf_counter", fake)
    monkeypatch.setattr(dist_optimizer.time, "perf_counter", fake)
    computed = []

    def link_sleep(kind, num_bytes, ranks):  # the emulated link: 5 s
        fake.now += 5.0

    clock = engine._Clock()
    hooks = SimpleNamespace(on_collective=link_sleep, on_compute=lambda stage, kind, s: computed.append(s))
    opt = SimpleNamespace(ex=SimpleNamespace(clock=clock, hooks=hooks), comm_s=0.0)
    bucket = SimpleNamespace(ranks=(0, 1), ranges=[(0, 8), (8, 2)])
    start = fake.now
    clock.in_chunk = True
    fake.now += 1.0  # one second of backward compute, then the unit's hook reduce-scatters
    ShardedAdam._report(opt, "reduce_scatter", torch.zeros(10), bucket, fake.now)
    fake.now += 2.0  # the rest of the backward
    clock.in_chunk = False
    clock.chunk("bwd", 0, start, 0.0, hooks)
    assert computed == [3.0] and clock.bwd == 3.0 and clock.comm == 5.0 and opt.comm_s == 5.0
    # after the backward (level 1, or what no hook reduced) it is communication as before
    ShardedAdam._report(opt, "reduce_scatter", torch.zeros(10), bucket, fake.now)
    assert clock.comm == 10.0 and clock.bwd == 3.0


def test_level_1_fuses_the_buckets_of_one_rank_set_up_to_the_cap_in_one_global_order() -> None:
    """Level 1 reduce-scatters per run of buckets that share their ranks (one collective, not one per unit:
    each pays the link's latency), member-major: member j's ranges of every bucket form its one range."""
    from hetpart.runtime.dist_optimizer import _Bucket, _Segment, fuse_level1

    def bucket(ranks, numel, fractions):
        segment = _Segment(torch.nn.Parameter(torch.zeros(numel)), "w")
        return _Bucket(ranks, [segment], uneven_ranges(numel, fractions), 0, 0, None)

    a1, b1, a2, a3 = (bucket((0, 1), 10, [0.8, 0.2]), bucket((0, 2), 6, [0.5, 0.5]),
                      bucket((0, 1), 5, [0.8, 0.2]), bucket((0, 1), 20, [0.8, 0.2]))
    fused = fuse_level1([a1, b1, a2, a3], cap=16)
    assert [[b.numel for b in f.buckets] for f in fused] == [[10, 5], [6], [20]]
    assert fused[0].ranges == [(0, 8 + 4), (12, 2 + 1)]  # member 0: 8 of 10 and 4 of 5; member 1: the rest
    assert fused[0].mine == (0, 12) and fused[2].ranges == [(0, 16), (16, 4)]
