"""The runtime's correctness gate: a partitioned run equals the single-process reference.

For GPipe, 1F1B and interleaved 1F1B, uneven pipeline stages, uneven data-parallel shares, replicas
cutting the model at different places, TP=2 (also mixed with TP=1 replicas), tied embeddings split
across stages, and the transformers GPT-2 and Llama as well as hetpart's own GPT and a ``python:``
model: after one step, the loss and every parameter's gradient (each rank's shard) equal those of
:class:`hetpart.runtime.reference.Reference` (``torch.testing.assert_close``, fp32, gloo on CPU). A few
Adam steps follow the reference's losses and lower the loss.

Several plans run in one spawned job (each builds its own groups) to keep process start-up cheap.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetpart.errors import PlanError
from hetpart.graph.transformer import TransformerConfig
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed

SEQ = 8


def _gpt2(layers: int = 4) -> TransformerConfig:
    return TransformerConfig("gpt2", layers, 32, 4, 64, 16)


def _llama(layers: int = 4) -> TransformerConfig:
    return TransformerConfig("llama", layers, 32, 4, 64, 16, ffn_hidden_size=64, num_kv_heads=2,
                             tied_embeddings=False, activation="swiglu", norm="rmsnorm", bias=False,
                             learned_positions=False, dropout=False)


def _st(first: int, last: int, *devices: str) -> Stage:
    return Stage((first, last), tuple(devices), len(devices))


def _two_cuts(schedule: str, global_batch: int = 6, micro_batch: int = 1) -> Plan:
    """Two replicas with shares 2/3 and 1/3, each a 2-stage pipeline cut at a different place."""
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=SEQ, schedule=schedule, replicas=(
        Replica(2 / 3, (_st(0, 4, "0/0/0"), _st(4, 6, "0/0/1"))),
        Replica(1 / 3, (_st(0, 2, "1/0/0"), _st(2, 6, "1/0/1")))))


CASES: dict[str, tuple[RunnableSpec, Plan]] = {
    # transformers GPT-2, tied embedding and LM head on different stages of each replica.
    "gpipe_gpt2": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), _two_cuts("gpipe")),
    "1f1b_llama": (RunnableSpec("llama", _llama(), impl="transformers"), _two_cuts("1f1b", 12, 2)),
    # One replica, two stages of TP=2 (hetpart GPT: column/row-wise attention and MLP).
    "1f1b_tp2_gpt": (RunnableSpec("gpt", _gpt2(), impl="hetpart"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="1f1b", replicas=(
            Replica(1.0, (_st(0, 3, "0/0/0", "0/0/1"), _st(3, 6, "1/0/0", "1/0/1"))),))),
    # A TP=2 replica (one stage) next to a TP=1 pipeline: unit gradients exchanged at full size.
    "gpipe_tp_mixed_llama": (RunnableSpec("llama", _llama(), impl="transformers"), Plan(
        global_batch=6, micro_batch=1, seq_len=SEQ, schedule="gpipe", replicas=(
            Replica(1 / 2, (_st(0, 6, "0/0/0", "0/0/1"),)),
            Replica(1 / 2, (_st(0, 1, "1/0/0"), _st(1, 6, "1/0/1")))))),
}

CASES_2 = {
    # Interleaved 1F1B: 2 ranks x 2 virtual stages, uneven.
    "interleaved_gpt2": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, replicas=(
            Replica(1.0, (_st(0, 2, "0/0/0"), _st(2, 3, "0/0/1"), _st(3, 4, "0/0/0"), _st(4, 6, "0/0/1"))),))),
    # A python: model (embedding, two blocks, head), two uneven replicas of one stage each.
    "python_toy_dp": (RunnableSpec("toy", python_spec="python:tests.fixtures.toy:build"), Plan(
        global_batch=3, micro_batch=1, seq_len=SEQ, schedule="gpipe", replicas=(
            Replica(2 / 3, (_st(0, 4, "0/0/0"),)), Replica(1 / 3, (_st(0, 4, "0/0/1"),))))),
}

TRAIN_STEPS = 4


class _Recorder:
    """Hooks that count calls by kind and add up bytes."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def _add(self, kind: str, num_bytes: int = 0) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes[kind] = self.bytes.get(kind, 0) + num_bytes

    def on_compute(self, stage_index: int, kind: str, seconds: float) -> None:
        assert seconds >= 0
        self._add(kind)

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        self._add(f"send_to_{peer_rank}", num_bytes)

    def on_collective(self, kind: str, num_bytes: int, group_ranks: tuple[int, ...]) -> None:
        self._add(kind, num_bytes)


def _one_step(rank: int, world: int, out: str, cases: dict) -> None:
    from hetpart.runtime.engine import Executor

    for name, (spec, plan) in cases.items():
        hooks = _Recorder()
        ex = Executor(plan, spec, rank, world, hooks=hooks)
        loss = ex.global_loss(ex.forward_backward(0))
        ex.sync_gradients()
        torch.save({"loss": loss, "grads": ex.local_gradients(), "schedule": ex.schedule_used,
                    "calls": hooks.calls, "bytes": hooks.bytes}, Path(out, f"{name}_{rank}.pt"))


def _train(rank: int, world: int, out: str, spec: RunnableSpec, plan: Plan) -> None:
    from hetpart.runtime.engine import Executor

    ex = Executor(plan, spec, rank, world, lr=3e-3)
    results = [ex.step(s) for s in range(TRAIN_STEPS)]
    torch.save({"losses": [r.loss for r in results], "timing": [r.timing for r in results],
                "memory": [(r.peak_memory_bytes, r.memory_source) for r in results]}, Path(out, f"train_{rank}.pt"))


def _job_4(rank: int, world: int, out: str) -> None:
    _one_step(rank, world, out, CASES)
    _train(rank, world, out, *CASES["1f1b_llama"])


def _job_2(rank: int, world: int, out: str) -> None:
    _one_step(rank, world, out, CASES_2)


@pytest.fixture(scope="module")
def out_4() -> Path:
    return run_distributed(_job_4, 4, timeout_s=150)


@pytest.fixture(scope="module")
def out_2() -> Path:
    return run_distributed(_job_2, 2, timeout_s=120)


def _check_against_reference(out: Path, name: str, spec: RunnableSpec, plan: Plan, world: int) -> None:
    from hetpart.runtime.reference import Reference

    ref = Reference(spec, plan.global_batch, plan.seq_len)
    ref_loss = ref.forward_backward(0)
    expected = ref.gradients()
    seen: set[str] = set()
    for rank in range(world):
        got = torch.load(out / f"{name}_{rank}.pt", weights_only=False)
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-5), f"{name}: rank {rank} loss"
        for key, g in got["grads"].items():
            want = expected[key] if g.tp_dim is None else expected[key].chunk(g.tp, g.tp_dim)[g.tp_index]
            torch.testing.assert_close(g.grad, want, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} rank {rank} {key}: {m}")
            seen.add(key)
    assert seen == set(expected), f"{name}: parameters never checked: {sorted(set(expected) - seen)}"


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_matches_reference_4_ranks(out_4: Path, name: str) -> None:
    spec, plan = CASES[name]
    _check_against_reference(out_4, name, spec, plan, 4)


@pytest.mark.parametrize("name", list(CASES_2))
def test_one_step_matches_reference_2_ranks(out_2: Path, name: str) -> None:
    spec, plan = CASES_2[name]
    _check_against_reference(out_2, name, spec, plan, 2)


def test_schedules_are_the_ones_asked(out_4: Path, out_2: Path) -> None:
    assert torch.load(out_4 / "gpipe_gpt2_0.pt", weights_only=False)["schedule"] == "gpipe"
    assert torch.load(out_4 / "1f1b_llama_0.pt", weights_only=False)["schedule"] == "1f1b"
    assert torch.load(out_2 / "interleaved_gpt2_0.pt", weights_only=False)["schedule"] == "interleaved"


def test_hooks_see_every_compute_send_and_collective(out_4: Path) -> None:
    """1F1B, 2 stages of TP=2, 4 micro-batches of 1 x 8 tokens x 32 wide (fp32), 2 blocks per stage."""
    act = 8 * 32 * 4
    for rank in range(4):
        got = torch.load(out_4 / f"1f1b_tp2_gpt_{rank}.pt", weights_only=False)
        calls, sent = got["calls"], got["bytes"]
        last = rank >= 2
        assert calls["fwd"] == 4 and calls["bwd"] == 4
        assert calls.get("loss", 0) == (4 if last else 0)
        peer = rank - 2 if last else rank + 2  # same TP lane, other stage
        assert calls[f"send_to_{peer}"] == 4 and sent[f"send_to_{peer}"] == 4 * act
        # Row-parallel outputs (attn.o, mlp.proj) forward, column-parallel inputs (q, k, v, fc) backward.
        assert calls["tp_all_reduce"] == 4 * 2 * (2 + 4)
        assert sent["tp_all_reduce"] == 4 * 2 * (2 + 4) * act
        # One replica: only the tied embedding/LM-head weight is summed between its two stages.
        assert calls["all_reduce"] == 1 and sent["all_reduce"] == 64 * 32 * 4
    for rank in range(4):
        got = torch.load(out_4 / f"gpipe_gpt2_{rank}.pt", weights_only=False)
        assert got["calls"]["all_reduce"] >= 1  # replicas sync their units


def test_training_follows_reference_and_lowers_loss(out_4: Path) -> None:
    from hetpart.runtime.reference import Reference

    spec, plan = CASES["1f1b_llama"]
    ref = Reference(spec, plan.global_batch, plan.seq_len, lr=3e-3)
    ref_losses = [ref.step(s) for s in range(TRAIN_STEPS)]
    for rank in range(4):
        got = torch.load(out_4 / f"train_{rank}.pt", weights_only=False)
        assert got["losses"] == pytest.approx(ref_losses, rel=1e-4)
        for t in got["timing"]:
            assert t.step_s > 0 and t.compute_s > 0 and t.idle_s >= 0
            assert t.compute_s + t.comm_s + t.optimizer_s <= t.step_s + 1e-6
        assert all(src in ("rss_peak_delta", "rss_peak_since_start") for _, src in got["memory"])
    assert ref_losses[-1] < ref_losses[0] - 0.1, ref_losses


def test_check_runnable_refuses_unequal_tp_in_a_replica() -> None:
    from hetpart.runtime.engine import check_runnable
    from hetpart.runtime.groups import rank_roles

    spec = RunnableSpec("gpt", _gpt2(), impl="hetpart")
    plan = Plan(global_batch=2, micro_batch=1, seq_len=SEQ, replicas=(
        Replica(1.0, (_st(0, 3, "0/0/0", "0/0/1"), _st(3, 6, "1/0/0"))),))
    assert any("tensor-parallel degrees [1, 2] differ" in p for p in check_runnable(plan, spec))
    with pytest.raises(PlanError, match=r"replicas\[0\]\.stages: tensor-parallel degrees \[1, 2\] differ"):
        rank_roles(plan)
