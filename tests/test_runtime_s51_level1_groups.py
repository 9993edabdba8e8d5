"""ZeRO-1 on FSDP2 where every holder holds the same stage: one FSDP2 group over the stage, so a step runs one
all-gather and one reduce-scatter of it instead of one of each per unit (level 1 keeps the gathered parameters
through the backward; per-unit groups only multiplied the points where the ranks must meet). Levels 2-3, and
replicas cut at other places (``z1_two_cuts_gpt2`` of the sharded gate), keep one group per unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.slow  # multi-process runs


class _Recorder:
    def __init__(self) -> None:
        self.collectives: list[str] = []

    def on_compute(self, stage_index: int, kind: str, seconds: float) -> None:
        return None

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        return None

    def on_collective(self, kind: str, num_bytes: int, group_ranks) -> None:
        self.collectives.append(kind)


def _job(rank: int, world: int, out: str, zero: int) -> None:
    from torch.distributed.fsdp import FSDPModule

    from hetpart.plan import Plan, Replica
    from hetpart.runtime.engine import Executor
    from hetpart.runtime.models import RunnableSpec
    from hetpart.runtime.sharded import transport_jobs
    from tests.test_runtime_gate import SEQ, _gpt2, _st

    plan = Plan(global_batch=4, micro_batch=1, seq_len=SEQ, schedule="gpipe", zero=zero,
                replicas=(Replica(0.5, (_st(0, 6, "0/0/0"),)), Replica(0.5, (_st(0, 6, "0/0/1"),))))
    hooks = _Recorder()
    ex = Executor(plan, RunnableSpec("gpt2", _gpt2(), impl="transformers"), rank, world, hooks=hooks)
    ex.step(0)  # the first step infers shapes
    hooks.collectives.clear()
    ex.step(1)
    module = ex.stage_modules[0]
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "stage_fsdp": isinstance(module, FSDPModule),
        "unit_fsdp": sum(isinstance(u, FSDPModule) for u in module.units),
        "gathers": hooks.collectives.count("all_gather"), "scatters": hooks.collectives.count("reduce_scatter"),
        "timed": [kind for kind, *_ in transport_jobs(ex)], "sharded": len(ex.sharded_keys)}))


@pytest.mark.parametrize("zero", [1, 2])
def test_level_1_shards_a_stage_held_alike_as_one_group(zero: int) -> None:
    out = run_distributed(_job, 2, zero, timeout_s=180)
    for rank in range(2):
        got = json.loads(Path(out, f"rank{rank}.json").read_text())
        assert got["sharded"] > 0
        if zero == 1:
            assert got["stage_fsdp"] is True and got["unit_fsdp"] == 0
            assert (got["gathers"], got["scatters"]) == (1, 1)  # 4 micro-batches, 6 units: one of each per step
            assert got["timed"] == ["all_gather"]
        else:  # level 2: each unit's gradients are reduce-scattered after each micro-batch's backward
            assert got["stage_fsdp"] is False and got["unit_fsdp"] >= 5
            assert got["scatters"] >= 2 * 5
