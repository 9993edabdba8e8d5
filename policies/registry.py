"""The open planner registry: ``register_planner``, ``get_planner``, ``available_planners``.

A planner is registered as an object (a :class:`~hetpart.policies.common.Planner`) or as
``"module:attribute"``, imported on first use, so that registering costs no import (the GNN policy
pulls in torch-geometric only when asked for). Adding a planner is one module and one line here.

>>> from hetpart.policies import available_planners, get_planner
>>> available_planners()[:3]
('uniform', 'proportional', 'search')
>>> sorted(get_planner("search").options)[:3]
['configs_per_pool', 'fewer_nodes', 'ignore_memory']
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Union

from hetpart.errors import PlanError
from hetpart.policies.common import Planner

__all__ = ["register_planner", "get_planner", "available_planners", "BUILTIN_PLANNERS", "checkpoint_file"]

BUILTIN_PLANNERS: tuple[str, ...] = ("uniform", "proportional", "search")
"""The planners that ship with the core install (baseline first)."""

_PLANNERS: dict[str, Union[Planner, str]] = {
    "uniform": "hetpart.policies.plan_uniform:UNIFORM",
    "proportional": "hetpart.policies.plan_proportional:PROPORTIONAL",
    "search": "hetpart.policies.plan_search:SEARCH",
    "policy": "hetpart.policies.policy_planner:POLICY",
}
_PLACEHOLDERS: dict[str, str] = {}
"""Names the CONTRACT promises that no planner answers yet: asked for, they say why."""


def register_planner(name: str, planner: Union[Planner, str]) -> None:
    """Make ``planner`` (an object, or ``"module:attribute"`` imported on first use) available as ``name``."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise PlanError(f"register_planner: name {name!r}: use letters, digits, '-' or '_'")
    _PLANNERS[name] = planner


def available_planners() -> tuple[str, ...]:
    """Registered planner names: the built-in ones first, then in registration order."""
    return tuple(sorted(_PLANNERS, key=lambda n: (n not in BUILTIN_PLANNERS,
                                                  BUILTIN_PLANNERS.index(n) if n in BUILTIN_PLANNERS else 0)))


def get_planner(name: str) -> Planner:
    """The planner registered as ``name``.

    Raises:
        PlanError: unknown name, or a promised one (``policy``) that is not registered yet.
    """
    if name not in _PLANNERS:
        known = ", ".join(available_planners())
        if name in _PLACEHOLDERS:
            raise PlanError(f"--planner: {name!r} is not built yet ({_PLACEHOLDERS[name]}); use one of {known}")
        raise PlanError(f"--planner: unknown planner {name!r}; use one of {known}")
    planner = _PLANNERS[name]
    if isinstance(planner, str):
        module, _, attribute = planner.partition(":")
        planner = _PLANNERS[name] = getattr(importlib.import_module(module), attribute)
    if not isinstance(planner, Planner):
        raise PlanError(f"planner {name!r}: {type(planner).__name__} is not a Planner (needs name, options and "
                        "plan(model, cluster, workload, *, evaluator, **options))")
    return planner


def checkpoint_file(path: str | Path) -> Path | None:
    """The policy checkpoint file stable-baselines3 loads for ``path``: ``path`` itself, else ``path.zip``
    (SB3's ``save("runs/mine")`` writes ``runs/mine.zip``, and ``load("runs/mine")`` reads it), else None.

    >>> checkpoint_file("no/such/policy") is None
    True
    """
    for candidate in (Path(path), Path(f"{path}.zip")):
        if candidate.is_file():
            return candidate
    return None
