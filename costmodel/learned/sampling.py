"""Random scenarios and random valid plans: the inputs of the learned cost model's data set.

A *scenario* is a model, a cluster and a workload; a *plan* is what the simulator labels. Both are
drawn from a seeded :class:`random.Random`, so a data set is reproducible from its seed.

Plans cover what planners emit and more: one tensor-parallel degree per plan or per stage, device
slots in cluster order, sorted by speed or shuffled, pipeline cuts even, random or in proportion to
stage speed, replicas of different depths, batch shares even or in proportion to replica speed,
every micro-batch size and recompute mode, 1F1B, GPipe or interleaved schedules.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, replace
from dataclasses import dataclass

from hetpart.catalog.hardware import GPU_CATALOG, NIC_CATALOG
from hetpart.catalog.models import MODEL_CATALOG
from hetpart.cluster import Cluster, parse_cluster
from hetpart.graph.model_graph import ModelGraph
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan, Replica, Stage

__all__ = ["Scenario", "random_transformer", "random_cluster", "random_scenario", "random_plan", "neighbour",
           "model_family", "held_out_configs"]

_INTRA_BY_VENDOR = {"nvidia": ("PCIe4", "NVLink2", "NVLink3", "NVLink4", "PCIe5"), "amd": ("xGMI", "PCIe4"),
                    "huawei": ("HCCS",), "intel": ("PCIe4",), "other": ("PCIe4",)}


@dataclass(frozen=True)
class Scenario:
    """A model, a cluster and a workload."""

    name: str
    model: ModelGraph
    cluster: Cluster
    global_batch: int
    family: str
    """The model family (``gpt2``, ``llama``, ``opt``, ``bert``; catalog names keep their series:
    ``gpt3``, ``llama3``): what held-out splits keep apart."""
    shape: str
    """The cluster's shape: ``{types}t{zones}z`` (device types, zones)."""
    model_spec: dict
    """``{"name", "config" (TransformerConfig fields), "seq_len"}``: rebuilds the model."""
    cluster_spec: dict
    """The cluster in the cluster YAML schema."""

    @staticmethod
    def rebuild(model_spec: dict, cluster_spec: dict) -> tuple[ModelGraph, Cluster]:
        """The model and cluster of stored specs."""
        cfg = TransformerConfig(**model_spec["config"])
        model = transformer_graph(cfg, model_spec["name"], model_spec["seq_len"], 2, source="random")
        return model, parse_cluster(cluster_spec, "<stored cluster>")


def model_family(name: str, cfg: TransformerConfig) -> str:
    """``gpt2``, ``gpt3``, ``llama2``, ``llama3``, ``opt``, ``bert`` for catalog names; ``random-<family>`` else."""
    for series in ("gpt2", "gpt3", "llama2", "llama3", "opt", "bert"):
        if name.startswith(series):
            return series
    return f"random-{cfg.family}"


def held_out_configs(families: tuple[str, ...]) -> tuple[TransformerConfig, ...]:
    """The configs of the catalog models whose :func:`model_family` is in ``families`` (a data set's
    ``heldout_families``): random shapes must not equal one (:func:`random_transformer`'s ``refuse``)."""
    return tuple(cfg for name, cfg in MODEL_CATALOG.items() if model_family(name, cfg) in families)


def random_transformer(rng: random.Random, refuse: tuple[TransformerConfig, ...] = ()) -> TransformerConfig:
    """A random GPT-2-like or Llama-like shape between ~50M and ~200B parameters, drawn again while its
    architecture (:meth:`~hetpart.graph.transformer.TransformerConfig.architecture`) is one of ``refuse``'s:
    a held-out family is held out by what its models are, not by their names (Llama-style shapes of 32 x 4096
    with 8 KV heads, a 14336-wide MLP and 128256 tokens are llama3-8b)."""
    held = {cfg.architecture() for cfg in refuse}
    cfg = _random_transformer(rng)
    while cfg.architecture() in held:
        cfg = _random_transformer(rng)
    return cfg


def _random_transformer(rng: random.Random) -> TransformerConfig:
    heads = rng.choice([8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128])
    head_dim = rng.choice([64, 64, 80, 96, 128, 128])
    hidden = heads * head_dim
    layers = rng.randint(4, 96)
    if rng.random() < 0.5:
        return TransformerConfig("gpt2", layers, hidden, heads, rng.choice([32000, 50257, 65536]), 8192)
    kv = rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0])
    ffn = int(hidden * rng.uniform(2.5, 3.6) / 64) * 64
    return TransformerConfig("llama", layers, hidden, heads, rng.choice([32000, 100352, 128256]), 8192,
                             ffn_hidden_size=ffn, num_kv_heads=kv, tied_embeddings=False, activation="swiglu",
                             norm="rmsnorm", bias=False, learned_positions=False, dropout=False)


def _node_group(rng: random.Random, gpu: str, count: int, zone: str) -> dict:
    vendor = GPU_CATALOG[gpu].vendor
    gpn = rng.choice([1, 2, 4, 8, 8, 8]) if count > 1 else rng.choice([2, 4, 8, 8])
    nic = rng.choice(sorted(NIC_CATALOG))
    return {"count": count, "gpus_per_node": gpn, "gpu": gpu, "intra_node": rng.choice(_INTRA_BY_VENDOR[vendor]),
            "nic": nic, "nics_per_node": rng.choice([1, 1, 2, 4, 8]), "zone": zone}


def random_cluster(rng: random.Random, max_devices: int = 4096, types: int | None = None) -> tuple[Cluster, dict]:
    """A cluster of 1 to 4 device types (from the catalog), 2 to ``max_devices`` devices, 1 to 3 zones,
    and its spec in the cluster YAML schema."""
    types = types or rng.choice([1, 2, 2, 3, 3, 4])
    gpus = rng.sample(sorted(GPU_CATALOG), types)
    zones = [f"z{i}" for i in range(min(types, rng.choice([1, 1, 1, 2, 3])))]
    budget = int(2 ** rng.uniform(1, max(1.0, math.log2(max_devices))))
    groups = []
    for i, gpu in enumerate(gpus):
        share = max(1, budget // (types * 8))
        groups.append(_node_group(rng, gpu, rng.randint(1, max(1, share)), zones[i % len(zones)]))
    links = []
    for i in range(1, len(zones)):
        for j in range(i):
            links.append({"zones": [zones[j], zones[i]], "bandwidth_gbit_s": rng.choice([10, 25, 100, 400]),
                          "latency_us": rng.choice([50, 200, 1000, 5000])})
    spec = {"name": f"random-{types}t{len(zones)}z", "nodes": groups, "links": links}
    cluster = parse_cluster(spec, "<random cluster>")
    if cluster.num_devices < 2:
        groups[0]["count"] += 1
        cluster = parse_cluster(spec, "<random cluster>")
    return cluster, spec


def random_scenario(rng: random.Random, families: tuple[str, ...] | None = None, max_devices: int = 4096,
                    catalog_share: float = 0.4, refuse: tuple[TransformerConfig, ...] = ()) -> Scenario:
    """A catalog or random transformer on a random cluster, with a global batch and sequence length
    (``refuse``: architectures a random transformer must not have, :func:`random_transformer`)."""
    if rng.random() < catalog_share:
        names = [n for n in MODEL_CATALOG if families is None or model_family(n, MODEL_CATALOG[n]) in families]
        name = rng.choice(names) if names else None
    else:
        name = None
    if name is None:
        cfg = random_transformer(rng, refuse)
        name = f"random-{cfg.family}-{cfg.num_layers}x{cfg.hidden_size}"
    else:
        cfg = MODEL_CATALOG[name]
    seq = rng.choice([s for s in (512, 1024, 2048, 4096) if s <= cfg.max_positions or not cfg.learned_positions])
    model = transformer_graph(cfg, name, seq, 2, source="random")
    cluster, spec = random_cluster(rng, max_devices)
    batch = rng.choice([64, 128, 256, 512, 1024, 2048])
    shape = f"{len(cluster.gpu_types)}t{len(cluster.zones)}z"
    return Scenario(f"{name}@{cluster.name}", model, cluster, batch, model_family(name, cfg), shape,
                    {"name": name, "config": asdict(cfg), "seq_len": seq}, spec)


def _slots(rng: random.Random, cluster: Cluster, tp: int) -> list[tuple[tuple[str, ...], float]]:
    """Groups of ``tp`` consecutive devices of one node with their speed (TFLOPS x tp)."""
    out = []
    for g, group in enumerate(cluster.groups):
        if group.gpus_per_node % tp:
            continue
        for n in range(group.count):
            for s in range(group.gpus_per_node // tp):
                ids = tuple(f"{g}/{n}/{s * tp + i}" for i in range(tp))
                out.append((ids, group.gpu.tflops_bf16 * tp))
    return out


def _cuts(rng: random.Random, units: int, speeds: list[float]) -> list[int]:
    pp = len(speeds)
    if pp == 1:
        return [0, units]
    r = rng.random()
    if r < 0.4:
        bounds, acc = [0], 0.0
        for i in range(pp - 1):
            acc += speeds[i] / sum(speeds)
            bounds.append(min(max(round(acc * units), bounds[-1] + 1), units - (pp - 1 - i)))
        return bounds + [units]
    if r < 0.6:
        return [round(i * units / pp) for i in range(pp + 1)]
    return [0] + sorted(rng.sample(range(1, units), pp - 1)) + [units]


def random_plan(rng: random.Random, model: ModelGraph, cluster: Cluster, global_batch: int,
                max_replicas: int = 64) -> Plan | None:
    """A random plan that passes :meth:`Plan.validate` structurally (memory may not fit), or None
    when this draw found none (too few devices for the chosen degrees)."""
    heads = (model.arch or {}).get("num_heads") or 1
    tps = [t for t in (1, 2, 4, 8) if heads % t == 0 and any(g.gpus_per_node % t == 0 for g in cluster.groups)]
    tp = rng.choice(tps)
    slots = _slots(rng, cluster, tp)
    order = rng.random()
    if order < 0.35:
        rng.shuffle(slots)
    elif order < 0.7:
        slots.sort(key=lambda s: -s[1])
    units = model.num_units
    pps = [p for p in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if p <= len(slots) and p <= units]
    pp = rng.choice(pps)
    mb = rng.choice([1, 1, 2, 4, 8])
    total_mb = global_batch // mb
    if total_mb < 1:
        return None
    dp = min(len(slots) // pp, total_mb, max_replicas)
    if rng.random() < 0.4:
        dp = rng.randint(1, dp)
    groups = [slots[i * pp:(i + 1) * pp] for i in range(dp)]
    speeds = [min(s for _, s in st) for st in groups]
    if dp > 1 and rng.random() < 0.5:
        counts = [max(1, int(total_mb * v / sum(speeds))) for v in speeds]
    else:
        counts = [max(1, total_mb // dp)] * dp
    counts[max(range(dp), key=lambda i: speeds[i])] += total_mb - sum(counts)
    if min(counts) < 1:
        return None
    schedule = rng.choice(["1f1b", "1f1b", "1f1b", "gpipe", "interleaved"])
    v = 1
    if schedule == "interleaved":
        vs = [x for x in (2, 3, 4) if pp > 1 and pp * x <= units and all(c % pp == 0 for c in counts)]
        if not vs:
            schedule = "1f1b"
        else:
            v = rng.choice(vs)
    same_cuts = rng.random() < 0.5
    shared = _cuts(rng, units, [s for _, s in groups[0]] * v)
    replicas = []
    for st, c in zip(groups, counts):
        b = shared if same_cuts else _cuts(rng, units, [s for _, s in st] * v)
        stages = tuple(Stage((b[i], b[i + 1]), st[i % pp][0], tp) for i in range(pp * v))
        replicas.append(Replica(c * mb / global_batch, stages))
    return Plan(global_batch=global_batch, micro_batch=mb, seq_len=model.seq_len, replicas=tuple(replicas),
                schedule=schedule, interleave=v, recompute=rng.choice(["none", "selective", "full"]))


def neighbour(rng: random.Random, plan: Plan, num_units: int) -> Plan | None:
    """A plan one move away: a stage boundary shifted, the micro-batch halved or doubled, or another
    recompute mode (what a local search tries next)."""
    move = rng.random()
    if move < 0.5:
        r = rng.randrange(plan.dp)
        rep = plan.replicas[r]
        if rep.pp < 2:
            return None
        k = rng.randrange(rep.pp - 1)
        a, z = rep.stages[k].layers[0], rep.stages[k + 1].layers[1]
        cut = rep.stages[k].layers[1] + rng.choice([-2, -1, 1, 2])
        if not a < cut < z:
            return None
        stages = list(rep.stages)
        stages[k] = Stage((a, cut), stages[k].devices, stages[k].tp)
        stages[k + 1] = Stage((cut, z), stages[k + 1].devices, stages[k + 1].tp)
        reps = list(plan.replicas)
        reps[r] = Replica(rep.batch_share, tuple(stages))
        return replace(plan, replicas=tuple(reps))
    if move < 0.8:
        mb = plan.micro_batch * 2 if rng.random() < 0.5 else plan.micro_batch // 2
        if mb < 1 or any(s % mb for s in plan.replica_samples()):
            return None
        return replace(plan, micro_batch=mb)
    return replace(plan, recompute=rng.choice([m for m in ("none", "selective", "full") if m != plan.recompute]))
