"""Cost models: the analytical simulator of heterogeneous training, the upper bound and the planners."""

from hetpart.costmodel.collectives import allreduce_cost, allreduce_time_s, p2p_time_s, ring_allreduce_time_s
from hetpart.costmodel.compute import stage_compute_s, stage_tp_comm_s, unit_compute_s, unit_tp_comm_s
from hetpart.costmodel.efficiency import CURVES, EfficiencyCurve, curve_for, matmul_efficiency
from hetpart.costmodel.megatron import even_layer_split, megatron_plan
from hetpart.costmodel.memory import PrefixTables, in_flight_microbatches, memory_capacity_gb, stage_memory_gb, \
    stage_params_per_device
from hetpart.costmodel.schedule import PipelineTiming, pipeline_step_time_s, pipeline_summary, pipeline_timing, \
    simulate_pipeline_events
from hetpart.costmodel.simulator import Estimate, Prediction, Simulator, simulate
from hetpart.costmodel.planner import PLANNERS, PlanResult, plan
from hetpart.costmodel.plan_search import SearchOptions, plan_search
from hetpart.costmodel.plan_uniform import plan_uniform
from hetpart.costmodel.plan_proportional import plan_proportional
from hetpart.costmodel.upper_bound import roofline_tokens_per_s, upper_bound

__all__ = [
    # simulator (engineer B)
    "simulate", "Simulator", "Prediction", "Estimate", "pipeline_summary", "PrefixTables", "stage_compute_s",
    "stage_tp_comm_s", "unit_compute_s", "unit_tp_comm_s", "p2p_time_s", "allreduce_time_s", "allreduce_cost",
    "ring_allreduce_time_s", "stage_memory_gb", "stage_params_per_device", "in_flight_microbatches", "memory_capacity_gb", "pipeline_step_time_s",
    "pipeline_timing", "simulate_pipeline_events", "PipelineTiming", "megatron_plan", "even_layer_split",
    "matmul_efficiency", "curve_for", "CURVES", "EfficiencyCurve",
    # planners and upper bound (engineer C)
    "PLANNERS", "PlanResult", "plan", "SearchOptions", "plan_search", "plan_uniform", "plan_proportional",
    "upper_bound", "roofline_tokens_per_s",
]
