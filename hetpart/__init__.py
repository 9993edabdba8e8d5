"""hetpart: plan, predict and run the training of large models on heterogeneous clusters.

The core (this package) is the shared language: the cluster, the model graph, the workload and
the plan. ``hetpart.costmodel`` predicts, ``hetpart.runtime`` executes, ``hetpart.envs`` and
``hetpart.policies`` learn to plan, ``hetpart.experiments`` compares.
"""

from hetpart.errors import (HetpartError, Interrupted, ModelError, PlanError, RuntimeFault, SpecError, WorkerFault,
                            WorkloadError)
from hetpart.cluster import Cluster, load_cluster
from hetpart.graph import ModelGraph, Unit, load_model
from hetpart.workload import Workload
from hetpart.plan import Plan, Replica, Stage, load_plan

__version__ = "0.1.0"

__all__ = ["HetpartError", "ModelError", "PlanError", "RuntimeFault", "WorkerFault", "Interrupted", "SpecError",
           "WorkloadError",
           "Cluster", "load_cluster", "ModelGraph", "Unit", "load_model", "Workload", "Plan", "Replica",
           "Stage", "load_plan"]
