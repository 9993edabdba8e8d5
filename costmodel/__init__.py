"""Cost models price plans: the :class:`Predictor` protocol and registry, the analytical simulator
(the ``simulator`` predictor), the memory model and the evaluator planners price candidates with.
Planners live in :mod:`hetpart.policies`."""

from hetpart.costmodel.collectives import allreduce_choice, allreduce_cost, allreduce_lines, allreduce_time_s, \
    p2p_time_s, reduce_scatter_time_s, ring_allreduce_time_s
from hetpart.costmodel.nccl import CollectiveLine
from hetpart.costmodel.compute import stage_compute_s, stage_tp_comm_s, unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.efficiency import CURVES, EfficiencyCurve, curve_for, matmul_efficiency
from hetpart.costmodel.megatron import even_layer_split, megatron_plan
from hetpart.costmodel.memory import PrefixTables, in_flight_microbatches, memory_capacity_gb, stage_memory_gb, \
    stage_params_per_device
from hetpart.costmodel.schedule import PipelineTiming, pipeline_step_time_s, pipeline_summary, pipeline_timing, \
    simulate_pipeline_events
from hetpart.costmodel.simulator import Estimate, Prediction, Simulator, simulate, simulator_predictor
from hetpart.costmodel.predictor import Predictor, available_predictors, default_predictor, get_predictor, \
    register_predictor, set_default_predictor
from hetpart.costmodel.evaluator import Evaluated, Evaluator, best_of
from hetpart.costmodel.roofline import roofline_tokens_per_s
from hetpart.costmodel.device_group import DeviceGroupFacts, device_group_facts

__all__ = [
    # simulator
    "simulate", "Simulator", "Prediction", "Estimate", "pipeline_summary", "PrefixTables", "stage_compute_s",
    "stage_tp_comm_s", "unit_compute_s", "unit_tp_comm_s", "p2p_time_s", "allreduce_time_s", "allreduce_cost",
    "ring_allreduce_time_s", "allreduce_lines", "allreduce_choice", "reduce_scatter_time_s", "CollectiveLine",
    "stage_memory_gb", "stage_params_per_device", "in_flight_microbatches", "memory_capacity_gb", "pipeline_step_time_s",
    "pipeline_timing", "simulate_pipeline_events", "PipelineTiming", "megatron_plan", "even_layer_split",
    "matmul_efficiency", "curve_for", "CURVES", "EfficiencyCurve",
    "simulator_predictor", "roofline_tokens_per_s",
    # the predictor interface and what prices candidates
    "Predictor", "get_predictor", "register_predictor", "available_predictors", "default_predictor",
    "set_default_predictor", "Evaluator", "Evaluated", "best_of", "DeviceGroupFacts", "device_group_facts",
]
