"""A run record keeps the resident-set growth beside the live-tensor peak, and reads records without it."""

import json

from hetpart.records import EXAMPLE_LINE, RunRecord


def test_the_record_keeps_rss_peak_delta_beside_the_live_peak():
    data = json.loads(EXAMPLE_LINE)
    old = RunRecord.from_dict(data)
    assert old.measured.rss_peak_delta_gb == {}
    data["measured"]["memory_method"] = "live_tensors"
    data["measured"]["rss_peak_delta_gb"] = {"A100-40GB": 0.012}
    data["measured"]["ranks"] = [{"rank": 0, "device": "0/0/0", "step_time_s": 0.5, "compute_s": 0.4, "comm_s": 0.0,
                                  "optimizer_s": 0.05, "idle_s": 0.05, "peak_memory_gb": 0.027,
                                  "rss_peak_delta_gb": 0.011}]
    back = RunRecord.from_dict(json.loads(RunRecord.from_dict(data).to_json()))
    assert back.measured.rss_peak_delta_gb == {"A100-40GB": 0.012}
    assert back.measured.ranks[0].rss_peak_delta_gb == 0.011
    assert back.measured.memory_method == "live_tensors"
