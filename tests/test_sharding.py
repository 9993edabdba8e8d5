"""Sharded data parallelism (ZeRO 1-3, HSDP, uneven shards): plan schema, simulator memory and
communication against a slow unit-by-unit reference, and the ``--zero`` flag."""

import dataclasses
import json
import random
import re

import pytest

from hetpart import Plan, Replica, Stage, load_cluster, load_model
from hetpart.costmodel import Simulator, megatron_plan
from hetpart.costmodel.collectives import nic_flows
from hetpart.costmodel.sharding import exposed_unit_comm_s
from hetpart.costmodel.sharding_reference import reference_exposed_s, reference_memory_gb
from hetpart.errors import PlanError, WorkloadError
from hetpart.workload import Workload

from tests._cli import cli_json, run_cli

S = 128


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S)


@pytest.fixture(scope="module")
def mixed():
    return load_cluster("tiny-mixed")  # node 0: 2 x A100-40GB, node 1: 2 x V100-16GB


def _dp_plan(zero=0, fractions=None, shard_group=0, devices=("0/0/0", "0/0/1", "1/0/0", "1/0/1"), cut=None,
             micro_batch=1):
    n = len(devices)
    stages = (lambda d: (Stage((0, 14), (d,)),)) if cut is None else (
        lambda d: (Stage((0, cut), (d[0],)), Stage((cut, 14), (d[1],))))
    return Plan(global_batch=8 * n, micro_batch=micro_batch, seq_len=S,
                replicas=tuple(Replica(1.0 / n, stages(d)) for d in devices),
                zero=zero, shard_fractions=fractions, shard_group=shard_group)


# ------------------------------------------------------------------------------------------ schema
def test_sharding_fields_round_trip_and_default_to_unsharded():
    plan = _dp_plan(zero=3, fractions=(0.4, 0.3, 0.2, 0.1))
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    hybrid = _dp_plan(zero=2, shard_group=2)
    assert Plan.from_dict(hybrid.to_dict()) == hybrid and hybrid.shard_groups() == [[0, 1], [2, 3]]
    legacy = {k: v for k, v in _dp_plan().to_dict().items() if k != "zero"}
    assert Plan.from_dict(legacy).zero == 0 and Plan.from_dict(legacy).shard_fraction(0) == 1.0
    assert hybrid.shard_fraction(3) == 0.5 and plan.shard_fraction(3) == 0.1


@pytest.mark.parametrize("patch,match", [
    ({"zero": 4}, r"p.json: zero: expected a sharding level 0, 1, 2 or 3, got 4"),
    ({"zero": "3"}, r"p.json: zero: expected a sharding level"),
    ({"shard_fractions": "even"}, r"p.json: shard_fractions: expected a list of fractions"),
    ({"shard_fractions": [0.5, -1]}, r"p.json: shard_fractions\[1\]: must be > 0"),
    ({"shard_group": -1}, r"p.json: shard_group: must be"),
])
def test_bad_sharding_fields_name_the_field(patch, match):
    with pytest.raises(PlanError, match=match):
        Plan.from_dict(_dp_plan(zero=1).to_dict() | patch, source="p.json")


@pytest.mark.parametrize("kw,match", [
    ({"zero": 0, "fractions": (0.25,) * 4}, r"shard_fractions: given but zero is 0"),
    ({"zero": 1, "fractions": (0.5, 0.5)}, r"shard_fractions: 2 fractions for 4 replicas"),
    ({"zero": 1, "fractions": (0.5, 0.2, 0.2, 0.2)}, r"hold 1.1 of their shard group's states, not 1"),
    ({"zero": 1, "shard_group": 3}, r"shard_group: 3 does not divide the 4 replicas"),
    ({"zero": 0, "shard_group": 2}, r"shard_group: 2 needs zero >= 1"),
    ({"zero": 2, "shard_group": 2, "fractions": (0.5, 0.5, 0.9, 0.1)}, None),
])
def test_validate_states_every_sharding_rule(gpt2, mixed, kw, match):
    problems = _dp_plan(**kw).validate(gpt2, mixed)
    if match is None:
        assert problems == []
    else:
        assert any(re.search(match, p) for p in problems), problems


def test_workload_zero_is_checked():
    with pytest.raises(WorkloadError, match=r"--zero: 5 is not a sharding level; use 0, 1, 2 or 3"):
        Workload(8, S, zero=5)


# ------------------------------------------------------------------------------------------ simulator
def test_each_level_divides_what_it_shards(gpt2, mixed):
    sim = Simulator(gpt2, mixed)
    mem = {z: sim.simulate(_dp_plan(zero=z)).memory_gb["0/0/0"] for z in range(4)}
    params = gpt2.range_params(0, 14, 1)
    # level 1 saves 12 of 16 bytes x 3/4; level 2 also 2 bytes x 3/4 (less one unit's full gradient) ...
    assert mem[0] - mem[1] == pytest.approx(params * 12 * 0.75 / 1e9)
    assert mem[0] > mem[1] > mem[2] > mem[3]
    assert sim.simulate(_dp_plan(zero=0)).step_time_s == pytest.approx(
        Simulator(gpt2, mixed).simulate(dataclasses.replace(_dp_plan(), zero=0)).step_time_s)


def test_uneven_fractions_move_states_to_the_large_device_and_pad_the_collectives(gpt2, mixed):
    sim = Simulator(gpt2, mixed)
    even = sim.simulate(_dp_plan(zero=3))
    uneven = sim.simulate(_dp_plan(zero=3, fractions=(0.4, 0.4, 0.1, 0.1)))
    assert uneven.memory_gb["1/0/0"] < even.memory_gb["1/0/0"] and uneven.memory_gb["0/0/0"] > even.memory_gb["0/0/0"]
    assert uneven.step_time_s > even.step_time_s  # every member sends the largest shard


def test_level_three_gathers_every_micro_batch(gpt2, mixed):
    sim = Simulator(gpt2, mixed)
    one, three = (sim.simulate(_dp_plan(zero=z, micro_batch=1)) for z in (1, 3))
    assert all(b["zero_comm_s"] == 0 for b in one.breakdown)
    assert all(b["zero_comm_s"] > 0 for b in three.breakdown)
    optim = max(b["optimizer_s"] for b in three.breakdown)
    for b in three.breakdown:
        busy = b["compute_s"] + b["tp_comm_s"] + b["zero_comm_s"]
        assert busy + b["bubble_s"] + b["sync_wait_s"] + optim == pytest.approx(three.step_time_s, rel=1e-9)


def test_hybrid_sharding_keeps_more_than_full_sharding_and_syncs_across_groups(gpt2, mixed):
    sim = Simulator(gpt2, mixed)
    full, hybrid = (sim.simulate(_dp_plan(zero=1, shard_group=g)) for g in (0, 2))
    assert hybrid.memory_gb["0/0/0"] > full.memory_gb["0/0/0"]
    assert hybrid.step_time_s != full.step_time_s


def _random_plan(rng: random.Random) -> Plan:
    devices = [("0/0/0", "0/0/1"), ("1/0/0", "1/0/1")]
    zero = rng.choice([1, 2, 3])
    cuts = [rng.randrange(2, 12) for _ in devices]
    if zero >= 2:  # per-micro-batch collectives run between replicas cut alike (hetpart.rules)
        cuts = [cuts[0]] * len(devices)
    fractions = None
    n = len(devices)
    if rng.random() < 0.5:
        raw = [rng.uniform(0.2, 1.0) for _ in devices]
        fractions = tuple(x / sum(raw) for x in raw)
    return Plan(global_batch=4 * rng.choice([1, 2, 4]) * n, micro_batch=rng.choice([1, 2]), seq_len=S,
                schedule=rng.choice(["gpipe", "1f1b"]), recompute=rng.choice(["none", "selective", "full"]),
                replicas=tuple(Replica(1.0 / n, (Stage((0, c), (d[0],)), Stage((c, 14), (d[1],))))
                               for c, d in zip(cuts, devices)),
                zero=zero, shard_fractions=fractions, optimizer=rng.choice(["adam", "sgd", "adam8bit"]))


@pytest.mark.parametrize("seed", range(12))
def test_simulator_matches_the_unit_by_unit_reference(gpt2, mixed, seed):
    plan = _random_plan(random.Random(seed))
    sim = Simulator(gpt2, mixed)
    pred = sim.simulate(plan)
    for (r, d), gb in reference_memory_gb(gpt2, plan).items():
        assert pred.memory_gb[plan.replicas[r].stages[d].devices[0]] == pytest.approx(gb, rel=1e-9)
    if plan.zero < 2:
        return
    shard_comm = sim._shard_comm(plan)
    for r, rep in enumerate(plan.replicas):
        for k, s in enumerate(rep.stages):
            units = sim._unit_prefix(s.devices, s.tp, plan.micro_batch, plan.precision, plan.recompute)
            f = [units.fwd[u + 1] - units.fwd[u] for u in range(gpt2.num_units)]
            b = [units.bwd[u + 1] - units.bwd[u] for u in range(gpt2.num_units)]
            expect = reference_exposed_s(gpt2, mixed, plan, r, k, f, b)
            assert sim._shard_exposed_s(plan, shard_comm.get((r, k)), units) == pytest.approx(expect, rel=1e-9)


def _both_paths_s(model, cluster, plan) -> tuple[float, float]:
    """The plan's step through the numpy path (replicas over stage tables) and the scalar one."""
    import hetpart.costmodel.simulator as simulator

    def step_s(fewest_for_vector: int) -> float:
        old, simulator._VECTOR_MIN_REPLICAS = simulator._VECTOR_MIN_REPLICAS, fewest_for_vector
        try:
            return Simulator(model, cluster).simulate(plan).step_time_s
        finally:
            simulator._VECTOR_MIN_REPLICAS = old

    return step_s(1), step_s(10**9)


@pytest.mark.parametrize("pp, dp, order", [(1, 16, "tp-dp-pp"), (2, 8, "tp-pp-dp")])
def test_many_replicas_take_the_vector_path_and_agree_with_the_scalar_one(pp, dp, order):
    """Both paths price level 1's reduce-scatter alike, NIC sharing included: with ``tp-pp-dp`` each node
    holds both stages of four replicas, so two crossing rings share each node's one NIC (the scalar path
    once priced each ring with the NIC to itself, 11% faster on a consumer cluster)."""
    model, cluster = load_model("gpt2-small", seq_len=S), load_cluster("a100-v100-16")
    plan = megatron_plan(model, cluster, Workload(64, S, zero=1), tp=1, pp=pp, dp=dp, micro_batch=1, order=order)
    assert plan.zero == 1
    vector, scalar = _both_paths_s(model, cluster, plan)
    assert vector == pytest.approx(scalar, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1])
def test_both_paths_agree_when_replicas_are_cut_unlike(zero):
    """Eight one-stage replicas on the A100 node beside four two-stage ones on the V100 node: each A100 is in
    both stages' rings, so those rings take turns (the duty cycle of :func:`~hetpart.costmodel.collectives.nic_flows`); the
    numpy path (:meth:`Simulator._table_flows`) counts it alike."""
    model, cluster = load_model("gpt2-small", seq_len=S), load_cluster("a100-v100-16")
    one = [Replica(4 / 48, (Stage((0, 14), (f"0/0/{i}",)),)) for i in range(8)]
    two = [Replica(4 / 48, (Stage((0, 6), (f"1/0/{2 * i}",)), Stage((6, 14), (f"1/0/{2 * i + 1}",)))) for i in range(4)]
    plan = Plan(global_batch=48, micro_batch=1, seq_len=S, replicas=tuple(one + two), zero=zero)
    vector, scalar = _both_paths_s(model, cluster, plan)
    assert vector == pytest.approx(scalar, rel=1e-9)


def test_rings_that_take_turns_share_a_nic_only_while_they_run(gpt2, mixed):
    """A one-stage replica on node 0 and a two-stage one on node 1: the node-0 device is in all three rings
    (stage 0's, stage 1's, the tied embedding's, which joins 1/0/0 and 1/0/1) and runs them one after
    another, so each runs a third of the time and node 1's two devices, in two rings each, count 2/3 each
    (before: 2, every ring there priced at half the NIC). Two two-stage replicas, one per node, run both
    stages' rings at once: two per NIC. That is hetpart's runtime (kernels ``torch``: one ring over every holder
    of the tied weight); under Megatron's (``fused``) the tied copies sum inside node 1's pipeline, so only the
    two stages' rings cross: each half the time, 1 per NIC."""
    sim = Simulator(gpt2, mixed, kernels="torch")
    turns = Plan(global_batch=8, micro_batch=1, seq_len=S, replicas=(
        Replica(0.5, (Stage((0, 14), ("0/0/0",)),)),
        Replica(0.5, (Stage((0, 6), ("1/0/0",)), Stage((6, 14), ("1/0/1",))))))
    at_once = _dp_plan(devices=(("0/0/0", "0/0/1"), ("1/0/0", "1/0/1")), cut=6)

    def flows(plan):
        rings = [[(sim._node_id(plan.replicas[r].stages[k].devices[0]), (r, k), 1) for r, k in seg.holders]
                 for seg in sim._dp_segments_small(plan)]
        return nic_flows(rings)

    node0, node1 = sim._node_id("0/0/0"), sim._node_id("1/0/0")
    assert flows(turns) == {node0: pytest.approx(1.0), node1: pytest.approx(4 / 3)}
    assert flows(at_once) == {node0: 2.0, node1: 2.0}
    sim = Simulator(gpt2, mixed, kernels="fused")
    assert flows(turns) == {node0: pytest.approx(1.0), node1: pytest.approx(1.0)}


def test_shard_gathers_of_replicas_cut_unlike_match_the_reference(gpt2, mixed):
    """Level 1's parameter gathers where a one-stage replica (node 0) shards with a two-stage one (node 1):
    both of node 1's devices' rings include the node-0 device, so they take turns; the simulator's per-unit
    gathers agree with the unit-by-unit reference, which counts the turns in loops of its own."""
    from hetpart.costmodel.sharding_reference import reference_unit_gather_s, reference_unit_scatter_s

    plan = Plan(global_batch=8, micro_batch=1, seq_len=S, zero=1, replicas=(
        Replica(0.5, (Stage((0, 14), ("0/0/0",)),)),
        Replica(0.5, (Stage((0, 6), ("1/0/0",)), Stage((6, 14), ("1/0/1",))))))
    comm = Simulator(gpt2, mixed)._shard_comm(plan)
    assert set(comm) == {(0, 0), (1, 0), (1, 1)}
    for (r, _), times in comm.items():
        for unit, seconds, scatter in times:
            assert seconds == pytest.approx(reference_unit_gather_s(gpt2, mixed, plan, r, unit), rel=1e-9)
            assert scatter == pytest.approx(reference_unit_scatter_s(gpt2, mixed, plan, r, unit), rel=1e-9)


# ------------------------------------------------------------------------------------------ CLI
def test_predict_takes_zero_and_refuses_a_bad_level(capsys):
    base = ["predict", "--model", "gpt2-small", "--cluster", "a100-8", "--seq-len", "128", "--global-batch", "64",
            "--tp", "1", "--pp", "1", "--dp", "8", "--micro-batch", "2", "--json"]
    plain, sharded = (cli_json(capsys, *base, "--zero", z) for z in ("0", "3"))
    assert sum(plain["metrics"]["peak_memory_gb"].values()) > sum(sharded["metrics"]["peak_memory_gb"].values())
    code, out, err = run_cli(capsys, *base, "--zero", "4")
    assert code == 2 and "--zero: 4 is not a sharding level" in out + err


def test_the_learned_predictor_answers_sharded_plans_with_the_sharded_collective_terms(gpt2, mixed):
    from hetpart.costmodel.predictor import get_predictor

    learned = get_predictor("learned", gpt2, mixed, Workload(32, S))
    sim = Simulator(gpt2, mixed)
    for zero in (1, 2, 3):
        plan = _dp_plan(zero=zero)
        got = learned.predict(plan, Workload(32, S)).metrics
        want = sim.simulate(plan)
        assert got["step_time_s"] == pytest.approx(want.step_time_s, rel=0.02)
        assert got["peak_memory_gb"] == pytest.approx(want.metrics["peak_memory_gb"], rel=1e-6)


def test_a_padded_collective_moves_the_padded_bytes_with_the_rings_latency_once(gpt2, mixed):
    """Uneven shards pad every piece to the largest: ``n max f`` times the bytes, as many messages. The
    simulator prices each unit's reduce-scatter (NCCL's ring) as the emulated runtime delays the padded bucket
    it reports (hetpart.runtime.dist_optimizer), so an emulated run pays what is predicted (before: the
    latency x 1.6)."""
    from hetpart.costmodel.collectives import reduce_scatter_time_s
    from hetpart.costmodel.sharding_reference import reference_unit_params
    from hetpart.runtime.emulation import Emulator

    plan = _dp_plan(zero=2, fractions=(0.4, 0.4, 0.1, 0.1))
    sim = Simulator(gpt2, mixed)
    members = [r.stages[0].devices[0] for r in plan.replicas]
    emulator = Emulator(mixed, tuple(plan.devices), 0, 1.0)
    pad = 4 * 0.4
    for unit, seconds, _ in sim._shard_comm(plan)[(0, 0)]:
        nbytes = reference_unit_params(gpt2, unit, 1, [(0, gpt2.num_units)]) * 2
        assert seconds == pytest.approx(reduce_scatter_time_s(nbytes * pad, members, mixed), rel=1e-9)
        assert seconds < reduce_scatter_time_s(nbytes, members, mixed) * pad  # latency not padded
        ranks = [plan.devices.index(d) for d in members]
        assert seconds == pytest.approx(emulator.collective_delay_s("reduce_scatter", nbytes * pad, ranks), rel=1e-9)


@pytest.mark.parametrize("zero", [1, 3])
def test_shard_rings_leaving_one_node_share_its_nic(gpt2, mixed, zero):
    """Both stages of each replica sit on one node; each stage's shard ring crosses to the other node, so
    two rings leave every node's NIC at once and each gets half of it (before: each had the NIC to
    itself, the per-unit collectives 2x too fast on this Ethernet pair). With one stage per replica the
    lone ring keeps the whole NIC."""
    from hetpart.costmodel.collectives import reduce_scatter_time_s
    from hetpart.costmodel.sharding_reference import reference_unit_params

    sim = Simulator(gpt2, mixed)
    two = _dp_plan(zero=zero, devices=(("0/0/0", "0/0/1"), ("1/0/0", "1/0/1")), cut=6)
    for (_, k), times in sim._shard_comm(two).items():
        members = [rep.stages[k].devices[0] for rep in two.replicas]
        for unit, seconds, _ in times:
            nbytes = reference_unit_params(gpt2, unit, 1, [two.replicas[0].stages[k].layers]) * 2
            assert seconds == pytest.approx(reduce_scatter_time_s(nbytes, members, mixed, concurrent=2), rel=1e-9)
            assert seconds > 1.5 * reduce_scatter_time_s(nbytes, members, mixed)
    one = _dp_plan(zero=zero, devices=("0/0/0", "1/0/0"))
    for unit, seconds, _ in sim._shard_comm(one)[(0, 0)]:
        nbytes = reference_unit_params(gpt2, unit, 1, [(0, gpt2.num_units)]) * 2
        assert seconds == pytest.approx(reduce_scatter_time_s(nbytes, ["0/0/0", "1/0/0"], mixed), rel=1e-9)


@pytest.mark.parametrize("t, c", [(1.0, 3.0), (3.0, 1.0), (2.0, 2.0)])
def test_per_unit_collectives_hide_behind_the_next_unit_only(t, c):
    """Two streams, n alike units: a reduce-scatter after each backward pays, when communication
    outweighs compute, the first unit's compute then n collectives back to back (t + n c - n t); when
    compute outweighs it, only the last collective trails. Gathers prefetched one ahead pay the first
    gather and n - 1 overruns. A collective is never charged against its own unit's compute."""
    n = 5
    assert exposed_unit_comm_s([t] * n, post_s=[c] * n) == pytest.approx(max(c, t + n * c - n * t))
    assert exposed_unit_comm_s([t] * n, pre_s=[c] * n) == pytest.approx(c + (n - 1) * max(0.0, c - t))
    assert exposed_unit_comm_s([t] * n) == 0.0
    both = exposed_unit_comm_s([t] * n, pre_s=[c] * n, post_s=[c] * n)
    assert both >= exposed_unit_comm_s([t] * n, post_s=[c] * n) - 1e-12
    assert both <= c + n * 2 * c  # never worse than running every collective unhidden
