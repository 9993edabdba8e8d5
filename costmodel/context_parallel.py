"""Context parallelism (``cp > 1``): what splitting every sequence over ``cp`` devices costs and saves.

The scheme priced is Megatron-Core's (``context_parallel_size``, run inside Transformer Engine's fused
attention, ``AttnFuncWithCPAndKVP2P``; the ring attention of Liu et al. 2023, "Ring Attention with
Blockwise Transformers"), which NeMo and torchtitan's ring variant use the same way:

* **The split.** Each sequence is cut into ``2 cp`` equal chunks and context-parallel rank ``c`` holds
  chunks ``c`` and ``2 cp - 1 - c`` (the load-balanced causal split: every rank then has the same share
  of the causal score blocks). Every linear layer, MLP, norm and the head run on ``s / cp`` tokens, so
  their FLOPs and their activations divide by ``cp`` (:func:`hetpart.costmodel.compute.unit_compute_s`);
  so does the attention core, whose ``cp`` ring steps each compute two of the ``2 cp^2`` half-blocks
  (equal steps).
* **The ring** (per attention layer, forward): ``cp`` steps; at step ``i`` a rank computes attention of
  its queries against the key/value chunks it holds while it sends those to the next rank and receives
  the previous rank's (``cp - 1`` transfers of the local ``K`` and ``V``: under grouped-query attention
  only the key/value heads, ``2 (s / cp) b d_head kv_heads / tp`` elements per tensor-parallel rank).
  The transfer of a step runs beside that step's compute, so a step costs
  ``max(compute step, transfer step)``; the exposed part is what the ring adds.
* **Backward**: the ring runs again, carrying ``K, V`` and the accumulated ``dK, dV`` (step 0 sends
  ``K, V``; steps 1 to ``cp - 2`` both, twice the bytes; the last step ``dK, dV``), each beside that
  step's attention backward (2.5 times the forward core: the two gradient products and the recomputed
  scores). Full recomputation runs the forward ring again.
* **Links.** The ring crosses the link between consecutive context-parallel ranks (NVLink when they share
  a node, the NIC otherwise); each rank's ``tp`` tensor-parallel ranks send at once, and every stage's
  rings leaving a node share its NICs (all stages compute attention at about the same time). The
  slowest hop paces the ring (each step ends when every rank has its next block). Over TCP NICs the
  sends do not overlap compute (NCCL's socket transport, as for pipeline sends), so they are paid whole.
* **Gradients and memory.** Parameters are replicated over the ``cp`` ranks: the data-parallel gradient
  reduction runs over ``dp x cp`` ranks (Megatron-Core's ``data_parallel_group(with_context_parallel=
  True)``), and so does the distributed optimizer's sharding (ZeRO levels here). Activations (saved and
  working set) are per token, so they divide by ``cp``; model states do not. The ring's two extra
  key/value buffers (one layer's ``K, V`` received while the next is computed) are under 1% of a
  layer's activations and are left out.

Not modelled: the all-to-all (Ulysses) and all-gather (Llama 3's) variants of context parallelism,
uneven tensor-parallel splits with ``cp > 1``, and eager attention (Megatron-Core runs context
parallelism only in the fused kernel; :meth:`hetpart.plan.Plan.validate` refuses those).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hetpart.cluster import PathLink
from hetpart.graph.model_graph import ModelGraph

__all__ = ["ring_hops", "kv_bytes_per_step", "ring_step_s", "ring_exposed_s"]


def ring_hops(devices: Sequence[str], tp: int, cp: int) -> list[tuple[str, str]]:
    """``(sender, receiver)`` of each hop of a stage's ring, by the first device of each context-parallel
    rank's tensor-parallel group (``devices[c * tp]``; the other ``tp - 1`` ranks send beside it)."""
    return [(devices[c * tp], devices[((c + 1) % cp) * tp]) for c in range(cp)]


def kv_bytes_per_step(model: ModelGraph, tp: int, cp: int, micro_batch: int) -> np.ndarray:
    """Bytes one device sends per ring step, per unit: its ``K`` and ``V`` for its ``s / cp`` tokens (its
    ``kv_heads / tp`` key/value heads, at least one: tensor parallelism beyond the key/value heads
    replicates them); 0 for units without attention."""
    cfg = model.config
    if cfg is None:
        return np.zeros(model.num_units)
    heads = max(cfg.kv_heads / tp, 1.0)
    per_block = 2.0 * heads * cfg.head_dim * model.dtype_bytes * model.seq_len / cp * micro_batch
    return np.array([per_block if u.kind == "block" else 0.0 for u in model.units])


def ring_step_s(nbytes: np.ndarray, links: Sequence[PathLink]) -> np.ndarray:
    """Seconds of one ring step per unit: the slowest hop's latency plus ``nbytes`` over its bandwidth
    (0 where nothing is sent)."""
    out = np.zeros_like(nbytes, dtype=float)
    for link in links:
        if link.kind == "self":
            continue
        out = np.maximum(out, link.latency_us * 1e-6 + nbytes / (link.bandwidth_gbyte_s * 1e9))
    return np.where(nbytes > 0, out, 0.0)


def ring_exposed_s(core_fwd_s: np.ndarray, core_bwd_s: np.ndarray, step_s: np.ndarray, double_s: np.ndarray,
                   cp: int, overlap: bool = True, full_recompute: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(exposed_fwd_s, exposed_bwd_s, link_s)`` per unit and micro-batch: what the ring adds to the
    forward and the backward beyond the attention core's compute, and the ring's whole transfer time.

    Args:
        core_fwd_s, core_bwd_s: the attention core's compute on the device (all ``cp`` steps).
        step_s: one step's transfer of ``K, V`` (:func:`ring_step_s`); ``double_s``: of ``K, V`` with
            ``dK, dV`` (twice the bytes).
        cp: context-parallel degree (>= 2).
        overlap: whether transfers run beside compute (False over TCP: each is paid whole).
        full_recompute: the backward runs the forward (and its ring) again.
    """
    c_f, c_b = core_fwd_s / cp, core_bwd_s / cp

    def exposed(t: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.maximum(t - c, 0.0) if overlap else t

    fwd = (cp - 1) * exposed(step_s, c_f)
    bwd = 2 * exposed(step_s, c_b) + (cp - 2) * exposed(double_s, c_b)
    link = (cp - 1) * step_s + 2 * step_s + (cp - 2) * double_s
    if full_recompute:
        bwd = bwd + fwd
        link = link + (cp - 1) * step_s
    return fwd, bwd, link
