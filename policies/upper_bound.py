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

__all__ = ["upper_bound", "DEFINITION"]

DEFINITION = ("HETHUB's theoretical upper bound: the sum over device types of the best throughput the search "
              "planner finds for that type's devices alone on the same workload (memory limits lifted for a type "
              "that cannot hold the model alone); roofline_tokens_per_s is every device's peak at its best "
              "achievable matrix efficiency over the model's training FLOPs per token.")


def _type_throughput(model: "ModelGraph", cluster: "Cluster", workload: "Workload", gpu: str,
                     predictor: str | None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The type's best throughput alone; its devices in zones that cannot reach each other (once the
    other types' zones are gone) count as separate clusters, summed."""
    from hetpart.policies.plan_search import plan_search
    from hetpart.policies.planner import make_evaluator

    whole = type_subcluster(cluster, gpu)
    out = {"tokens_per_s": 0.0, "devices": whole.num_devices, "memory_lifted": False, "step_time_s": 0.0,
           "memory_lifted_tokens_per_s": 0.0}
    for zones in zone_components(whole):
        sub = type_subcluster(cluster, gpu, zones)
        free = plan_search(model, sub, workload, include_baselines=False, ignore_memory=True,
                           evaluator=make_evaluator(model, sub, workload, predictor, ignore_memory=True,
                                                    predictor_options=options))
        try:
            # the baselines too: where they beat the search's structures (a throttled device's stage), a bound
            # without them sat below the uniform plan of the whole cluster (llama3-70b, 96 P100: 1,133 vs 1,187)
            best = plan_search(model, sub, workload,
                               evaluator=make_evaluator(model, sub, workload, predictor, predictor_options=options))
        except WorkloadError:
            best, out["memory_lifted"] = free, True
        out["tokens_per_s"] += best.tokens_per_s
        # a plan that fits is a plan with memory lifted too: the search with memory lifted, not exact either,
        # can end below it (gpt3-175b on 4,096 H100, fp16: 1.18 M against 1.34 M), and the ceiling may not
        out["memory_lifted_tokens_per_s"] += max(free.tokens_per_s, best.tokens_per_s)
        out["step_time_s"] = max(out["step_time_s"], best.step_time_s)
    return out


def upper_bound(model: "ModelGraph", cluster: "Cluster", workload: "Workload", *,
                predictor: str | None = None, predictor_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{tokens_per_s, memory_lifted_tokens_per_s, roofline_tokens_per_s, per_type, definition}`` for ``workload`` on ``cluster``.

    ``per_type[gpu]`` holds that type's ``tokens_per_s``, ``devices``, ``step_time_s``, whether
    memory limits were lifted, and ``memory_lifted_tokens_per_s``.

    Raises:
        WorkloadError: when a type's devices cannot run the workload even without memory limits.
    """
    per_type = {gpu: _type_throughput(model, cluster, workload, gpu, predictor, predictor_options)
                for gpu in cluster.gpu_types}
    return {
        "tokens_per_s": sum(t["tokens_per_s"] for t in per_type.values()),
        "memory_lifted_tokens_per_s": sum(t["memory_lifted_tokens_per_s"] for t in per_type.values()),
        "roofline_tokens_per_s": roofline_tokens_per_s(model, cluster, workload.precision),
        "per_type": per_type,
        "definition": DEFINITION,
    }
