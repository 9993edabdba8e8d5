"""The bound's per-type searches dealt to forked children give the same values as searched one after another."""

from __future__ import annotations

import importlib
import os

import pytest

from hetpart import Workload, load_cluster
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies.upper_bound import upper_bound

bound_module = importlib.import_module("hetpart.policies.upper_bound")  # the package's attribute is the function


def _model():
    cfg = TransformerConfig(family="gpt2", num_layers=4, hidden_size=2048, num_heads=16, vocab_size=50257,
                            max_positions=1024)
    return transformer_graph(cfg, "tiny-h2048", 512)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: the types are searched in the process")
def test_forked_types_give_the_bound_of_the_types_one_by_one(monkeypatch) -> None:
    model, cluster, workload = _model(), load_cluster("tiny-mixed"), Workload(8, 512)
    forked = upper_bound(model, cluster, workload)
    monkeypatch.setattr(bound_module, "PARALLEL_TYPES", False)
    alone = upper_bound(model, cluster, workload)
    assert list(forked["per_type"]) == list(alone["per_type"]) == cluster.gpu_types
    assert forked == alone
    assert forked["tokens_per_s"] > 0


def test_a_child_that_fails_is_redone_in_the_process(monkeypatch) -> None:
    model, cluster, workload = _model(), load_cluster("tiny-mixed"), Workload(8, 512)
    expected = upper_bound(model, cluster, workload)
    calls = []
    real = bound_module._types_of

    def failing_in_child(*args):
        calls.append(os.getpid())
        if os.getpid() != parent:
            raise RuntimeError("a child that dies")
        return real(*args)

    parent = os.getpid()
    monkeypatch.setattr(bound_module, "_types_of", failing_in_child)
    assert upper_bound(model, cluster, workload) == expected
    assert calls.count(parent) == (2 if len(os.sched_getaffinity(0)) >= 2 else 1)
