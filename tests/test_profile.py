"""Per-unit profiles measured on the device at hand (here the CPU): structure and sanity of the timings."""

import pytest

from hetpart.runtime.models import runnable_spec
from hetpart.runtime.profile import profile_units


def test_profile_units_times_every_unit_kind_and_micro_batch():
    spec = runnable_spec("gpt2-small", "tiny")
    rows = profile_units(spec, [1, 2], seq_len=16, precision="fp32", device="cpu", warmup=1, repeats=3)
    assert [(r.unit, r.micro_batch) for r in rows] == [
        ("embedding", 1), ("embedding", 2), ("block_0", 1), ("block_0", 2), ("head", 1), ("head", 2)]
    for r in rows:
        assert 0 < r.fwd_range_s[0] <= r.fwd_s <= r.fwd_range_s[1]
        assert 0 < r.bwd_range_s[0] <= r.bwd_s <= r.bwd_range_s[1]
        assert r.precision == "fp32" and r.seq_len == 16 and r.repeats == 3
        assert r.peak_memory_gb is None  # measured on GPUs only
    assert rows[0].to_dict()["unit"] == "embedding"


def test_profile_units_refuses_unknown_precision():
    with pytest.raises(ValueError, match="precision 'int4'"):
        profile_units(runnable_spec("gpt2-small", "tiny"), [1], 16, precision="int4")
