"""The ``hetpart`` entry point: builds the typer app and turns user errors into one line + exit 2."""

from __future__ import annotations

import sys

import typer

__all__ = ["app", "main"]

app = typer.Typer(name="hetpart", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=True,
                  help="Plan, predict and run the training of large models on heterogeneous clusters.")


def _version(value: bool) -> None:
    if value:
        from hetpart import __version__

        print(f"hetpart {__version__}")
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
    for name in ("plan_cmd", "run_cmd", "bench_cmd", "export_cmd", "report_cmd"):
        try:
            module = __import__(f"hetpart.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"hetpart.cli.{name}":
                raise
            continue
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for bad input)."""
    from typer._click.exceptions import ClickException  # typer vendors click since 0.20

    from hetpart.errors import HetpartError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:  # --debug belongs to the root command; accept it anywhere on the line
        argv = ["--debug"] + [a for a in argv if a != "--debug"]
    try:
        result = app(args=argv, prog_name="hetpart", standalone_mode=False)
        if isinstance(result, int) and not isinstance(result, bool):  # typer returns Exit codes (130 on Ctrl-C)
            return result
    except HetpartError as exc:
        if debug:
            raise
        print(f"hetpart: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except typer.Abort:
        print("hetpart: aborted", file=sys.stderr)
        return 130
    except ClickException as exc:
        msg = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        cmd = ctx.command_path if ctx is not None else "hetpart"
        if msg:  # an empty message: a group called without a command, its help is already printed
            print(f"hetpart: error: {cmd}: {msg} (see '{cmd} --help')", file=sys.stderr)
        return exc.exit_code if exc.exit_code else 2
    except typer.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        print("hetpart: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: still one line, the traceback under --debug
        if debug:
            raise
        print(f"hetpart: internal error: {exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}; "
              "rerun with --debug for the traceback and report it", file=sys.stderr)
        return 1
    return 0


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()
