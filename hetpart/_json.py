"""Strict JSON text: what hetpart prints with ``--json`` and writes as state files. JSON has no NaN or
infinity (Python's ``json`` writes them as the bare words ``NaN``/``Infinity``, which strict parsers such as
JavaScript's ``JSON.parse`` refuse), so a float that is not finite (a mean over nothing measured) is written
``null``: no value."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

__all__ = ["finite", "strict_dumps"]


def finite(obj: Any) -> Any:
    """``obj`` (plain data: dicts, lists, tuples, scalars) with every non-finite float replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(value) for value in obj]
    return obj


def strict_dumps(obj: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None,
                 sort_keys: bool = False) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats as null (objects ``default`` converts included)."""
    if default is not None:  # convert first, so that what default returns is made finite too
        obj = json.loads(json.dumps(obj, default=default))
    return json.dumps(finite(obj), indent=indent, allow_nan=False, sort_keys=sort_keys)
