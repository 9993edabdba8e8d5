"""The model graph: partitionable units with FLOPs, parameters and activation bytes."""

from hetpart.graph.model_graph import ModelGraph, Unit
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.graph.load import load_model, resolve_transformer

__all__ = ["ModelGraph", "Unit", "TransformerConfig", "transformer_graph", "load_model", "resolve_transformer"]
