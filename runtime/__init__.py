"""The runtime: executes plans with torch.distributed and measures real throughput."""

from hetpart.runtime.engine import Executor, Hooks, LocalGrad, NoHooks, StepResult, StepTiming, check_runnable
from hetpart.runtime.groups import CommLayout, GradBucket, ProcessGroups, RankRole, comm_layout, device_ranks
from hetpart.runtime.models import (SCALES, RunnableSpec, Scale, build_units, runnable_spec, scaled_config,
                                    scaled_seq_len, synthetic_batch, unit_infos)
from hetpart.runtime.reference import Reference

__all__ = [
    # engine
    "Executor", "Hooks", "NoHooks", "StepResult", "StepTiming", "LocalGrad", "check_runnable",
    # groups
    "CommLayout", "GradBucket", "ProcessGroups", "RankRole", "comm_layout", "device_ranks",
    # models
    "SCALES", "Scale", "RunnableSpec", "runnable_spec", "scaled_config", "scaled_seq_len", "build_units",
    "unit_infos", "synthetic_batch",
    # reference
    "Reference",
]
