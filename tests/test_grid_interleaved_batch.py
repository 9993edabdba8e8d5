"""The interleaved grid with micro-batches per replica not a multiple of --pp: one line naming the flags to change."""

from tests._cli import run_cli

GRID = ["predict", "--model", "gpt2-small", "--cluster", "a100-8", "--seq-len", "512", "--tp", "1", "--pp", "4",
        "--dp", "2", "--micro-batch", "1", "--schedule", "interleaved", "--interleave", "2"]


def test_a_batch_whose_micro_batches_do_not_fill_the_rounds_names_the_flags(capsys) -> None:
    code, out, err = run_cli(capsys, *GRID, "--global-batch", "60")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "30 micro-batches" in err and "--pp 4" in err and "multiple of 8" in err and "share" not in err


def test_a_full_round_passes(capsys) -> None:
    code, _, err = run_cli(capsys, *GRID, "--global-batch", "64")
    assert code == 0, err
