"""The exception hierarchy and the CLI's exit codes.

The CLI turns any :class:`HetpartError` into one line on stderr (and, under ``--json``, one
``{"error": ..., "kind": ...}`` object on stdout) and exits with the error's ``exit_code``:

=====  ==================  ==========================================================
code   kind                meaning
=====  ==================  ==========================================================
0                          success
1      ``internal``        a bug in hetpart (the message asks for a report)
2      ``bad_input``       bad input: unknown name, wrong field, impossible plan, ...
3      ``run_failed``      a started run failed: a rank died, raised or hung
130    ``interrupted``     interrupted (Ctrl-C); 143 when terminated (SIGTERM)
=====  ==================  ==========================================================
"""

from __future__ import annotations

__all__ = ["HetpartError", "SpecError", "ModelError", "PlanError", "WorkloadError", "RuntimeFault", "WorkerFault",
           "Interrupted", "EXIT_OK", "EXIT_INTERNAL", "EXIT_BAD_INPUT", "EXIT_RUN_FAILED", "EXIT_INTERRUPTED"]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 130


class HetpartError(Exception):
    """Base of every error caused by user input or an impossible request.

    The message names the offending value, where it came from (file and field) and the fix.
    """

    exit_code: int = EXIT_BAD_INPUT
    kind: str = "bad_input"


class SpecError(HetpartError):
    """A cluster or hardware description is malformed or names something unknown."""


class ModelError(HetpartError):
    """A model argument (catalog name, config.json, ``python:`` spec) cannot be turned into a graph."""


class PlanError(HetpartError):
    """A plan is malformed or breaks a rule of the model, the cluster or the workload."""


class WorkloadError(HetpartError):
    """A workload is impossible (batch not divisible, model fits nowhere, zones without a link)."""


class RuntimeFault(HetpartError):
    """A distributed run cannot start here: the machine cannot host the plan, a tool is missing."""


class WorkerFault(RuntimeFault):
    """A started run failed: a rank died, raised, hung or ended without a result (exit code 3)."""

    exit_code = EXIT_RUN_FAILED
    kind = "run_failed"


class Interrupted(HetpartError):
    """The user stopped the command (Ctrl-C: exit code 130; SIGTERM: 143)."""

    kind = "interrupted"

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
