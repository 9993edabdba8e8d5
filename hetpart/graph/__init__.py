"""The model graph: partitionable units with FLOPs, parameters and activation bytes."""

from hetpart.graph.model_graph import ModelGraph, Unit
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.graph.load import load_model, resolve_transformer
from hetpart.graph.scales import SCALES, Scale, check_seq_len, scale_of

__all__ = ["ModelGraph", "Unit", "TransformerConfig", "transformer_graph", "load_model", "resolve_transformer",
           "Scale", "SCALES", "scale_of", "check_seq_len"]
