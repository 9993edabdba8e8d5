"""What every planner shares: the :class:`Planner` protocol, the choices a planner may make, and the
error it raises when nothing fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from hetpart.errors import PlanError, WorkloadError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.evaluator import Evaluated, Evaluator
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["Planner", "FunctionPlanner", "recompute_modes", "microbatch_options", "no_plan_error", "spec_name",
           "check_options"]


@runtime_checkable
class Planner(Protocol):
    """Turns a model, a cluster and a workload into the best plan it can find.

    ``plan`` receives an :class:`~hetpart.costmodel.evaluator.Evaluator` (which holds the predictor
    every planner prices its candidates with) and only the options named in ``options``; the front
    door (:func:`hetpart.policies.plan`) refuses any other option before calling it.
    """

    name: str
    """Registry name (``search``, ``uniform``, ...)."""
    options: frozenset[str]
    """Keyword options ``plan`` takes (besides ``evaluator``)."""

    def plan(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: "Evaluator",
             **options: Any) -> "Evaluated":
        """The chosen plan and its estimate; raises :class:`~hetpart.errors.WorkloadError` when none fits."""
        ...


@dataclass(frozen=True)
class FunctionPlanner:
    """A :class:`Planner` made of a function ``f(model, cluster, workload, *, evaluator, **options)``."""

    name: str
    function: Callable[..., "Evaluated"]
    options: frozenset[str] = frozenset()
    description: str = ""
    """One line for ``--help`` and the README."""

    def plan(self, model: "ModelGraph", cluster: "Cluster", workload: "Workload", *, evaluator: "Evaluator",
             **options: Any) -> "Evaluated":
        check_options(self, options)
        return self.function(model, cluster, workload, evaluator=evaluator, **options)


def check_options(planner: Planner, options: dict[str, Any]) -> None:
    """Refuse options ``planner`` does not take (never drop them silently)."""
    unknown = sorted(set(options) - set(planner.options))
    if unknown:
        takes = ", ".join(sorted(planner.options)) or "no options"
        raise PlanError(f"planner {planner.name!r}: unknown option(s) {', '.join(unknown)}; it takes {takes}")


def recompute_modes(workload: "Workload") -> tuple[str, ...]:
    """Modes a planner may choose: all three for ``auto``, else the one asked for."""
    if workload.recompute == "auto":
        return ("none", "selective", "full")
    return (workload.recompute,)


def sharding_levels(workload: "Workload") -> tuple[int, ...]:
    """Sharding levels a planner tries, in order, until a plan fits: the workload's, else 0 to 3; offloaded, only
    3 when the parameters live on the host (``full``), and from 1 up when the optimizer does (at level 0 every
    replica would step all the parameters on its node's CPU; level 1 divides that work among them)."""
    if workload.zero is not None:
        return (workload.zero,)
    return {"full": (3,), "optimizer": (1, 2, 3)}.get(workload.offload, (0, 1, 2, 3))


def offload_level(workload: "Workload") -> "Workload":
    """``workload`` with the first level of :func:`sharding_levels` where it offloads and leaves the level open;
    unchanged otherwise."""
    from dataclasses import replace

    if workload.zero is not None or workload.offload == "none":
        return workload
    return replace(workload, zero=sharding_levels(workload)[0])


def with_full_shard_fallback(planner, model, cluster, workload, evaluate):
    """``planner(model, cluster, workload, evaluate)``; when nothing fits and the workload leaves the
    sharding level open, the same planner again with states sharded over data parallelism, level 1 up
    to 3 (FSDP's full shard) until something fits: the obvious default of a baseline where nothing fits
    otherwise (one huge unit can fit at level 1 and not at 3, which gathers it whole). With host offload it
    starts at level 3 (``full``) or 1 (``optimizer``). Returns its best or None."""
    from dataclasses import replace

    rest = sharding_levels(workload)[1:] if workload.zero is None else ()
    best = planner(model, cluster, offload_level(workload), evaluate)
    for zero in rest:
        if best is not None:
            break
        best = planner(model, cluster, replace(workload, zero=zero), evaluate)
    return best


def microbatch_options(samples: int, limit: int = 16) -> list[int]:
    """Micro-batch sizes that divide ``samples`` sequences, up to ``limit``.

    >>> microbatch_options(12, limit=8)
    [1, 2, 3, 4, 6]
    """
    return [b for b in range(1, min(samples, limit) + 1) if samples % b == 0]


def spec_name(source: str, fallback: str) -> str:
    """The ``--model`` / ``--cluster`` argument that reloads an object read from ``source``.

    >>> spec_name("catalog:gpt2-small", "x"), spec_name("<dict>", "mine")
    ('gpt2-small', 'mine')
    """
    if source.startswith("catalog:"):
        return source.split(":", 1)[1]
    return source if source and not source.startswith("<") else fallback


LONG_SEQUENCE = 16384
"""From this many tokens a plan that does not fit is told about context parallelism (Megatron-Core and
torchtitan recipes turn it on for sequences of 16K-32K tokens and beyond)."""


OFFLOAD_HINTS = ("; or keep the optimizer in host memory (--offload optimizer: ZeRO-Offload, 2 bytes per parameter "
                 "left on the devices; --offload full with --zero 3 keeps none)",
                 ", or keep the optimizer in host memory (--offload optimizer)",
                 "--offload optimizer (the optimizer in host memory: a plan of this planner then fits), ",
                 ", --offload optimizer (the optimizer in host memory)")
"""What :func:`no_plan_error` adds for a workload that offloads nothing (dropped where offload was tried)."""


def device_state_bytes_per_param(workload: "Workload") -> float:
    """The least model-state bytes per parameter the devices hold together, however the states are sharded:
    all of them, or under ``offload`` only the 16-bit weights (``optimizer``) or none (``full``)."""
    from hetpart.costmodel.memory import state_bytes_per_param
    from hetpart.costmodel.sharding import state_bytes

    if workload.offload == "full":
        return 0.0
    if workload.offload == "optimizer":
        return state_bytes(workload.precision, workload.optimizer)[0]
    return float(state_bytes_per_param(workload.optimizer, workload.precision))


def host_state_gb(model: "ModelGraph", workload: "Workload", offload: str | None = None) -> float:
    """The least host memory the offloaded model states take on all nodes together, GB: each parameter's
    offloaded bytes once (fully sharded; :func:`hetpart.costmodel.offload.host_state_bytes`), under ``offload``
    (default the workload's)."""
    from hetpart.costmodel.offload import host_state_bytes
    from hetpart.costmodel.sharding import state_bytes

    w, g, opt = state_bytes(workload.precision, workload.optimizer)
    return model.num_params * host_state_bytes(w, g, opt, 1.0, offload or workload.offload) / 1e9


def host_capacity_gb(cluster: "Cluster") -> float:
    """Host memory of all the cluster's nodes together, GB (:func:`hetpart.costmodel.offload.host_memory_gb`: the
    cluster file's ``host_memory_gb``, else assumed)."""
    from hetpart.costmodel.offload import host_memory_gb

    return sum(host_memory_gb(group) * group.count for group in cluster.groups)


def _host_holds(model: "ModelGraph", cluster: "Cluster", workload: "Workload", offload: str) -> bool:
    """Whether the nodes' host memory can hold what ``offload`` moves there (else advising it is a dead end)."""
    return host_state_gb(model, workload, offload) <= host_capacity_gb(cluster)


def _host_text(model: "ModelGraph", cluster: "Cluster", workload: "Workload", offload: str) -> str:
    return (f"--offload {offload} needs {host_state_gb(model, workload, offload):.1f} GB of host memory and the "
            f"nodes hold {host_capacity_gb(cluster):.1f} GB in all")


def no_plan_error(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str, why: str) -> WorkloadError:
    """A :class:`WorkloadError` that says why nothing fits and what would.

    Where the model states alone bind (more than the devices hold in all; or, for the ``uniform`` and
    ``proportional`` planners, no plan of the planner's own space fits even at one sequence per micro-batch
    with full recomputation, checked by the memory rule the planner uses), the advice leads with what shrinks
    the states, and says nothing of the batch."""
    from hetpart.costmodel.memory import FRAGMENTATION_FRACTION, FRAMEWORK_OVERHEAD_GB, memory_capacity_gb

    per_param = device_state_bytes_per_param(workload)
    state_gb = model.num_params * per_param / 1e9
    capacity = sum(max(0.0, memory_capacity_gb(d.gpu)) for d in cluster.devices)  # a device under the reserve holds 0
    if capacity <= 0:
        types = list(dict.fromkeys(d.gpu for d in cluster.devices))
        return WorkloadError(
            f"{planner} planner: no plan for {model.name} fits {cluster.name}: the devices' memory ("
            + ", ".join(f"{g.name} {g.memory_gb:g} GB" for g in types)
            + f") is below the runtime's reserve ({FRAMEWORK_OVERHEAD_GB:g} GB of framework overhead plus "
            f"{FRAGMENTATION_FRACTION:.0%} for fragmentation), so nothing can be placed on them; check memory_gb "
            "(GiB, e.g. 80 for an 80 GB card) or use GPUs with more memory")
    kept = {"none": f"the weights, gradients and {workload.optimizer} states",
            "optimizer": "the 16-bit weights (the rest offloaded)", "full": "the states"}[workload.offload]
    hint = f"{kept} alone need {state_gb:.1f} GB and the cluster's devices hold {capacity:.1f} GB usable in all"
    if workload.offload in ("optimizer", "full") and not _host_holds(model, cluster, workload, workload.offload):
        host = _host_text(model, cluster, workload, workload.offload)
        hint = f"host memory binds: {host}" + (f"; {hint}" if state_gb >= capacity else "")
        fix = ("use a smaller model or a cluster with more memory (host_memory_gb per node group in the cluster "
               "file, if its nodes have more than assumed)")
    elif state_gb >= capacity:
        fix = _states_exceed_fix(model, cluster, workload, per_param, capacity)
    elif _least_activations_fit(model, cluster, workload, planner) is False:
        hint += (f", but no plan of the {planner} planner's own space fits even at one sequence per micro-batch with "
                 "full recomputation, so a smaller --global-batch cannot help")
        fix = _states_bind_fix(model, cluster, workload, planner)
    else:
        fix = ("try " + ("--recompute full (or auto), " if workload.recompute in ("none", "selective") else "")
               + "a smaller --global-batch that divides into whole micro-batches, a shorter --seq-len, or more devices")
        if workload.offload == "none" and _host_holds(model, cluster, workload, "optimizer"):
            fix += OFFLOAD_HINTS[1]
        if workload.seq_len >= LONG_SEQUENCE and model.config is not None:
            fix += ("; at this sequence length the activations are what does not fit: context parallelism splits "
                    "them (the planners do not choose it yet; price a grid with 'hetpart predict ... --cp 2' "
                    "(or 4, 8), prediction only)")
    unlinked = [(a, b) for i, a in enumerate(cluster.zones) for b in cluster.zones[i + 1:]
                if not cluster.zones_connected(a, b)]
    head = (f"{planner} planner: no plan for {model.name} (global batch {workload.global_batch}, seq "
            f"{workload.seq_len}) fits {cluster.name}: {why}")
    if unlinked:  # the cluster passed check_zones_connected: its zones reach each other through others
        a, b = unlinked[0]
        # the zones first: memory advice cannot help a plan that needs traffic between unlinked zones
        route = (f"or every candidate joins zones {a!r} and {b!r}, which have no link, in a pipeline or a gradient "
                 f"sync" + (", the tied embeddings' reduction included" if model.tied_owner_index >= 0 else ""))
        if planner != "search":
            route += "; `--planner search` and `--planner policy` keep to linked zones"
        return WorkloadError(f"{head}, {route}; where memory is what binds: {hint}; {fix}")
    return WorkloadError(f"{head}; {hint}; {fix}")


def _states_exceed_fix(model: "ModelGraph", cluster: "Cluster", workload: "Workload", per_param: float,
                       capacity: float) -> str:
    """The advice where the states outgrow the devices' memory in all: offload first where the 16-bit weights
    alone would fit (the same count) and host memory holds the rest, then a smaller model or more memory."""
    fix = (f"use a smaller model (under {capacity / per_param:.1f}B parameters, less with "
           "activations) or a cluster with more device memory")
    if workload.offload != "none":
        return fix
    from hetpart.costmodel.sharding import state_bytes

    weights_gb = model.num_params * state_bytes(workload.precision, workload.optimizer)[0] / 1e9
    optimizer_fits, full_fits = (_host_holds(model, cluster, workload, o) for o in ("optimizer", "full"))
    if weights_gb < capacity and optimizer_fits:
        return (f"keep the optimizer in host memory (--offload optimizer: ZeRO-Offload leaves the 16-bit weights, "
                f"{weights_gb:.1f} GB, on the devices), " + fix)
    if full_fits:
        return fix + "; or keep every state in host memory (--offload full --zero 3)"
    if optimizer_fits:
        return fix + OFFLOAD_HINTS[0]
    return fix + f" (offload cannot help: {_host_text(model, cluster, workload, 'optimizer')})"


def _states_bind_fix(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str) -> str:
    """The advice where the states bind the planner's own space: offload where that fits by the same check, a
    planner that cuts layers by device memory, more devices, a shorter sequence; never the batch. The offload
    parts are :data:`OFFLOAD_HINTS` (``--offload auto`` drops them, having tried offload)."""
    from dataclasses import replace

    first = last = ""
    if workload.offload == "none" and _host_holds(model, cluster, workload, "optimizer"):
        if _least_activations_fit(model, cluster, replace(workload, offload="optimizer"), planner):
            first = OFFLOAD_HINTS[2]
        else:
            last = OFFLOAD_HINTS[3]
    search = ("--planner search (it cuts layers by each device's memory, and the devices hold the states in all), "
              if planner in _CHECKED_PLANNERS else "")
    return f"try {first}{search}more devices{last}, or a shorter --seq-len"


_CHECKED_PLANNERS = ("uniform", "proportional")
"""Planners whose own space :func:`_least_activations_fit` walks (a grid of a few dozen layouts)."""
_MAX_CHECKED_PLANS = 4096
"""At most this many plans of the space are checked; beyond, the answer is unknown."""


def _least_activations_fit(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str) -> bool | None:
    """Whether some plan of ``planner``'s own space fits in memory with the least activations a batch can ask for:
    one sequence per micro-batch and full recomputation, at each sharding level the planner tries (the memory
    rule the planner itself checks: :meth:`~hetpart.plan.Plan.validate` and
    :meth:`~hetpart.costmodel.evaluator.Evaluator.fits`); ``None`` for a
    planner whose space is not walked here, or one too large to walk."""
    from dataclasses import replace

    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.errors import HetpartError

    if planner not in _CHECKED_PLANNERS:
        return None
    seen = 0
    for zero in sharding_levels(workload):
        least = replace(workload, recompute="full", zero=zero)
        fits = Evaluator(model, cluster, least).fits
        for plan in _space(model, cluster, least, planner):
            seen += 1
            if seen > _MAX_CHECKED_PLANS:
                return None
            try:
                if plan.micro_batch == 1 and not plan.validate(model, cluster) and fits(plan):
                    return True
            except HetpartError:
                continue
    return False


def _space(model: "ModelGraph", cluster: "Cluster", workload: "Workload", planner: str):
    """The plans of ``planner``'s own space at ``workload``'s recompute mode (a generator)."""
    from hetpart.errors import HetpartError

    if planner == "uniform":
        from hetpart.costmodel.megatron import megatron_plan
        from hetpart.policies.plan_uniform import uniform_grid

        for tp, pp, dp in uniform_grid(model, cluster, workload):
            try:
                yield megatron_plan(model, cluster, workload, tp=tp, pp=pp, dp=dp, micro_batch=1, schedule="1f1b",
                                    recompute=workload.recompute, zero=workload.zero)
            except HetpartError:
                continue
        return
    from hetpart.policies.plan_proportional import hap_plans, holmes_plans

    for layouts in (holmes_plans(model, cluster, workload), hap_plans(model, cluster, workload)):
        for variants in layouts:
            yield from variants
