"""Small helpers that check untrusted mappings and raise one clear line: ``file: field: problem; fix``."""

from __future__ import annotations

import difflib
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from hetpart.errors import HetpartError

__all__: list[str] = []


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so that a huge bad value still gives one short line."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # ints beyond Python's digit limit, self-nesting
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def where(source: str, field: str) -> str:
    return f"{source}: {field}" if field else source


def fail(exc: type[HetpartError], source: str, field: str, message: str) -> HetpartError:
    return exc(f"{where(source, field)}: {message}")


def kind(value: Any) -> str:
    """What a value is, in the words of the file formats (no Python class names)."""
    if value is None:
        return "an empty value"
    names = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping"}
    for t, name in names.items():
        if type(value) is t:
            return f"{name} {show(value, 40)}" if t in (bool, int, float, str) else name
    return "a value of another kind"


def require_mapping(exc, value: Any, source: str, field: str) -> dict:
    if not isinstance(value, dict):
        raise fail(exc, source, field, f"expected a mapping (key: value), got {kind(value)}")
    return value


def require_keys(exc, data: dict, source: str, field: str, required: Iterable[str], optional: Iterable[str]) -> None:
    required = list(required)
    allowed = set(required) | set(optional)
    for key in data:
        if not isinstance(key, str) or key not in allowed:
            # Prefer a required key that is still missing: 'tflops' most likely meant 'tflops_bf16'.
            missing = sorted(k for k in required if k not in data)
            hint = (difflib.get_close_matches(str(key), missing, n=1)
                    or difflib.get_close_matches(str(key), sorted(allowed), n=1))
            fix = f"did you mean '{hint[0]}'?" if hint else f"allowed keys: {', '.join(sorted(allowed))}"
            name = key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else show(key)
            raise fail(exc, source, f"{field}.{name}" if field else name, f"unknown key; {fix}")
    for key in required:
        if key not in data:
            raise fail(exc, source, f"{field}.{key}" if field else key, "missing required field; add it")


def number(exc, value: Any, source: str, field: str, *, minimum: float = 0.0, strict: bool = True,
           maximum: float = 1e9) -> float:
    # ints are compared exactly: math.isfinite would overflow on a 400-digit YAML integer.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise fail(exc, source, field, f"expected a number, got {show(value)}")
    if (strict and not value > minimum) or (not strict and not value >= minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise fail(exc, source, field, f"must be {bound}, got {show(value)}")
    if value > maximum:
        raise fail(exc, source, field, f"{show(value)} is absurdly large (limit {maximum:g}); check the unit")
    return float(value)


def number_text(value: Any) -> Any:
    """``value``, or the number a text spells in full (``"1e2"``: YAML 1.1 reads an exponent without a decimal
    point as text); other text stays text, for :func:`number` to refuse."""
    if isinstance(value, str) and len(value) <= 40:
        try:
            parsed = float(value)
        except ValueError:
            return value
        return parsed if math.isfinite(parsed) else value
    return value


def integer(exc, value: Any, source: str, field: str, *, minimum: int = 1, maximum: int = 10**7) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(exc, source, field, f"expected a whole number, got {show(value)}")
    if value < minimum:
        raise fail(exc, source, field, f"must be >= {minimum}, got {show(value)}")
    if value > maximum:
        raise fail(exc, source, field, f"{show(value)} is absurdly large (limit {maximum})")
    return value


def boolean(exc, value: Any, source: str, field: str) -> bool:
    # bool("false") is True: a quoted YAML/JSON boolean must be an error, not a silent yes.
    if not isinstance(value, bool):
        raise fail(exc, source, field, f"expected true or false, got {show(value)}")
    return value


MAX_STRING_CHARS = 256
"""Names and ids in input files are short; a longer one is a mistake and is never echoed whole."""


def string(exc, value: Any, source: str, field: str, max_chars: int = MAX_STRING_CHARS) -> str:
    if not isinstance(value, str) or not value.strip():
        raise fail(exc, source, field, f"expected a non-empty string, got {kind(value)}")
    if len(value) > max_chars or not value.isprintable():
        what = f"{len(value):,} characters, more than {max_chars}" if len(value) > max_chars else "unprintable characters"
        raise fail(exc, source, field, f"{show(value, 40)} has {what}; use a short name")
    return value


def unknown_name(exc, kind: str, name: str, known: Iterable[str], source: str, field: str, extra: str = "") -> HetpartError:
    known = list(known)
    hint = closest_name(name, known)
    did = f"did you mean '{hint}'? " if hint else ""
    return fail(exc, source, field, f"unknown {kind} {show(name, 200)}; {did}known: {', '.join(sorted(known))}{extra}")


def _squash(text: str) -> str:
    """``text`` without case and punctuation but decimal points: 'GPT-2' and 'gpt2' are one name, 'gpt3-1.3b'
    and 'gpt3-13b' two."""
    return "".join(c for c in text.casefold() if c.isalnum() or c == ".")


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` that ``name`` most likely means: the same letters and digits (case and
    punctuation aside), else the first (in ``known``'s order, a catalog's smallest first) that starts with
    them, a family's name ('GPT-2' -> 'gpt2-small'), else the closest spelling; None when none is close.

    >>> closest_name("GPT-2", ["gpt2-small", "gpt2-medium", "gpt3-2.7b"])
    'gpt2-small'
    >>> closest_name("lama2-7b", ["gpt2-small", "llama2-7b"])
    'llama2-7b'
    """
    known = list(known)
    if len(name) >= 100 or not known:
        return None
    squashed = {_squash(k): k for k in reversed(known)}  # the first of names that squash alike wins
    key = _squash(name)
    if key in squashed:
        return squashed[key]
    if key:
        family = next((k for k in known if _squash(k).startswith(key)), None)
        if family is not None:
            return family
    close = difflib.get_close_matches(key, list(squashed), n=1) if key else []
    if close:
        return squashed[close[0]]
    folded = {k.casefold(): k for k in known}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1)
    return folded[close[0]] if close else None


def path_exists(path: Path) -> bool:
    """Whether ``path`` exists; False for names the OS refuses (too long, NUL bytes) instead of raising."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def check_creatable(exc: type[HetpartError], path: Path, source: str, fix: str) -> None:
    """Refuse, before long work starts, a ``path`` that cannot be created: its nearest existing folder is no
    folder, or no file can be made in it (tried: a file created there and removed, since ``os.access`` says
    yes to root on /proc and read-only mounts). Missing folders between them are left to the writer to
    create. Leaves nothing behind.

    Raises:
        exc: ``source: cannot create PATH: FOLDER is not ...; fix``.
    """
    parent = path.parent
    while not path_exists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise exc(f"{source}: cannot create {path}: {parent} is not a directory; {fix}")
    try:
        handle, probe = tempfile.mkstemp(prefix=".hetpart-out-check-", dir=parent)
    except OSError as err:
        raise exc(f"{source}: cannot create {path}: {parent} is not writable ({err.strerror or err}); {fix}") \
            from None
    os.close(handle)
    os.unlink(probe)


MAX_FILE_BYTES = 64 * 2**20
"""Input files (cluster YAML, plan JSON, config.json) are small; anything larger is a wrong path."""


def read_text(exc: type[HetpartError], path: Path, what: str) -> str:
    """The UTF-8 text of the regular file ``path``, or one clear error naming the file.

    Devices and pipes (``/dev/zero``) are refused before reading, so a wrong path cannot hang.
    """
    try:
        if not path.is_file():
            reason = "is a directory" if path.is_dir() else (
                "is not a regular file" if path_exists(path) else "no such file")
        elif path.stat().st_size > MAX_FILE_BYTES:
            reason = f"{path.stat().st_size} bytes, more than the {MAX_FILE_BYTES} byte limit"
        else:
            return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        reason = "not UTF-8 text"
    except (OSError, ValueError) as err:  # permissions, names the OS refuses
        reason = f"{err.__class__.__name__}: {getattr(err, 'strerror', None) or err}"
    name = str(path) if str(path).isprintable() and len(str(path)) <= 200 else show(str(path), 200)
    raise exc(f"{name}: cannot read {what}: {reason}; check the path")


def missing_recorded_source(source: str, key: str, recorded: Any) -> str | None:
    """Why the ``model`` or ``cluster`` (``key``) a plan's meta records cannot be read, or None: a plan keeps the
    path of the files it was planned on, and a moved or copied plan otherwise failed as if ``--cluster`` (or
    ``--model``) had been given. Catalog names, ``python:`` specs and bare names (whose own error says more) pass."""
    if not isinstance(recorded, str) or not recorded or recorded.startswith("python:"):
        return None
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.cluster import cluster_catalog

    catalog = MODEL_CATALOG if key == "model" else cluster_catalog()
    if recorded in catalog or path_exists(Path(recorded)):
        return None
    if not (recorded.endswith((".yaml", ".yml", ".json")) or "/" in recorded):
        return None
    return (f"{source}: meta.{key}: {show(recorded, 200)}: no such file (the {key} the plan was made on has moved); "
            f"give --{key}")


def yaml_float(value: Any) -> float | None:
    """``value`` as a float for a float setting read from YAML, or None when it is no finite number.

    PyYAML follows YAML 1.1, where a float needs a dot: ``1e-3`` is read as the string ``'1e-3'`` (and ``1`` as
    an int). Both are taken; booleans, None and text that is no finite number are not.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def refuse_input_as_output(exc: type[HetpartError], out: Any, flag: str, inputs: dict[str, Any]) -> None:
    """Refuse an output path that is one of the command's own input files (``inputs``: what the user calls it, e.g.
    ``"--cluster"``, to the path or spec given; catalog names, ``python:`` specs and None are skipped): writing it
    would destroy the input (a plan written over the cluster YAML it was planned on). Compared as files (the same
    inode where both exist, else the same resolved path), before any work.

    Raises:
        exc: ``FLAG: OUT is the INPUT file this command reads; give another path (nothing was written)``.
    """
    if out is None:
        return
    target = Path(str(out))
    for what, given in inputs.items():
        if given is None or not str(given) or str(given).startswith("python:"):
            continue
        source = Path(str(given))
        if not path_exists(source) or source.is_dir():
            continue
        try:
            same = path_exists(target) and os.path.samefile(target, source)
        except OSError:
            same = False
        if same or target.resolve() == source.resolve():
            raise exc(f"{flag}: {out} is the {what} file this command reads; give another path (nothing was written)")
