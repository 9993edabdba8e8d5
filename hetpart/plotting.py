"""Figures of plans and benchmarks (matplotlib, Agg): Gantt chart, cluster map, memory, planner bars.

Every function returns a matplotlib ``Figure``; :func:`save_png`, :func:`to_svg` and
:func:`to_png_base64` turn it into a file or into something an HTML page inlines. The CLI
(``show --gantt``, ``show --html``, ``bench``) and the experiments' reports draw through here.

Large plans stay readable: replicas with the same structure (device types, layers, tensor
parallelism and batch share per stage) run the same schedule, so the Gantt chart and the memory
plot draw them once, labelled with the replicas they stand for (``r0-r31 (x32)``), and at most
``max_rows`` rows are drawn (the rest is named in the title).
"""

from __future__ import annotations

import base64
import io
import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from hetpart.cluster import Cluster
    from hetpart.plan import Plan

__all__ = ["COLOURS", "ReplicaGroup", "replica_groups", "gantt_figure", "cluster_figure", "memory_figure",
           "planner_bars", "scaling_figure", "save_png", "to_svg", "to_png_base64", "stage_colour", "replicas_text"]

COLOURS = {"fwd": "#4C72B0", "bwd": "#DD8452", "send": "#9A9A9A", "dp_sync": "#C44E52", "optim": "#8172B3"}
_LABELS = {"fwd": "forward", "bwd": "backward", "send": "send (p2p)", "dp_sync": "gradient all-reduce",
           "optim": "optimizer"}
_HEIGHT = {"fwd": 0.8, "bwd": 0.8, "send": 0.25, "dp_sync": 0.5, "optim": 0.8}
_STAGE_CMAP = "tab10"
_ROW_INCH = 0.32
_MAX_HEIGHT_INCH = 11.0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class ReplicaGroup:
    """Replicas of a plan that run the same schedule: drawn once."""

    def __init__(self, first: int, members: list[int]) -> None:
        self.first = first
        """The replica drawn for the group."""
        self.members = members

    @property
    def label(self) -> str:
        """``r3`` or ``r0-r7 (x8)`` or ``r0,r2,r5 (x3)``."""
        m = self.members
        if len(m) == 1:
            return f"r{m[0]}"
        runs = m == list(range(m[0], m[-1] + 1))
        names = f"r{m[0]}-r{m[-1]}" if runs else ",".join(f"r{i}" for i in m[:3]) + (",..." if len(m) > 3 else "")
        return f"{names} (x{len(m)})"


def replicas_text(n: int) -> str:
    """``n`` data-parallel replicas in words: '1 replica', '4 replicas'."""
    return f"{n} replica" if n == 1 else f"{n} replicas"


def replica_groups(plan: "Plan", cluster: "Cluster") -> list[ReplicaGroup]:
    """Replicas grouped by structure: per stage the device types, layers and tp, plus the batch share."""
    groups: dict[tuple, ReplicaGroup] = {}
    for r, rep in enumerate(plan.replicas):
        key = (round(rep.batch_share, 9),
               tuple((s.layers, s.tp, tuple(cluster.device(d).gpu.name for d in s.devices)) for s in rep.stages))
        if key in groups:
            groups[key].members.append(r)
        else:
            groups[key] = ReplicaGroup(r, [r])
    return list(groups.values())


def _device_groups(plan: "Plan") -> int:
    """Pipeline device groups per replica's schedule row (virtual stages folded)."""
    return plan.chunks_per_device


def _rows(plan: "Plan", cluster: "Cluster") -> list[tuple[tuple[int, int], str]]:
    v = _device_groups(plan)
    rows = []
    for g in replica_groups(plan, cluster):
        rep = plan.replicas[g.first]
        for d in range(rep.pp // v):
            stage = rep.stages[d]
            gpu = ",".join(dict.fromkeys(cluster.device(x).gpu.name for x in stage.devices))
            rows.append(((g.first, d), f"{g.label} s{d}  {gpu} x{stage.tp}"))
    return rows


def _height(rows: int, extra: float) -> float:
    return min(_MAX_HEIGHT_INCH, _ROW_INCH * rows + extra)


def gantt_figure(timeline: Sequence[Mapping[str, Any]], plan: "Plan", cluster: "Cluster", *, title: str = "",
                 step_time_s: float | None = None, tokens_per_s: float | None = None, max_rows: int = 24) -> "Figure":
    """One row per pipeline device group of each distinct replica, time across, with a legend.

    Args:
        timeline: ``Prediction.timeline`` (``simulate(..., trace=True)``): events with replica,
            stage (device group), kind (fwd, bwd, send, dp_sync, optim), start_s and end_s.
        max_rows: rows drawn at most; the title says how many were left out.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    all_rows = _rows(plan, cluster)
    rows = all_rows[:max_rows]
    order = {key: i for i, (key, _) in enumerate(rows)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for e in timeline:
        row = order.get((e["replica"], e["stage"]))
        if row is not None and e["end_s"] > e["start_s"]:
            bars[(row, e["kind"])].append((e["start_s"], e["end_s"] - e["start_s"]))
    fig, ax = plt.subplots(figsize=(12, _height(len(rows), 1.5)))
    for (row, kind), spans in bars.items():
        h = _HEIGHT.get(kind, 0.5)
        ax.broken_barh(spans, (row - h / 2, h), facecolors=COLOURS.get(kind, "#333333"), linewidth=0)
    labels = [label for _, label in rows]
    fontsize = "small" if len(rows) <= 16 else "x-small"
    ax.set_yticks(range(len(rows)), labels, fontsize=fontsize)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time in the step (s)")
    ax.grid(axis="x", alpha=0.3)
    head = f"{title}: " if title else ""
    if step_time_s is not None and tokens_per_s is not None:
        head += f"step {step_time_s:.3f} s, {tokens_per_s:,.0f} tokens/s"
    groups = len(replica_groups(plan, cluster))
    note = f"{plan.dp} replicas as {groups} distinct" if groups < plan.dp else replicas_text(plan.dp)
    if len(all_rows) > len(rows):
        note += f"; first {len(rows)} of {len(all_rows)} rows"
    ax.set_title(f"{head}\n{note}", fontsize="medium")
    ax.legend(handles=[Patch(color=COLOURS[k], label=_LABELS[k]) for k in COLOURS], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize="small")
    fig.tight_layout()
    return fig


def stage_colour(stage: int, replica: int) -> tuple[float, float, float]:
    """The colour of a device of ``stage`` in ``replica``: hue by stage, lightness alternating by replica."""
    import matplotlib

    base = matplotlib.colormaps[_STAGE_CMAP](stage % 10)[:3]
    shade = (0.0, 0.35, -0.25, 0.55)[replica % 4]
    if shade >= 0:
        return tuple(c + (1 - c) * shade for c in base)  # type: ignore[return-value]
    return tuple(c * (1 + shade) for c in base)  # type: ignore[return-value]


def _device_roles(plan: "Plan") -> dict[str, tuple[int, int]]:
    v = _device_groups(plan)
    roles = {}
    for r, rep in enumerate(plan.replicas):
        for k, stage in enumerate(rep.stages):
            for dev in stage.devices:
                roles.setdefault(dev, (r, k % (rep.pp // v)))
    return roles


def cluster_figure(plan: "Plan", cluster: "Cluster", *, title: str = "", max_nodes: int = 256) -> "Figure":
    """Every device of the cluster as a cell (nodes as rows of cells), coloured by stage and replica.

    Cells of devices the plan leaves idle are grey. With few devices each cell is labelled
    ``r<replica> s<stage>``; node rows are labelled with their node group, node and device type.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle

    roles = _device_roles(plan)
    nodes: dict[tuple[int, int], list] = defaultdict(list)
    for dev in cluster.devices:
        nodes[dev.node_key].append(dev)
    keys = list(nodes)[:max_nodes]
    width = max(len(nodes[k]) for k in keys)
    per_col = 32
    cols = math.ceil(len(keys) / per_col)
    rows = min(len(keys), per_col)
    fig, ax = plt.subplots(figsize=(min(16, 2.2 + cols * (0.55 * width + 1.8)), _height(rows, 1.6)))
    label_cells = len(keys) * width <= 128
    for i, key in enumerate(keys):
        col, row = divmod(i, per_col)
        x0 = col * (width + 3.2)
        for dev in nodes[key]:
            role = roles.get(dev.id)
            colour = stage_colour(role[1], role[0]) if role else (0.86, 0.86, 0.86)
            ax.add_patch(Rectangle((x0 + dev.local, row), 0.92, 0.85, facecolor=colour, edgecolor="white"))
            if role and label_cells:
                ax.text(x0 + dev.local + 0.46, row + 0.43, f"r{role[0]}\ns{role[1]}", ha="center", va="center",
                        fontsize=6)
        if len(keys) <= 64 or row % 4 == 0:
            dev = nodes[key][0]
            label = f"{key[0]}/{key[1]}" if cols > 2 else f"{key[0]}/{key[1]} {dev.gpu.name}"  # room between columns
            ax.text(x0 - 0.15, row + 0.43, label, ha="right", va="center", fontsize="x-small")
    ax.set_xlim(-3.2, cols * (width + 3.2) - 2.8)
    ax.set_ylim(rows + 0.1, -0.1)
    ax.axis("off")
    stages = sorted({s for _, s in roles.values()})[:10]
    handles = [Patch(color=stage_colour(s, 0), label=f"stage {s}") for s in stages]
    handles.append(Patch(color=(0.86, 0.86, 0.86), label="idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 6),
              frameon=False, fontsize="small")
    more = f" (first {len(keys)} of {len(nodes)} nodes)" if len(nodes) > len(keys) else ""
    groups = "" if cols <= 2 else "\nnode groups: " + ", ".join(f"{g} = {'+'.join(t.name for t, _ in grp.gpu_counts)}"
                                                               for g, grp in enumerate(cluster.groups))
    ax.set_title(f"{title or cluster.name}: {cluster.num_devices} devices, {replicas_text(plan.dp)}; "
                 f"shade = replica{more}{groups}", fontsize="medium")
    fig.tight_layout()
    return fig


def memory_figure(breakdown: Sequence[Mapping[str, Any]], plan: "Plan", cluster: "Cluster", *,
                  max_rows: int = 32) -> "Figure":
    """Predicted peak memory of each pipeline device group (distinct replicas) against its capacity."""
    plt = _pyplot()

    wanted = [key for key, _ in _rows(plan, cluster)][:max_rows]
    labels = dict(_rows(plan, cluster))
    by_key = {(b["replica"], b["stage"]): b for b in breakdown}
    entries = [(labels[k], by_key[k]) for k in wanted if k in by_key]
    fig, ax = plt.subplots(figsize=(10, _height(len(entries), 1.5)))
    ys = range(len(entries))
    used = [b["memory_gb"] for _, b in entries]
    cap = [b["capacity_gb"] for _, b in entries]
    colours = ["#C44E52" if u > c else stage_colour(b["stage"], b["replica"]) for u, c, (_, b) in
               zip(used, cap, entries)]
    ax.barh(ys, cap, color="#EEEEEE", edgecolor="#999999", label="usable capacity")
    ax.barh(ys, used, height=0.55, color=colours, label="predicted peak")
    for y, u, c in zip(ys, used, cap):
        ax.text(max(u, c) * 1.01, y, f"{u:.1f} / {c:.1f} GB", va="center", fontsize="x-small")
    ax.set_yticks(list(ys), [label for label, _ in entries], fontsize="small" if len(entries) <= 16 else "x-small")
    ax.set_ylim(len(entries) - 0.5, -0.5)
    ax.set_xlim(0, max(used + cap) * 1.25)
    ax.set_xlabel("GB per device")
    ax.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("memory per device against capacity (red: does not fit)", fontsize="medium")
    fig.tight_layout()
    return fig


def planner_bars(rows: Sequence[Mapping[str, Any]], planners: Sequence[str], column: str, ylabel: str, *,
                 bound_column: str | None = None, log: bool = False, reference: float | None = None) -> "Figure":
    """Grouped bars: one group per scenario, one bar per planner (``rows`` as in ``results.csv``)."""
    plt = _pyplot()

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    width = 0.8 / max(len(planners), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(scenarios)), 4.8))
    centres = [i + 0.4 - width / 2 for i in range(len(scenarios))]
    for k, name in enumerate(planners):
        values = [next((_num(r.get(column)) for r in rows if r["scenario"] == s and r["planner"] == name), 0.0)
                  for s in scenarios]
        ax.bar([i + k * width for i in range(len(scenarios))], values, width, label=name)
    if bound_column:
        bounds = [next(_num(r.get(bound_column)) for r in rows if r["scenario"] == s) for s in scenarios]
        ax.scatter(centres, bounds, marker="_", s=900, color="black", label="HETHUB upper bound", zorder=3)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=0.8)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(centres, scenarios, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False, fontsize="small")
    fig.tight_layout()
    return fig


def scaling_figure(points: Sequence[Mapping[str, Any]], y: str, ylabel: str, *, log_y: bool = True,
                   title: str = "", lines: bool = True) -> "Figure":
    """``y`` against GPUs, one line per (planner, device types): points need planner, gpus, types and ``y``.

    With ``lines=False`` only markers are drawn, one legend entry per planner (unrelated clusters).
    """
    plt = _pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.8))
    series: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for p in points:
        value = _num(p.get(y))
        if value > 0:
            series[(str(p["planner"]), int(p.get("types", 1)))].append((float(p["gpus"]), value))
    styles = ("-", "--", ":", "-.")
    planners = list(dict.fromkeys(name for name, _ in series))
    for (name, types), xy in sorted(series.items()):
        xy.sort()
        colour = f"C{planners.index(name) % 10}"
        label = f"{name}, {types} type{'s' if types > 1 else ''}" if lines else name
        ax.plot([a for a, _ in xy], [b for _, b in xy], styles[(types - 1) % 4] if lines else "none", marker="o",
                color=colour, label=label)
    ax.set_xscale("log", base=2)
    gpus = sorted({x for xy in series.values() for x, _ in xy})
    if gpus:
        ax.set_xticks(gpus, [f"{g:,.0f}" for g in gpus])
    if log_y:
        ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize="medium")
    ax.set_xlabel("GPUs in the cluster")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), frameon=False, fontsize="x-small", ncol=2)
    fig.tight_layout()
    return fig


CHART_MARK = "Drawn by hetpart"
"""What :func:`save_png` writes into each image's metadata, so that ``hetpart show --gantt`` replaces only charts
hetpart drew (a PNG's ``Description`` text chunk, an SVG's ``dc:description``, a PDF's ``/Subject``)."""

_MARK_KEY = {"png": "Description", "svg": "Description", "pdf": "Subject"}


def save_png(fig: "Figure", path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (the format from its extension, PNG without one), marked as hetpart's
    (:data:`CHART_MARK`), and close it; raises :class:`OSError` as the file system does."""
    plt = _pyplot()
    key = _MARK_KEY.get(Path(path).suffix.lower().lstrip(".") or "png")
    try:
        fig.savefig(path, dpi=dpi, metadata={key: CHART_MARK} if key else None)
    finally:
        plt.close(fig)
    return Path(path)


def to_svg(fig: "Figure") -> str:
    """``fig`` as an inline ``<svg>`` element (no XML header), and close it."""
    plt = _pyplot()
    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def to_png_base64(fig: "Figure", dpi: int = 100) -> str:
    """``fig`` as a ``data:image/png;base64,...`` URI (for ``<img src=...>``), and close it."""
    plt = _pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _num(x: Any) -> float:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0
