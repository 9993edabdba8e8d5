"""Helper d's fixes to the loop (s53): policy training logs the episodes it ran, more iterations decide again,
and the trained PPO steps are the ones announced."""

from __future__ import annotations

import csv
import json
import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest

from hetpart import load_cluster, load_model
from hetpart.workload import Workload


def _scenario():
    model = load_model("gpt2-small", seq_len=256, precision="bf16")
    cluster = load_cluster("tiny-mixed")
    return model, cluster, Workload(global_batch=8, seq_len=256, precision="bf16", recompute="auto")


def _last_logged(progress_csv, key: str) -> float:
    with open(progress_csv, newline="") as f:
        values = [row[key] for row in csv.DictReader(f) if row.get(key)]
    return float(values[-1])


@pytest.fixture(scope="module")
def loop_trained(tmp_path_factory):
    """The loop's policy training of ``--policy-timesteps 64`` from the shipped checkpoint on gpt2-small and
    tiny-mixed, the corrected reward half the simulator's: ``(checkpoint, episode returns, tracked run folder,
    progress lines)``; each episode's return is recorded by the environment itself."""
    from hetpart.costmodel.learned.corrected import CORRECTION_FEATURES, fit_correction
    from hetpart.experiments.loop import _Loop
    from hetpart.experiments.tracking import make_tracker

    tmp = tmp_path_factory.mktemp("loop-policy")
    model, cluster, workload = _scenario()
    slower = fit_correction([np.zeros(len(CORRECTION_FEATURES))], [math.log(2.0)], wide_bandwidth=100.0,
                            prior_runs=0.0)
    loop = SimpleNamespace(model=model, cluster=cluster, workload=workload, out=tmp,
                           cfg=SimpleNamespace(seed=0, policy_timesteps=64))
    tracker = make_tracker("tensorboard", "loop", 0, root=tmp / "tracked")
    with pytest.MonkeyPatch.context() as mp:
        returns = _recording_env(mp)
        path = _Loop.train_policy(loop, slower, None, 0, tracker)
    tracker.finish()
    return path, returns, tracker.run_dir


def test_loop_policy_training_logs_the_mean_return_of_the_episodes_it_ran(loop_trained):
    """Probe 2026-12-01: the loop's PPO logged rollout/ep_rew_mean 0.406, the mean of the shipped checkpoint's
    last 100 training episodes, whatever it ran (no Monitor, and the loaded buffer kept)."""
    path, returns, run_dir = loop_trained
    assert path.exists() and returns
    logged = _last_logged(run_dir / "progress.csv", "rollout/ep_rew_mean")
    # Monitor rounds each return to 6 decimals
    assert logged == pytest.approx(statistics.fmean(returns[-100:]), abs=1e-6)


def test_the_loop_trains_the_steps_its_progress_line_announces(loop_trained):
    """``--policy-timesteps 64`` trained 128 steps while the line said 64 (probe 2026-12-01): SB3 collects whole
    rollouts of 2 environments x 64 steps. The line now says what is trained, and the checkpoint agrees."""
    from hetpart.experiments.loop import policy_steps_trained, policy_training_line
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    path, _, _ = loop_trained
    trained = _saved(path)["num_timesteps"] - _saved(DEFAULT_CHECKPOINT)["num_timesteps"]
    assert trained == policy_steps_trained(64) == 128
    assert policy_training_line(64) == ("  policy training: 128 PPO steps on the corrected reward (64 asked, "
                                        "rounded up to whole rollouts of 2 environments x 64 steps)")
    assert policy_training_line(512) == "  policy training: 512 PPO steps on the corrected reward"
    assert [policy_steps_trained(n) for n in (0, 1, 128, 129)] == [0, 128, 128, 256]


def _saved(checkpoint) -> dict:
    import json
    import zipfile

    with zipfile.ZipFile(checkpoint) as z:
        return json.loads(z.read("data"))


def _recording_env(monkeypatch) -> list[float]:
    """Replace the partition environment by one that records each finished episode's return."""
    import hetpart.envs

    returns: list[float] = []

    class Recording(hetpart.envs.PartitionEnv):
        def reset(self, **kwargs):
            self._return = 0.0
            return super().reset(**kwargs)

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            self._return += float(reward)
            if terminated or truncated:
                returns.append(self._return)
            return obs, reward, terminated, truncated, info

    monkeypatch.setattr(hetpart.envs, "PartitionEnv", Recording)
    return returns


def test_train_policy_resume_logs_only_the_resumed_run_episodes(tmp_path, monkeypatch):
    """``train-policy --resume``: a checkpoint whose saved episodes all returned 99 must not lift the resumed
    run's rollout/ep_rew_mean (SB3 keeps a loaded buffer when the timestep count goes on)."""
    from collections import deque

    from sb3_contrib import MaskablePPO

    from hetpart.experiments.train_policy import PolicyTrainConfig, train_policy
    from hetpart.policies.gnn import PointerPolicy

    monkeypatch.chdir(tmp_path)
    tiny = dict(tracker="tensorboard", imitation_scenarios=0, n_envs=1, n_steps=8, batch_size=8, max_devices=8,
                checkpoint_every=1000, progress_bar=False, hidden=8)
    first = train_policy(PolicyTrainConfig(experiment="policy/first", timesteps=8, out="first.zip", **tiny))
    saved = MaskablePPO.load(first["checkpoint"], device="cpu", custom_objects={"policy_class": PointerPolicy})
    saved.ep_info_buffer = deque([{"r": 99.0, "l": 1, "t": 0.0}] * 100, maxlen=100)
    saved.save(tmp_path / "stale.zip")
    returns = _recording_env(monkeypatch)
    summary = train_policy(PolicyTrainConfig(experiment="policy/resumed", timesteps=48, out="resumed.zip",
                                             resume=str(tmp_path / "stale.zip"), **tiny))
    assert summary["timesteps"] == 8 + 48 and returns
    (run,) = (tmp_path / "runs").glob("policy-resumed__*")
    logged = _last_logged(run / "progress.csv", "rollout/ep_rew_mean")
    assert logged == pytest.approx(statistics.fmean(returns[-100:]), abs=1e-6)


def test_reopen_moves_an_earlier_decision_aside_only_when_iterations_are_added(tmp_path):
    """``_reopen``: a loop that decided after 1 iteration and is now asked for 2 forgets its plan and final runs
    (kept under ``decisions``); asked for 1 again, or never decided, nothing moves."""
    from hetpart.experiments.loop import _reopen

    def loop(iterations: int, data: dict):
        saved = []
        state = SimpleNamespace(data=data, save=lambda: saved.append(dict(data)))
        return SimpleNamespace(cfg=SimpleNamespace(iterations=iterations), state=state, say=lambda line: None), saved

    decided = {"iterations": [{"iteration": 0}], "loop_plan": {"p": 1}, "final": [{"plan": "loop_plan"}]}
    same, saved = loop(1, json_copy(decided))
    _reopen(same)
    assert same.state.data == decided and not saved
    more, saved = loop(2, json_copy(decided))
    _reopen(more)
    assert "loop_plan" not in more.state.data and more.state.data["final"] == [] and saved
    assert more.state.data["decisions"] == [{"iterations": 1, "loop_plan": {"p": 1},
                                            "final": [{"plan": "loop_plan"}]}]
    undecided, saved = loop(2, {"iterations": [{"iteration": 0}], "final": []})
    _reopen(undecided)
    assert "decisions" not in undecided.state.data and not saved


def json_copy(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.mark.slow
def test_a_finished_loop_given_more_iterations_continues_and_decides_again(tmp_path):
    """Probe 2026-12-01: ``--iterations 2`` on a loop finished after 1 ran iteration 1 and then reported the old
    decision and its final runs. Now the new end races and measures anew (its race and final runs numbered 2),
    the first decision is kept in state.json, and a third start runs nothing. The smallest loop of
    tests/test_loop.py (2 emulated CPU processes)."""
    from hetpart.experiments.loop import LoopConfig, _plan_key, _record_plan, _role, run_loop
    from hetpart.records import load_records

    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: A100-40GB, intra_node: NVLink3, "
                       "nic: Ethernet-25}\n  - {count: 1, gpus_per_node: 1, gpu: V100-16GB, intra_node: NVLink2, "
                       "nic: Ethernet-25}\n")
    keys = dict(cluster=str(cluster), model="gpt2-small", runs_per_iteration=2, explore=0, held_out=1, repeats=1,
                global_batch=8, seq_len=256, steps=1, policy_timesteps=64, samples=4, tracker="tensorboard",
                out=str(tmp_path / "loop"))
    said: list[str] = []
    first = run_loop(LoopConfig(iterations=1, **keys), said.append)
    ended = len(load_records(tmp_path / "loop" / "runs.jsonl"))
    second = run_loop(LoopConfig(iterations=2, **keys), said.append)
    records = load_records(tmp_path / "loop" / "runs.jsonl")
    tag = lambda r: (r.original_plan["meta"]["loop"]["iteration"], _role(r))  # noqa: E731
    new = [tag(r) for r in records[ended:]]
    ran = [role for it, role in new if it == 1]  # exploit is skipped when no fresh plan is within the trust region
    assert ran and set(ran) <= {"exploit", "held_out"} and new[:len(ran)] == [(1, role) for role in ran]
    assert set(new[len(ran):]) <= {(2, "race"), (2, "final")} and (2, "final") in new
    assert any("continues to 2 and then chooses again" in line for line in said)
    assert len(second["iterations"]) == 2 and second["iterations"][1]["roles"] == ran
    # the second decision's measurements are its own final runs, not the first's
    sim_key = _plan_key(_record_plan(records[0]))
    finals = [r for r in records[ended:] if _role(r) == "final" and _plan_key(_record_plan(r)) == sim_key]
    assert second["measured_tokens_per_s_runs"]["simulator_plan"] == [r.measured.tokens_per_s for r in finals]
    state = json.loads((tmp_path / "loop" / "state.json").read_text())
    (earlier,) = state["decisions"]
    assert earlier["iterations"] == 1 and len(earlier["final"]) == (1 if first["same_plan"] else 2)
    assert earlier["loop_plan"] and state["final"] and "loop_plan" in state
    again = run_loop(LoopConfig(iterations=2, **keys), said.append)
    assert len(load_records(tmp_path / "loop" / "runs.jsonl")) == len(records)
    assert again["measured_tokens_per_s_loop_plan"] == second["measured_tokens_per_s_loop_plan"]
