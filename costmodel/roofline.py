"""A roofline: every device at its dense 16-bit peak times the best matrix-unit efficiency it
reaches on this model's products (fitted curve, largest micro-batch the planners try), over the
model's training FLOPs per token: compute alone, no communication, no bubble."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph

__all__ = ["roofline_tokens_per_s"]


def roofline_tokens_per_s(model: "ModelGraph", cluster: "Cluster", precision: str = "bf16",
                          max_micro_batch: int = 16) -> float:
    """Compute-only throughput of every device at its best achievable efficiency (times its speed factor,
    ``slow:`` in the cluster file: a throttled device computes that much less, a faster one more), tokens/s."""
    from hetpart.costmodel.efficiency import matmul_efficiency, unit_gemm_width

    widths = [unit_gemm_width(u.width, u.kind, 1, u.fwd_flops / model.seq_len)
              for u in model.units if u.fwd_flops > 0] or [1.0]
    tokens = model.seq_len * max_micro_batch
    total_flops_s = 0.0
    for d in cluster.devices:
        eff = max(matmul_efficiency(d.gpu, w, tokens, precision) for w in widths)
        total_flops_s += d.gpu.tflops(precision) * 1e12 * eff * d.speed
    return total_flops_s / model.flops_per_token
