"""Running the CLI in-process for tests: exit code, stdout and stderr."""

from __future__ import annotations

import json

from hetpart.cli.app import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    return json.loads(out)  # exactly one JSON object, nothing else on stdout


def forbid(monkeypatch, why: str, *targets: tuple[object, str]) -> None:
    """Make each ``(module, name)`` raise AssertionError(``why``) when called: a refusal must come before it."""
    def called(*_a, **_k):
        raise AssertionError(why)

    for module, name in targets:
        monkeypatch.setattr(module, name, called)


def one_line_exit_2(code: int, err: str, *parts: str) -> str:
    """The one error line of a refusal with exit code 2 (no traceback), holding each of ``parts``."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and lines[0].startswith("hetpart: error: "), err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]
