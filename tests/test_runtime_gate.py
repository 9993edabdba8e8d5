"""The runtime's correctness gate: a partitioned run equals the single-process reference.

For GPipe, 1F1B and interleaved 1F1B, uneven pipeline stages, uneven data-parallel shares, replicas
cutting the model at different places, TP=2 (also mixed with TP=1 replicas, and pipelines whose stages
differ in TP: TP2 -> TP1, TP1 -> TP2, TP1 -> TP2 -> TP1), tied embeddings split
across stages, and the transformers GPT-2 and Llama as well as hetpart's own GPT and a ``python:``
model: after one step, the loss and every parameter's gradient (each rank's shard) equal those of
:class:`hetpart.runtime.reference.Reference` (``torch.testing.assert_close``, fp32, gloo on CPU). A few
Adam steps follow the reference's losses and lower the loss.

Several plans run in one spawned job (each builds its own groups) to keep process start-up cheap.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hetpart.errors import PlanError
from hetpart.graph.transformer import TransformerConfig
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

SEQ = 8


def _gpt2(layers: int = 4) -> TransformerConfig:
    return TransformerConfig("gpt2", layers, 32, 4, 64, 16)


def _llama(layers: int = 4) -> TransformerConfig:
    return TransformerConfig("llama", layers, 32, 4, 64, 16, ffn_hidden_size=64, num_kv_heads=2,
                             tied_embeddings=False, activation="swiglu", norm="rmsnorm", bias=False,
                             learned_positions=False, dropout=False)


def _llama_head_dim(layers: int = 4) -> TransformerConfig:
    """Heads wider than hidden / heads (Gemma, Qwen3): queries and attention output 4 x 16 = 64 wide."""
    return replace(_llama(layers), head_size=16)


def _gpt_rotary(layers: int = 4) -> TransformerConfig:
    """A GPT of another lineage (GPT-NeoX, Falcon): no learned positions, grouped kv heads, wide heads."""
    return TransformerConfig("gpt", layers, 32, 4, 64, 16, num_kv_heads=2, learned_positions=False,
                             dropout=False, head_size=16)


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
    # Three stages TP1 -> TP2 -> TP1: the middle stage receives from one rank and sends to it from two.
    "1f1b_tp1_tp2_tp1_llama": (RunnableSpec("llama", _llama(), impl="transformers"), Plan(
        global_batch=6, micro_batch=1, seq_len=SEQ, schedule="1f1b", replicas=(
            Replica(1.0, (_st(0, 2, "0/0/0"), _st(2, 4, "0/0/1", "0/0/2"), _st(4, 6, "1/0/0"))),))),
    # One replica, two stages of TP=2 (hetpart GPT: column/row-wise attention and MLP).
    "1f1b_tp2_gpt": (RunnableSpec("gpt", _gpt2(), impl="hetpart"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="1f1b", replicas=(
            Replica(1.0, (_st(0, 3, "0/0/0", "0/0/1"), _st(3, 6, "1/0/0", "1/0/1"))),))),
    # A TP=2 replica (one stage) next to a TP=1 pipeline: unit gradients exchanged at full size.
    "gpipe_tp_mixed_llama": (RunnableSpec("llama", _llama(), impl="transformers"), Plan(
        global_batch=6, micro_batch=1, seq_len=SEQ, schedule="gpipe", replicas=(
            Replica(1 / 2, (_st(0, 6, "0/0/0", "0/0/1"),)),
            Replica(1 / 2, (_st(0, 1, "1/0/0"), _st(1, 6, "1/0/1")))))),
    # Activation recomputation changes memory, not gradients.
    "1f1b_tp2_gpt2_full_recompute": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), Plan(
        global_batch=4, micro_batch=2, seq_len=SEQ, schedule="1f1b", recompute="full", replicas=(
            Replica(1 / 2, (_st(0, 6, "0/0/0", "0/0/1"),)), Replica(1 / 2, (_st(0, 6, "1/0/0", "1/0/1"),))))),
}

CASES_2 = {
    # Interleaved 1F1B: 2 ranks x 2 virtual stages, uneven.
    "interleaved_gpt2": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, replicas=(
            Replica(1.0, (_st(0, 2, "0/0/0"), _st(2, 3, "0/0/1"), _st(3, 4, "0/0/0"), _st(4, 6, "0/0/1"))),))),
    # A python: model (embedding, two blocks, head), two uneven replicas of one stage each.
    "gpipe_llama_selective_recompute": (RunnableSpec("llama", _llama(), impl="transformers"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="gpipe", recompute="selective", replicas=(
            Replica(1.0, (_st(0, 3, "0/0/0"), _st(3, 6, "0/0/1"))),))),
    # head_dim apart from hidden / heads, tensor-parallel: the heads split, each 16 wide.
    "1f1b_tp2_llama_head_dim": (RunnableSpec("llama-hd", _llama_head_dim(), impl="transformers"), Plan(
        global_batch=4, micro_batch=2, seq_len=SEQ, schedule="1f1b", replicas=(
            Replica(1.0, (_st(0, 6, "0/0/0", "0/0/1"),)),))),
    "gpipe_tp2_gpt_rotary_head_dim": (RunnableSpec("gpt-hd", _gpt_rotary(), impl="hetpart"), Plan(
        global_batch=4, micro_batch=2, seq_len=SEQ, schedule="gpipe", replicas=(
            Replica(1.0, (_st(0, 6, "0/0/0", "0/0/1"),)),))),
    "python_toy_dp": (RunnableSpec("toy", python_spec="python:tests.fixtures.toy:build"), Plan(
        global_batch=3, micro_batch=1, seq_len=SEQ, schedule="gpipe", replicas=(
            Replica(2 / 3, (_st(0, 4, "0/0/0"),)), Replica(1 / 3, (_st(0, 4, "0/0/1"),))))),
}

def _mixed_tp(schedule: str, first_tp: int, cut: int = 3, global_batch: int = 4, micro_batch: int = 1) -> Plan:
    """One replica, two stages: ``first_tp`` ranks then ``3 - first_tp`` (TP2 -> TP1 or TP1 -> TP2)."""
    a = [f"0/0/{i}" for i in range(first_tp)]
    b = [f"1/0/{i}" for i in range(3 - first_tp)]
    return Plan(global_batch=global_batch, micro_batch=micro_batch, seq_len=SEQ, schedule=schedule, replicas=(
        Replica(1.0, (_st(0, cut, *a), _st(cut, 6, *b))),))


CASES_3 = {
    # Stages of different TP degrees: the activation is resharded at the boundary (every receiving TP
    # rank gets the whole activation; gradients come back from one rank of the next stage each).
    "1f1b_tp2_to_tp1_gpt2": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), _mixed_tp("1f1b", 2)),
    "gpipe_tp2_to_tp1_llama": (RunnableSpec("llama", _llama(), impl="transformers"), _mixed_tp("gpipe", 2, cut=2)),
    "1f1b_tp1_to_tp2_gpt": (RunnableSpec("gpt", _gpt2(), impl="hetpart"), _mixed_tp("1f1b", 1, global_batch=8,
                                                                                    micro_batch=2)),
    "gpipe_tp1_to_tp2_gpt2": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), _mixed_tp("gpipe", 1, cut=4)),
    # 1F1B where a replica has fewer micro-batches (1) than stages (2): it runs GPipe, same step.
    "1f1b_fallback_3_ranks": (RunnableSpec("gpt2", _gpt2(), impl="transformers"), Plan(
        global_batch=3, micro_batch=1, seq_len=SEQ, schedule="1f1b", replicas=(
            Replica(1 / 3, (_st(0, 3, "0/0/0"), _st(3, 6, "0/0/1"))), Replica(2 / 3, (_st(0, 6, "1/0/0"),))))),
    # Interleaved: a 2-rank replica (4 virtual stages) next to a 1-rank replica holding both its chunks.
    "interleaved_3_ranks": (RunnableSpec("llama", _llama(), impl="transformers"), Plan(
        global_batch=4, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, replicas=(
            Replica(1 / 2, (_st(0, 1, "0/0/0"), _st(1, 3, "0/0/1"), _st(3, 4, "0/0/0"), _st(4, 6, "0/0/1"))),
            Replica(1 / 2, (_st(0, 4, "1/0/0"), _st(4, 6, "1/0/0")))))),
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

    from hetpart._torch_compat import functional_collectives

    funcol = functional_collectives()

    issue = funcol.all_reduce
    for name, (spec, plan) in cases.items():
        hooks = _Recorder()
        ex = Executor(plan, spec, rank, world, hooks=hooks)
        issued = [0]  # the all-reduces torch's tensor parallelism really issues (DTensor -> funcol)

        def counted(*args, issued=issued, **kwargs):
            issued[0] += 1
            return issue(*args, **kwargs)

        if max(s.tp for s in plan.replicas[ex.replica].stages) > 1:
            ex.forward_backward(0)  # the first step also infers shapes (forwards that report nothing)
            hooks.calls.clear()
            hooks.bytes.clear()
        funcol.all_reduce = counted
        try:
            local = ex.forward_backward(0)  # grads are reset: the same step again
        finally:
            funcol.all_reduce = issue
        loss = ex.global_loss(local)
        ex.sync_gradients()
        stage_ranks = [ex.stage_rank(k) for k in range(plan.replicas[ex.replica].pp)]
        torch.save({"loss": loss, "grads": ex.local_gradients(), "schedule": ex.schedule_used,
                    "calls": hooks.calls, "bytes": hooks.bytes, "stage_ranks": stage_ranks,
                    "tp_all_reduces_issued": issued[0]},
                   Path(out, f"{name}_{rank}.pt"))


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


def _job_3(rank: int, world: int, out: str) -> None:
    _one_step(rank, world, out, CASES_3)


@pytest.fixture(scope="module")
def out_3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_distributed(_job_3, 3, timeout_s=300, out_dir=str(tmp_path_factory.mktemp("gate3")))


@pytest.fixture(scope="module")
def out_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_distributed(_job_4, 4, timeout_s=240, out_dir=str(tmp_path_factory.mktemp("gate4")))


@pytest.fixture(scope="module")
def out_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_distributed(_job_2, 2, timeout_s=120, out_dir=str(tmp_path_factory.mktemp("gate2")))


def _check_against_reference(out: Path, name: str, spec: RunnableSpec, plan: Plan, world: int) -> int:
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
            torch.testing.assert_close(g.grad, want, rtol=1e-4, atol=1e-6, msg=lambda m, where=f"{name} rank {rank} {key}": f"{where}: {m}")
            seen.add(key)
    assert seen == set(expected), f"{name}: parameters never checked: {sorted(set(expected) - seen)}"
    return len(seen)


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_matches_reference_4_ranks(out_4: Path, name: str) -> None:
    spec, plan = CASES[name]
    assert _check_against_reference(out_4, name, spec, plan, 4) > 0  # parameters whose gradients matched


@pytest.mark.parametrize("name", list(CASES_2))
def test_one_step_matches_reference_2_ranks(out_2: Path, name: str) -> None:
    spec, plan = CASES_2[name]
    assert _check_against_reference(out_2, name, spec, plan, 2) > 0  # parameters whose gradients matched


@pytest.mark.parametrize("name", list(CASES_3))
def test_one_step_matches_reference_3_ranks(out_3: Path, name: str) -> None:
    spec, plan = CASES_3[name]
    assert _check_against_reference(out_3, name, spec, plan, 3) > 0  # parameters whose gradients matched
    if name == "1f1b_fallback_3_ranks":
        used = [torch.load(out_3 / f"{name}_{r}.pt", weights_only=False)["schedule"] for r in range(3)]
        assert used == ["gpipe", "gpipe", "1f1b"]


def test_stage_ranks_follow_the_plan(out_2: Path, out_4: Path) -> None:
    assert torch.load(out_2 / "interleaved_gpt2_1.pt", weights_only=False)["stage_ranks"] == [0, 1, 0, 1]
    assert torch.load(out_4 / "1f1b_tp2_gpt_1.pt", weights_only=False)["stage_ranks"] == [1, 3]  # TP lane 1


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
        # Per block, Megatron's 2 + 2: row-parallel outputs (attn.o, mlp.proj) in the forward; in the
        # backward the input gradients of q, k and v (summed locally: one all-reduce) and of mlp.fc.
        assert calls["tp_all_reduce"] == 4 * 2 * (2 + 2)
        assert sent["tp_all_reduce"] == 4 * 2 * (2 + 2) * act
        # ... and that is what torch really issued (DTensor all-reduces; 2 + 4 before QKV was fused).
        assert got["tp_all_reduces_issued"] == 4 * 2 * (2 + 2)
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
        assert got["losses"][-1] < got["losses"][0] - 0.1, got["losses"]
        for t in got["timing"]:
            assert t.step_s > 0 and t.compute_s > 0 and t.idle_s >= 0
            assert t.compute_s + t.comm_s + t.optimizer_s <= t.step_s + 1e-6
        assert all(src in ("rss_peak_delta", "rss_peak_since_start") for _, src in got["memory"])
    assert ref_losses[-1] < ref_losses[0] - 0.1, ref_losses


def test_check_runnable_refuses_unequal_tp_only_where_the_schedule_cannot_run_it() -> None:
    from hetpart.runtime.engine import check_runnable, require_runnable

    spec = RunnableSpec("gpt", _gpt2(), impl="hetpart")
    for schedule in ("gpipe", "1f1b"):
        assert check_runnable(_mixed_tp(schedule, 2), spec) == []
    interleaved = Plan(global_batch=2, micro_batch=1, seq_len=SEQ, schedule="interleaved", interleave=2, replicas=(
        Replica(1.0, (_st(0, 2, "0/0/0", "0/0/1"), _st(2, 3, "1/0/0"), _st(3, 4, "0/0/0", "0/0/1"),
                      _st(4, 6, "1/0/0"))),))
    with pytest.raises(PlanError, match=r"replicas\[0\]\.stages: tensor-parallel degrees \[1, 2\] differ, which "
                                        "schedule 'interleaved' does not run"):
        require_runnable(interleaved, spec)


def test_mixed_tp_boundaries_fan_out_to_every_receiving_rank(out_3: Path, out_4: Path) -> None:
    """TP1 -> TP2 (4 micro-batches of 2): rank 0 sends each activation to both TP ranks of stage 1; only
    TP rank 0 of stage 1 sends the gradient back. TP2 -> TP1: only TP rank 0 sends forward, and rank 2
    sends each gradient to both. Bytes: 2 x 8 tokens x 32 wide (fp32) per micro-batch."""
    act = 2 * 8 * 32 * 4
    calls = [torch.load(out_3 / f"1f1b_tp1_to_tp2_gpt_{r}.pt", weights_only=False)["calls"] for r in range(3)]
    assert calls[0]["send_to_1"] == calls[0]["send_to_2"] == 4
    assert calls[1]["send_to_0"] == 4 and "send_to_0" not in calls[2]
    sent = torch.load(out_3 / "1f1b_tp1_to_tp2_gpt_0.pt", weights_only=False)["bytes"]
    assert sent["send_to_1"] == sent["send_to_2"] == 4 * act
    calls = [torch.load(out_3 / f"1f1b_tp2_to_tp1_gpt2_{r}.pt", weights_only=False)["calls"] for r in range(3)]
    assert calls[0]["send_to_2"] == 4 and "send_to_2" not in calls[1]
    assert calls[2]["send_to_0"] == calls[2]["send_to_1"] == 4
    # The middle stage (TP2) of TP1 -> TP2 -> TP1: its rank 1 (TP index 0) sends on and back, rank 2 neither.
    calls = [torch.load(out_4 / f"1f1b_tp1_tp2_tp1_llama_{r}.pt", weights_only=False)["calls"] for r in range(4)]
    assert calls[1]["send_to_3"] == calls[1]["send_to_0"] == 6
    assert not any(k.startswith("send_to") for k in calls[2])
    assert calls[3]["send_to_1"] == calls[3]["send_to_2"] == 6


# ----------------------------------------------------------------------------------- units and groups
def test_scaled_config_keeps_units_and_fits_tensor_parallelism() -> None:
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.runtime.models import scaled_config, scaled_seq_len

    for name, full in MODEL_CATALOG.items():
        for scale, tp in (("tiny", 1), ("tiny", 4), ("small", 8), (96, 2)):
            c = scaled_config(full, scale, heads_multiple_of=tp)
            assert c.num_layers == full.num_layers and c.family == full.family, name
            assert c.hidden_size <= max(256, int(scale) if isinstance(scale, int) else 0) + 8 * tp, name
            assert c.num_heads % tp == 0 and c.kv_heads % tp == 0 and c.ffn % tp == 0, (name, scale, tp)
            assert c.hidden_size % c.num_heads == 0 and c.num_heads % c.kv_heads == 0, (name, scale, tp)
            assert c.vocab_size <= full.vocab_size and (c.num_kv_heads == 0) == (full.num_kv_heads == 0)
    assert scaled_seq_len(2048, "tiny") == 32 and scaled_seq_len(16, "small") == 16


def test_scale_errors_name_the_fix() -> None:
    from hetpart.errors import ModelError
    from hetpart.runtime.models import runnable_spec, scaled_config

    with pytest.raises(ModelError, match=r"--scale: unknown scale 'huge'; use tiny, small or a hidden size"):
        scaled_config(_gpt2(), "huge")
    with pytest.raises(ModelError, match=r"--hidden-size: 4 is outside 8\.\.65536"):
        scaled_config(_gpt2(), 4)
    with pytest.raises(ModelError, match=r"--model: unknown model 'gpt5'"):
        runnable_spec("gpt5", "tiny")
    with pytest.raises(ModelError, match=r"llama2-7b \(llama: SwiGLU, RMSNorm\) is not a GPT shape"):
        runnable_spec("llama2-7b", "tiny", impl="hetpart")
    assert runnable_spec("opt-350m", "tiny").impl == "hetpart" and runnable_spec("llama2-7b", "tiny").impl == "transformers"


def _not_sequential():
    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.b(self.a(x))

    return Residual(), torch.zeros(1, 4)


def test_python_model_must_split_into_a_sequence() -> None:
    from hetpart.errors import ModelError
    from hetpart.runtime.models import runnable_spec

    with pytest.raises(ModelError, match=r"_not_sequential: running its units one after the other does not give"):
        runnable_spec("python:tests.test_runtime_gate:_not_sequential")
    with pytest.raises(ModelError, match=r"calling the model function failed: RuntimeError: weights file not found"):
        runnable_spec("python:tests.fixtures.toy:build_fails")
    spec = runnable_spec("python:tests.fixtures.toy:build")
    assert spec.num_units == 4  # embedding, block_0, block_1, head: as hetpart.graph.trace splits it


@pytest.mark.parametrize("model", ["gpt2-small", "llama3-8b"])
def test_transformers_units_compute_the_transformers_model(model: str) -> None:
    """The units chained give the logits of the whole transformers model with the same weights, and
    each unit holds exactly the parameters hetpart's unit graph gives it."""
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime import models as M

    torch.manual_seed(0)
    spec = M.runnable_spec(model, "tiny", max_tp=2)
    cfg = spec.config
    hf = M._hf_model(cfg)
    make = M._gpt2_unit if cfg.family == "gpt2" else M._llama_unit
    units = [make(hf, cfg, i) for i in range(spec.num_units)]
    for u in units:
        M._materialise(u, spec.seed, torch.device("cpu"), torch.float32)
    hf.lm_head.weight = hf.get_input_embeddings().weight if cfg.tied_embeddings else units[-1].body["lm_head"].weight
    if cfg.family == "llama":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        hf.model.rotary_emb = LlamaRotaryEmbedding(hf.config)
    x, _ = M.synthetic_batch(spec, 2, 16)
    h = x
    for u in units:
        h = u(h)
    torch.testing.assert_close(h, hf(x).logits)
    graph = transformer_graph(cfg, model, 16)
    for info, unit in zip(M.unit_infos(spec), graph.units):
        own = sum(math.prod(p.shape) for p in info.params if p.key.startswith(info.name + "."))
        tied = sum(math.prod(p.shape) for p in info.params if not p.key.startswith(info.name + "."))
        assert (info.name, own, tied) == (unit.name, unit.params, unit.shared_params)


def test_comm_layout_of_replicas_with_different_cuts_and_tp() -> None:
    from hetpart.runtime.groups import backend_for, comm_layout
    from hetpart.runtime.models import unit_infos

    spec = RunnableSpec("gpt", _gpt2(), impl="hetpart")
    plan = Plan(global_batch=6, micro_batch=1, seq_len=SEQ, replicas=(
        Replica(1 / 2, (_st(0, 2, "0/0/0", "0/0/1"), _st(2, 6, "0/1/0", "0/1/1"))),  # ranks 0,1 | 2,3
        Replica(1 / 2, (_st(0, 4, "1/0/0"), _st(4, 6, "1/0/1")))))  # ranks 4 | 5
    layout = comm_layout(plan, unit_infos(spec))
    assert layout.lanes == {(0, 0): (0, 2), (0, 1): (1, 3), (1, 0): (4, 5)}
    assert layout.tp_groups[(0, 1)] == (2, 3) and layout.roles[5].units == (4, 5)
    by_unit = {}
    for b in layout.buckets:
        by_unit.setdefault(b.unit, []).append(b)
    # block_0 (unit 1): ranks 0,1 (TP 2) and rank 4 (TP 1) -> one full-size bucket of all three.
    assert [(b.ranks, b.full) for b in by_unit[1]] == [((0, 1, 4), True)]
    # block_3 (unit 4): ranks 2,3 (TP 2) and 5 -> full-size; the tied embedding spans every holder copy.
    assert [(b.ranks, b.full) for b in by_unit[4]] == [((2, 3, 5), True)]
    tied = [b for b in by_unit[0] if "embedding.wte.weight" in b.keys]
    assert [b.ranks for b in tied] == [(0, 1, 2, 3, 4, 5)]
    assert backend_for((0, 1), ["nvidia|h:0", "nvidia|h:1"]) == "nccl"
    assert backend_for((0, 1), ["nvidia|h:0", "nvidia|h:0"]) == "gloo"  # NCCL refuses two ranks on one GPU
    assert backend_for((0, 1), ["nvidia|h:0", None]) == "gloo"
    assert backend_for((0, 1), ["nvidia|h:0", "amd|g:0"]) == "gloo"  # across vendors
    assert backend_for((1, 2), ["nvidia|h:0", "amd|g:0", "amd|g:1"]) == "nccl"  # RCCL among AMD GPUs


def test_gradient_buckets_fuse_per_rank_set_in_one_global_order() -> None:
    from hetpart.runtime.groups import GradBucket, fuse_buckets

    def b(ranks, unit, *keys, full=False):
        return GradBucket(ranks=ranks, keys=keys, full=full, unit=unit)

    buckets = [b((0, 2), 0, "e"), b((0, 1, 2), 0, "tied"), b((0, 2), 1, "a", "a.b"), b((1, 3), 2, "c"),
               b((0, 2), 2, "d"), b((1, 3), 3, "f", full=True), b((1, 3), 3, "g")]
    sizes = {"e": 4, "tied": 8, "a": 3, "a.b": 1, "c": 5, "d": 9, "f": 2, "g": 2}
    fused = fuse_buckets(buckets, sizes.__getitem__)
    # Largest first (17, 8, 7, 2 elements): disjoint rank sets' big all-reduces before the small ones.
    assert [(f.ranks, f.full, f.keys, f.units) for f in fused] == [
        ((0, 2), False, ("e", "a", "a.b", "d"), (0, 1, 2)), ((0, 1, 2), False, ("tied",), (0,)),
        ((1, 3), False, ("c", "g"), (2, 3)), ((1, 3), True, ("f",), (3,))]
    assert fuse_buckets(buckets, {**sizes, "tied": 1}.__getitem__)[1].ranks == (1, 3)
    # A cap of 8 elements: (0, 2) splits where its next unit would pass it; a 9-element key goes alone
    # (and, larger, first).
    capped = fuse_buckets(buckets, sizes.__getitem__, cap=8)
    assert [f.keys for f in capped if f.ranks == (0, 2)] == [("d",), ("e", "a", "a.b")]
    with pytest.raises(ValueError, match="cap"):
        fuse_buckets(buckets, sizes.__getitem__, cap=0)


@pytest.mark.parametrize("impl,cfg", [("hetpart", _gpt2(2)), ("transformers", _gpt2(2)), ("transformers", _llama(2))])
def test_recompute_keeps_fewer_activations(impl: str, cfg: TransformerConfig) -> None:
    from hetpart.runtime.models import build_units, synthetic_batch

    spec = RunnableSpec("m", cfg, impl=impl)
    x, _ = synthetic_batch(spec, 2, SEQ)

    def saved_bytes(mode: str) -> int:
        units = build_units(spec, range(1, 3))  # the two blocks
        for u in units:
            u.set_recompute(mode)
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        h = torch.randn(2, SEQ, cfg.hidden_size, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for u in units:
                h = u(h)
        h.sum().backward()
        return total

    none, selective, full = saved_bytes("none"), saved_bytes("selective"), saved_bytes("full")
    assert full < selective < none, (full, selective, none)


def test_executor_refuses_what_it_cannot_run() -> None:
    import torch.distributed as dist

    from hetpart.errors import RuntimeFault
    from hetpart.runtime.engine import Executor
    from tests._dist import free_port

    spec = RunnableSpec("gpt2", _gpt2(), impl="hetpart")
    one = Plan(global_batch=2, micro_batch=1, seq_len=SEQ, replicas=(Replica(1.0, (_st(0, 6, "0/0/0"),)),))
    with pytest.raises(RuntimeFault, match="torch.distributed is not initialised; start the ranks with torchrun"):
        Executor(one, spec, 0, 1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        two = Plan(global_batch=2, micro_batch=1, seq_len=SEQ, replicas=(
            Replica(1.0, (_st(0, 3, "0/0/0"), _st(3, 6, "0/0/1"))),))
        with pytest.raises(RuntimeFault, match="the plan has 2 devices but the job has 1 processes"):
            Executor(two, spec, 0, 1)
        short = Plan(global_batch=2, micro_batch=1, seq_len=SEQ, replicas=(Replica(1.0, (_st(0, 5, "0/0/0"),)),))
        with pytest.raises(PlanError, match="plan: covers 5 units but gpt2 has 6; plan and model must match"):
            Executor(short, spec, 0, 1)
        long_seq = Plan(global_batch=2, micro_batch=1, seq_len=64, replicas=(Replica(1.0, (_st(0, 6, "0/0/0"),)),))
        with pytest.raises(PlanError, match="seq_len: 64 exceeds the 16 positions of the model that runs"):
            Executor(long_seq, spec, 0, 1)
        # A one-rank plan runs in this process and matches the reference.
        from hetpart.runtime.reference import Reference

        ex = Executor(one, spec, 0, 1)
        loss = ex.global_loss(ex.forward_backward(0))
        ref = Reference(spec, 2, SEQ)
        assert loss == pytest.approx(ref.forward_backward(0), rel=1e-5)
        grads = ref.gradients()
        for key, g in ex.local_gradients().items():
            torch.testing.assert_close(g.grad, grads[key])
        # bf16 parameters and activations (the loss in fp32): a close loss, a step that trains.
        bf16 = Executor(one, spec, 0, 1, dtype=torch.bfloat16)
        first = bf16.step(0)
        assert first.loss == pytest.approx(loss, rel=2e-2)
        assert all(p.dtype == torch.bfloat16 for p in bf16.params.values())
    finally:
        dist.destroy_process_group()


def test_gpt2_linear_projections_compute_the_conv1d_model() -> None:
    """The transformers GPT-2 with its Conv1D projections (x @ W + b) gives the same logits as the
    units, whose projections are nn.Linear with q, k, v apart (weights copied across, W = A.T)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from hetpart.runtime.models import build_units, synthetic_batch

    cfg = _gpt2(2)
    spec = RunnableSpec("gpt2", cfg, impl="transformers")
    units = build_units(spec, range(spec.num_units))
    hf = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        t = hf.transformer
        t.wte.weight.copy_(units[0].body["wte"].weight)
        t.wpe.weight.copy_(units[0].body["wpe"].weight)
        for block, unit in zip(t.h, units[1:-1]):
            b = unit.body
            qkv = b.attn.c_attn
            block.ln_1.load_state_dict(b.ln_1.state_dict())
            block.ln_2.load_state_dict(b.ln_2.state_dict())
            block.attn.c_attn.weight.copy_(torch.cat([qkv.q.weight, qkv.k.weight, qkv.v.weight]).T)
            block.attn.c_attn.bias.copy_(torch.cat([qkv.q.bias, qkv.k.bias, qkv.v.bias]))
            for conv, lin in ((block.attn.c_proj, b.attn.c_proj), (block.mlp.c_fc, b.mlp.c_fc),
                              (block.mlp.c_proj, b.mlp.c_proj)):
                conv.weight.copy_(lin.weight.T)
                conv.bias.copy_(lin.bias)
        t.ln_f.load_state_dict(units[-1].body["ln_f"].state_dict())
    x, _ = synthetic_batch(spec, 2, SEQ)
    h = x
    for u in units:
        h = u(h)
    torch.testing.assert_close(h, hf(x).logits)


@pytest.mark.parametrize("cfg, impl", [(_llama_head_dim(), "transformers"), (_gpt_rotary(), "hetpart"),
                                       (_llama(), "transformers"), (_gpt2(), "hetpart")])
def test_the_runners_hold_the_parameters_the_graph_counts(cfg: TransformerConfig, impl: str) -> None:
    """The modules a run builds have the parameters the unit graph prices (head_dim apart from the width,
    rotary positions without a position table, grouped kv heads)."""
    from hetpart.graph.transformer import transformer_graph
    from hetpart.runtime.reference import Reference

    ref = Reference(RunnableSpec("m", cfg, impl=impl), 2, SEQ)
    assert sum(p.numel() for p in ref.params.values()) == transformer_graph(cfg, "m", SEQ).num_params
