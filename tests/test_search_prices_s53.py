"""experiments/search_prices.py reports what search priced: its simulations, CPU time and the plan's hash, stable
from run to run (the plan is deterministic)."""

from __future__ import annotations

import importlib


def test_one_entry_is_counted_and_its_plan_hashed(tmp_path) -> None:
    prices = importlib.import_module("hetpart.experiments.search_prices")
    (tmp_path / "c.yaml").write_text("name: two\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, "
                                     "intra_node: NVLink3, nic: IB-HDR}\n  - {count: 1, gpus_per_node: 2, "
                                     "gpu: V100-32GB, intra_node: NVLink2, nic: IB-HDR}\n")
    (tmp_path / "suite.yaml").write_text("entries:\n  - {name: small, cluster: c.yaml, model: gpt2-small, "
                                         "global_batch: 16, seq_len: 512}\n  - {name: other, cluster: c.yaml, "
                                         "model: gpt2-small, global_batch: 8, seq_len: 512}\n")
    first = prices.entry_prices(tmp_path / "suite.yaml", ["small"])
    again = prices.entry_prices(tmp_path / "suite.yaml", ["small"])
    assert [r["entry"] for r in first] == ["small"]
    row = first[0]
    assert row["simulations"] > 0 and row["step_s"] > 0 and len(row["plan"]) == 12
    assert (row["plan"], row["simulations"], row["step_s"]) == (again[0]["plan"], again[0]["simulations"],
                                                                 again[0]["step_s"])
