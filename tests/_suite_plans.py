"""The public suite's plans, planned once per test session.

test_planners (search never loses to the baselines) and test_rules (every plan passes the runtime's rules) both
plan every entry of ``shared/scenarios/suite.yaml`` with the same planners on the same inputs; planning is
deterministic, so each (entry, planner) is planned once and each test asserts its own claims on the result.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path


def _canonical(cluster: str) -> str:
    path = Path(cluster)
    return str(path.resolve()) if path.is_file() else cluster


def suite_plan(model: str, seq_len: int, cluster: str, global_batch: int, planner: str):
    """``plan(load_model(model, seq_len), load_cluster(cluster), Workload(global_batch, seq_len), planner)``;
    raises what it raised (a :class:`~hetpart.errors.WorkloadError` where nothing fits)."""
    result = _planned(model, seq_len, _canonical(cluster), global_batch, planner)
    if isinstance(result, BaseException):
        raise result
    return result


@cache
def _planned(model: str, seq_len: int, cluster: str, global_batch: int, planner: str):
    from hetpart import Workload, load_cluster, load_model
    from hetpart.errors import WorkloadError
    from hetpart.policies import plan

    try:
        return plan(load_model(model, seq_len=seq_len), load_cluster(cluster), Workload(global_batch, seq_len), planner)
    except WorkloadError as exc:
        return exc
