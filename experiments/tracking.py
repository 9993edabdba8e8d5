"""Tracked runs: one small interface over TensorBoard, wandb (offline by default) and nothing.

A run is named ``{experiment}__{seed}__{time}`` and lives in ``{root}/{name}/``, which holds its
full config (``config.yaml``, with the experiment, seed, start time, host and hetpart version, and, when
hetpart runs from a git checkout, the commit and whether tracked files differ from it: :func:`git_state`),
the TensorBoard event files and, with wandb, wandb's offline run (``wandb/``; sync it later with
``wandb sync runs/<name>/wandb/offline-run-*`` if you wish). Only the process that owns a metric
logs it: :func:`make_tracker` returns a :class:`NullTracker` on every rank but the owner (rank 0
of ``RANK`` by default), so training code calls ``tracker.log`` unconditionally.

Metric keys are namespaced by their producer: ``bench/...`` (benchmarks), ``plan/...``
(planners), ``costmodel/...`` (learned cost model training) and SB3's own keys (``rollout/...``,
``train/...``) for policy training, which logs through :func:`sb3_logger`. One run may mix unrelated steps (the
loop logs ``loop/...`` per iteration, SB3 per timestep): TensorBoard keeps a step per key, and in wandb each
namespace is plotted against its own step key (``loop/step``, ``rollout/step``; see :meth:`WandbTracker.log`).

Example:
    >>> import tempfile
    >>> from hetpart.experiments.tracking import make_tracker
    >>> with make_tracker("tensorboard", "demo", seed=0, config={"lr": 1e-3}, root=tempfile.mkdtemp()) as t:
    ...     t.log({"costmodel/val_mape": 12.5}, step=1)
    >>> t.name.startswith("demo__0__")
    True

Core, costmodel, envs and policies never import this module: the CLI or an experiment script
makes the tracker and passes it in (anything with ``log(metrics, step)`` will do).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import random
import re
import time
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence, runtime_checkable

from hetpart.errors import SpecError

__all__ = ["Tracker", "TrackerKind", "NullTracker", "TensorBoardTracker", "WandbTracker", "MultiTracker",
           "make_tracker", "run_name", "sb3_logger", "fresh_episode_stats", "seed_everything", "plain_config", "KINDS",
           "tracker_kinds", "git_state"]

TrackerKind = Literal["tensorboard", "wandb", "null"]
KINDS: tuple[str, ...] = ("tensorboard", "wandb", "null")


@runtime_checkable
class Tracker(Protocol):
    """What training and benchmark code needs from a tracker."""

    name: str
    """The run name, ``{experiment}__{seed}__{time}``."""
    run_dir: Path | None
    """The run's folder (config, event files); ``None`` for a tracker that keeps nothing."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record scalar ``metrics`` (``{"bench/tokens_per_s": ...}``) at ``step``."""

    def finish(self) -> None:
        """Flush and close; later calls to :meth:`log` are errors."""


class _Base:
    """Context-manager support and the closed-run check shared by the trackers."""

    name: str = ""
    run_dir: Path | None = None
    _closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"tracker {self.name!r}: log() after finish()")


class NullTracker(_Base):
    """Keeps nothing: for processes that do not own the metrics, and for ``--tracker null``."""

    def __init__(self, name: str = "", run_dir: Path | None = None) -> None:
        self.name, self.run_dir = name, run_dir

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        _scalars(metrics)  # the same checks as the real trackers: a bad metric fails on every rank

    def finish(self) -> None:
        self._closed = True


class TensorBoardTracker(_Base):
    """Scalars as TensorBoard event files in ``run_dir`` (tensorboard's own writer: no torch import)."""

    def __init__(self, name: str, run_dir: Path, config: Mapping[str, Any] | None = None) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.name, self.run_dir = name, Path(run_dir)
        self._writer = EventFileWriter(str(self.run_dir))
        if config:
            self._text("config", "```\n" + json.dumps(dict(config), indent=2, default=str) + "\n```")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._check_open()
        values = [Summary.Value(tag=k, simple_value=v) for k, v in _scalars(metrics).items()]
        self._writer.add_event(Event(summary=Summary(value=values), step=int(step), wall_time=time.time()))

    def _text(self, tag: str, text: str) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()],  # 7 = DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        value = Summary.Value(tag=tag, metadata=meta, tensor=tensor)
        self._writer.add_event(Event(summary=Summary(value=[value]), step=0, wall_time=time.time()))

    def finish(self) -> None:
        if not self._closed:
            self._writer.close()
        self._closed = True


class WandbTracker(_Base):
    """A wandb run, offline unless ``WANDB_MODE`` says otherwise (nothing leaves the machine)."""

    def __init__(self, name: str, run_dir: Path, experiment: str, config: Mapping[str, Any] | None = None) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb  # lazy: wandb is heavy and only this tracker needs it

        self.name, self.run_dir = name, Path(run_dir)
        project = experiment.split("/")[0] or "hetpart"
        self._run = wandb.init(project=f"hetpart-{project}", name=name, dir=str(self.run_dir),
                               config=dict(config or {}), reinit="create_new")
        self._defined: set[str] = set()
        """What ``define_metric`` was told so far: step keys (``loop/step``) and series (``loop/*``)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` against their namespace's own step (``loop/*`` against ``loop/step``, ...).

        One run holds series with unrelated steps (the loop's iterations 0, 1, ... and SB3's timesteps in the
        thousands), and wandb drops a record whose ``step=`` goes backwards; so ``step`` is never passed to wandb
        (each call is a row of wandb's own monotone step) but logged as ``{namespace}/step``, which
        ``define_metric`` makes the x-axis of ``{namespace}/*`` (a key without a namespace: of ``step``), as
        wandb's "customize log axes" guide does.
        """
        self._check_open()
        values = _scalars(metrics)
        for key in list(values):
            axis = _step_key(key)
            if key == axis:
                raise SpecError(f"tracker: metric {key!r} is the step wandb plots its namespace against; rename it")
            series = f"{axis[:-len('step')]}*" if "/" in axis else key
            if series not in self._defined:
                if axis not in self._defined:
                    self._run.define_metric(axis, hidden=True)
                    self._defined.add(axis)
                self._run.define_metric(series, step_metric=axis)
                self._defined.add(series)
            values[axis] = int(step)
        self._run.log(values)

    def finish(self) -> None:
        if not self._closed:
            self._run.finish()
        self._closed = True


class MultiTracker(_Base):
    """Several trackers of one run (``tensorboard,wandb``): every call goes to each."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)
        self.name = self.trackers[0].name if self.trackers else ""
        self.run_dir = next((t.run_dir for t in self.trackers if t.run_dir is not None), None)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._check_open()
        for t in self.trackers:
            t.log(metrics, step)

    def finish(self) -> None:
        for t in self.trackers:
            t.finish()
        self._closed = True


def run_name(experiment: str, seed: int, when: float | None = None) -> str:
    """``{experiment}__{seed}__{YYYYmmdd-HHMMSS}`` (UTC); ``/`` in the experiment becomes ``-``.

    >>> run_name("bench/suite", 3, when=0)
    'bench-suite__3__19700101-000000'
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    return f"{_slug(experiment)}__{int(seed)}__{stamp}"


def make_tracker(kinds: str | Iterable[str], experiment: str, seed: int, config: Any = None,
                 root: str | Path = "runs", rank: int | None = None, owner_rank: int = 0) -> Tracker:
    """Start a tracked run and save its config beside it.

    Args:
        kinds: ``"tensorboard"``, ``"wandb"``, ``"null"`` or several (a list, or ``"tensorboard,wandb"``).
        experiment: what is run (``"bench/suite"``, ``"costmodel/train"``, ``"policy/ppo"``).
        seed: the seed the run is repeatable from (part of the name; see :func:`seed_everything`).
        config: the full typed config: a dataclass, a pydantic model or a mapping (saved as ``config.yaml``).
        root: folder of all runs (``hetpart dashboard --logdir`` serves it).
        rank: this process's rank (default ``$RANK``, else 0); only ``owner_rank`` logs, others get a
            :class:`NullTracker` and write nothing.

    Returns:
        The tracker; use it as a context manager or call ``finish()``.
    """
    names = tracker_kinds(kinds)
    rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
    name = run_name(experiment, seed)
    if rank != owner_rank or names == ["null"]:
        return NullTracker(name)
    run_dir = _unique_dir(Path(root), name)
    plain = plain_config(config)
    git = git_state()
    _save_config(run_dir, {"experiment": experiment, "seed": int(seed), "run": run_dir.name,
                           "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": platform.node(), "hetpart": _version(), **({"git": git} if git else {}),
                           "config": plain})
    trackers: list[Tracker] = []
    for kind in names:
        if kind == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir.name, run_dir, plain))
        elif kind == "wandb":
            trackers.append(WandbTracker(run_dir.name, run_dir, experiment, plain))
    return trackers[0] if len(trackers) == 1 else MultiTracker(trackers)


def sb3_logger(tracker: Tracker, formats: Sequence[str] = ("tensorboard", "csv")):
    """An SB3 ``Logger`` writing into ``tracker``'s run with SB3's own keys (``rollout/ep_rew_mean``, ...).

    TensorBoard and CSV files go to the run folder through SB3's ``configure``; a wandb tracker of the
    run gets every record as well. Pass it to ``model.set_logger(...)``. A :class:`NullTracker` gives a
    logger that writes nothing.
    """
    from stable_baselines3.common.logger import Logger, configure

    if tracker.run_dir is None:
        return Logger(folder=None, output_formats=[])
    logger = configure(str(tracker.run_dir), list(formats))
    for t in getattr(tracker, "trackers", [tracker]):
        if isinstance(t, WandbTracker):
            logger.output_formats.append(_forward_writer(t))
    return logger


def fresh_episode_stats(model) -> None:
    """Forget the episode returns and successes a loaded SB3 model carries from the run that saved it.

    SB3 saves ``ep_info_buffer`` (the last 100 episodes' returns) in a checkpoint and, when training continues
    with ``reset_num_timesteps=False``, keeps it: ``rollout/ep_rew_mean`` then averages the old run's episodes
    with (or, where no new episode finishes, instead of) the new ones. With the buffers cleared, SB3's
    ``_setup_learn`` starts empty ones, so the logged means are of the episodes this training ran.
    """
    model.ep_info_buffer = None
    model.ep_success_buffer = None


def _forward_writer(tracker: Tracker):
    """An SB3 ``KVWriter`` (the class is SB3's: ``Logger.dump`` writes only to ``KVWriter`` instances) that hands
    every dump's numeric values to ``tracker``; keys a record excludes from ``"wandb"`` are left out."""
    from stable_baselines3.common.logger import KVWriter

    class _ForwardToTracker(KVWriter):
        def __init__(self, tracker: Tracker) -> None:
            self.tracker = tracker

        def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
            numbers = {k: float(v) for k, v in key_values.items()
                       if "wandb" not in (key_excluded.get(k) or ()) and _is_number(v)}
            if numbers:
                self.tracker.log(numbers, step)

        def close(self) -> None:
            """The tracker's owner finishes it."""

    return _ForwardToTracker(tracker)


def _is_number(value: Any) -> bool:
    """A Python or numpy/torch scalar, not a bool (SB3 records strings and videos too)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or hasattr(value, "item") and getattr(value, "ndim", 1) == 0


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and (when imported) torch's generators, so a run repeats from its seed."""
    import sys

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)


def plain_config(config: Any) -> dict[str, Any]:
    """A dataclass, pydantic model or mapping as plain JSON-able data (nested values too)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    elif hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    elif hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise SpecError(f"tracker config: expected a dataclass, pydantic model or mapping, got {type(config).__name__}")
    return json.loads(json.dumps(dict(config), default=str))


def tracker_kinds(kinds: str | Iterable[str], flag: str = "tracker") -> list[str]:
    """The tracker kinds named in ``kinds`` (comma-separated text or names), each once; ``flag`` names the option
    or field in the error (``--tracker`` for the CLI).

    Raises:
        SpecError: an unknown kind, none, or ``null`` with another kind.
    """
    names = [k.strip() for k in (kinds.split(",") if isinstance(kinds, str) else kinds) if k.strip()]
    bad = [k for k in names if k not in KINDS]
    given = f" {kinds!r}:" if isinstance(kinds, str) and kinds.strip() not in (*KINDS, *(bad[:1] if bad else ())) else ""
    if bad or not names:
        raise SpecError(f"{flag}:{given} unknown kind {bad[0] if bad else ''!r}; use one or more of {', '.join(KINDS)} "
                        "(comma-separated, e.g. tensorboard,wandb)")
    if "null" in names and len(names) > 1:
        raise SpecError(f"{flag}:{given} 'null' cannot be combined with other kinds; give it alone")
    return list(dict.fromkeys(names))


def _scalars(metrics: Mapping[str, float]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"tracker: metric {key!r} = {value!r} is not a number; log scalars only") from None
    return out


def _step_key(key: str) -> str:
    """The step key ``key`` is plotted against in wandb: ``loop/step`` for ``loop/...``, ``step`` for a bare key."""
    namespace, slash, _ = key.partition("/")
    return f"{namespace}/step" if slash else "step"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or "run"


def _unique_dir(root: Path, name: str) -> Path:
    """``root/name``, or ``root/name-2``... when two runs start in the same second."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            path = root / (name if i == 1 else f"{name}-{i}")
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise SpecError(f"runs folder {root}: cannot create a run there ({exc.__class__.__name__}); "
                        "choose another folder") from None
    raise SpecError(f"runs folder {root}: too many runs named {name}; wait a second or choose another folder")


def _save_config(run_dir: Path, record: dict[str, Any]) -> None:
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(record, sort_keys=False))


GIT_TIMEOUT_S = 5.0
"""ASSUMED: the most :func:`git_state` waits for one git command (a few ms on this checkout) before it records
nothing; a run must not hang on a locked or networked repository."""


def git_state(package_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The git commit the running hetpart comes from: ``{"commit": sha, "dirty": bool}``, or None.

    ``dirty`` is true when a tracked file differs from the commit (untracked files are not counted). None
    (nothing recorded, no error) when the package (``package_dir``, default the installed ``hetpart``'s
    folder) is not a tracked file of a git checkout, e.g. an installed wheel (a site-packages folder inside
    some other repository is not taken for one), or when git is missing or does not answer within
    :data:`GIT_TIMEOUT_S`.
    """
    import subprocess

    if package_dir is None:
        import hetpart

        package_dir = Path(hetpart.__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    if git("ls-files", "--error-unmatch", "__init__.py") is None:  # hetpart's own source, tracked there
        return None
    commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    if not commit or status is None:
        return None
    return {"commit": commit.strip(), "dirty": bool(status.strip())}


def _version() -> str:
    try:
        from hetpart import __version__
    except ImportError:  # pragma: no cover
        return "unknown"
    return str(__version__)
