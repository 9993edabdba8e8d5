"""Self-contained HTML pages: the plan report of ``hetpart show --html`` and the page scaffolding
the benchmark report shares.

Nothing is loaded from the network: figures are inline SVG or base64 PNG, CSS and the few lines of
JavaScript (sortable tables, a render check that marks ``<body data-figures-rendered=N>``) are in
the page. The figures come from :mod:`hetpart.plotting`.
"""

from __future__ import annotations

import html
import json
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hetpart import plotting

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan

__all__ = ["html_page", "html_table", "figure_block", "plan_report"]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#243447;color:#fff;padding:14px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cfd8e3;font-size:14px}
main{padding:8px 28px 40px;max-width:1300px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;margin:16px 0;padding:12px 18px}
h2{font-size:17px;margin:4px 0 10px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:4px 10px;border-bottom:1px solid #eee}
th{background:#f0f3f6;text-align:left;cursor:pointer;user-select:none}td.num{text-align:right;font-variant-numeric:tabular-nums}
.figure svg,.figure img{max-width:100%;height:auto}.note{color:#666;font-size:12px}
.kpis{display:flex;flex-wrap:wrap;gap:12px}.kpi{background:#f0f3f6;border-radius:6px;padding:8px 14px;min-width:150px}
.kpi b{display:block;font-size:20px}.kpi span{font-size:12px;color:#555}.bad{color:#b00020}.good{color:#1b7f3b}
"""

_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th, i){th.addEventListener('click', function(){
  var tb = th.closest('table').tBodies[0], rows = Array.from(tb.rows), asc = th.dataset.asc !== '1';
  rows.sort(function(a, b){var x = a.cells[i].dataset.v || a.cells[i].textContent,
    y = b.cells[i].dataset.v || b.cells[i].textContent, nx = parseFloat(x), ny = parseFloat(y);
    var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y); return asc ? c : -c;});
  th.dataset.asc = asc ? '1' : '0'; rows.forEach(function(r){tb.appendChild(r);});});});
window.addEventListener('load', function(){
  var ok = 0, figs = document.querySelectorAll('.figure');
  figs.forEach(function(f){var el = f.querySelector('svg, img'); if(!el) return;
    var r = el.getBoundingClientRect(); var drawn = el.tagName === 'IMG' ? el.naturalWidth > 0 :
      el.querySelectorAll('path, rect, use').length > 0;
    if(drawn && r.width > 0 && r.height > 0){ok++; f.dataset.rendered = '1';}});
  document.body.dataset.figures = figs.length; document.body.dataset.figuresRendered = ok;});
"""


def html_page(title: str, subtitle: str, sections: Sequence[str], data: Mapping[str, Any] | None = None) -> str:
    """A whole page: header, the ``sections`` (HTML strings), inline CSS and JS, and ``data`` as JSON."""
    blob = ""
    if data is not None:
        text = json.dumps(data, default=str).replace("</", "<\\/")
        blob = f'<script type="application/json" id="report-data">{text}</script>'
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>"
            f"<header><h1>{html.escape(title)}</h1><p>{html.escape(subtitle)}</p></header>\n<main>"
            + "\n".join(sections) + f"</main>{blob}<script>{_JS}</script></body></html>\n")


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, table_id: str = "",
               numeric: Sequence[bool] | None = None) -> str:
    """A sortable table (click a header); cells are escaped; numbers right-aligned where ``numeric`` says so.

    A cell given as ``(shown, sort_value)`` displays ``shown`` and sorts by ``sort_value``
    (``("1,234", 1234)``), so formatted numbers still sort numerically.
    """
    numeric = list(numeric) if numeric is not None else [False] * len(headers)
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for value, num in zip(row, numeric):
            sort = f' data-v="{value[1]}"' if isinstance(value, tuple) else ""
            shown = value[0] if isinstance(value, tuple) else value
            cells.append(f"<td{' class=num' if num else ''}{sort}>{html.escape(str(shown))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    ident = f' id="{table_id}"' if table_id else ""
    return f'<table class="sortable"{ident}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def figure_block(figure_id: str, title: str, fig: Any, *, fmt: str = "svg", note: str = "") -> str:
    """A section with ``fig`` inline (``svg``, or ``png`` as a base64 data URI for dense charts)."""
    if fmt == "svg":
        inner = plotting.to_svg(fig)
    else:
        inner = f'<img alt="{html.escape(title)}" src="{plotting.to_png_base64(fig)}">'
    extra = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return (f'<section id="{figure_id}"><h2>{html.escape(title)}</h2>'
            f'<div class="figure" id="{figure_id}-figure">{inner}</div>{extra}</section>')


def _kpi(value: str, label: str, cls: str = "") -> str:
    return f'<div class="kpi"><b class="{cls}">{html.escape(value)}</b><span>{html.escape(label)}</span></div>'


def plan_report(plan: "Plan", cluster: "Cluster", model: "ModelGraph", prediction: Any, *,
                upper_bound: Mapping[str, Any] | None = None,
                comparison: Sequence[Mapping[str, Any]] = (),
                provenance: Mapping[str, Any] | None = None) -> str:
    """The HTML report of one plan.

    Args:
        prediction: a ``Prediction`` made with ``trace=True`` (its metrics, breakdown and timeline).
        upper_bound: ``hetpart.policies.upper_bound(...)`` for the same workload, if known.
        comparison: rows ``{planner, tokens_per_s, step_time_s, fits_in_memory, plan_time_s, error}``
            of other planners on the same input (shown as a table and bars).
        provenance: where the numbers come from (predictor, plan file, hetpart version, ...).
    """
    m = prediction.metrics
    planner = plan.meta.get("planner", "?")
    subtitle = (f"{model.name} on {cluster.name} ({cluster.num_devices} GPUs: {', '.join(cluster.gpu_types)}), "
                f"global batch {plan.global_batch} x {plan.seq_len} tokens, planner {planner}")
    sections = [_summary(plan, m, upper_bound), _metrics_section(m, upper_bound, plan, provenance)]
    sections.append(figure_block("cluster", "Cluster: devices by stage and replica",
                                 plotting.cluster_figure(plan, cluster), fmt="svg"))
    sections.append(figure_block(
        "gantt", "Schedule of one step (simulated)",
        plotting.gantt_figure(prediction.timeline, plan, cluster, title=f"{model.name} on {cluster.name}",
                              step_time_s=prediction.step_time_s, tokens_per_s=prediction.tokens_per_s),
        fmt="png", note="Rows: pipeline device groups of each distinct replica (identical replicas drawn once)."))
    sections.append(figure_block("memory", "Memory per device against capacity",
                                 plotting.memory_figure(prediction.breakdown, plan, cluster), fmt="svg"))
    if comparison:
        sections.append(_comparison_section(comparison, planner))
    sections.append(_stages_section(plan, cluster, model))
    data = {"plan": plan.to_dict(), "metrics": m, "upper_bound": dict(upper_bound or {}),
            "comparison": list(comparison), "provenance": dict(provenance or {})}
    return html_page(f"hetpart plan: {model.name} on {cluster.name}", subtitle, sections, data)


def _summary(plan: "Plan", m: Mapping[str, Any], bound: Mapping[str, Any] | None) -> str:
    kpis = [_kpi(f"{m['tokens_per_s']:,.0f}", "tokens/s (predicted)"),
            _kpi(f"{m['step_time_s']:.3f} s", "step time"),
            _kpi(f"{m['mfu'] * 100:.1f}%", "MFU"),
            _kpi(f"{m['bubble_fraction'] * 100:.1f}%", "pipeline bubble"),
            _kpi("fits" if m["fits_in_memory"] else "does not fit", "memory",
                 "good" if m["fits_in_memory"] else "bad")]
    if bound:
        kpis.append(_kpi(f"{m['tokens_per_s'] / bound['tokens_per_s'] * 100:.1f}%", "of HETHUB's upper bound"))
    shape = (f"{plotting.replicas_text(plan.dp)}, micro-batch {plan.micro_batch}, schedule {plan.schedule}"
             f"{f' x{plan.interleave}' if plan.interleave > 1 else ''}, recompute {plan.recompute}, "
             f"precision {plan.precision}{f', context parallel cp {plan.cp}' if plan.cp > 1 else ''}"
             f"{f', ZeRO {plan.zero}' if plan.zero else ''}{f', offload {plan.offload}' if plan.offload != 'none' else ''}")
    return f'<section id="summary"><h2>Summary</h2><div class="kpis">{"".join(kpis)}</div><p>{html.escape(shape)}</p></section>'


def _metrics_section(m: Mapping[str, Any], bound: Mapping[str, Any] | None, plan: "Plan",
                     provenance: Mapping[str, Any] | None) -> str:
    rows: list[list[Any]] = [
        ["step time", f"{m['step_time_s']:.4f} s"], ["throughput", f"{m['tokens_per_s']:,.0f} tokens/s"],
        ["samples", f"{m['samples_per_s']:,.2f} sequences/s"],
        ["hardware TFLOPS per device", f"{m['hardware_tflops_per_device']:.1f} (recomputation included)"],
        ["model TFLOPS per device", f"{m['model_tflops_per_device']:.1f}"], ["MFU", f"{m['mfu'] * 100:.2f}%"],
        ["bubble fraction", f"{m['bubble_fraction'] * 100:.2f}%"],
        *[[f"peak memory, {gpu}", f"{gb:.2f} GB"] for gpu, gb in m["peak_memory_gb"].items()],
        *([["host memory (offloaded states)", f"{m['host_memory_gb']:.1f} of {m['host_capacity_gb']:.0f} GB on the "
                                                 "fullest node"]] if "host_memory_gb" in m else []),
        ["fits in memory", "yes" if m["fits_in_memory"] else "NO"]]
    if bound:
        rows += [["HETHUB upper bound", f"{bound['tokens_per_s']:,.0f} tokens/s "
                                        f"({m['tokens_per_s'] / bound['tokens_per_s'] * 100:.1f}% reached)"],
                 ["memory-lifted ceiling", f"{bound['memory_lifted_tokens_per_s']:,.0f} tokens/s "
                                           f"({m['tokens_per_s'] / bound['memory_lifted_tokens_per_s'] * 100:.1f}% reached)"]]
    prov = dict(provenance or {})
    prov.setdefault("generated", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    prov_rows = [[k, v if isinstance(v, str) else json.dumps(v, default=str)] for k, v in prov.items()]
    for key in ("planner", "predicted_tokens_per_s", "workload"):
        if key in plan.meta:
            value = plan.meta[key]
            prov_rows.append([f"plan meta: {key}", value if isinstance(value, str) else json.dumps(value)])
    definition = f'<p class="note">{html.escape(bound["definition"])}</p>' if bound and "definition" in bound else ""
    return ('<section id="metrics"><h2>Predicted metrics</h2>' + html_table(["metric", "value"], rows,
                                                                            table_id="metrics-table")
            + definition + "<h2>Provenance</h2>" + html_table(["what", "value"], prov_rows, table_id="provenance")
            + "</section>")


def _comparison_section(comparison: Sequence[Mapping[str, Any]], chosen: str) -> str:
    best = max((c.get("tokens_per_s") or 0.0 for c in comparison), default=0.0) or 1.0
    rows = []
    for c in comparison:
        tps = c.get("tokens_per_s")
        if not tps:
            rows.append([c["planner"] + (" (this plan)" if c["planner"] == chosen else ""), ("no plan", 0), "", "",
                         str(c.get("error", ""))[:160]])
            continue
        rows.append([c["planner"] + (" (this plan)" if c["planner"] == chosen else ""), (f"{tps:,.0f}", tps),
                     (f"{tps / best * 100:.1f}%", tps / best * 100),
                     (f"{c['plan_time_s']:.2f}", c["plan_time_s"]) if c.get("plan_time_s") is not None else "",
                     "fits" if c.get("fits_in_memory", True) else "does not fit"])
    bars = "".join(
        f'<div style="margin:3px 0"><span style="display:inline-block;width:150px">{html.escape(c["planner"])}</span>'
        f'<span class="bar" style="display:inline-block;height:14px;background:#4C72B0;'
        f'width:{(c.get("tokens_per_s") or 0) / best * 500:.0f}px"></span></div>' for c in comparison)
    table = html_table(["planner", "tokens/s", "% of best", "plan time s", "memory / error"], rows,
                       table_id="comparison-table", numeric=[False, True, True, True, False])
    return f'<section id="comparison"><h2>Comparison with other planners (same input)</h2>{table}{bars}</section>'


def _stages_section(plan: "Plan", cluster: "Cluster", model: "ModelGraph") -> str:
    from hetpart.plan import compress_device_ids, units_text

    rows = []
    for g in plotting.replica_groups(plan, cluster):
        rep = plan.replicas[g.first]
        for k, s in enumerate(rep.stages):
            gpu = ",".join(dict.fromkeys(cluster.device(d).gpu.name for d in s.devices))
            rows.append([g.label if k == 0 else "", f"{rep.batch_share:.3f}" if k == 0 else "", k,
                         units_text(s.layers, model), compress_device_ids(s.devices), gpu, s.tp]
                        + ([plan.cp] if plan.cp > 1 else []))
    cp = plan.cp > 1  # as the text table: a cp column only where the plan splits sequences (tp x cp devices a stage)
    table = html_table(["replicas", "share", "stage", "units", "devices (first replica)", "gpu", "tp"] + ["cp"] * cp,
                       rows, table_id="stages-table", numeric=[False, True, True, False, False, False, True] + [True] * cp)
    return f'<section id="stages"><h2>Stages</h2>{table}</section>'
