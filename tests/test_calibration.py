"""Calibration: the fitted A100 model reproduces Korthikanti et al. 2022 Table 5 and Narayanan et al.
2021 Table 1, and its constants are a least-squares optimum of the fit."""

from dataclasses import replace

import numpy as np
import pytest

from hetpart.costmodel.calibration import KORTHIKANTI_TABLE5, _setups, _table1_setups, anchor_volta_e_max, \
    calibration_residuals, mean_abs_error_pct, table1_validation, table5_comparison, table5_setup
from hetpart.costmodel.efficiency import CURVES


@pytest.fixture(scope="module")
def rows():
    return table5_comparison()


def test_table5_setups_match_the_paper():
    model, cluster, plan = table5_setup(KORTHIKANTI_TABLE5[2], "selective")  # 530B
    assert cluster.num_devices == 280 and plan.num_devices == 280
    assert plan.schedule == "interleaved" and plan.interleave == 3 and len(plan.replicas[0].stages) == 105
    assert model.num_params == pytest.approx(530e9, rel=0.01)
    model, _, plan = table5_setup(KORTHIKANTI_TABLE5[3], "full")  # 1T
    assert model.num_params == pytest.approx(1.0e12, rel=0.01) and plan.recompute == "full"


def test_predicted_step_times_are_within_the_bound(rows):
    # 5% mean on a fitting table (issue 9: no regression where fitted); 15% worst row: Korthikanti's
    # own MFU figures move by several points between neighbouring model sizes on the same machine.
    assert len(rows) == 8
    assert mean_abs_error_pct(rows) < 5.0
    assert max(abs(r.error_pct) for r in rows) < 15.0


def test_narayanan_table1_throughputs_are_within_the_bound():
    rows = table1_validation()
    assert len(rows) == 10
    assert np.mean([abs(r.error_pct) for r in rows]) < 5.0
    assert max(abs(r.error_pct) for r in rows) < 15.0


def test_selective_recompute_is_predicted_faster_by_about_the_published_ratio(rows):
    by = {(r.name, r.recompute): r for r in rows}
    for run in KORTHIKANTI_TABLE5:
        published = run.full_recompute_s / run.selective_recompute_s
        predicted = by[(run.name, "full")].predicted_s / by[(run.name, "selective")].predicted_s
        assert predicted == pytest.approx(published, rel=0.05)


def test_the_ampere_constants_are_a_least_squares_optimum():
    setups = (_setups(), _table1_setups())
    stored = CURVES["ampere"]

    def loss(curve):
        return float(np.sum(np.square(calibration_residuals(curve, setups))))

    best = loss(stored)
    for field in ("e_max", "w0_ref", "act_traffic"):
        for factor in (0.97, 1.03):
            moved = replace(stored, **{field: getattr(stored, field) * factor})
            assert loss(moved) > best * 0.999, f"{field} x {factor} fits better; re-run the calibration"


def test_the_volta_constant_is_anchored_to_megatron_lm():
    assert anchor_volta_e_max() == pytest.approx(CURVES["volta"].e_max, rel=0.01)
