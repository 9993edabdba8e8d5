"""Held-out models are held out by architecture, not only by name (probe e, item 6): the environment's random
shapes and the cost-model data set's random transformers are drawn again when they equal a held-out model."""

import random

import numpy as np
import pytest

from hetpart.catalog.models import MODEL_CATALOG
from hetpart.envs import scenarios
from hetpart.envs.scenarios import ScenarioDistribution, held_out_models
from hetpart.graph import transformer


def _held(names):
    return {MODEL_CATALOG[n].architecture() for n in names}


def test_architecture_ignores_the_name_the_sequence_bound_and_the_cited_count():
    from dataclasses import replace

    llama = MODEL_CATALOG["llama2-7b"]
    twin = replace(llama, max_positions=2048, published_params=0.0, num_kv_heads=0)  # 0 KV heads: num_heads
    assert twin.architecture() == llama.architecture()
    assert replace(llama, num_layers=31).architecture() != llama.architecture()
    assert len({cfg.architecture() for cfg in MODEL_CATALOG.values()}) == len(MODEL_CATALOG)


def test_held_out_list_is_the_one_training_and_the_benchmark_split_on():
    from hetpart.experiments.bench_policy import BENCH_HELD_OUT_MODELS

    held = held_out_models()
    assert held == ("gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                    "llama3-405b")
    train = ScenarioDistribution().catalog_models
    assert set(held) & set(train) == set()
    assert set(BENCH_HELD_OUT_MODELS) <= set(held)
    assert _held(held) & _held(train) == set()  # no training catalog model is a held-out one renamed


def test_env_random_shapes_never_equal_a_held_out_model(monkeypatch):
    # Depth <= 40 and both families: about 1 draw in 750 of the unrefused shapes is llama2-7b, llama2-13b or
    # gpt3-13b (the graph is not built: only the config is compared).
    monkeypatch.setattr(transformer, "transformer_graph", lambda cfg, *args, **kwargs: cfg)
    dist = ScenarioDistribution(max_layers=40)
    held = _held(held_out_models())
    raw_rng, rng = np.random.default_rng(5), np.random.default_rng(5)
    raw = [scenarios._random_config(raw_rng, dist, 2048).architecture() for _ in range(10_000)]
    drawn = [scenarios._random_model(rng, dist, 2048).architecture() for _ in range(10_000)]
    assert sum(a in held for a in raw) > 5  # the check has something to refuse
    assert sum(a in held for a in drawn) == 0


def test_env_draws_without_a_held_out_shape_are_unchanged(monkeypatch):
    # Refusing redraws only on a hit: seeded scenarios of shipped runs draw what they drew before.
    monkeypatch.setattr(transformer, "transformer_graph", lambda cfg, *args, **kwargs: cfg)
    dist = ScenarioDistribution()
    for seed in range(50):
        a = scenarios._random_model(np.random.default_rng(seed), dist, 1024)
        b = scenarios._random_config(np.random.default_rng(seed), dist, 1024)
        assert a == b


def test_dataset_random_transformer_redraws_a_held_out_architecture(monkeypatch):
    from dataclasses import replace

    from hetpart.costmodel.learned import sampling
    from hetpart.costmodel.learned.dataset import DatasetConfig

    twin = replace(MODEL_CATALOG["llama3-8b"], published_params=0.0)  # what random-llama can draw
    other = MODEL_CATALOG["gpt2-small"]
    script = iter([twin, twin, other])
    monkeypatch.setattr(sampling, "_random_transformer", lambda rng: next(script))
    refuse = sampling.held_out_configs(DatasetConfig().heldout_families)
    assert {cfg.architecture() for cfg in refuse} == _held(("llama3-8b", "llama3-70b", "llama3-405b", "opt-350m",
                                                            "bert-large"))
    assert sampling.random_transformer(random.Random(0), refuse) is other


def test_dataset_random_transformers_never_equal_a_held_out_model():
    from hetpart.costmodel.learned import sampling
    from hetpart.costmodel.learned.dataset import DatasetConfig

    refuse = sampling.held_out_configs(DatasetConfig().heldout_families)
    held = {cfg.architecture() for cfg in refuse}
    rng = random.Random(3)
    assert sum(sampling.random_transformer(rng, refuse).architecture() in held for _ in range(2_000)) == 0


def test_dataset_scenarios_refuse_the_configs_held_out_families(monkeypatch):
    from hetpart.costmodel.learned import dataset

    seen = {}

    class Stop(Exception):
        pass

    def spy(rng, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(dataset, "random_scenario", spy)
    cfg = dataset.DatasetConfig(heldout_families=("llama2", "gpt3"))
    with pytest.raises(Stop):
        dataset.label_scenario(cfg, 0)
    assert {c.architecture() for c in seen["refuse"]} == _held(("llama2-7b", "llama2-13b", "llama2-70b", "gpt3-1.3b",
                                                                "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"))
