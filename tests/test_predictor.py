"""The Predictor protocol and registry; search without a lower bound prices everything and says so."""

from __future__ import annotations

import pytest

from hetpart import Workload, load_cluster
from hetpart.costmodel import megatron_plan
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.predictor import (Predictor, available_predictors, default_predictor, get_predictor,
                                         register_predictor, set_default_predictor)
from hetpart.costmodel.simulator import Simulator, simulate
from hetpart.errors import PlanError
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.policies import plan


def tiny_model(layers: int = 4, seq_len: int = 512):
    cfg = TransformerConfig(family="gpt2", num_layers=layers, hidden_size=2048, num_heads=16, vocab_size=50257,
                            max_positions=4096)
    return transformer_graph(cfg, "tiny", seq_len, source="catalog:tiny")


class NoBound:
    """A predictor with the simulator's numbers and no lower bound (as a learned model would be)."""

    name, version = "no-bound", "test"

    def __init__(self, model, cluster, workload=None) -> None:
        self._sim = Simulator(model, cluster)
        self.batches: list[int] = []

    def estimate_batch(self, plans):
        self.batches.append(len(plans))
        return self._sim.estimate_batch(plans)

    def predict(self, plan, workload=None, *, validate=True, trace=False):
        return self._sim.predict(plan, workload, validate=validate, trace=trace)


@pytest.fixture
def registry():
    """Leave the predictor registry as it was."""
    from hetpart.costmodel import predictor as reg

    saved, default = dict(reg._FACTORIES), reg.default_predictor()
    yield reg
    reg._FACTORIES.clear()
    reg._FACTORIES.update(saved)
    reg.set_default_predictor(default)


def test_the_simulator_is_a_registered_predictor_with_the_simulators_numbers() -> None:
    model, cluster = tiny_model(), load_cluster("tiny-mixed")
    sim = get_predictor("simulator", model, cluster)
    assert isinstance(sim, Predictor) and sim.name == "simulator" and sim.version
    assert "simulator" in available_predictors() and default_predictor() == "simulator"
    plans = [megatron_plan(model, cluster, Workload(8, 512), tp=1, pp=pp, dp=4 // pp, micro_batch=1)
             for pp in (1, 2, 4)]
    batch = sim.estimate_batch(plans)
    for p, e in zip(plans, batch, strict=True):
        full = simulate(model, cluster, p)
        assert e.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
        assert sim.predict(p).metrics == full.metrics
        assert sim.lower_bound_s(p) <= e.step_time_s


def test_unknown_placeholder_and_bad_options_are_clear_errors() -> None:
    model, cluster = tiny_model(), load_cluster("tiny-mixed")
    with pytest.raises(PlanError, match=r"--predictor: unknown predictor 'oracle'; use one of simulator"):
        get_predictor("oracle", model, cluster)
    with pytest.raises(PlanError, match=r"predictor 'simulator': unknown option\(s\) temperature"):
        get_predictor("simulator", model, cluster, temperature=1.0)
    with pytest.raises(PlanError, match=r"register_predictor: name 'a b'"):
        register_predictor("a b", NoBound)


def test_registered_predictors_are_found_lazily_and_may_become_the_default(registry) -> None:
    model, cluster = tiny_model(), load_cluster("tiny-mixed")
    register_predictor("lazy", "tests.test_predictor:NoBound")
    assert isinstance(get_predictor("lazy", model, cluster), NoBound)
    set_default_predictor("lazy")
    assert isinstance(get_predictor(None, model, cluster), NoBound)
    assert available_predictors()[0] == "lazy"
    with pytest.raises(PlanError, match="unknown predictor 'nothing'"):
        set_default_predictor("nothing")


def test_search_without_a_lower_bound_prices_every_candidate_and_says_so() -> None:
    model, cluster = tiny_model(), load_cluster("tiny-mixed")
    workload = Workload(8, 512, recompute="selective")
    bounded = plan(model, cluster, workload, "search")
    unbounded = NoBound(model, cluster)
    result = plan(model, cluster, workload, "search", predictor=unbounded)
    assert bounded.evaluation["pruned"] is True and "branch and bound" in bounded.evaluation["pruning"]
    assert result.evaluation["pruned"] is False and "no pruning" in result.evaluation["pruning"]
    assert result.evaluation["predictor"] == {"name": "no-bound", "version": "test"}
    assert result.to_dict()["planner"]["pruned"] is False
    assert max(unbounded.batches) > 1  # candidates went to the predictor in batches
    assert result.prediction.tokens_per_s == pytest.approx(bounded.prediction.tokens_per_s, rel=1e-12)


def test_branch_and_bound_prices_fewer_plans_than_pricing_everything() -> None:
    from hetpart.policies.search_reference import space_plans

    model, cluster = tiny_model(layers=3), load_cluster("tiny-mixed")
    workload = Workload(4, 512, recompute="none")
    plans = list(space_plans(model, cluster, workload))
    pruned = Evaluator(model, cluster, workload)
    everything = Evaluator(model, cluster, workload, predictor=NoBound(model, cluster))
    a, b = pruned.best(plans), everything.best(plans)
    assert a.tokens_per_s == pytest.approx(b.tokens_per_s, rel=1e-12)
    assert pruned.simulations < everything.simulations and everything.lower_bound_s(plans[0]) is None
