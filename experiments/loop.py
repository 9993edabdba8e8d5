"""``hetpart loop``: the closed loop between the policy, the runtime and the corrected cost model.

Each iteration:

1. the policy proposes plans (greedy + sampled decodes, exactly completed; :func:`sample_plans`),
   with neighbours of them as a pool for exploration (on clusters of at most :data:`GRID_DEVICES`
   devices, every Megatron grid too);
2. ``runs_per_iteration`` of them run with the runtime (``hetpart run``'s :func:`run_plan`), one at a
   time, the correction refitted before each choice: the best by the corrected model, ``explore``
   where it is least certain, and ``held_out`` chosen at random, never trained on (the errors are
   measured on these); iteration 0 runs the simulator-only plan (``search`` on the simulator) first;
3. the run records are appended to ``DIR/runs.jsonl`` and the correction is refitted on every
   measured run but the held-out ones (:func:`fit_records`, features of the plan as planned);
4. the policy continues MaskablePPO training on the fixed scenario with the corrected model as
   its reward (``policy_timesteps`` steps, rounded up to whole rollouts: :func:`policy_steps_trained`) and is
   saved to ``DIR/policy-K.zip`` (``K``: the iteration, from 0,
   as the JSON's ``iteration``, the records' ``meta.loop.iteration``, ``DIR/correction-K.json`` and the
   progress lines number it).

At the end the loop's plan is chosen by measurement: the ``race`` plans with the best median measured
throughput and the simulator-only plan run once more each, interleaved, and the best median of all their
runs wins, but displaces the simulator-only plan only if both have :data:`RACE_RUNS` runs (a leading
challenger and the simulator's plan run again, interleaved, until they do) and every run of the challenger
beats every run of the simulator's plan (one short run of a plan spreads 15-30% on a loaded machine; a
single lucky or unlucky run must not decide, and a tie keeps the simulator's plan). The correction is then refitted on every run but the
held-out and final ones, the race's included (``DIR/correction-final.json``). The loop's plan and
the simulator-only plan are then measured ``repeats`` times each, interleaved, and the JSON of
shared/CONTRACT.md is returned. ``DIR/state.json`` records what is done,
so a loop started again with the same ``--out`` resumes where it stopped (run records included). A finished
loop started again with more ``--iterations`` runs the new iterations and then chooses and measures its plan
anew (race and final runs are numbered with the iteration count at that end; the earlier decision is kept in
``state.json`` under ``decisions``).

Grounds: ``emulated`` (the cluster emulated on local CPU processes, with
:class:`~hetpart.runtime.emulation.EmulationEffects` the simulator does not model), ``cpu`` (real
CPU processes of this machine, no emulation; the cluster is this machine's, measured) and ``real``
(the given cluster is the machine's own GPUs: no emulation, one process per GPU, NCCL between GPUs
of one vendor).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from hetpart.errors import HetpartError, PlanError, RuntimeFault

__all__ = ["LoopConfig", "run_loop", "DEFAULT_EFFECTS", "cpu_cluster", "UNSEEN_ROLES", "split_unseen",
           "errors_line", "policy_steps_trained"]

DEFAULT_EFFECTS = {"small_batch_tokens": 4096, "small_batch_slowdown": 2.5, "layer_overhead_ms": 0.8,
                   "congestion": 0.6}
"""The emulated ground's effects (docs/BENCHMARKS.md gives each one's source); ``small_batch_types`` is
the cluster's slowest device type."""


@dataclass(frozen=True)
class LoopConfig:
    """What one loop does (the ``hetpart loop`` flags)."""

    cluster: str
    """Cluster YAML or catalog name; unused on the ``cpu`` ground, which plans for this machine's own measured
    cluster (``hetpart loop`` refuses ``--cluster`` there)."""
    model: str
    iterations: int = 3
    runs_per_iteration: int = 4
    ground: Literal["emulated", "cpu", "real"] = "emulated"
    """``emulated``: the cluster emulated with effects; ``cpu``: this machine's CPU processes, no emulation;
    ``real``: the cluster's own devices (GPUs on a GPU machine, NCCL between them), no emulation."""
    out: str = "runs/loop"
    """State, run records, corrections, policy checkpoints and tracked runs."""
    global_batch: int = 32
    seq_len: int | None = None
    steps: int = 2
    """Measured steps per run (after ``warmup``)."""
    warmup: int = 1
    scale: str = "tiny"
    repeats: int = 2
    """Final measurements of each of the two plans (interleaved)."""
    race: int = 2
    """Plans (the best measured) that run once more each before the loop's plan is chosen; 1: no race."""
    explore: int = 1
    """Runs per iteration where the cost model is least certain."""
    held_out: int = 1
    """Runs per iteration kept out of training (the errors are measured on them)."""
    policy_timesteps: int = 512
    """PPO steps of policy training per iteration on the corrected reward, rounded up to whole rollouts
    (:func:`policy_steps_trained`)."""
    samples: int = 16
    trust: float = 0.7
    """Plans run only when the corrected model prices them at least this share of its best candidate."""
    seed: int = 0
    cpu_devices: int = 4
    """Processes of the ``cpu`` ground."""
    tracker: str = "wandb,tensorboard"

    def __post_init__(self) -> None:
        for name in ("iterations", "runs_per_iteration", "repeats", "race", "global_batch", "steps", "cpu_devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"--{name.replace('_', '-')}: must be a whole number >= 1, got {value!r}")
        # 0 is allowed on purpose: the policy then stays as it was (the loop still measures and refits)
        if isinstance(self.policy_timesteps, bool) or not isinstance(self.policy_timesteps, int) \
                or self.policy_timesteps < 0:
            raise PlanError(f"--policy-timesteps: must be a whole number >= 0 (0: no policy training), got "
                            f"{self.policy_timesteps!r}")
        if self.seq_len is not None and (isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int)
                                         or self.seq_len < 1):
            raise PlanError(f"--seq-len: must be a whole number >= 1, got {self.seq_len!r}; or leave it out for "
                            "the model's own (at most 1024)")
        if self.ground not in ("emulated", "cpu", "real"):
            raise PlanError(f"--ground: unknown ground {self.ground!r}; use emulated, cpu or real")
        if self.explore + self.held_out >= self.runs_per_iteration + (0 if self.runs_per_iteration > 1 else 1):
            raise PlanError(f"--runs-per-iteration: {self.runs_per_iteration} leaves no run to exploit beside "
                            f"{self.explore} exploratory and {self.held_out} held-out; give at least "
                            f"{self.explore + self.held_out + 1}")

    def key(self) -> dict[str, Any]:
        """What a resumed loop must share with the one it resumes (the cluster by content, not by path)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("iterations", "tracker", "out", "cluster")}
        if self.ground != "cpu":
            from hetpart.cluster import cluster_to_dict, load_cluster

            out["cluster"] = cluster_to_dict(load_cluster(self.cluster))
        return out


# ------------------------------------------------------------------------------------------- grounds
def cpu_cluster(devices: int) -> dict[str, Any]:
    """This machine as a cluster of ``devices`` CPU processes (cluster YAML schema), its rates measured."""
    import os

    from hetpart.runtime.measure import matmul_tflops, memory_gbyte_s
    from hetpart.runtime.launch import host_capacity

    tflops = matmul_tflops(256)
    mem = memory_gbyte_s()
    cap = host_capacity(1.0)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = min(1.0, cores / devices)  # processes share the cores
    gpu = {"name": "cpu-process", "tflops_bf16": tflops * share, "tflops_fp32": tflops * share,
           "memory_gb": round(cap.memory_available_gb / devices, 2), "hbm_gbyte_s": mem * share, "vendor": "other",
           "supports_bf16": False, "source": f"measured on this machine: fp32 matmul {tflops:.3f} TFLOPS, memory "
                                              f"{mem:.1f} GB/s, {cores} cores shared by {devices} processes"}
    link = {"name": "loopback", "bandwidth_gbyte_s": mem / 4, "latency_us": 50.0,
            "source": "assumed: a quarter of the measured memory rate (gloo over loopback copies through it)"}
    nic = {"name": "none", "bandwidth_gbit_s": 1.0, "latency_us": 100.0, "rdma": False, "source": "unused (one node)"}
    return {"name": f"this-machine-{devices}cpu", "nodes": [{"count": 1, "gpus_per_node": devices, "gpu": gpu,
                                                               "intra_node": link, "nic": nic}]}


# ---------------------------------------------------------------------------------------------- state
class _State:
    """``DIR/state.json``: the config, finished iterations, the simulator plan, and the final measurements."""

    def __init__(self, out: Path, cfg: LoopConfig) -> None:
        self.path = out / "state.json"
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        if data and data.get("config") != cfg.key():
            changed = sorted(k for k in cfg.key() if data.get("config", {}).get(k) != cfg.key()[k])
            raise PlanError(f"--out {out}: holds a loop with other settings ({', '.join(changed)}); give another "
                            "directory or the same settings to resume it")
        self.data = data or {"config": cfg.key(), "iterations": [], "final": []}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        from hetpart._json import strict_dumps  # NaN (nothing measured) as null: state.json stays JSON

        tmp.write_text(strict_dumps(self.data, indent=1))
        tmp.replace(self.path)


# ----------------------------------------------------------------------------------------------- loop
class _Loop:
    def __init__(self, cfg: LoopConfig, say: Callable[[str], None]) -> None:
        from hetpart.cluster import load_cluster, parse_cluster
        from hetpart.graph import load_model
        from hetpart.workload import Workload

        self.cfg, self.say = cfg, say
        self.out = Path(cfg.out)
        # everything that can refuse the input is checked before the folder exists (a refused loop leaves
        # none), the cheap checks first: the folder, the tracker, the cluster, then what imports torch
        _check_out(self.out)
        _check_tracker(cfg.tracker)
        self.created = not self.out.exists()
        if cfg.ground != "cpu":  # the cpu ground's cluster is measured, after the model's check
            self.cluster_spec = self._cluster_spec()
            self.cluster = load_cluster(self.cluster_spec)
        if cfg.ground == "real":
            _check_real_ground(self.cluster, cfg.cluster)
        _check_runnable(cfg)
        if cfg.ground == "cpu":
            self.cluster_spec = self._cluster_spec()
            self.cluster = load_cluster(self.cluster_spec) if isinstance(self.cluster_spec, str) else \
                parse_cluster(self.cluster_spec, source="this machine")
        precision = "fp32" if cfg.ground == "cpu" else None
        probe = load_model(cfg.model, seq_len=cfg.seq_len)
        self.precision = precision or _precision(self.cluster)
        self.model = load_model(cfg.model, seq_len=cfg.seq_len or min(probe.seq_len, 1024), precision=self.precision)
        self.workload = Workload(global_batch=cfg.global_batch, seq_len=self.model.seq_len, precision=self.precision,
                                 recompute="auto")
        self.effects = self._effects()
        self.out.mkdir(parents=True, exist_ok=True)
        say(f"state in {self.out} (run again with --out {self.out} to resume)")
        if cfg.ground == "cpu":
            self._write_cpu_cluster()
        self.state = _State(self.out, cfg)
        self.records_path = self.out / "runs.jsonl"
        self.rng = random.Random(cfg.seed)
        self.refused: set[str] = set()
        """Plans the runtime refused (not proposed again in this process)."""

    def _cluster_spec(self):
        """The cluster's path or catalog name; on the ``cpu`` ground, the measured cluster as a mapping until
        :meth:`_write_cpu_cluster` writes it (a resumed loop reads the one it wrote)."""
        if self.cfg.ground == "cpu":
            path = self.out / "cpu-cluster.yaml"
            return str(path.resolve()) if path.exists() else cpu_cluster(self.cfg.cpu_devices)
        path = Path(self.cfg.cluster)
        return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.exists() else self.cfg.cluster

    def _write_cpu_cluster(self) -> None:
        import yaml

        path = self.out / "cpu-cluster.yaml"
        if not path.exists():
            path.write_text(yaml.safe_dump(self.cluster_spec, sort_keys=False))
        self.cluster_spec = str(path.resolve())

    def _effects(self) -> dict[str, Any] | None:
        if self.cfg.ground != "emulated":
            return None
        slowest = min(self.cluster.groups, key=lambda g: g.gpu.tflops(self.precision)).gpu.name
        return dict(DEFAULT_EFFECTS, small_batch_types=[slowest])

    # ------------------------------------------------------------------------------------ records
    def records(self) -> list:
        from hetpart.records import load_records

        return load_records(self.records_path) if self.records_path.exists() else []

    def correction(self, records: list):
        from hetpart.costmodel.learned.corrected import fit_records

        return fit_records(split_unseen(records)[0], "plan")

    def predictor(self, correction):
        from hetpart.costmodel.learned.corrected import CorrectedPredictor

        return CorrectedPredictor(self.model, self.cluster, self.workload, correction=correction)

    # ---------------------------------------------------------------------------------------- runs
    def run(self, plan, role: str, iteration: int) -> Any:
        from hetpart.runtime.launch import RunOptions, run_plan

        plan = dataclasses.replace(plan, meta=dict(plan.meta, model=self.cfg.model, cluster=self.cluster_spec,
                                                   loop={"iteration": iteration, "role": role}))
        options = RunOptions(steps=self.cfg.steps, warmup=self.cfg.warmup, scale=self.cfg.scale, seed=self.cfg.seed,
                             emulate=self.cfg.ground == "emulated", balance_links=True, effects=self.effects,
                             impl="hetpart")  # hetpart's own GPT: its workers start without importing transformers
        start = time.time()
        try:
            result = run_plan(plan, self.cfg.model, self.cluster_spec, options, out=self.records_path)
        except (PlanError, RuntimeFault) as exc:  # the runtime refuses it (its rules, this machine): next one
            self.refused.add(_plan_key(plan))
            self.say(f"  {role:9s} {_describe(plan)}: not run ({exc})")
            return None
        m = result.record.measured
        self.say(f"  {role:9s} {_describe(plan)}: {m.tokens_per_s:,.0f} tokens/s measured "
                 f"({m.step_time_s:.2f} s/step, {time.time() - start:.0f} s)")
        return result.record

    # ---------------------------------------------------------------------------------- proposals
    def proposals(self, predictor, policy_path: Path | None, iteration: int, records: list = ()) -> list:
        """Policy proposals and their neighbours, and neighbours of the fastest measured plans (a local
        search around what ran well), those that fit, with the simulator's report: ``[(plan, prediction)]``."""
        from hetpart.costmodel.evaluator import Evaluator
        from hetpart.costmodel.learned.sampling import neighbour
        from hetpart.policies.policy_planner import sample_plans

        evaluator = Evaluator(self.model, self.cluster, self.workload, predictor=predictor)
        found = sample_plans(self.model, self.cluster, self.workload, samples=self.cfg.samples,
                             seed=self.cfg.seed * 1000 + iteration, checkpoint=policy_path, evaluator=evaluator)
        plans = [f.plan for f in found]
        rng = random.Random(self.cfg.seed * 7919 + iteration)
        fastest = sorted((r for r in records if _role(r) in ("baseline", "exploit", "explore")),
                         key=lambda r: -r.measured.tokens_per_s)[:2]
        bases = [(p, 3) for p in plans] + [(_record_plan(r), 6) for r in fastest]
        for base, count in bases:
            for _ in range(count):
                near = neighbour(rng, base, self.model.num_units)
                if near is not None:
                    plans.append(near)
        for rec in fastest:  # the same structure at every micro-batch its replicas' samples allow
            plans += _micro_batch_variants(_record_plan(rec))
        if self.cluster.num_devices <= GRID_DEVICES:
            plans += _grid_plans(self.model, self.cluster, self.workload)
        out, seen = [], set()
        for plan in plans:
            key = _plan_key(plan)
            if key in seen:
                continue
            seen.add(key)
            try:
                pred = predictor.sim.simulate(plan, self.workload)
            except HetpartError:  # a neighbour that breaks a rule is no candidate
                continue
            if pred.metrics.get("fits_in_memory", True):
                out.append((plan, pred))
        return out

    @staticmethod
    def score(pool: list, correction) -> list:
        """``[(plan, corrected tokens/s, relative std)]`` of the proposals under ``correction``."""
        from hetpart.costmodel.learned.corrected import correction_features

        out = []
        for plan, pred in pool:
            c, std, _ = correction.apply(correction_features(pred, plan))
            out.append((plan, pred.tokens_per_s / math.exp(c), std))
        return out

    def choose(self, scored: list, measured: set, role: str):
        """The plan to run in ``role`` (``exploit``, ``explore``, ``held_out``), or None when none is left.

        Only plans the corrected model prices within ``trust`` of its best candidate are run: a plan it
        prices far below is not worth a measurement (and in emulation such plans run for minutes).
        """
        # the trust region is set by plans that can run: a refused plan's price must not push the rest out
        best = max((p[1] for p in scored if _plan_key(p[0]) not in self.refused), default=0.0)
        unmeasured = [p for p in scored if _plan_key(p[0]) not in measured | self.refused]
        fresh = [p for p in unmeasured if p[1] >= self.cfg.trust * best]
        if not fresh and role == "held_out" and unmeasured:  # the errors need held-out runs: the best left
            return max(unmeasured, key=lambda p: p[1])[0]
        if not fresh:
            return None
        if role == "exploit":
            return max(fresh, key=lambda p: p[1])[0]
        if role == "explore":
            return max(fresh, key=lambda p: p[2])[0]
        return self.rng.choice(fresh)[0]

    def roles(self, iteration: int) -> list[str]:
        cfg = self.cfg
        exploit = cfg.runs_per_iteration - cfg.explore - cfg.held_out
        first = ["baseline"] if iteration == 0 else []
        return first + ["exploit"] * (exploit - len(first)) + ["explore"] * cfg.explore + ["held_out"] * cfg.held_out

    # ------------------------------------------------------------------------------------- policy
    def train_policy(self, correction, policy_path: Path | None, iteration: int, tracker) -> Path:
        """Continue PPO on the fixed scenario with the corrected reward; returns the new checkpoint."""
        import torch
        from sb3_contrib import MaskablePPO
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv

        from hetpart.envs import PartitionEnv
        from hetpart.experiments.tracking import fresh_episode_stats, sb3_logger
        from hetpart.policies.gnn import PointerPolicy
        from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

        torch.set_num_threads(1)
        scenario = (self.model, self.cluster, self.workload)
        # Monitor reports each finished episode's return in info["episode"], which is all SB3 fills its
        # rollout/ep_rew_mean from (MaskablePPO finds action_masks through the wrapper)
        env = DummyVecEnv([lambda: Monitor(PartitionEnv(scenario=scenario, reward="corrected",
                                                        reward_options={"correction": correction}))
                           for _ in range(POLICY_ENVS)])
        env.seed(self.cfg.seed + iteration)
        model = MaskablePPO.load(str(policy_path or DEFAULT_CHECKPOINT), env=env, device="cpu",
                                 custom_objects={"policy_class": PointerPolicy, "n_steps": POLICY_ROLLOUT_STEPS,
                                                 "batch_size": 64})
        fresh_episode_stats(model)
        model.set_logger(sb3_logger(tracker))
        if self.cfg.policy_timesteps:
            model.learn(self.cfg.policy_timesteps, reset_num_timesteps=False)
            if model.logger.name_to_value:  # SB3 dumps before each update: the last update's train/* is still here
                model.logger.dump(step=model.num_timesteps)
        path = self.out / f"policy-{iteration}.zip"
        model.save(path)
        from hetpart.policies.gnn import save_network_file

        save_network_file(model, path)
        return path


POLICY_ENVS = 2
"""ASSUMED: environments the loop's PPO steps side by side (in one process)."""
POLICY_ROLLOUT_STEPS = 64
"""ASSUMED: steps per environment in one PPO rollout of the loop (SB3's ``n_steps``)."""


def policy_steps_trained(asked: int) -> int:
    """The PPO steps the loop trains for ``--policy-timesteps asked``: SB3's ``learn`` collects whole rollouts
    of :data:`POLICY_ENVS` x :data:`POLICY_ROLLOUT_STEPS` steps until it has ``asked``, so it rounds up to a
    multiple of that (64 asked: 128 trained; 0: none).

    >>> policy_steps_trained(64), policy_steps_trained(512), policy_steps_trained(0)
    (128, 512, 0)
    """
    rollout = POLICY_ENVS * POLICY_ROLLOUT_STEPS
    return -(-asked // rollout) * rollout


def policy_training_line(asked: int) -> str:
    """The progress line on an iteration's policy training, saying what is trained where it is not ``asked``."""
    trained = policy_steps_trained(asked)
    if trained == asked:
        return f"  policy training: {trained} PPO steps on the corrected reward"
    return (f"  policy training: {trained} PPO steps on the corrected reward ({asked} asked, rounded up to whole "
            f"rollouts of {POLICY_ENVS} environments x {POLICY_ROLLOUT_STEPS} steps)")


def _check_out(out: Path) -> None:
    """``--out`` is a folder, or one can be made there, and files can be written in it (checked before any
    work: a loop runs for minutes before it first writes)."""
    from hetpart import _validate

    if out.exists() and not out.is_dir():
        raise PlanError(f"--out: {out} is a file; give a directory (a new one, or a loop's to resume it)")
    _validate.check_creatable(PlanError, out / "state.json", "--out", "give a directory you can write")


def _check_tracker(kinds: str) -> None:
    """``--tracker`` names known kinds (checked before the loop's folder is made)."""
    from hetpart.experiments.tracking import tracker_kinds

    tracker_kinds(kinds, "--tracker")


def _check_runnable(cfg: LoopConfig) -> None:
    """The model is one the runtime builds with hetpart's own GPT (as every loop run does), so that a model
    it refuses (a classifier head, a SwiGLU/RMSNorm shape) is refused before the loop starts, not at its first run."""
    if cfg.model.startswith("python:"):
        return
    from hetpart.errors import ModelError
    from hetpart.runtime.models import runnable_spec

    try:
        runnable_spec(cfg.model, cfg.scale, impl="hetpart", seed=cfg.seed)
    except ModelError as exc:
        if "impl 'transformers'" not in str(exc):
            raise
        # the runner's advice names an option the loop does not have: say what the loop runs instead
        raise ModelError(f"--model: {cfg.model} has a SwiGLU/RMSNorm (Llama) shape, and the loop's runs use "
                         "hetpart's own GPT; give a GPT-shaped model (gpt2-*, gpt3-*, opt-*, bert-* or such a "
                         "config.json), or run and calibrate this one with 'hetpart run' and 'hetpart calibrate'") from None


def _check_real_ground(cluster, spec: str) -> None:
    """``--ground real`` runs the cluster's own GPUs: where this machine lacks them the runtime would run the
    ranks on its CPU and record CPU timings as the GPUs' runs, so that is refused. A cluster of CPU
    processes (vendor ``other``, as ``--ground cpu`` writes) needs no GPU."""
    gpus = list(dict.fromkeys(gpu.name for g in cluster.groups for gpu, _ in g.gpu_counts if gpu.vendor != "other"))
    if not gpus:
        return
    names = _cuda_devices()
    norm = lambda text: "".join(ch for ch in text.upper() if ch.isalnum())  # noqa: E731
    missing = [t for t in gpus if not any(norm(t.split("-")[0]) in norm(n) for n in names)]
    if not missing and len(names) >= cluster.num_devices:
        return
    here = (f"{len(names)} CUDA device(s) ({', '.join(dict.fromkeys(names))})" if names else "no CUDA device")
    raise RuntimeFault(f"--ground real: needs the cluster's GPUs on this machine, as CUDA devices of those types "
                       f"({cluster.num_devices} of {', '.join(gpus)} in {spec}), and this machine has {here}; "
                       "use the default --ground emulated to emulate the cluster on CPU processes "
                       "(or --ground cpu to measure this machine's CPU)")


_GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
"""Device files of the NVIDIA, AMD (ROCm) and WSL GPU drivers: without any, no GPU can be visible."""


def _cuda_devices() -> list[str]:
    """The names of this machine's CUDA (or ROCm) devices; torch (seconds to import) is asked only when it is
    imported already or a GPU driver is there."""
    import sys

    if "torch" not in sys.modules and not any(Path(f).exists() for f in _GPU_DRIVER_FILES):
        return []
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []


def _precision(cluster) -> str:
    return "bf16" if all(g.gpu.supports_bf16 for g in cluster.groups) else "fp16"


def _measured_by_plan(records, leave_out: tuple[str, ...]) -> dict[str, tuple]:
    """``{plan key: (plan, [measured tokens/s, ...])}`` of the records whose role is not in ``leave_out``."""
    out: dict[str, tuple] = {}
    for r in records:
        if _role(r) in leave_out or r.measured is None:
            continue
        plan = _record_plan(r)
        out.setdefault(_plan_key(plan), (plan, []))[1].append(r.measured.tokens_per_s)
    return out


def _role(record) -> str:
    return ((record.original_plan.get("meta") or {}).get("loop") or {}).get("role", "")


def _iteration(record) -> int:
    return int(((record.original_plan.get("meta") or {}).get("loop") or {}).get("iteration", -1))


def _plan_key(plan) -> str:
    d = plan.to_dict()
    d.pop("meta", None)
    return json.dumps(d, sort_keys=True)


def _describe(plan) -> str:
    pp = max(len(r.stages) for r in plan.replicas)
    tp = max(s.tp for r in plan.replicas for s in r.stages)
    return f"dp={plan.dp} pp={pp} tp={tp} mb={plan.micro_batch}"


def _error_pct(predicted_s: float, measured_s: float) -> float:
    return 100.0 * abs(predicted_s / measured_s - 1.0)


# ------------------------------------------------------------------------------------------ the loop
def run_loop(cfg: LoopConfig, say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run (or resume) the loop of ``cfg``; returns the CONTRACT's ``hetpart loop`` JSON."""
    from hetpart.experiments.tracking import make_tracker
    from hetpart.plan import Plan
    from hetpart.policies import plan as make_plan

    loop = _Loop(cfg, say)
    state = loop.state.data
    if "simulator_plan" not in state:
        say(f"simulator-only plan: search on the simulator for {loop.model.name} on {loop.cluster.name}")
        try:
            found = make_plan(loop.model, loop.cluster, loop.workload, "search", predictor="simulator")
        except HetpartError:  # nothing fits, no plan: a loop refused before its first step leaves no folder
            if loop.created:
                import shutil

                shutil.rmtree(loop.out, ignore_errors=True)
            raise
        state["simulator_plan"] = found.plan.to_dict()
        loop.state.save()
    tracker = make_tracker(cfg.tracker, "loop", cfg.seed, config=dataclasses.asdict(cfg), root=str(loop.out / "tracked"))
    try:
        simulator_plan = Plan.from_dict(state["simulator_plan"])
        policy_path = Path(state["policy"]) if state.get("policy") else None
        _reopen(loop)
        for iteration in range(len(state["iterations"]), cfg.iterations):
            policy_path = _iteration_step(loop, iteration, simulator_plan, policy_path, tracker)
        result = _finish(loop, simulator_plan, policy_path, tracker)
    finally:
        tracker.finish()
    return result


def _reopen(loop: _Loop) -> None:
    """A loop that chose its plan after fewer iterations than ``cfg.iterations`` asks for now continues: its
    decision (the loop's plan and its final measurements) moves to ``state["decisions"]``, so that the loop
    decides again, by a race and final runs of its own, after the new iterations."""
    state, done = loop.state.data, len(loop.state.data["iterations"])
    if "loop_plan" not in state or done >= loop.cfg.iterations:
        return
    loop.say(f"the loop chose its plan after {done} iteration(s); it continues to {loop.cfg.iterations} and "
             "then chooses again")
    state.setdefault("decisions", []).append({"iterations": done, "loop_plan": state.pop("loop_plan"),
                                              "final": state["final"]})
    state["final"] = []
    loop.state.save()


def _end_runs(records: list, role: str, end: int) -> list:
    """The ``role`` (``race`` or ``final``) runs of the decision taken after ``end`` iterations: they carry
    ``end`` as their iteration (an earlier decision's carry its own count)."""
    return [r for r in records if _role(r) == role and _iteration(r) == end]


ROLE_TRIES = 4
"""Plans tried for one role of an iteration when the runtime refuses them (a plan needing more processes than
this machine hosts, say): the next candidate by the same rule, until one runs or these are spent."""


def _run_role(loop, role: str, pool: list, simulator_plan, iteration: int) -> Any:
    """Run one plan in ``role`` (the simulator's plan as the baseline, else the corrected model's choice); a
    plan the runtime refuses gives way to the next candidate, :data:`ROLE_TRIES` in all. The record, or None."""
    for _ in range(1 if role == "baseline" else ROLE_TRIES):
        records = loop.records()
        measured = {_record_key(r) for r in records}
        plan = simulator_plan if role == "baseline" else loop.choose(loop.score(pool, loop.correction(records)),
                                                                     measured, role)
        if plan is None:
            loop.say(f"  {role}: no candidate left within the trust region; skipped")
            return None
        record = loop.run(plan, role, iteration)
        if record is not None:
            return record
    return None


def _iteration_step(loop: _Loop, iteration: int, simulator_plan, policy_path: Path | None, tracker) -> Path:
    """Propose, then run one plan at a time (the correction refitted before each choice), refit, train."""
    cfg, state, say = loop.cfg, loop.state.data, loop.say
    start = time.time()
    records = loop.records()
    # numbered from 0 as the JSON, the records and DIR/correction-K.json and DIR/policy-K.zip number it
    say(f"iteration {iteration} ({iteration + 1} of {cfg.iterations}): the policy proposes plans")
    pool = loop.proposals(loop.predictor(loop.correction(records)), policy_path, iteration, records)
    roles = loop.roles(iteration)
    done_here = [_role(r) for r in records if _iteration(r) == iteration and _role(r) not in END_ROLES]
    for role in done_here:  # a resumed iteration: what already ran is not run again
        if role in roles:
            roles.remove(role)
    say(f"  {len(pool)} candidates; runs: {', '.join(roles) or 'none left'}"
        + (f" (already ran {len(done_here)})" if done_here else ""))
    for role in roles:
        _run_role(loop, role, pool, simulator_plan, iteration)
    records = loop.records()
    correction = loop.correction(records)
    correction.save(loop.out / f"correction-{iteration}.json")
    errors = _held_out_errors(loop, records, correction)
    trend = "no linear term" if correction.linear is None else f"linear term, ridge {correction.ridge:g}"
    say(f"  refitted on {len(correction.r)} runs ({trend}); {errors_line(errors)}")
    say(policy_training_line(cfg.policy_timesteps))
    policy_path = loop.train_policy(correction, policy_path, iteration, tracker)
    here = [r for r in records if _iteration(r) == iteration and _role(r) not in END_ROLES]
    summary = {"iteration": iteration, "runs": len(here), "trained_on": len(correction.r),
               "correction_ridge": correction.ridge,  # None: no linear term (leave-one-out kept none)
               "best_measured_tokens_per_s": max((r.measured.tokens_per_s for r in here), default=None),
               "roles": [_role(r) for r in here], **errors, "wall_s": round(time.time() - start, 1)}
    tracker.log({f"loop/{k}": float(v) for k, v in summary.items() if isinstance(v, (int, float)) and v is not None},
                step=iteration)
    state["iterations"].append(summary)
    state["policy"] = str(policy_path)
    loop.state.save()
    return policy_path


END_ROLES = ("race", "final")
"""Roles of the runs after the last iteration, numbered with the iteration count at that end; a loop continued
with more iterations numbers its next iteration so too, and tells them apart by role."""

UNSEEN_ROLES = ("held_out", "final")
"""Roles of the runs the correction never trains on; the loop's errors are measured on those of them whose plan
it never trained on either (:func:`split_unseen`)."""

GRID_DEVICES = 16
"""Clusters of at most this many devices (every loop that runs its plans on local processes) also get every
Megatron grid as a candidate: the policy's decodes and their one-move neighbours keep the structure (its TP,
PP and DP degrees), so a structure the pretrained policy does not favour would otherwise never be measured."""


def _grid_plans(model, cluster, workload) -> list:
    """Every ``tp x pp x dp`` grid that uses the whole cluster (Megatron-LM placement, 1F1B, no recomputation),
    at every power-of-two micro-batch the replicas' samples allow; grids the cluster cannot hold are skipped."""
    from hetpart.costmodel.megatron import megatron_plan

    n = cluster.num_devices
    out = []
    for tp in (t for t in range(1, n + 1) if n % t == 0):
        for pp in (q for q in range(1, n // tp + 1) if (n // tp) % q == 0):
            dp = n // (tp * pp)
            if workload.global_batch % dp:
                continue
            mb = 1
            while mb <= workload.global_batch // dp:
                if (workload.global_batch // dp) % mb == 0:
                    try:
                        out.append(megatron_plan(model, cluster, workload, tp, pp, dp, mb, recompute="none"))
                    except HetpartError:  # a TP group across nodes, more stages than layers, ...
                        break
                mb *= 2
    return out


def _micro_batch_variants(plan) -> list:
    samples = plan.replica_samples()
    out, mb = [], 1
    while mb <= max(samples):
        if mb != plan.micro_batch and not any(n % mb for n in samples):
            out.append(dataclasses.replace(plan, micro_batch=mb))
        mb *= 2
    return out


def _record_plan(record):
    from hetpart.plan import Plan

    return Plan.from_dict(_strip_meta(record.original_plan))


def _record_key(record) -> str:
    return _plan_key(_record_plan(record))


def split_unseen(records: list) -> tuple[list, list, list]:
    """``(training runs, unseen runs, repeats)`` of a loop's run records.

    The correction trains on every run whose role is not in :data:`UNSEEN_ROLES`. A held-out or final run is
    unseen only if no training run has its plan (compared as :func:`_plan_key`'s canonical JSON): a final run of
    the simulator's plan (its first run is the baseline) or of a plan that raced repeats a plan the correction
    trained on, so it goes to ``repeats`` and no error is taken on it.
    """
    train = [r for r in records if _role(r) not in UNSEEN_ROLES]
    trained = {_record_key(r) for r in train}
    candidates = [r for r in records if _role(r) in UNSEEN_ROLES]
    unseen = [r for r in candidates if _record_key(r) not in trained]
    return train, unseen, [r for r in candidates if _record_key(r) in trained]


def _held_out_errors(loop: _Loop, records: list, correction) -> dict[str, Any]:
    """Mean absolute step-time error (% of the measured one) of the simulator and of the corrected model on the
    runs of plans it never trained on (:func:`split_unseen`; the ``held_out_plan_*`` keys: those of the held-out
    role alone), with how many runs and plans each figure rests on and how many repeats of trained plans were
    left out. NaN where no run is unseen."""
    from hetpart.costmodel.learned.corrected import planned_features, run_prediction

    _, unseen, repeats = split_unseen(records)
    sim: dict[str, list[float]] = {role: [] for role in UNSEEN_ROLES}
    corr: dict[str, list[float]] = {role: [] for role in UNSEEN_ROLES}
    for rec in unseen:
        simulated = run_prediction(rec).step_time_s
        c, _, _ = correction.apply(planned_features(rec))
        sim[_role(rec)].append(_error_pct(simulated, rec.measured.step_time_s))
        corr[_role(rec)].append(_error_pct(simulated * math.exp(c), rec.measured.step_time_s))
    mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    held = [r for r in unseen if _role(r) == "held_out"]
    return {"simulator_error_pct": mean(sim["held_out"] + sim["final"]),
            "learned_error_pct": mean(corr["held_out"] + corr["final"]),
            "held_out_runs": len(unseen), "held_out_plans": len({_record_key(r) for r in unseen}),
            "held_out_plan_simulator_error_pct": mean(sim["held_out"]),
            "held_out_plan_learned_error_pct": mean(corr["held_out"]),
            "held_out_plan_runs": len(held), "held_out_plan_plans": len({_record_key(r) for r in held}),
            "repeat_runs_left_out": len(repeats)}


def errors_line(errors: dict[str, Any]) -> str:
    """One line on the held-out errors of :func:`_held_out_errors` (an iteration's progress, the loop's summary)."""
    left = errors.get("repeat_runs_left_out", 0)  # .get: a summary written before these keys existed
    repeats = f"; {left} repeat run(s) of trained plans left out" if left else ""
    if not errors["held_out_runs"]:
        return f"no held-out error: no run of a plan the corrected model never trained on{repeats}"
    plans = f" of {errors['held_out_plans']} plan(s)" if "held_out_plans" in errors else ""
    return (f"held-out error simulator {errors['simulator_error_pct']:.1f}% vs corrected "
            f"{errors['learned_error_pct']:.1f}% ({errors['held_out_runs']} runs{plans} never trained on{repeats})")


def _finish(loop: _Loop, simulator_plan, policy_path: Path | None, tracker) -> dict[str, Any]:
    """Pick the loop's plan, measure it against the simulator's plan (interleaved repeats), report."""
    from hetpart.plan import Plan

    cfg, state, say = loop.cfg, loop.state.data, loop.say
    end = len(state["iterations"])  # the race and final runs of this decision carry it as their iteration
    records = loop.records()
    if "loop_plan" not in state:
        # the loop ends with the fastest plan it measured (median of its runs): the policy and the
        # corrected model chose what to measure; a prediction alone never overrules a measurement.
        # The best few by their runs so far race first (one more run each, interleaved), the simulator's
        # plan among them, so that one lucky or unlucky short run does not decide.
        measured = _measured_by_plan(records, ("final", "race"))
        if not measured:
            raise RuntimeFault("loop: no run was measured; run the loop again with --out to retry")
        incumbent = _plan_key(simulator_plan)
        contenders = sorted(measured, key=lambda k: -statistics.median(measured[k][1]))[:cfg.race]
        if cfg.race > 1 and incumbent in measured and incumbent not in contenders:
            contenders.append(incumbent)
        raced = {_plan_key(_record_plan(r)) for r in _end_runs(records, "race", end)}
        if cfg.race <= 1:
            say(f"  no race (--race {cfg.race}): the best median so far, {_describe(measured[contenders[0]][0])} on "
                f"{len(measured[contenders[0]][1])} run(s), is the loop's plan; the three-run guard of the "
                "simulator's plan is off")
        if len(contenders) > 1:
            for key in contenders:
                if key not in raced and loop.run(measured[key][0], "race", end) is None:
                    say(f"  race run of {_describe(measured[key][0])} failed; its earlier runs stand")
            records = loop.records()
        both = _measured_by_plan(records, ("final",))
        best = _race_winner({k: both[k][1] for k in contenders}, incumbent, decide=False)
        # a challenger ahead of the simulator's plan on fewer than RACE_RUNS runs each: both run again,
        # interleaved, until each has RACE_RUNS (a failed run ends the race on the runs there are)
        while best is None:
            leader = max(contenders, key=lambda k: statistics.median(both[k][1]))
            say(f"  race: {_describe(measured[leader][0])} leads the simulator's plan; one more run of each")
            if any(loop.run(measured[k][0], "race", end) is None for k in (incumbent, leader)):
                say("  a race run failed; the race is decided on the runs there are")
                records = loop.records()
                both = _measured_by_plan(records, ("final",))
                best = _race_winner({k: both[k][1] for k in contenders}, incumbent)
                break
            records = loop.records()
            both = _measured_by_plan(records, ("final",))
            best = _race_winner({k: both[k][1] for k in contenders}, incumbent, decide=False)
        state["loop_plan"] = measured[best][0].to_dict()
        loop.state.save()
    loop_plan = Plan.from_dict(state["loop_plan"])
    say(f"final: loop plan {_describe(loop_plan)} vs simulator plan {_describe(simulator_plan)}, "
        f"{cfg.repeats} interleaved runs each")
    records = loop.records()
    # the race's runs are measurements like any other: the final correction trains on them too (a plan
    # first measured as held out, then raced, is no longer unseen), never on the held-out or final runs
    correction = loop.correction(records)
    correction.save(loop.out / "correction-final.json")
    done = _end_runs(records, "final", end)
    same = _plan_key(simulator_plan) == _plan_key(loop_plan)
    # one plan is measured once per repeat and reported for both (the same runs, not two noisy draws)
    order = [("simulator_plan", simulator_plan)] * cfg.repeats if same else \
        [("simulator_plan", simulator_plan), ("loop_plan", loop_plan)] * cfg.repeats
    for which, plan in order[len(done):]:
        rec = loop.run(plan, "final", end)
        if rec is None:
            raise RuntimeFault(f"loop: the final run of the {which.replace('_', ' ')} failed (above); run the loop "
                               f"again with --out {loop.out} to retry it")
        state["final"].append({"plan": which, "tokens_per_s": rec.measured.tokens_per_s,
                               "step_time_s": rec.measured.step_time_s})
        loop.state.save()
    tok = {w: [f["tokens_per_s"] for f in state["final"] if f["plan"] == w] for w in ("simulator_plan", "loop_plan")}
    if same:
        tok["loop_plan"] = list(tok["simulator_plan"])
    records = loop.records()
    errors = _held_out_errors(loop, records, correction)
    result = {"iterations": state["iterations"], "ground": cfg.ground, "cluster": loop.cluster.name,
              "model": cfg.model, **errors,
              "measured_tokens_per_s_simulator_plan": statistics.fmean(tok["simulator_plan"]),
              "measured_tokens_per_s_loop_plan": statistics.fmean(tok["loop_plan"]),
              "repeats": cfg.repeats,
              "tokens_per_s_std_simulator_plan": _std(tok["simulator_plan"]),
              "tokens_per_s_std_loop_plan": _std(tok["loop_plan"]),
              "measured_tokens_per_s_runs": tok,
              "simulator_plan": _describe(simulator_plan), "loop_plan": _describe(loop_plan),
              "same_plan": same,
              "measured_runs": len(records), "trained_on": len(correction.r), "out": str(loop.out),
              "effects": loop.effects}
    tracker.log({"loop/final_simulator_plan_tokens_per_s": result["measured_tokens_per_s_simulator_plan"],
                 "loop/final_loop_plan_tokens_per_s": result["measured_tokens_per_s_loop_plan"]}, step=end)
    return result


RACE_RUNS = 3
"""Runs each (the earlier ones and the race's) a challenger and the simulator's plan need before the challenger
can displace it: all its runs above all of the simulator plan's. Of two equally fast plans, three runs each
fall that way by chance once in twenty (two runs each: once in six)."""


def _race_winner(runs: dict[str, list[float]], incumbent: str, decide: bool = True) -> str | None:
    """The race's winner among ``{plan key: measured tokens/s of its runs}``: the best median, except that a
    challenger displaces the simulator's plan (``incumbent``, when it raced) only if it has at least
    :data:`RACE_RUNS` runs, as does the incumbent, and every one of them beats every run of the incumbent.
    Anything less is a tie, and a tie keeps the simulator's plan: the loop's plan must be measured faster,
    not drawn faster once. With ``decide=False``, a challenger that leads on fewer runs gets None (run both
    again); otherwise the runs there are decide."""
    best = max(runs, key=lambda k: statistics.median(runs[k]))
    if best == incumbent or incumbent not in runs:
        return best
    if not decide and min(len(runs[best]), len(runs[incumbent])) < RACE_RUNS:
        return None
    enough = min(len(runs[best]), len(runs[incumbent])) >= RACE_RUNS
    return best if enough and min(runs[best]) > max(runs[incumbent]) else incumbent


def _strip_meta(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "meta"}


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0
