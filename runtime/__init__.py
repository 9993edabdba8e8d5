"""The runtime: executes plans with torch.distributed and measures real throughput."""

from hetpart.runtime.engine import Executor, Hooks, LocalGrad, NoHooks, StepResult, StepTiming, check_runnable
from hetpart.runtime.groups import (CommLayout, FusedBucket, GradBucket, ProcessGroups, RankRole, comm_layout,
                                   device_ranks, fuse_buckets)
from hetpart.runtime.models import (SCALES, RunnableSpec, Scale, build_units, runnable_spec, scaled_config,
                                    scaled_seq_len, synthetic_batch, unit_infos)
from hetpart.runtime.reference import Reference
from hetpart.runtime.checkpoint import load_checkpoint, save_checkpoint
from hetpart.runtime.emulation import (ArrivalBoard, EmulationParams, Emulator, emulated_cluster, resolve_emulation,
                                       speed_ratios)
from hetpart.runtime.faults import FaultSpec, Watchdog
from hetpart.runtime.launch import (Capacity, RunOptions, RunResult, check_capacity, host_capacity, prepare_run,
                                    run_plan, torchrun_command)
from hetpart.runtime.measure import Calibration, Measurement, calibrate, predict, summarize
from hetpart.runtime.netem import NetemNetwork, netem_unavailable

__all__ = [
    # engine
    "Executor", "Hooks", "NoHooks", "StepResult", "StepTiming", "LocalGrad", "check_runnable",
    # groups
    "CommLayout", "FusedBucket", "GradBucket", "ProcessGroups", "RankRole", "comm_layout", "device_ranks", "fuse_buckets",
    # models
    "SCALES", "Scale", "RunnableSpec", "runnable_spec", "scaled_config", "scaled_seq_len", "build_units",
    "unit_infos", "synthetic_batch",
    # reference
    "Reference",
    # launcher, emulation, measurements, faults, checkpoints
    "RunOptions", "RunResult", "run_plan", "prepare_run", "Capacity", "host_capacity", "check_capacity",
    "torchrun_command", "Emulator", "EmulationParams", "ArrivalBoard", "emulated_cluster", "resolve_emulation",
    "speed_ratios", "Measurement", "Calibration", "calibrate", "summarize", "predict", "FaultSpec", "Watchdog",
    "save_checkpoint", "load_checkpoint", "NetemNetwork", "netem_unavailable",
]
