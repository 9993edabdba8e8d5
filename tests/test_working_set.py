"""The running unit's working set counts once per device, not once per model chunk (issue 10).

A device runs one unit at a time, so a device hosting ``v`` chunks of an interleaved schedule holds the
largest of its chunks' transient buffers, not their sum. Every path that prices a device's memory (the
simulator, its unit-by-unit reference, the planners' fast check, the plan encoders and the closed-form
predictor, the shard-fraction chooser, the tensor-parallel split's LP) must agree on it.
(A device serving stages of two replicas does not exist: ``Plan.validate`` refuses it.)
"""

from dataclasses import replace

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel import Simulator
from hetpart.costmodel.evaluator import Evaluator
from hetpart.costmodel.memory import PrefixTables, chunk_flights
from hetpart.costmodel.sharding_reference import reference_memory_gb
from hetpart.plan import TPSplit
from hetpart.workload import Workload

S = 128
MIXED = {"name": "mixed", "nodes": [{"count": 2, "gpus": [{"gpu": "A100-80GB", "count": 2},
                                                          {"gpu": "V100-32GB", "count": 2}],
                                     "intra_node": "PCIe4", "nic": "Ethernet-10"}]}


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S)


@pytest.fixture(scope="module")
def cluster():
    return parse_cluster(MIXED, "mixed.yaml")


def _interleaved(v: int = 2, zero: int = 0, recompute: str = "selective", fractions=None, split=None) -> Plan:
    """Two replicas (one per node), each two devices x ``v`` chunks of gpt2-small's 14 units; with
    ``split``, replica 0 runs TP 2 over an A100 and a V100 split unevenly."""
    cuts = [round(14 * i / (2 * v)) for i in range(2 * v + 1)]
    replicas = []
    for node in range(2):
        if split is not None and node == 0:
            groups = [("0/0/0", "0/0/2"), ("0/0/1", "0/0/3")]
        else:
            groups = [(f"0/{node}/0",), (f"0/{node}/2",)]
        stages = tuple(Stage((cuts[k], cuts[k + 1]), groups[k % 2], len(groups[k % 2]),
                             tp_split=split if len(groups[k % 2]) > 1 else None) for k in range(2 * v))
        replicas.append(Replica(0.5, stages))
    schedule = "interleaved" if v > 1 else "1f1b"
    return Plan(global_batch=16, micro_batch=2, seq_len=S, schedule=schedule, interleave=v, recompute=recompute,
                zero=zero, shard_fractions=fractions, replicas=tuple(replicas))


def _simulated(gpt2, cluster, plan) -> dict:
    return {(b["replica"], b["stage"]): b["memory_gb"] for b in Simulator(gpt2, cluster).simulate(plan).breakdown}


def _evaluated(gpt2, cluster, plan) -> dict:
    return Evaluator(gpt2, cluster, Workload(plan.global_batch, S)).device_memory_gb(plan)


def _chunks(plan, r, d):
    rep = plan.replicas[r]
    pp = plan.pipeline_devices(r)
    return [rep.stages[k] for k in range(d, rep.pp, pp)]


@pytest.mark.parametrize("zero,recompute,fractions,offload", [
    (0, "selective", None, "none"), (0, "full", None, "none"), (2, "none", None, "none"),
    (3, "selective", None, "none"), (1, "none", (0.7, 0.3), "none"),
    (0, "selective", None, "optimizer"), (1, "none", (0.7, 0.3), "optimizer"), (2, "none", None, "optimizer"),
    (3, "selective", None, "optimizer"), (3, "full", None, "full")])
def test_every_path_gives_the_simulators_per_device_peak(gpt2, cluster, zero, recompute, fractions, offload):
    plan = replace(_interleaved(2, zero, recompute, fractions), offload=offload)
    assert not plan.validate(gpt2, cluster)
    sim = _simulated(gpt2, cluster, plan)
    assert len(sim) == 4
    for name, got in (("reference", reference_memory_gb(gpt2, plan)), ("evaluator", _evaluated(gpt2, cluster, plan))):
        assert got.keys() == sim.keys()
        for key in sim:
            assert got[key] == pytest.approx(sim[key], rel=1e-12), (name, key)


def test_the_encoders_and_the_closed_predictor_give_the_simulators_peak(gpt2, cluster):
    from hetpart.costmodel.learned.closed import ClosedPredictor
    from hetpart.costmodel.learned.encode import ScenarioContext, encode_plans
    from hetpart.costmodel.learned.encode_reference import encode_plans_reference

    plan = _interleaved(2, 0, "full")
    want = Simulator(gpt2, cluster).simulate(plan).metrics["peak_memory_gb"]
    assert want.keys() == {"A100-80GB", "V100-32GB"}
    fast = encode_plans(ScenarioContext(gpt2, cluster), [plan]).memory_gb[0]
    slow = encode_plans_reference(ScenarioContext(gpt2, cluster), [plan]).memory_gb[0]
    closed = ClosedPredictor(gpt2, cluster).predict(plan, Workload(16, S)).metrics["peak_memory_gb"]
    for got in (fast, slow, closed):
        assert got == pytest.approx(want, rel=1e-12)


def test_an_uneven_tensor_parallel_split_counts_the_working_set_once_per_device(gpt2, cluster):
    from hetpart.costmodel.tp_split import _memory_rows, param_shares

    plan = _interleaved(2, 0, "none", split=TPSplit(heads=(8, 4), ffn=(2048, 1024)))
    assert not plan.validate(gpt2, cluster)
    sim = _simulated(gpt2, cluster, plan)
    got = _evaluated(gpt2, cluster, plan)
    for key in sim:
        assert got[key] == pytest.approx(sim[key], rel=1e-12), key
    assert float(param_shares(gpt2, 2, plan.replicas[0].stages[0].tp_split)[0]) > 0.5  # uneven indeed
    # the LP's rows for a device group: all its chunks (split alike), the working set once; at the even
    # share they give the simulator's memory of the even plan
    even = replace(plan, replicas=(replace(plan.replicas[0], stages=tuple(
        replace(s, tp_split=None) for s in plan.replicas[0].stages)),) + plan.replicas[1:])
    sim_even = _simulated(gpt2, cluster, even)
    for d in range(2):
        chunks = _chunks(even, 0, d)
        flight = chunk_flights(PrefixTables(gpt2), "interleaved", d, 2, even.num_microbatches(0), 2,
                               [(*c.layers, c.tp) for c in chunks], "none")
        rep, split_gb, _ = _memory_rows(gpt2, cluster, chunks[0], 2, flight, "none", [c.layers for c in chunks])
        assert rep + split_gb / 2 == pytest.approx(sim_even[(0, d)], rel=1e-8)  # (tp 10^9 stands for "replicated")


def test_the_shard_fraction_chooser_uses_the_simulators_peak(gpt2, cluster):
    """``fraction_limits`` solves ``need(f) = capacity`` on the line the simulator's memory follows."""
    from hetpart.costmodel.memory import memory_capacity_gb
    from hetpart.policies.shard_fractions import fraction_limits

    at = {f: _simulated(gpt2, cluster, _interleaved(2, 1, "none", (f, 1 - f))) for f in (0.3, 0.6)}
    limits = fraction_limits(gpt2, cluster, _interleaved(2, 1, "none", (0.5, 0.5)))
    for r in range(2):
        caps = []
        for d in range(2):
            a, b = at[0.3][(r, d)], at[0.6][(r, d)]
            frac = 0.3 if r == 0 else 0.7
            slope = (b - a) / (0.6 - 0.3) * (1 if r == 0 else -1)
            at0 = a - slope * frac
            cap = min(memory_capacity_gb(cluster.device(x).gpu) for x in _interleaved().replicas[r].stages[d].devices)
            caps.append((cap - at0) / slope)
        assert limits[r] == pytest.approx(min(caps), rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_an_interleave_4_device_holds_the_working_set_of_interleave_1(gpt2, cluster, recompute):
    """What a device holds beyond its chunks' states and saved activations is one working set, whatever
    the number of chunks: interleave 4 (4 chunks per device) and interleave 1 (one stage) hold the same."""
    tables = PrefixTables(gpt2)
    extra = {}
    for v in (1, 4):
        plan = _interleaved(v, 0, recompute)
        sim = _simulated(gpt2, cluster, plan)
        m = plan.num_microbatches(0)
        for d in range(2):
            chunks = _chunks(plan, 0, d)
            flights = chunk_flights(tables, plan.schedule, d, 2, m, v, [(*c.layers, c.tp) for c in chunks], recompute)
            base = sum(tables.memory_gb(*c.layers, c.tp, 2, f, recompute, working_set=False, precision=plan.precision)
                       for c, f in zip(chunks, flights))
            extra[(v, d)] = sim[(0, d)] - base
    for d in range(2):
        assert extra[(4, d)] == pytest.approx(extra[(1, d)], rel=1e-9)
        assert extra[(1, d)] > 0
    if recompute == "none":  # device 0 holds blocks only: one block's MLP gradients, two 16-bit f-wide tensors
        assert extra[(4, 0)] * 1e9 == pytest.approx(2 * 2 * 4 * 768 * S * 2, rel=1e-9)


@pytest.mark.parametrize("zero, offload", [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (2, "optimizer"),
                                           (3, "full")])
def test_the_breakdown_names_what_holds_each_peak(gpt2, cluster, zero, offload):
    """Every breakdown row splits its peak into the states the level and the offload leave on the device
    (bf16: 2-byte weights, fp32 gradients, 12 bytes of Adam; sharded by the replica's fraction) and the rest."""
    plan = replace(_interleaved(2, zero, fractions=(0.7, 0.3) if zero in (1, 2) else None), offload=offload)
    tables = PrefixTables(gpt2)
    for row in Simulator(gpt2, cluster).simulate(plan).breakdown:
        parts = row["memory_parts_gb"]
        assert sum(parts.values()) == pytest.approx(row["memory_gb"], rel=1e-12)
        params = sum(tables.params_per_device(*c.layers, c.tp) for c in _chunks(plan, row["replica"], row["stage"]))
        f = plan.shard_fraction(row["replica"]) if zero else 1.0
        want = {"none": (2 * (f if zero >= 3 else 1), 4 * (f if zero >= 2 else 1), 12 * (f if zero else 1)),
                "optimizer": (2 * (f if zero >= 3 else 1), 4 if zero <= 1 else 0, 0), "full": (0, 0, 0)}[offload]
        got = (parts["weights"], parts["gradients"], parts["optimizer_states"])
        assert got == pytest.approx(tuple(params * b / 1e9 for b in want), rel=1e-12, abs=1e-15)
        assert parts["activations_and_working_set"] > 0


def test_a_plan_that_does_not_fit_says_what_fills_its_tightest_device(capsys):
    from tests._cli import run_cli

    code, out, err = run_cli(capsys, "predict", "--model", "gpt2-xl", "--cluster", "tiny-mixed", "--global-batch", "64",
                             "--seq-len", "1024", "--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "16",
                             "--recompute", "none")
    assert code == 0, err
    assert "DOES NOT FIT" in out and "tightest:" in out and "activations and working set" in out
    code, out, err = run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", "tiny-mixed", "--global-batch",
                             "8", "--seq-len", "128", "--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "2")
    assert code == 0 and "tightest:" not in out, err  # a plan that fits gets no memory line
