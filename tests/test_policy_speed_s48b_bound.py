""":meth:`Simulator.lower_bound_s` walks one replica per class of replicas alike in what the bound reads (and memoises
each stage's terms) against the plain walk over every replica and stage: the same float, bit for bit (to 1e-12 where
the gradients' all-reduce term enters, summed by NumPy in another order), on plans of
uniform and mixed clusters, uneven shares, sharding, interleaving, uneven TP splits, context parallelism, NCCL-priced
TP and a profile's measured links; and fewer stages walked where replicas repeat."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.simulator import _BOUND_SLACK, Simulator
from hetpart.costmodel.tp_split import fill_tp_splits
from hetpart.plan import Plan, Replica, Stage
from hetpart.policies.plan_proportional import hap_plans, holmes_plans
from hetpart.workload import Workload


def plain_bound_s(sim: Simulator, plan: Plan) -> float:
    """The bound written plainly: every replica, every stage, in order (the slow reference). Per pipeline device,
    its stages' compute and the blocking sends it makes or takes; where replicas all-reduce their gradients once
    after the backward (levels 0-1), each device's runs one after another from the earliest start of its last
    backward, per unit ``c (N - 1) / N`` of its gradient bytes over its node's NICs (``N`` nodes holding the unit;
    the fastest zone link where they span zones)."""
    v = plan.chunks_per_device
    pipe = optim = 0.0
    cp_flows = sim._cp_flows(plan) if plan.cp > 1 else None
    flows = sim._pipeline_flows(plan) if sim._sharing is None and any(r.pp > 1 for r in plan.replicas) else None
    sync = len(plan.replicas) > 1 and sim._sync_bounded(plan)
    ready: dict[tuple[int, int], float] = {}
    for r, rep in enumerate(plan.replicas):
        pp, m = rep.pp // v, plan.num_microbatches(r)
        per_device = [0.0] * pp
        params = [0.0] * pp
        forward = [0.0] * pp
        least_bwd = [float("inf")] * pp
        for k, s in enumerate(rep.stages):
            u = (sim._cp_unit_prefix(s, plan, cp_flows) if cp_flows is not None else
                 sim._unit_prefix(s.devices, s.tp, plan.micro_batch, plan.precision, plan.recompute, s.tp_split,
                                  plan.attention))
            f, b, tf, tb = u.fwd, u.bwd, u.tp_fwd, u.tp_bwd
            a, z = s.layers
            busy, fwd = (f[z] - f[a]) + (b[z] - b[a]) + (tf[z] - tf[a]) + (tb[z] - tb[a]), (f[z] - f[a]) + (tf[z] - tf[a])
            per_device[k % pp] += busy
            forward[k % pp] += fwd
            least_bwd[k % pp] = min(least_bwd[k % pp], busy - fwd)
            params[k % pp] += sim._tables.params_per_device(a, z, s.tp)
            if flows is not None and k + 1 < len(rep.stages) and sim._send_blocks(s, rep.stages[k + 1]):
                t = sim._p2p_s(s, rep.stages[k + 1], plan.micro_batch, flows, plan.cp)
                per_device[k % pp] += t
                per_device[(k + 1) % pp] += t
        before = 0.0
        for d in range(pp):
            pipe = max(pipe, (before if v == 1 else 0.0) + m * per_device[d])
            ready[r, d] = (sum(forward[:d]) if v == 1 else 0.0) + m * forward[d] + (m - 1) * least_bwd[d]
            before += per_device[d]
            optim = max(optim, sim._optimizer_s(rep.stages[d].devices, params[d] * sim._fraction(plan, r),
                                                plan.optimizer, plan.precision))
    if sync:
        node_of = sim._nodes  # device -> its node's number
        holders: dict[int, list[int]] = {}
        for rep in plan.replicas:
            for s in rep.stages:
                for u in range(*s.layers):
                    holders.setdefault(u, []).append(node_of[s.devices[0]])
        grads = sim._unit_grad_bytes(plan.precision)
        c = 2.0 if plan.zero == 0 else 1.0
        for r, rep in enumerate(plan.replicas):
            pp = rep.pp // v
            busy = [0.0] * pp
            for k, s in enumerate(rep.stages):
                node = node_of[s.devices[0]]
                for u in range(*s.layers):
                    n = len(set(holders[u]))
                    nbytes = c * (n - 1) / n * grads[u]
                    t = nbytes / sim._node_nic_bps[node]
                    zones = {sim._node_zone[h] for h in holders[u]}
                    if sim._zoned and sim._zone_bps > 0 and len(zones) > 1:
                        t = max(t, nbytes / sim._zone_bps)
                    busy[k % pp] += t
            pipe = max([pipe] + [ready[r, d] + busy[d] for d in range(pp)])
    return (pipe + optim) * _BOUND_SLACK


def matches_plain(sim: Simulator, fresh: Simulator, plan: Plan) -> bool:
    """``sim``'s bound is the plain one: bit for bit, or to 1e-12 where the gradient term enters (its sums run in
    NumPy, in another order)."""
    got, want = sim.lower_bound_s(plan), plain_bound_s(fresh, plan)
    if len(plan.replicas) > 1 and sim._sync_bounded(plan):
        return got == pytest.approx(want, rel=1e-12, abs=0.0)
    return got == want


def _candidates(model, cluster, workload) -> list[Plan]:
    return [p for gen in (holmes_plans, hap_plans) for layout in gen(model, cluster, workload) for p in layout]


@pytest.mark.parametrize("model_name,cluster_name,batch", [("gpt2-medium", "tiny-mixed", 32),
                                                           ("gpt2-medium", "consumer-mix", 64),
                                                           ("llama2-7b", "a100-v100-16", 64)])
def test_class_bound_is_the_plain_bound_on_planner_candidates(model_name: str, cluster_name: str,
                                                              batch: int) -> None:
    model, cluster = load_model(model_name, seq_len=1024), load_cluster(cluster_name)
    workload = Workload(global_batch=batch, seq_len=1024)
    plans = _candidates(model, cluster, workload)
    plans += [fill_tp_splits(p, model, cluster) for p in plans]  # uneven splits where groups are unlike
    plans += [replace(p, zero=1) for p in plans if p.dp > 1]  # shard fractions per replica
    assert len(plans) >= 20 and any(p.dp > 2 for p in plans)
    sim, fresh = Simulator(model, cluster), Simulator(model, cluster)
    for p in plans:
        assert matches_plain(sim, fresh, p)
    for p in plans:  # again: every stage's terms now come from the memo
        assert matches_plain(sim, fresh, p)


def test_replicas_alike_are_walked_once_and_unlike_ones_each() -> None:
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-8")
    plan = megatron_plan(model, cluster, Workload(32, 1024), tp=1, pp=2, dp=4, micro_batch=1)
    sim = Simulator(model, cluster)
    walked = []
    inner = sim._replica_bound
    sim._replica_bound = lambda *a: walked.append(a[1]) or inner(*a)
    assert matches_plain(sim, Simulator(model, cluster), plan)
    assert len(walked) == 1  # four replicas on alike devices, one class
    # uneven shares: replicas with other micro-batch counts are other classes, and the bound follows the largest
    shares = (0.5, 0.25, 0.125, 0.125)
    uneven = replace(plan, replicas=tuple(replace(r, batch_share=s) for r, s in zip(plan.replicas, shares)))
    walked.clear()
    assert matches_plain(sim, Simulator(model, cluster), uneven)
    assert len(walked) == 3
    assert sim.lower_bound_s(uneven) > sim.lower_bound_s(plan)


def test_mixed_cluster_classes_follow_device_facts() -> None:
    """Replicas on unlike device kinds are distinct classes: the slower kind's replica sets the bound."""
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-v100-16")
    kinds = {}
    for d in cluster.devices:
        kinds.setdefault(d.gpu.name, []).append(d.id)
    assert len(kinds) == 2
    replicas = []
    for ids in kinds.values():
        for i in range(0, 8, 4):
            replicas.append(Replica(0.25, (Stage((0, 12), tuple(ids[i:i + 2]), 2),
                                           Stage((12, model.num_units), tuple(ids[i + 2:i + 4]), 2))))
    plan = Plan(global_batch=32, micro_batch=1, seq_len=1024, replicas=tuple(replicas))
    assert plan.validate(model, cluster) == []
    sim = Simulator(model, cluster)
    walked = []
    inner = sim._replica_bound
    sim._replica_bound = lambda *a: walked.append(a[1]) or inner(*a)
    assert matches_plain(sim, Simulator(model, cluster), plan)
    assert len(walked) == 2  # one per device kind
    # each half alone, as many micro-batches per replica: the whole plan's bound is at least the larger of theirs
    only_fast = replace(plan, global_batch=16, replicas=tuple(replace(r, batch_share=0.5) for r in replicas[:2]))
    only_slow = replace(plan, global_batch=16, replicas=tuple(replace(r, batch_share=0.5) for r in replicas[2:]))
    # (at most the whole: the whole plan's gradients also cross between the halves' nodes)
    assert max(sim.lower_bound_s(only_fast), sim.lower_bound_s(only_slow)) <= sim.lower_bound_s(plan)


@pytest.mark.parametrize("options", [{"tp_comm": "nccl"}, {"tp_comm": "nccl-sp"}])
def test_per_device_pricing_keys_on_devices(options: dict) -> None:
    """Under NCCL-priced TP a stage's terms depend on its devices, not only their facts: still the plain bound."""
    model, cluster = load_model("gpt2-medium", seq_len=1024), load_cluster("a100-v100-16")
    workload = Workload(global_batch=64, seq_len=1024)
    plans = _candidates(model, cluster, workload)
    sim, fresh = Simulator(model, cluster, **options), Simulator(model, cluster, **options)
    assert all(isinstance(sim._bound_group(s.devices), tuple) for p in plans[:1] for r in p.replicas
               for s in r.stages)
    for p in plans:
        assert matches_plain(sim, fresh, p)


def test_context_parallel_and_interleaved_plans() -> None:
    model, cluster = load_model("llama2-7b", seq_len=2048), load_cluster("a100-v100-16")
    workload = Workload(global_batch=32, seq_len=2048)
    sim, fresh = Simulator(model, cluster), Simulator(model, cluster)
    cp = megatron_plan(model, cluster, workload, tp=2, pp=2, dp=2, micro_batch=1, cp=2)
    inter = megatron_plan(model, cluster, workload, tp=2, pp=2, dp=4, micro_batch=1, schedule="interleaved",
                          interleave=2)
    for p in (cp, inter):
        assert p.validate(model, cluster) == [] or p.cp > 1
        assert matches_plain(sim, fresh, p) and sim.lower_bound_s(p) > 0


def test_profiled_simulator_keys_on_devices(tmp_path) -> None:
    """A profile's measured links are per device pair: stages key on their devices, and the bound is the plain one."""
    from tests.test_profile_model import CLUSTER, _model, analytic_profile

    (tmp_path / "c.yaml").write_text(CLUSTER)
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    model = _model()
    workload = Workload(8, 64, precision="bf16", recompute="none")
    sim = Simulator(model, cluster, profile=analytic_profile(model, cluster))
    fresh = Simulator(model, cluster, profile=analytic_profile(model, cluster))
    plans = [megatron_plan(model, cluster, workload, tp=tp, pp=pp, dp=dp, micro_batch=1, recompute="none")
             for tp, pp, dp in [(1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1), (1, 4, 1)]]
    assert isinstance(sim._bound_group(plans[0].replicas[0].stages[0].devices), tuple)
    for p in plans:
        assert matches_plain(sim, fresh, p) and sim.lower_bound_s(p) > 0
