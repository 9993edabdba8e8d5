"""``hetpart models``, ``hetpart clusters``, ``hetpart inspect model|cluster``."""

from __future__ import annotations

import typer

from typing import Optional

from hetpart.cli.common import AttentionOpt, JsonFlag, Precision, console, emit_json, params_text, workload_from

__all__ = ["register"]


def _fmt(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def models(json_out: bool = JsonFlag) -> None:
    """List the model catalog."""
    from rich.table import Table

    from hetpart.catalog.models import MODEL_CATALOG
    from hetpart.graph import load_model

    rows = []
    for name, cfg in MODEL_CATALOG.items():
        g = load_model(name, seq_len=min(2048, cfg.max_positions))
        rows.append({"name": name, "family": cfg.family, "num_params": g.num_params, "num_layers": cfg.num_layers,
                     "hidden_size": cfg.hidden_size, "num_heads": cfg.num_heads, "num_units": g.num_units})
    if json_out:
        emit_json({"models": rows})
        return
    t = Table(title="model catalog")
    for col in ("name", "family", "params", "layers", "hidden", "heads", "units"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["family"], params_text(r["num_params"]), str(r["num_layers"]), str(r["hidden_size"]),
                  str(r["num_heads"]), str(r["num_units"]))
    console().print(t)


def clusters(json_out: bool = JsonFlag) -> None:
    """List the bundled clusters and the hardware catalog."""
    from rich.table import Table

    from hetpart.catalog.hardware import GPU_CATALOG, LINK_CATALOG, NIC_CATALOG
    from hetpart.cluster import cluster_catalog, load_cluster

    cl = [load_cluster(name).summary() for name in sorted(cluster_catalog())]
    if json_out:
        emit_json({"clusters": [{"name": c["name"], "num_devices": c["num_devices"],
                                 "gpus": sorted({g["gpu"] for g in c["node_groups"]}), "zones": c["zones"]} for c in cl],
                   "gpus": {k: vars(v) for k, v in GPU_CATALOG.items()},
                   "intra_node_links": {k: vars(v) for k, v in LINK_CATALOG.items()},
                   "nics": {k: vars(v) for k, v in NIC_CATALOG.items()}})
        return
    out = console()
    t = Table(title="bundled clusters")
    for col in ("name", "devices", "gpus", "zones"):
        t.add_column(col)
    for c in cl:
        gpus = ", ".join(f"{g['count'] * g['gpus_per_node']}x {g['gpu']}" for g in c["node_groups"])
        t.add_row(c["name"], str(c["num_devices"]), gpus, ", ".join(c["zones"]))
    out.print(t)
    g = Table(title="GPU catalog (dense peak)")
    for col in ("name", "vendor", "TFLOPS 16-bit", "TFLOPS fp32", "memory GB", "HBM GB/s"):
        g.add_column(col)
    for s in GPU_CATALOG.values():
        g.add_row(s.name, s.vendor, f"{s.tflops_bf16:g}", f"{s.tflops_fp32:g}", f"{s.memory_gb:g}", f"{s.hbm_gbyte_s:g}")
    out.print(g)
    n = Table(title="links and NICs")
    for col in ("name", "kind", "bandwidth", "latency us"):
        n.add_column(col)
    for s in LINK_CATALOG.values():
        n.add_row(s.name, "intra-node", f"{s.bandwidth_gbyte_s:g} GB/s", f"{s.latency_us:g}")
    for s in NIC_CATALOG.values():
        n.add_row(s.name, "NIC", f"{s.bandwidth_gbit_s:g} Gbit/s", f"{s.latency_us:g}")
    out.print(n)


def inspect_model(model: str = typer.Argument(..., help="Catalog name, config.json path or python:MODULE:FUNCTION."),
                  seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (default: min(2048, max positions))."),
                  precision: str = Precision, attention: str = AttentionOpt, json_out: bool = JsonFlag) -> None:
    """Show a model's units with FLOPs, parameters and the activation bytes plan and predict charge."""
    from rich.table import Table

    from hetpart.costmodel.activations import DEFAULT_KERNELS
    from hetpart.graph import load_model

    workload_from(1, 1, "bf16", "none", attention=attention)  # a bad --attention fails as plan's does
    g = load_model(model, seq_len=seq_len, precision=precision or "bf16", exact_seq_len=True)
    saved = _saved_bytes(g, attention)
    kernels = DEFAULT_KERNELS
    unmodelled = list(getattr(g.config, "unmodelled", ()) or ())
    if json_out:
        s = g.summary()
        s["memory_model"] = {"attention": attention, "kernels": kernels, "precision": precision or "bf16"}
        s["unmodelled"] = unmodelled
        for row, *per_mode in zip(s["units"], *saved.values()):
            row["saved_bytes"] = dict(zip(saved, per_mode))
        emit_json(s)
        return
    t = Table(title=f"{g.name}: {params_text(g.num_params)} parameters, {g.num_units} units, seq_len {g.seq_len} "
                    f"({_fmt(g.flops_per_token)}FLOP/token for training)",
              caption=f"saved bytes per sequence and micro-batch in flight, by recompute mode, as plan and predict "
                      f"charge them: {attention} attention, {_KERNEL_TEXT[kernels]}, {precision or 'bf16'}")
    for col in ("units", "kind", "fwd FLOPs/seq", "params", "out bytes/seq", "saved bytes/seq (none/sel/full)"):
        t.add_column(col)
    rows = [(u.kind, u.fwd_flops, u.params, tuple(per_mode[i] for per_mode in saved.values()))
            for i, u in enumerate(g.units)]
    i = 0
    while i < g.num_units:
        u = g.units[i]
        j = i
        while j + 1 < g.num_units and rows[j + 1] == rows[i]:
            j += 1
        label = u.name if i == j else f"{u.name} .. {g.units[j].name} (x{j - i + 1})"
        t.add_row(f"{i}" + (f"-{j}" if j > i else "") + f" {label}", u.kind, _fmt(u.fwd_flops), params_text(u.params),
                  _fmt(u.out_act_bytes), "/".join(_fmt(b) for b in rows[i][3]))
        i = j + 1
    console().print(t)
    for what in unmodelled:
        console().print(f"held only approximately: {what}", highlight=False)


_KERNEL_TEXT = {"fused": "Megatron-Core/Transformer Engine kernels", "torch": "PyTorch kernels (hetpart's runtime)"}
"""How the header names each kernel set of :mod:`hetpart.costmodel.activations`."""


def _saved_bytes(g, attention: str) -> dict[str, list[float]]:
    """Per recompute mode, the bytes each unit keeps per sequence and micro-batch in flight under the kernel
    set plan and predict use: the memory model's own activation term
    (:func:`~hetpart.costmodel.activations.unit_kept_bytes`), so the table shows what the planners charge."""
    from hetpart.costmodel.activations import DEFAULT_KERNELS, unit_kept_bytes

    return {mode: unit_kept_bytes(g, mode, attention, DEFAULT_KERNELS) for mode in ("none", "selective", "full")}


def inspect_cluster(cluster: str = typer.Argument(..., help="Catalog name or cluster YAML path."),
                    json_out: bool = JsonFlag) -> None:
    """Show a cluster's node groups, device ids, links and zones."""
    from rich.table import Table

    from hetpart.cluster import load_cluster
    from hetpart.costmodel.pools import check_zones_connected

    c = load_cluster(cluster)
    check_zones_connected(c)  # refused as plan and predict refuse it (README, "zones")
    s = c.summary()
    if json_out:
        emit_json(s)
        return
    t = Table(title=f"{c.name}: {c.num_devices} devices, {s['peak_tflops_bf16'] / 1000:.1f} PFLOPS 16-bit peak, "
                    f"zones {', '.join(c.zones)}")
    for col in ("group", "nodes x gpus", "gpu", "intra-node", "network per node", "zone", "device ids"):
        t.add_column(col)
    for g in s["node_groups"]:
        gpu = g["gpu"] if len(g["gpus"]) == 1 else " + ".join(f"{x['count']}x {x['gpu']}" for x in g["gpus"])
        t.add_row(str(g["index"]), f"{g['count']} x {g['gpus_per_node']}", gpu,
                  f"{g['intra_node']} ({g['intra_node_gbyte_s']:g} GB/s)",
                  f"{g['nics_per_node']} x {g['nic']} ({g['node_bandwidth_gbit_s']:g} Gbit/s, "
                  f"{'RDMA' if g['nic_rdma'] else 'TCP'})", g["zone"], g["device_ids"])
    out = console()
    out.print(t)
    from hetpart.costmodel.links import intra_node_link
    for i, group in enumerate(c.groups):  # what the cost model prices, where the board is not what the name says
        priced = intra_node_link(group)
        if priced.name != group.intra_node.name:
            out.print(f"group {i}: intra-node {group.intra_node.name} priced as {priced.name} "
                      f"({priced.bandwidth_gbyte_s:g} GB/s between two GPUs: {priced.source})")
    for link in s["links"]:
        out.print(f"link {link['zones'][0]} <-> {link['zones'][1]}: {link['bandwidth_gbit_s']:g} Gbit/s, "
                  f"{link['latency_us']:g} us")
    if s["slow"]:
        out.print("measured speed factors: " + ", ".join(f"{d} x{f:g}" for d, f in s["slow"].items()))


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("clusters")(clusters)
    inspect = typer.Typer(help="Show a model graph or a cluster.", no_args_is_help=True)
    inspect.command("model")(inspect_model)
    inspect.command("cluster")(inspect_cluster)
    app.add_typer(inspect, name="inspect")
