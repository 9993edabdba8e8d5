"""The ``planner`` block of a result says whether the planner searched its whole space (``exact``)."""

from hetpart.cluster import load_cluster
from hetpart.policies import plan
from hetpart.workload import Workload
from tests.test_predictor import tiny_model


def test_only_search_is_called_exact() -> None:
    model, cluster = tiny_model(), load_cluster("tiny-mixed")
    workload = Workload(8, 512, recompute="selective")
    searched = plan(model, cluster, workload, "search").evaluation
    assert searched["exact"] is True and searched["pruning"].endswith("(exact)")
    for name in ("uniform", "proportional"):
        info = plan(model, cluster, workload, name).evaluation
        assert info["exact"] is False
        assert info["pruning"].startswith(f"{name}: not an exhaustive search") and "(exact)" not in info["pruning"]
