"""A type checked on one row says so (one residual, not a range); the loop's --help says its model is GPT-shaped."""

from __future__ import annotations

from tests._cli import run_cli


def test_a_one_row_band_is_not_printed_as_a_range(capsys) -> None:
    code, out, err = run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", "a100-v100-16", "--global-batch",
                             "16", "--seq-len", "512", "--tp", "1", "--pp", "1", "--dp", "16", "--micro-batch", "1",
                             "--precision", "fp16")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.strip().startswith("V100-16GB: compute"))
    assert "checked on one row only: -9.4%" in line and "over 1 rows" not in line


def test_loop_help_says_the_model_is_gpt_shaped(capsys) -> None:
    code, out, _ = run_cli(capsys, "loop", "--help")
    assert code == 0 and "GPT-shaped" in out
