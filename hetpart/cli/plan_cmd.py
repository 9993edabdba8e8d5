"""``hetpart plan``, ``hetpart predict``, ``hetpart show`` and ``hetpart demo``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer

from hetpart.cli.calibrate_cmd import ProfileOpt, load_profile_option
from hetpart.cli.common import (AttentionOpt, ClusterArg, GlobalBatch, JsonFlag, ModelArg, OptimizerOpt, OverlapGradOpt,
                                OffloadOpt, OverlapP2POpt, Precision, RecomputeOpt, SeqLen, ZeroOpt, console, emit_json,
                                engine_options, resolve_precision, workload_from)

__all__ = ["register"]

FullOpt = typer.Option(False, "--full", help="List every replica (identical ones are collapsed into one 'xN' row set).")
PlannerOpt = typer.Option("search", "--planner", help="A registered planner: search, proportional, uniform (policy once "
                          "the learned policy is built).")
PredictorOpt = typer.Option(None, "--predictor", help="What prices plans: simulator (learned once the learned cost model "
                            "is built); default: the registry's default.")
DEMO = {"model": "gpt2-xl", "cluster": "a100-v100-16", "global_batch": 256, "seq_len": 1024}
"""The bundled heterogeneous example of ``hetpart demo`` (one A100 node + one V100 node)."""


def _spec(arg: str) -> str:
    """A --model/--cluster argument that still resolves from another directory."""
    path = Path(arg)
    return str(path.resolve()) if not arg.startswith("python:") and path.exists() else arg


def _load(model: str, cluster: str, seq_len: int | None, precision: str | None, devices=None,
          precision_source: str = "--precision", seq_len_source: str = "--seq-len"):
    """The model and cluster; ``seq_len`` None takes the model's own (at most 2048), ``precision`` None
    the best that every device in use (``devices``, default the whole cluster) supports."""
    from hetpart import load_cluster, load_model

    cl = load_cluster(cluster)
    used = [cl.device(d) for d in devices if cl.has_device(d)] if devices is not None else cl.devices
    precision = resolve_precision(precision, {d.gpu for d in used}, precision_source)
    return (load_model(model, seq_len=seq_len, precision=precision, seq_len_source=seq_len_source, exact_seq_len=True),
            cl, precision)


def _metrics_line(metrics: dict[str, Any]) -> str:
    mem = ", ".join(f"{k} {v:.1f} GB" for k, v in metrics["peak_memory_gb"].items())
    host = (f", host memory {metrics['host_memory_gb']:.1f} of {metrics['host_capacity_gb']:.0f} GB per node"
            if "host_memory_gb" in metrics else "")
    return (f"step {metrics['step_time_s']:.3f} s, {metrics['tokens_per_s']:,.0f} tokens/s, MFU "
            f"{metrics['mfu'] * 100:.1f}%, bubble {max(0.0, metrics['bubble_fraction']) * 100:.1f}%, peak memory "
            f"{mem}{host}")


def plan_command(model: str = ModelArg, cluster: str = ClusterArg, global_batch: int = GlobalBatch,
                 seq_len: Optional[int] = SeqLen, precision: Optional[str] = Precision, recompute: str = RecomputeOpt,
                 zero: Optional[int] = ZeroOpt, offload: Optional[str] = OffloadOpt, optimizer: str = OptimizerOpt,
                 attention: str = AttentionOpt, planner: str = PlannerOpt, predictor: Optional[str] = PredictorOpt,
                 out: Optional[Path] = typer.Option(None, "--out", help="Write the plan JSON here."),
                 profile_path: Optional[Path] = ProfileOpt,
                 policy_checkpoint: Optional[Path] = typer.Option(
                     None, "--policy-checkpoint", help="With --planner policy: a checkpoint 'hetpart train-policy' "
                     "wrote (its config's out) instead of the shipped one."),
                 overlap_p2p: bool = OverlapP2POpt, overlap_grad_reduce: bool = OverlapGradOpt,
                 full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Plan the training of MODEL on CLUSTER and compare with the upper bound."""
    from hetpart.policies import get_planner, plan, upper_bound

    get_planner(planner)  # an unknown planner fails before the model loads
    planner_options = _policy_checkpoint(policy_checkpoint, planner)
    workload_from(global_batch, 1, "bf16", recompute, zero, optimizer, attention, offload)  # bad options fail early
    profile = load_profile_option(profile_path, predictor)
    precision_given = precision is not None
    graph, cl, precision = _load(model, cluster, seq_len, precision)
    workload = workload_from(global_batch, graph.seq_len, precision, recompute, zero, optimizer, attention, offload)
    options = ({"profile": profile} if profile is not None else {}) | engine_options(overlap_p2p, overlap_grad_reduce)
    with _status(json_out, f"planning {graph.name} on {cl.name} ({cl.num_devices} GPUs) with {planner}"):
        chosen_predictor = _predictor(predictor, graph, cl, workload, options)
        result = plan(graph, cl, workload, planner, predictor=chosen_predictor, **planner_options)
        if workload.offload == "auto":  # the bound of the offload the plan settled on
            workload = replace(workload, offload=result.plan.offload)
        bound = upper_bound(graph, cl, workload, predictor=predictor, predictor_options=options)
    chosen = replace(result.plan, meta=result.plan.meta | {"model": _spec(model), "cluster": _spec(cluster)})
    result = replace(result, plan=chosen)
    if out is not None:
        _write_plan(chosen, out)
    payload = result.to_dict() | {"upper_bound": bound, "provenance": result.prediction.provenance}
    if json_out:
        emit_json(payload)
        return
    con = console()
    con.print(_workload_line(workload, graph, cl, seq_len is None, precision_given))
    con.print(chosen.table(cl, graph, full=full))
    con.print(f"{planner}: {_metrics_line(result.prediction.metrics)}")
    _provenance_lines(con, result.prediction.provenance)
    pct = result.prediction.tokens_per_s / bound["tokens_per_s"] * 100
    con.print(f"upper bound {bound['tokens_per_s']:,.0f} tokens/s ({pct:.1f}% reached); roofline "
              f"{bound['roofline_tokens_per_s']:,.0f} tokens/s; planned in {result.wall_time_s:.2f} s"
              + (f"; plan written to {out}" if out else ""))


def _policy_checkpoint(path: Optional[Path], planner: str) -> dict[str, Any]:
    """The policy planner's ``checkpoint`` option, loaded here so that a wrong file is refused before planning."""
    from hetpart.errors import HetpartError, PlanError

    if path is None:
        return {}
    if planner != "policy":
        raise PlanError(f"--policy-checkpoint: only --planner policy uses a checkpoint (not {planner!r}); add "
                        "--planner policy or leave the checkpoint out")
    if not path.is_file():
        raise PlanError(f"--policy-checkpoint: {path}: no such file; give the checkpoint 'hetpart train-policy' "
                        "wrote (the 'out' of its config)")
    from hetpart.policies.policy_planner import load_policy

    try:
        load_policy(str(path.resolve()))
    except HetpartError:
        raise
    except Exception as exc:  # a zip SB3 cannot read, or no zip at all: its error names no file
        raise PlanError(f"--policy-checkpoint: {path}: not a policy checkpoint ({exc.__class__.__name__}: "
                        f"{' '.join(str(exc).split())[:120]}); give a file 'hetpart train-policy' wrote") from None
    return {"checkpoint": str(path.resolve())}


def _predictor(name, graph, cl, workload, options: dict):
    """The predictor by name, built with ``options`` (a profile, engine options); just the name when there
    are none: planners take the registry's default themselves."""
    if not options:
        return name
    from hetpart.costmodel.predictor import get_predictor

    return get_predictor(name or "simulator", graph, cl, workload, **options)


def _memory_line(breakdown: list[dict]) -> str | None:
    """The tightest device group's peak memory and what holds it (:meth:`Simulator._memory_parts_gb`), or None
    where the predictor gives no parts."""
    rows = [b for b in breakdown or () if b.get("memory_parts_gb") and b.get("capacity_gb")]
    if not rows:
        return None
    row = max(rows, key=lambda b: b["memory_gb"] / b["capacity_gb"])
    p = row["memory_parts_gb"]
    return (f"  tightest: {row['gpu']} (replica {row['replica']}, stage {row['stage']}) holds {row['memory_gb']:.1f} "
            f"of {row['capacity_gb']:.1f} GB usable: weights {p['weights']:.1f}, gradients {p['gradients']:.1f}, "
            f"optimizer states {p['optimizer_states']:.1f}, activations and working set "
            f"{p['activations_and_working_set']:.1f}")


def _provenance_lines(con, provenance: dict) -> None:
    """One line per device type: where its compute came from and its error band."""
    for gpu, p in (provenance or {}).get("device_types", {}).items():
        band = p.get("error_band", {})
        lo, hi = band.get("signed_pct", [None, None])
        what = p["compute"] + (" on a stand-in: " + p["measured_on"] if p.get("stand_in") else
                               (" on " + p["measured_on"] if p.get("measured_on") else f" ({p['curve']})"))
        trust = (f"error band {lo:+.0f}% to {hi:+.0f}% (mean {band['mean_abs_pct']:.0f}% over {band['rows']} rows)"
                 if band.get("rows") else "no validation rows yet")
        con.print(f"  {gpu}: compute {what}; {trust}")


def _workload_line(workload, graph, cl, seq_default: bool, precision_given: bool) -> str:
    """The workload with where each default came from (the model's positions, the devices' precisions)."""
    seq = f"seq {workload.seq_len}"
    if seq_default:
        seq += f" ({graph.name}'s own maximum, at most 2048; --seq-len to change)"
    prec = workload.precision
    if not precision_given:
        lacking = sorted({g.name for g in (d.gpu for d in cl.devices) if not g.supports_bf16})
        prec += f" ({', '.join(lacking)} lack bf16)" if lacking else " (every device has bf16)"
    return (f"workload: global batch {workload.global_batch} x {seq}, {prec}, recompute {workload.recompute}, "
            f"{workload.optimizer}, {workload.attention} attention")


def _status(quiet: bool, message: str):
    """A spinner on stderr while planning (nothing with --json)."""
    from contextlib import nullcontext

    from rich.console import Console

    return nullcontext() if quiet else Console(stderr=True).status(message)


def _write_plan(plan, out: Path) -> None:
    from hetpart.errors import PlanError

    try:
        plan.save(out)
    except OSError as exc:
        raise PlanError(f"--out: cannot write {out} ({exc.strerror or exc}); check the directory") from None


def _plan_from_args(graph, cl, workload, plan_path, tp, pp, dp, micro_batch, schedule, interleave, order=None, cp=None):
    from hetpart.costmodel.megatron import megatron_plan
    from hetpart.errors import PlanError

    if plan_path is not None:
        from hetpart.plan import load_plan

        return load_plan(plan_path)
    missing = [name for name, value in (("--tp", tp), ("--pp", pp), ("--dp", dp), ("--micro-batch", micro_batch))
               if value is None]
    if missing:
        raise PlanError(f"predict: {', '.join(missing)} missing; give --plan plan.json or all of --tp --pp --dp "
                        "--micro-batch")
    from hetpart.costmodel.megatron import DEFAULT_ORDER

    _check_tp_flag(graph, tp)
    return megatron_plan(graph, cl, workload, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, schedule=schedule,
                         interleave=interleave, recompute=workload.recompute, order=order or DEFAULT_ORDER,
                         **({"cp": cp} if cp is not None else {}))


def _stated_precision(plan, plan_path) -> str | None:
    """The plan file's precision, or None where it names none (the devices' default then applies, as for
    ``--precision`` left out: fp16 beside V100s, where the plan's own default, bf16, is refused)."""
    from hetpart.plan import states_precision

    return plan.precision if plan_path is None or states_precision(plan_path) else None


def _check_tp_flag(graph, tp) -> None:
    """``--tp`` against the sizes a TP degree must divide (:func:`hetpart.rules.tp_divisors`), answered with the
    degrees that divide them all."""
    from hetpart.errors import PlanError
    from hetpart.rules import tp_divisors

    sizes = tp_divisors(graph)
    if not sizes or isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return  # megatron_plan says what is wrong
    failing = [f"the {n} {what[:-1] if n == 1 and what.endswith('s') else what}" for what, n in sizes.items()
               if n % tp]
    if failing:
        valid = [d for d in range(1, min(sizes.values()) + 1) if all(n % d == 0 for n in sizes.values())]
        choice = f"one of {', '.join(map(str, valid))}" if len(valid) > 2 else " or ".join(map(str, valid))
        what = failing[0] if len(failing) == 1 else f"{', '.join(failing[:-1])} or {failing[-1]}"
        raise PlanError(f"--tp: {tp} does not divide {what} of {graph.name}; use {choice}")


def _from_plan_meta(plan_path: Optional[Path], model: Optional[str], cluster: Optional[str]) -> tuple[str, str, Any]:
    """Model and cluster from the options or, failing that, from the plan's meta."""
    from hetpart.errors import PlanError
    from hetpart.plan import load_plan

    plan = load_plan(plan_path) if plan_path is not None else None
    meta = plan.meta if plan is not None else {}
    model = model or meta.get("model")
    cluster = cluster or meta.get("cluster")
    if not model or not cluster:
        what = "--model" if not model else "--cluster"
        raise PlanError(f"{plan_path or 'predict'}: {what} missing and the plan does not record it; give {what}")
    return str(model), str(cluster), plan


def predict_command(
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the plan's meta.model)."),
        cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster (default: the plan's meta.cluster)."),
        global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per step (default: the plan's, else 512)."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (default: the plan's, else 2048)."),
        precision: Optional[str] = typer.Option(None, "--precision", help="bf16, fp16, fp32, tf32 or fp8 (default: the plan's, else bf16; fp8 on Hopper, Ada and MI300 only)."),
        recompute: Optional[str] = typer.Option(None, "--recompute", help="none, selective or full (default: the plan's, else selective)."),
        zero: Optional[int] = ZeroOpt, offload: Optional[str] = OffloadOpt,
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam, sgd or adam8bit (default: the plan's, else adam)."),
        attention: Optional[str] = typer.Option(None, "--attention", help="fused or eager (default: the plan's, else fused)."),
        plan_path: Optional[Path] = typer.Option(None, "--plan", help="A plan JSON written by 'hetpart plan --out'."),
        tp: Optional[int] = typer.Option(None, "--tp"), pp: Optional[int] = typer.Option(None, "--pp"),
        dp: Optional[int] = typer.Option(None, "--dp"),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch"),
        schedule: str = typer.Option("1f1b", "--schedule", help="1f1b, gpipe or interleaved."),
        interleave: int = typer.Option(1, "--interleave", help="Model chunks per device (interleaved)."),
        order: Optional[str] = typer.Option(None, "--order", help="Rank order of the --tp --pp --dp grid, innermost "
                                            "first: tp-dp-pp (Megatron-LM's, the default) or tp-pp-dp; with --cp, "
                                            "context parallelism sits next to tp (tp-cp-dp-pp, Megatron-Core's)."),
        cp: Optional[int] = typer.Option(None, "--cp", help="Context parallelism of the grid: each stage splits every "
                                         "sequence over cp tensor-parallel groups (ring attention, Megatron-Core's "
                                         "scheme; prediction only). Default 1."),
        predictor: Optional[str] = PredictorOpt,
        records: Optional[Path] = typer.Option(None, "--records", help="Re-predict every run record of this file "
                                               "('hetpart run --out'); one JSON line each with --json."),
        plans_path: Optional[Path] = typer.Option(None, "--plans", help="Score many plans: a JSONL file, one plan "
                                                  "per line; prints one JSON line per plan (with --json)."),
        jobs: int = typer.Option(0, "--jobs", min=0, help="With --plans: processes that score plans side by side "
                                 "(0: one per core; the simulator only, on Linux; answers stay in the file's "
                                 "order and do not depend on it)."),
        profile_path: Optional[Path] = ProfileOpt,
        overlap_p2p: bool = OverlapP2POpt, overlap_grad_reduce: bool = OverlapGradOpt,
        full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Predict step time, throughput and memory of a plan (a file, or the Megatron grid of --tp --pp --dp)."""
    from hetpart.costmodel.predictor import check_predictor_name, get_predictor

    check_predictor_name(predictor)  # an unknown predictor fails before the model loads
    profile = load_profile_option(profile_path, predictor)
    if records is not None:
        from hetpart.cli.records_cmd import predict_records

        return predict_records(records, predictor, json_out)
    if plans_path is not None:
        _predict_batch(plans_path, plan_path, model, cluster, global_batch, seq_len, precision, predictor, json_out,
                       profile, engine_options(overlap_p2p, overlap_grad_reduce), jobs)
        return
    model, cluster, plan = _from_plan_meta(plan_path, model, cluster)
    where = f"{plan_path}: " if plan is not None else ""
    if plan is not None and seq_len is not None and seq_len != plan.seq_len:
        from hetpart.errors import PlanError

        raise PlanError(f"--seq-len: {seq_len} but {plan_path} was planned for {plan.seq_len} tokens; drop --seq-len "
                        f"(the plan's is used) or plan for {seq_len} ('hetpart plan ... --seq-len {seq_len}')")
    graph, cl, precision = _load(model, cluster, seq_len or (plan.seq_len if plan else None),
                                 precision or (_stated_precision(plan, plan_path) if plan else None),
                                 devices=plan.devices if plan else None,
                                 precision_source="--precision" if precision or not plan else f"{where}precision",
                                 seq_len_source="--seq-len" if seq_len or not plan else f"{where}seq_len")
    optimizer = optimizer or (plan.optimizer if plan else "adam")
    attention = attention or (plan.attention if plan else "fused")
    if offload == "auto":
        from hetpart.errors import WorkloadError

        raise WorkloadError("--offload: 'auto' lets a planner choose ('hetpart plan --offload auto'); predict prices "
                            "one plan: give none, optimizer or full")
    offload = offload or (plan.offload if plan else "none")
    workload = workload_from(global_batch or (plan.global_batch if plan else 512), graph.seq_len, precision,
                             recompute or (plan.recompute if plan else "selective"), zero, optimizer, attention, offload)
    if plan is not None and (order is not None or cp is not None):
        from hetpart.errors import PlanError

        flag = "--order" if order is not None else "--cp"
        raise PlanError(f"{flag}: {plan_path} already places its ranks; {flag} applies to the --tp --pp --dp grid"
                        + (" (a plan file sets its context parallelism in its 'cp' field)" if flag == "--cp" else ""))
    if plan is not None:  # the options override what the plan file says
        plan = replace(plan, optimizer=workload.optimizer, attention=workload.attention, precision=workload.precision,
                       **({"recompute": recompute} if recompute in ("none", "selective", "full") else {}))
    plan = plan or _plan_from_args(graph, cl, workload, None, tp, pp, dp, micro_batch, schedule, interleave, order, cp)
    if zero is not None and plan.zero != zero:
        plan = replace(plan, zero=zero, **({"shard_fractions": None, "shard_group": 0} if zero == 0 else {}))
    if plan.offload != offload:
        plan = replace(plan, offload=offload)
    if plan_path is not None and recompute is None:
        workload = workload_from(workload.global_batch, workload.seq_len, workload.precision, plan.recompute, zero,
                                 workload.optimizer, workload.attention, offload)
    chosen = get_predictor(predictor, graph, cl, workload, **({"profile": profile} if profile is not None else {}),
                           **engine_options(overlap_p2p, overlap_grad_reduce))
    from hetpart.errors import PlanError

    if plan_path is not None:  # the rules broken by a plan file name the file, not a literal "plan"
        plan.check(graph, cl, str(plan_path))
    try:
        prediction = chosen.predict(plan, workload, validate=True)
    except PlanError as exc:  # found while pricing it (two zones without a link an all-reduce crosses)
        if plan_path is None or str(exc).startswith(f"{plan_path}:"):
            raise
        raise PlanError(f"{plan_path}: {exc}") from None
    if json_out:
        answer = {"metrics": prediction.metrics, "predictor": chosen.name, "predictor_version": chosen.version,
                  "breakdown": prediction.breakdown, "provenance": prediction.provenance}
        if "order" in plan.meta and plan.meta.get("planner") == "megatron":
            answer["order"] = plan.meta["order"]  # the rank order of the --tp --pp --dp grid
        emit_json(answer)
        return
    con = console()
    con.print(plan.table(cl, graph, full=full))
    con.print(_metrics_line(prediction.metrics) + ("" if prediction.fits_in_memory else " - DOES NOT FIT in memory"))
    line = None if prediction.fits_in_memory else _memory_line(prediction.breakdown)
    if line:
        con.print(line, highlight=False)
    _provenance_lines(con, prediction.provenance)


def _predict_batch(plans_path: Path, plan_path: Optional[Path], model: Optional[str], cluster: Optional[str],
                   global_batch: Optional[int], seq_len: Optional[int], precision: Optional[str],
                   predictor: Optional[str], json_out: bool, profile=None, engine: dict | None = None,
                   jobs: int = 0) -> None:
    """``predict --plans``: one model, cluster and predictor, one answer line per plan, scored by ``jobs``
    forked processes (:func:`hetpart.costmodel.batch.workers_for`)."""
    import json
    import sys

    from hetpart.costmodel.batch import predict_lines
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.errors import PlanError
    from hetpart.plan import Plan

    if plan_path is not None:
        raise PlanError("predict: give --plan or --plans, not both")
    try:
        lines = plans_path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"--plans: cannot read {plans_path} ({exc.__class__.__name__}); give a JSONL file with one "
                        "plan per line") from None
    if not any(line.strip() for line in lines):
        raise PlanError(f"--plans: {plans_path} holds no plans (it is empty or blank); give a JSONL file with one "
                        "plan per line")
    first, stated = None, None
    for number, line in enumerate(lines, 1):  # the first readable plan fills in what the options leave out
        if line.strip():
            try:
                first = Plan.from_json(line, f"{plans_path}:{number}")
                stated = json.loads(line).get("precision")  # absent: the devices choose, as for --precision
                break
            except PlanError:
                continue
    meta = first.meta if first is not None else {}
    model, cluster = model or meta.get("model"), cluster or meta.get("cluster")
    if not model or not cluster:
        what = "--model" if not model else "--cluster"
        raise PlanError(f"{plans_path}: {what} missing and no plan records it; give {what}")
    explicit = global_batch is not None or seq_len is not None
    graph, cl, precision = _load(str(model), str(cluster), seq_len or (first.seq_len if first else None),
                                 precision or stated,
                                 seq_len_source="--seq-len" if seq_len or not first else f"{plans_path}: seq_len")
    workload = workload_from(global_batch or (first.global_batch if first else 512), graph.seq_len, precision, "auto")
    chosen = get_predictor(predictor, graph, cl, workload, **({"profile": profile} if profile is not None else {}),
                           **(engine or {}))
    answers = predict_lines(lines, chosen, workload if explicit else None, str(plans_path), jobs=jobs)
    if json_out:
        for answer in answers:
            sys.stdout.write(json.dumps(answer) + "\n")
        return
    con = console()
    for number, answer in enumerate(answers, 1):
        con.print(f"{number}: " + (_metrics_line(answer["metrics"]) if "metrics" in answer else answer["error"]))


def show_command(plan_path: Path = typer.Argument(..., help="A plan JSON written by 'hetpart plan --out'."),
                 model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the plan's meta.model)."),
                 cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster (default: the plan's meta.cluster)."),
                 gantt: Optional[Path] = typer.Option(None, "--gantt", help="Draw the simulated schedule to this "
                                                      "image (.png, .svg or .pdf)."),
                 html_out: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
                 compare: str = typer.Option("", "--compare",
                                             help="Planners to compare with in the HTML report (e.g. uniform,proportional)."),
                 max_replicas: int = typer.Option(24, "--max-rows", "--max-replicas",
                                                  help="Rows drawn at most in the Gantt chart (identical replicas share rows)."),
                 full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Show a plan as a table, its simulated schedule as a Gantt chart (--gantt) and an HTML report (--html)."""
    from hetpart.costmodel.simulator import simulate
    from hetpart.errors import PlanError

    if max_replicas < 1:
        raise PlanError(f"--max-rows: must be >= 1, got {max_replicas}; give the number of Gantt rows to draw")
    _check_compare(compare)  # an unknown planner fails before the model loads
    _check_image(gantt, "--gantt")
    model, cluster, plan = _from_plan_meta(plan_path, model, cluster)
    graph, cl, precision = _load(model, cluster, plan.seq_len, _stated_precision(plan, plan_path), devices=plan.devices,
                                 precision_source=f"{plan_path}: precision", seq_len_source=f"{plan_path}: seq_len")
    plan = replace(plan, precision=precision)
    plan.check(graph, cl, str(plan_path))  # the file named, as export and predict name it
    prediction = simulate(graph, cl, plan, validate=True, trace=gantt is not None or html_out is not None)
    if gantt is not None:
        from hetpart import plotting

        fig = plotting.gantt_figure(prediction.timeline, plan, cl, title=f"{graph.name} on {cl.name}",
                                    step_time_s=prediction.step_time_s, tokens_per_s=prediction.tokens_per_s,
                                    max_rows=max_replicas)
        _write(lambda: plotting.save_png(fig, gantt), "--gantt", gantt)
    if html_out is not None:
        from hetpart.cli.report_cmd import plan_html

        page = plan_html(plan_path, plan, graph, cl, prediction, compare)
        _write(lambda: html_out.write_text(page), "--html", html_out)
    if json_out:
        emit_json({"plan": plan.to_dict(), "metrics": prediction.metrics, "gantt": str(gantt) if gantt else None,
                   "html": str(html_out) if html_out else None})
        return
    con = console()
    con.print(plan.table(cl, graph, full=full))
    con.print(_metrics_line(prediction.metrics) + (f"; Gantt chart in {gantt}" if gantt else "")
              + (f"; HTML report in {html_out}" if html_out else ""))


IMAGE_FORMATS = (".png", ".svg", ".pdf")
"""What ``show --gantt`` writes (matplotlib picks the format from the extension)."""


def _check_image(path: Optional[Path], option: str) -> None:
    from hetpart.errors import PlanError

    if path is not None and path.suffix.lower() not in IMAGE_FORMATS:
        what = f"unsupported extension {path.suffix!r}" if path.suffix else "no extension"
        raise PlanError(f"{option}: {path}: {what}; give a file ending in {', '.join(IMAGE_FORMATS[:-1])} or "
                        f"{IMAGE_FORMATS[-1]}")


def _check_compare(compare: str) -> None:
    """Every planner named by ``show --compare`` exists (the registry's error names --planner)."""
    from hetpart.errors import PlanError
    from hetpart.policies import get_planner

    for name in (n.strip() for n in compare.split(",") if n.strip()):
        try:
            get_planner(name)
        except PlanError as exc:
            raise PlanError(f"--compare: {str(exc).removeprefix('--planner: ')}") from None


def _write(action, option: str, path: Path) -> None:
    from hetpart.errors import PlanError

    try:
        action()
    except OSError as exc:
        raise PlanError(f"{option}: cannot write {path} ({exc.__class__.__name__}); check the directory") from None


def demo_command(json_out: bool = JsonFlag) -> None:
    """Plan a bundled heterogeneous example with search; compare with the upper bound and Megatron."""
    from hetpart.policies import plan, upper_bound

    graph, cl, precision = _load(DEMO["model"], DEMO["cluster"], DEMO["seq_len"], None)
    workload = workload_from(DEMO["global_batch"], DEMO["seq_len"], precision, "auto")
    with _status(json_out, f"planning {DEMO['model']} on {DEMO['cluster']}"):
        best = plan(graph, cl, workload, "search")
        uniform = plan(graph, cl, workload, "uniform")
        bound = upper_bound(graph, cl, workload)
    tps, base = best.prediction.tokens_per_s, uniform.prediction.tokens_per_s
    summary = {"example": DEMO, "tokens_per_s": tps, "upper_bound_tokens_per_s": bound["tokens_per_s"],
               "pct_upper_bound": tps / bound["tokens_per_s"] * 100, "uniform_tokens_per_s": base,
               "speedup_vs_uniform": tps / base, "search_wall_time_s": best.wall_time_s}
    if json_out:
        emit_json(summary | {"plan": best.plan.to_dict(), "metrics": best.prediction.metrics, "upper_bound": bound})
        return
    con = console()
    con.print(f"[bold]hetpart demo[/bold]: {DEMO['model']} on {DEMO['cluster']} ({cl.num_devices} GPUs: "
              f"{', '.join(cl.gpu_types)}), global batch {DEMO['global_batch']} x {DEMO['seq_len']} tokens")
    con.print(best.plan.table(cl, graph))
    con.print(f"search plan:     {_metrics_line(best.prediction.metrics)} (planned in {best.wall_time_s:.2f} s)")
    con.print(f"upper bound:     {bound['tokens_per_s']:,.0f} tokens/s (sum of each GPU type alone); "
              f"{summary['pct_upper_bound']:.1f}% reached; roofline {bound['roofline_tokens_per_s']:,.0f} tokens/s")
    con.print(f"uniform (Megatron, heterogeneity-unaware): {base:,.0f} tokens/s; "
              f"search is {summary['speedup_vs_uniform']:.2f}x faster")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
    app.command("predict")(predict_command)
    app.command("show")(show_command)
    app.command("demo")(demo_command)
