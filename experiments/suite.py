"""The planner benchmark suite: every planner on every entry of a suite file.

A suite file (shared/CONTRACT.md) is ``entries: [{name, cluster, model, global_batch, seq_len}]``;
``cluster`` and ``model`` are catalog names or paths relative to the suite file. :func:`run_suite`
writes ``results.csv`` (one row per scenario and planner) and two bar charts.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from hetpart import _validate as v
from hetpart.errors import HetpartError, PlanError, SpecError

__all__ = ["SuiteEntry", "EntryResult", "load_suite", "check_planners", "run_entry", "solve_entry", "run_suite",
           "COLUMNS", "write_csv", "write_plots", "make_out_dir"]

COLUMNS = ("scenario", "planner", "tokens_per_s", "pct_upper_bound", "speedup_vs_uniform", "plan_time_s",
           "fits_in_memory", "pct_memory_lifted", "pct_of_search", "peak_memory_gb", "peak_memory_capacity_gb",
           "peak_memory_gpu", "step_time_s", "mfu", "upper_bound_tokens_per_s",
           "memory_lifted_upper_bound_tokens_per_s", "num_devices", "model", "cluster", "global_batch", "seq_len",
           "error")


@dataclass(frozen=True)
class SuiteEntry:
    """One scenario."""

    name: str
    cluster: str
    """Catalog name or resolved path of the cluster YAML."""
    model: str
    """Catalog name or resolved path of a config.json."""
    global_batch: int
    seq_len: int


def _resolve(value: Any, base: Path, source: str, field: str) -> str:
    text = v.string(SpecError, value, source, field)
    candidate = base / text
    return str(candidate.resolve()) if candidate.exists() else text


def _check_loads(path: Path, field: str, text: str, resolved: str) -> None:
    """The entry's cluster or model loads (a model given as ``python:`` is traced only when its entry runs):
    refused here, naming the suite file and the entry's field, not the ``--cluster``/``--model`` flag the
    loaders name, and before any planner has run."""
    from hetpart import load_cluster
    from hetpart.graph.load import resolve_transformer

    kind = field.rsplit(".", 1)[-1]
    try:
        if kind == "cluster":
            load_cluster(resolved)
        else:
            resolve_transformer(resolved)
    except HetpartError as exc:
        message = " ".join(str(exc).split()).removeprefix(f"--{kind}: ")
        where = (f" (paths in a suite are relative to its folder, {path.parent})"
                 if "no such file" in message and not Path(text).is_absolute() else "")
        raise SpecError(f"{path}: {field}: {message}{where}") from None


def load_suite(path: str | Path) -> list[SuiteEntry]:
    """Read and check a suite file; raises :class:`SpecError` naming the file and field (a cluster or model
    that does not load, two entries of one name)."""
    from hetpart._yaml import load_yaml_file

    path = Path(path)
    data = load_yaml_file(SpecError, path, "the suite")
    data = v.require_mapping(SpecError, data, str(path), "")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{path}: entries: expected a non-empty list of {{name, cluster, model, global_batch, seq_len}}")
    out = []
    named: dict[str, int] = {}
    for i, raw in enumerate(entries):
        field = f"entries[{i}]"
        raw = v.require_mapping(SpecError, raw, str(path), field)
        v.require_keys(SpecError, raw, str(path), field, ["name", "cluster", "model", "global_batch", "seq_len"], [])
        name = v.string(SpecError, raw["name"], str(path), f"{field}.name")
        if name in named:  # results.csv rows and the gantt_<name>.png files are told apart by name
            raise SpecError(f"{path}: {field}.name: {name!r} is also entries[{named[name]}]'s name; give every "
                            "entry its own name")
        named[name] = i
        out.append(SuiteEntry(
            name=name,
            cluster=_resolve(raw["cluster"], path.parent, str(path), f"{field}.cluster"),
            model=_resolve(raw["model"], path.parent, str(path), f"{field}.model"),
            global_batch=v.integer(SpecError, raw["global_batch"], str(path), f"{field}.global_batch", maximum=10**8),
            seq_len=v.integer(SpecError, raw["seq_len"], str(path), f"{field}.seq_len", maximum=10**7)))
        for key in ("cluster", "model"):
            if not (key == "model" and out[-1].model.startswith("python:")):
                _check_loads(path, f"{field}.{key}", raw[key], getattr(out[-1], key))
        if not out[-1].model.startswith("python:"):
            _check_seq_len(path, field, out[-1])
    return out


def _check_seq_len(path: Path, field: str, entry: SuiteEntry) -> None:
    """A model with learned positions takes no longer sequence than it has positions: refused here, naming the
    entry's ``seq_len`` (not the ``--seq-len`` flag the model loader names), before any planner has run.
    Rotary and ALiBi models take longer sequences (context extension), as ``hetpart plan`` does."""
    from hetpart.graph.load import resolve_transformer

    name, cfg, _ = resolve_transformer(entry.model)
    if cfg.learned_positions and entry.seq_len > cfg.max_positions:
        raise SpecError(f"{path}: {field}.seq_len: {entry.seq_len} exceeds the {cfg.max_positions} learned positions "
                        f"of {name} (entry {entry.name!r}); use seq_len {cfg.max_positions} or less, or another model")


def check_planners(planners: Sequence[str]) -> list[str]:
    """The planner names, checked against the planner registry (an unregistered ``policy`` says why)."""
    from hetpart.policies.registry import available_planners, get_planner

    names = [p.strip() for p in planners if p.strip()]
    for name in names:
        try:
            get_planner(name)
        except PlanError as exc:
            raise PlanError(f"--planners: {str(exc).removeprefix('--planner: ')}") from None
    if not names:
        raise PlanError(f"--planners: empty list; use a comma-separated list of {', '.join(available_planners())}")
    return names


@dataclass(frozen=True)
class EntryResult:
    """One entry's rows and the best plan found for it (for the Gantt chart)."""

    rows: list[dict[str, Any]]
    best: Any | None
    """The fastest planner's ``PlanResult`` (``None`` when no planner found a plan)."""
    model: Any
    cluster: Any


def run_entry(entry: SuiteEntry, planners: Sequence[str],
              on_planner: Callable[[SuiteEntry, str], None] | None = None) -> list[dict[str, Any]]:
    """One row per planner for ``entry`` (a planner that finds nothing gets a row with its error)."""
    return solve_entry(entry, planners, on_planner).rows


def solve_entry(entry: SuiteEntry, planners: Sequence[str],
                on_planner: Callable[[SuiteEntry, str], None] | None = None) -> EntryResult:
    """Every planner on ``entry`` (``uniform`` always, as the baseline): rows and the best plan."""
    from hetpart import Workload, load_cluster, load_model
    from hetpart.workload import cluster_precision
    from hetpart.policies.planner import plan
    from hetpart.policies.upper_bound import upper_bound

    # the suite's field, not the --seq-len flag of `hetpart plan`, in the loader's notes and errors
    model = load_model(entry.model, seq_len=entry.seq_len, seq_len_source=f"suite entry {entry.name!r}: seq_len")
    cluster = load_cluster(entry.cluster)
    workload = Workload(entry.global_batch, entry.seq_len, precision=cluster_precision(cluster))  # as `hetpart plan`
    bound = upper_bound(model, cluster, workload)
    results: dict[str, Any] = {}
    for name in dict.fromkeys([*planners, "uniform"]):
        if on_planner is not None:
            on_planner(entry, name)
        try:
            results[name] = plan(model, cluster, workload, name)
        except HetpartError as exc:
            results[name] = exc
    found = {k: r for k, r in results.items() if not isinstance(r, HetpartError)}
    base = found["uniform"].prediction.tokens_per_s if "uniform" in found else None
    search = found["search"].prediction.tokens_per_s if "search" in found else None
    rows = [_row(entry, name, results[name], bound, cluster.num_devices, base, search) for name in planners]
    best = max((found[n] for n in planners if n in found), key=lambda r: r.prediction.tokens_per_s, default=None)
    return EntryResult(rows, best, model, cluster)


def _row(entry: SuiteEntry, name: str, r: Any, bound: dict[str, Any], devices: int, base: float | None,
         search: float | None) -> dict[str, Any]:
    row = {"scenario": entry.name, "planner": name, "upper_bound_tokens_per_s": bound["tokens_per_s"],
           "memory_lifted_upper_bound_tokens_per_s": bound["memory_lifted_tokens_per_s"],
           "num_devices": devices, "model": entry.model, "cluster": entry.cluster,
           "global_batch": entry.global_batch, "seq_len": entry.seq_len}
    if isinstance(r, HetpartError):
        return row | {c: "" for c in COLUMNS if c not in row} | {"fits_in_memory": False,
                                                                  "error": " ".join(str(r).split())}
    tps = r.prediction.tokens_per_s
    worst = max(r.prediction.breakdown, key=lambda b: b["memory_gb"] / b["capacity_gb"])
    return row | {"tokens_per_s": tps, "pct_upper_bound": tps / bound["tokens_per_s"] * 100,
                  "pct_memory_lifted": tps / bound["memory_lifted_tokens_per_s"] * 100,
                  "speedup_vs_uniform": tps / base if base else "", "pct_of_search": tps / search * 100 if search else "",
                  "plan_time_s": r.wall_time_s, "fits_in_memory": r.prediction.fits_in_memory,
                  "peak_memory_gb": worst["memory_gb"], "peak_memory_capacity_gb": worst["capacity_gb"],
                  "peak_memory_gpu": worst["gpu"], "step_time_s": r.prediction.step_time_s,
                  "mfu": r.prediction.metrics["mfu"], "error": ""}


def run_suite(suite: str | Path, planners: Sequence[str], out_dir: str | Path,
              on_entry: Callable[[SuiteEntry], None] | None = None) -> list[dict[str, Any]]:
    """Run every planner on every entry; write ``results.csv`` and the bar charts to ``out_dir``."""
    names = check_planners(planners)
    entries = load_suite(suite)
    out = make_out_dir(out_dir)
    rows = []
    for entry in entries:
        if on_entry is not None:
            on_entry(entry)
        rows += run_entry(entry, names)
    write_csv(rows, out / "results.csv")
    write_plots(rows, names, out)
    return rows


def make_out_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--out: cannot create {out} ({exc.__class__.__name__}); choose another directory") from None
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """``results.csv``: the CONTRACT columns first, then the rest of :data:`COLUMNS`."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_plots(rows: list[dict[str, Any]], planners: Sequence[str], out: Path) -> list[Path]:
    """``throughput.png`` (tokens/s per scenario and planner, upper bound marked) and ``pct_upper_bound.png``."""
    from hetpart import plotting

    throughput = plotting.planner_bars(rows, planners, "tokens_per_s", "tokens/s (predicted)",
                                       bound_column="upper_bound_tokens_per_s", log=True)
    pct = plotting.planner_bars(rows, planners, "pct_upper_bound", "% of HETHUB's upper bound", reference=100)
    return [plotting.save_png(throughput, out / "throughput.png"), plotting.save_png(pct, out / "pct_upper_bound.png")]
