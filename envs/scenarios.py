"""Random planning problems for the environment: models, heterogeneous clusters and workloads.

A :class:`ScenarioDistribution` names what may be drawn; :func:`sample_scenario` draws one with a
``numpy`` generator (so an environment seeded the same draws the same problems). Models are catalog
entries or random transformer shapes of the allowed families; clusters have 1 to ``max_types``
device types (node groups of one type may differ in NIC and zone), ``min_devices`` to
``max_devices`` GPUs, NIC mixes and zones joined by links; workloads draw batch and sequence length.

Held out of the default training distribution (:data:`HELD_OUT`), so that the benchmark can judge
the policy on what it never saw: every ``llama*`` and ``gpt3-13b``/``gpt3-175b`` catalog model (random
GPT-2- and Llama-style shapes of at most 48 blocks are drawn instead), models of more than 48 blocks,
clusters of more than 128 GPUs, and clusters of 4 device types.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.workload import Workload

__all__ = ["ScenarioDistribution", "sample_scenario", "HELD_OUT", "GPU_TYPES", "held_out_models"]

HELD_OUT = ("catalog models llama2-*, llama3-*, gpt3-13b, gpt3-175b", "models of more than 48 blocks",
            "clusters of more than 128 GPUs", "clusters of 4 device types")
_HELD_OUT_SERIES = ("llama2-", "llama3-")
_HELD_OUT_NAMES = ("gpt3-13b", "gpt3-175b")


def held_out_models() -> tuple[str, ...]:
    """The catalog models :data:`HELD_OUT` names (its first entry): never in the default ``catalog_models``, and
    no random shape has the architecture of one (:meth:`~hetpart.graph.transformer.TransformerConfig.
    architecture`: Llama-style shapes of 32 x 4096 with 32 KV heads are llama2-7b under another name)."""
    from hetpart.catalog.models import MODEL_CATALOG

    return tuple(n for n in MODEL_CATALOG if n.startswith(_HELD_OUT_SERIES) or n in _HELD_OUT_NAMES)

GPU_TYPES: dict[str, tuple[str, tuple[str, ...], int]] = {
    # device type: (intra-node link, NICs it is found with, GPUs per node)
    "V100-16GB": ("NVLink2", ("Ethernet-25", "Ethernet-100", "IB-EDR"), 8),
    "V100-32GB": ("NVLink2", ("Ethernet-100", "IB-EDR"), 8),
    "T4-16GB": ("PCIe3", ("Ethernet-10", "Ethernet-25"), 4),
    "A10-24GB": ("PCIe4", ("Ethernet-25", "Ethernet-100"), 4),
    "L4-24GB": ("PCIe4", ("Ethernet-25", "Ethernet-100"), 8),
    "RTX3090-24GB": ("PCIe4", ("Ethernet-10", "Ethernet-25"), 8),
    "RTX4090-24GB": ("PCIe4", ("Ethernet-25",), 8),
    "A6000-48GB": ("PCIe4", ("Ethernet-25", "Ethernet-100"), 4),
    "A100-40GB": ("NVLink3", ("Ethernet-100", "RoCE-200", "IB-HDR"), 8),
    "A100-80GB": ("NVLink3", ("RoCE-200", "IB-HDR"), 8),
    "H100-80GB": ("NVLink4", ("RoCE-400", "IB-NDR"), 8),
    "H200-141GB": ("NVLink4", ("IB-NDR",), 8),
    "MI250X-GCD-64GB": ("xGMI", ("RoCE-200",), 8),
    "MI300X-192GB": ("xGMI", ("RoCE-400",), 8),
    "Ascend910B-64GB": ("HCCS", ("RoCE-200",), 8),
}
_TRAIN_MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b",
                 "opt-350m", "bert-large")


@dataclass(frozen=True)
class ScenarioDistribution:
    """What :func:`sample_scenario` may draw (defaults: the training distribution)."""

    catalog_models: tuple[str, ...] = _TRAIN_MODELS
    """Catalog models, drawn ``catalog_share`` of the time."""
    catalog_share: float = 0.5
    """Chance of a catalog model rather than a random shape."""
    families: tuple[str, ...] = ("gpt2", "llama")
    """Families of the random transformer shapes drawn otherwise (``gpt2``, ``llama``)."""
    max_layers: int = 48
    """Largest number of blocks of a random shape."""
    gpu_types: tuple[str, ...] = tuple(GPU_TYPES)
    """Device types clusters are made of."""
    min_types: int = 1
    max_types: int = 3
    """Device types per cluster."""
    min_devices: int = 2
    max_devices: int = 128
    """GPUs per cluster."""
    batches: tuple[int, ...] = (32, 64, 128, 256, 512)
    """Global batch sizes, sequences."""
    seq_lens: tuple[int, ...] = (512, 1024, 2048)
    """Sequence lengths, tokens."""
    zone_probability: float = 0.3
    """Chance that a cluster spans two zones."""
    extra: dict = field(default_factory=dict, compare=False)


@functools.lru_cache(maxsize=1)
def _held_out_architectures() -> frozenset:
    from hetpart.catalog.models import MODEL_CATALOG

    return frozenset(MODEL_CATALOG[n].architecture() for n in held_out_models())


def _random_model(rng: np.random.Generator, dist: ScenarioDistribution, seq_len: int) -> "ModelGraph":
    """A random shape, drawn again while it is a held-out model's architecture (:func:`held_out_models`)."""
    from hetpart.graph.transformer import transformer_graph

    held = _held_out_architectures()
    cfg = _random_config(rng, dist, seq_len)
    while cfg.architecture() in held:
        cfg = _random_config(rng, dist, seq_len)
    return transformer_graph(cfg, f"random-{cfg.family}-{cfg.num_layers}x{cfg.hidden_size}", seq_len, 2,
                             source=f"random:{cfg.family}")


def _random_config(rng: np.random.Generator, dist: ScenarioDistribution, seq_len: int):
    from hetpart.graph.transformer import TransformerConfig

    family = str(rng.choice(dist.families))
    head_dim = int(rng.choice([64, 128]))
    heads = int(rng.choice([8, 12, 16, 24, 32, 40, 48]))
    layers = int(rng.integers(4, dist.max_layers + 1))
    hidden = heads * head_dim
    if family == "llama":
        kv = int(rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
        cfg = TransformerConfig("llama", layers, hidden, heads, 32000, max(4096, seq_len),
                                ffn_hidden_size=int(hidden * 8 / 3) // 256 * 256 + 256, num_kv_heads=kv,
                                tied_embeddings=False, activation="swiglu", norm="rmsnorm", bias=False,
                                learned_positions=False, dropout=False)
    else:
        cfg = TransformerConfig("gpt2", layers, hidden, heads, 50257, max(2048, seq_len))
    return cfg


def _random_cluster(rng: np.random.Generator, dist: ScenarioDistribution) -> "Cluster":
    from hetpart.cluster import parse_cluster

    types = list(rng.choice(dist.gpu_types, size=int(rng.integers(dist.min_types, dist.max_types + 1)),
                            replace=False))
    two_zones = len(types) > 1 and rng.random() < dist.zone_probability
    budget = int(np.exp(rng.uniform(np.log(dist.min_devices), np.log(dist.max_devices))))
    nodes = []
    for i, gpu in enumerate(types):
        link, nics, per_node = GPU_TYPES[gpu]
        share = max(per_node, budget // len(types))
        count = max(1, min(share // per_node, (dist.max_devices // len(types)) // per_node))
        if per_node * count < dist.min_devices and len(types) == 1:
            count = -(-dist.min_devices // per_node)
        nodes.append({"count": count, "gpus_per_node": per_node, "gpu": str(gpu), "intra_node": link,
                      "nic": str(rng.choice(nics)), "nics_per_node": int(rng.choice([1, 2, 4, 8])),
                      "zone": "b" if two_zones and i == len(types) - 1 else "a"})
    data = {"name": "random", "nodes": nodes}
    if two_zones:
        data["links"] = [{"zones": ["a", "b"], "bandwidth_gbit_s": float(rng.choice([10, 25, 100, 400])),
                          "latency_us": float(rng.choice([50, 500, 2000]))}]
    return parse_cluster(data, source="<random cluster>")


def sample_scenario(rng: np.random.Generator, dist: ScenarioDistribution
                    ) -> tuple["ModelGraph", "Cluster", "Workload"]:
    """One (model, cluster, workload) drawn from ``dist`` (not yet checked for a fitting plan)."""
    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.graph.load import load_model
    from hetpart.workload import Workload

    seq_len = int(rng.choice(dist.seq_lens))
    if dist.catalog_models and rng.random() < dist.catalog_share:
        name = str(rng.choice(dist.catalog_models))
        seq_len = min(seq_len, MODEL_CATALOG[name].max_positions)
        model = load_model(name, seq_len=seq_len)
    else:
        model = _random_model(rng, dist, seq_len)
    return model, _random_cluster(rng, dist), Workload(int(rng.choice(dist.batches)), seq_len)
