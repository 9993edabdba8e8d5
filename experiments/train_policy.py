"""``hetpart train-policy --config FILE``: imitation warm start from search, then MaskablePPO.

1. **Imitation** (optional, ``imitation_scenarios > 0``): scenarios drawn from the training
   distribution (small clusters, so search is quick), the search's best structure replayed as
   actions (:mod:`hetpart.policies.imitation`), behaviour cloning of the policy on them.
2. **RL**: sb3-contrib's MaskablePPO with :class:`~hetpart.policies.gnn.PointerPolicy` on vectorised
   ``hetpart/Partition-v0`` environments (reward: throughput over the scenario's ceiling), SB3's
   logger keys plus ``plan/...`` (mean reward ratio, share of mixed pipelines), checkpoints every
   ``checkpoint_every`` steps and at the end, ``resume`` from a checkpoint.

Logging goes through :mod:`hetpart.experiments.tracking` (wandb offline and/or TensorBoard).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpart import _validate
from hetpart.errors import SpecError

__all__ = ["PolicyTrainConfig", "load_config", "train_policy"]


@dataclass(frozen=True)
class PolicyTrainConfig:
    """Everything a policy training run depends on (YAML keys are these field names)."""

    experiment: str = "policy/ppo"
    """Run name prefix (runs are ``{experiment}__{seed}__{time}``)."""
    seed: int = 0
    """Seeds scenarios, imitation, PPO and torch."""
    out: str = ""
    """Where the final checkpoint goes (relative to the working directory); left out: ``policy.zip`` in the
    run's own folder (``runs/{experiment}__{seed}__{time}/policy.zip``), so that no run replaces another's
    file. A name without a suffix gets ``.zip``, as stable-baselines3 writes it (``out: runs/mine`` writes
    ``runs/mine.zip``); the summary names the file written. The shipped checkpoint
    (``policies/checkpoints/policy.zip`` of the installed package) is written only with ``replace_shipped``
    (``hetpart train-policy --replace-shipped``)."""
    tracker: str = "wandb,tensorboard"
    """``wandb`` (offline), ``tensorboard``, ``null``, or several joined by commas."""
    runs_dir: str = "runs"
    """Folder of tracked runs and intermediate checkpoints."""
    imitation_scenarios: int = 60
    """Scenarios the search demonstrates (0: no imitation)."""
    imitation_epochs: int = 40
    """Behaviour-cloning epochs over the demonstrations."""
    imitation_max_devices: int = 64
    """Largest cluster of a demonstration scenario (search time grows with it)."""
    imitation_workers: int = 1
    """Processes computing demonstrations (each scenario is seeded, so the set does not depend on it)."""
    timesteps: int = 20000
    """PPO environment steps (decisions)."""
    n_envs: int = 4
    """Vectorised environments (in one process: this machine has 2 cores)."""
    n_steps: int = 128
    """Steps per environment per rollout."""
    batch_size: int = 128
    n_epochs: int = 4
    learning_rate: float = 3e-4
    ent_coef: float = 0.01
    gamma: float = 1.0
    """No discount: the only reward is the finished plan's."""
    hidden: int = 64
    """GNN embedding width."""
    layers: int = 2
    """Message-passing rounds."""
    max_devices: int = 128
    """Largest cluster drawn for RL episodes."""
    checkpoint_every: int = 5000
    """Steps between intermediate checkpoints (under the run folder)."""
    resume: str = ""
    """A MaskablePPO checkpoint to continue from (skips imitation; relative to the working directory; a
    name without ``.zip`` is also looked up with it, as stable-baselines3 does). The network keeps its
    size (``hidden``, ``layers`` differing from the checkpoint's are refused); the training keys
    (``learning_rate``, ``n_steps``, ``batch_size``, ``n_epochs``, ``ent_coef``, ``gamma``) written in the
    config apply to the continued training, those left out keep the checkpoint's."""
    progress_bar: bool = True
    """Show PPO's progress (on stderr, so that ``--json`` output stays alone on stdout)."""
    distribution: dict = field(default_factory=dict)
    """Overrides of :class:`hetpart.envs.scenarios.ScenarioDistribution` fields."""


def load_config(path: str | Path, *, replace_shipped: bool = False) -> PolicyTrainConfig:
    """Read a YAML config; unknown keys and wrong types are refused with the file and key named, and so is
    an empty file (a mapping ``{}`` takes every default), an ``out`` (or ``runs_dir``) that cannot be
    written, and the shipped checkpoint as ``out`` unless ``replace_shipped``: all before any work."""
    from hetpart._yaml import load_yaml_file

    path = Path(path)  # the reader clusters and suites use: UTF-8, no repeated keys or aliases, at most 1 MiB
    data = load_yaml_file(SpecError, path, "the policy training config (a YAML file)")
    if data is None:  # more likely a wrong or unsaved file than a wish for the full default training
        raise SpecError(f"{path}: empty config; give the keys to set (e.g. timesteps, out; known: "
                        f"{', '.join(f.name for f in dataclasses.fields(PolicyTrainConfig))}), as in "
                        "experiments/configs/policy-smoke.yaml, or '{}' to train with every default")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(PolicyTrainConfig)}
    for key, value in data.items():
        if key not in fields:
            raise SpecError(f"{path}: {key}: unknown key; known: {', '.join(fields)}")
        want = type(getattr(PolicyTrainConfig(), key))
        if key == "tracker" and value is None:  # YAML reads a bare null as None; the tracker's name is "null"
            data[key] = "null"
        elif want is float:  # YAML 1.1 reads 1e-3 (no dot) as text: take it where it reads as a number
            data[key] = _validate.yaml_float(value)
            if data[key] is None:
                raise SpecError(f"{path}: {key}: expected a number, got {value!r}; write a number (the default is "
                                f"{key}: {getattr(PolicyTrainConfig(), key)!r})")
        elif not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise SpecError(f"{path}: {key}: expected {want.__name__}, got {value!r}")
    _check_ranges(path, data)
    _check_out(str(path), PolicyTrainConfig(**{k: v for k, v in data.items() if k in _OUT_KEYS}), replace_shipped,
               given_out="out" in data)
    if data.get("resume"):
        data = _resume_settings(path, data)
        _check_ranges(path, data)
    from hetpart.envs.scenarios import ScenarioDistribution

    known = {f.name for f in dataclasses.fields(ScenarioDistribution)}
    for key in data.get("distribution", {}):
        if key not in known:
            raise SpecError(f"{path}: distribution.{key}: unknown key; known: {', '.join(sorted(known))}")
    return PolicyTrainConfig(**data)


_MINIMUM = {"seed": 0, "imitation_scenarios": 0, "imitation_epochs": 1, "imitation_max_devices": 2,
            "imitation_workers": 1, "timesteps": 1, "n_envs": 1, "n_steps": 1, "batch_size": 2, "n_epochs": 1,
            "hidden": 1, "layers": 1, "max_devices": 2, "checkpoint_every": 1}
"""The least each integer key takes (clusters have at least 2 GPUs; SB3's PPO needs a batch of 2 or more)."""


def _check_ranges(path: Path, data: dict) -> None:
    """Values a run would fail on minutes later (or silently ignore), refused before any work."""
    for key, least in _MINIMUM.items():
        if key in data and data[key] < least:
            raise SpecError(f"{path}: {key}: must be >= {least}, got {data[key]}")
    if "learning_rate" in data and not data["learning_rate"] > 0:
        raise SpecError(f"{path}: learning_rate: must be > 0, got {data['learning_rate']}")
    if "gamma" in data and not 0 < data["gamma"] <= 1:
        raise SpecError(f"{path}: gamma: must be in (0, 1], got {data['gamma']}")
    n_steps, n_envs = (data.get(k, getattr(PolicyTrainConfig, k)) for k in ("n_steps", "n_envs"))
    if n_steps * n_envs < 2:
        raise SpecError(f"{path}: n_steps: n_steps x n_envs must be >= 2 (SB3's PPO), got {n_steps} x {n_envs}")
    if "tracker" in data:
        from hetpart.experiments.tracking import KINDS

        names = [k.strip() for k in data["tracker"].split(",") if k.strip()]
        bad = [k for k in names if k not in KINDS]
        if bad or not names or ("null" in names and len(names) > 1):
            raise SpecError(f"{path}: tracker: {data['tracker']!r}: use one or more of {', '.join(KINDS)} "
                            "(comma-separated; null alone)")


def written_path(out: str | Path) -> Path:
    """The file stable-baselines3's ``save(out)`` writes: ``out`` itself, or ``out.zip`` when ``out`` has no
    suffix."""
    out = Path(out)
    return out if out.suffix else out.with_name(out.name + ".zip")


def shipped_checkpoint() -> Path:
    """The checkpoint the ``policy`` planner plans with by default (inside the installed package)."""
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    return DEFAULT_CHECKPOINT


_OUT_KEYS = ("experiment", "seed", "out", "runs_dir")
"""The keys that say where a run writes."""


def _check_out(source: str, cfg: PolicyTrainConfig, replace_shipped: bool, given_out: bool = True) -> None:
    """``cfg.out`` (empty: the run folder's ``policy.zip``) and the run folder under ``cfg.runs_dir`` can be
    written, and ``out`` is not the shipped checkpoint unless ``replace_shipped`` (refused before training)."""
    from hetpart.experiments.tracking import run_name

    run = Path(cfg.runs_dir) / run_name(cfg.experiment, cfg.seed)
    _check_creatable(run, f"{source}: runs_dir", "runs_dir")
    if not cfg.out:
        if given_out:
            raise SpecError(f"{source}: out: empty; give the checkpoint's file name (e.g. runs/mine.zip), or leave "
                            "out: out to write policy.zip in the run's folder")
        return
    target = written_path(cfg.out)
    from hetpart import _validate

    _validate.refuse_input_as_output(SpecError, target, f"{source}: out", {"training config": source})
    if target.is_dir():
        raise SpecError(f"{source}: out: {target} is a folder; give a file name (e.g. {target / 'policy.zip'})")
    if not replace_shipped and target.resolve() == shipped_checkpoint().resolve():
        raise SpecError(f"{source}: out: {target} is the shipped policy, which '--planner policy' plans with; give "
                        "another file (or leave out: out for the run's folder), or pass --replace-shipped to "
                        "replace it on purpose")
    if target.is_file() and not _is_checkpoint(target):  # a rerun replaces its own checkpoint, nothing else
        raise SpecError(f"{source}: out: {target} exists and is not a policy checkpoint (train-policy replaces only "
                        "a checkpoint it wrote); give another file name, or move that file away")
    _check_creatable(target, f"{source}: out", "out")


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a zip as stable-baselines3 saves a model (its ``data`` and ``policy.pth`` members)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {"data", "policy.pth"} <= names


def _check_creatable(target: Path, source: str, key: str) -> None:
    from hetpart import _validate

    _validate.check_creatable(SpecError, target, source, f"choose another place for {key}")


_RESUMED_KEYS = ("learning_rate", "n_steps", "batch_size", "n_epochs", "ent_coef", "gamma")
"""Training settings a resumed run takes from the config (given) or the checkpoint (left out)."""
_NETWORK_KEYS = ("hidden", "layers")
"""The network's size: a resumed run keeps the checkpoint's."""


def resume_file(resume: str) -> Path | None:
    """The checkpoint stable-baselines3 loads for ``resume`` (``resume`` itself, else ``resume.zip``), or None."""
    from hetpart.policies.registry import checkpoint_file

    return checkpoint_file(resume)


def checkpoint_settings(resume: str, source: str = "resume") -> dict[str, Any]:
    """The training settings and network size stored in the MaskablePPO checkpoint ``resume`` (read from its
    ``data`` entry, without loading the network); :class:`SpecError` naming ``source`` when it is missing or
    not such a checkpoint."""
    import json
    import zipfile

    found = resume_file(resume)
    if found is None:
        also = "" if Path(resume).suffix else f" nor {resume}.zip"
        raise SpecError(f"{source}: no checkpoint {resume}{also} (relative to the working directory {Path.cwd()}); "
                        "give a file train-policy wrote (its out:, or runs/<run>/checkpoints/*.zip)")
    wrong = SpecError(f"{source}: {found} is not a MaskablePPO checkpoint; give a file train-policy wrote (its out:, "
                      "or runs/<run>/checkpoints/*.zip)")
    try:
        with zipfile.ZipFile(found) as z:
            data = json.loads(z.read("data"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        raise wrong from None
    kwargs = data.get("policy_kwargs") if isinstance(data, dict) else None
    net = kwargs.get("features_extractor_kwargs") if isinstance(kwargs, dict) else None
    if not isinstance(net, dict):
        raise wrong
    from hetpart.policies.gnn import check_features

    check_features(found, source, fix="train a new policy (leave resume out)")
    settings = {k: net[k] for k in _NETWORK_KEYS if isinstance(net.get(k), int)}
    for key in _RESUMED_KEYS:  # a schedule (not a number) is left as the config says
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            settings[key] = float(value) if isinstance(getattr(PolicyTrainConfig, key), float) else int(value)
    return settings


def _resume_settings(path: Path, data: dict) -> dict:
    """``data`` completed from the ``resume`` checkpoint: the network size (a different one given is refused)
    and the training keys the config leaves out."""
    saved = checkpoint_settings(data["resume"], f"{path}: resume")
    clash = [k for k in _NETWORK_KEYS if k in data and k in saved and data[k] != saved[k]]
    if clash:
        given = ", ".join(f"{k} {data[k]}" for k in clash)
        stored = ", ".join(f"{k} {saved[k]}" for k in clash)
        raise SpecError(f"{path}: {', '.join(clash)}: the network resumed from {data['resume']} has {stored}, not "
                        f"{given}; a resumed network keeps its size: drop {' and '.join(clash)} or set the "
                        "checkpoint's (or train a new one without resume)")
    return {k: v for k, v in saved.items() if k not in data} | data


def _distribution(cfg: PolicyTrainConfig, max_devices: int):
    from hetpart.envs.scenarios import ScenarioDistribution

    over = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.distribution.items()}
    return ScenarioDistribution(**(over | {"max_devices": max_devices}))


def _demonstrate_seed(args) -> list:
    """The search's decisions on the first feasible scenario drawn from ``seed``."""
    import numpy as np

    from hetpart.envs.scenarios import sample_scenario
    from hetpart.policies.imitation import demonstrate
    from hetpart.policies.structure import Scenario

    seed, dist = args
    rng = np.random.default_rng(seed)
    while True:
        scenario = Scenario(*sample_scenario(rng, dist))
        if scenario.feasible:
            return demonstrate(scenario)


def _demonstrations(cfg: PolicyTrainConfig, progress) -> list:
    import multiprocessing

    dist = _distribution(cfg, cfg.imitation_max_devices)
    jobs = [(cfg.seed * 100_003 + i, dist) for i in range(cfg.imitation_scenarios)]
    task = progress.add_task("imitation: search demonstrates", total=len(jobs))
    demos = []
    if cfg.imitation_workers > 1:
        with multiprocessing.get_context("fork").Pool(cfg.imitation_workers) as pool:
            for found in pool.imap(_demonstrate_seed, jobs):
                demos += found
                progress.advance(task)
        return demos
    for job in jobs:
        demos += _demonstrate_seed(job)
        progress.advance(task)
    return demos


def _plan_callback():
    from stable_baselines3.common.callbacks import BaseCallback

    class PlanMetrics(BaseCallback):
        """``plan/ratio_mean`` (throughput over ceiling of finished plans) and ``plan/mixed_share``."""

        def _on_rollout_start(self) -> None:
            self.ratios, self.mixed = [], []

        def _on_step(self) -> bool:
            for info, done, reward in zip(self.locals["infos"], self.locals["dones"], self.locals["rewards"]):
                if done and "structure" in info:
                    self.ratios.append(float(reward))
                    self.mixed.append(info["structure"][0] == "mixed")
            return True

        def _on_rollout_end(self) -> None:
            if self.ratios:
                self.logger.record("plan/ratio_mean", sum(self.ratios) / len(self.ratios))
                self.logger.record("plan/mixed_share", sum(self.mixed) / len(self.mixed))
                self.logger.record("plan/episodes", len(self.ratios))

    return PlanMetrics()


def _say(line: str) -> None:
    """One progress line on stderr (stdout is left to the caller's summary), with or without a terminal."""
    import sys

    print(line, file=sys.stderr, flush=True)


def _stderr_progress():
    """A transient rich progress bar on stderr, drawn only on a terminal (elsewhere it leaves blank lines)."""
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    return Progress(console=console, transient=True, disable=not console.is_terminal)


def _progress_callback():
    """PPO's progress as a bar on stderr (SB3's own ``progress_bar=True`` draws on stdout, where a
    ``--json`` summary must stand alone)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class StderrProgress(BaseCallback):
        def _on_training_start(self) -> None:
            self.bar = _stderr_progress()
            self.task = self.bar.add_task("PPO", total=self.locals["total_timesteps"] - self.model.num_timesteps)
            self.bar.start()

        def _on_step(self) -> bool:
            self.bar.advance(self.task, self.training_env.num_envs)
            return True

        def _on_training_end(self) -> None:
            self.bar.stop()

    return StderrProgress()


def train_policy(cfg: PolicyTrainConfig, *, replace_shipped: bool = False) -> dict[str, Any]:
    """Run the training described by ``cfg``; returns a summary (paths, accuracy, timings). Progress goes to
    stderr: stdout is left to the caller. The checkpoint goes to ``cfg.out`` (empty: the run folder's
    ``policy.zip``); the shipped one is replaced only with ``replace_shipped``."""
    _check_out("config", cfg, replace_shipped, given_out=False)  # a config built in code: load_config's checks
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import CheckpointCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from hetpart.envs import PartitionEnv
    from hetpart.experiments.tracking import fresh_episode_stats, make_tracker, sb3_logger, seed_everything
    from hetpart.policies.gnn import PointerPolicy
    from hetpart.policies.observation import feature_record

    if cfg.resume:  # a config built in code: the same checks as load_config's, before anything is created
        saved = checkpoint_settings(cfg.resume)
        clash = [k for k in _NETWORK_KEYS if k in saved and getattr(cfg, k) != saved[k]]
        if clash:
            raise SpecError(f"resume: the network in {cfg.resume} has "
                            f"{', '.join(f'{k} {saved[k]}' for k in clash)}, not "
                            f"{', '.join(f'{k} {getattr(cfg, k)}' for k in clash)}; a resumed network keeps its size")
    seed_everything(cfg.seed)
    torch.set_num_threads(1)
    start = time.time()
    tracker = make_tracker(cfg.tracker, cfg.experiment, cfg.seed, cfg, root=cfg.runs_dir)
    dist = _distribution(cfg, cfg.max_devices)
    env = DummyVecEnv([lambda: Monitor(PartitionEnv(distribution=dist)) for _ in range(cfg.n_envs)])
    env.seed(cfg.seed)
    summary: dict[str, Any] = {"run": tracker.name}
    if cfg.resume:
        # the training settings are the config's (load_config filled those it left out from the checkpoint):
        # SB3 sets them before it builds the rollout buffer and the learning-rate schedule
        model = MaskablePPO.load(cfg.resume, env=env, device="cpu", custom_objects={"policy_class": PointerPolicy},
                                 **{k: getattr(cfg, k) for k in _RESUMED_KEYS})
        fresh_episode_stats(model)
        summary["resumed_from"] = str(resume_file(cfg.resume) or cfg.resume)
    else:
        model = MaskablePPO(PointerPolicy, env, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                            learning_rate=cfg.learning_rate, ent_coef=cfg.ent_coef, gamma=cfg.gamma, seed=cfg.seed,
                            device="cpu", policy_kwargs=dict(features_extractor_kwargs=dict(
                                hidden=cfg.hidden, layers=cfg.layers, features=feature_record())))
        if cfg.imitation_scenarios:
            from hetpart.policies.imitation import behaviour_clone

            _say(f"train-policy: imitation: search's decisions on {cfg.imitation_scenarios} scenarios, "
                 f"{cfg.imitation_epochs} epochs")
            with _stderr_progress() as progress:
                demos = _demonstrations(cfg, progress)
            summary["imitation_decisions"] = len(demos)
            summary["imitation_accuracy"] = behaviour_clone(model.policy, demos, epochs=cfg.imitation_epochs,
                                                            seed=cfg.seed, log=tracker.log)
            summary["imitation_s"] = time.time() - start
    run_dir = Path(tracker.run_dir) if tracker.run_dir else Path(cfg.runs_dir) / tracker.name
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)  # else SB3 warns that it creates it
    from hetpart.policies.gnn import save_network_file

    if not cfg.resume and cfg.imitation_scenarios:
        model.save(run_dir / "checkpoints" / "imitation.zip")  # the warm start alone, for comparison
        save_network_file(model, run_dir / "checkpoints" / "imitation.zip")

    class NetworkCheckpoint(CheckpointCallback):
        """SB3's periodic checkpoint, with the network file planning reads beside each zip."""

        def _on_step(self) -> bool:
            going = super()._on_step()
            if self.n_calls % self.save_freq == 0:
                save_network_file(self.model, self._checkpoint_path(extension="zip"))
            return going

    model.set_logger(sb3_logger(tracker))
    callbacks = [_plan_callback(), NetworkCheckpoint(max(cfg.checkpoint_every // cfg.n_envs, 1),
                                                     str(run_dir / "checkpoints"), name_prefix="policy")]
    if cfg.progress_bar:
        callbacks.append(_progress_callback())
    _say(f"train-policy: PPO, {cfg.timesteps} timesteps on {cfg.n_envs} environment(s); checkpoints in "
         f"{run_dir / 'checkpoints'}")
    model.learn(cfg.timesteps, callback=callbacks, reset_num_timesteps=not cfg.resume)
    out = written_path(cfg.out) if cfg.out else run_dir / "policy.zip"  # what SB3 writes, named so in the summary
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(out)
    save_network_file(model, out)  # planning with it needs no SB3
    tracker.finish()
    summary |= {"checkpoint": str(out), "timesteps": int(model.num_timesteps), "wall_s": time.time() - start}
    return summary
