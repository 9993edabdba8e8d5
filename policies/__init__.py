"""Policies produce plans: the planners (``uniform``, ``proportional``, ``search``), their open
registry and the upper bound that runs a planner per device type. The learned GNN policy registers
itself here as one more planner (``policy``)."""

from hetpart.policies.common import FunctionPlanner, Planner
from hetpart.policies.planner import PlanResult, make_evaluator, plan
from hetpart.policies.registry import BUILTIN_PLANNERS, available_planners, get_planner, register_planner
from hetpart.policies.plan_search import SearchOptions, plan_search
from hetpart.policies.plan_uniform import plan_uniform
from hetpart.policies.plan_proportional import plan_proportional
from hetpart.policies.upper_bound import upper_bound

PLANNERS = BUILTIN_PLANNERS
"""Backwards-compatible name of the built-in planners; :func:`available_planners` lists every registered one."""

__all__ = ["Planner", "FunctionPlanner", "PlanResult", "plan", "make_evaluator", "register_planner", "get_planner",
           "available_planners", "BUILTIN_PLANNERS", "PLANNERS", "SearchOptions", "plan_search", "plan_uniform",
           "plan_proportional", "upper_bound"]
