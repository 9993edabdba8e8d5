"""``--model`` resolution: a catalog name, a config.json path, or ``python:MODULE:FUNCTION``."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import replace
from pathlib import Path

from hetpart import _validate as v
from hetpart.catalog.models import MODEL_CATALOG
from hetpart.errors import ModelError
from hetpart.graph.hf_config import read_hf_config
from hetpart.graph.model_graph import ModelGraph
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.vocabulary import DTYPE_BYTES, PRECISIONS

__all__ = ["load_model", "resolve_transformer", "ModelNote"]


class ModelNote(UserWarning):
    """A remark on how a model was read that is not an error (the CLI prints it as one ``hetpart: note:``
    line on stderr)."""


def _file_model_name(path: Path) -> str:
    """The name of a model given as a config file: its folder's for ``.../NAME/config.json`` (the Hugging Face
    layout), else the file's own (``llama-2.4b.config.json`` -> ``llama-2.4b``)."""
    if path.name == "config.json":
        return path.parent.name or "config"
    stem = path.stem
    return stem[:-len(".config")] if stem.endswith(".config") else stem


def resolve_transformer(spec: str) -> tuple[str, TransformerConfig, str] | None:
    """``(name, config, source)`` for a catalog name or a config.json path; None for ``python:`` specs."""
    if spec.startswith("python:"):
        return None
    if spec in MODEL_CATALOG:
        return spec, MODEL_CATALOG[spec], f"catalog:{spec}"
    path = Path(spec)
    if v.path_exists(path):  # False, not an OSError, for names the OS refuses
        if path.is_file():
            return _file_model_name(path), read_hf_config(path), str(path)
        if (path / "config.json").is_file():
            return path.name, read_hf_config(path / "config.json"), str(path / "config.json")
        if path.is_dir():
            raise ModelError(f"--model: {v.show(spec, 200)}: no config.json in this directory; give the directory "
                             "of a Hugging Face model (or the path of its config.json), a catalog name or "
                             "python:MODULE:FUNCTION")
        raise ModelError(f"--model: {v.show(spec, 200)}: not a regular file (a device, pipe or socket); give the "
                         "path of a Hugging Face config.json (or of its directory), a catalog name or "
                         "python:MODULE:FUNCTION")
    if spec.endswith(".json") or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelError(f"--model: {v.show(spec, 200)}: no such file; give the path of a Hugging Face config.json "
                         "(or of its directory), a catalog name or python:MODULE:FUNCTION")
    if _HUB_ID.fullmatch(spec):
        cached = _cached_hub_config(spec)
        if cached is not None:
            return spec, read_hf_config(cached), str(cached)
        raise ModelError(f"--model: {spec!r} looks like a Hugging Face hub id, and hetpart does not download (it "
                         "is not in the local Hugging Face cache either); fetch its config.json "
                         f"(huggingface-cli download {spec} config.json) and give --model path/to/config.json")
    raise v.unknown_name(ModelError, "model", spec, MODEL_CATALOG, "--model", "",
                         extra=" (or a path to a Hugging Face config.json, or python:MODULE:FUNCTION)")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def _cached_hub_config(repo_id: str) -> Path | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache (newest snapshot), if it is there.

    The cache layout is ``$HF_HUB_CACHE`` (default ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``)
    ``/models--{org}--{name}/snapshots/{revision}/config.json``; ``refs/main`` names the current revision.
    """
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    root = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub"))
    repo = root / ("models--" + repo_id.replace("/", "--"))
    try:
        main = (repo / "refs" / "main").read_text().strip()
        if (repo / "snapshots" / main / "config.json").is_file():
            return repo / "snapshots" / main / "config.json"
    except OSError:
        pass
    try:
        configs = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    return configs[-1] if configs else None


def load_model(spec: str, seq_len: int | None = None, precision: str = "bf16",
               seq_len_source: str = "--seq-len", exact_seq_len: bool = False) -> ModelGraph:
    """The unit graph of the model ``spec`` for sequences of ``seq_len`` tokens.

    ``python:MODULE:FUNCTION`` imports user code (an explicit opt-in) and traces the returned module
    on the meta device; a function without a ``seq_len`` parameter gives the length in its example inputs,
    which wins over ``seq_len`` unless ``exact_seq_len`` (the CLI, where ``seq_len`` is what the user asked
    for): then another length is an error. ``seq_len=None`` takes ``min(2048, max_positions)``.
    ``seq_len_source`` names where ``seq_len`` came from (a flag, or a plan file's field) in error messages.
    """
    resolved = None if not isinstance(spec, str) or spec.startswith("python:") else resolve_transformer(spec)
    given = seq_len
    if seq_len is None:
        seq_len = min(2048, resolved[1].max_positions) if resolved else 2048
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= 10**7:
        raise ModelError(f"{seq_len_source}: must be a whole number between 1 and 1e7, got {v.show(seq_len)}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ModelError(f"--precision: unknown precision {v.show(precision)}; use {', '.join(PRECISIONS)}")
    dtype_bytes = DTYPE_BYTES[precision]
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"--model: expected a catalog name, a config.json path or python:MODULE:FUNCTION, got {v.show(spec)}")
    if spec.startswith("python:"):
        from hetpart.graph.trace import trace_python_spec  # imports torch; only on demand

        return trace_python_spec(spec, seq_len=given, precision=precision,
                                 seq_len_source=seq_len_source if exact_seq_len else None)
    name, cfg, source = resolved
    if cfg.learned_positions and seq_len > cfg.max_positions:
        raise ModelError(f"{seq_len_source}: {seq_len} exceeds the {cfg.max_positions} learned positions of {name}; "
                         f"use {'--seq-len ' if seq_len_source.startswith('--') else ''}{cfg.max_positions} or less")
    if seq_len > cfg.max_positions:  # rotary or ALiBi: context extension; what is built must take the length
        warnings.warn(ModelNote(f"{seq_len_source} {seq_len} exceeds {name}'s max_position_embeddings "
                                f"{cfg.max_positions} (rotary/ALiBi positions extrapolated)"), stacklevel=2)
        cfg = replace(cfg, max_positions=seq_len)
    return transformer_graph(cfg, name, seq_len, dtype_bytes, source=source)
