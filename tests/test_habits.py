"""Habits that keep the house standing: the import contract covers the whole core; docstring examples run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import tomllib
from pathlib import Path

import pytest

import hetpart

REPO = Path(__file__).resolve().parents[1]
PARTS = {"costmodel", "envs", "policies", "runtime", "experiments", "cli"}
"""Subpackages above the core (each has its own contract)."""


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_core_contract_names_every_core_module() -> None:
    """A new core module must join the core's contract, or import-linter would not look at it."""
    core = {m.name for m in pkgutil.iter_modules(hetpart.__path__)} - PARTS - {"__main__"}
    for contract in ("core", "cli"):
        listed = {m.removeprefix("hetpart.") for m in _contracts()[contract]["source_modules"]}
        missing = sorted(core - listed)
        assert not missing, f"pyproject.toml: contract {contract!r}: add hetpart.{', hetpart.'.join(missing)}"


DOCTESTED = ["hetpart.vocabulary", "hetpart.costmodel.device_group", "hetpart.costmodel.predictor", "hetpart.costmodel.simulator", "hetpart.costmodel.nccl", "hetpart.policies.registry",
             "hetpart.policies.common"]


@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result.failed} of {result.attempted} failed"
