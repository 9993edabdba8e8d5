"""The gradient gate for uneven tensor parallelism with sharded optimizer states (``tp_split`` + zero 1-2).

Two TP-2 replicas on hetpart's distributed optimizer (:mod:`hetpart.runtime.dist_optimizer`): split alike
(every data-parallel peer holds the same slice), and split differently (5:1 heads beside an even replica,
6:2 beside 2:6 of a grouped-query Llama, and inside a 1F1B pipeline whose second stage is TP-1: 6 ranks),
where each key is cut at every holder's slice boundary and the pieces move among the ranks that hold
them; with even and uneven shard fractions and uneven batch shares.
After one step the loss is the single-process reference's (1e-6 relative) and every local gradient slice
equals the reference's slice at its offset; after 3 Adam steps every parameter slice equals the
reference's; a checkpoint resumes to the same weights and optimizer state. gloo on CPU, fp32.
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
LR = 3e-3
EPS = 1e-6
"""Adam's eps in both runs. With torch's 1e-8, Adam's first steps move each element by about
``lr * g / (|g| + eps)``: an element whose exact gradient is zero or tiny (key biases: softmax ignores a
shift of every score) moves by up to ``lr`` on float noise of ~1e-10, which the split's other summation
order changes (3.7e-5 apart after 3 steps, measured). At 1e-6 such noise moves it by ~1e-4 lr."""
ATOL_PARAMS = 1e-5
"""The split's own rounding: the same plans at zero 0 (torch's Adam on whole local tensors) end as far from
the reference, 7.5e-6 at most (measured; the sharded runs: the same to 1e-9)."""


def _gpt() -> TransformerConfig:
    return TransformerConfig("gpt2", 4, 48, 6, 64, 16, ffn_hidden_size=96)


def _llama() -> TransformerConfig:  # 8 heads in 4 key/value groups of 2
    return TransformerConfig("llama", 4, 32, 8, 64, 16, ffn_hidden_size=64, num_kv_heads=4, tied_embeddings=False,
                             activation="swiglu", norm="rmsnorm", bias=False, learned_positions=False, dropout=False)


def _st(devices, heads=(), ffn=()) -> Stage:
    split = TPSplit(heads=tuple(heads), ffn=tuple(ffn)) if heads or ffn else None
    return Stage((0, 6), tuple(devices), len(devices), split)


def _plan(zero: int, first: Stage, second: Stage, shares=(2 / 3, 1 / 3), fractions=None, schedule="gpipe",
          batch: int = 6, mb: int = 1) -> Plan:
    return Plan(global_batch=batch, micro_batch=mb, seq_len=SEQ, schedule=schedule, zero=zero,
                shard_fractions=fractions, replicas=(Replica(shares[0], (first,)), Replica(shares[1], (second,))))


A, B = ("0/0/0", "0/0/1"), ("1/0/0", "1/0/1")
GPT = RunnableSpec("gpt", _gpt(), impl="hetpart")
GPT2 = RunnableSpec("gpt2", _gpt(), impl="transformers")
LLAMA = RunnableSpec("llama", _llama(), impl="transformers")
CASES: dict[str, tuple[RunnableSpec, Plan]] = {
    # both replicas split 4:2 / 64:32: every peer holds the same slice
    "z1_alike_gpt": (GPT, _plan(1, _st(A, (4, 2), (64, 32)), _st(B, (4, 2), (64, 32)))),
    # 5:1 heads and 80:16 columns beside an even replica (DTensor): pieces at 48 and 80 columns
    "z1_differ_gpt2": (GPT2, _plan(1, _st(A, (5, 1), (80, 16)), _st(B))),
    # the same at level 2 (reduce-scattered every micro-batch), shard fractions 0.75 / 0.25
    "z2_differ_gpt2": (GPT2, _plan(2, _st(A, (5, 1), (80, 16)), _st(B), (0.5, 0.5), (0.75, 0.25), "1f1b",
                                   batch=8, mb=2)),
    # grouped-query Llama, 6:2 beside 2:6 heads (whole key/value groups), 40:24 beside 24:40 columns
    "z1_crossed_llama": (LLAMA, _plan(1, _st(A, (6, 2), (40, 24)), _st(B, (2, 6), (24, 40)), fractions=(0.3, 0.7))),
}
# Inside a pipeline: a 5:1 TP-2 stage (beside an even one in the other replica), then a TP-1 stage (6 ranks).
PIPE = Plan(global_batch=6, micro_batch=1, seq_len=SEQ, schedule="1f1b", zero=1, replicas=(
    Replica(2 / 3, (Stage((0, 3), A, 2, TPSplit(heads=(5, 1), ffn=(80, 16))), Stage((3, 6), ("0/0/2",), 1))),
    Replica(1 / 3, (Stage((0, 3), B, 2), Stage((3, 6), ("1/0/2",), 1)))))
CASES_6: dict[str, tuple[RunnableSpec, Plan]] = {"z1_pipe_gpt2": (GPT2, PIPE)}
WORLD = {**{n: 4 for n in CASES}, **{n: 6 for n in CASES_6}}
TRAINED = ("z1_differ_gpt2", "z2_differ_gpt2", "z1_crossed_llama", "z1_alike_gpt", "z1_pipe_gpt2")
RESUMED = "z1_crossed_llama"


def _job(rank: int, world: int, out: str) -> None:
    from hetpart._torch_compat import local_tensor
    from hetpart.runtime.checkpoint import load_checkpoint, save_checkpoint
    from hetpart.runtime.engine import Executor

    for name, (spec, plan) in (CASES if world == 4 else CASES_6).items():
        ex = Executor(plan, spec, rank, world, lr=LR)
        local = ex.forward_backward(0)
        loss = ex.global_loss(local)
        ex.sync_gradients()
        grads = ex.local_gradients()
        held = {k: (local_tensor(ex.params[k]).numel(), ex._shard(k).tp_dim is not None) for k in ex.sharded_keys}
        torch.save({"loss": loss, "grads": grads, "shard": ex.dist_optimizer.numel,
                    "sliced": sum(n for n, sliced in held.values() if sliced),
                    "copies": sum(n for n, sliced in held.values() if not sliced)}, Path(out, f"{name}_{rank}.pt"))
        if name in TRAINED:
            ex = _adam(Executor(plan, spec, rank, world, lr=LR))
            losses = [ex.step(s).loss for s in range(STEPS)]
            params = {k: (local_tensor(p).detach().clone(), grads[k]) for k, p in ex.params.items()}
            torch.save({"losses": losses, "params": params}, Path(out, f"train_{name}_{rank}.pt"))
        if name == RESUMED:
            ckpt = Path(out, "ckpt")
            ex = _adam(Executor(plan, spec, rank, world, lr=LR))
            ex.step(0)
            save_checkpoint(ckpt, ex, next_step=1)
            saved = _states(ex)
            ex.step(1)
            again = _adam(Executor(plan, spec, rank, world, lr=LR))
            start = load_checkpoint(ckpt, again)
            loaded = _states(again)
            again.step(start)
            torch.save({"saved": saved, "loaded": loaded, "whole": _states(ex), "resumed": _states(again),
                        "start": start}, Path(out, f"resume_{rank}.pt"))


def _adam(ex):
    """``ex`` with Adam's eps at :data:`EPS` (the sharded keys' and the rest's)."""
    ex.dist_optimizer.eps = EPS
    for group in ex.optimizer.param_groups:
        group["eps"] = EPS
    return ex


def _states(ex) -> dict[str, torch.Tensor]:
    from hetpart._torch_compat import local_tensor

    return {**{f"model.{k}": local_tensor(p).detach().clone() for k, p in ex.params.items()},
            **{k: local_tensor(t).clone() for k, t in ex.dist_optimizer.whole_states().items()}}


@pytest.fixture(scope="module")
def outs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    return {n: run_distributed(_job, n, timeout_s=300, out_dir=str(tmp_path_factory.mktemp(f"split_sharded{n}")))
            for n in (4, 6)}


@pytest.fixture(scope="module")
def out(outs: dict[int, Path]) -> Path:
    return outs[4]


@pytest.mark.parametrize("name", list(WORLD))
def test_split_sharded_step_matches_the_reference(outs: dict[int, Path], name: str) -> None:
    from hetpart.runtime.engine import check_runnable
    from hetpart.runtime.reference import Reference

    spec, plan = {**CASES, **CASES_6}[name]
    assert check_runnable(plan, spec) == []
    ref = Reference(spec, plan.global_batch, plan.seq_len)
    ref_loss = ref.forward_backward(0)
    expected = ref.gradients()
    seen: set[str] = set()
    for rank in range(WORLD[name]):
        got = torch.load(outs[WORLD[name]] / f"{name}_{rank}.pt", weights_only=False)
        assert got["loss"] == pytest.approx(ref_loss, rel=1e-6), f"{name}: rank {rank} loss"
        for key, g in got["grads"].items():
            torch.testing.assert_close(g.grad, g.of(expected[key]), rtol=1e-4, atol=1e-6,
                                       msg=lambda m, where=f"{name} rank {rank} {key}": f"{where}: {m}")
            seen.add(key)
    assert seen == set(expected)


@pytest.mark.parametrize("name", TRAINED)
def test_split_sharded_follows_the_reference_for_three_adam_steps(outs: dict[int, Path], name: str) -> None:
    from hetpart.runtime.reference import Reference

    spec, plan = {**CASES, **CASES_6}[name]
    ref = Reference(spec, plan.global_batch, plan.seq_len, lr=LR)
    ref.optimizer = torch.optim.Adam(list(ref.params.values()), lr=LR, eps=EPS)
    want = [ref.step(s) for s in range(STEPS)]
    for rank in range(WORLD[name]):
        got = torch.load(outs[WORLD[name]] / f"train_{name}_{rank}.pt", weights_only=False)
        assert got["losses"] == pytest.approx(want, rel=1e-5)
        for key, (p, where) in got["params"].items():
            torch.testing.assert_close(p, where.of(ref.params[key].detach()), rtol=1e-5, atol=ATOL_PARAMS,
                                       msg=lambda m, w=f"{name} rank {rank} {key}": f"{w}: {m}")


def test_each_rank_keeps_its_fraction_of_its_own_slice(out: Path) -> None:
    """Split differently (5:1 beside even), a rank's shard is its replica's fraction of what it holds: of
    its TP slice, and of the copies its TP group holds whole (norms, biases) 1 / tp each; so the 5:1
    replica's rank 0 keeps more than its rank 1."""
    got = [torch.load(out / f"z2_differ_gpt2_{r}.pt", weights_only=False) for r in range(4)]
    for rank, fraction in zip(range(4), (0.75, 0.75, 0.25, 0.25)):
        want = fraction * (got[rank]["sliced"] + got[rank]["copies"] / 2)
        assert got[rank]["shard"] == pytest.approx(want, rel=0.01), rank
    assert got[0]["shard"] > 2 * got[1]["shard"]


def test_a_split_sharded_checkpoint_resumes_to_the_same_state(out: Path) -> None:
    for rank in range(4):
        got = torch.load(out / f"resume_{rank}.pt", weights_only=False)
        assert got["start"] == 1 and set(got["loaded"]) == set(got["saved"])
        assert any(k.endswith(".exp_avg_sq") and v.abs().sum() > 0 for k, v in got["saved"].items())
        for name in got["saved"]:
            torch.testing.assert_close(got["loaded"][name], got["saved"][name], rtol=0, atol=0)
            torch.testing.assert_close(got["resumed"][name], got["whole"][name], rtol=0, atol=0)


def test_what_does_not_run_with_a_split_is_refused_in_one_line() -> None:
    from dataclasses import replace

    from hetpart.errors import PlanError
    from hetpart.runtime.engine import require_runnable

    _, plan = CASES["z1_differ_gpt2"]
    with pytest.raises(PlanError, match=r"tp_split: an uneven split does not run at zero 3 \(torch FSDP2 shards "
                                        r"DTensors, which cannot hold an uneven slice\); use zero 1 or 2, or drop "
                                        r"tp_split"):
        require_runnable(replace(plan, zero=3), GPT2)
