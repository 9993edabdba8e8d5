"""Search's memory masks price an fp8 run as the simulator does (Transformer Engine under the fused kernels): the
cached fp8 weights and transposes of every linear layer below level 3, and the fp8 copies of the linear inputs
saved for the backward. Without them search took a stage the simulator says holds 2 bytes per linear weight more."""

from __future__ import annotations

import random

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel.memory import fp8_stage_bytes, stage_memory_gb
from hetpart.costmodel.pools import device_pools
from hetpart.policies.search_costs import CostTable


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_cost_table_memory_adds_the_fp8_cache_and_saved_inputs(recompute: str) -> None:
    model = load_model("llama3-8b", seq_len=2048, precision="fp8")
    cluster = load_cluster("h100-a100-two-zones")
    pool = next(p for p in device_pools(cluster) if p.gpu.name.startswith("H100"))
    fp8, bf16 = CostTable(model, cluster, "fp8"), CostTable(load_model("llama3-8b", seq_len=2048), cluster, "bf16")
    rng = random.Random(5)
    for tp in (1, 4):
        costs, plain = fp8.get(pool, tp, 2, recompute), bf16.get(pool, tp, 2, recompute)
        for _ in range(12):
            a = rng.randrange(model.num_units)
            b = rng.randrange(a + 1, model.num_units + 1)
            flight = rng.choice([1, 2, 3.5])
            extra = fp8_stage_bytes(model, a, b, tp, 2, flight, recompute) / 1e9
            assert costs.memory_gb(a, b, flight) == pytest.approx(
                stage_memory_gb(model, a, b, tp, 2, flight, recompute) + extra, rel=1e-9)
            if 0 < a < b < model.num_units and recompute != "full":  # blocks only: the cache outweighs the saving
                assert costs.memory_gb(a, b, flight) > plain.memory_gb(a, b, flight)
            # level 3 over several replicas gathers each weight when it runs and caches no fp8 copy: the saved
            # inputs alone differ; one replica (all its states held) runs unsharded and keeps the cache
            assert costs.memory_gb(a, b, flight, zero=3, fraction=0.5) - plain.memory_gb(
                a, b, flight, zero=3, fraction=0.5) == pytest.approx(
                fp8_stage_bytes(model, a, b, tp, 2, flight, recompute, zero=3) / 1e9, abs=1e-9)
            assert costs.memory_gb(a, b, flight, zero=3, fraction=1.0) - plain.memory_gb(
                a, b, flight, zero=3, fraction=1.0) == pytest.approx(extra, abs=1e-9)


def test_first_unfit_scans_the_fp8_cache_as_fits_from_does() -> None:
    """The policy's masks walk deep pipelines with :meth:`StageCosts.first_unfit`, whose quick scan summed the
    16-bit accounting alone, so it admitted ranges that the fp8 cache pushes past the device (llama3-8b at TP 1)."""
    model = load_model("llama3-8b", seq_len=2048, precision="fp8")
    cluster = load_cluster("h100-a100-two-zones")
    pool = next(p for p in device_pools(cluster) if p.gpu.name.startswith("H100"))
    costs = CostTable(model, cluster, "fp8").get(pool, 1, 1, "none")
    for first in (0, 1, 5):
        for zero in (0, 1, 3):
            row = costs.fits_from(first, model.num_units + 1, 1.0, zero=zero)
            expect = first + 1 + int(row.argmin()) if not row.all() else model.num_units + 1
            assert costs.first_unfit(first, model.num_units + 1, 1.0, zero=zero) == expect
    end = costs.first_unfit(0, model.num_units + 1, 1.0)
    assert costs.memory_gb(0, end, 1.0) > costs.capacity_gb >= costs.memory_gb(0, end - 1, 1.0)
    assert end == 17
