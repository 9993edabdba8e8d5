"""The exception hierarchy. The CLI turns any :class:`HetpartError` into one line and exit code 2."""

from __future__ import annotations

__all__ = ["HetpartError", "SpecError", "ModelError", "PlanError", "WorkloadError", "RuntimeFault"]


class HetpartError(Exception):
    """Base of every error caused by user input or an impossible request.

    The message names the offending value, where it came from (file and field) and the fix.
    """


class SpecError(HetpartError):
    """A cluster or hardware description is malformed or names something unknown."""


class ModelError(HetpartError):
    """A model argument (catalog name, config.json, ``python:`` spec) cannot be turned into a graph."""


class PlanError(HetpartError):
    """A plan is malformed or breaks a rule of the model, the cluster or the workload."""


class WorkloadError(HetpartError):
    """A workload is impossible (batch not divisible, model fits nowhere, zones without a link)."""


class RuntimeFault(HetpartError):
    """A distributed run failed: a rank died or hung, or the machine cannot host the plan."""
