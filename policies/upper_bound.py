"""HETHUB's theoretical upper bound on the throughput of a heterogeneous cluster, and a roofline.

``tokens_per_s``: the sum over device types of the best throughput the ``search`` planner finds for
that type's devices alone (a homogeneous sub-cluster) on the same workload. A type that cannot
hold the model alone is counted with memory limits lifted, so that no feasible plan of the whole
cluster exceeds the bound (mixing types only adds communication between them).

``roofline_tokens_per_s``: :func:`hetpart.costmodel.roofline.roofline_tokens_per_s`.

It runs the ``search`` planner on each device type, so it lives with the planners; the candidates
are priced by the predictor named (default: the registry's default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hetpart.costmodel.pools import type_subcluster, zone_components
from hetpart.costmodel.roofline import roofline_tokens_per_s
from hetpart.errors import WorkloadError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["upper_bound", "skipped_bound", "DEFINITION"]

DEFINITION = ("HETHUB's theoretical upper bound: the sum over device types of the best throughput the search "
              "planner finds for that type's devices alone on the same workload (memory limits lifted for a type "
              "that cannot hold the model alone); roofline_tokens_per_s is every device's peak at its best "
              "achievable matrix efficiency over the model's training FLOPs per token.")


def _type_throughput(model: "ModelGraph", cluster: "Cluster", workload: "Workload", gpu: str,
                     predictor: str | None, options: dict[str, Any] | None = None,
                     limit: dict[str, float] | None = None) -> dict[str, Any]:
    """The type's best throughput alone; its devices in zones that cannot reach each other (once the
    other types' zones are gone) count as separate clusters, summed. ``limit``: the searches' time limit
    (``{"time_limit_s": seconds}``; default theirs); ``complete`` says whether every search finished."""
    from hetpart.policies.plan_search import plan_search
    from hetpart.policies.planner import make_evaluator

    limit = limit or {}
    whole = type_subcluster(cluster, gpu)
    out = {"tokens_per_s": 0.0, "devices": whole.num_devices, "memory_lifted": False, "step_time_s": 0.0,
           "memory_lifted_tokens_per_s": 0.0, "complete": True}
    for zones in zone_components(whole):
        sub = type_subcluster(cluster, gpu, zones)
        lifted = make_evaluator(model, sub, workload, predictor, ignore_memory=True, predictor_options=options)
        try:
            free = plan_search(model, sub, workload, include_baselines=False, ignore_memory=True, evaluator=lifted,
                               **limit)
        except WorkloadError:
            if not limit:
                raise
            free = None  # cut short before it priced a point (no baselines with memory lifted)
        fitting = make_evaluator(model, sub, workload, predictor, predictor_options=options)
        try:
            # the baselines too: where they beat the search's structures (a throttled device's stage), a bound
            # without them sat below the uniform plan of the whole cluster (llama3-70b, 96 P100: 1,133 vs 1,187)
            best = plan_search(model, sub, workload, evaluator=fitting, **limit)
        except WorkloadError:
            if free is None:
                raise
            best, out["memory_lifted"] = free, True
        out["complete"] &= free is not None and lifted.time_limited is None and fitting.time_limited is None
        out["tokens_per_s"] += best.tokens_per_s
        # a plan that fits is a plan with memory lifted too: the search with memory lifted, not exact either,
        # can end below it (gpt3-175b on 4,096 H100, fp16: 1.18 M against 1.34 M), and the ceiling may not
        out["memory_lifted_tokens_per_s"] += max(free.tokens_per_s if free else 0.0, best.tokens_per_s)
        out["step_time_s"] = max(out["step_time_s"], best.step_time_s)
    return out


def upper_bound(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                predictor: str | None = None, predictor_options: dict[str, Any] | None = None,
                time_limit_s: float | None = None) -> dict[str, Any]:
    """``{tokens_per_s, memory_lifted_tokens_per_s, roofline_tokens_per_s, per_type, definition}`` for ``workload`` on ``cluster``.

    ``per_type[gpu]`` holds that type's ``tokens_per_s``, ``devices``, ``step_time_s``, whether
    memory limits were lifted, ``memory_lifted_tokens_per_s`` and whether its searches finished (``complete``).
    ``time_limit_s``: each per-type search's limit (:attr:`~hetpart.policies.plan_search.SearchOptions.time_limit_s`;
    ``hetpart plan --time-limit`` passes its own, which the bound's searches ignored before: a plan asked for in 45 s
    spent up to 54 s more on the bound); a search cut short may fall below what the type reaches, so ``complete``
    is false there and the bound is no bound.

    Raises:
        WorkloadError: when a type's devices cannot run the workload even without memory limits.
    """
    limit = {} if time_limit_s is None else {"time_limit_s": time_limit_s}
    per_type = {gpu: _type_throughput(model, cluster, workload, gpu, predictor, predictor_options, limit)
                for gpu in cluster.gpu_types}
    return {
        "tokens_per_s": sum(t["tokens_per_s"] for t in per_type.values()),
        "memory_lifted_tokens_per_s": sum(t["memory_lifted_tokens_per_s"] for t in per_type.values()),
        "roofline_tokens_per_s": roofline_tokens_per_s(model, cluster, workload.precision),
        "per_type": per_type,
        "complete": all(t["complete"] for t in per_type.values()),
        "computed": True,
        "definition": DEFINITION,
    }


def skipped_bound(model: "ModelGraph", cluster: "Cluster", workload: "Workload") -> dict[str, Any]:
    """:func:`upper_bound`'s keys where the bound was not asked for (``hetpart plan --no-bound``): the roofline (no
    search), ``tokens_per_s`` and ``memory_lifted_tokens_per_s`` None, ``per_type`` empty, ``computed`` False."""
    return {"tokens_per_s": None, "memory_lifted_tokens_per_s": None,
            "roofline_tokens_per_s": roofline_tokens_per_s(model, cluster, workload.precision), "per_type": {},
            "complete": False, "computed": False, "definition": DEFINITION}
