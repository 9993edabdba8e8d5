""":meth:`Evaluator.fits` takes each replica class's micro-batches in flight from a memo per (schedule, pp,
micro-batches, chunks per device): the same answer as checking every replica's every device group against its least
capacity (:meth:`Evaluator.device_memory_gb`), on planner candidates under 1F1B, GPipe and interleaving, at batches
where some fit and some do not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.memory import in_flight_microbatches
from hetpart.policies.plan_proportional import hap_plans, holmes_plans
from hetpart.workload import Workload


def plain_fits(ev: Evaluator, plan) -> bool:
    """Every (replica, device group) against the least capacity of its devices: no classes, no memo."""
    return all(need <= ev._least_capacity_gb(plan.replicas[r].stages[d].devices)
               for (r, d), need in ev.device_memory_gb(plan).items())


@pytest.mark.parametrize("model_name,cluster_name,batch,seq", [("gpt2-medium", "tiny-mixed", 32, 1024),
                                                               ("llama2-7b", "a100-v100-16", 64, 2048),
                                                               ("llama2-13b", "a100-v100-16", 256, 4096)])
def test_fits_is_the_plain_check_on_planner_candidates(model_name: str, cluster_name: str, batch: int,
                                                       seq: int) -> None:
    model, cluster = load_model(model_name, seq_len=seq), load_cluster(cluster_name)
    workload = Workload(global_batch=batch, seq_len=seq)
    plans = [p for gen in (holmes_plans, hap_plans) for layout in gen(model, cluster, workload) for p in layout]
    plans += [replace(p, schedule="gpipe") for p in plans]
    ev = Evaluator(model, cluster, workload)
    answers = [ev.fits(p) for p in plans]
    assert answers == [plain_fits(Evaluator(model, cluster, workload), p) for p in plans]
    assert answers == [ev.fits(p) for p in plans]  # again, from the memo
    assert True in answers and False in answers
    assert len(ev._flights) >= 2


def test_fits_under_interleaving_and_the_memo_holds_the_schedule_s_flights() -> None:
    model, cluster = load_model("llama2-7b", seq_len=2048), load_cluster("a100-v100-16")
    workload = Workload(global_batch=64, seq_len=2048)
    ev = Evaluator(model, cluster, workload)
    plans = [megatron_plan(model, cluster, workload, tp=2, pp=4, dp=2, micro_batch=1, schedule=s, interleave=i)
             for s, i in [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)]]
    assert [ev.fits(p) for p in plans] == [plain_fits(ev, p) for p in plans]
    assert ev._flights[("1f1b", 4, 32, 1)] == (4.0, 3.0, 2.0, 1.0)
    assert ev._flights[("gpipe", 4, 32, 1)] == (32.0,) * 4
    assert ev._flights[("interleaved", 4, 32, 2)] == tuple(in_flight_microbatches("interleaved", d, 4, 32, 2)
                                                           for d in range(4))
