"""The loop's held-out errors are taken only on runs of plans the correction never trained on, and say how many
runs and plans they rest on (probe e, finding 3): a final run of the simulator's plan (run first as the baseline)
or of a plan that raced repeats a trained plan."""

from __future__ import annotations

import math

from hetpart.experiments.bench_correction import DATA, _records
from hetpart.experiments.loop import UNSEEN_ROLES, _held_out_errors, _record_key, _role, errors_line, split_unseen


def _loop(name: str) -> list:
    return [r for r in _records(DATA / f"{name}.jsonl.gz") if r.measured is not None]


def test_final_runs_that_repeat_a_trained_plan_are_not_unseen():
    records = _loop("acceptance-loop-01")  # roles: b e e h e e e h e h f f
    train, unseen, repeats = split_unseen(records)
    trained = {_record_key(r) for r in train}
    assert [_role(r) for r in unseen] == ["held_out", "held_out", "held_out"]
    assert [_role(r) for r in repeats] == ["final", "final"]
    assert all(_record_key(r) in trained for r in repeats) and not any(_record_key(r) in trained for r in unseen)
    # the old rule took every held-out and final run: 5 runs, 2 of them repeats of the trained simulator's plan
    assert sum(_role(r) in UNSEEN_ROLES for r in records) == 5
    assert len(train) + len(unseen) + len(repeats) == len(records) == 12


def test_a_held_out_plan_that_raced_is_trained_on_and_left_out_and_the_counts_say_so():
    from hetpart.costmodel.learned.corrected import fit_records

    records = _loop("acceptance-loop-11")  # a held-out plan is among the race's contenders (race runs train)
    train, unseen, repeats = split_unseen(records)
    assert sorted(_role(r) for r in repeats) == ["final", "final", "held_out"]
    errors = _held_out_errors(None, records, fit_records(train, "plan"))
    assert errors["held_out_runs"] == 2 and errors["held_out_plans"] == 2
    assert errors["held_out_plan_runs"] == 2 and errors["held_out_plan_plans"] == 2
    assert errors["repeat_runs_left_out"] == 3
    # no final run is unseen here, so the top-level figures are the held-out plans' own
    assert errors["simulator_error_pct"] == errors["held_out_plan_simulator_error_pct"] > 0
    assert errors["learned_error_pct"] == errors["held_out_plan_learned_error_pct"] >= 0
    line = errors_line(errors)
    assert "(2 runs of 2 plan(s) never trained on; 3 repeat run(s) of trained plans left out)" in line


def test_no_unseen_run_gives_nan_and_says_so():
    records = [r for r in _loop("acceptance-loop-01") if _role(r) != "held_out"]
    from hetpart.costmodel.learned.corrected import fit_records

    errors = _held_out_errors(None, records, fit_records(split_unseen(records)[0], "plan"))
    assert errors["held_out_runs"] == 0 and errors["repeat_runs_left_out"] == 2
    assert math.isnan(errors["simulator_error_pct"]) and math.isnan(errors["learned_error_pct"])
    assert errors_line(errors) == ("no held-out error: no run of a plan the corrected model never trained on; "
                                   "2 repeat run(s) of trained plans left out")
