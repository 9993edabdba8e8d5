"""The ``hetpart`` entry point: builds the typer app and turns user errors into one line + exit 2."""

from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager

import typer

__all__ = ["app", "main"]

app = typer.Typer(name="hetpart", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True,
                  help="Plan, predict and run the training of large models on heterogeneous clusters.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from hetpart import __version__

        try:
            installed = version("hetpart")
        except PackageNotFoundError:  # run from a source tree without installing
            installed = __version__
        print(f"hetpart {installed}")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """hetpart: heterogeneity-aware parallel plans for large-model training."""


def _register() -> None:
    # Each module adds its commands; imports inside the commands stay lazy.
    from hetpart.cli import inspect_cmd

    inspect_cmd.register(app)
    for name in ("plan_cmd", "run_cmd", "bench_cmd", "export_cmd", "report_cmd", "policy_cmd", "costmodel_cmd", "loop_cmd",
                 "calibrate_cmd"):
        try:
            module = __import__(f"hetpart.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"hetpart.cli.{name}":
                raise
            continue
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (:mod:`hetpart.errors`: 0 ok, 2 bad input, 3 failed run, 130
    interrupted). Every failure is one line on stderr and, under ``--json``, one JSON object on stdout."""
    from typer._click.exceptions import ClickException  # typer vendors click since 0.20

    from hetpart.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, HetpartError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:  # --debug belongs to the root command; accept it anywhere on the line
        argv = ["--debug"] + [a for a in argv if a != "--debug"]
    fail = _Failure("--json" in argv)
    try:
        with _notes_on_stderr():  # held until the command ends well: a failure is its error line alone
            code = app(args=argv, prog_name="hetpart", standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # typer turns KeyboardInterrupt into this return value (it exited 0 before)
            raise KeyboardInterrupt
        if isinstance(code, int) and not isinstance(code, bool) and code:
            return code
    except HetpartError as exc:
        if debug:
            raise
        return fail(exc.exit_code, exc.kind, str(exc), "interrupted" if exc.kind == "interrupted" else "error")
    except (typer.Abort, KeyboardInterrupt):
        return fail(EXIT_INTERRUPTED, "interrupted", "stopped by Ctrl-C", "interrupted")
    except ClickException as exc:
        msg = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        cmd = ctx.command_path if ctx is not None else "hetpart"
        if not msg:  # an empty message: a group called without a command, its help is already printed
            return exc.exit_code if exc.exit_code else 2
        where = "" if cmd == "hetpart" else f"{cmd}: "  # fail() already says "hetpart: error:"
        return fail(exc.exit_code if exc.exit_code else 2, "usage", f"{where}{msg} (see '{cmd} --help')")
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # a bug, not bad input: still one line, the traceback under --debug
        if debug:
            raise
        return fail(EXIT_INTERNAL, "internal", f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}; "
                    "rerun with --debug for the traceback and report it", "internal error")
    return 0


@contextmanager
def _notes_on_stderr():
    """Print each :class:`~hetpart.graph.load.ModelNote` (a remark, not an error) as one ``hetpart: note:``
    line on stderr, never on stdout (which holds the JSON under ``--json``), once the command has ended without
    an error: a failure prints its one error line alone (a note on how a file was read is moot there)."""
    from hetpart.graph.load import ModelNote

    held: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("default", ModelNote)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, ModelNote):
                held.append(f"hetpart: note: {message}")
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield
        for note in held:
            print(note, file=sys.stderr)


class _Failure:
    """Reports a failure: one line on stderr, and one ``{"error", "kind"}`` object on stdout under ``--json``."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode

    def __call__(self, code: int, kind: str, message: str, label: str = "error") -> int:
        message = " ".join(message.split())
        print(f"hetpart: {label}: {message}", file=sys.stderr)
        if self.json_mode:
            import json

            sys.stdout.write(json.dumps({"error": message, "kind": kind, "exit_code": code}) + "\n")
            sys.stdout.flush()
        return code


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
