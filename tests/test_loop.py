"""The closed loop: the ``corrected`` predictor in the registry, emulation effects, ``hetpart loop``.

The loop test starts real torchrun jobs of 2 CPU processes (marked slow); the rest checks pure functions.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import pytest

from hetpart import load_cluster, load_model
from hetpart.plan import Plan, Replica, Stage
from hetpart.workload import Workload

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")
H100_RUNS = Path(__file__).resolve().parents[1] / "experiments" / "data" / "h100_runs.jsonl"


def _setup():
    model = load_model("gpt2-small", seq_len=256, precision="bf16")
    cluster = load_cluster("tiny-mixed")
    plan = Plan(global_batch=8, micro_batch=2, seq_len=256, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),))
    return model, cluster, plan


# ------------------------------------------------------------------------------- corrected predictor
def test_corrected_predictor_is_registered_and_without_runs_is_the_simulator_flagged_unseen():
    from hetpart.costmodel.predictor import available_predictors, get_predictor

    model, cluster, plan = _setup()
    assert "corrected" in available_predictors()
    sim = get_predictor("simulator", model, cluster).predict(plan)
    got = get_predictor("corrected", model, cluster).predict(plan).metrics
    assert got["step_time_s"] == pytest.approx(sim.step_time_s, rel=1e-9)
    assert got["uncertainty"]["out_of_distribution"] is True


def test_corrected_predictor_fits_records_and_round_trips_through_a_file(tmp_path):
    from hetpart.costmodel.learned.corrected import fit_records, load_correction
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.records import load_records

    records = load_records(H100_RUNS)
    corr = fit_records(records[:8], "run")
    assert corr.meta["runs"] == 8 and corr.meta["features"] == "run"
    corr.save(tmp_path / "c.json")
    again = load_correction(tmp_path / "c.json")
    x = corr.x[0] + 0.01
    assert again.apply(x) == pytest.approx(corr.apply(x))
    model, cluster, plan = _setup()
    a = get_predictor("corrected", model, cluster, correction=corr).predict(plan).step_time_s
    b = get_predictor("corrected", model, cluster, correction=str(tmp_path / "c.json")).predict(plan).step_time_s
    c = get_predictor("corrected", model, cluster, records=str(H100_RUNS)).predict(plan).step_time_s
    assert a == pytest.approx(b) and c > 0


def test_corrected_model_on_held_out_real_h100_runs_costs_at_most_a_point_against_the_simulator():
    """Leave-one-out over the 11 real H100 runs: each predicted by a correction fitted on the other 10.

    Today's finding (2026-12-01, HEAD 355e00e; README's "no gain (7.4% against 6.8%)"): mean |error| 7.35%
    corrected against 6.77% for the simulator alone. The simulator (host dispatch overlapped) leaves the
    correction too little to learn on so few runs, so the gain once hoped for (a strict improvement, a
    non-strict xfail here that could never fail) is not asserted. What is asserted is what holds: the
    correction, fitted blind on the other runs, makes the held-out prediction at most 1 point worse on average.
    """
    from hetpart.costmodel.learned.corrected import fit_correction, records_training_set
    from hetpart.records import load_records

    xs, rs, _ = records_training_set(load_records(H100_RUNS))
    sim_err, corr_err = [], []
    for i in range(len(rs)):
        rest = [j for j in range(len(rs)) if j != i]
        corr = fit_correction([xs[j] for j in rest], [rs[j] for j in rest])
        c, _, _ = corr.apply(xs[i])
        sim_err.append(abs(math.exp(-rs[i]) - 1))  # simulated / measured - 1
        corr_err.append(abs(math.exp(c - rs[i]) - 1))
    assert len(rs) == 11
    assert np.mean(corr_err) <= np.mean(sim_err) + 0.01


def test_wide_kernel_carries_the_shared_bias_to_plans_far_from_every_run():
    from hetpart.costmodel.learned.corrected import CORRECTION_FEATURES, fit_correction

    rng = np.random.default_rng(0)
    x = [rng.normal(0, 0.05, len(CORRECTION_FEATURES)) for _ in range(10)]
    narrow = fit_correction(x, [math.log(1.5)] * 10)
    wide = fit_correction(x, [math.log(1.5)] * 10, wide_bandwidth=50.0)
    far = np.full(len(CORRECTION_FEATURES), 2.0)
    assert narrow.apply(far)[0] == pytest.approx(0.0, abs=1e-6)
    assert wide.apply(far)[0] == pytest.approx(math.log(1.5) * 10 / 11, rel=0.05) and wide.apply(far)[2]


def test_a_correction_of_other_features_is_refused(tmp_path):
    from hetpart.costmodel.learned.corrected import load_correction
    from hetpart.errors import SpecError

    (tmp_path / "c.json").write_text(json.dumps({"features": ["a"], "x": [[1.0]], "r": [0.1]}))
    with pytest.raises(SpecError, match="features .* differ"):
        load_correction(tmp_path / "c.json")
    (tmp_path / "d.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="not a correction"):
        load_correction(tmp_path / "d.json")


def test_environment_rewards_with_the_corrected_model():
    from hetpart.costmodel.learned.corrected import CORRECTION_FEATURES, fit_correction
    from hetpart.envs import PartitionEnv

    model, cluster, _ = _setup()
    workload = Workload(global_batch=8, seq_len=256, precision="bf16", recompute="auto")
    x = [np.zeros(len(CORRECTION_FEATURES))]
    slower = fit_correction(x, [math.log(2.0)], wide_bandwidth=100.0, prior_runs=0.0)
    rewards = {}
    for name, options in (("simulator", {}), ("corrected", {"correction": slower})):
        env = PartitionEnv(scenario=(model, cluster, workload), reward=name, reward_options=options)
        env.reset(seed=0)
        done, reward = False, 0.0
        while not done:
            _, reward, done, _, _ = env.step(int(np.flatnonzero(env.action_masks())[0]))
        rewards[name] = reward
    assert rewards["corrected"] == pytest.approx(rewards["simulator"] / 2.0, rel=1e-6)


# ---------------------------------------------------------------------------------------- effects
def test_emulation_effects_per_rank():
    from hetpart.runtime.emulation import EmulationEffects

    cluster = load_cluster("tiny-mixed")
    plan = Plan(global_batch=8, micro_batch=2, seq_len=64, schedule="1f1b",
                replicas=(Replica(0.5, (Stage((0, 10), ("0/0/0",)), Stage((10, 14), ("1/0/0",)))),
                          Replica(0.5, (Stage((0, 10), ("0/0/1",)), Stage((10, 14), ("1/0/1",))))))
    fx = EmulationEffects(small_batch_types=("V100-16GB",), small_batch_tokens=4096, small_batch_slowdown=3.0,
                          layer_overhead_ms=2.0, congestion=0.5)
    devices = plan.devices
    a100 = fx.rank_terms(plan, cluster, devices, devices.index("0/0/0"), planned_seq_len=1024, compute_time_factor=10.0)
    v100 = fx.rank_terms(plan, cluster, devices, devices.index("1/0/0"), planned_seq_len=1024, compute_time_factor=10.0)
    assert a100["compute_scale"] == 1.0 and v100["compute_scale"] == 3.0  # 2 x 1024 tokens < 4096 on a V100
    assert a100["pass_overhead_s"] == pytest.approx(10 * 2e-3 * 10) and v100["pass_overhead_s"] == pytest.approx(4 * 2e-3 * 10)
    assert a100["congestion_scale"] == pytest.approx(1.5)  # 2 ranks per node share the NIC
    big = fx.rank_terms(plan, cluster, devices, devices.index("1/0/0"), planned_seq_len=4096, compute_time_factor=10.0)
    assert big["compute_scale"] == 1.0
    assert EmulationEffects.from_dict(fx.to_dict()) == fx
    with pytest.raises(ValueError, match="must not speed anything up"):
        EmulationEffects(small_batch_slowdown=0.5)


def test_emulator_applies_the_effects():
    from hetpart.costmodel.collectives import allreduce_time_s
    from hetpart.runtime.emulation import Emulator

    cluster = load_cluster("tiny-mixed")
    devices = ("0/0/0", "0/0/1", "1/0/0", "1/0/1")
    emu = Emulator(cluster=cluster, rank_devices=devices, rank=2, speed_ratio=2.0, compute_scale=3.0,
                   pass_overhead_s=0.01, congestion_scale=1.5)
    assert emu.compute_delay_s(1.0) == pytest.approx(5.0)
    assert emu.pass_delay_s("fwd") == 0.01 and emu.pass_delay_s("loss") == 0.0
    inter = allreduce_time_s(1e6, list(devices), cluster)
    intra = allreduce_time_s(1e6, ["1/0/0", "1/0/1"], cluster)
    assert emu.collective_delay_s("allreduce", 1e6, [0, 1, 2, 3]) == pytest.approx(inter * 1.5)
    assert emu.collective_delay_s("allreduce", 1e6, [2, 3]) == pytest.approx(intra)


# ------------------------------------------------------------------------------------------- loop
def test_loop_config_refuses_too_few_runs():
    from hetpart.errors import PlanError
    from hetpart.experiments.loop import LoopConfig

    with pytest.raises(PlanError, match="--runs-per-iteration: 2 leaves no run"):
        LoopConfig(cluster="tiny-mixed", model="gpt2-small", runs_per_iteration=2)
    with pytest.raises(PlanError, match="--ground: unknown ground 'gpu'"):
        LoopConfig(cluster="tiny-mixed", model="gpt2-small", ground="gpu")


def test_race_winner_keeps_the_simulator_plan_on_a_tie():
    from hetpart.experiments.loop import RACE_RUNS, _race_winner

    assert RACE_RUNS == 3
    # a challenger ahead on two runs each: not decided yet (both run again); decided on those runs, a tie
    assert _race_winner({"sim": [100.0, 120.0], "new": [121.0, 130.0]}, "sim", decide=False) is None
    assert _race_winner({"sim": [100.0, 120.0], "new": [121.0, 130.0]}, "sim") == "sim"
    # three runs each, every one of the challenger's above every one of the incumbent's: it wins
    assert _race_winner({"sim": [100.0, 120.0, 110.0], "new": [121.0, 130.0, 125.0]}, "sim", decide=False) == "new"
    # a better median whose worst run falls under the incumbent's best is a tie: the incumbent stays
    assert _race_winner({"sim": [100.0, 120.0, 110.0], "new": [119.0, 130.0, 125.0]}, "sim", decide=False) == "sim"
    # the incumbent's own best median wins outright, on any number of runs; without the incumbent, the best median
    assert _race_winner({"sim": [140.0, 150.0], "new": [111.0, 130.0]}, "sim", decide=False) == "sim"
    assert _race_winner({"a": [100.0, 120.0], "b": [105.0, 130.0]}, "sim", decide=False) == "b"


@pytest.mark.slow
def test_loop_runs_measures_refits_and_resumes(tmp_path):
    """One iteration of 2 real emulated runs (the simulator's plan and a held-out one), then the
    final comparison; run again on the same directory, it resumes with nothing left to run."""
    from hetpart.experiments.loop import LoopConfig, run_loop
    from hetpart.records import load_records

    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: A100-40GB, intra_node: NVLink3, "
                       "nic: Ethernet-25}\n  - {count: 1, gpus_per_node: 1, gpu: V100-16GB, intra_node: NVLink2, "
                       "nic: Ethernet-25}\n")
    cfg = LoopConfig(cluster=str(cluster), model="gpt2-small", iterations=1, runs_per_iteration=2, explore=0,
                     held_out=1, repeats=1, global_batch=8, seq_len=256, steps=1, policy_timesteps=64,
                     samples=4, tracker="tensorboard", out=str(tmp_path / "loop"))
    said: list[str] = []
    out = run_loop(cfg, said.append)
    records = load_records(tmp_path / "loop" / "runs.jsonl")
    roles = [r.original_plan["meta"]["loop"]["role"] for r in records]
    # the two measured plans race (one more run each); a challenger ahead of the simulator's plan then
    # runs again beside it, interleaved, until each has three runs; then the final comparison runs each
    # plan once (repeats=1), or once for both when the loop's plan is the simulator's
    raced = roles.count("race")
    assert roles[:4] == ["baseline", "held_out", "race", "race"] and raced in (2, 4)
    assert roles[2 + raced:] == ["final"] * (1 if out["same_plan"] else 2)
    from hetpart.experiments.loop import _plan_key, _record_plan

    by_plan: dict = {}
    for r in records[:2 + raced]:
        by_plan.setdefault(_plan_key(_record_plan(r)), []).append(r.measured.tokens_per_s)
    incumbent = _plan_key(_record_plan(records[0]))  # the simulator's plan, run first
    (challenger,) = set(by_plan) - {incumbent}
    assert len(by_plan[incumbent]) == len(by_plan[challenger]) == raced // 2 + 1
    # the extra round runs exactly when the challenger led on two runs each
    assert (raced == 4) == (statistics.median(by_plan[challenger][:2]) > statistics.median(by_plan[incumbent][:2]))
    # the race's winner is the loop's plan: the challenger must beat every run of the incumbent on three runs
    displaced = raced == 4 and min(by_plan[challenger]) > max(by_plan[incumbent])
    assert out["same_plan"] == (not displaced)
    if out["same_plan"]:
        assert out["measured_tokens_per_s_loop_plan"] == out["measured_tokens_per_s_simulator_plan"]
    # trained on the baseline and the race runs (the final correction is refitted after the race); the held-out
    # plan raced and the final runs repeat raced plans, so no run is of a plan never trained on: no error is taken
    assert out["held_out_runs"] == 0 and out["held_out_plan_runs"] == 0
    assert out["repeat_runs_left_out"] == 1 + len(roles[2 + raced:])
    assert out["trained_on"] == 1 + raced
    assert (tmp_path / "loop" / "correction-final.json").exists()
    assert math.isnan(out["simulator_error_pct"]) and math.isnan(out["learned_error_pct"])
    assert out["iterations"][0]["held_out_runs"] == 1 and out["iterations"][0]["simulator_error_pct"] > 0
    assert out["measured_tokens_per_s_simulator_plan"] > 0 and out["measured_tokens_per_s_loop_plan"] > 0
    assert len(out["iterations"]) == 1 and (tmp_path / "loop" / "policy-0.zip").exists()
    assert any((tmp_path / "loop" / "tracked").rglob("events.out.tfevents*"))
    again = run_loop(cfg, said.append)
    assert len(load_records(tmp_path / "loop" / "runs.jsonl")) == len(records)
    assert again["measured_tokens_per_s_loop_plan"] == out["measured_tokens_per_s_loop_plan"]


def test_loop_choice_keeps_to_the_trust_region_and_never_reruns_a_plan():
    import random

    from hetpart.experiments.loop import _Loop, _micro_batch_variants, _plan_key

    _, _, plan = _setup()
    a, b, c = (Plan.from_dict(dict(plan.to_dict(), micro_batch=m)) for m in (1, 2, 4))
    loop = _Loop.__new__(_Loop)  # choose() needs only the config, the generator and the refused plans
    from hetpart.experiments.loop import LoopConfig

    loop.cfg, loop.rng, loop.refused = LoopConfig(cluster="tiny-mixed", model="gpt2-small"), random.Random(0), set()
    scored = [(a, 100.0, 0.1), (b, 90.0, 0.4), (c, 10.0, 0.9)]  # c is far below the best: outside the region
    assert loop.choose(scored, set(), "exploit") is a
    assert loop.choose(scored, {_plan_key(a)}, "exploit") is b
    assert loop.choose(scored, set(), "explore") is b  # the most uncertain inside the region
    assert loop.choose(scored, {_plan_key(a), _plan_key(b)}, "exploit") is None
    assert loop.choose(scored, {_plan_key(a), _plan_key(b)}, "held_out") is c  # held-out runs are never skipped
    assert [p.micro_batch for p in _micro_batch_variants(b)] == [1, 4, 8]


def test_the_linear_term_carries_a_trend_to_a_plan_beside_the_runs():
    """Runs at micro-batches 1, 2, 4 and 8 whose simulator error shrinks as the micro-batch grows (as the
    emulated ground's small-batch slowdown does): at micro-batch 16, which no run measured, the linear
    term follows the trend where the kernel alone leans on its nearest runs; on pure noise it finds no trend."""
    from hetpart.costmodel.learned.corrected import CORRECTION_FEATURES, fit_correction

    rng = np.random.default_rng(1)
    col = CORRECTION_FEATURES.index("log_micro_batch")
    xs, rs = [], []
    for mb in (1, 2, 4, 8):
        for _ in range(3):
            x = rng.normal(0, 0.02, len(CORRECTION_FEATURES))
            x[col] = math.log2(mb) / 3
            xs.append(x)
            rs.append(0.9 - 0.6 * x[col])
    at = np.zeros(len(CORRECTION_FEATURES))
    at[col] = math.log2(16) / 3
    truth = 0.9 - 0.6 * at[col]
    semi = fit_correction(xs, rs)
    kernel = fit_correction(xs, rs, linear=False)
    assert semi.linear is not None and semi.ridge is not None
    assert abs(semi.apply(at)[0] - truth) < 0.5 * abs(kernel.apply(at)[0] - truth)
    noise = fit_correction(xs, list(rng.normal(0, 0.05, len(xs))))
    # on noise leave-one-out keeps no trend, or one well inside the noise (std 0.05)
    assert noise.linear is None or max(abs(noise.apply(x)[0] - noise.apply(at)[0]) for x in xs) < 0.05


def test_cli_costmodel_correct_reports_leave_one_out_and_saves_the_linear_term(capsys, tmp_path):
    from hetpart.costmodel.learned.corrected import fit_records, load_correction
    from hetpart.records import load_records
    from tests._cli import cli_json

    out = cli_json(capsys, "costmodel", "correct", "--records", str(H100_RUNS), "--out", str(tmp_path / "c.json"),
                   "--json")
    assert out["runs"] == 11 and out["leave_one_out_simulator_error_pct"] > 0
    assert out["linear_term"] == (out["ridge"] is not None)
    # a correction with a linear term round-trips through its file
    corr = fit_records(load_records(H100_RUNS), "run")
    corr.linear = np.linspace(-0.1, 0.1, corr.x.shape[1] + 1)
    corr.ridge = 0.1
    corr.save(tmp_path / "d.json")
    again = load_correction(tmp_path / "d.json")
    assert again.ridge == 0.1 and again.apply(corr.x[0] + 0.01) == pytest.approx(corr.apply(corr.x[0] + 0.01))


def test_small_clusters_get_every_megatron_grid_as_a_candidate():
    """The policy's decodes keep their structure; on a 4-device node the grid adds DP 4, TP 4, PP 4 and the mixes."""
    from hetpart.cluster import parse_cluster
    from hetpart.experiments.loop import _grid_plans

    cluster = parse_cluster({"name": "four", "nodes": [{"count": 1, "gpus_per_node": 4, "gpu": "A100-80GB",
                                                        "intra_node": "NVLink3", "nic": "IB-HDR"}]})
    model = load_model("gpt2-small", seq_len=256)
    plans = _grid_plans(model, cluster, Workload(global_batch=8, seq_len=256, recompute="auto"))
    shapes = {(p.dp, p.replicas[0].stages[0].tp, p.replicas[0].pp) for p in plans}
    assert shapes == {(4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 4, 1), (1, 2, 2), (1, 1, 4)}
    for p in plans:
        assert p.validate(model, cluster) == []
        assert p.num_devices == 4 and all(n % p.micro_batch == 0 for n in p.replica_samples())
    # every power-of-two micro-batch of DP 4's two samples per replica: 1 and 2
    assert sorted(p.micro_batch for p in plans if p.dp == 4) == [1, 2]
