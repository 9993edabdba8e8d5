"""``hetpart plan``, ``hetpart predict``, ``hetpart show`` and ``hetpart demo``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import typer

from hetpart.cli.calibrate_cmd import ProfileOpt, load_profile_option
from hetpart.cli.common import (AttentionOpt, ClusterArg, GlobalBatch, JsonFlag, ModelArg, OpCountsOpt, OptimizerOpt,
                                OverlapGradOpt, OffloadOpt, OverlapP2POpt, Precision, RecomputeOpt, SeqLen, ZeroOpt, console, emit_json,
                                engine_flags, engine_options, json_text, non_default, resolve_precision,
                                is_plan_text, refuse_replacing, workload_from)

__all__ = ["register"]

FullOpt = typer.Option(False, "--full", help="List every replica (identical ones are collapsed into one 'xN' row set).")
PlannerOpt = typer.Option("search", "--planner", help="A registered planner: search (exact), policy (the trained RL "
                          "planner), proportional, uniform.")
PredictorOpt = typer.Option(None, "--predictor", help="What prices plans: simulator, learned, learned-graph or corrected "
                            "(any registered predictor); default: the registry's default.")
DEMO = {"model": "gpt2-xl", "cluster": "a100-v100-16", "global_batch": 256, "seq_len": 1024}
"""The bundled heterogeneous example of ``hetpart demo`` (one A100 node + one V100 node)."""


def _spec(arg: str) -> str:
    """A --model/--cluster argument that still resolves from another directory (a ``python:`` model loaded
    already: :func:`hetpart.graph.user_module.portable_spec`)."""
    if arg.startswith("python:"):
        from hetpart.graph.user_module import portable_spec

        return portable_spec(arg)
    path = Path(arg)
    return str(path.resolve()) if path.exists() else arg


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


def _priced_by_line(metrics: dict[str, Any], predictor: str) -> str | None:
    """Which model priced a learned predictor's answer, with its spread or why the simulator did; None for the
    simulator's own answers (its provenance lines say the rest)."""
    u = metrics.get("uncertainty")
    if not isinstance(u, dict):
        return None
    by = metrics.get("priced_by", predictor)
    if by == "simulator":
        line = f"  priced by: the simulator ({metrics.get('priced_by_reason', 'deferred by the learned predictor')})"
        if u.get("band"):
            line += f"; {u['band']}"
    else:
        std = u.get("relative_std")
        line = f"  priced by: {by}" + (f" (relative std {std * 100:.2f}%)" if std is not None else "")
        low, high = u.get("step_time_s_low"), u.get("step_time_s_high")
        if low is not None and high is not None:
            line += f"; measured step likely {low:.3f}-{high:.3f} s"
        elif u.get("band"):
            line += "; " + u["band"].split(", within ", 1)[-1]
    if u.get("out_of_distribution"):
        line += "; out of distribution: " + ("; ".join(u.get("out_of_distribution_reasons") or ()) or "no reason given")
    return line


def plan_command(model: str = ModelArg, cluster: str = ClusterArg, global_batch: int = GlobalBatch,
                 seq_len: Optional[int] = SeqLen, precision: Optional[str] = Precision, recompute: str = RecomputeOpt,
                 zero: Optional[int] = ZeroOpt, offload: Optional[str] = OffloadOpt, optimizer: str = OptimizerOpt,
                 attention: str = AttentionOpt, planner: str = PlannerOpt, predictor: Optional[str] = PredictorOpt,
                 out: Optional[Path] = typer.Option(None, "--out", help="Write the plan JSON here."),
                 profile_path: Optional[Path] = ProfileOpt,
                 policy_checkpoint: Optional[Path] = typer.Option(
                     None, "--policy-checkpoint", help="With --planner policy: a checkpoint 'hetpart train-policy' "
                     "wrote (its config's out) instead of the shipped one."),
                 overlap_p2p: Optional[bool] = OverlapP2POpt, overlap_grad_reduce: Optional[bool] = OverlapGradOpt,
                 op_counts: Optional[str] = OpCountsOpt,
                 time_limit: Optional[float] = typer.Option(
                     None, "--time-limit", help="With --planner search: seconds after which it answers with the best "
                     "plan priced so far (default 600; 0: no limit). The JSON's planner.complete says whether it "
                     "visited its whole space."),
                 with_bound: bool = typer.Option(
                     True, "--bound/--no-bound", help="Also compute the upper bound (a search per device type: "
                     "seconds to a minute on 1,024 GPUs, often longer than the policy's plan). --no-bound answers "
                     "with the plan alone; the JSON's upper_bound then holds only the roofline."),
                 full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Plan the training of MODEL on CLUSTER and compare with the upper bound."""
    from hetpart.policies import get_planner, plan, upper_bound
    from hetpart.policies.upper_bound import skipped_bound

    get_planner(planner)  # an unknown planner fails before the model loads
    from hetpart import _validate
    from hetpart.errors import PlanError

    _validate.refuse_input_as_output(PlanError, out, "--out", {"--model": model, "--cluster": cluster,
                                                               "--profile": profile_path,
                                                               "--policy-checkpoint": policy_checkpoint})
    refuse_replacing(out, "--out", "hetpart plan --out", "a plan JSON", is_plan_text)
    planner_options = _policy_checkpoint(policy_checkpoint, planner) | _time_limit(time_limit, planner)
    workload_from(global_batch, 1, "bf16", recompute, zero, optimizer, attention, offload)  # bad options fail early
    profile = load_profile_option(profile_path, predictor)
    precision_given = precision is not None
    graph, cl, precision = _load(model, cluster, seq_len, precision)
    workload = workload_from(global_batch, graph.seq_len, precision, recompute, zero, optimizer, attention, offload)
    options = ({"profile": profile} if profile is not None else {}) | engine_options(overlap_p2p, overlap_grad_reduce,
                                                                                     op_counts)
    with _status(json_out, f"planning {graph.name} on {cl.name} ({cl.num_devices} GPUs) with {planner}"):
        chosen_predictor = _predictor(predictor, graph, cl, workload, options)
        result = plan(graph, cl, workload, planner, predictor=chosen_predictor, **planner_options)
        if workload.offload == "auto":  # the bound of the offload the plan settled on
            workload = replace(workload, offload=result.plan.offload)
        bound = (upper_bound(graph, cl, workload, predictor=predictor, predictor_options=options,
                             time_limit_s=planner_options.get("time_limit_s")) if with_bound
                 else skipped_bound(graph, cl, workload))
    priced = engine_options(overlap_p2p, overlap_grad_reduce, op_counts)  # what priced it, where not the defaults
    from hetpart.cli.recorded import profile_record

    chosen = replace(result.plan, meta=result.plan.meta | {"model": _spec(model), "cluster": _spec(cluster)}
                     | ({"engine": priced} if priced else {}) | {"cluster_digest": cluster_digest(cl)}
                     | ({"profile": profile_record(profile_path)} if profile is not None else {}))
    result = replace(result, plan=chosen)
    if out is not None:
        _write_plan(chosen, out)
    _note_cpu_only(chosen)
    if zero and chosen.zero != zero and chosen.dp * chosen.cp == 1:  # the plan file would say 0 without a word
        import sys

        print(f"hetpart: note: --zero {zero}: the plan has one replica, nothing to shard the states over; it keeps "
              f"zero: {chosen.zero}", file=sys.stderr)
    from hetpart.policies.idle import idle_devices, idle_lines

    payload = result.to_dict() | {"upper_bound": bound, "provenance": result.prediction.provenance,
                                  "idle": idle_devices(chosen, cl)}
    if json_out:
        emit_json(payload)
        return
    con = console()
    con.print(_workload_line(workload, graph, cl, seq_len is None, precision_given))
    con.print(chosen.table(cl, graph, full=full))
    con.print(f"{planner}: {_metrics_line(result.prediction.metrics)}")
    for line in idle_lines(chosen, cl):
        con.print(line, highlight=False)
    if result.evaluation.get("checkpoint"):
        con.print(f"  policy checkpoint: {result.evaluation['checkpoint']}", highlight=False)
    priced = _priced_by_line(result.prediction.metrics, predictor or "")
    if priced:
        con.print(priced, highlight=False)
    _provenance_lines(con, result.prediction.provenance)
    if result.evaluation.get("complete") is False:
        limit = result.evaluation.get("time_limit_s", 0) or 0
        past = (f"; it answered at {result.wall_time_s:.1f} s: the policy's walk, the floor a cut-short search keeps, "
                "always runs whole" if planner == "search" and result.wall_time_s > 1.2 * limit + 0.5 else "")
        con.print(f"{planner} stopped at its time limit ({limit:.0f} s) before visiting its whole space: the plan is "
                  f"the best it priced (--time-limit 0 lets it finish){past}")
    if bound["tokens_per_s"] is None:
        head = "upper bound not computed (--no-bound)"
    else:
        pct = result.prediction.tokens_per_s / bound["tokens_per_s"] * 100
        cut = "" if bound.get("complete", True) else " (its searches cut short by --time-limit: not a bound)"
        head = f"upper bound {bound['tokens_per_s']:,.0f} tokens/s{cut} ({pct:.1f}% reached)"
    con.print(f"{head}; roofline {bound['roofline_tokens_per_s']:,.0f} tokens/s; planned in {result.wall_time_s:.2f} s"
              + (f"; plan written to {out}" if out else ""))


def cluster_digest(cluster) -> str:
    """A short digest of what prices a plan on ``cluster`` (its node groups, zone links and speed factors; not its
    name or where it was read from)."""
    import hashlib

    return hashlib.sha256(repr((cluster.groups, cluster.zone_links, cluster.slow)).encode()).hexdigest()[:16]


def note_cluster_changed(plan, cluster, plan_path) -> None:
    """A note when ``cluster`` is not the one ``plan`` was made on (its ``meta.cluster_digest``): an edited cluster
    file re-prices an old plan, which is what a what-if wants and a mistake otherwise."""
    import sys

    recorded = plan.meta.get("cluster_digest")
    if isinstance(recorded, str) and recorded != cluster_digest(cluster):
        print(f"hetpart: note: {plan_path} was planned on cluster {plan.meta.get('cluster', '?')} as it was then; "
              f"{cluster.name} differs now (priced as it is; re-plan to plan for it)", file=sys.stderr)


def _note_cpu_only(plan) -> None:
    """A note where ``hetpart run`` executes the plan on CPU ranks only (:func:`hetpart.rules.accelerator_problems`:
    sound plans for other engines, so the planners keep them)."""
    import sys

    from hetpart.rules import accelerator_problems

    problems = accelerator_problems(plan)
    if problems:
        print(f"hetpart: note: hetpart run executes this plan on CPU ranks only, and refuses it on GPUs: {problems[0]}",
              file=sys.stderr)


def _time_limit(seconds: Optional[float], planner: str) -> dict[str, Any]:
    """The search's ``time_limit_s`` option from ``--time-limit``."""
    from hetpart.errors import PlanError

    if seconds is None:
        return {}
    if planner != "search":
        raise PlanError(f"--time-limit: only --planner search takes a time limit (not {planner!r}); add --planner "
                        "search or leave the limit out")
    if not math.isfinite(seconds) or seconds < 0:
        raise PlanError(f"--time-limit: {seconds} is no number of seconds; give 0 (no limit) or more")
    return {"time_limit_s": float(seconds)}


def _policy_checkpoint(path: Optional[Path], planner: str) -> dict[str, Any]:
    """The policy planner's ``checkpoint`` option, loaded here so that a wrong file is refused before planning."""
    from hetpart.errors import HetpartError, PlanError

    if path is None:
        return {}
    if planner != "policy":
        raise PlanError(f"--policy-checkpoint: only --planner policy uses a checkpoint (not {planner!r}); add "
                        "--planner policy or leave the checkpoint out")
    from hetpart.policies.registry import checkpoint_file

    found = checkpoint_file(path)  # tp/smoke reads tp/smoke.zip, as SB3 loads it and train-policy writes it
    if found is None:
        also = "" if path.suffix else f" nor {path}.zip"
        raise PlanError(f"--policy-checkpoint: {path}: no such file{also}; give the checkpoint 'hetpart "
                        "train-policy' wrote (the 'checkpoint' of its summary)")
    path = found
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
        if not band.get("rows"):
            trust = "no validation rows yet"
        elif band.get("scope", "step") == "unit":
            trust = (f"no whole step checked; single units' times {lo:+.0f}% to {hi:+.0f}% (mean {band['mean_abs_pct']:.0f}% "
                     f"over {band['rows']} units)")
        elif band["rows"] == 1:  # one row is one residual, not a range: the point may be right or that far off
            trust = f"checked on one row only: {lo:+.1f}% (the band runs from there to 0)"
        else:
            trust = f"error band {lo:+.0f}% to {hi:+.0f}% (mean {band['mean_abs_pct']:.0f}% over {band['rows']} rows)"
        con.print(f"  {gpu}: compute {what}; {trust}")
    att = (provenance or {}).get("attention")
    if att:
        changed = "" if att["priced"] == att["requested"] else f" (asked: {att['requested']})"
        con.print(f"  attention priced {att['priced']}{changed}: {att['kernel']}; {att['why']}", highlight=False)
    profile = (provenance or {}).get("profile")
    if profile and profile.get("summary"):
        con.print(f"  profile {profile.get('file') or ''}: {profile['summary']}", highlight=False)


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
    from hetpart import _validate

    for key, value in (("model", model), ("cluster", cluster)):
        why = _validate.missing_recorded_source(str(plan_path), key, value) if value == meta.get(key) else None
        if why:
            raise PlanError(why)
    return str(model), str(cluster), plan


def predict_command(
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the plan's meta.model)."),
        cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster (default: the plan's meta.cluster)."),
        global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per step (default: the plan's, else 512)."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (default: the plan's, else 2048)."),
        precision: Optional[str] = typer.Option(None, "--precision", help="bf16, fp16, fp32, tf32 or fp8 (default: the plan's, else bf16; fp8 on Hopper, Ada and MI300 only)."),
        recompute: Optional[str] = typer.Option(None, "--recompute", help="none, selective or full (default: the plan's, else selective; 'auto' is for 'hetpart plan')."),
        zero: Optional[int] = ZeroOpt, offload: Optional[str] = OffloadOpt,
        optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam, sgd or adam8bit (default: the plan's, else adam)."),
        attention: Optional[str] = typer.Option(None, "--attention", help="fused or eager (default: the plan's, else fused)."),
        plan_path: Optional[Path] = typer.Option(None, "--plan", help="A plan JSON written by 'hetpart plan --out'."),
        tp: Optional[int] = typer.Option(None, "--tp"), pp: Optional[int] = typer.Option(None, "--pp"),
        dp: Optional[int] = typer.Option(None, "--dp"),
        micro_batch: Optional[int] = typer.Option(None, "--micro-batch"),
        schedule: Optional[str] = typer.Option(None, "--schedule", help="1f1b (default), gpipe or interleaved (with "
                                               "--interleave)."),
        interleave: Optional[int] = typer.Option(None, "--interleave", help="Model chunks per device, 2 or more "
                                                 "(--schedule interleaved only)."),
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
        overlap_p2p: Optional[bool] = OverlapP2POpt, overlap_grad_reduce: Optional[bool] = OverlapGradOpt,
        op_counts: Optional[str] = OpCountsOpt, full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Predict step time, throughput and memory of a plan (a file, or the Megatron grid of --tp --pp --dp)."""
    from hetpart.costmodel.predictor import check_predictor_name, get_predictor
    from hetpart.errors import PlanError

    check_predictor_name(predictor)  # an unknown predictor fails before the model loads
    flags = _WorkloadFlags(global_batch, seq_len, precision, recompute, zero, offload, optimizer, attention)
    grid = {"--tp": tp, "--pp": pp, "--dp": dp, "--micro-batch": micro_batch, "--schedule": schedule,
            "--interleave": interleave, "--order": order, "--cp": cp}
    if records is not None:
        _records_alone(model, cluster, flags, grid, plan_path, plans_path, profile_path, jobs, overlap_p2p,
                       overlap_grad_reduce, op_counts)
        from hetpart.cli.records_cmd import predict_records

        return predict_records(records, predictor, json_out)
    flags.check()  # a bad workload flag fails before anything loads, whichever form prices the plans
    profile = load_profile_option(profile_path, predictor)
    engine = engine_flags(overlap_p2p, overlap_grad_reduce, op_counts)  # as given: over what a plan recorded
    if plans_path is not None or plan_path is not None:
        given = [flag for flag, value in grid.items() if value is not None]
        if plans_path is not None and plan_path is not None:
            raise PlanError("predict: give --plan or --plans, not both")
        if given:
            source, what = ("--plans", "each plan places") if plans_path is not None else ("--plan", "the plan places")
            cp_field = "; context parallelism in its 'cp' field" if "--cp" in given else ""
            raise PlanError(f"{', '.join(given)}: {what} its own ranks (stages, devices, tp, micro_batch, schedule"
                            f"{cp_field}); give {source} or the --tp/--pp/--dp grid, not both")
    if plans_path is not None:
        _predict_batch(plans_path, model, cluster, flags, predictor, json_out, profile, engine, jobs)
        return
    model, cluster, plan = _from_plan_meta(plan_path, model, cluster)
    models = _Models(model, cluster)
    if plan is not None:
        from hetpart.plan import states_precision

        graph, workload, plan = _resolve_plan(plan, str(plan_path), states_precision(plan_path), flags, models)
    else:
        graph, workload, plan = _grid_plan(flags, models, tp, pp, dp, micro_batch, schedule, interleave, order, cp)
    cl = models.cluster
    if plan_path is not None:
        note_cluster_changed(plan, cl, plan_path)
    if plan_path is not None:  # the engine options and profile the plan was priced with, unless flags say others
        from hetpart.cli.recorded import plan_options

        options = plan_options(plan, str(plan_path), engine, profile, predictor)
    else:
        options = ({"profile": profile} if profile is not None else {}) | non_default(engine)
    chosen = get_predictor(predictor, graph, cl, workload, **options)
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
    for line in (None if prediction.fits_in_memory else _memory_line(prediction.breakdown),
                 _priced_by_line(prediction.metrics, chosen.name)):
        if line:
            con.print(line, highlight=False)
    _provenance_lines(con, prediction.provenance)


@dataclass(frozen=True)
class _WorkloadFlags:
    """The workload options of ``predict`` as given (None: not given). They act alike on a plan file
    (``--plan``), on every line of ``--plans`` (:func:`_resolve_plan`) and on the grid (:func:`_grid_plan`)."""

    global_batch: Optional[int]
    seq_len: Optional[int]
    precision: Optional[str]
    recompute: Optional[str]
    zero: Optional[int]
    offload: Optional[str]
    optimizer: Optional[str]
    attention: Optional[str]

    def check(self) -> None:
        """Refuse a value no plan can take, before anything loads: 0 or less for a size (0 is not 'left
        out'), and ``auto``, which only a planner resolves."""
        from hetpart.errors import WorkloadError
        from hetpart.vocabulary import RECOMPUTE_MODES

        if self.global_batch is not None and self.global_batch < 1:
            raise WorkloadError(f"--global-batch: must be a whole number >= 1, got {self.global_batch}; give the "
                                "sequences per step, or leave it out for the plan's (else 512)")
        if self.seq_len is not None and not 1 <= self.seq_len <= 10**7:
            raise WorkloadError(f"--seq-len: must be a whole number between 1 and 1e7, got {self.seq_len}; give the "
                                "tokens per sequence, or leave it out for the plan's")
        for flag, value, modes in (("--recompute", self.recompute, RECOMPUTE_MODES),
                                   ("--offload", self.offload, ("none", "optimizer", "full"))):
            if value == "auto":
                raise WorkloadError(f"{flag}: 'auto' lets a planner choose ('hetpart plan {flag} auto'); predict "
                                    f"prices one plan: give {', '.join(modes[:-1])} or {modes[-1]}")
        if self.recompute is not None and self.recompute not in RECOMPUTE_MODES:
            raise WorkloadError(f"--recompute: unknown mode {self.recompute!r}; use "
                                f"{', '.join(RECOMPUTE_MODES[:-1])} or {RECOMPUTE_MODES[-1]}")
        workload_from(1, 1, self.precision or "bf16", self.recompute or "none", self.zero, self.optimizer or "adam",
                      self.attention or "fused", self.offload)  # the names and the zero stage

    def given(self) -> list[str]:
        return [f"--{name.replace('_', '-')}" for name, value in self.__dict__.items() if value is not None]


class _Models:
    """``predict``'s cluster, loaded once, and its model graphs, one per sequence length and precision (plans
    in one ``--plans`` file may use devices that choose different precisions)."""

    def __init__(self, model: str, cluster: str) -> None:
        from hetpart import load_cluster

        self.spec, self.cluster = model, load_cluster(cluster)
        self._graphs: dict[tuple, Any] = {}

    def check_model(self) -> None:
        """Refuse an unknown model name or an unreadable config once, not on every plan of a batch."""
        from hetpart.graph import resolve_transformer

        if not self.spec.startswith("python:"):
            resolve_transformer(self.spec)

    def load(self, seq_len: int | None, precision: str | None, devices=None, precision_source: str = "--precision",
             seq_len_source: str = "--seq-len"):
        """The graph and the precision: ``precision`` checked against the devices in use (``devices``, default the
        whole cluster), or None for the best they all support (:func:`resolve_precision`)."""
        from hetpart import load_model

        cl = self.cluster
        used = [cl.device(d) for d in devices if cl.has_device(d)] if devices is not None else cl.devices
        # the device types, told apart by identity first (a GPUSpec hashes every field; plans list 1,000s of devices)
        gpus = set({id(d.gpu): d.gpu for d in used}.values())
        precision = resolve_precision(precision, gpus, precision_source)
        key = (seq_len, precision)
        if key not in self._graphs:
            self._graphs[key] = load_model(self.spec, seq_len=seq_len, precision=precision,
                                           seq_len_source=seq_len_source, exact_seq_len=True)
        return self._graphs[key], precision


def _resolve_plan(plan, where: str, stated: bool, flags: _WorkloadFlags, models: _Models, label: str = ""):
    """What ``predict`` prices for a plan read from ``where`` (``--plan FILE``, or ``FILE:LINE`` of ``--plans``):
    the model graph, the workload and the plan with the workload flags applied, checked against the model and
    the cluster. Without ``--precision``, a plan that states no precision (``stated`` False; the key is
    optional) takes the best its own devices support, as ``--precision`` left out does (fp16 beside V100s).
    ``label`` names the plan in a sentence (default ``where``)."""
    from hetpart.errors import PlanError

    if flags.seq_len is not None and flags.seq_len != plan.seq_len:
        raise PlanError(f"--seq-len: {flags.seq_len} but {label or where} was planned for {plan.seq_len} tokens; drop "
                        f"--seq-len (the plan's is used) or plan for {flags.seq_len} ('hetpart plan ... --seq-len "
                        f"{flags.seq_len}')")
    if flags.global_batch is not None and flags.global_batch != plan.global_batch:  # the flag, not "workload:"
        raise PlanError(f"--global-batch: {flags.global_batch} but {label or where} was planned for "
                        f"{plan.global_batch} sequences per step; drop --global-batch (the plan's is used) or plan "
                        f"for {flags.global_batch} ('hetpart plan ... --global-batch {flags.global_batch}')")
    graph, precision = models.load(plan.seq_len, flags.precision or (plan.precision if stated else None),
                                   devices=plan.devices,
                                   precision_source="--precision" if flags.precision else f"{where}: precision",
                                   seq_len_source="--seq-len" if flags.seq_len else f"{where}: seq_len")
    recompute = flags.recompute or plan.recompute
    optimizer, attention = flags.optimizer or plan.optimizer, flags.attention or plan.attention
    offload = flags.offload or plan.offload
    workload = workload_from(plan.global_batch if flags.global_batch is None else flags.global_batch, graph.seq_len,
                             precision, recompute, flags.zero, optimizer, attention, offload)
    plan = replace(plan, optimizer=optimizer, attention=attention, precision=precision, recompute=recompute,
                   offload=offload)
    if flags.zero is not None and plan.zero != flags.zero:
        plan = replace(plan, zero=flags.zero, **({"shard_fractions": None, "shard_group": 0} if flags.zero == 0 else {}))
    plan.check(graph, models.cluster, where)  # the rules a plan breaks name its file (and line), not "plan"
    return graph, workload, plan


def _grid_plan(flags: _WorkloadFlags, models: _Models, tp, pp, dp, micro_batch, schedule, interleave, order, cp):
    """The model graph, the workload and the Megatron plan of the ``--tp --pp --dp`` grid."""
    from hetpart.errors import PlanError

    from hetpart.vocabulary import SCHEDULES

    schedule = "1f1b" if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise PlanError(f"--schedule: unknown schedule {schedule!r}; use {', '.join(SCHEDULES[:-1])} or {SCHEDULES[-1]}")
    if schedule == "interleaved" and interleave is None:
        raise PlanError("--interleave: --schedule interleaved needs --interleave 2 or more (model chunks per device; "
                        "one chunk is plain 1F1B, as in Megatron-LM: use --schedule 1f1b)")
    if schedule == "interleaved" and isinstance(interleave, int) and interleave == 1:
        raise PlanError("--interleave: 1 model chunk per device is plain 1F1B (as in Megatron-LM), not interleaved; "
                        "give --interleave 2 or more, or --schedule 1f1b")
    batch = 512 if flags.global_batch is None else flags.global_batch
    if schedule == "interleaved" and all(isinstance(x, int) and x > 0 for x in (pp, dp, micro_batch or 1)) and pp > 1:
        per_replica, left = divmod(batch, dp * (micro_batch or 1))
        if left == 0 and per_replica % pp:
            step = dp * (micro_batch or 1) * pp
            raise PlanError(f"--schedule interleaved: each of the {dp} replicas runs {per_replica} micro-batches "
                            f"(--global-batch {batch} / (--dp {dp} x --micro-batch {micro_batch or 1})), not a multiple "
                            f"of --pp {pp} (Megatron-LM's interleaved schedule needs one); give --global-batch a "
                            f"multiple of {step} (e.g. {max(step, batch // step * step)}) or --schedule 1f1b")
    graph, precision = models.load(flags.seq_len, flags.precision)
    workload = workload_from(batch, graph.seq_len, precision,
                             flags.recompute or "selective", flags.zero, flags.optimizer or "adam",
                             flags.attention or "fused", flags.offload or "none")
    plan = _plan_from_args(graph, models.cluster, workload, None, tp, pp, dp, micro_batch, schedule,
                           1 if interleave is None else interleave, order, cp)
    if flags.zero is not None and plan.zero != flags.zero:
        plan = replace(plan, zero=flags.zero, **({"shard_fractions": None, "shard_group": 0} if flags.zero == 0 else {}))
    if plan.offload != workload.offload:
        plan = replace(plan, offload=workload.offload)
    return graph, workload, plan


def _records_alone(model, cluster, flags: _WorkloadFlags, grid: dict, plan_path, plans_path, profile_path, jobs,
                   overlap_p2p, overlap_grad_reduce, op_counts=None) -> None:
    """``--records`` re-predicts each record with its own model, cluster, plan, workload and engine options:
    refuse the options it would ignore."""
    from hetpart.errors import PlanError

    given = ([flag for flag, value in (("--model", model), ("--cluster", cluster), ("--plan", plan_path),
                                       ("--plans", plans_path), ("--profile", profile_path)) if value is not None]
             + flags.given() + [flag for flag, value in grid.items() if value is not None]
             + (["--jobs"] if jobs else [])
             + [f"--{key.replace('_', '-')}" for key in engine_flags(overlap_p2p, overlap_grad_reduce, op_counts)])
    if given:
        raise PlanError(f"--records: each record is re-predicted with its own model, cluster, plan, workload and "
                        f"engine options; drop {', '.join(given)} (only --predictor and --json go with --records)")


def _one_line(exc: Exception, where: str) -> str:
    """An error of one ``--plans`` line, on one line and naming the line."""
    message = " ".join(str(exc).split())
    return message if message.startswith(where) else f"{where}: {message}"


def _predict_batch(plans_path: Path, model: Optional[str], cluster: Optional[str], flags: _WorkloadFlags,
                   predictor: Optional[str], json_out: bool, profile=None, engine: dict | None = None,
                   jobs: int = 0) -> None:
    """``predict --plans``: one model, cluster and predictor, one answer line per plan, each the answer
    ``--plan`` gives that plan (:func:`_resolve_plan`: the same precision choice, workload flags and errors,
    naming the line). Each model graph (sequence length and precision) has its predictor. Each line is read,
    resolved and priced on its own, by ``jobs`` forked processes (:func:`hetpart.costmodel.batch.workers_for`)
    that share the whole of that work; a predictor that prices a batch in one pass gets its plans in groups
    of one model graph instead (:func:`_predict_groups`)."""
    import sys

    from hetpart.costmodel.batch import answer_lines, pricer, workers_for
    from hetpart.costmodel.predictor import get_predictor
    from hetpart.errors import HetpartError, PlanError
    from hetpart.plan import Plan

    try:
        lines = plans_path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"--plans: cannot read {plans_path} ({exc.__class__.__name__}); give a JSONL file with one "
                        "plan per line") from None
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise PlanError(f"--plans: {plans_path} holds no plans (it is empty or blank); give a JSONL file with one "
                        "plan per line")
    first = None  # the first readable plan names what the options leave out
    for number, line in numbered:
        try:
            first = Plan.from_json(line, f"{plans_path}:{number}")
            break
        except HetpartError:
            continue
    meta = first.meta if first is not None else {}
    model, cluster = model or meta.get("model"), cluster or meta.get("cluster")
    if not model or not cluster:
        what = "--model" if not model else "--cluster"
        raise PlanError(f"{plans_path}: {what} missing and no plan records it; give {what}")
    models = _Models(str(model), str(cluster))
    models.check_model()
    profiles = _batch_recorded(numbered, plans_path, models.cluster, predictor, profile)
    predictors: dict[tuple, tuple] = {}  # (seq_len, precision, options) -> the predictor of that model graph, its pricer

    def resolved(number: int, line: str):
        """The line's graph, workload and plan, and the options that price it (:func:`plan_options`)."""
        from hetpart.cli.recorded import profile_from_record, recorded_engine

        where = f"{plans_path}:{number}"
        plan, stated = Plan.read_json(line, where)
        graph, workload, plan = _resolve_plan(plan, where, stated, flags, models, "this line's plan")
        options = non_default(recorded_engine(plan, where) | (engine or {}))
        record = plan.meta.get("profile")
        found = profile if profile is not None else profiles.get(_record_key(record), None) if record else None
        if profile is None and record is not None and _record_key(record) not in profiles:
            found = profile_from_record(record, where, predictor)  # a malformed record: this line's error
        return graph, workload, plan, ({"profile": found} if found is not None else {}) | options

    def predictor_of(graph, workload, options: dict) -> tuple:
        key = (graph.seq_len, workload.precision, tuple(sorted((k, v) for k, v in options.items() if k != "profile")),
               id(options.get("profile")))
        if key not in predictors:
            chosen = get_predictor(predictor, graph, models.cluster, workload, **options)
            # _resolve_plan checked the plan against this graph and cluster: the predictor need not again
            predictors[key] = (chosen, pricer(chosen, str(plans_path), validate=False))
        return predictors[key]

    def line_answer(number: int, line: str) -> dict[str, Any]:
        try:
            graph, workload, plan, options = resolved(number, line)
            price = predictor_of(graph, workload, options)[1]
        except HetpartError as exc:
            return {"line": number, "error": _one_line(exc, f"{plans_path}:{number}")}
        return {"line": number} | price(number, plan, workload if flags.global_batch is not None else None)

    chosen = None
    for number, line in numbered:  # the first plan that resolves: its predictor is built before any fork
        try:
            graph, workload, _, options = resolved(number, line)
            chosen = predictor_of(graph, workload, options)[0]
        except HetpartError:
            continue
        break
    if chosen is not None and getattr(chosen, "predict_many", None) is not None:
        answers = _predict_groups(numbered, resolved, predictor_of, flags, plans_path, len(lines))
    else:
        workers = workers_for(chosen, jobs, len(numbered)) if chosen is not None else 1
        answers = dict(zip((number for number, _ in numbered), answer_lines(numbered, line_answer, workers)))
    if json_out:
        for number in sorted(answers):
            sys.stdout.write(json_text(answers[number]) + "\n")
        return
    con = console()
    for number in sorted(answers):
        answer = answers[number]
        con.print(f"{number}: " + (_metrics_line(answer["metrics"]) if "metrics" in answer else answer["error"]),
                  highlight=False, markup=False)


def _predict_groups(numbered: list[tuple[int, str]], resolved, predictor_of, flags: _WorkloadFlags, plans_path: Path,
                    size: int) -> dict[int, dict]:
    """``predict --plans`` with a predictor that prices a batch in one pass (``predict_many``): every line
    resolved here, the plans in groups of one model graph, each group in one call."""
    from hetpart.costmodel.batch import predict_lines
    from hetpart.errors import HetpartError

    answers: dict[int, dict] = {}
    groups: dict[tuple, tuple] = {}  # predictor -> graph, workload, [(line number, resolved plan)]
    for number, line in numbered:
        try:
            graph, workload, plan, options = resolved(number, line)
            chosen = predictor_of(graph, workload, options)[0]
        except HetpartError as exc:
            answers[number] = {"line": number, "error": _one_line(exc, f"{plans_path}:{number}")}
            continue
        groups.setdefault(id(chosen), (chosen, workload, []))[2].append((number, plan))
    for chosen, workload, members in groups.values():
        texts = [""] * size  # the group's plans at their own line numbers; the rest blank (no answer)
        for number, plan in members:
            texts[number - 1] = plan.to_json(indent=None)
        priced = predict_lines(texts, chosen, workload if flags.global_batch is not None else None, str(plans_path))
        for (number, _), answer in zip(members, priced):
            answers[number] = {"line": number} | answer
    return answers


def _record_key(record) -> tuple | None:
    """A well-formed ``meta.profile`` record as a dict key; None for anything else."""
    if isinstance(record, dict) and isinstance(record.get("path"), str) and isinstance(record.get("sha256"), str):
        return (record["path"], record["sha256"])
    return None


def _batch_recorded(numbered: list[tuple[int, str]], plans_path: Path, cluster, predictor, profile) -> dict:
    """For ``predict --plans``, read before any line is priced (and before any fork, so that each note comes
    once): one note for the lines planned on another version of ``cluster`` (as ``--plan`` gives), and the
    profiles the lines recorded (``meta.profile``), loaded once each (None where one cannot price them now,
    with its note), unless ``--profile`` (``profile``) prices every line."""
    import json
    import sys

    from hetpart.cli.recorded import profile_from_record

    digest = cluster_digest(cluster)
    changed, records = [], {}
    for number, line in numbered:
        try:
            meta = json.loads(line).get("meta")
        except (ValueError, AttributeError):
            continue  # the line's own answer says what is wrong with it
        if not isinstance(meta, dict):
            continue
        if isinstance(meta.get("cluster_digest"), str) and meta["cluster_digest"] != digest:
            changed.append(number)
        key = _record_key(meta.get("profile"))
        if key is not None:
            records.setdefault(key, (meta["profile"], []))[1].append(number)
    if changed:
        shown = ", ".join(map(str, changed[:5])) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        print(f"hetpart: note: {plans_path}: line{'s' if len(changed) > 1 else ''} {shown} "
              f"{'were' if len(changed) > 1 else 'was'} planned on cluster {cluster.name} as it was then; it differs "
              "now (priced as it is; re-plan to plan for it)", file=sys.stderr)
    if profile is not None:
        return {}
    loaded = {}
    for key, (record, lines) in records.items():
        where = f"{plans_path}:{lines[0]}" + (f" (and {len(lines) - 1} more lines)" if len(lines) > 1 else "")
        loaded[key] = profile_from_record(record, where, predictor)
    return loaded


def _is_chart(text: str) -> bool:
    """Whether ``text`` (a file read as text) is a chart :func:`hetpart.plotting.save_png` drew: it marks each
    image's metadata with :data:`hetpart.plotting.CHART_MARK` (any other matplotlib image is the user's)."""
    from hetpart.plotting import CHART_MARK

    return CHART_MARK in text


def _is_report_page(text: str) -> bool:
    """Whether ``text`` is a page :func:`hetpart.report.html_page` wrote (its title starts with hetpart)."""
    return text.startswith("<!DOCTYPE html>") and "<title>hetpart" in text[:4096]


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
                 profile_path: Optional[Path] = ProfileOpt,
                 overlap_p2p: Optional[bool] = OverlapP2POpt, overlap_grad_reduce: Optional[bool] = OverlapGradOpt,
                 op_counts: Optional[str] = OpCountsOpt,
                 full: bool = FullOpt, json_out: bool = JsonFlag) -> None:
    """Show a plan as a table, its simulated schedule as a Gantt chart (--gantt) and an HTML report (--html).
    The simulator prices it as the plan records (workload, engine options, profile); the engine flags and
    --profile override those, while a changed workload is a what-if for 'hetpart predict'."""
    from hetpart.cli.recorded import plan_options
    from hetpart.costmodel.simulator import Simulator
    from hetpart.errors import PlanError

    if max_replicas < 1:
        raise PlanError(f"--max-rows: must be >= 1, got {max_replicas}; give the number of Gantt rows to draw")
    if compare.strip() and html_out is None:  # refused, not dropped: the comparison lives in the HTML report
        raise PlanError("--compare: the comparison is part of the HTML report; give --html report.html with it")
    _check_compare(compare)  # an unknown planner fails before the model loads
    _check_image(gantt, "--gantt")
    engine = engine_flags(overlap_p2p, overlap_grad_reduce, op_counts)
    profile = load_profile_option(profile_path, "simulator")
    model, cluster, plan = _from_plan_meta(plan_path, model, cluster)
    from hetpart import _validate

    for flag, target in (("--gantt", gantt), ("--html", html_out)):
        _validate.refuse_input_as_output(PlanError, target, flag, {"PLAN": plan_path, "--model": model,
                                                                  "--cluster": cluster, "--profile": profile_path})
    refuse_replacing(gantt, "--gantt", "hetpart show --gantt", "a chart image", _is_chart)
    refuse_replacing(html_out, "--html", "hetpart show --html", "an HTML report", _is_report_page)
    graph, cl, precision = _load(model, cluster, plan.seq_len, _stated_precision(plan, plan_path), devices=plan.devices,
                                 precision_source=f"{plan_path}: precision", seq_len_source=f"{plan_path}: seq_len")
    plan = replace(plan, precision=precision)
    plan.check(graph, cl, str(plan_path))  # the file named, as export and predict name it
    note_cluster_changed(plan, cl, plan_path)
    options = plan_options(plan, str(plan_path), engine, profile, "simulator")
    prediction = Simulator(graph, cl, **options).simulate(plan, validate=True,
                                                          trace=gantt is not None or html_out is not None)
    if gantt is not None:
        from hetpart import plotting

        fig = plotting.gantt_figure(prediction.timeline, plan, cl, title=f"{graph.name} on {cl.name}",
                                    step_time_s=prediction.step_time_s, tokens_per_s=prediction.tokens_per_s,
                                    max_rows=max_replicas)
        _write(lambda: plotting.save_png(fig, gantt), "--gantt", gantt)
    if html_out is not None:
        from hetpart.cli.report_cmd import plan_html

        page = plan_html(plan_path, plan, graph, cl, prediction, compare, options)
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
