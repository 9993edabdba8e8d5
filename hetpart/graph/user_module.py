"""Where the code of a ``python:`` model is, and the spec a plan keeps so that it is found from any directory.

Two forms (``--model``):

* ``python:MODULE:FUNCTION``: a module on the Python path, or a top-level package in the current directory, as
  ``python -m`` finds it;
* ``python:/path/to/file.py:FUNCTION``: a file, imported under its packages' dotted name (the folders above it
  that hold an ``__init__.py``), so that its relative imports work. A module of the same top-level name found
  elsewhere first (on the Python path, or imported already) is refused rather than silently used instead.

Neither edits ``sys.path`` (STYLE.md): a top-level module is loaded from its folder with
``importlib.machinery.PathFinder`` and entered in ``sys.modules``; its submodules are then found through it.

A plan keeps :func:`portable_spec` of its model: a module found through the current directory (a probe of
2026-12-01 planned ``python:mymod:build`` in its folder, and ``hetpart show --plan`` failed from any other) is
stored as the absolute path of its file.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from hetpart.errors import ModelError

__all__ = ["split_python_spec", "import_python_module", "portable_spec"]

_FORMS = "python:MODULE:FUNCTION or python:/path/to/file.py:FUNCTION, e.g. python:mypkg.models:build"


def split_python_spec(spec: str) -> tuple[str, str]:
    """``(module or file, function)`` of ``spec``; a spec of another shape is a :class:`ModelError`."""
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "python" or not parts[1] or not parts[2]:
        raise ModelError(f"--model: {spec!r}: expected {_FORMS}")
    return parts[1], parts[2]


def _is_file(module: str) -> bool:
    """Whether the module part names a file (a path, or an existing ``NAME.py`` here) rather than a dotted module
    name (``pkg.py`` without such a file stays the submodule ``py`` of ``pkg``)."""
    return "/" in module or os.sep in module or (module.endswith(".py") and Path(module).is_file())


def import_python_module(spec: str) -> ModuleType:
    """The module of ``spec`` (``python:MODULE:FUNCTION`` or ``python:/path/file.py:FUNCTION``), imported.

    Raises:
        ModelError: the module or file is not found, or its name is taken by another module. Errors raised by
            the module's own code while it is imported propagate unchanged (the caller names them).
    """
    module, _ = split_python_spec(spec)
    if _is_file(module):
        name, root = _file_module(Path(module), spec)
        return _import_at(name, root, spec)
    top = module.split(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        found = importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())])
        if found is None or found.loader is None:
            raise ModelError(f"{spec}: no module named {top!r} on the Python path or in {Path.cwd()}; check the "
                             "spelling, run from the directory that holds it, or give the file: "
                             "python:/path/to/file.py:FUNCTION")
        _load_top(top, found)
    return importlib.import_module(module)


def _file_module(path: Path, spec: str) -> tuple[str, Path]:
    """``(dotted name, folder above its packages)`` of the file ``path``: ``/w/pkg/sub/m.py`` with ``__init__.py``
    in ``pkg`` and ``sub`` is ``pkg.sub.m`` under ``/w``."""
    file = path.expanduser()
    if not file.is_file():
        why = "is a directory" if file.is_dir() else "no such file"
        raise ModelError(f"{spec}: {path}: {why}; give the .py file that defines the function "
                         "(python:/path/to/file.py:FUNCTION)")
    if file.suffix != ".py":
        raise ModelError(f"{spec}: {path} is not a .py file; give the Python file that defines the function")
    file = file.resolve()
    parts = [] if file.stem == "__init__" else [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    bad = next((p for p in parts if not p.isidentifier()), None)
    if bad is not None or not parts:
        raise ModelError(f"{spec}: {bad or file.name!r} is not a Python module name (letters, digits and _, not "
                         "starting with a digit); rename it")
    return ".".join(parts), folder


def _import_at(name: str, root: Path, spec: str) -> ModuleType:
    """Import ``name`` whose top-level module is in the folder ``root``; refused where that name is another
    module's (on the Python path or imported already), which would be used in its place."""
    top = name.split(".")[0]
    wanted = {root / f"{top}.py", root / top / "__init__.py"}
    if top in sys.modules:
        where = getattr(sys.modules[top], "__file__", None) or "an imported module"
    else:
        found = importlib.util.find_spec(top)
        if found is None:  # not on the Python path: loaded from its folder
            here = importlib.machinery.PathFinder.find_spec(top, [str(root)])
            if here is None or here.loader is None or not here.origin:
                raise ModelError(f"{spec}: Python cannot load {top!r} from {root}; check the file")
            _load_top(top, here)
            return importlib.import_module(name)
        where = found.origin or "a namespace package"
    if not _same_file(where, wanted):
        raise ModelError(f"{spec}: its module name {top!r} is taken by {where}, which Python would import "
                         f"instead; rename the file (or its package folder {top!r})")
    return importlib.import_module(name)


def _same_file(where: str, wanted: set[Path]) -> bool:
    try:
        return Path(where).resolve() in wanted
    except (OSError, ValueError):
        return False


def _load_top(top: str, found) -> None:
    """Enter the top-level module ``top`` found at ``found`` (a module spec) in ``sys.modules`` and run it."""
    mod = importlib.util.module_from_spec(found)
    sys.modules[top] = mod
    try:
        found.loader.exec_module(mod)
    except BaseException:
        del sys.modules[top]
        raise


def portable_spec(spec: str) -> str:
    """``spec`` as a plan keeps it, found from any directory: a file given by a relative path becomes absolute,
    and a module that the Python path finds only through the current directory (an entry equal to it, ``''`` or
    a relative one; or the directory lookup of :func:`import_python_module`) becomes the absolute path of its
    file. A module found through another absolute entry of the Python path stays as given. Call it after the
    model was loaded: it reads ``sys.modules``."""
    try:
        module, func = split_python_spec(spec)
    except ModelError:
        return spec
    if _is_file(module):
        return f"python:{Path(module).expanduser().resolve()}:{func}"
    file = getattr(sys.modules.get(module), "__file__", None)
    top_file = getattr(sys.modules.get(module.split(".")[0]), "__file__", None)
    if not file or not top_file:
        return spec
    cwd = Path.cwd().resolve()
    elsewhere = [p for p in sys.path if p and os.path.isabs(p) and Path(p).resolve() != cwd]
    found = importlib.machinery.PathFinder.find_spec(module.split(".")[0], elsewhere)
    if found is not None and found.origin and _same_file(found.origin, {Path(top_file).resolve()}):
        return spec
    return f"python:{Path(file).resolve()}:{func}"
