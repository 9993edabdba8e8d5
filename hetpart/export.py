"""A plan in the terms of the training engines people run: Megatron-LM, torchtitan and DeepSpeed.

Each target gets what it can express of the plan (parallel degrees, the pipeline partition,
batches, recomputation, precision) and a list of what it cannot (uneven replicas, per-stage tensor
parallelism, ...), never a silent approximation. The names are the engines' own:

* Megatron-LM (``megatron/training/arguments.py``): ``--tensor-model-parallel-size``,
  ``--pipeline-model-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``,
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, or the general
  ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder layer, ``L`` loss, ``|`` between
  stages; the one way to put the embedding or the head alone on a stage), ``--micro-batch-size``,
  ``--global-batch-size``, ``--seq-length``, ``--recompute-granularity``,
  ``--optimizer sgd``, ``--attention-backend unfused`` (eager attention) and, for hybrid sharding,
  ``--num-distributed-optimizer-instances`` (the distributed optimizer sharded inside groups of consecutive ranks),
  and ``--optimizer-cpu-offload`` with what Megatron-Core requires of it (``--use-precision-aware-optimizer``,
  hence ``--use-distributed-optimizer`` and Adam) and ``--optimizer-offload-fraction 1.0``.
* torchtitan (``torchtitan/config/job_config.py``): ``[training] local_batch_size`` (the samples of one forward;
  ``global_batch_size / (local_batch_size x dp)`` accumulation steps), ``[parallelism]`` degrees (HSDP:
  ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree``), ``pipeline_parallel_schedule``,
  ``module_fqns_per_model_part`` (the split, per model chunk) and the older ``pipeline_parallel_split_points``.
* DeepSpeed: the JSON config (``train_batch_size``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``, ``zero_optimization.stage`` with its ``offload_optimizer`` /
  ``offload_param`` and MiCS's ``mics_shard_size`` (hybrid sharding, ZeRO-3 only), ``bf16``/``fp16``,
  ``optimizer.type`` ``SGD``) and the
  ``PipelineModule(num_stages=..., partition_method=...)`` arguments.

The plan's optimizer and attention kernel are part of what it assumed (model-state and activation memory):
where a target has no setting for them (8-bit Adam anywhere, SGD in torchtitan, eager attention outside
Megatron-LM) they are named, never dropped.

Given the cluster, groups whose GPUs come from two vendors (an A100 and an MI250X replica) are named too: no
NCCL/RCCL communicator spans both, and the engines run one backend for every group.

Units of a hetpart transformer are ``embedding, block_0 .. block_{L-1}, head``; a ``python:`` model, traced
from a module, has no shape arguments for the engines and is refused.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from hetpart.errors import PlanError

__all__ = ["TARGETS", "Export", "export_plan", "is_export"]

TARGETS = ("megatron", "torchtitan", "deepspeed")
Target = Literal["megatron", "torchtitan", "deepspeed"]


@dataclass(frozen=True)
class Export:
    """A plan in one engine's terms."""

    target: str
    text: str
    """The artifact: Megatron-LM command-line arguments, a torchtitan TOML fragment, or a DeepSpeed JSON config."""
    data: dict[str, Any]
    """The same as data (argument -> value, or the config mapping)."""
    cannot_express: tuple[str, ...] = ()
    """What of the plan the target cannot express (the artifact then describes replica 0 / the first stage's TP)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the user must do besides (rank order, a custom partition)."""

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "text": self.text, "data": self.data,
                "cannot_express": list(self.cannot_express), "notes": list(self.notes)}


@dataclass(frozen=True)
class _Shape:
    """What every engine needs: the plan reduced to one homogeneous grid, and where it is not one."""

    dp: int
    pp: int
    """Physical pipeline depth (device groups per replica)."""
    vpp: int
    """Model chunks per device group (1 unless interleaved)."""
    tp: int
    blocks: tuple[int, ...]
    """Decoder layers per (virtual) stage of replica 0, in stage order."""
    stage_units: tuple[tuple[int, int], ...]
    """Unit ranges per (virtual) stage of replica 0."""
    num_layers: int
    problems: tuple[str, ...]


def export_plan(plan, graph, target: str, cluster=None) -> Export:
    """Express ``plan`` (made for ``graph``) for ``target`` (``megatron``, ``torchtitan`` or ``deepspeed``).

    Args:
        cluster: the plan's cluster; with it, communication groups that mix GPU vendors are named.

    Raises:
        PlanError: an unknown target, or a model that is not a hetpart transformer (embedding, blocks, head).
    """
    if target not in TARGETS:
        raise PlanError(f"--to: unknown target {target!r}; use one of {', '.join(TARGETS)}")
    shape = _shape(plan, graph, cluster)
    return {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed}[target](plan, graph, shape)


def is_export(text: str, target: str) -> bool:
    """Whether ``text`` is an export to ``target`` as :func:`export_plan` writes it (what ``hetpart export --out``
    may replace): Megatron-LM's arguments start with ``--tensor-model-parallel-size``, torchtitan's TOML has
    ``[training]`` and ``[parallelism]`` tables (read as lines: ``tomllib`` is Python 3.11+), DeepSpeed's JSON
    config ``train_batch_size`` and ``zero_optimization``."""
    if target == "megatron":
        return text.lstrip().startswith("--tensor-model-parallel-size")
    if target == "torchtitan":
        return {"[training]", "[parallelism]"} <= {line.strip() for line in text.splitlines()}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return target == "deepspeed" and isinstance(data, dict) and {"train_batch_size", "zero_optimization"} <= set(data)


def _shape(plan, graph, cluster=None) -> _Shape:
    _check_exportable(graph)
    arch = graph.arch or {}
    first = plan.replicas[0]
    vpp = plan.chunks_per_device
    pp, tp = first.pp // vpp, first.stages[0].tp
    dp, grid_problem = _grid_dp(plan, pp, tp)
    problems = []
    shares = {round(r.batch_share, 9) for r in plan.replicas}
    if len(shares) > 1:
        problems.append(f"uneven data-parallel replicas (batch shares {_runs(r.batch_share for r in plan.replicas)}): "
                        "every replica gets global_batch / dp there")
    splits = {tuple(s.layers for s in r.stages) for r in plan.replicas}
    if len(splits) > 1:
        problems.append(f"replicas with different pipelines ({len(splits)} distinct stage splits or depths): one "
                        "split for all replicas there; shown: replica 0's")
    tps = sorted({s.tp for r in plan.replicas for s in r.stages})
    if len(tps) > 1:
        problems.append(f"per-stage tensor parallelism (tp {', '.join(map(str, tps))}): one TP degree for all "
                        f"stages there; shown: tp {first.stages[0].tp}" + _one_tp_grid(plan, pp, tp, dp))
    uneven = sum(s.tp_split is not None for r in plan.replicas for s in r.stages)
    if uneven:
        problems.append(f"uneven tensor-parallel splits ({uneven} stage{'s' if uneven > 1 else ''} with tp_split): "
                        "the engines shard heads and columns evenly (torch.chunk); shown: even shards")
    fractions = getattr(plan, "shard_fractions", None)
    if getattr(plan, "zero", 0) and fractions is not None and len({round(f, 9) for f in fractions}) > 1:
        problems.append(f"uneven shards (shard_fractions {_runs(fractions)}): the engines split each sharded state evenly over its shard group (Megatron-LM's distributed "
                        "optimizer, FSDP2, DeepSpeed ZeRO); shown: even shards, more than planned on the replicas "
                        "given less")
    problems += [p for p in (grid_problem, _batch_problem(plan, dp, pp, tp), _vendor_problem(plan, cluster)) if p]
    n = graph.num_units
    blocks = tuple(max(0, min(b, n - 1) - max(a, 1)) for a, b in (s.layers for s in first.stages))
    return _Shape(dp=dp, pp=pp, vpp=vpp, tp=tp, blocks=blocks,
                  stage_units=tuple(s.layers for s in first.stages), num_layers=int(arch["num_layers"]),
                  problems=tuple(problems))


def _runs(values) -> str:
    """Fractions in order, a run of equal ones (to the 3 decimals shown) once with its length: ``0.023 x32,
    0.047 x8`` for a plan of 40 replicas, which listed all 40 (the probe of 2026-12-01: 128 on 1,024 GPUs)."""
    shown = [f"{value:.3f}" for value in values]
    runs: list[list] = []
    for text in shown:
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    return ", ".join(text if count == 1 else f"{text} x{count}" for text, count in runs)


def _check_exportable(graph) -> None:
    """The engines build their own transformer from shape arguments; a traced module states none."""
    if graph.config is None:
        raise PlanError(f"export: model {graph.source or graph.name} is a python: model, which cannot be exported: "
                        "Megatron-LM, torchtitan and DeepSpeed build their own transformer from shape arguments "
                        "(layers, hidden size, heads, vocabulary), and a traced module gives hetpart its units, "
                        "not these; describe the model as a Hugging Face config.json and plan with that, or run "
                        "this plan with 'hetpart run'")
    kinds = [u.kind for u in graph.units]
    if not (graph.arch or {}).get("num_layers") or kinds[0] != "embedding" or kinds[-1] != "head":
        raise PlanError(f"export: model {graph.name} is not a transformer of embedding, blocks and head; the "
                        "engines' arguments describe transformer layers only")


def _grid_dp(plan, pp: int, tp: int) -> tuple[int, str | None]:
    """The data-parallel degree of the config shown. Replicas alike (the same device count per stage, per-stage
    TP inside them or not) are its data-parallel ranks. Replicas of other depths or TP widths are no grid: the
    config shown, run on the plan's devices, makes ``world / (tp x cp x pp)`` of them (Megatron-LM's
    ``validate_args``; torchtitan's mesh), replica 0 giving tp and pp."""
    shapes = {tuple(len(s.devices) for s in r.stages) for r in plan.replicas}
    if len(shapes) == 1:
        return plan.dp, None
    width = tp * getattr(plan, "cp", 1) * pp
    world = plan.num_devices
    dp = max(1, world // width)
    if dp * width == world:
        return dp, None
    return dp, (f"the plan's {world} devices as one grid of {width}-device replicas (replica 0's tp {tp}, "
                f"{'cp ' + str(plan.cp) + ', ' if getattr(plan, 'cp', 1) > 1 else ''}pp {pp}): the engines need "
                f"a multiple of {width}; the config shown runs {dp} data-parallel rank{'s' if dp > 1 else ''} on "
                f"{dp * width} of them")


def _one_tp_grid(plan, pp: int, tp: int, dp: int) -> str:
    """What the config shown launches where a plan's replicas are alike but their stages differ in TP width: the
    plan's replicas as its data-parallel ranks, each stage at replica 0's first TP degree, so another number of
    ranks than the plan has devices. (Replicas of other shapes: :func:`_grid_dp` counts the grid.)"""
    if len({tuple(len(s.devices) for s in r.stages) for r in plan.replicas}) > 1:
        return ""
    cp = getattr(plan, "cp", 1)
    ranks, world = tp * cp * pp * dp, plan.num_devices
    degrees = [("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp)]
    grid = " x ".join(f"{k} {v}" for k, v in degrees if k != "cp" or v > 1)
    widths = ", ".join(str(s.tp) for s in plan.replicas[0].stages)
    each = "its one replica" if dp == 1 else f"each of its {dp} replicas"
    if ranks < world:
        launched = (f"launches {ranks} ranks on the plan's {world} devices and leaves {world - ranks} of them idle "
                    f"(the tensor-parallel ranks its stages wider than tp {tp} add)")
    elif ranks > world:
        launched = (f"launches {ranks} ranks, {ranks - world} more than the plan's {world} devices (its stages "
                    f"narrower than tp {tp} run at tp {tp} there)")
    else:
        launched = f"launches {ranks} ranks on the plan's {world} devices, at other TP widths than planned"
    return (f" on every stage (the plan: tp {widths} in {each}), a grid of {grid} = {ranks} ranks, which "
            f"{launched}; a plan of one TP degree (hetpart plan --planner uniform) exports as a grid of all its "
            "devices")


def _batch_problem(plan, dp: int, pp: int, tp: int) -> str | None:
    """Each engine's global batch is dp x micro-batch x accumulation steps, dp being the config's (not the
    plan's replica count: replicas of other TP widths or depths make another grid on the same devices)."""
    step = dp * plan.micro_batch
    if plan.global_batch % step == 0:
        return None
    near = sorted({max(step, plan.global_batch // step * step), (plan.global_batch // step + 1) * step})
    whose = "" if dp == plan.dp else (f" (the config's dp: the plan's {plan.num_devices} devices over tp {tp} x "
                                      f"pp {pp}; the plan has {plan.dp} replicas)")
    return (f"a global batch of {plan.global_batch} sequences over {dp} data-parallel replicas of micro-batch "
            f"{plan.micro_batch}{whose} (the engines need a multiple of {step}: the config shown does not add up to "
            f"{plan.global_batch} and is refused or trains on fewer): set the global batch to "
            f"{' or '.join(map(str, near))} there")


def _vendor_problem(plan, cluster) -> str | None:
    """Groups whose GPUs come from more than one vendor. Each vendor's collective library connects its own GPUs
    only (a PyTorch build has NCCL or RCCL behind its ``nccl`` backend, not both), so no one communicator spans
    two vendors, and the engines create one backend for every group."""
    if cluster is None or len(_vendors(cluster, plan.devices)) < 2:
        return None
    holders: dict[int, set[str]] = {}  # unit -> vendors of the devices holding it: its gradient all-reduce
    for r in plan.replicas:
        for s in r.stages:
            for u in range(*s.layers):
                holders.setdefault(u, set()).update(_vendors(cluster, s.devices))
    groups = [name for name, mixed in (
        ("data-parallel (the gradient all-reduce)", any(len(v) > 1 for v in holders.values())),
        ("pipeline (the sends between stages)",
         any(len({_vendors(cluster, s.devices) for s in r.stages}) > 1 for r in plan.replicas)),
        ("tensor-parallel", any(len(_vendors(cluster, s.devices)) > 1 for r in plan.replicas for s in r.stages)),
    ) if mixed]
    gpus = sorted({f"{g.vendor} {g.name}" for g in (cluster.device(d).gpu for d in plan.devices)})
    return (f"{' and '.join(groups)} groups that mix GPU vendors ({', '.join(gpus)}): each vendor's collective "
            "library (NVIDIA's NCCL, AMD's RCCL) connects its own GPUs only, so no single NCCL/RCCL communicator "
            "spans both, while the engines create one backend (nccl) for every group; run these groups over gloo "
            "through host memory, or one vendor per job")


def _vendors(cluster, devices) -> frozenset[str]:
    return frozenset(cluster.device(d).gpu.vendor for d in devices)


def _shard_group(plan, dp: int) -> int:
    """Ranks per shard group: ``shard_group`` under hybrid sharding (HSDP), else all ``dp`` data-parallel ranks
    (``dp`` is the config's; a group that does not divide it shards over all of them)."""
    group = getattr(plan, "shard_group", 0)
    return group if getattr(plan, "zero", 0) and 0 < group < dp and dp % group == 0 else dp


# --------------------------------------------------------------------------------------- Megatron-LM
def _megatron(plan, graph, shape: _Shape) -> Export:
    arch = graph.arch or {}
    args: dict[str, Any] = {
        "--tensor-model-parallel-size": shape.tp,
        "--pipeline-model-parallel-size": shape.pp,
    }
    problems = list(shape.problems)
    args.update(_megatron_partition(shape))
    args.update({
        "--micro-batch-size": plan.micro_batch,
        "--global-batch-size": plan.global_batch,
        "--seq-length": plan.seq_len,
        "--num-layers": shape.num_layers,
        "--hidden-size": arch.get("hidden_size"),
        "--num-attention-heads": arch.get("num_heads"),
        "--ffn-hidden-size": arch.get("ffn_hidden_size") or 4 * int(arch.get("hidden_size", 0)),
        "--max-position-embeddings": arch.get("max_positions"),
    })
    if arch.get("head_size"):  # head width apart from hidden / heads (Gemma, Qwen3)
        args["--kv-channels"] = arch["head_size"]
    kv = arch.get("num_kv_heads") or arch.get("num_heads")
    if kv and kv != arch.get("num_heads"):
        args.update({"--group-query-attention": True, "--num-query-groups": kv})
    if graph.config is not None:
        args.update(_megatron_architecture(graph.config, problems, plan.seq_len))
    args.update(_megatron_recompute(plan.recompute))
    args.update(_megatron_optimizer_and_attention(plan, problems))
    if getattr(plan, "cp", 1) > 1:
        args["--context-parallel-size"] = plan.cp
    if plan.precision in ("bf16", "fp16"):
        args[f"--{plan.precision}"] = True
    elif plan.precision == "fp8":  # Transformer Engine FP8 on bf16 weights (E4M3 forward, E5M2 gradients)
        args.update({"--bf16": True, "--fp8-format": "hybrid"})
    if plan.schedule == "gpipe":
        problems.append("schedule gpipe (every forward before any backward: all micro-batches' activations held at "
                        "once): Megatron-LM's pipelines run 1F1B or interleaved 1F1B, and without a pipeline one "
                        "micro-batch at a time; shown: 1F1B, which holds fewer activations and idles otherwise than "
                        "planned")
    if getattr(plan, "zero", 0) >= 1:
        args["--use-distributed-optimizer"] = True
        if _shard_group(plan, shape.dp) < shape.dp:  # partial distributed optimizer: shards inside dp/instances ranks
            args["--num-distributed-optimizer-instances"] = shape.dp // _shard_group(plan, shape.dp)
        if plan.zero >= 2:
            problems.append(f"ZeRO stage {plan.zero}: Megatron-LM's distributed optimizer shards optimizer states "
                            "(ZeRO-1) only; gradients and parameters stay replicated")
    notes: list[str] = []
    if getattr(plan, "offload", "none") != "none":
        args.update(_megatron_offload(plan, shape, problems, notes))
    args = {k: v for k, v in args.items() if v is not None}
    lines = [k if v is True else f"{k} {_shell_word(v)}" for k, v in args.items()]
    text = " \\\n".join(lines) + "\n"
    return Export("megatron", text, args, tuple(problems), _rank_note(plan, shape, "Megatron-LM") + tuple(notes))


def _shell_word(value: Any) -> str:
    """An argument value as the shell reads it: quoted where it holds a character the shell would act on (the
    layout's ``|``); the data keeps the bare value."""
    text = str(value)
    return text if all(c.isalnum() or c in "._-/+=:," for c in text) else f'"{text}"'


def _megatron_offload(plan, shape: _Shape, problems: list[str], notes: list[str]) -> dict[str, Any]:
    """Megatron-Core's optimizer CPU offload (its HybridDeviceOptimizer). ``validate_args`` refuses
    ``--optimizer-cpu-offload`` without ``--use-precision-aware-optimizer``, and ``OptimizerConfig`` refuses that
    without ``--optimizer adam`` and ``--use-distributed-optimizer``. ``--optimizer-offload-fraction`` is given:
    it defaults to 0 in Megatron-Core's ``OptimizerConfig`` (1.0 in older ``arguments.py``)."""
    if getattr(plan, "optimizer", "adam") == "sgd":
        problems.append("offload optimizer with optimizer sgd: Megatron-LM's --optimizer-cpu-offload needs "
                        "--use-precision-aware-optimizer, which Megatron-Core takes with adam only; shown: sgd "
                        "on the GPU, holding the optimizer state in device memory, more than planned")
        return {}
    args: dict[str, Any] = {"--use-distributed-optimizer": True, "--optimizer-cpu-offload": True,
                            "--optimizer-offload-fraction": 1.0, "--use-precision-aware-optimizer": True}
    if getattr(plan, "zero", 0) == 0:
        said = ("offload optimizer at ZeRO 0 (every replica keeps the whole optimizer state in host memory): "
                "Megatron-LM's --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs "
                f"--use-distributed-optimizer (ZeRO-1); shown: the distributed optimizer, {_sharded_offload(shape.dp)}")
        (problems if shape.dp > 1 else notes).append(said)
    if plan.offload == "full":
        problems.append("offload full: Megatron-LM offloads the optimizer (--optimizer-cpu-offload), not the "
                        "parameters; shown: the optimizer only")
    return args


def _sharded_offload(dp: int) -> str:
    """What ZeRO-1, the engines' one way to offload the optimizer, does to a plan's ZeRO-0 offload."""
    if dp == 1:
        return "over one data-parallel rank, which shards nothing: the same state as planned"
    return (f"sharded over the {dp} data-parallel ranks, each offloading and stepping 1/{dp} of it: less host memory "
            "and CPU work per rank than planned")


def _megatron_architecture(cfg, problems: list[str], seq_len: int) -> dict[str, Any]:
    """The model beyond its sizes as Megatron-LM's GPT takes it (its defaults: GELU, LayerNorm, biases, learned
    absolute positions, tied embeddings, dropout); what it cannot build goes to ``problems``. Without these a
    Llama exported as sizes alone builds a GPT-2-style model of other parameters and FLOPs."""
    args: dict[str, Any] = {}
    if cfg.family == "bert":
        problems.append("an encoder (BERT: bidirectional attention): Megatron-LM's pretrain_gpt.py builds a causal "
                        "decoder; train it with pretrain_bert.py and these parallel settings")
    if cfg.activation == "swiglu" and cfg.gate_activation == "gelu":
        problems.append("a GeGLU MLP (GELU-gated, Gemma): Megatron-LM's arguments gate with SiLU only (--swiglu); "
                        "shown: a plain GELU MLP, with a third fewer MLP weights")
    elif cfg.activation == "swiglu":
        args["--swiglu"] = True
    elif cfg.activation == "relu":
        problems.append("ReLU activation (OPT): Megatron-LM's GPT offers GELU, SwiGLU and squared ReLU; shown: GELU")
    if cfg.norm == "rmsnorm":
        args["--normalization"] = "RMSNorm"
    if not cfg.bias:
        args["--disable-bias-linear"] = True  # Megatron-Core: the qkv bias is add_bias_linear or add_qkv_bias
        if cfg.qkv_bias:
            args["--add-qkv-bias"] = True
    if not cfg.learned_positions:
        args["--position-embedding-type"] = "rope"
    if not cfg.tied_embeddings:
        args["--untie-embeddings-and-output-weights"] = True
    if not cfg.dropout:
        args.update({"--attention-dropout": 0.0, "--hidden-dropout": 0.0})
    problems += _unexpressed_layers_and_head(cfg, seq_len)
    if cfg.embed_dim and cfg.embed_dim != cfg.hidden_size:
        problems.append(f"an embedding {cfg.embed_dim} wide projected to the hidden size {cfg.hidden_size} (OPT-350m): "
                        "Megatron-LM's GPT embeds at the hidden size; shown: at the hidden size")
    return args


def _unexpressed_layers_and_head(cfg, seq_len: int) -> list[str]:
    """A sliding window, a classification head and what hetpart's model holds only approximately
    (:attr:`~hetpart.graph.transformer.TransformerConfig.unmodelled`): the engines' arguments build none. A window
    of at least ``seq_len`` tokens covers every key: that attention is full causal attention, nothing lost."""
    out = []
    windows = [w for w in cfg.sliding_windows if w and w < seq_len]
    if windows:
        sizes = ", ".join(map(str, sorted(set(windows))))
        out.append(f"sliding-window attention (window {sizes} on {len(windows)} of {cfg.num_layers} layers): these "
                   "arguments build full causal attention; shown: full attention")
    if cfg.head_task != "lm":
        out.append(f"a {cfg.head_task.replace('_', ' ')} head ({cfg.num_labels} label"
                   f"{'s' if cfg.num_labels > 1 else ''}, a reward or classifier model): the engine's GPT trains a "
                   f"language-model head; shown: one over the {cfg.vocab_size}-token vocabulary")
    out += [f"the config's {what.split(':', 1)[0]} ({what}); these settings carry nothing of it"
            for what in getattr(cfg, "unmodelled", ())]
    return out


def _rank_note(plan, shape: _Shape, engine: str) -> tuple[str, ...]:
    """Which device each rank must run on, in the engine's rank order (TP innermost, then CP, then DP, then
    PP: Megatron-Core's ``tp-cp-ep-dp-pp`` and torchtitan's device mesh agree). Given also when the plan has
    other problems (uneven shares, a batch to round): the placement is still the one to start with."""
    cp = getattr(plan, "cp", 1)
    differs = _what_differs(plan, cp * shape.tp)
    if differs:
        return (f"{engine} places ranks on one grid of equal replicas with one TP degree on every stage; {differs}, "
                "so no rank order runs it as planned: place each rank by hand (hetpart show --full lists every "
                "stage's devices)",)
    order = [r.stages[k].devices[c * shape.tp + t] for k in range(shape.pp) for r in plan.replicas
             for c in range(cp) for t in range(shape.tp)]
    from hetpart.plan import compress_device_ids

    dims = "TP innermost, then CP, then DP" if cp > 1 else "TP innermost, then DP"
    return (f"{engine} orders ranks {dims}, then PP: start rank r on device r of "
            f"[{compress_device_ids(order)}] (hetpart ids group/node/gpu)",)


def _what_differs(plan, width: int) -> str | None:
    """What keeps the plan off one rank grid: replicas of other depths, replicas of other TP widths, or stages of
    other TP widths inside alike replicas (``width``: the devices of replica 0's first stage)."""
    depths = sorted({len(r.stages) for r in plan.replicas})
    if len(depths) > 1:
        return f"this plan's replicas differ in depth ({' and '.join(map(str, depths))} stages)"
    if len({tuple(len(s.devices) for s in r.stages) for r in plan.replicas}) > 1:
        counts = Counter(", ".join(str(s.tp) for s in r.stages) for r in plan.replicas)
        said = "; ".join(f"tp {k} in {n} replica{'s' if n > 1 else ''}" for k, n in counts.items())
        return f"this plan's replicas differ in tensor-parallel width ({said})"
    if any(len(s.devices) != width for s in plan.replicas[0].stages):
        each = "" if plan.dp == 1 else f" in each of its {plan.dp} replicas"
        return (f"this plan's stages differ in tensor-parallel width "
                f"(tp {', '.join(str(s.tp) for s in plan.replicas[0].stages)}{each})")
    return None


def _megatron_partition(shape: _Shape) -> dict[str, Any]:
    """The split of decoder layers over (virtual) stages in the simplest arguments that say it exactly."""
    blocks, pp, vpp = shape.blocks, shape.pp, shape.vpp
    even = len(set(blocks)) == 1
    if vpp > 1:
        if even:
            return {"--num-layers-per-virtual-pipeline-stage": blocks[0]}
        return {"--pipeline-model-parallel-layout": _layout(blocks)}
    if even or pp == 1:
        return {}
    middle = blocks[1:-1]
    # --decoder-first/last-pipeline-num-layers must be > 0 (Megatron-Core refuses 0): an embedding or a head
    # alone on its stage takes the layout ("E|t...L", "Et...|L"; empty stages are legal there)
    if len(set(middle)) <= 1 and (not middle or middle[0] > 0) and blocks[0] > 0 and blocks[-1] > 0:
        out: dict[str, Any] = {}
        mid = middle[0] if middle else None
        if mid is None or blocks[0] != mid:
            out["--decoder-first-pipeline-num-layers"] = blocks[0]
        if mid is None or blocks[-1] != mid:
            out["--decoder-last-pipeline-num-layers"] = blocks[-1]
        return out
    return {"--pipeline-model-parallel-layout": _layout(blocks)}


def _layout(blocks: tuple[int, ...]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout``: ``E`` embedding, ``t`` per decoder layer, ``L`` loss."""
    stages = ["t" * b for b in blocks]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "L"
    return "|".join(stages)


def _megatron_optimizer_and_attention(plan, problems: list[str]) -> dict[str, Any]:
    """``--optimizer`` (adam, its default, or sgd: momentum 0.9 by default) and ``--attention-backend``
    (default ``auto``: flash or fused kernels, no score matrix; ``unfused`` stores it as eager does)."""
    args: dict[str, Any] = {}
    optimizer = getattr(plan, "optimizer", "adam")
    if optimizer == "sgd":
        args["--optimizer"] = "sgd"
    elif optimizer != "adam":
        problems.append(_optimizer_problem(optimizer, "Megatron-LM's --optimizer takes adam or sgd (its precision-aware "
                                           "optimizer, --use-precision-aware-optimizer, keeps 16-bit moments, not "
                                           "8-bit ones); shown: adam, which keeps more optimizer state than planned"))
    if getattr(plan, "attention", "fused") == "eager":
        args["--attention-backend"] = "unfused"
    return args


_OPTIMIZERS = {"adam": "Adam: two fp32 moments per parameter", "sgd": "momentum SGD: one fp32 moment per parameter",
               "adam8bit": "8-bit Adam: two 1-byte moments per parameter"}


def _optimizer_problem(optimizer: str, why: str) -> str:
    return f"optimizer {optimizer} ({_OPTIMIZERS.get(optimizer, optimizer)}, as the plan's memory and step time assume): {why}"


def _eager_problem(why: str) -> str:
    return f"attention eager (the plan keeps each layer's attention-score matrix for the backward pass): {why}"


def _megatron_recompute(mode: str) -> dict[str, Any]:
    if mode == "selective":
        return {"--recompute-granularity": "selective"}
    if mode == "full":
        return {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1}
    return {}


# --------------------------------------------------------------------------------------- torchtitan
_TITAN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}


def _torchtitan(plan, graph, shape: _Shape) -> Export:
    problems = list(shape.problems) + (_unexpressed_layers_and_head(graph.config, plan.seq_len) if graph.config else [])
    chunks = [_titan_fqns(a, b, graph.num_units) for a, b in shape.stage_units]
    split_points = _titan_split_points(chunks, shape.num_layers)
    zero = getattr(plan, "zero", 0)
    group = _shard_group(plan, shape.dp)  # FSDP2 shards over dp_shard, replicates over dp_replicate (HSDP when both > 1)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": shape.dp if zero < 3 else shape.dp // group,
        "data_parallel_shard_degree": group if zero >= 3 else 1,
        "tensor_parallel_degree": shape.tp,
        **({"context_parallel_degree": plan.cp} if getattr(plan, "cp", 1) > 1 else {}),
        "pipeline_parallel_degree": shape.pp,
        "pipeline_parallel_schedule": _TITAN_SCHEDULES[plan.schedule],
        "pipeline_parallel_microbatch_size": plan.micro_batch,
        "module_fqns_per_model_part": chunks,
    }
    if zero in (1, 2):
        problems.append(f"ZeRO stage {zero}: torchtitan shards with FSDP (ZeRO-3, data_parallel_shard_degree) or "
                        "replicates (data_parallel_replicate_degree); shown: replicated")
    # torchtitan runs local_batch_size samples per forward (split into pipeline_parallel_microbatch_size micro-batches
    # when pp > 1) and accumulates gradients over global / (local x dp) of them. Without a pipeline the plan's
    # micro-batch is the local batch; GPipe there holds every micro-batch at once, as one forward of them all does.
    per_replica = plan.global_batch // max(1, shape.dp)
    local = per_replica if shape.pp > 1 or plan.schedule == "gpipe" else plan.micro_batch
    training: dict[str, Any] = {"local_batch_size": local,
                                "global_batch_size": plan.global_batch, "seq_len": plan.seq_len}
    offload = getattr(plan, "offload", "none")
    if offload == "full":
        training["enable_cpu_offload"] = True  # FSDP2's CPUOffloadPolicy: parameters, gradients, optimizer
    elif offload == "optimizer":
        problems.append("offload optimizer: torchtitan offloads with FSDP2's CPUOffloadPolicy (parameters, gradients "
                        "and optimizer: training.enable_cpu_offload, offload full), not the optimizer alone")
    if plan.precision == "bf16":
        training["mixed_precision_param"] = "bfloat16"
    elif plan.precision == "fp32":
        training["mixed_precision_param"] = "float32"
    elif plan.precision == "fp8":
        training["mixed_precision_param"] = "bfloat16"
        problems.append("precision fp8: torchtitan turns float8 on with a model converter ([model] converters, named "
                        "float8 or quantize.linear.float8 depending on the version); shown: bfloat16, add the "
                        "converter by hand")
    else:
        problems.append(f"precision {plan.precision}: torchtitan's training.mixed_precision_param takes bfloat16 or "
                        "float32")
    optimizer = getattr(plan, "optimizer", "adam")
    if optimizer != "adam":  # build_optimizers takes Adam and AdamW ([optimizer] name, default AdamW)
        problems.append(_optimizer_problem(optimizer, "torchtitan's [optimizer] name takes Adam or AdamW; shown: its "
                                           "default, AdamW, which keeps more optimizer state than planned"))
    if getattr(plan, "attention", "fused") == "eager":
        problems.append(_eager_problem("torchtitan's models run SDPA or FlexAttention, with no eager kernel to choose; "
                                      "shown: fused attention, which stores less than planned"))
    config = {"training": training, "parallelism": parallelism,
              "activation_checkpoint": {"mode": plan.recompute}}
    text = _toml(config)
    if split_points and shape.vpp == 1:
        text += f"# older torchtitan: pipeline_parallel_split_points = {json.dumps(split_points)}\n"
        if split_points[-1] == f"layers.{shape.num_layers}":
            text += (f"# layers.{shape.num_layers} is one past the last layer: older torchtitan's "
                     "pipeline_llama_manual_split keeps a stage's layers by name, from its split point to the next, so "
                     "the stage before keeps the layers to the end and the last stage holds norm and output alone\n")
    return Export("torchtitan", text, config, tuple(problems), _rank_note(plan, shape, "torchtitan"))


def _titan_split_points(chunks: list[list[str]], num_layers: int) -> list[str]:
    """The older ``pipeline_parallel_split_points``: the first layer of every stage after the first (one stage
    per split point more). A stage of the head alone starts at ``layers.{num_layers}``, which names no layer:
    the stage before keeps every layer to the end and that stage none."""
    return [c[0] if c[0].startswith("layers.") else f"layers.{num_layers}" for c in chunks[1:] if c]


def _titan_fqns(first: int, last: int, num_units: int) -> list[str]:
    """torchtitan's module names (Llama 3: tok_embeddings, layers.i, norm, output) of units ``[first, last)``."""
    names = []
    for u in range(first, last):
        if u == 0:
            names.append("tok_embeddings")
        elif u == num_units - 1:
            names += ["norm", "output"]
        else:
            names.append(f"layers.{u - 1}")
    return names


def _toml(config: dict[str, dict[str, Any]]) -> str:
    out = []
    for section, values in config.items():
        out.append(f"[{section}]")
        out += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------- DeepSpeed
def _deepspeed(plan, graph, shape: _Shape) -> Export:
    problems = list(shape.problems)
    zero = getattr(plan, "zero", 0)
    micro = plan.micro_batch
    accumulation = plan.global_batch // max(1, micro * shape.dp)
    config: dict[str, Any] = {"train_batch_size": plan.global_batch, "train_micro_batch_size_per_gpu": micro,
                              "gradient_accumulation_steps": accumulation, "zero_optimization": {"stage": zero}}
    notes: list[str] = []
    if plan.precision in ("bf16", "fp16"):
        config[plan.precision] = {"enabled": True}
    elif plan.precision == "fp8":  # FP8 training is Transformer Engine's fp8 matmuls on top of a bf16 engine
        config["bf16"] = {"enabled": True}
        notes.append("precision fp8: the engine runs in bf16 (bf16.enabled) and the matrix multiplies in fp8 under "
                     "Transformer Engine, which DeepSpeed's config does not switch on (it has no fp8 section): "
                     "build the model's linear layers from transformer_engine.pytorch and run its forward under "
                     "te.fp8_autocast (the plan priced E4M3 forward, E5M2 gradients: recipe Format.HYBRID)")
    offload = getattr(plan, "offload", "none")
    if offload != "none":  # ZeRO-Offload; ZeRO-Infinity's parameter offload at stage 3
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if offload == "full":
            config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
        if zero == 0:  # DeepSpeed's config documentation: offload_optimizer is valid for ZeRO stages 1, 2 and 3
            zero = config["zero_optimization"]["stage"] = 1
            said = ("offload optimizer at ZeRO 0 (every replica keeps the whole optimizer state in host memory): "
                    "DeepSpeed's offload_optimizer is valid for ZeRO stages 1-3 only (at stage 0 no ZeRO optimizer "
                    f"runs to offload); shown: stage 1, the optimizer state {_sharded_offload(shape.dp)}")
            (problems if shape.dp > 1 else notes).append(said)
    _deepspeed_optimizer(plan, config, problems)
    if getattr(plan, "attention", "fused") == "eager":
        problems.append(_eager_problem("a DeepSpeed config does not choose the attention kernel, the model code does "
                                       "(run its unfused attention, e.g. Hugging Face attn_implementation=\"eager\", "
                                       "for the memory planned)"))
    if shape.tp > 1:
        problems.append(_deepspeed_tp_problem(plan, shape))
    if shape.vpp > 1:
        problems.append(f"interleaved schedule ({shape.vpp} chunks per device): DeepSpeed pipelines run 1F1B "
                        "with one chunk per stage")
    if plan.schedule == "gpipe":
        problems.append("schedule gpipe: DeepSpeed's pipeline engine runs 1F1B")
    group = _shard_group(plan, shape.dp)
    if group < shape.dp and zero >= 3:  # MiCS: all ZeRO-3 states sharded inside groups of consecutive ranks
        config["zero_optimization"]["mics_shard_size"] = group
        notes.append("mics_shard_size (MiCS): build the model under deepspeed.zero.MiCS_Init(config_dict_or_path=...) "
                      "instead of deepspeed.zero.Init")
    elif group < shape.dp:
        problems.append(f"hybrid sharding (shard_group {group}: ZeRO-{zero} states sharded inside groups of {group} "
                        f"replicas, replicated across the {shape.dp // group} groups): DeepSpeed's hierarchical "
                        f"sharding (MiCS, mics_shard_size) is ZeRO-3 only; shown: stage {zero} over all {shape.dp} "
                        "data-parallel ranks")
    if getattr(plan, "cp", 1) > 1:
        problems.append(f"context parallelism (cp {plan.cp}, ring attention): DeepSpeed's sequence parallelism is "
                        "Ulysses (all-to-all over heads), another scheme")
    if zero >= 2 and shape.pp > 1:
        problems.append(f"ZeRO stage {zero} with pipeline parallelism: DeepSpeed supports ZeRO-1 with pipelines")
    if plan.recompute == "selective":
        problems.append("selective recomputation: PipelineModule checkpoints whole layers "
                        "(activation_checkpoint_interval)")
    parts = [a for a, _ in shape.stage_units] + [graph.num_units]
    pipe: dict[str, Any] = {"num_stages": shape.pp}
    if parts == _ds_partition_uniform(graph.num_units, len(parts) - 1):
        pipe["partition_method"] = "uniform"
    elif shape.vpp == 1:
        problems.append(f"the pipeline partition (layer boundaries {parts} over the {graph.num_units} "
                        "embedding, block and head layers): PipelineModule's partition_method takes uniform, "
                        "parameters or type:REGEX; set these boundaries as self.parts in a PipelineModule "
                        "subclass's _partition_layers")
    if plan.recompute == "full":
        pipe["activation_checkpoint_interval"] = 1
    text = json.dumps(config, indent=2) + "\n"
    args = ", ".join(f"{k}={v!r}" for k, v in pipe.items())
    notes.insert(0, f"PipelineModule(layers=..., {args})")
    return Export("deepspeed", text, {"config": config, "pipeline_module": pipe}, tuple(problems), tuple(notes))


def _deepspeed_tp_problem(plan, shape: _Shape) -> str:
    """TP under DeepSpeed: its batch figures hold for Megatron-DeepSpeed's grid (dp ranks of tp GPUs each);
    plain DeepSpeed makes every GPU of a pipeline stage a data-parallel rank, and checks
    train_batch_size = micro x accumulation x those ranks."""
    head = (f"tensor parallelism (tp {shape.tp}): DeepSpeed's PipelineModule has no TP of its own (Megatron-DeepSpeed "
            f"adds it); the batch figures shown count {shape.dp} data-parallel ranks of tp {shape.tp}, as "
            "Megatron-DeepSpeed does, while plain DeepSpeed makes ")
    counts = _stage_gpus(plan, shape.pp)
    if len(set(counts)) > 1:  # an uneven plan: there is no one figure per stage to give
        return (head + "every GPU of a stage a data-parallel rank and needs as many in each stage; these stages "
                f"hold {_counted(counts)} GPUs")
    ranks = counts[0]
    per_step = plan.micro_batch * ranks
    there = (f"gradient_accumulation_steps {plan.global_batch // per_step} there" if plan.global_batch % per_step == 0
             else f"no whole gradient_accumulation_steps gives {plan.global_batch} there (a multiple of {per_step} does)")
    return head + f"all {ranks} GPUs of a stage data-parallel ranks: {there}"


def _stage_gpus(plan, pp: int) -> list[int]:
    """GPUs of each physical pipeline stage over every replica (a device group of interleaved chunks counted once)."""
    counts = [0] * pp
    for replica in plan.replicas:
        groups = list(dict.fromkeys(stage.devices for stage in replica.stages))
        for g, devices in enumerate(groups[:pp]):
            counts[g] += len(devices)
    return counts


def _counted(counts: list[int]) -> str:
    """``[2, 1, 1]`` as ``2, 1 and 1``."""
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _deepspeed_optimizer(plan, config: dict[str, Any], problems: list[str]) -> None:
    """The config's ``optimizer`` section where the plan's is not Adam (no section: the client's optimizer, or
    one named there). ``SGD`` is not one of DeepSpeed's own types: the engine takes it from ``torch.optim``,
    and ZeRO runs it only when allowed (``zero_allow_untested_optimizer``; with offload also
    ``zero_force_ds_cpu_optimizer`` off, which otherwise insists on DeepSpeedCPUAdam)."""
    optimizer = getattr(plan, "optimizer", "adam")
    if optimizer == "sgd":
        config["optimizer"] = {"type": "SGD", "params": {"momentum": 0.9}}
        if config["zero_optimization"]["stage"] >= 1:
            config["zero_allow_untested_optimizer"] = True
        if getattr(plan, "offload", "none") != "none":
            config["zero_force_ds_cpu_optimizer"] = False
    elif optimizer != "adam":
        problems.append(_optimizer_problem(optimizer, "DeepSpeed's optimizer types have no 8-bit Adam (pass "
                                           "bitsandbytes' Adam8bit to deepspeed.initialize(optimizer=...), with "
                                           "zero_allow_untested_optimizer under ZeRO); shown: no optimizer section"))


def _ds_partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """``deepspeed.runtime.utils.partition_uniform``: equal chunks, the first ``residual`` parts one larger."""
    if num_items <= num_parts:
        return [min(i, num_items) for i in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    parts = [i * chunk for i in range(num_parts + 1)]
    for i in range(residual):
        for j in range(i + 1, num_parts + 1):
            parts[j] += 1
    return parts
