"""Search's near basins climb on one shared budget (hetpart.policies.search.climb_starts), fastest first, as the
policy's: the best basin is still climbed, the others climb while the budget lasts, and a basin left unclimbed still
stands as the plan it is."""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

from hetpart import Workload
from hetpart.cluster import parse_cluster
from hetpart.costmodel.evaluator import Evaluator
from hetpart.graph.load import load_model
from hetpart.policies.policy_planner import NEAR_CLIMBS
from hetpart.policies.refine import refine
from hetpart.policies.search import Asked, climb_starts, is_near_start


@dataclass(frozen=True)
class _Plan:
    name: str
    num_devices: int = 8
    recompute: str = "none"


def _start(name: str, tokens: float) -> SimpleNamespace:
    return SimpleNamespace(plan=_Plan(name), tokens_per_s=tokens)


class _Counting:
    """Every plan asked for is priced 1.0 tokens/s (logged): only the count of plans asked matters here."""

    def __init__(self) -> None:
        self.log: list = []
        self.cluster = None

    def __call__(self, plan, **_):
        self.log.append(plan)
        return _start("asked", 1.0)


LIFTS = {"best": 1.0, "fast": 1.1}
"""What each start climbs to (share of its start); 1.05 for the others."""


def _climb(climbed: list):
    """A climb that asks ``steps`` plans and lifts the start by :data:`LIFTS` where every plan it asked was priced."""
    def climb(evaluate, start, steps, deadline):
        got = [evaluate(start.plan) for _ in range(steps)]
        climbed.append((start.plan.name, sum(g is not None for g in got)))
        lift = LIFTS.get(start.plan.name, 1.05) if all(g is not None for g in got) else 1.0
        return _start(start.plan.name + "+", start.tokens_per_s * lift)
    return climb


def test_near_kinds_are_the_level_and_walk_basins() -> None:
    assert is_near_start(("near basin", 0, 3))
    assert is_near_start(("walk", 1, 2))
    assert not is_near_start(("walk", 1, 0))  # the walk's best climbs on its own
    assert not is_near_start(("mixed", False, 0, False))
    assert not is_near_start(("speed-typed",))


def test_the_budget_climbs_the_fastest_near_basin_first_and_keeps_the_rest() -> None:
    climbed: list = []
    starts = {("mixed", False, 0, False): _start("best", 100.0),
              ("near basin", 0, 0): _start("slow", 98.0),
              ("near basin", 0, 1): _start("fast", 99.0),
              ("walk", 0, 1): _start("best", 100.0),  # the same plan as a start of its own: climbed once
              ("near basin", 1, 0): None}
    got = climb_starts(_climb(climbed), _Counting(), starts, steps=5, near_climbs=1)
    assert climbed == [("best", 5), ("fast", 5)]  # the slower basin is past the shared budget of 1 x 5 plans
    assert got.plan.name == "fast+"
    assert round(got.tokens_per_s, 6) == 108.9


def test_an_unclimbed_near_basin_still_counts_as_it_is() -> None:
    climbed: list = []
    starts = {("mixed", True, 1, False): _start("own", 50.0),
              ("near basin", 1, 0): _start("a", 60.0),
              ("near basin", 1, 1): _start("b", 59.0)}
    got = climb_starts(_climb(climbed), _Counting(), starts, steps=3, near_climbs=0)
    assert climbed == [("own", 3)]
    assert got.plan.name == "a"
    assert got.tokens_per_s == 60.0  # above the climbed own start (52.5)


def test_asked_refuses_past_its_allowance_and_delegates() -> None:
    inner = _Counting()
    asked = Asked(inner, 2)
    assert [asked(_Plan(str(i))) is None for i in range(4)] == [False, False, True, True]
    assert asked.asked == 4
    assert len(inner.log) == 2
    assert asked.cluster is None


LONGSEQ = parse_cluster({"name": "longseq", "nodes": [
    {"count": 1, "gpus_per_node": 8, "gpu": "H100-80GB", "intra_node": "NVLink4", "nic": "IB-NDR", "nics_per_node": 8},
    {"count": 1, "gpus_per_node": 8, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR",
     "nics_per_node": 4}]})


def test_the_shared_budget_still_climbs_the_basin_that_interleaves_past_the_best() -> None:
    """llama3-8b at sequence 32,768 on 8 H100 + 8 A100-40GB (tests/test_search_basins.py): level 1's best (A100 TP 4,
    H100 TP 2, H100 TP 2) climbs to nothing better than 44,843 tokens/s; its near basin A100 TP 4 then H100 TP 4
    interleaves to 46,305. Under the shared budget it is still climbed."""
    search = importlib.import_module("hetpart.policies.plan_search")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sequence is past llama3-8b's positions (extrapolated)
        model = load_model("llama3-8b", 32768)
    workload = Workload(16, 32768)
    evaluate = Evaluator(model, LONGSEQ, workload)
    found = search._level_pass(model, LONGSEQ, workload, search.SearchOptions(), evaluate, 1)
    assert sum(is_near_start(kind) for kind, e in found.items() if e is not None) >= 1
    got = climb_starts(refine, evaluate, found, 40, NEAR_CLIMBS)
    assert got.tokens_per_s >= 46_304
    assert got.plan.schedule == "interleaved"
    assert [s.tp for s in got.plan.replicas[0].stages] == [4, 4, 4, 4]
