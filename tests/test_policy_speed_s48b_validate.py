""":meth:`Plan.validate`'s device check skips its per-stage sets and its count of uses when no device is listed twice
in the whole plan (a planner's plan): the same problems, in the same order, as the check that always counts, on
valid plans of every planner candidate and on plans broken every way a device can be (listed twice in a stage, used
by two replicas, two stages sharing a group, unknown, interleaved)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel.megatron import megatron_plan
from hetpart.plan import Plan, Replica, Stage, compress_device_ids
from hetpart.policies.plan_proportional import hap_plans, holmes_plans
from hetpart.workload import Workload


def counted_check_devices(plan: Plan, cluster) -> list[str]:
    """The device check as written before the fast path (the slow reference): every stage's set, every use counted."""
    out = []
    uses: Counter[str] = Counter()
    unknown = {d for r in plan.replicas for s in r.stages for d in s.devices if not cluster.has_device(d)}
    for i, r in enumerate(plan.replicas):
        groups = [s.devices for s in r.stages]
        for j, s in enumerate(r.stages):
            if plan.cp == 1 and s.tp != len(s.devices):
                out.append(f"replicas[{i}].stages[{j}].tp: {s.tp} but {len(s.devices)} devices listed; "
                           "tp must equal the number of devices")
            elif s.tp * plan.cp != len(s.devices):
                out.append(f"replicas[{i}].stages[{j}].devices: {len(s.devices)} devices listed, but tp {s.tp} x "
                           f"cp {plan.cp} = {s.tp * plan.cp}; list tp x cp devices (tensor-parallel groups one "
                           "after another) or change tp")
            if len(s.devices) > 1 and len(set(s.devices)) != len(s.devices):
                out.append(f"replicas[{i}].stages[{j}].devices: a device is listed twice")
            for d in s.devices if unknown else ():
                if d in unknown:
                    out.append(f"replicas[{i}].stages[{j}].devices: {d!r} does not exist in cluster "
                               f"{cluster.name!r} ({cluster.num_devices} devices)")
        distinct = list(dict.fromkeys(groups))
        if plan.schedule == "interleaved":
            pp = max(1, r.pp // max(1, plan.interleave))
            if any(groups[k] != groups[k % pp] for k in range(len(groups))):
                out.append(f"replicas[{i}].stages: interleaved stage k must run on the devices of stage k mod {pp}")
        elif len(distinct) != len(groups):
            out.append(f"replicas[{i}].stages: two stages share devices; use schedule 'interleaved' for that")
        uses.update(d for g in distinct for d in set(g))
    twice = [d for d, c in uses.items() if c > 1]
    if twice:
        out.append(f"devices {compress_device_ids(sorted(twice))} are used more than once; a device serves one stage "
                   "of one replica")
    return out


def _broken(plan: Plan) -> dict[str, Plan]:
    """``plan`` broken each way a device list can be (``plan`` has two replicas of two stages of two devices)."""
    r0, r1 = plan.replicas[0], plan.replicas[1]
    s0, s1 = r0.stages
    a, b = s0.devices
    other = r1.stages[0].devices
    return {
        "listed twice in a stage": replace(plan, replicas=(replace(r0, stages=(replace(s0, devices=(a, a)), s1)), r1)),
        "used by two replicas": replace(plan, replicas=(r0, replace(r1, stages=(replace(r1.stages[0], devices=(a, b)),
                                                                                r1.stages[1])))),
        "two stages share a group": replace(plan, replicas=(replace(r0, stages=(s0, replace(s1, devices=(a, b)))), r1)),
        "one device in two stages": replace(plan, replicas=(replace(r0, stages=(s0, replace(s1, devices=(b, other[0])))),
                                                            r1)),
        "unknown device": replace(plan, replicas=(replace(r0, stages=(replace(s0, devices=(a, "9/9/9")), s1)), r1)),
        "unknown twice": replace(plan, replicas=(replace(r0, stages=(replace(s0, devices=("9/9/9", "9/9/9")), s1)), r1)),
        "tp unlike devices": replace(plan, replicas=(replace(r0, stages=(replace(s0, tp=4), s1)), r1)),
    }


def test_fast_device_check_is_the_counted_one_on_broken_plans() -> None:
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-v100-16")
    plan = megatron_plan(model, cluster, Workload(32, 1024), tp=2, pp=2, dp=2, micro_batch=1)
    assert plan._check_devices(cluster) == counted_check_devices(plan, cluster) == []
    broken = _broken(plan)
    for why, bad in broken.items():
        assert bad._check_devices(cluster) == counted_check_devices(bad, cluster) != [], why
    assert broken["listed twice in a stage"]._check_devices(cluster) == [
        "replicas[0].stages[0].devices: a device is listed twice"]
    used = broken["used by two replicas"]._check_devices(cluster)
    assert len(used) == 1 and used[0].endswith("are used more than once; a device serves one stage of one replica")
    assert broken["two stages share a group"]._check_devices(cluster)[0] == (
        "replicas[0].stages: two stages share devices; use schedule 'interleaved' for that")


def test_fast_device_check_on_interleaved_plans() -> None:
    model, cluster = load_model("llama2-7b", seq_len=1024), load_cluster("a100-v100-16")
    plan = megatron_plan(model, cluster, Workload(32, 1024), tp=2, pp=2, dp=2, micro_batch=1, schedule="interleaved",
                         interleave=2)
    assert plan.validate(model, cluster) == []
    assert plan._check_devices(cluster) == counted_check_devices(plan, cluster) == []
    r0 = plan.replicas[0]
    stages = list(r0.stages)
    stages[2] = replace(stages[2], devices=stages[1].devices)  # stage 2 must run where stage 0 runs
    bad = replace(plan, replicas=(replace(r0, stages=tuple(stages)), *plan.replicas[1:]))
    assert bad._check_devices(cluster) == counted_check_devices(bad, cluster)
    assert "interleaved stage k must run on the devices of stage k mod 2" in bad._check_devices(cluster)[0]


@pytest.mark.parametrize("model_name,cluster_name,batch", [("gpt2-medium", "tiny-mixed", 32),
                                                           ("llama2-7b", "a100-v100-16", 64)])
def test_fast_device_check_on_planner_candidates(model_name: str, cluster_name: str, batch: int) -> None:
    model, cluster = load_model(model_name, seq_len=1024), load_cluster(cluster_name)
    workload = Workload(global_batch=batch, seq_len=1024)
    plans = [p for gen in (holmes_plans, hap_plans) for layout in gen(model, cluster, workload) for p in layout]
    assert len(plans) >= 10
    for p in plans:
        assert p._check_devices(cluster) == counted_check_devices(p, cluster) == []
        if p.dp > 1:  # each replica handed the first replica's devices: every device used twice
            clash = replace(p, replicas=tuple(replace(r, stages=tuple(replace(s, devices=p.replicas[0].stages[min(
                j, len(p.replicas[0].stages) - 1)].devices) for j, s in enumerate(r.stages))) for r in p.replicas))
            assert clash._check_devices(cluster) == counted_check_devices(clash, cluster) != []


def test_a_user_plan_with_a_device_twice_is_still_refused() -> None:
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-8")
    plan = Plan(global_batch=8, micro_batch=1, seq_len=1024,
                replicas=(Replica(0.5, (Stage((0, 10), ("0/0/0",)), Stage((10, model.num_units), ("0/0/1",)))),
                          Replica(0.5, (Stage((0, 10), ("0/0/1",)), Stage((10, model.num_units), ("0/0/2",))))))
    problems = plan.validate(model, cluster)
    assert problems == ["devices 0/0/1 are used more than once; a device serves one stage of one replica"]
