"""``hetpart costmodel dataset|train|train-closed|evaluate``: build, train and score the learned cost model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hetpart.cli.common import JsonFlag, console, emit_json

__all__ = ["register"]

costmodel_app = typer.Typer(name="costmodel", no_args_is_help=True,
                            help="Build, train and evaluate the learned cost model.")


def _progress(quiet: bool, what: str):
    """A rich progress bar as a ``(done, total)`` callback, and the context to run it in."""
    from contextlib import nullcontext

    if quiet:
        return None, nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True)
    task = bar.add_task(what, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return update, bar


@costmodel_app.command("dataset")
def dataset_command(out: Path = typer.Option(Path("runs/costmodel/dataset.pt"), "--out", help="Where to write it."),
                    scenarios: int = typer.Option(300, "--scenarios", help="Scenarios to sample."),
                    plans_per_scenario: int = typer.Option(48, "--plans-per-scenario", help="Random plans per scenario."),
                    max_devices: int = typer.Option(1024, "--max-devices", help="Largest cluster (2 .. 4096)."),
                    seed: int = typer.Option(0, "--seed", help="Seed of every draw."),
                    planners: str = typer.Option("uniform,proportional", "--planners",
                                                 help="Planners whose plans join each scenario's ('' for none)."),
                    planner_neighbours: int = typer.Option(0, "--planner-neighbours",
                                                           help="Extra neighbours drawn around each planner plan."),
                    workers: int = typer.Option(1, "--workers", help="Processes labelling scenarios (the data set is "
                                                "the same for any number)."),
                    json_out: bool = JsonFlag) -> None:
    """Sample scenarios, random valid plans, planner plans and neighbours; label them with the simulator (seeded)."""
    import time

    from hetpart.costmodel.learned.dataset import DatasetConfig, build_dataset, save_dataset
    from hetpart.errors import SpecError

    if not 2 <= max_devices <= 4096:
        raise SpecError(f"--max-devices: {max_devices} is outside 2 .. 4096")
    if not 1 <= workers <= 256:
        raise SpecError(f"--workers: {workers} is outside 1 .. 256")
    names = _planner_names(planners)
    _check_out(out, "dataset.pt")
    for flag, value, low in (("--scenarios", scenarios, 1), ("--plans-per-scenario", plans_per_scenario, 1),
                             ("--planner-neighbours", planner_neighbours, 0)):
        if value < low:  # the flag the user typed, not the config key behind it
            raise SpecError(f"{flag}: expected a whole number >= {low}, got {value}")
    cfg = DatasetConfig(seed=seed, scenarios=scenarios, plans_per_scenario=plans_per_scenario,
                        max_devices=max_devices, planner_neighbours=planner_neighbours)
    began = time.time()
    update, bar = _progress(json_out, "labelling scenarios")
    with bar:
        records = build_dataset(cfg, update, _planner_plans(names), workers=workers)
    save_dataset(records, cfg, out)
    summary = {"out": str(out), "scenarios": len(records), "plans": sum(len(r["plans"]) for r in records),
               "splits": {s: sum(r["split"] == s for r in records) for s in ("train", "val", "test")},
               "heldout_families": list(cfg.heldout_families), "heldout_shapes": list(cfg.heldout_shapes),
               "workers": workers, "wall_time_s": time.time() - began}
    if json_out:
        emit_json(summary)
        return
    console().print(f"{summary['scenarios']} scenarios, {summary['plans']} labelled plans "
                    f"(train/val/test {summary['splits']}) in {summary['wall_time_s']:.0f} s -> {out}")


def _planner_names(planners: str) -> list[str]:
    """``--planners``: registered planner names, comma-separated ('' for none); an unknown one is refused."""
    from hetpart.errors import PlanError
    from hetpart.policies import available_planners

    names = [p.strip() for p in planners.split(",") if p.strip()]
    known = available_planners()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise PlanError(f"--planners: unknown planner {unknown[0]!r}; use one or more of {', '.join(known)} "
                        "(comma-separated, '' for none)")
    return names


def _planner_plans(names: list[str]):
    """``extra_plans`` for the data set: each planner's plan of the scenario (skipped where it finds none)."""
    if not names:
        return None
    from hetpart.errors import HetpartError
    from hetpart.policies import plan
    from hetpart.workload import Workload

    def extra(scenario, rng):
        workload = Workload(scenario.global_batch, scenario.model.seq_len)
        out = []
        for name in names:
            try:
                out.append(plan(scenario.model, scenario.cluster, workload, name.strip()).plan)
            except HetpartError:
                continue
        return out

    return extra


@costmodel_app.command("train")
def train_command(config: Optional[Path] = typer.Option(None, "--config", help="YAML of training settings."),
                  dataset: Optional[Path] = typer.Option(None, "--dataset", help="Overrides the config's dataset."),
                  out: Optional[Path] = typer.Option(None, "--out", help="Overrides the config's checkpoint path."),
                  tracker: str = typer.Option("tensorboard", "--tracker", help="tensorboard, wandb (offline), null."),
                  device: str = typer.Option("auto", "--device", help="auto (CUDA when torch sees one), cuda or cpu."),
                  json_out: bool = JsonFlag) -> None:
    """Train the surrogate on a data set (resumes an unfinished run of the same config)."""
    from dataclasses import replace

    if out:  # before the training module, which imports torch (seconds)
        _check_out(out, "surrogate.pt", inputs={"--config": config, "--dataset": dataset})
    from hetpart.costmodel.learned.dataset import load_dataset
    from hetpart.costmodel.learned.train import load_train_config, resolve_device, train
    from hetpart.errors import SpecError

    cfg = load_train_config(config)
    cfg = replace(cfg, **({"dataset": str(dataset)} if dataset else {}), **({"out": str(out)} if out else {}))
    # the checkpoint is written over ``out`` every epoch: an ``out`` that is the data set would replace it
    _check_out(Path(cfg.out), "surrogate.pt", "--out" if out else f"{config or 'the default config'}: out",
               inputs={"--config": config, ("--dataset" if dataset else "dataset"): cfg.dataset})
    resolve_device(device)  # a bad --device fails before the data set is read
    if cfg.resume and Path(cfg.out).is_file():  # training resumes from it: a wrong file is refused first
        _check_checkpoint(Path(cfg.out), "--out")
    try:
        data_cfg, records = load_dataset(cfg.dataset)
    except SpecError:
        if not dataset:  # the config named it: say which file and key
            _check_config_path(config, "dataset", cfg.dataset)
        raise
    heldout = {"families": list(data_cfg.get("heldout_families", ())), "shapes": list(data_cfg.get("heldout_shapes", ()))}
    run = _tracker(tracker, cfg)
    update, bar = _progress(json_out, "training")
    try:
        with bar:
            _, report = train(cfg, records, log=run.log if run else None, progress=update, heldout=heldout,
                              device=device)
    finally:
        if run:
            run.finish()
    report = _clean_report(report)
    if json_out:
        emit_json({"checkpoint": cfg.out, "device": str(resolve_device(device)), "report": report})
        return
    _print_report(report, f"checkpoint {cfg.out}")


def _check_config_path(config: Optional[Path], key: str, value: str) -> None:
    """A file a ``costmodel train`` config names (``key``) exists; else one line naming the config and the key.
    Relative paths are read from the working directory, as the shipped config's ``runs/costmodel/...`` are (run
    from the repository root); the error says so where the file sits beside the config instead."""
    from hetpart.errors import SpecError

    if Path(value).is_file():
        return
    where = f"{config}: {key}" if config is not None else f"the default config: {key}"
    beside = config.parent / value if config is not None and not Path(value).is_absolute() else None
    hint = (f"; relative paths are read from the working directory, and {beside} exists: give that path"
            if beside is not None and beside.is_file() else
            f"; build it with 'hetpart costmodel dataset --out {value}' or give --{key} FILE")
    raise SpecError(f"{where}: {value}: no such file{hint}")


def _tracker(kind: str, cfg):
    """The experiment tracker when the experiments layer is installed (the costmodel never imports it)."""
    try:
        from hetpart.experiments.tracking import make_tracker
    except ImportError:
        return None
    return make_tracker(kind, "costmodel/train", cfg.seed, cfg)


_FIGURES = ("error_pct_mean", "error_pct_p90", "tau_mean", "tau_std", "top1_regret_pct")


def _clean_report(report: dict) -> dict:
    """A report whose splits of no scenario hold 0 plans and no figure, and whose undefined figures (a tau of
    scenarios too small to rank, a split with nothing in it) are None: JSON null, never NaN or a made-up 0."""
    import math

    out = {}
    for split, r in report.items():
        if not isinstance(r, dict) or "scenarios" not in r:
            out[split] = _clean_report(r) if isinstance(r, dict) else r
            continue
        r = dict(r)
        if not r["scenarios"]:
            r.update(plans=0, **{k: None for k in _FIGURES})
        out[split] = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()}
    return out


def _print_report(report: dict, title: str) -> None:
    from rich.table import Table

    def fig(value, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    table = Table(title=title)
    for col in ("split", "scenarios", "plans", "error % mean", "error % p90", "tau mean", "tau std", "top-1 regret %"):
        table.add_column(col)
    for split, r in report.items():
        table.add_row(split, str(r["scenarios"]), str(r["plans"]), fig(r["error_pct_mean"], 2),
                      fig(r["error_pct_p90"], 2), fig(r["tau_mean"], 3), fig(r["tau_std"], 3),
                      fig(r["top1_regret_pct"], 2))
    console().print(table)


@costmodel_app.command("evaluate")
def evaluate_command(dataset: Path = typer.Option(Path("runs/costmodel/dataset.pt"), "--dataset",
                                                  help="A data set from 'hetpart costmodel dataset'."),
                     checkpoint: Optional[Path] = typer.Option(None, "--checkpoint",
                                                               help="Surrogate checkpoint (default: the shipped one)."),
                     json_out: bool = JsonFlag) -> None:
    """Score a surrogate against the simulator on every split of a data set."""
    from hetpart.costmodel.learned.dataset import load_dataset
    from hetpart.costmodel.learned.predictor import default_checkpoint
    from hetpart.costmodel.learned.train import evaluate_records, load_checkpoint

    path = checkpoint or default_checkpoint()
    if not Path(path).is_file():
        from hetpart.errors import SpecError

        raise SpecError(f"--checkpoint: {path}: no such file; train one with 'hetpart costmodel train'")
    _check_checkpoint(path)
    model, _ = load_checkpoint(path)
    _, records = load_dataset(dataset)
    splits = {split: [r for r in records if r["split"] == split] for split in ("train", "val", "test")}
    # a split of no scenario is not evaluated: there is nothing to score (evaluate_records would report a plan)
    report = _clean_report({split: evaluate_records(model, part) if part else {"scenarios": 0}
                            for split, part in splits.items()})
    if json_out:
        emit_json({"checkpoint": str(path), "dataset": str(dataset), "report": report})
        return
    _print_report(report, f"{path} on {dataset}")


def _check_out(out: Path, example: str, source: str = "--out", inputs: Optional[dict] = None) -> None:
    """A file can be written at ``out`` and is none of the command's ``inputs`` (flag to path, as
    ``_validate.refuse_input_as_output`` takes them): checked before minutes of work, since the file is written last."""
    from hetpart import _validate
    from hetpart.errors import SpecError

    _validate.refuse_input_as_output(SpecError, out, source, inputs or {})
    if out.is_dir():
        raise SpecError(f"{source}: {out} is a directory; give a file name such as {out / example}")
    _validate.check_creatable(SpecError, out, source, "give a place you can write")


def _check_checkpoint(path: Path, option: str = "--checkpoint") -> None:
    """``path`` is a torch archive (``torch.save``): any other file (JSON, a train-closed head) is named as
    not a checkpoint before torch's unpickler or zip reader fails on it in its own words."""
    from hetpart.costmodel.learned.dataset import is_torch_archive
    from hetpart.errors import SpecError

    if is_torch_archive(path):
        return
    if option == "--out":
        raise SpecError(f"--out: {path} exists and is not a checkpoint written by 'hetpart costmodel train'; give "
                        "a new path (or that checkpoint, to resume its training)")
    raise SpecError(f"{option}: {path}: not a checkpoint written by 'hetpart costmodel train'; give one "
                    "(a head written by 'hetpart costmodel train-closed' is used with --predictor learned)")


@costmodel_app.command("train-closed")
def train_closed_command(dataset: Path = typer.Option(Path("runs/costmodel/dataset.pt"), "--dataset",
                                                      help="A data set from 'hetpart costmodel dataset'."),
                         out: Path = typer.Option(Path("runs/costmodel/closed.npz"), "--out",
                                                  help="Where to write the head (numpy .npz, a few KB)."),
                         epochs: int = typer.Option(60, "--epochs", help="Passes over the training scenarios."),
                         seed: int = typer.Option(0, "--seed", help="Seed of the initialisation and the order."),
                         json_out: bool = JsonFlag) -> None:
    """Fit the closed-form surrogate's learned head (--predictor learned) on a data set's train split."""
    import time

    from hetpart.costmodel.learned.closed import ClosedTrainConfig, record_examples, save_head, train_closed
    from hetpart.costmodel.learned.coverage import training_scale
    from hetpart.costmodel.learned.dataset import load_dataset
    from hetpart.errors import SpecError

    if epochs < 1:
        raise SpecError(f"--epochs: expected a whole number >= 1, got {epochs}")
    _check_out(out, "closed.npz", inputs={"--dataset": dataset})
    began = time.time()
    data_cfg, records = load_dataset(dataset)
    update, bar = _progress(json_out, "composing")
    with bar:
        examples = record_examples(records, update)
    cfg = ClosedTrainConfig(epochs=epochs, seed=seed)
    update, bar = _progress(json_out, "training")
    with bar:
        head, report = train_closed(examples, cfg, update)
    heldout = {"families": list(data_cfg.get("heldout_families", ())), "shapes": list(data_cfg.get("heldout_shapes", ()))}
    meta = {"epochs": epochs, "seed": seed, "dataset": str(dataset), "heldout": heldout,
            "train_scale": training_scale(records),  # the predictor flags a model or cluster outside it
            "report": _clean_report(report), "wall_time_s": time.time() - began}
    report = meta["report"]
    save_head(head, out, meta)
    if json_out:
        emit_json({"out": str(out), **meta})
        return
    _print_report({k: v for k, v in report.items() if k != "composition_only"}, f"head {out}")
    _print_report(report["composition_only"], "the composition alone (no learned correction)")


@costmodel_app.command("correct")
def correct_command(records: Path = typer.Option(..., "--records", help="Run records (hetpart run --out, hetpart loop)."),
                    out: Optional[Path] = typer.Option(None, "--out", help="Write the correction here (JSON); "
                                                       "HETPART_CORRECTION=FILE makes --predictor corrected use it."),
                    features: str = typer.Option("run", "--features", help="run: features of the run as it ran; "
                                                 "plan: of the plan as planned (full model, real cluster)."),
                    json_out: bool = JsonFlag) -> None:
    """Fit the corrected model on measured runs; report its leave-one-out error against the simulator's."""
    import statistics

    from hetpart.costmodel.learned.corrected import fit_correction, leave_one_out, records_training_set
    from hetpart.errors import PlanError
    from hetpart.records import load_records

    if features not in ("run", "plan"):
        raise PlanError(f"--features: unknown {features!r}; use run or plan")
    if out is not None:  # before the fit: writing over the records would lose every run in them
        _check_out(out, "correction.json", inputs={"--records": records})
    xs, rs, emulated = records_training_set(load_records(records), features)  # type: ignore[arg-type]
    if not rs:
        raise PlanError(f"--records: {records} holds no run; give the file 'hetpart run --out' appended to")
    sim, corr = leave_one_out(xs, rs) if len(rs) > 1 else ([], [])
    correction = fit_correction(xs, rs)
    correction.meta.update(features=features, runs=len(rs), emulated_runs=int(sum(emulated)), records=str(records))
    if out is not None:
        correction.save(out)
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    report = {"runs": len(rs), "emulated_runs": int(sum(emulated)), "features": features,
              "leave_one_out_simulator_error_pct": mean(sim), "leave_one_out_corrected_error_pct": mean(corr),
              "linear_term": correction.linear is not None, "ridge": correction.ridge,
              "out": str(out) if out else None}
    if json_out:
        emit_json(report)
        return
    if sim:
        print(f"{len(rs)} runs; leave-one-out step-time error: simulator {mean(sim):.1f}%, corrected {mean(corr):.1f}%")
    trend = (f"a linear term (ridge penalty {correction.ridge:g}, chosen by leave-one-out)" if correction.linear is not None
             else "no linear term (leave-one-out found none better than the simulator)")
    print(f"the correction: {trend}, then a kernel over the runs")
    if out is not None:
        print(f"correction written to {out} (HETPART_CORRECTION={out} hetpart predict ... --predictor corrected)")


def register(app: typer.Typer) -> None:
    app.add_typer(costmodel_app, name="costmodel")
