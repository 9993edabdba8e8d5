"""The runtime's multi-rank prediction (issue 9, point 3): CPU ranks time the whole model together and meet after
each repeat (:class:`hetpart.runtime.profile.Meeting`), the slowest rank's pace over the typical one scales the
in-run profile (:func:`hetpart.runtime.calibrate.meeting_factor`), and the step's own host work, measured by the
ranks, is added to the predicted step (:func:`hetpart.runtime.measure.predict`) so that a record replays to the
prediction it holds (:func:`hetpart.costmodel.replay.repredict`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from hetpart.cluster import load_cluster
from hetpart.costmodel.replay import repredict, with_runtime_terms
from hetpart.graph.load import load_model
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.calibrate import meeting_factor, profile_from_samples
from hetpart.runtime.models import runnable_spec
from hetpart.runtime.profile import _met, time_chain


def _unit(kind: str, fwd: float, bwd: float) -> dict:
    return {"unit": f"{kind}_0", "micro_batch": 2, "fwd_s": fwd, "bwd_s": bwd, "fwd_range_s": [fwd, fwd],
            "bwd_range_s": [bwd, bwd], "repeats": 10, "activation_gb": None}


def _sample(met: dict | None) -> dict:
    # units alone sum to 8 (forward) and 16 (backward); the chain took as much: a chain factor of 1
    units = [_unit("embedding", 1.0, 2.0), _unit("block", 2.0, 4.0), _unit("head", 3.0, 6.0)]
    chain = {"fwd_s": 8.0, "bwd_s": 16.0, "units": 4, **({"met": met} if met else {})}
    return {"units": units, "adam_fixed_s": 0.001, "adam_s_per_param": 1e-9, "device": None, "chain": chain}


def test_a_meeting_keeps_the_slowest_and_the_typical_member_per_repeat():
    fwd, bwd = [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]
    everyone = [[2.0, 3.0], [3.0, 5.0], [4.0, 4.0]]  # this rank is the first member
    met = _met(fwd, bwd, everyone)
    assert met == {"own_s": 3.0, "slowest_s": 4.0, "typical_s": 4.0, "ranks": 2}
    three = _met([1.0] * 3, [0.0] * 3, [[1.0, 2.0, 6.0], [1.0, 1.0, 1.0], [2.0, 3.0, 4.0]])
    assert (three["slowest_s"], three["typical_s"]) == (4.0, 2.0)  # medians of 6, 1, 4 and of 2, 1, 3


def test_the_meeting_factor_is_the_median_over_samples_of_slowest_over_typical():
    met = [{"own_s": 1.0, "slowest_s": s, "typical_s": t, "ranks": 2} for s, t in ((1.2, 1.0), (3.0, 2.0), (1.1, 1.0))]
    assert meeting_factor([_sample(m) for m in met]) == pytest.approx(1.2)
    assert meeting_factor([_sample(None), _sample(None)]) is None  # one rank, or GPU ranks: no meeting
    assert meeting_factor([dict(_sample(None), chain=None)]) is None


def test_the_profile_is_scaled_by_the_chain_and_the_meeting():
    spec = runnable_spec("gpt2-small", "tiny")
    graph = load_model("gpt2-small", seq_len=16)
    plain = profile_from_samples(spec, graph, [_sample(None)], ["A100-80GB"])
    met = profile_from_samples(spec, graph, [_sample({"own_s": 24.0, "slowest_s": 30.0, "typical_s": 25.0,
                                                      "ranks": 2})], ["A100-80GB"])
    for a, b in zip(plain.compute, met.compute):
        assert b.fwd_s == pytest.approx(1.2 * a.fwd_s) and b.bwd_s == pytest.approx(1.2 * a.bwd_s)
    assert met.meta["meeting_factors"]["cpu"] == pytest.approx(1.2)
    assert plain.meta["meeting_factors"]["cpu"] is None


class _Members:
    """A meeting of this rank with others who took ``factor`` times as long: counts the collectives entered."""

    def __init__(self, factor: float) -> None:
        self.factor, self.starts, self.gathers = factor, 0, 0

    def start(self) -> None:
        self.starts += 1

    def seconds(self, mine: float) -> list[float]:
        self.gathers += 1
        return [mine, self.factor * mine]


def test_time_chain_enters_the_meeting_a_fixed_number_of_times():
    spec = runnable_spec("gpt2-small", "tiny")
    members, met = _Members(2.0), {}
    time_chain(spec, 1, 16, repeats=2, block_s=0.001, meeting=members, met=met)
    # the calls per repeat agreed once, then a barrier and a gather per repeat: whatever the timings
    assert (members.starts, members.gathers) == (2, 3)
    assert met["ranks"] == 2 and met["slowest_s"] == pytest.approx(2.0 * met["own_s"])
    assert met["typical_s"] == pytest.approx(1.5 * met["own_s"])


def test_the_runtime_terms_are_added_to_the_step_and_the_rates_scaled():
    metrics = {"step_time_s": 0.5, "tokens_per_s": 1000.0, "samples_per_s": 4.0, "mfu": 0.3}
    out = with_runtime_terms(metrics, {"host_work_s": 0.125, "transport_excess_s": 0.125})
    assert out["step_time_s"] == 0.75 and out["mfu"] == 0.3
    assert (out["host_work_s"], out["transport_excess_s"]) == (0.125, 0.125)
    assert out["tokens_per_s"] == pytest.approx(1000.0 * 0.5 / 0.75) and out["samples_per_s"] == pytest.approx(4 / 1.5)
    assert with_runtime_terms(metrics, {"host_work_s": 0.0}) is metrics
    assert with_runtime_terms(metrics, {}) is metrics
    inf = {"step_time_s": math.inf}  # a plan that does not fit: unchanged
    assert with_runtime_terms(inf, {"host_work_s": 0.1}) is inf


def test_a_collective_faster_emulated_than_the_transport_under_it_counts_the_excess():
    from hetpart.runtime.worker import WorkerHooks

    class _Emulator:
        def collective_delay_s(self, kind, num_bytes, ranks):
            return 0.004 if num_bytes == 100 else 0.010

    beat = SimpleNamespace(progress=lambda *a: None, busy=lambda s: None)
    hooks = WorkerHooks(_Emulator(), None, beat, None, rank=0,
                        transport={((0, 1), 100): 0.006, ((0, 1), 200): 0.0075})
    hooks.begin_step(0)
    hooks.on_collective("all_reduce", 100, (1, 0))  # transport 6 ms under an emulated 4 ms: 2 ms more
    hooks.on_collective("all_reduce", 200, (0, 1))  # 7.5 ms under 10 ms: slept up to 10, nothing more
    assert hooks.account.transport_excess_s == pytest.approx(0.002)
    assert hooks.account.emulated_comm_s == pytest.approx(0.0025)


def _two_stages() -> Plan:
    return Plan(global_batch=4, micro_batch=1, seq_len=128, schedule="1f1b", precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})


def test_a_prediction_with_host_work_replays_to_the_last_bit():
    from hetpart.runtime.measure import predict
    from hetpart.runtime.record import predicted_record

    plan, cluster = _two_stages(), load_cluster("tiny-mixed")
    graph = load_model("gpt2-small", seq_len=plan.seq_len, precision=plan.precision)
    bare = predict(graph, cluster, plan)
    out = predict(graph, cluster, plan, host_work_s=0.0123, transport_excess_s=0.0045)
    assert out["step_time_s"] == bare["step_time_s"] + (0.0123 + 0.0045)
    assert (out["host_work_s"], out["transport_excess_s"]) == (0.0123, 0.0045)
    assert out["tokens_per_s"] == pytest.approx(bare["tokens_per_s"] * bare["step_time_s"] / out["step_time_s"])
    assert out["predictor"]["options"]["host_work_s"] == 0.0123
    assert out["predictor"]["options"]["transport_excess_s"] == 0.0045
    assert "host_work_s" not in bare["predictor"]["options"] and bare["host_work_s"] == 0.0
    # the record's JSON round trip, then the record's own predictor with the options it kept
    predicted = predicted_record(json.loads(json.dumps(out, default=str)))
    record = SimpleNamespace(predicted=predicted, model_graph=lambda: graph,
                             workload={"global_batch": 4, "seq_len": plan.seq_len, "precision": plan.precision},
                             prediction_cluster=lambda source: cluster, run_plan=lambda source: plan,
                             graph_matches=lambda g: True)
    again = repredict(record)["metrics"]
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "host_work_s", "transport_excess_s"):
        assert again[key] == out[key], key  # exactly


def _meet_and_work(rank: int, world: int, out_dir: str) -> None:
    """Both ranks time the chain together (a real meeting over gloo), then measure a DP replica's host work."""
    from hetpart.runtime.engine import Executor
    from hetpart.runtime.profile import Meeting

    spec = runnable_spec("gpt2-small", "tiny")
    met: dict = {}
    time_chain(spec, 1, 16, repeats=3, block_s=0.005, meeting=Meeting(), met=met)
    plan = Plan(global_batch=2, micro_batch=1, seq_len=16, schedule="1f1b",
                replicas=(Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("0/0/1",)),))),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})
    executor = Executor(plan, spec, rank=rank, world_size=world)
    work = executor.host_work_s(repeats=3)
    left = [k for k, p in executor.params.items() if p.grad is not None]
    Path(out_dir, f"{rank}.json").write_text(json.dumps({"met": met, "host_work_s": work, "grads_left": left}))


@pytest.mark.slow
def test_two_ranks_meet_alike_and_measure_their_host_work():
    from tests._dist import run_distributed

    out = run_distributed(_meet_and_work, 2, timeout_s=120.0)
    ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in (0, 1)]
    first, second = ranks[0]["met"], ranks[1]["met"]
    assert first["ranks"] == second["ranks"] == 2
    # the slowest and the typical member are gathered: the same numbers on both ranks, whatever the load
    assert (first["slowest_s"], first["typical_s"]) == (second["slowest_s"], second["typical_s"])
    assert first["slowest_s"] >= first["typical_s"] > 0.0
    for r in ranks:
        assert r["host_work_s"] > 0.0 and math.isfinite(r["host_work_s"]) and r["grads_left"] == []
