"""Pipeline schedules: the fast path against the event-by-event reference, and the textbook cases."""

import numpy as np
import pytest

from hetpart.costmodel.memory import in_flight_microbatches
from hetpart.costmodel.schedule import BWD, FWD, SharedPipeline, device_op_order, pipeline_step_time_s, \
    pipeline_timing, simulate_pipeline_events, simulate_shared_cores
from hetpart.errors import PlanError


def _random_case(rng, constant: bool):
    schedule = rng.choice(["gpipe", "1f1b", "interleaved"])
    pp = int(rng.integers(1, 6))
    v = int(rng.integers(2, 4)) if schedule == "interleaved" else 1
    m = pp * int(rng.integers(1, 4)) if schedule == "interleaved" else int(rng.integers(1, 9))
    shape = (pp * v, 1) if constant else (pp * v, m)
    fwd = np.broadcast_to(rng.uniform(0.1, 2.0, shape), (pp * v, m))
    bwd = np.broadcast_to(rng.uniform(0.2, 4.0, shape), (pp * v, m))
    p2p = rng.uniform(0.0, 0.5, max(pp * v - 1, 0))
    return fwd, bwd, p2p, str(schedule), v


@pytest.mark.parametrize("vector_min_devices", [64, 2], ids=["scalar", "wavefront"])
@pytest.mark.parametrize("constant", [True, False], ids=["equal-microbatches", "ragged-microbatches"])
def test_fast_path_matches_event_reference_on_seeded_random_pipelines(constant, vector_min_devices, monkeypatch):
    import hetpart.costmodel.schedule as schedule_module

    monkeypatch.setattr(schedule_module, "_VECTOR_MIN_DEVICES", vector_min_devices)
    rng = np.random.default_rng(1234 + constant)
    for _ in range(60):
        fwd, bwd, p2p, schedule, v = _random_case(rng, constant)
        ref = simulate_pipeline_events(fwd, bwd, p2p, schedule, v)
        fast = pipeline_timing(fwd, bwd, p2p, schedule, v)
        np.testing.assert_allclose(fast.end_s, ref.end_s, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fast.start_s, ref.start_s, rtol=1e-9, atol=1e-12)
        assert fast.makespan_s == pytest.approx(ref.makespan_s, rel=1e-9)


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_vectorized_wavefront_path_matches_reference_on_deep_pipelines(schedule, v, monkeypatch):
    import hetpart.costmodel.schedule as schedule_module

    monkeypatch.setattr(schedule_module, "_VECTOR_MIN_DEVICES", 2)  # numpy over each wavefront
    rng = np.random.default_rng(7)
    pp, m = 17, 34
    fwd = rng.uniform(0.5, 1.5, (pp * v, m))
    bwd = 2 * fwd
    p2p = rng.uniform(0, 0.2, pp * v - 1)
    fast = pipeline_timing(fwd, bwd, p2p, schedule, v)
    ref = simulate_pipeline_events(fwd, bwd, p2p, schedule, v)
    np.testing.assert_allclose(fast.end_s, ref.end_s, rtol=1e-9)


@pytest.mark.parametrize("pp,m", [(1, 5), (4, 8), (8, 3)])
def test_equal_stages_give_the_textbook_bubble(pp, m):
    f, b = 1.0, 2.0
    fwd, bwd = np.full((pp, m), f), np.full((pp, m), b)
    for schedule in ("gpipe", "1f1b"):
        assert pipeline_step_time_s(fwd, bwd, None, schedule) == pytest.approx((m + pp - 1) * (f + b))


def test_interleaving_shrinks_the_bubble_by_the_chunk_count():
    pp, m, v = 4, 8, 2
    fwd, bwd = np.full((pp * v, m), 1.0 / v), np.full((pp * v, m), 2.0 / v)
    assert pipeline_step_time_s(fwd, bwd, None, "interleaved", v) == pytest.approx(m * 3 + (pp - 1) * 3 / v)


def test_a_slow_stage_paces_the_pipeline():
    m = 16
    fwd = np.array([[1.0] * m, [3.0] * m, [1.0] * m])
    t = pipeline_step_time_s(fwd, 2 * fwd, np.zeros(2), "1f1b")
    assert t >= m * 9.0  # the slow stage alone is busy m * (3 + 6)
    assert t < (m + 2) * 9.0  # and the closed form with the slowest stage everywhere overestimates


def test_p2p_latency_delays_the_fill_and_drain():
    fwd, bwd = np.ones((3, 4)), 2 * np.ones((3, 4))
    base = pipeline_step_time_s(fwd, bwd, np.zeros(2), "gpipe")
    slow = pipeline_step_time_s(fwd, bwd, np.full(2, 0.5), "gpipe")
    assert slow == pytest.approx(base + 4 * 0.5)  # two boundaries, down and back up
    # 1F1B also waits for transfers in its steady state (each backward needs a round trip)
    assert pipeline_step_time_s(fwd, bwd, np.full(2, 0.5), "1f1b") > base + 4 * 0.5


def test_every_operation_runs_once_and_1f1b_limits_in_flight_microbatches():
    pp, m = 4, 10
    order = device_op_order("1f1b", pp, m, 1)
    for d, ops in enumerate(order):
        assert sorted(ops) == sorted([(FWD, d, j) for j in range(m)] + [(BWD, d, j) for j in range(m)])
        held = peak = 0
        for kind, _, _ in ops:
            held += 1 if kind == FWD else -1
            peak = max(peak, held)
        assert peak == in_flight_microbatches("1f1b", d, pp, m)


def test_interleaved_order_holds_megatrons_warmup():
    pp, m, v = 4, 8, 2
    for d, ops in enumerate(device_op_order("interleaved", pp, m, v)):
        held = peak = 0
        for kind, _, _ in ops:
            held += 1 if kind == FWD else -1
            peak = max(peak, held)
        assert peak / v == pytest.approx(in_flight_microbatches("interleaved", d, pp, m, v))


def test_interleaved_needs_microbatches_divisible_by_pp():
    with pytest.raises(PlanError, match="multiple of the pipeline depth"):
        pipeline_step_time_s(np.ones((4, 3)), np.ones((4, 3)), np.zeros(3), "interleaved", 2)


def test_unknown_schedule_is_a_plan_error():
    with pytest.raises(PlanError, match="unknown schedule 'zb'"):
        pipeline_step_time_s(np.ones((2, 2)), np.ones((2, 2)), np.zeros(1), "zb")


@pytest.mark.parametrize("vector_min_devices", [64, 2], ids=["scalar", "wavefront"])
def test_summary_fast_path_matches_the_reference(vector_min_devices, monkeypatch):
    import hetpart.costmodel.schedule as schedule_module
    from hetpart.costmodel.schedule import pipeline_summary

    monkeypatch.setattr(schedule_module, "_VECTOR_MIN_DEVICES", vector_min_devices)
    rng = np.random.default_rng(99)
    for _ in range(40):
        fwd, bwd, p2p, schedule, v = _random_case(rng, constant=True)
        k, m = fwd.shape
        ref = simulate_pipeline_events(fwd, bwd, p2p, schedule, v)
        makespan, last_bwd = pipeline_summary(fwd[:, 0].tolist(), bwd[:, 0].tolist(), p2p.tolist(), schedule, m, v)
        assert makespan == pytest.approx(ref.makespan_s, rel=1e-9)
        np.testing.assert_allclose(last_bwd, ref.last_backward_end_s(k), rtol=1e-9)


def test_shared_cores_with_a_core_each_is_the_event_reference_pipeline_by_pipeline():
    rng = np.random.default_rng(99)
    cases = [_random_case(rng, constant=False) for _ in range(6)]
    pipes = [SharedPipeline(f, b, p, s, v) for f, b, p, s, v in cases]
    procs = sum(p.fwd.shape[0] // p.interleave for p in pipes)
    for got, (f, b, p, s, v) in zip(simulate_shared_cores(pipes, capacity=procs), cases, strict=True):
        ref = simulate_pipeline_events(f, b, p, s, v)
        np.testing.assert_allclose(got.end_s, ref.end_s, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got.start_s, ref.start_s, rtol=1e-9, atol=1e-12)


def test_shared_cores_time_slice_only_the_processes_that_compute():
    one = SharedPipeline(np.ones((1, 4)), np.full((1, 4), 2.0), np.zeros(0), "1f1b")
    # four data-parallel replicas on two cores all compute at once: half a core each, twice as long
    assert [t.makespan_s for t in simulate_shared_cores([one] * 4, capacity=2)] == pytest.approx([24.0] * 4)
    # a four-stage pipeline of one micro-batch computes one stage at a time: two cores are enough
    deep = SharedPipeline(np.ones((4, 1)), np.full((4, 1), 2.0), np.zeros(3), "1f1b")
    assert simulate_shared_cores([deep], capacity=2)[0].makespan_s == pytest.approx(12.0)
    # two such pipelines of eight micro-batches: 8 processes, 192 core-seconds of work on 2 cores; alone 33 s
    deep = SharedPipeline(np.ones((4, 8)), np.full((4, 8), 2.0), np.zeros(3), "1f1b")
    assert simulate_shared_cores([deep], capacity=8)[0].makespan_s == pytest.approx(33.0)
    assert [t.makespan_s for t in simulate_shared_cores([deep] * 2, capacity=2)] == pytest.approx([96.0, 96.0])
    # a stage of two tensor-parallel processes weighs two: alone with one idle stage on 2 cores, full speed;
    # both of pp 1 replicas' TP pairs at once on 2 cores: half speed
    tp = SharedPipeline(np.ones((1, 2)), np.ones((1, 2)), np.zeros(0), "1f1b", processes=(2,))
    assert simulate_shared_cores([tp], capacity=2)[0].makespan_s == pytest.approx(4.0)
    assert simulate_shared_cores([tp, tp], capacity=2)[0].makespan_s == pytest.approx(8.0)
    # a transfer is a wait, not work: the receiver starts when it arrives
    sent = SharedPipeline(np.ones((2, 1)), np.ones((2, 1)), np.array([0.5]), "1f1b")
    assert simulate_shared_cores([sent], capacity=1)[0].makespan_s == pytest.approx(5.0)
    with pytest.raises(ValueError, match="capacity"):
        simulate_shared_cores([one], capacity=0)
    with pytest.raises(ValueError, match="processes"):
        simulate_shared_cores([SharedPipeline(np.ones((2, 1)), np.ones((2, 1)), np.zeros(1), "1f1b", processes=(1,))],
                              capacity=1)
