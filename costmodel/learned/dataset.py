"""The surrogate's data set: random scenarios, random valid plans, simulator labels (seeded).

Each scenario is split by what it holds: scenarios whose model family is in ``heldout_families`` or
whose cluster shape (device types x zones, :attr:`Scenario.shape`) is in ``heldout_shapes`` go to the
``test`` split and are never trained on; the others are split ``train`` / ``val`` at random. A random
transformer never has the architecture of a held-out family's catalog model (it is drawn again), so the
families are held out by what they are, not only by name.
"""

from __future__ import annotations

import math
import pickle
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from hetpart.errors import HetpartError, SpecError
from hetpart.graph.load import ModelNote
from hetpart.plan import Plan

from hetpart.costmodel.learned.encode import ScenarioContext, teacher_labels
from hetpart.costmodel.learned.sampling import Scenario, held_out_configs, neighbour, random_plan, random_scenario

__all__ = ["DatasetConfig", "build_dataset", "label_scenario", "scenario_rng", "save_dataset", "load_dataset"]


@dataclass(frozen=True)
class DatasetConfig:
    """What `hetpart costmodel dataset` samples."""

    seed: int = 0
    """Seed of every random draw."""
    scenarios: int = 300
    """Scenarios (model, cluster, workload) to sample."""
    plans_per_scenario: int = 48
    """Random valid plans drawn per scenario (invalid draws are skipped)."""
    max_devices: int = 1024
    """Largest cluster drawn (the sampler's budget is log-uniform from 2 devices up to this)."""
    max_replicas: int = 32
    """Largest data-parallel degree of a random plan."""
    heldout_families: tuple[str, ...] = ("llama3", "opt", "bert")
    """Model families kept out of training (test split only)."""
    heldout_shapes: tuple[str, ...] = ("4t2z", "4t3z")
    """Cluster shapes kept out of training (test split only)."""
    val_share: float = 0.1
    """Share of the remaining scenarios kept for validation."""
    neighbour_share: float = 0.25
    """Share of plans that also get a neighbour (a boundary moved, micro-batch or recompute changed)."""
    planner_neighbours: int = 0
    """Neighbours drawn around each planner plan (``extra_plans``), besides the shared ``neighbour_share``:
    planners' plans sit where the simulator's formula is lowest, where a surrogate errs most."""

    def __post_init__(self) -> None:
        if not isinstance(self.planner_neighbours, int) or self.planner_neighbours < 0:
            raise SpecError(f"dataset config: planner_neighbours: expected a whole number >= 0, got {self.planner_neighbours!r}")
        for name in ("scenarios", "plans_per_scenario", "max_devices", "max_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SpecError(f"dataset config: {name}: expected a whole number >= 1, got {value!r}")


def _split(rng: random.Random, cfg: DatasetConfig, family: str, shape: str) -> str:
    if family in cfg.heldout_families or shape in cfg.heldout_shapes:
        return "test"
    return "val" if rng.random() < cfg.val_share else "train"


def scenario_rng(seed: int, index: int) -> random.Random:
    """The random stream of scenario ``index`` of a data set seeded ``seed``: each scenario draws from
    its own stream, so a data set is the same however many workers label it."""
    return random.Random(f"hetpart-costmodel-dataset:{seed}:{index}")


MIN_PLANS = 4
"""Valid, priced plans a scenario needs to join the data set (ranking needs a few plans per scenario)."""


class DatasetNote(ModelNote):
    """A remark on the data set built (scenarios drawn again in place of dropped ones); the CLI prints it, as it
    prints model notes, as one ``hetpart: note:`` line on stderr."""


def label_scenario(cfg: DatasetConfig, index: int,
                   extra_plans: Callable[[Scenario, random.Random], list[Plan]] | None = None) -> dict[str, Any] | None:
    """Sample and label scenario ``index`` of the data set (None when fewer than :data:`MIN_PLANS` plans are
    valid)."""
    found = _label(cfg, index, extra_plans)
    return found if isinstance(found, dict) else None


def _label(cfg: DatasetConfig, index: int,
           extra_plans: Callable[[Scenario, random.Random], list[Plan]] | None = None) -> dict[str, Any] | str:
    """Scenario ``index``'s record, or why it has none (a line)."""
    from hetpart.costmodel.simulator import Simulator

    rng = scenario_rng(cfg.seed, index)
    sc = random_scenario(rng, max_devices=cfg.max_devices, refuse=held_out_configs(cfg.heldout_families))
    sim = Simulator(sc.model, sc.cluster)
    plans, ys = [], []
    candidates = [random_plan(rng, sc.model, sc.cluster, sc.global_batch, cfg.max_replicas)
                  for _ in range(cfg.plans_per_scenario)]
    if extra_plans is not None:
        chosen = extra_plans(sc, rng)
        candidates += chosen
        for plan in chosen:
            candidates += [neighbour(rng, plan, sc.model.num_units) for _ in range(cfg.planner_neighbours)]
    for plan in candidates:
        if plan is not None and rng.random() < cfg.neighbour_share:
            candidates.append(neighbour(rng, plan, sc.model.num_units))
    for plan in candidates:
        if plan is None or plan.validate(sc.model, sc.cluster):
            continue
        try:
            ys.append(math.log(sim.estimate(plan).step_time_s))
        except HetpartError:
            continue
        plans.append(plan)
    if len(plans) < MIN_PLANS:
        return (f"{sc.name}: {len(plans)} of {len(candidates)} plans drawn valid and priced, {MIN_PLANS} needed")
    batch = teacher_labels(ScenarioContext(sc.model, sc.cluster), plans)
    return {"name": sc.name, "family": sc.family, "shape": sc.shape, "split": _split(rng, cfg, sc.family, sc.shape),
            "model_spec": sc.model_spec, "cluster_spec": sc.cluster_spec, "global_batch": sc.global_batch,
            "plans": [p.to_dict() for p in plans], "log_step_s": ys, "batch": batch}


_WORKER_EXTRA: Callable | None = None
"""``extra_plans`` of the data set being built (inherited by forked workers: closures do not pickle)."""


def _label_in_worker(job: tuple[DatasetConfig, int]) -> dict[str, Any] | None:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return _label(job[0], job[1], _WORKER_EXTRA)


def build_dataset(cfg: DatasetConfig, progress: Callable[[int, int], None] | None = None,
                  extra_plans: Callable[[Scenario, random.Random], list[Plan]] | None = None,
                  workers: int = 1) -> list[dict[str, Any]]:
    """Sample and label ``cfg.scenarios`` scenarios; one record per scenario (in scenario order).

    A scenario with fewer than :data:`MIN_PLANS` valid plans is dropped and the next scenario index is drawn
    in its place (at most ``2 * cfg.scenarios`` draws in all), and a :class:`DatasetNote` says which were
    dropped and why (the CLI prints it on stderr); a data set without drops is what it always was.

    ``extra_plans(scenario, rng)`` adds plans from above (the CLI passes the planners' outputs: this
    package imports no planner). A share of the plans gets a neighbour (one move away) as well.
    ``workers`` > 1 labels scenarios in that many processes (forked; where the platform cannot fork,
    one process); every scenario draws from its own seeded stream (:func:`scenario_rng`), so the data
    set is identical for any number of workers.

    A record holds the specs (``model_spec``, ``cluster_spec``, ``global_batch``), the plans (dicts),
    ``log_step_s`` (the simulator's log step time per plan), the encoded :class:`PlanBatch` with the
    teacher's leaf labels, the ``split``, ``family`` and ``shape``.
    """
    global _WORKER_EXTRA
    import multiprocessing as mp
    import warnings

    if not isinstance(workers, int) or workers < 1:
        raise SpecError(f"dataset: workers: expected a whole number >= 1, got {workers!r}")
    n = cfg.scenarios
    limit = 2 * n  # draws at most: a config where few scenarios have enough valid plans stops, and says so
    kept: list[dict[str, Any]] = []
    dropped: list[tuple[int, str]] = []
    drawn = 0
    pool = None
    if workers > 1 and "fork" in mp.get_all_start_methods():
        _WORKER_EXTRA = extra_plans
        pool = mp.get_context("fork").Pool(min(workers, n))
    try:
        # scenarios 0 .. n-1 first; each one dropped (too few valid plans) is replaced by the next index, so the
        # records are the same for any number of workers and a data set without drops is unchanged
        while len(kept) < n and drawn < limit:
            batch = range(drawn, min(drawn + n - len(kept), limit))
            found = (pool.imap(_label_in_worker, [(cfg, i) for i in batch], chunksize=1) if pool is not None
                     else (_label(cfg, i, extra_plans) for i in batch))
            for i, rec in zip(batch, found):
                if isinstance(rec, dict):
                    kept.append(rec)
                else:
                    dropped.append((i, rec))
                if progress:
                    progress(len(kept) + len(dropped), n + len(dropped))
            drawn = batch.stop
    finally:
        if pool is not None:
            pool.terminate()  # as Pool's context manager does (every result is in by now, or an error is raised)
            pool.join()
            _WORKER_EXTRA = None
    if dropped:
        why = "; ".join(f"scenario {i} ({reason})" for i, reason in dropped[:3])
        more = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
        what = (f"drew {len(dropped)} more in their place" if len(kept) == n else
                f"kept {len(kept)} of the {n} asked for after {drawn} draws; raise --plans-per-scenario "
                f"(or keep --planners) so that scenarios have {MIN_PLANS} valid plans")
        warnings.warn(DatasetNote(f"costmodel dataset: {len(dropped)} scenario(s) dropped, too few valid plans: "
                                  f"{why}{more}; {what}"), stacklevel=2)
    empty = [split for split in ("train", "val", "test") if kept and not any(r["split"] == split for r in kept)]
    if empty:
        shares = {"train": "the rest", "val": f"a share of {cfg.val_share:g} at random",
                  "test": "the held-out model families and cluster shapes"}
        warnings.warn(DatasetNote(f"costmodel dataset: no scenario in the {' and '.join(empty)} split"
                                  f"{'s' if len(empty) > 1 else ''} of {len(kept)} ("
                                  + "; ".join(f"{split}: {shares[split]}" for split in empty)
                                  + "): training reports no error there; draw more --scenarios"), stacklevel=2)
    return kept


def save_dataset(records: list[dict[str, Any]], cfg: DatasetConfig, path: str | Path) -> None:
    """Write records and their config (``torch.save``)."""
    import torch

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(cfg), "records": records}, path)


def load_dataset(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(config dict, records)`` of a file written by :func:`save_dataset`."""
    import torch

    if not Path(path).is_file():
        raise SpecError(f"{path}: no such data set; build one with 'hetpart costmodel dataset --out {path}'")
    wrong = SpecError(f"{path}: not a data set written by 'hetpart costmodel dataset'; give one (build it with "
                      f"'hetpart costmodel dataset --out FILE')")
    if not is_torch_archive(path):  # JSON, a numpy head, ...: torch's unpickler would fail with its own words
        raise wrong
    try:
        data = torch.load(path, weights_only=False, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError):  # a damaged archive
        raise wrong from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or not isinstance(data.get("records"), list):
        raise wrong  # a surrogate checkpoint or another torch file
    return data["config"], data["records"]


def is_torch_archive(path: str | Path) -> bool:
    """Whether ``path`` is a ``torch.save`` zip archive (every entry under one folder, with a ``data.pkl``)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(name.endswith("/data.pkl") for name in z.namelist())

