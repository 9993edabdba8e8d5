"""The evaluator's memory filter, fast path against the plain computation: :meth:`Evaluator._stage_memory_gb` (per-unit
terms summed once per chunk) against :func:`stage_memory_gb` and :func:`stage_working_gb` on random chunks, and
:meth:`Evaluator.device_memory_gb` / :meth:`Evaluator.fits` of whole plans (the ``proportional`` planner's layouts,
LP-split versions included) against the evaluator with those functions put back: the same numbers, bit for bit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hetpart import load_cluster
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.memory import stage_memory_gb, stage_working_gb
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.plan_proportional import hap_plans, holmes_plans
from hetpart.workload import Workload


def _model(layers: int, hidden: int = 2048, tied: bool = True, family: str = "gpt2"):
    cfg = TransformerConfig(family=family, num_layers=layers, hidden_size=hidden, num_heads=16, vocab_size=50257,
                            max_positions=1024, tied_embeddings=tied)
    return transformer_graph(cfg, f"tiny-{family}-h{hidden}-l{layers}", 512)


def _plain(self, layers, tp, plan, flight, zero=0):
    """What :meth:`Evaluator._stage_memory_gb` stands for: the memory model's own functions."""
    return (stage_memory_gb(self.model, *layers, tp, plan.micro_batch, flight, plan.recompute, plan.precision,
                            plan.optimizer, plan.attention, working_set=False, zero=zero),
            stage_working_gb(self.model, *layers, tp, plan.micro_batch, plan.recompute, plan.attention))


@pytest.mark.parametrize("attention", ["fused", "eager"])
def test_stage_memory_terms_equal_the_memory_models_functions(attention: str) -> None:
    rng = random.Random(48)
    model = _model(12, tied=True)
    cl = load_cluster("tiny-mixed")
    workload = Workload(global_batch=16, seq_len=512, attention=attention)
    ev = Evaluator(model, cl, workload)
    checked = 0
    for rc in ("none", "selective", "full"):
        for optimizer, precision in (("adam", "bf16"), ("sgd", "fp16"), ("adam8bit", "bf16")):
            plan = next(p for layout in holmes_plans(model, cl, replace(workload, optimizer=optimizer,
                                                                        precision=precision)) for p in layout)
            plan = replace(plan, recompute=rc)
            for _ in range(40):
                a = rng.randrange(model.num_units)
                b = rng.randrange(a, model.num_units + 1)  # empty ranges too
                tp = rng.choice([1, 2, 4, 1 / 0.37])  # an uneven split's largest share is a float divisor
                flight = rng.choice([1, 2, 3.5, 8])
                mb = rng.choice([1, 2, 4])
                p = replace(plan, micro_batch=mb)
                assert ev._stage_memory_gb((a, b), tp, p, flight) == _plain(ev, (a, b), tp, p, flight)
                checked += 1
    assert checked == 360


@pytest.mark.parametrize("cluster,layers,hidden,tied,answers", [
    ("tiny-mixed", 5, 2048, True, {True}), ("consumer-mix", 12, 2048, True, {True}),
    ("tiny-mixed", 24, 4096, False, {True, False}), ("consumer-mix", 24, 4096, False, {True, False})])
def test_fits_and_peaks_equal_the_plain_evaluator(cluster: str, layers: int, hidden: int, tied: bool, answers: set,
                                                  monkeypatch) -> None:
    model = _model(layers, hidden, tied)
    cl = load_cluster(cluster)
    workload = Workload(global_batch=32, seq_len=512)
    plans = [p for gen in (holmes_plans, hap_plans) for layout in gen(model, cl, workload) for p in layout]
    fast = Evaluator(model, cl, workload)
    plans += [q for p in plans if (q := fast.with_splits(p)) is not p]
    for zero in (0, 1, 3):
        plans += [replace(p, zero=zero) for p in plans[:20]]
    found_fast = [(fast.fits(p), fast.device_memory_gb(p)) for p in plans]
    monkeypatch.setattr(Evaluator, "_stage_memory_gb", _plain)
    plain = Evaluator(model, cl, workload)
    found_plain = [(plain.fits(p), plain.device_memory_gb(p)) for p in plans]
    assert found_fast == found_plain
    assert len(plans) > 40 and {f for f, _ in found_fast} == answers
