"""A GH200 computes as an H100 but dispatches from its Grace CPU: each operator's host time is the published
Grace / x86 ratio (TransformerEngine issue 2053) times the x86 cost."""

import pytest

from hetpart import load_model
from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.costmodel.compute import unit_compute_s
from hetpart.costmodel.efficiency import GRACE_HOST_FACTOR, HOST_US_PER_OP, curve_for

H100, GH200 = GPU_CATALOG["H100-80GB"], GPU_CATALOG["GH200-96GB"]


def test_the_grace_curve_is_hoppers_with_a_dearer_host():
    h, g = curve_for(H100), curve_for(GH200)
    assert g.name == h.name == "hopper" and g.e_max == h.e_max and g.w0_ref == h.w0_ref
    assert g.host_us_per_op == pytest.approx(HOST_US_PER_OP * 33.17 / 13.48)
    assert GRACE_HOST_FACTOR == pytest.approx(2.46, abs=0.01)


def test_small_work_is_host_bound_on_grace_and_large_work_is_not():
    model = load_model("gpt2-small", seq_len=256)
    small_h = sum(map(sum, unit_compute_s(model, H100, 1, 1, "bf16", "none")))
    small_g = sum(map(sum, unit_compute_s(model, GH200, 1, 1, "bf16", "none")))
    assert small_g == pytest.approx(GRACE_HOST_FACTOR * small_h, rel=0.05)  # the host's time, all of it
    big = load_model("gpt3-2.7b", seq_len=2048)
    large_h = sum(map(sum, unit_compute_s(big, H100, 1, 8, "bf16", "none")))
    large_g = sum(map(sum, unit_compute_s(big, GH200, 1, 8, "bf16", "none")))
    # the device's time hides the host's (the GH200's HBM is faster: 4.0 against 3.35 TB/s)
    assert 0.95 * large_h < large_g <= large_h
