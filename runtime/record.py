"""A finished run as a :class:`hetpart.records.RunRecord` (the ``hetpart run --out`` JSON line)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetpart.cluster import Cluster, cluster_to_dict
from hetpart.records import (Emulation, Environment, Measured, ModelSpec, Predicted, RankTimes, RunRecord,
                             StageTimes)

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.runtime.launch import PreparedRun, RunOptions
    from hetpart.runtime.measure import Measurement

__all__ = ["run_record", "model_summary", "measured_record", "predicted_record", "environment_record"]


def run_record(prep: "PreparedRun", options: "RunOptions", emulation: dict[str, Any], emu: Cluster | None,
               measured: "Measurement", predicted: dict[str, Any] | None) -> RunRecord:
    """The record of a run prepared as ``prep``, emulated on ``emu`` (None: not emulated)."""
    from hetpart.runtime.launch import run_device
    from hetpart.workload import Workload

    small = prep.run_plan
    workload = Workload(global_batch=small.global_batch, seq_len=small.seq_len, precision=small.precision,
                        recompute=small.recompute)
    return RunRecord(cluster=cluster_to_dict(prep.cluster), model=_model_spec(prep, options), plan=small.to_dict(),
                     original_plan=prep.plan.to_dict(), workload=workload.to_dict(),
                     measured=measured_record(measured), predicted=predicted_record(predicted),
                     emulated=emu is not None, emulation=_emulation(emulation, prep.cluster, emu),
                     environment=environment_record(len(prep.rank_devices), run_device(options, len(prep.rank_devices))),
                     options=options.to_dict())


def _model_spec(prep: "PreparedRun", options: "RunOptions") -> ModelSpec:
    from hetpart.graph.load import resolve_transformer

    spec = prep.model_spec
    resolved = resolve_transformer(spec)
    config_json = None
    if resolved is not None and not resolved[2].startswith("catalog:"):  # a config.json: keep its content
        config_json = json.loads(Path(resolved[2]).read_text())
    run_config = prep.runnable.config
    return ModelSpec(spec=spec, name=prep.full_graph.name, config=resolved[1].to_dict() if resolved else None,
                     config_json=config_json, run_config=run_config.to_dict() if run_config is not None else None,
                     scale=str(options.scale) if run_config is not None else "", impl=prep.runnable.impl,
                     full_num_params=prep.full_graph.num_params, graph=prep.run_graph.summary())


def model_summary(prep: "PreparedRun", options: "RunOptions") -> dict[str, Any]:
    """What ran, for the ``hetpart run --json`` object and its table."""
    graph, arch = prep.run_graph, prep.run_graph.arch or {}
    return {"name": prep.full_graph.name, "spec": prep.model_spec, "scale": str(options.scale),
            "shrunken": not prep.model_spec.startswith("python:"), "full_num_params": prep.full_graph.num_params,
            "num_params": graph.num_params, "num_units": graph.num_units, "seq_len": graph.seq_len,
            "full_seq_len": prep.plan.seq_len, "hidden_size": arch.get("hidden_size"),
            "vocab_size": arch.get("vocab_size"), "num_heads": arch.get("num_heads"), "impl": prep.runnable.impl}


def measured_record(m: "Measurement") -> Measured:
    stages = tuple(StageTimes(replica=s["replica"], stage=s["stage"], layers=tuple(s["layers"]),
                              devices=tuple(s["devices"]), ranks=tuple(s["ranks"]), compute_s=s["compute_s"],
                              comm_s=s["comm_s"], optimizer_s=s["optimizer_s"], idle_s=s["idle_s"])
                   for s in m.stages)
    fields = RankTimes.__dataclass_fields__
    ranks = tuple(RankTimes(**{k: r[k] for k in fields if k in r}) for r in m.ranks)
    return Measured(step_time_s=m.step_time_s, tokens_per_s=m.tokens_per_s, samples_per_s=m.samples_per_s,
                    step_times_s=tuple(m.step_times_s), step_time_std_s=m.step_time_std_s, losses=tuple(m.losses),
                    stages=stages, ranks=ranks, peak_memory_gb=dict(m.peak_memory_gb), memory_method=m.memory_method,
                    steps=m.steps, warmup=m.warmup, rss_peak_delta_gb=dict(m.rss_peak_delta_gb))


def predicted_record(predicted: dict[str, Any] | None) -> Predicted | None:
    """The record of :func:`hetpart.runtime.measure.predict`'s answer."""
    if predicted is None:
        return None
    head = ("step_time_s", "tokens_per_s", "samples_per_s")
    metrics = {k: v for k, v in predicted.items() if k not in head and k not in ("breakdown", "predictor", "provenance")}
    who = predicted["predictor"]
    return Predicted(predictor=who["name"], version=who["version"], step_time_s=predicted["step_time_s"],
                     tokens_per_s=predicted["tokens_per_s"], samples_per_s=predicted["samples_per_s"],
                     metrics=metrics, options=dict(who["options"]))


def _emulation(summary: dict[str, Any], real: Cluster, emu: Cluster | None) -> Emulation | None:
    if emu is None:
        return None
    names = {e.name: r.name for eg, rg in zip(emu.groups, real.groups)
             for (e, _), (r, _) in zip(eg.gpu_counts, rg.gpu_counts)}
    keys = ("time_factor", "peak_tflops", "achieved_tflops", "memory_gbyte_s", "precision")
    details = {k: v for k, v in summary.items() if k not in keys and k != "enabled"}
    return Emulation(time_factor=summary["time_factor"], peak_tflops=summary["peak_tflops"],
                     achieved_tflops=summary["achieved_tflops"], memory_gbyte_s=summary["memory_gbyte_s"],
                     precision=summary["precision"], cluster=cluster_to_dict(emu), gpu_names=names, details=details)


def environment_record(world: int, device: str = "cpu") -> Environment:
    """This machine, now; ``world`` processes (one per device of the plan), on ``device`` (``cuda``: rank ``i`` on
    GPU ``i``, :func:`hetpart.runtime.launch.run_device`)."""
    import torch

    cuda = device == "cuda" and torch.cuda.is_available()
    devices = tuple(torch.cuda.get_device_name(r) for r in range(world)) if cuda else ("cpu",) * world
    backend = "nccl where every member has its own GPU, else gloo" if cuda else "gloo"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Environment(torch=torch.__version__, python=platform.python_version(), host=platform.node(),
                       platform=platform.platform(), devices=devices, cores=cores,
                       backend=backend,
                       time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
