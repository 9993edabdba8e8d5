"""Context parallelism (``cp > 1``): the plan field, its rules, and what the simulator prices for it.

A 4-layer Llama-shaped model (grouped-query attention) at 16,384 tokens on small clusters: one node of
eight A100s, and two one-GPU nodes joined by a NIC whose speed the tests choose."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetpart import Workload
from hetpart.cluster import load_cluster, parse_cluster
from hetpart.costmodel import Simulator
from hetpart.costmodel import simulator as simulator_module
from hetpart.costmodel.megatron import megatron_plan
from hetpart.costmodel.memory import PrefixTables, state_bytes_per_param
from hetpart.errors import PlanError
from hetpart.graph.transformer import TransformerConfig, transformer_graph
from hetpart.plan import Plan, Replica, Stage, TPSplit
from tests._cli import cli_json, run_cli

SEQ = 16384
CFG = TransformerConfig("llama", 4, 1024, 16, 8000, SEQ, ffn_hidden_size=2816, num_kv_heads=4, tied_embeddings=False,
                        activation="swiglu", norm="rmsnorm", bias=False, learned_positions=False, dropout=False)
MODEL = transformer_graph(CFG, "llama-tiny", SEQ)
N = MODEL.num_units


def two_nodes(gbit_s: float, rdma: bool = True, latency_us: float = 5.0):
    """Two nodes of one A100 each, joined by one NIC of ``gbit_s``."""
    nic = {"bandwidth_gbit_s": gbit_s, "latency_us": latency_us, "rdma": rdma}
    return parse_cluster({"name": f"two-{gbit_s:g}", "nodes": [
        {"count": 2, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": nic}]})


def one_stage(devices: tuple[str, ...], cp: int, tp: int = 1, global_batch: int = 4, **kw) -> Plan:
    return Plan(global_batch=global_batch, micro_batch=1, seq_len=SEQ, cp=cp, recompute="none",
                replicas=(Replica(1.0, (Stage((0, N), devices, tp),)),), **kw)


# --------------------------------------------------------------------------------------------- the plan
def test_cp_round_trips_and_is_left_out_at_one():
    plan = one_stage(("0/0/0", "0/1/0"), cp=2)
    data = plan.to_dict()
    assert data["cp"] == 2 and Plan.from_dict(data) == plan
    assert "cp" not in one_stage(("0/0/0",), cp=1).to_dict()  # cp 1 plans read and write as before
    assert Plan.from_json(plan.to_json()).cp == 2


@pytest.mark.parametrize("value, match", [(0, r"cp: must be >= 1"), ("2", r"cp: expected a whole number")])
def test_a_bad_cp_value_names_the_field(value, match):
    data = one_stage(("0/0/0", "0/1/0"), cp=2).to_dict() | {"cp": value}
    with pytest.raises(PlanError, match=match):
        Plan.from_dict(data, "plan.json")


def test_validate_names_the_stage_and_the_fix():
    cluster = two_nodes(100)
    wrong = one_stage(("0/0/0",), cp=2)
    with pytest.raises(PlanError, match=r"replicas\[0\]\.stages\[0\]\.devices: 1 devices listed, but tp 1 x cp 2 = 2; "
                                         r"list tp x cp devices"):
        wrong.check(MODEL, cluster)
    odd = replace(one_stage(("0/0/0", "0/1/0"), cp=2), seq_len=SEQ + 2)
    assert any(f"seq_len {SEQ + 2} is not divisible by 2 x cp = 4" in p for p in odd.validate(MODEL, cluster))
    eager = replace(one_stage(("0/0/0", "0/1/0"), cp=2), attention="eager")
    with pytest.raises(PlanError, match=r"cp: context parallelism runs inside the fused attention kernel"):
        eager.check(MODEL, cluster)


def test_an_uneven_split_with_cp_is_refused():
    cluster = load_cluster("a100-8")
    stage = Stage((0, N), tuple(f"0/0/{i}" for i in range(4)), 2, TPSplit(heads=(12, 4)))
    plan = replace(one_stage(("0/0/0",), cp=2), replicas=(Replica(1.0, (stage,)),))
    assert any("tp_split: an uneven tensor-parallel split is not modelled with cp 2" in p
               for p in plan.validate(MODEL, cluster))


def test_the_grid_places_cp_next_to_tp():
    cluster = load_cluster("a100-8")
    plan = megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=2, pp=1, dp=2, micro_batch=1, cp=2)
    assert plan.cp == 2 and plan.meta["order"] == "tp-cp-dp-pp"
    assert [r.stages[0].devices for r in plan.replicas] == [tuple(f"0/0/{i}" for i in range(4)),
                                                           tuple(f"0/0/{i}" for i in range(4, 8))]
    assert plan.validate(MODEL, cluster) == []
    same = megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=2, pp=2, dp=2, micro_batch=1)
    assert same == megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=2, pp=2, dp=2, micro_batch=1, cp=1)
    assert same.meta == megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=2, pp=2, dp=2, micro_batch=1, cp=1).meta


# --------------------------------------------------------------------------------------------- the simulator
def test_without_communication_cost_cp_halves_the_compute():
    fast = two_nodes(1e5, latency_us=0.0)  # 12.5 TB/s: the ring and the gradients cost next to nothing
    sim = Simulator(MODEL, fast)
    one = sim.simulate(one_stage(("0/0/0",), cp=1, global_batch=8)).breakdown[0]
    two = sim.simulate(one_stage(("0/0/0", "0/1/0"), cp=2, global_batch=8)).breakdown[0]
    assert two["cp"] == 2 and two["cp_comm_s"] == 0.0
    ratio = two["compute_s"] / one["compute_s"]
    assert 0.5 <= ratio < 0.6, ratio  # half the FLOPs; smaller products and the ring's launches cost a little


def test_cp_divides_the_activations_and_keeps_the_states():
    sim = Simulator(MODEL, two_nodes(100))
    states_gb = PrefixTables(MODEL).params_per_device(0, N, 1) * state_bytes_per_param("adam", "bf16") / 1e9
    one = sim.simulate(one_stage(("0/0/0",), cp=1)).breakdown[0]["memory_gb"]
    two = sim.simulate(one_stage(("0/0/0", "0/1/0"), cp=2)).breakdown[0]["memory_gb"]
    assert two - states_gb == pytest.approx((one - states_gb) / 2, rel=1e-9)


def test_the_ring_shows_in_the_breakdown_and_grows_on_slower_links():
    plan = one_stage(("0/0/0", "0/1/0"), cp=2)
    rows = {gbit: Simulator(MODEL, two_nodes(gbit)).simulate(plan) for gbit in (400, 10, 1)}
    link = [rows[g].breakdown[0]["cp_link_s"] for g in (400, 10, 1)]
    exposed = [rows[g].breakdown[0]["cp_comm_s"] for g in (400, 10, 1)]
    assert 0 < link[0] < link[1] < link[2]
    assert exposed[0] <= exposed[1] < exposed[2] and exposed[2] > 0  # hidden behind attention while the link keeps up
    steps = [rows[g].step_time_s for g in (400, 10, 1)]
    assert steps[0] < steps[2]
    for row in rows[1].breakdown:  # the ring's exposed time is busy time like the other terms
        busy = row["compute_s"] + row["tp_comm_s"] + row["zero_comm_s"] + row["pp_blocked_s"] + row["cp_comm_s"]
        assert busy + row["bubble_s"] + row["sync_wait_s"] + row["optimizer_s"] == pytest.approx(rows[1].step_time_s)


def test_over_tcp_the_ring_is_paid_whole():
    plan = one_stage(("0/0/0", "0/1/0"), cp=2)
    row = Simulator(MODEL, two_nodes(400, rdma=False)).simulate(plan).breakdown[0]
    assert row["cp_comm_s"] == pytest.approx(row["cp_link_s"])


def test_gradients_are_reduced_over_dp_times_cp():
    cluster = two_nodes(25)
    sim = Simulator(MODEL, cluster)
    alone = sim.simulate(one_stage(("0/0/0",), cp=1)).breakdown[0]["dp_comm_s"]
    cp2 = sim.simulate(one_stage(("0/0/0", "0/1/0"), cp=2)).breakdown[0]["dp_comm_s"]
    dp2 = Plan(global_batch=4, micro_batch=1, seq_len=SEQ, recompute="none",
               replicas=(Replica(0.5, (Stage((0, N), ("0/0/0",)),)), Replica(0.5, (Stage((0, N), ("0/1/0",)),))))
    assert alone == 0.0 and cp2 > 0
    assert cp2 == pytest.approx(sim.simulate(dp2).breakdown[0]["dp_comm_s"], rel=1e-12)  # the same ring, bytes


def test_zero_shards_over_dp_times_cp():
    sim = Simulator(MODEL, two_nodes(100))
    plan = one_stage(("0/0/0", "0/1/0"), cp=2)
    whole = sim.simulate(plan).breakdown[0]["memory_gb"]
    sharded = sim.simulate(replace(plan, zero=1)).breakdown[0]["memory_gb"]
    params = PrefixTables(MODEL).params_per_device(0, N, 1)
    assert whole - sharded == pytest.approx(params * 12 / 2 / 1e9, rel=1e-9)  # half of Adam's 12 bytes, over 2 ranks


def test_the_many_replica_path_agrees_with_the_few_replica_one(monkeypatch):
    """dp 8 x cp 2 reduces over 16 ranks: the numpy path; the scalar one must give the same step."""
    cluster = load_cluster("a100-v100-16")
    plans = [megatron_plan(MODEL, cluster, Workload(16, SEQ), tp=1, pp=1, dp=8, micro_batch=1, cp=2),
             replace(megatron_plan(MODEL, cluster, Workload(16, SEQ), tp=1, pp=1, dp=8, micro_batch=1, cp=2), zero=1)]
    fast = [Simulator(MODEL, cluster).simulate(p, validate=False) for p in plans]
    monkeypatch.setattr(simulator_module, "_VECTOR_MIN_REPLICAS", 10**6)
    slow = [Simulator(MODEL, cluster).simulate(p, validate=False) for p in plans]
    for f, s in zip(fast, slow):
        assert f.step_time_s == pytest.approx(s.step_time_s, rel=1e-12)
        assert [b["dp_comm_s"] for b in f.breakdown] == pytest.approx([b["dp_comm_s"] for b in s.breakdown], rel=1e-12)


def test_estimate_and_bound_agree_with_simulate():
    cluster = load_cluster("a100-8")
    sim = Simulator(MODEL, cluster)
    plan = megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=1, pp=2, dp=2, micro_batch=1, cp=2)
    full = sim.simulate(plan)
    assert sim.estimate(plan).step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert sim.lower_bound_s(plan) <= full.step_time_s
    assert set(full.memory_gb) == set(plan.devices)


# --------------------------------------------------------------------------------------------- the CLI and the rest
def test_predict_takes_cp_in_the_grid_and_says_the_order(capsys):
    out = cli_json(capsys, "predict", "-m", "llama3-8b", "-c", "a100-8", "--seq-len", "8192", "--global-batch", "8",
                   "--tp", "4", "--pp", "1", "--dp", "1", "--cp", "2", "--micro-batch", "1", "--json")
    assert out["order"] == "tp-cp-dp-pp"
    assert out["breakdown"][0]["cp"] == 2 and len(out["breakdown"][0]["devices"]) == 8


def test_predict_refuses_cp_beside_a_plan_file(capsys, tmp_path):
    path = tmp_path / "plan.json"
    one_stage(("0/0/0", "0/0/1"), cp=2).save(path)
    code, _, err = run_cli(capsys, "predict", "--plan", str(path), "-m", "llama3-8b", "-c", "a100-8", "--cp", "2")
    assert code == 2 and "--cp" in err and "'cp' field" in err


def test_run_and_the_graph_surrogate_refuse_cp(capsys, tmp_path):
    path = tmp_path / "plan.json"
    plan = Plan(global_batch=4, micro_batch=1, seq_len=1024, cp=2, meta={"model": "gpt2-small", "cluster": "tiny-mixed"},
                replicas=(Replica(1.0, (Stage((0, 14), ("0/0/0", "0/0/1")),)),))
    plan.save(path)
    code, _, err = run_cli(capsys, "run", str(path))
    assert code == 2 and "context parallelism is prediction-only" in err
    code, _, err = run_cli(capsys, "predict", "--plan", str(path), "--predictor", "learned-graph")
    assert code == 2 and "cp: 2: the learned predictor" in err and "--predictor simulator" in err


def test_export_names_cp_in_each_engine():
    from hetpart.export import export_plan

    cluster = load_cluster("a100-8")
    plan = megatron_plan(MODEL, cluster, Workload(8, SEQ), tp=2, pp=1, dp=2, micro_batch=1, cp=2)
    megatron = export_plan(plan, MODEL, "megatron")
    assert megatron.data["--context-parallel-size"] == 2 and not megatron.cannot_express
    assert "TP innermost, then CP, then DP, then PP" in megatron.notes[0] and "0/0/0-7" in megatron.notes[0]
    assert export_plan(plan, MODEL, "torchtitan").data["parallelism"]["context_parallel_degree"] == 2
    assert any("context parallelism" in p for p in export_plan(plan, MODEL, "deepspeed").cannot_express)


def test_pipeline_sends_go_rank_to_rank_each_over_its_own_nodes_nic():
    """pp 2 x cp 2 on four one-GPU nodes: rank c of stage 0 sends its half of the sequence to rank c of
    stage 1, each pair over its own nodes' NICs; against two cp 1 replicas on the same pairs, each sends
    half the bytes over a link of the same share (one flow per node)."""
    nic = {"bandwidth_gbit_s": 25, "latency_us": 5.0, "rdma": True}
    four = parse_cluster({"name": "four", "nodes": [
        {"count": 4, "gpus_per_node": 1, "gpu": "A100-80GB", "intra_node": "NVLink3", "nic": nic}]})
    half = N // 2
    cp2 = Plan(global_batch=4, micro_batch=1, seq_len=SEQ, cp=2, recompute="none", replicas=(
        Replica(1.0, (Stage((0, half), ("0/0/0", "0/1/0")), Stage((half, N), ("0/2/0", "0/3/0")))),))
    dp2 = Plan(global_batch=8, micro_batch=1, seq_len=SEQ, recompute="none", replicas=tuple(
        Replica(0.5, (Stage((0, half), (a,)), Stage((half, N), (b,)))) for a, b in (("0/0/0", "0/2/0"),
                                                                                   ("0/1/0", "0/3/0"))))
    sim = Simulator(MODEL, four)
    sends_cp = sim.simulate(cp2).breakdown[0]["pp_comm_s"]
    sends_dp = sim.simulate(dp2).breakdown[0]["pp_comm_s"]
    assert sends_dp / 2 < sends_cp < sends_dp
    # per transfer: latency + bytes / bw against latency + bytes / (2 bw); four micro-batches of a 5 us hop
    assert 2 * sends_cp - sends_dp == pytest.approx(4 * 5e-6, rel=1e-6)


def test_a_long_sequence_that_fits_nowhere_is_told_about_cp():
    from hetpart.policies.common import no_plan_error

    cluster = two_nodes(100)
    long = no_plan_error(MODEL, cluster, Workload(4, SEQ), "uniform", "nothing fits")
    short = no_plan_error(MODEL, cluster, Workload(4, 1024), "uniform", "nothing fits")
    assert "hetpart predict ... --cp 2" in str(long) and "context parallelism" not in str(short)


def test_a_profile_equal_to_the_analytic_terms_predicts_the_same_cp_step(tmp_path):
    """Measured entries (whole sequences) are scaled by the analytic ratio of the split: a profile that
    copies the analytic terms must leave a cp plan's step where the analytic model puts it."""
    from hetpart.costmodel.profile import ComputeEntry, Profile
    from tests.test_profile_model import CLUSTER, _model, analytic_profile

    (tmp_path / "c.yaml").write_text(CLUSTER)
    cluster = load_cluster(str(tmp_path / "c.yaml"))
    model = _model()
    plan = megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=1, pp=2, dp=1,
                         micro_batch=2, cp=2, recompute="none")
    plain = Simulator(model, cluster).simulate(plan)
    base = analytic_profile(model, cluster)
    profiled = Simulator(model, cluster, profile=base).simulate(plan)
    # measured links price all-reduces as a plain ring on their latency, the analytic ones as NCCL's
    # tuner (protocol latencies of tens of microseconds more): the same up to those
    assert profiled.step_time_s == pytest.approx(plain.step_time_s, rel=1e-3)
    assert [b["compute_s"] for b in profiled.breakdown] == pytest.approx([b["compute_s"] for b in plain.breakdown])
    slow = Profile(devices=base.devices, device_types=base.device_types, links=base.links,
                   compute=tuple(ComputeEntry(**{**e.__dict__, "fwd_s": e.fwd_s * 3, "bwd_s": e.bwd_s * 3})
                                 for e in base.compute))
    three = Simulator(model, cluster, profile=slow).simulate(plan)
    assert [b["compute_s"] for b in three.breakdown] == pytest.approx([3 * b["compute_s"] for b in plain.breakdown])


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_the_two_chunk_split_gives_every_ring_step_the_same_causal_work(cp):
    """The premise of pricing each ring step as ``1/cp`` of a rank's attention: with rank r holding chunks
    r and 2cp-1-r of 2cp, each (rank, step) pair computes two half-chunk-squared blocks of the causal
    mask (brute force over chunk pairs; a diagonal block counts half)."""
    def work(q: int, kv: int) -> float:
        return 1.0 if kv < q else 0.5 if kv == q else 0.0

    chunks = {r: (r, 2 * cp - 1 - r) for r in range(cp)}
    per_step = {(r, i): sum(work(q, k) for q in chunks[r] for k in chunks[(r - i) % cp])
                for r in range(cp) for i in range(cp)}
    assert set(per_step.values()) == {2.0}
    assert sum(per_step.values()) == (2 * cp) ** 2 / 2  # the whole causal square, split evenly


def test_the_learned_predictor_defers_a_cp_plan_to_the_simulator(capsys, tmp_path):
    path = tmp_path / "plan.json"
    Plan(global_batch=4, micro_batch=1, seq_len=1024, cp=2, meta={"model": "gpt2-small", "cluster": "tiny-mixed"},
         replicas=(Replica(1.0, (Stage((0, 14), ("0/0/0", "0/0/1")),)),)).save(path)
    out = cli_json(capsys, "predict", "--plan", str(path), "--predictor", "learned", "--json")
    assert out["metrics"]["priced_by"] == "simulator"
    simulated = cli_json(capsys, "predict", "--plan", str(path), "--json")
    assert out["metrics"]["step_time_s"] == pytest.approx(simulated["metrics"]["step_time_s"])


def test_the_table_has_a_cp_column_only_with_cp():
    cluster = two_nodes(100)
    with_cp = one_stage(("0/0/0", "0/1/0"), cp=2).table(cluster, MODEL)
    without = one_stage(("0/0/0",), cp=1).table(cluster, MODEL)
    assert [c.header for c in with_cp.columns][-2:] == ["tp", "cp"] and "cp=2" in str(with_cp.title)
    assert "cp" not in [c.header for c in without.columns] and "cp=" not in str(without.title)
