"""Uneven tensor parallelism at run time (issue 17): a partitioned run equals the single-process reference.

Splits 4:2 and 5:1 of 6 heads (hetpart's GPT, transformers GPT-2), a 3-way 5:4:3 of 12 heads, a
grouped-query Llama split in whole key/value groups, vocabulary splits 5:3 and 30:20:14 (tied and untied
embeddings, vocabulary-parallel cross-entropy), alone, inside a pipeline (uneven stage next to an
even one and a TP1 stage; a split embedding with a whole tied head and the reverse), and in replicas with uneven batch shares whose splits differ (gradients
exchanged at full size, slices at prefix-sum offsets): loss within 1e-6 relative, every local gradient
slice equal to the reference's slice at its offset, and the losses and parameters equal after several
optimizer steps (SGD, see ``LR``).
gloo on CPU, fp32.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetpart.graph.transformer import TransformerConfig
from hetpart.plan import Plan, Replica, Stage, TPSplit
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

SEQ = 8
STEPS = 3
LR = 0.5
"""SGD: Adam divides each gradient by its own size, so an element whose gradient is ~0 (key biases:
softmax ignores a shift of every score) moves by rounding noise and parameters could only be compared
loosely; SGD moves each by lr x its gradient, which the test compares to 1e-6."""


def _gpt(heads: int = 6, ffn: int = 96) -> TransformerConfig:
    return TransformerConfig("gpt2", 2, 8 * heads, heads, 64, 16, ffn_hidden_size=ffn)


def _llama() -> TransformerConfig:  # 8 heads in 4 key/value groups of 2
    return TransformerConfig("llama", 2, 32, 8, 64, 16, ffn_hidden_size=64, num_kv_heads=4, tied_embeddings=False,
                             activation="swiglu", norm="rmsnorm", bias=False, learned_positions=False, dropout=False)


def _st(first: int, last: int, devices, heads=(), ffn=(), vocab=()) -> Stage:
    split = TPSplit(heads=tuple(heads), ffn=tuple(ffn), vocab=tuple(vocab)) if heads or ffn or vocab else None
    return Stage((first, last), tuple(devices), len(devices), split)


def _plan(*replicas: Replica, batch: int = 6, mb: int = 1, schedule: str = "gpipe") -> Plan:
    return Plan(global_batch=batch, micro_batch=mb, seq_len=SEQ, schedule=schedule, replicas=tuple(replicas))


A, B, C = ("0/0/0", "0/0/1"), ("0/0/2",), ("0/0/0", "0/0/1", "0/0/2")
CASES: dict[str, tuple[RunnableSpec, Plan]] = {
    # one stage, 4:2 of 6 heads, MLP 64:32 (hetpart's GPT)
    "gpt_4_2": (RunnableSpec("gpt", _gpt(), impl="hetpart"), _plan(Replica(1.0, (_st(0, 4, A, (4, 2), (64, 32)),)))),
    # transformers GPT-2, 5:1, heads only (MLP even)
    "gpt2_5_1": (RunnableSpec("gpt2", _gpt(), impl="transformers"),
                 _plan(Replica(1.0, (_st(0, 4, A, (5, 1)),)), schedule="1f1b")),
    # a 3-way 5:4:3 of 12 heads, MLP 80:56:56
    "gpt2_5_4_3": (RunnableSpec("gpt2", _gpt(12, 192), impl="transformers"),
                   _plan(Replica(1.0, (_st(0, 4, C, (5, 4, 3), (80, 56, 56)),)))),
    # grouped-query Llama: 6:2 heads (3:1 key/value groups), MLP 40:24
    "llama_gqa_6_2": (RunnableSpec("llama", _llama(), impl="transformers"),
                      _plan(Replica(1.0, (_st(0, 4, A, (6, 2), (40, 24)),)), batch=4, mb=2)),
    # a pipeline: an uneven TP2 stage, then a TP1 stage
    "pipe_uneven_then_tp1": (RunnableSpec("gpt", _gpt(), impl="hetpart"),
                             _plan(Replica(1.0, (_st(0, 2, A, (4, 2), (72, 24)), _st(2, 4, B))), schedule="1f1b")),
    # uneven batch shares 2/3 : 1/3, a 5:1 TP2 replica next to a TP1 replica (full-size gradient exchange)
    "dp_uneven_vs_tp1": (RunnableSpec("gpt2", _gpt(), impl="transformers"),
                         _plan(Replica(2 / 3, (_st(0, 4, A, (5, 1), (80, 16)),)), Replica(1 / 3, (_st(0, 4, B),)))),
    # the vocabulary split 5:3 (40:24 of 64 rows) with heads 4:2, tied embedding and head on one stage
    "gpt_vocab_5_3": (RunnableSpec("gpt", _gpt(), impl="hetpart"),
                      _plan(Replica(1.0, (_st(0, 4, A, (4, 2), (64, 32), (40, 24)),)))),
    # a 3-way vocabulary split alone (heads and MLP even), transformers GPT-2 (tied)
    "gpt2_vocab_3way": (RunnableSpec("gpt2", _gpt(12, 192), impl="transformers"),
                        _plan(Replica(1.0, (_st(0, 4, C, vocab=(30, 20, 14)),)), schedule="1f1b")),
    # an untied Llama: embedding and head sliced on their own, 5:3
    "llama_vocab_5_3": (RunnableSpec("llama", _llama(), impl="transformers"),
                        _plan(Replica(1.0, (_st(0, 4, A, (6, 2), (40, 24), (40, 24)),)), batch=4, mb=2)),
    # a pipeline: the embedding split 5:3 in a TP2 stage, the (tied) head whole on a TP1 stage
    "pipe_vocab_then_tp1": (RunnableSpec("gpt", _gpt(), impl="hetpart"),
                            _plan(Replica(1.0, (_st(0, 2, A, vocab=(40, 24)), _st(2, 4, B))), schedule="1f1b")),
    # a pipeline: the embedding whole on a TP1 stage, the head split 3:5 (and heads 2:4) in a TP2 stage
    "pipe_tp1_then_vocab": (RunnableSpec("gpt2", _gpt(), impl="transformers"),
                            _plan(Replica(1.0, (_st(0, 2, B), _st(2, 4, A, (2, 4), vocab=(24, 40)))))),
}
RESUME = {  # a checkpoint written under the case's split, resumed under another one
    "gpt_4_2": (_st(0, 4, A, (2, 4), (32, 64)),),
    "gpt_vocab_5_3": (_st(0, 4, A, (2, 4), (32, 64), (20, 44)),),
}


def _job(rank: int, world: int, out: str, names: list[str]) -> None:
    from hetpart.runtime.engine import Executor

    for name in names:
        spec, plan = CASES[name]
        if plan.num_devices != world:
            continue
        ex = Executor(plan, spec, rank, world)
        ex.optimizer = torch.optim.SGD(list(ex.params.values()), lr=LR)  # see the test for why not Adam
        local = ex.forward_backward(0)
        loss = ex.global_loss(local)
        ex.sync_gradients()
        grads = ex.local_gradients()
        ex.optimizer.step()
        losses = [loss] + [ex.step(s).loss for s in range(1, STEPS)]
        params = {k: (p.detach().clone(), grads[k]) for k, p in ex.params.items()}
        torch.save({"loss": loss, "grads": grads, "losses": losses, "params": params,
                    "state": ex.state_dict()["tp_slices"]}, Path(out, f"{name}_{rank}.pt"))
        if name in RESUME:  # a checkpoint of the split resumed under another one
            from hetpart.runtime.checkpoint import _state, load_checkpoint, save_checkpoint

            ex.optimizer = torch.optim.Adam(list(ex.params.values()))  # checkpoints hold Adam's state:
            _state(ex, create=True)  # zeros here (the run trained with SGD)
            save_checkpoint(Path(out, f"ckpt_{name}"), ex, STEPS)
            other = Plan(global_batch=6, micro_batch=1, seq_len=SEQ, schedule="gpipe",
                         replicas=(Replica(1.0, RESUME[name]),))
            resumed = Executor(other, spec, rank, world)
            assert load_checkpoint(Path(out, f"ckpt_{name}"), resumed) == STEPS
            torch.save({k: (p.detach().clone(), resumed._slices.get(k)) for k, p in resumed.params.items()},
                       Path(out, f"resumed_{name}_{rank}.pt"))


def _reference(name: str):
    from hetpart.runtime.reference import Reference

    spec, plan = CASES[name]
    ref = Reference(spec, plan.global_batch, plan.seq_len)
    ref.optimizer = torch.optim.SGD(list(ref.params.values()), lr=LR)
    loss = ref.forward_backward(0)
    grads = ref.gradients()
    ref.optimizer.step()
    losses = [loss] + [ref.step(s) for s in range(1, STEPS)]
    return loss, grads, losses, {k: p.detach() for k, p in ref.params.items()}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("uneven")
    run_distributed(_job, 2, sorted(n for n, (_, p) in CASES.items() if p.num_devices == 2), timeout_s=300,
                    out_dir=str(d))
    run_distributed(_job, 3, sorted(n for n, (_, p) in CASES.items() if p.num_devices == 3), timeout_s=300,
                    out_dir=str(d))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_uneven_split_matches_the_reference(out: Path, name: str) -> None:
    _, plan = CASES[name]
    loss, grads, losses, params = _reference(name)
    seen = set()
    for rank in range(plan.num_devices):
        got = torch.load(out / f"{name}_{rank}.pt", weights_only=False)
        assert got["loss"] == pytest.approx(loss, rel=1e-6), f"{name} rank {rank}"
        assert got["losses"] == pytest.approx(losses, rel=1e-5), f"{name} rank {rank}"
        for key, g in got["grads"].items():
            torch.testing.assert_close(g.grad, g.of(grads[key]), rtol=1e-4, atol=1e-6,
                                       msg=lambda m, k=key, rank=rank: f"{name} rank {rank} {k}: {m}")
            p, shard = got["params"][key]
            torch.testing.assert_close(p, shard.of(params[key]), rtol=1e-4, atol=1e-6,
                                       msg=lambda m, k=key, rank=rank: f"{name} rank {rank} {k} after {STEPS} steps: {m}")
            seen.add(key)
    assert seen == set(grads)


@pytest.mark.slow
def test_slices_sit_at_prefix_sum_offsets(out: Path) -> None:
    """5:4:3 of 12 heads of width 8: rank 1's q rows start at 5 heads, rank 2's at 9."""
    offsets = [torch.load(out / f"gpt2_5_4_3_{r}.pt", weights_only=False)["state"] for r in range(3)]
    q = [o["block_0.attn.c_attn.q.weight"] for o in offsets]
    assert q == [(0, 0, 40), (0, 40, 32), (0, 72, 24)]
    assert [o["block_0.attn.c_proj.weight"] for o in offsets] == [(1, 0, 40), (1, 40, 32), (1, 72, 24)]
    assert [o["block_1.mlp.c_fc.weight"] for o in offsets] == [(0, 0, 80), (0, 80, 56), (0, 136, 56)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUME))
def test_a_checkpoint_resumes_under_another_split(out: Path, name: str) -> None:
    """Saved under 4:2 heads (and 5:3 vocabulary rows), loaded under 2:4 (and 20:44): every rank holds the
    reference's slice at its new offset."""
    _, _, _, params = _reference(name)
    for rank in range(2):
        got = torch.load(out / f"resumed_{name}_{rank}.pt", weights_only=False)
        for key, (p, where) in got.items():
            want = params[key] if where is None else params[key].narrow(where[0], where[1], where[2])
            torch.testing.assert_close(p, want, rtol=1e-5, atol=1e-7, msg=lambda m, k=key, r=rank: f"rank {r} {k}: {m}")
    assert got["block_0.attn.q.weight"][1] == (0, 16, 32)  # rank 1 now holds 4 heads of 8 from head 2
    if name == "gpt_vocab_5_3":
        assert got["embedding.wte.weight"][1] == (0, 20, 44)  # and vocabulary rows 20..63


@pytest.mark.slow
def test_vocabulary_slices_are_tied_and_sit_at_prefix_sum_offsets(out: Path) -> None:
    """3-way 30:20:14 of 64 rows: the tied head is the embedding's slice (one parameter per rank)."""
    offsets = [torch.load(out / f"gpt2_vocab_3way_{r}.pt", weights_only=False)["state"] for r in range(3)]
    assert [o["embedding.wte.weight"] for o in offsets] == [(0, 0, 30), (0, 30, 20), (0, 50, 14)]
    grads = torch.load(out / "gpt2_vocab_3way_1.pt", weights_only=False)["grads"]
    assert "head.lm_head.weight" not in grads and grads["embedding.wte.weight"].grad.shape == (20, 96)
    untied = [torch.load(out / f"llama_vocab_5_3_{r}.pt", weights_only=False)["state"] for r in range(2)]
    assert [o["head.lm_head.weight"] for o in untied] == [(0, 0, 40), (0, 40, 24)]
    assert [o["embedding.embed_tokens.weight"] for o in untied] == [(0, 0, 40), (0, 40, 24)]


def test_runtime_split_scales_a_plan_split_to_the_shrunken_model() -> None:
    from hetpart.runtime.models import scaled_config
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.runtime.uneven_tp import runtime_split

    cfg = scaled_config(MODEL_CATALOG["gpt2-medium"], "tiny", heads_multiple_of=16)
    split = runtime_split(TPSplit(heads=(5, 5, 3, 3), ffn=(1280, 1280, 768, 768)), cfg, 4)
    assert split.heads == (5, 5, 3, 3) and sum(split.ffn) == cfg.ffn
    assert split.ffn[0] > split.ffn[3] and split.vocab == ()
    vocab = runtime_split(TPSplit(vocab=(20000, 20000, 5129, 5128)), cfg, 4).vocab  # 50,257 rows -> 3,200
    assert vocab == (1273, 1273, 327, 327)  # largest remainder: 1273.45, 1273.45, 326.58, 326.51


def test_a_split_shrunk_to_a_tiled_width_stays_in_whole_tiles() -> None:
    """--scale small: gpt3-2.7b's 1,024 shrunken columns split in 64-column tiles, as the plan's rules ask
    (largest remainder of 6,912:3,328 gave 691:333, which the shrunken plan's check refused)."""
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.graph.transformer import transformer_graph
    from hetpart.rules import tp_split_problems
    from hetpart.runtime.models import scaled_config
    from hetpart.runtime.uneven_tp import scale_plan_splits

    cfg = scaled_config(MODEL_CATALOG["gpt3-2.7b"], "small", heads_multiple_of=8)
    assert cfg.ffn == 1024
    plan = _plan(Replica(1.0, (_st(0, 34, A, heads=(20, 12), ffn=(6912, 3328)),)))
    scaled, _ = scale_plan_splits(plan, cfg)
    stage = scaled.replicas[0].stages[0]
    assert stage.tp_split.ffn == (704, 320)  # 691.2 : 332.8 -> 11 : 5 tiles of 64
    assert tp_split_problems(transformer_graph(cfg, "small", 128, 4), stage) == []


def test_a_plan_vocabulary_split_keeps_its_ratio_in_the_shrunken_model() -> None:
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.runtime.models import scaled_config
    from hetpart.runtime.uneven_tp import scale_plan_splits

    cfg = scaled_config(MODEL_CATALOG["gpt2-medium"], "tiny", heads_multiple_of=2)
    plan = _plan(Replica(1.0, (_st(0, 26, A, vocab=(31411, 18846)),)))
    scaled, notes = scale_plan_splits(plan, cfg)
    assert scaled.replicas[0].stages[0].tp_split == TPSplit(vocab=(2000, 1200))
    assert notes == ["replicas[0].stages[0]: vocabulary [31411, 18846] runs as [2000, 1200] of the 3200 rows of the "
                     "shrunken model"]
