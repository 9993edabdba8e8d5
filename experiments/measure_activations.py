"""Measure the activation bytes autograd saves for one transformer unit of hetpart's runtime, on CPU.

For each family (the runtime's ``transformers`` GPT-2 and Llama blocks), precision (fp32, bf16),
attention kernel (``sdpa``: torch's fused CPU kernel, which keeps q, k, v, the output and the
log-sum-exp; ``eager``: the score matrix kept), recompute mode (``none``, ``selective``, ``full``, as
:meth:`hetpart.runtime.models.UnitModel.set_recompute` applies them) and a few shapes (width, heads,
key/value heads, MLP width, sequence length, micro-batch), one block runs one forward and we count ``saved_bytes``: every tensor autograd packs for the backward
(``torch.autograd.graph.saved_tensors_hooks``), once per storage (views share their base's storage),
parameters left out, the unit's input included where something saves it. Recomputation is seen too:
torch's non-reentrant checkpoint saves the inputs of the recomputed region through the same hooks
(``_NoopSaveInputs``) and nothing inside it. The backward then runs (the graph is a real one). The
head unit (final norm, vocabulary projection) and the engine's loss (cross-entropy on the logits) are
measured the same way.

Coefficients: per (family, precision, attention, recompute), bytes per token of one block as
``c_h h + c_kv kv + c_f f + c_a a + c_d d + c_as a s`` (``h`` width, ``kv`` key/value width, ``f`` MLP width,
``a`` heads, ``d`` head dim (rotary tables), ``s`` sequence: the score matrix of eager attention),
least squares over the shapes; :mod:`hetpart.costmodel.activations` carries the result.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.measure_activations`` (about a minute);
writes ``experiments/data/activation_bytes.json`` (``--out`` elsewhere). ``--check`` refits the stored
measurements and prints the coefficients without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

__all__ = ["SHAPES", "measure_unit", "measure_all", "fit", "FEATURES", "HEAD_FEATURES", "main"]

DATA = Path(__file__).resolve().parent / "data" / "activation_bytes.json"

SHAPES = [
    # hidden, heads, kv heads (llama; gpt2 has none), ffn, seq, micro-batch
    (64, 4, 2, 176, 32, 2),
    (128, 4, 2, 352, 64, 2),
    (128, 8, 8, 512, 64, 1),
    (192, 6, 2, 512, 96, 2),
    (256, 8, 4, 688, 128, 1),
    (256, 4, 1, 704, 64, 3),
    (96, 3, 1, 256, 48, 4),
    (160, 10, 5, 448, 80, 1),
    (64, 2, 2, 320, 128, 2),
    (320, 5, 5, 864, 32, 2),
]
"""Shapes measured (small enough for a shared CPU; different ratios so the fit can tell the terms apart)."""

FEATURES = ("h", "kv", "f", "a", "one", "d/b", "as")
"""Per-token terms of the fit: width, key/value width, MLP width, heads (the attention kernel's fp32
log-sum-exp), a constant (the norms' per-token statistics), head dim over micro-batch (the rotary
cos/sin tables, one per sequence position shared by the micro-batch), heads x sequence (eager
attention's score matrix)."""


def _config(family: str, h: int, a: int, kv_heads: int, ffn: int, s: int):
    from hetpart.graph.transformer import TransformerConfig

    llama = family == "llama"
    return TransformerConfig(family="gpt2" if family == "gpt" else family, num_layers=1, hidden_size=h, num_heads=a,
                             vocab_size=4 * h + 3 * s + 100,
                             max_positions=1024, ffn_hidden_size=ffn,
                             num_kv_heads=kv_heads if llama else 0, activation="swiglu" if llama else "gelu",
                             norm="rmsnorm" if llama else "layernorm", bias=not llama, learned_positions=not llama,
                             tied_embeddings=not llama, dropout=False)


def _set_attention(unit, attention: str) -> None:
    for m in unit.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = attention
    for m in unit.modules():  # _LlamaBlock keeps the HF config as _config
        cfg = getattr(m, "_config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = attention


def measure_unit(family: str, precision: str, attention: str, recompute: str, shape: tuple, unit: str = "block") -> dict:
    """One forward of one unit (``block`` or ``head``: the head with the engine's cross-entropy loss)."""
    import torch
    from torch.nn import functional as F

    from hetpart.runtime.models import RunnableSpec, build_units

    h, a, kvh, ffn, s, b = shape
    cfg = _config(family, h, a, kvh, ffn, s)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    index = 1 if unit == "block" else cfg.num_layers + 1
    impl = "hetpart" if family == "gpt" else "transformers"
    (u,) = build_units(RunnableSpec(name=f"{family}-measure", config=cfg, impl=impl), [index], dtype=dtype)
    _set_attention(u, attention)
    u.set_recompute(recompute)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, s, h, generator=gen).to(dtype).requires_grad_(True)
    targets = torch.randint(0, cfg.vocab_size, (b, s), generator=gen)
    params = {p.untyped_storage().data_ptr() for p in u.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    def forward():
        y = u(x)
        if unit == "head":  # the engine's loss: cross-entropy of the logits, in fp32
            y = F.cross_entropy(y.float().view(-1, y.shape[-1]), targets.view(-1))
        return y

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = forward()
    y.float().sum().backward()  # the graph is a real one: its backward runs
    kv = cfg.kv_dim
    return {"family": family, "precision": precision, "attention": attention, "recompute": recompute, "unit": unit,
            "h": h, "heads": a, "kv": kv, "f": cfg.ffn, "d": cfg.head_dim, "seq": s, "micro_batch": b,
            "vocab": cfg.vocab_size, "tokens": b * s, "saved_bytes": int(sum(seen.values()))}


def measure_all(quick: bool = False) -> list[dict]:
    rows = []
    shapes = SHAPES[:4] if quick else SHAPES
    for family in ("gpt2", "llama", "gpt"):
        for precision in ("fp32", "bf16"):
            for attention in (("sdpa", "eager") if family != "gpt" else ("sdpa",)):
                for recompute in ("none", "selective", "full"):
                    for shape in shapes:
                        rows.append(measure_unit(family, precision, attention, recompute, shape))
            for shape in shapes:
                rows.append(measure_unit(family, precision, "sdpa", "none", shape, unit="head"))
    return rows


HEAD_FEATURES = ("h", "V", "one")
"""Per-token terms of the head's fit (final norm, vocabulary projection, fp32 cross-entropy): width,
vocabulary, a constant (norm statistics, the int64 target)."""


def _features(row: dict) -> list[float]:
    if row["unit"] == "head":
        return [row["h"], row["vocab"], 1.0]
    return [row["h"], row["kv"], row["f"], row["heads"], 1.0, row["d"] / row["micro_batch"], row["heads"] * row["seq"]]


def fit(rows: list[dict], key: str = "saved_bytes") -> dict:
    """Least-squares per-token coefficients per ``unit/family/precision/attention/recompute``, with the
    largest relative residual over the shapes."""
    import numpy as np

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['unit']}/{r['family']}/{r['precision']}/{r['attention']}/{r['recompute']}", []).append(r)
    out = {}
    for name, rs in sorted(groups.items()):
        unit, family, _, attention, _ = name.split("/")
        names = HEAD_FEATURES if unit == "head" else FEATURES
        X = np.array([_features(r) for r in rs], dtype=float)
        y = np.array([r[key] / r["tokens"] for r in rs], dtype=float)
        drop = {"as"} if attention != "eager" else set()
        if family in ("gpt2", "gpt"):  # no grouped-query attention (kv = h) and learned positions (no rotary)
            drop |= {"kv", "d/b"}
        use = [i for i, f in enumerate(names) if f not in drop]
        coef, *_ = np.linalg.lstsq(X[:, use], y, rcond=None)
        full = dict.fromkeys(names, 0.0)
        for i, c in zip(use, coef):
            full[names[i]] = round(float(c), 4) + 0.0
        pred = X @ np.array([full[f] for f in names])
        out[name] = {"per_token": full, "max_rel_residual": round(float(np.max(np.abs(pred - y) / y)), 6),
                     "shapes": len(rs)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA)
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    ap.add_argument("--check", action="store_true", help="refit the stored measurements, measure nothing")
    args = ap.parse_args(argv)
    if args.check:
        data = json.loads(args.out.read_text())
        print(json.dumps(fit(data["rows"]), indent=1))
        return 0
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = measure_all(args.quick)
    data = {"what": "bytes autograd keeps for the backward of one unit of hetpart's runtime (one forward, CPU)",
            "command": "OMP_NUM_THREADS=1 python -m hetpart.experiments.measure_activations",
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "features": list(FEATURES), "rows": rows, "fit": fit(rows)}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["fit"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
