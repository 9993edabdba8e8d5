"""What ``hetpart plan`` recorded in a plan's meta about how it priced the plan (engine options, a measured
profile), and the options ``predict`` and ``show`` price a plan file with: the recorded ones, where no flag
given on the command line says otherwise."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

__all__ = ["recorded_engine", "profile_record", "recorded_profile", "profile_from_record", "plan_options"]


def recorded_engine(plan, source: str) -> dict:
    """The engine options ``hetpart plan`` priced ``plan`` with (its ``meta.engine``: ``--overlap-p2p``,
    ``--no-overlap-grad-reduce``, ``--op-counts measured``), checked; {} for the defaults."""
    from hetpart.errors import PlanError

    recorded = plan.meta.get("engine") or {}
    if not isinstance(recorded, dict):
        raise PlanError(f"{source}: meta.engine: expected the engine options hetpart plan wrote, got "
                        f"{type(recorded).__name__}; remove it (the defaults price the plan)")
    allowed = {"overlap_p2p": (True, False), "overlap_grad_reduce": (True, False), "op_counts": ("measured", "engine")}
    for key, value in recorded.items():
        if key not in allowed or not any(value is a if isinstance(a, bool) else value == a for a in allowed[key]):
            raise PlanError(f"{source}: meta.engine.{key}: {value!r} is not an engine option hetpart plan writes "
                            f"({', '.join(allowed)}); remove it")
    return dict(recorded)


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def profile_record(path: Path) -> dict[str, str]:
    """The ``meta.profile`` of a plan priced with the profile at ``path``: where it is and a digest of its bytes
    (so that a later edit of the file is noticed instead of silently re-pricing the plan)."""
    return {"path": str(path.resolve()), "sha256": _digest(path)}


def recorded_profile(plan, source: str, predictor: Optional[str]):
    """The profile ``plan`` was priced with (its ``meta.profile``), loaded; None where it records none, or, with
    one ``hetpart: note:`` line on stderr, where that profile cannot price it now (the file is gone or changed,
    or the predictor takes no profile): the plan is then re-priced without it."""
    return profile_from_record(plan.meta.get("profile"), source, predictor)


def profile_from_record(record: Any, source: str, predictor: Optional[str]):
    """:func:`recorded_profile` of a ``meta.profile`` value ``record`` (None: none recorded)."""
    from hetpart.costmodel.predictor import default_predictor
    from hetpart.errors import PlanError

    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("path"), str) or not isinstance(
            record.get("sha256"), str):
        raise PlanError(f"{source}: meta.profile: expected the path and sha256 hetpart plan wrote, got {record!r}; "
                        "remove it (or give --profile)")
    path = Path(record["path"])
    name = predictor or default_predictor()
    why = None
    if name != "simulator":
        why = f"the {name!r} predictor takes no profile"
    elif not path.is_file():
        why = "that file is gone"
    else:
        try:
            if _digest(path) != record["sha256"]:
                why = "that file changed since (its sha256 differs)"
        except OSError as exc:
            why = f"that file cannot be read ({exc.__class__.__name__})"
    if why:
        print(f"hetpart: note: {source} was priced with the profile {path}, but {why}: it is re-priced without "
              "the profile (give --profile to price it with one)", file=sys.stderr)
        return None
    from hetpart.costmodel.profile import load_profile

    return load_profile(path)


def plan_options(plan, source: str, given_engine: dict, profile, predictor: Optional[str]) -> dict[str, Any]:
    """The predictor options that price ``plan`` (read from ``source``): its recorded engine options with the
    flags given on the command line (``given_engine``, :func:`engine_flags`) over them, and ``profile``
    (``--profile``) or else the recorded one; engine options at their defaults left out."""
    from hetpart.cli.common import non_default

    engine = non_default(recorded_engine(plan, source) | given_engine)
    if profile is None:
        profile = recorded_profile(plan, source, predictor)
    return ({"profile": profile} if profile is not None else {}) | engine
