"""One interface to every cost model: the :class:`Predictor` protocol and its registry.

A predictor prices plans of one model on one cluster. It answers three questions:

* :meth:`Predictor.estimate_batch` -- step time and memory fit of many plans in one call (the
  planners' and the environment's inner loop; a learned model scores them in one forward pass);
* :meth:`Predictor.predict` -- the full report of one plan (:class:`Prediction`, with the CONTRACT
  metrics);
* ``lower_bound_s`` -- a step time no prediction of the plan goes below, or ``None`` (absent) when the
  predictor cannot bound itself. Branch and bound (:class:`~hetpart.costmodel.evaluator.Evaluator`)
  prunes only with a bound and says in its result when it could not.

Every predictor carries a ``name`` and a ``version`` (run records store both). The registry maps
names to factories ``factory(model, cluster, workload=None, **options) -> Predictor``; a factory may
be given as ``"module:attribute"`` and is imported on first use, so that registering costs no import.

Example:
    >>> from hetpart import load_cluster, load_model
    >>> from hetpart.costmodel import available_predictors, get_predictor
    >>> "simulator" in available_predictors()
    True
    >>> sim = get_predictor("simulator", load_model("gpt2-small", seq_len=256), load_cluster("a100-8"))
    >>> sim.name, sim.lower_bound_s is not None
    ('simulator', True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, Union, runtime_checkable

from hetpart.errors import PlanError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.simulator import Estimate, Prediction
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan
    from hetpart.workload import Workload

__all__ = ["Predictor", "PredictorFactory", "register_predictor", "get_predictor", "available_predictors",
           "default_predictor", "set_default_predictor", "lower_bound_of", "check_predictor_name"]


@runtime_checkable
class Predictor(Protocol):
    """Prices plans of one model on one cluster (see the module docstring)."""

    name: str
    """Registry name (``simulator``, ``learned``, ...)."""
    version: str
    """What produced the numbers (code version, or a learned model's checkpoint); run records keep it."""

    def estimate_batch(self, plans: Sequence["Plan"]) -> list["Estimate"]:
        """Step time and memory fit of each plan, in order. Plans are valid (callers check them);
        one that breaks a rule raises :class:`~hetpart.errors.PlanError`."""
        ...

    def predict(self, plan: "Plan", workload: Optional["Workload"] = None, *, validate: bool = True,
                trace: bool = False) -> "Prediction":
        """The full report of one plan (metrics, breakdown, per-device memory)."""
        ...


PredictorFactory = Callable[..., Predictor]
"""``factory(model, cluster, workload=None, **options) -> Predictor``."""

_FACTORIES: dict[str, Union[PredictorFactory, str]] = {
    "simulator": "hetpart.costmodel.simulator:simulator_predictor",
    "learned": "hetpart.costmodel.learned.closed:closed_predictor",
    "learned-graph": "hetpart.costmodel.learned.predictor:learned_predictor",
    "corrected": "hetpart.costmodel.learned.corrected:corrected_predictor",
}
_PLACEHOLDERS: dict[str, str] = {}
"""Names the CONTRACT promises that no factory answers yet: asked for, they say why."""
_DEFAULT = ["simulator"]


def register_predictor(name: str, factory: Union[PredictorFactory, str], *, default: bool = False) -> None:
    """Make ``name`` available to :func:`get_predictor` (``factory`` or ``"module:attribute"``).

    Args:
        default: also make it the predictor used when none is named.
    """
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise PlanError(f"register_predictor: name {name!r}: use letters, digits, '-' or '_'")
    _FACTORIES[name] = factory
    if default:
        _DEFAULT[0] = name


def set_default_predictor(name: str) -> None:
    """Use ``name`` when no predictor is named (it must be registered)."""
    _check_name(name)
    _DEFAULT[0] = name


def default_predictor() -> str:
    """The name :func:`get_predictor` uses for ``name=None``."""
    return _DEFAULT[0]


def available_predictors() -> tuple[str, ...]:
    """Registered predictor names (placeholders excluded), default first."""
    return tuple(sorted(_FACTORIES, key=lambda n: (n != _DEFAULT[0], n)))


def check_predictor_name(name: Optional[str]) -> None:
    """Raise the registry's clear :class:`PlanError` for a name it cannot answer (None: the default)."""
    _check_name(name or _DEFAULT[0])


def _check_name(name: str) -> None:
    if name in _FACTORIES:
        return
    known = ", ".join(available_predictors())
    if name in _PLACEHOLDERS:
        raise PlanError(f"--predictor: {name!r} is not built yet ({_PLACEHOLDERS[name]}); use one of {known}")
    raise PlanError(f"--predictor: unknown predictor {name!r}; use one of {known}")


def _resolve(name: str) -> PredictorFactory:
    factory = _FACTORIES[name]
    if isinstance(factory, str):
        module, _, attribute = factory.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
        _FACTORIES[name] = factory
    return factory


def get_predictor(name: Optional[str], model: "ModelGraph", cluster: "Cluster",
                  workload: Optional["Workload"] = None, **options: Any) -> Predictor:
    """The predictor ``name`` (the default one for ``None``) for ``model`` on ``cluster``.

    Raises:
        PlanError: unknown or not yet available name, or an option the predictor does not take.
    """
    name = name or _DEFAULT[0]
    _check_name(name)
    factory = _resolve(name)
    _check_options(name, factory, options)
    return factory(model, cluster, workload, **options)


def _check_options(name: str, factory: PredictorFactory, options: dict[str, Any]) -> None:
    """Refuse an option the predictor's factory does not take (one line, naming it), instead of a TypeError."""
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: let the call itself decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(options) - set(params))
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise PlanError(f"--predictor {name}: it does not take {flags}; drop {'it' if len(unknown) == 1 else 'them'} "
                        "or use --predictor simulator")


def lower_bound_of(predictor: Predictor) -> Optional[Callable[["Plan"], float]]:
    """The predictor's ``lower_bound_s`` method, or None when it has none (absent or ``None``)."""
    return getattr(predictor, "lower_bound_s", None)
