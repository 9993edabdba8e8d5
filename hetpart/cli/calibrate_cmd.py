"""``hetpart calibrate``: measure a profile on the devices at hand (``--profile`` of predict and plan uses it)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hetpart.cli.common import ClusterArg, JsonFlag, console, emit_json

__all__ = ["register", "load_profile_option"]

ProfileOpt = typer.Option(None, "--profile", help="A measured profile ('hetpart calibrate --out'): its entries "
                          "replace the simulator's analytic terms where it has them.")


def calibrate_command(
        ctx: typer.Context,
        cluster: str = ClusterArg,
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Catalog name, path to a HF config.json, or "
                                            "python:MODULE:FUNCTION (not with --speeds-from: the records name it)."),
        out: Path = typer.Option(..., "--out", help="Where to write the profile JSON (with --speeds-from: the cluster "
                                 "YAML with the measured slow:)."),
        speeds_from: Optional[Path] = typer.Option(None, "--speeds-from", help="Run records ('hetpart run --out'): "
                                                   "write CLUSTER with each device's measured speed factor in slow: "
                                                   "(against the fastest device of its type that ran the same units: "
                                                   "data-parallel replicas, an even TP group) instead of a profile."),
        tolerance: float = typer.Option(0.1, "--tolerance", help="With --speeds-from: factors above 1 - this are "
                                        "noise and get no slow: entry."),
        micro_batches: str = typer.Option("1,2,4,8", "--micro-batches", help="Micro-batch sizes to measure, comma-separated."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (default: the model's own, at "
                                              "most 2048, on a GPU; at most 64 on a CPU: entries are interpolated in FLOPs)."),
        precision: Optional[str] = typer.Option(None, "--precision", help="fp32, tf32, bf16 or fp16 (default: bf16 on "
                                                "GPUs that have it, fp32 on a CPU)."),
        scale: Optional[str] = typer.Option(None, "--scale", help="Measure the shrunken model that 'hetpart run --scale' "
                                            "runs (tiny, small or a hidden size)."),
        repeats: Optional[int] = typer.Option(None, "--repeats", help="Most timed repeats per measurement (default 10 on "
                                              "a GPU, 7 on a CPU; at least 3, fewer only when one takes over 3 s)."),
        links: bool = typer.Option(True, "--links/--no-links", help="Also measure p2p and all-reduce between two local processes."),
        tensor_parallel: bool = typer.Option(True, "--tensor-parallel/--no-tensor-parallel", help="Also time each unit "
                                             "kind tensor-parallel over local processes as 'hetpart run' runs it."),
        tp_degrees: Optional[str] = typer.Option(None, "--tp-degrees", help="Tensor-parallel degrees to time, "
                                                 "comma-separated (default: 2, 4 and 8 where there are CUDA devices, "
                                                 "or cores, for a process each)."),
        device: str = typer.Option("auto", "--device", help="auto (CUDA when present, else this CPU), cpu or cuda."),
        import_metis: Optional[Path] = typer.Option(None, "--import-metis", help="Measure nothing: read the per-layer "
                                                    "profiles Metis wrote (DeviceType.NAME_tpT_bsB.json files in this "
                                                    "folder) against --model at --seq-len, as a profile."),
        bind: Optional[str] = typer.Option(None, "--bind", help="With --import-metis: which cluster device types each "
                                           "Metis type prices, e.g. A100=A100-80GB,V100=V100-16GB (default: by name "
                                           "prefix)."),
        json_out: bool = JsonFlag) -> None:
    """Measure per-unit compute, optimizer and link times on the devices at hand; write a profile. With
    --speeds-from: each device's speed factor from the runs' own timings; write the cluster with slow:."""
    import sys

    from hetpart.errors import PlanError

    mode = "speeds" if speeds_from is not None else "metis" if import_metis is not None else "measure"
    _refuse_unused(ctx, mode)
    from hetpart import _validate

    _validate.refuse_input_as_output(PlanError, out, "--out", {"--cluster": cluster, "--model": model,
                                                                 "--speeds-from": speeds_from,
                                                                 "--import-metis": import_metis})
    if mode == "speeds":
        _speeds(cluster, speeds_from, out, tolerance, json_out)
        return
    if model is None:
        raise PlanError("--model: missing; give the model to measure (a catalog name such as gpt2-small), or "
                        "--speeds-from RUNS.jsonl to measure device speeds from run records")
    if mode == "metis":
        _import_metis(cluster, model, import_metis, bind, seq_len, precision, out, json_out)
        return

    try:
        sizes = tuple(int(x) for x in micro_batches.split(",") if x.strip())
    except ValueError:
        raise PlanError(f"--micro-batches: {micro_batches!r}; give whole numbers separated by commas, "
                        "such as 1,2,4,8") from None
    _check_scale(scale)
    _check_seq_len(model, scale, seq_len)
    try:
        degrees = tuple(int(x) for x in tp_degrees.split(",") if x.strip()) if tp_degrees is not None else None
    except ValueError:
        raise PlanError(f"--tp-degrees: {tp_degrees!r}; give whole numbers >= 2 separated by commas, such as 2,4,8") \
            from None
    from hetpart.runtime.calibrate import CalibrateOptions, calibrate_profile

    options = CalibrateOptions(micro_batches=sizes, seq_len=seq_len, precision=precision,
                               scale=int(scale) if scale and scale.strip().isdigit() else scale, repeats=repeats,
                               links=links, tensor_parallel=tensor_parallel, tp_degrees=degrees, device=device)
    _check_writable(out)
    profile = calibrate_profile(cluster, model, options,
                                say=lambda text: print(f"hetpart calibrate: {text}", file=sys.stderr, flush=True))
    profile.save(out)
    summary = {"profile": str(out), "device_types": {k: {"device": v.device, "stand_in": v.stand_in}
                                                     for k, v in profile.device_types.items()},
               "devices": {k: v.description for k, v in profile.devices.items()},
               "compute_entries": len(profile.compute), "link_entries": len(profile.links),
               "model": profile.model, "wall_time_s": profile.meta.get("wall_time_s")}
    _report(summary, json_out, [f"profile written to {out}: {len(profile.compute)} compute and {len(profile.links)} "
                                f"link entries in {profile.meta.get('wall_time_s')} s"]
            + [f"  {t}: " + (f"priced as {profile.devices[b.device].description} (a stand-in)" if b.stand_in
                             else f"measured on {profile.devices[b.device].description}")
               for t, b in profile.device_types.items()])


_OPTION_FLAGS = {"model": "--model", "speeds_from": "--speeds-from", "tolerance": "--tolerance",
                 "micro_batches": "--micro-batches", "seq_len": "--seq-len", "precision": "--precision",
                 "scale": "--scale", "repeats": "--repeats", "links": "--links/--no-links",
                 "tensor_parallel": "--tensor-parallel/--no-tensor-parallel", "tp_degrees": "--tp-degrees",
                 "device": "--device", "import_metis": "--import-metis", "bind": "--bind"}
"""Each mode-specific option (parameter name -> its flags), in the order of ``--help``."""
_MODE_OPTIONS = {
    "speeds": ("calibrate --speeds-from (it reads device speeds from run records and measures nothing; the records name "
               "the model)", {"speeds_from", "tolerance"}),
    "metis": ("calibrate --import-metis (it reads Metis' profiles and measures nothing)",
              {"model", "import_metis", "bind", "seq_len", "precision"}),
    "measure": ("calibrate measuring (neither --speeds-from nor --import-metis)",
                {"model", "micro_batches", "seq_len", "precision", "scale", "repeats", "links", "tensor_parallel",
                 "tp_degrees", "device"}),
}
"""Mode -> (what it is, for the error; the options it uses)."""


def _refuse_unused(ctx: typer.Context, mode: str) -> None:
    """Options given on the command line that ``mode`` does not use are refused, never silently ignored."""
    from typer._click.core import ParameterSource  # typer vendors click since 0.20

    from hetpart.errors import PlanError

    what, used = _MODE_OPTIONS[mode]
    given = [flag.split("/")[0 if ctx.params.get(name) else 1] if "/" in flag else flag
             for name, flag in _OPTION_FLAGS.items() if name not in used
             and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)]
    if given:
        verb = "does" if len(given) == 1 else "do"
        raise PlanError(f"{', '.join(given)}: {verb} not apply to {what}; leave "
                        f"{'it' if len(given) == 1 else 'them'} out")


def _check_seq_len(model: str, scale: Optional[str], seq_len: Optional[int]) -> None:
    """``--seq-len`` fits the model that will be measured (full size or shrunk by ``--scale``), said before torch
    loads and anything is measured."""
    from hetpart.graph.load import resolve_transformer
    from hetpart.graph.scales import check_seq_len

    resolved = resolve_transformer(model) if seq_len is not None and seq_len >= 1 else None
    if resolved is not None:
        name, config, _ = resolved
        check_seq_len(seq_len, name, config.max_positions,
                      int(scale) if scale and scale.strip().isdigit() else scale)


def _check_scale(scale: Optional[str]) -> None:
    """``--scale`` as a hidden size is in the runtime's range (its own error names run's --hidden-size)."""
    from hetpart.errors import PlanError

    if scale is not None and scale.strip().lstrip("+-").isdigit() and not 8 <= int(scale) <= 65536:
        raise PlanError(f"--scale: {scale} is outside 8..65536; give tiny, small or a hidden size such as 128")


def _report(summary: dict, json_out: bool, lines: list[str]) -> None:
    """The summary as one JSON object (``--json``), else the lines for people."""
    if json_out:
        emit_json(summary)
        return
    con = console()
    for line in lines:
        con.print(line)


def _import_metis(cluster: str, model: str, folder: Path, bind: Optional[str], seq_len: Optional[int],
                  precision: Optional[str], out: Path, json_out: bool) -> None:
    """``--import-metis``: Metis' per-layer profiles as a hetpart profile (:mod:`hetpart.costmodel.profile_import`)."""
    from hetpart import load_cluster, load_model
    from hetpart.costmodel.profile_import import import_metis
    from hetpart.errors import PlanError
    from hetpart.vocabulary import PRECISIONS

    precision = precision or "bf16"
    if precision not in PRECISIONS:
        raise PlanError(f"--precision: {precision!r}; use one of {', '.join(PRECISIONS)} (the one Metis ran)")
    pairs: dict[str, list[str]] = {}
    for item in (bind or "").split(","):
        if not item.strip():
            continue
        kind, sep, device_type = (x.strip() for x in item.partition("="))
        if not sep or not kind or not device_type:
            raise PlanError(f"--bind: {item.strip()!r}; give METIS_TYPE=CLUSTER_TYPE pairs separated by commas, "
                            "such as A100=A100-80GB")
        pairs.setdefault(kind, []).append(device_type)
    _check_writable(out)
    graph = load_model(model, seq_len=seq_len, precision=precision)
    profile = import_metis(folder, graph, load_cluster(cluster), precision, pairs)
    profile.save(out)
    summary = {"profile": str(out), "imported_from": "metis", "files": len(profile.meta["files"]),
               "device_types": {k: v.device for k, v in profile.device_types.items()},
               "compute_entries": len(profile.compute), "model": profile.model, "assumed": profile.meta["assumed"]}
    _report(summary, json_out, [f"profile written to {out}: {len(profile.compute)} compute entries from "
                                f"{summary['files']} Metis file(s), {graph.name} at seq_len {graph.seq_len}, {precision}"]
            + [f"  {t}: measured by Metis as {b.device}" for t, b in profile.device_types.items()])


def _speeds(cluster: str, records_path: Path, out: Path, tolerance: float, json_out: bool) -> None:
    """``--speeds-from``: the measured factors of the records, written into the cluster file as ``slow:``."""
    import sys

    import yaml

    from hetpart.errors import PlanError
    from hetpart.records import iter_records
    from hetpart.runtime.speeds import speed_factors, with_measured_slow

    if not 0 <= tolerance < 1:
        raise PlanError(f"--tolerance: {tolerance}; give a fraction in [0, 1) such as 0.1")
    _check_writable(out, "measured-cluster.yaml")
    records = [(f"{records_path}:{n}", r) for n, r in iter_records(records_path)]
    estimate = speed_factors(records, tolerance, str(records_path))
    # a device with no other of its type in the runs got no factor: its entry in the cluster (if any) stays
    rated = [d.device for d in estimate.devices if d.compared_with]
    data = with_measured_slow(cluster, estimate.slow, rated, estimate, str(records_path))
    kept = data.get("slow") or {}
    out.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
    single = [d.device for d in estimate.devices if d.compared_with and d.runs == 1]
    notes = [f"{', '.join(single)}: each factor rests on a single run record; one run (a busy neighbour) can mark a "
             "healthy GPU slow; append more runs ('hetpart run ... --out "
             f"{records_path}') and calibrate on them all"] if single else []
    unrated = _unrated_note(estimate)
    if unrated:
        notes.append(unrated)
    summary = {"cluster": str(out), "records": estimate.records, "records_cluster": estimate.cluster,
               "tolerance": tolerance, "slow": estimate.slow, "written_slow": kept,
               "devices": [{"device": d.device, "gpu": d.gpu, "tflops": d.tflops, "factor": d.factor,
                            "compared_with": d.compared_with, "runs": d.runs, "unrated": d.unrated or None}
                           for d in estimate.devices],
               "notes": notes}
    for note in notes:
        print(f"hetpart: note: {note}", file=sys.stderr)
    if json_out:
        emit_json(summary)
        return
    con = console()
    con.print(f"cluster written to {out} from {estimate.records} run record(s): slow: {kept or 'none'}"
              + (f" (measured: {estimate.slow})" if estimate.slow and estimate.slow != kept else ""))
    for d in estimate.devices:
        why = "ran other work than its type's other devices" if d.unrated == "unlike_work" else "only device of its type"
        note = "" if d.compared_with else (f" ({why}: no factor measured; keeps the cluster's {kept[d.device]})"
                                           if d.device in kept else f" ({why}: no factor)")
        note += " (1 run)" if d.compared_with and d.runs == 1 else ""
        con.print(f"  {d.device} {d.gpu}: {d.tflops:.4f} TFLOPS measured, factor {d.factor:.2f}{note}")


def _unrated_note(estimate) -> str:
    """One line naming the devices the records could not rate, and why ("" when all were rated)."""
    unlike = [d.device for d in estimate.devices if d.unrated == "unlike_work"]
    alone = [d.device for d in estimate.devices if d.unrated == "only_of_type"]
    if not unlike:  # a device alone of its type is said on its own line; a note only with unlike work
        return ""
    why = [f"{', '.join(unlike)}: in every record the other devices of their type ran other work (another pipeline "
           "stage's units, another tensor-parallel slice), which runs at another efficiency on the same GPU"]
    if alone:
        why.append(f"{', '.join(alone)}: the only device of its type in the records")
    return (f"not rated, no factor written (the cluster's own entries kept): {'; '.join(why)}; rate them from runs "
            "where devices of a type run the same units (data-parallel replicas, an even tensor-parallel group)")


def _check_writable(out: Path, example: str = "profile.json") -> None:
    from hetpart.errors import PlanError

    parent = out.resolve().parent
    if out.is_dir():
        raise PlanError(f"--out: {out} is a directory; give a file name such as {example}")
    if not parent.is_dir():
        raise PlanError(f"--out: {parent} does not exist; create it or give another path")


def load_profile_option(path: Optional[Path], predictor: Optional[str] = None):
    """The profile of ``--profile`` (None when not given); only the simulator takes one."""
    if path is None:
        return None
    from hetpart.costmodel.predictor import default_predictor
    from hetpart.costmodel.profile import load_profile
    from hetpart.errors import PlanError

    if (predictor or default_predictor()) != "simulator":
        raise PlanError(f"--profile: the {predictor or default_predictor()!r} predictor takes no profile; use "
                        "--predictor simulator (the profile replaces its analytic terms)")
    return load_profile(path)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_command)
