"""Probe: the emulation of sharded data parallelism (FSDP2's collectives) in ``hetpart run``.

Two defects a probe found, one cause: FSDP2's all-gathers and reduce-scatters never reached the
emulation hooks (:mod:`hetpart.runtime.sharded`).

* No link was paid for them: a ZeRO-1 run over 4 emulated ranks charged 0.32 s of link per step (the
  tied embedding's all-reduce alone) against 2.46 s unsharded, for the same gradient bytes.
* At levels 2-3 they run inside compute chunks (a unit's gather before its forward and backward, its
  reduce-scatter after its backward), so the time a rank waited there for a slower peer counted as its
  compute, and an emulated slow device stretched it by its slowdown; its peers then waited for it in
  turn, longer at every unit (ZeRO-3 over an A100, an RTX 3090 and a T4: 55-95 s per step).

Both are checked on two gloo ranks with recording hooks, without launching ``hetpart run``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from hetpart.plan import Plan, Replica
from hetpart.runtime.models import RunnableSpec
from tests._dist import run_distributed
from tests.test_runtime_gate import SEQ, _gpt2, _st

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

GPT2 = RunnableSpec("gpt2", _gpt2(), impl="transformers")
SLOW_S = 0.15
"""Rank 0's emulated slowdown after every compute chunk (its peer waits that long in the next collective)."""


def _plan(zero: int) -> Plan:
    """Two single-stage replicas with uneven shares (levels 2-3 pad the smaller one)."""
    return Plan(global_batch=6, micro_batch=1, seq_len=SEQ, schedule="1f1b", zero=zero,
                replicas=(Replica(2 / 3, (_st(0, 6, "0/0/0"),)), Replica(1 / 3, (_st(0, 6, "0/0/1"),))))


class _Recorder:
    """Hooks that note every collective and every compute chunk; rank 0 plays a slow device."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.collectives: list[tuple[str, int, list[int]]] = []
        self.compute: list[float] = []
        self.slow = False

    def on_compute(self, stage_index: int, kind: str, seconds: float) -> None:
        self.compute.append(seconds)
        if self.slow and self.rank == 0:
            time.sleep(SLOW_S)

    def on_send(self, num_bytes: int, peer_rank: int) -> None:
        return None

    def on_collective(self, kind: str, num_bytes: int, group_ranks) -> None:
        self.collectives.append((kind, int(num_bytes), sorted(group_ranks)))


def _job(rank: int, world: int, out: str, zero: int) -> None:
    from hetpart.runtime.engine import Executor
    from hetpart.runtime.sharded import transport_jobs

    hooks = _Recorder(rank)
    ex = Executor(_plan(zero), GPT2, rank, world, hooks=hooks)
    ex.step(0)  # the first step infers shapes; not measured
    hooks.collectives.clear()
    hooks.compute.clear()
    hooks.slow = True
    result = ex.step(1)
    sharded = sum(math.prod(ex._param_info[k].shape) for k in ex.sharded_keys)
    jobs = [(kind, list(ranks), numel * dtype.itemsize) for kind, ranks, _, numel, dtype in transport_jobs(ex)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "collectives": hooks.collectives, "compute": hooks.compute, "compute_s": result.timing.compute_s, "jobs": jobs,
        "comm_s": result.timing.comm_s, "sharded_bytes": sharded * 4, "microbatches": ex.microbatches_run}))


@pytest.fixture(scope="module", params=[1, 3])
def recorded(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict]]:
    out = run_distributed(_job, 2, request.param, timeout_s=120,
                          out_dir=str(tmp_path_factory.mktemp(f"zero{request.param}")))
    return request.param, [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]


def test_fsdp2_collectives_reach_the_emulation_hooks(recorded) -> None:
    """Every sharded unit's reduce-scatter (and all-gather) is reported with the whole buffer's bytes, among
    the unit's holders; the gradient bytes reduce-scattered per step are at least the sharded parameters'
    (once per step at level 1, reported as one collective per run of units held alike, as the simulator
    prices it; once per micro-batch run and unit at level 3)."""
    zero, ranks = recorded
    for r in ranks:
        kinds = {k for k, _, _ in r["collectives"]}
        assert {"reduce_scatter", "all_gather"} <= kinds, kinds
        assert all(members == [0, 1] for k, _, members in r["collectives"] if k != "all_reduce")
        scattered = sum(b for k, b, _ in r["collectives"] if k == "reduce_scatter")
        times = 1 if zero == 1 else r["microbatches"]
        assert scattered >= r["sharded_bytes"] * times
        assert scattered <= r["sharded_bytes"] * times * 1.1  # FSDP2 pads each parameter to 2 pieces at most
        if zero == 1:  # one run of units held alike: one reduce-scatter reported, as the simulator prices it
            assert [k for k, _, _ in r["collectives"]].count("reduce_scatter") == 1
        gathered = sum(b for k, b, _ in r["collectives"] if k == "all_gather")
        assert gathered >= r["sharded_bytes"] * (1 if zero == 1 else 2 * r["microbatches"])


def test_the_transport_calibration_times_every_reported_sharded_collective(recorded) -> None:
    """The emulated link replaces gloo's own transport (the worker times each collective beforehand and
    sleeps the rest): every gather and reduce-scatter reported in a step has its calibration entry (at level 1
    the gathers: the gradients' reduce-scatters are reported fused per run of units)."""
    zero, ranks = recorded
    timed = ("all_gather",) if zero == 1 else ("all_gather", "reduce_scatter")  # level 1: gradients fused per run
    for r in ranks:
        jobs = {(k, tuple(m), b) for k, m, b in r["jobs"]}
        reported = {(k, tuple(m), b) for k, b, m in r["collectives"] if k in timed}
        assert reported and reported <= jobs, (reported - jobs, jobs)


def test_waiting_for_a_slow_peer_in_a_sharded_collective_is_not_compute(recorded) -> None:
    """Rank 0 sleeps after each of its compute chunks (an emulated slow device); rank 1 waits for it in the
    next gather or reduce-scatter. At level 3 those run inside rank 1's chunks: the wait must be booked as
    communication, never passed to ``on_compute`` (where an emulated slow device would stretch it)."""
    zero, ranks = recorded
    fast = ranks[1]
    # rank 1's chunks are each a few milliseconds of a tiny model; a wait for rank 0 would add SLOW_S
    assert max(fast["compute"]) < SLOW_S / 2, fast["compute"]
    assert fast["compute_s"] < fast["comm_s"]


def test_a_reduce_scatter_and_an_all_gather_are_charged_an_all_reduce() -> None:
    """The emulator charges a ZeRO step's reduce-scatter plus all-gather of ``B`` bytes what it charges an
    all-reduce of ``B`` (the same bytes on the same rings; at small sizes the second call's latency more)."""
    from hetpart.cluster import load_cluster
    from hetpart.runtime.emulation import Emulator

    cluster = load_cluster("tiny-mixed")
    devices = tuple(d.id for d in cluster.devices)[:2]
    emu = Emulator(cluster=cluster, rank_devices=devices, rank=0, speed_ratio=1.0)
    for nbytes in (1e7, 1e8):
        ar = emu.collective_delay_s("all_reduce", nbytes, [0, 1])
        sharded = emu.collective_delay_s("reduce_scatter", nbytes, [0, 1]) + \
            emu.collective_delay_s("all_gather", nbytes, [0, 1])
        assert ar > 0 and ar <= sharded <= 1.25 * ar, (nbytes, ar, sharded)


def _hsdp_job(rank: int, world: int, out: str) -> None:
    from hetpart.runtime.engine import Executor

    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")
    plan = Plan(global_batch=4, micro_batch=1, seq_len=SEQ, schedule="gpipe", zero=3, shard_group=2,
                replicas=tuple(Replica(1 / 4, (_st(0, 6, d),)) for d in devices))
    hooks = _Recorder(rank)
    ex = Executor(plan, GPT2, rank, world, hooks=hooks)
    ex.step(0)
    hooks.collectives.clear()
    ex.step(1)
    sharded = sum(math.prod(ex._param_info[k].shape) for k in ex.sharded_keys)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"collectives": hooks.collectives,
                                                         "sharded_bytes": sharded * 4}))


def test_hybrid_sharding_reports_the_all_reduce_across_shard_groups(tmp_path: Path) -> None:
    """``shard_group: 2`` over 4 replicas: reduce-scatters and gathers inside the pairs (0, 1) and (2, 3), and
    each reduce-scattered shard all-reduced across them ((0, 2), (1, 3)): about half the sharded bytes."""
    out = run_distributed(_hsdp_job, 4, timeout_s=120, out_dir=str(tmp_path))
    for rank in range(4):
        r = json.loads(Path(out, f"rank{rank}.json").read_text())
        pair, across = sorted({rank, rank ^ 1}), sorted({rank, rank ^ 2})
        assert all(m == pair for k, _, m in r["collectives"] if k in ("reduce_scatter", "all_gather"))
        reduced = [b for k, b, m in r["collectives"] if k == "all_reduce" and m == across]
        assert r["sharded_bytes"] / 2 <= sum(reduced) <= r["sharded_bytes"] / 2 * 1.1, (sum(reduced), r["sharded_bytes"])
