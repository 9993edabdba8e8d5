"""A generation's step band speaks for the device families its rows were measured on; another type priced with
the same curve (RTX 3090 or A10 with Ampere's, GH200 with Hopper's) keeps the ``fitted`` curve but no band."""

from __future__ import annotations

from hetpart.cluster import parse_cluster
from hetpart.costmodel.provenance import ERROR_BANDS, prediction_provenance, step_band
from hetpart.plan import Plan


def _provenance(gpus: list[str]) -> dict:
    cluster = parse_cluster({"name": "zoo", "nodes": [
        {"count": 1, "gpus_per_node": 1, "gpu": g, "intra_node": "PCIe4", "nic": "Ethernet-10"} for g in gpus]})
    plan = Plan.from_dict({"global_batch": len(gpus), "micro_batch": 1, "seq_len": 128, "schedule": "1f1b",
                           "recompute": "none", "replicas": [
                               {"batch_share": 1 / len(gpus), "stages": [{"layers": [0, 14], "devices": [f"{i}/0/0"],
                                                                           "tp": 1}]} for i in range(len(gpus))]})
    return prediction_provenance(cluster, plan, None)


def test_the_measured_families_keep_their_generation_band() -> None:
    types = _provenance(["A100-80GB", "H100-80GB", "V100-32GB"])["device_types"]
    assert types["A100-80GB"]["error_band"]["signed_pct"] == ERROR_BANDS["fitted:ampere"]["signed_pct"]
    assert types["H100-80GB"]["error_band"]["signed_pct"] == ERROR_BANDS["fitted:hopper"]["signed_pct"]
    assert types["V100-32GB"]["error_band"]["signed_pct"] == ERROR_BANDS["fitted:volta"]["signed_pct"]


def test_other_types_on_a_fitted_curve_carry_no_step_band() -> None:
    prov = _provenance(["A100-80GB", "RTX3090-24GB", "A10-24GB", "GH200-96GB"])
    types = prov["device_types"]
    for name in ("RTX3090-24GB", "A10-24GB", "GH200-96GB"):
        assert types[name]["compute"] == "fitted"
        band = types[name]["error_band"]
        assert band["rows"] == 0 and band["signed_pct"] == [None, None]
        assert name.split("-")[0] in band["from"]
    low, high, unknown = step_band(prov)
    assert (low, high) == (None, None) and set(unknown) == {"RTX3090-24GB", "A10-24GB", "GH200-96GB"}
