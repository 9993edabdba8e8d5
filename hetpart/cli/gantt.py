"""The Gantt chart of a simulated step: one row per pipeline device group, time across.

Forward, backward, point-to-point sends, gradient all-reduce and the optimizer step each get a
colour; rows are labelled with replica, stage, device type and tensor-parallel degree.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.costmodel.simulator import Prediction
    from hetpart.plan import Plan

__all__ = ["draw_gantt", "COLOURS"]

COLOURS = {"fwd": "#4C72B0", "bwd": "#DD8452", "send": "#9A9A9A", "dp_sync": "#C44E52", "optim": "#8172B3"}
_HEIGHT = {"fwd": 0.8, "bwd": 0.8, "send": 0.25, "dp_sync": 0.5, "optim": 0.8}


def _rows(plan: "Plan", cluster: "Cluster", max_replicas: int) -> dict[tuple[int, int], str]:
    v = plan.interleave if plan.schedule == "interleaved" else 1
    rows = {}
    for r, rep in enumerate(plan.replicas[:max_replicas]):
        for d in range(rep.pp // v):
            stage = rep.stages[d]
            gpu = ",".join(dict.fromkeys(cluster.device(x).gpu.name for x in stage.devices))
            rows[(r, d)] = f"r{r} s{d}  {gpu} x{stage.tp}"
    return rows


def draw_gantt(prediction: "Prediction", plan: "Plan", cluster: "Cluster", path: Path, title: str = "",
               max_replicas: int = 4) -> Path:
    """Draw ``prediction.timeline`` (from ``simulate(..., trace=True)``) to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from hetpart.errors import PlanError

    rows = _rows(plan, cluster, max_replicas)
    order = {key: i for i, key in enumerate(rows)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for e in prediction.timeline:
        key = (e["replica"], e["stage"])
        if key in order and e["end_s"] > e["start_s"]:
            bars[(order[key], e["kind"])].append((e["start_s"], e["end_s"] - e["start_s"]))
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.6))
    for (row, kind), spans in bars.items():
        h = _HEIGHT.get(kind, 0.5)
        ax.broken_barh(spans, (row - h / 2, h), facecolors=COLOURS.get(kind, "#333333"), linewidth=0)
    ax.set_yticks(range(len(rows)), list(rows.values()))
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (s)")
    shown = f" (first {max_replicas} of {plan.dp} replicas)" if plan.dp > max_replicas else ""
    ax.set_title(f"{title}: step {prediction.step_time_s:.3f} s, {prediction.tokens_per_s:,.0f} tokens/s{shown}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12 if len(rows) > 4 else -0.25), ncol=len(COLOURS), frameon=False)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise PlanError(f"--gantt: cannot write {path} ({exc.__class__.__name__}); check the directory") from None
    finally:
        plt.close(fig)
    return Path(path)
