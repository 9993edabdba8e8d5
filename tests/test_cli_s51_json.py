"""``--json`` output and JSON state files are strict JSON: a float that is not finite (a mean over no measured
run) is null, never the bare word NaN that JavaScript's JSON.parse refuses (the user-journey probe of
2026-12-01: ``loop --json`` printed ``"simulator_error_pct": NaN``, and its state.json held it too)."""

from __future__ import annotations

import json
import math

from hetpart.cli.common import emit_json, json_text


def _strict(text: str):
    def refuse(word: str):
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_emit_json_writes_null_for_nan_and_infinity(capsys) -> None:
    class Metric:
        def item(self) -> float:  # a numpy or torch scalar
            return float("nan")

    emit_json({"simulator_error_pct": float("nan"), "rows": [1.5, float("inf"), (float("-inf"),)], "m": Metric(),
               "name": "NaN"})
    got = _strict(capsys.readouterr().out)
    assert got == {"simulator_error_pct": None, "rows": [1.5, None, [None]], "m": None, "name": "NaN"}
    assert _strict(json_text({"x": math.nan})) == {"x": None}


def test_the_loop_state_file_is_strict_json(tmp_path) -> None:
    from hetpart.experiments.loop import _State

    state = _State.__new__(_State)  # its save alone: the loop's config is beside the point
    state.path, state.data = tmp_path / "state.json", {"iterations": [{"simulator_error_pct": float("nan")}]}
    state.save()
    assert _strict(state.path.read_text()) == {"iterations": [{"simulator_error_pct": None}]}
