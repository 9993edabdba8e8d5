"""calibrate --scale refuses a --seq-len beyond the shrunken model's positions before it measures anything, naming
the scale's limit (runtime.models' SCALES) rather than the full model's."""

import pytest

from hetpart.graph.scales import SCALES, check_seq_len
from hetpart.errors import PlanError
from tests._cli import run_cli

CLUSTER = """name: two-a100
nodes:
  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
"""


def test_the_scale_limit_is_said_before_anything_is_measured(tmp_path, capsys, monkeypatch):
    import hetpart.runtime.calibrate as calibrate

    def measured(*args, **kwargs):
        raise AssertionError("calibrate measured before checking --seq-len")

    monkeypatch.setattr(calibrate, "calibrate_profile", measured)
    (tmp_path / "c.yaml").write_text(CLUSTER)
    code, out, err = run_cli(capsys, "calibrate", "--cluster", str(tmp_path / "c.yaml"), "--model", "gpt2-small",
                             "--scale", "tiny", "--micro-batches", "1,2", "--seq-len", "128",
                             "--out", str(tmp_path / "p.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.strip() == ("hetpart: error: --seq-len: 128: at --scale tiny the shrunken gpt2-small runs at most 32 "
                           "positions (the full model has 1,024); give --seq-len <= 32 or --scale small (128) or no "
                           "--scale (the full model)")
    assert not (tmp_path / "p.json").exists()


def test_the_limits_come_from_the_scales():
    assert (SCALES["tiny"].seq_len, SCALES["small"].seq_len) == (32, 128)
    check_seq_len(32, "gpt2-small", 1024, "tiny")  # at the limit: fine
    check_seq_len(1024, "gpt2-small", 1024, None)
    with pytest.raises(PlanError, match=r"^--seq-len: 200: at --scale small the shrunken m runs at most 128 positions "
                                         r"\(the full model has 256\); give --seq-len <= 128 or no --scale"):
        check_seq_len(200, "m", 256, "small")
    with pytest.raises(PlanError, match=r"at --scale 64 the shrunken m runs at most 64 positions .*give --seq-len "
                                         r"<= 64 or --scale small \(128\)$"):
        check_seq_len(100, "m", 64, 64)
    with pytest.raises(PlanError, match=r"^--seq-len: 2048 is more than m's 1,024 positions; give a shorter one$"):
        check_seq_len(2048, "m", 1024, None)
