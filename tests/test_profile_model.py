"""Measured profiles in the simulator: file round trip, checks, interpolation and the differential
test (a profile whose entries equal the analytic terms predicts the same step)."""

import json

import numpy as np
import pytest

from hetpart import load_cluster, load_model
from hetpart.costmodel import Simulator, megatron_plan
from hetpart.costmodel.compute import unit_compute_s
from hetpart.costmodel.profile import (BoundProfile, ComputeEntry, CoreSharing, DeviceBinding, DeviceClass, LinkEntry,
                                       Profile,
                                       TensorParallelEntry, _interp, fit_latency_bandwidth, load_profile, parse_profile)
from hetpart.costmodel.memory import optimizer_step_bytes
from hetpart.errors import SpecError
from hetpart.workload import Workload
from tests._cli import run_cli

CLUSTER = """name: two-a100
nodes:
  - {count: 2, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, nic: Ethernet-10}
"""


@pytest.fixture()
def cluster(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    return load_cluster(str(path))


def _model(seq_len=64):
    return load_model("gpt2-small", seq_len=seq_len, precision="bf16")


def analytic_profile(model, cluster, micro_batches=(1, 2, 4)) -> Profile:
    """Entries equal to the simulator's own analytic terms for A100-80GB (bf16, tp 1, no recompute)."""
    gpu = cluster.groups[0].gpu
    picks = {"embedding": 0, "block": 1, "head": model.num_units - 1}
    compute = []
    for b in micro_batches:
        fwd, bwd = unit_compute_s(model, gpu, 1, b, "bf16", "none", kernels="fused")  # the simulator's default counts
        for kind, i in picks.items():
            u = model.units[i]
            compute.append(ComputeEntry(device="A100", precision="bf16", unit=kind, params=u.params,
                                        seq_len=model.seq_len, micro_batch=b, fwd_flops=u.fwd_flops * b,
                                        fwd_s=float(fwd[i]), bwd_s=float(bwd[i]), repeats=1))
    from hetpart.costmodel.links import achieved_link

    # what a measurement sees: the rates transfers reach, not the datasheet's
    intra, nic = achieved_link(cluster, "0/0/0", "0/0/1"), achieved_link(cluster, "0/0/0", "0/1/0")
    links = (LinkEntry("p2p", ("A100", "A100"), "intra_node", intra.latency_us, intra.bandwidth_gbyte_s),
             LinkEntry("p2p", ("A100", "A100"), "inter_node", nic.latency_us, nic.bandwidth_gbyte_s),
             LinkEntry("allreduce", ("A100", "A100"), "intra_node", intra.latency_us, intra.bandwidth_gbyte_s),
             LinkEntry("allreduce", ("A100", "A100"), "inter_node", nic.latency_us, nic.bandwidth_gbyte_s))
    adam = optimizer_step_bytes("adam", "bf16") / (gpu.hbm_gbyte_s * 1e9)
    return Profile(devices={"A100": DeviceClass("A100", "imported", "analytic copy", adam)},
                   device_types={"A100-80GB": DeviceBinding("A100", stand_in=False)},
                   compute=tuple(compute), links=links, model={"name": "gpt2-small"})


@pytest.mark.parametrize("shape", [dict(tp=1, pp=2, dp=2, micro_batch=2), dict(tp=1, pp=4, dp=1, micro_batch=1),
                                   dict(tp=1, pp=1, dp=4, micro_batch=4)])
def test_a_profile_equal_to_the_analytic_terms_predicts_the_same_step(cluster, shape):
    model = _model()
    plan = megatron_plan(model, cluster, Workload(16, 64, precision="bf16", recompute="none"),
                         recompute="none", **shape)
    plain = Simulator(model, cluster, overlap_grad_reduce=False).simulate(plan)
    profiled = Simulator(model, cluster, overlap_grad_reduce=False,
                         profile=analytic_profile(model, cluster)).simulate(plan)
    # all-reduces over measured links are a plain ring on the measured latency; the analytic ones NCCL's
    # tuner's lines (tens of microseconds of protocol latency more): the same up to those
    assert profiled.step_time_s == pytest.approx(plain.step_time_s, rel=1e-3)
    assert [b["compute_s"] for b in profiled.breakdown] == pytest.approx([b["compute_s"] for b in plain.breakdown])
    assert [b["dp_comm_s"] for b in profiled.breakdown] == pytest.approx([b["dp_comm_s"] for b in plain.breakdown],
                                                                         rel=1e-3, abs=1e-4)
    assert profiled.provenance["device_types"]["A100-80GB"]["compute"] == "measured"
    assert plain.provenance["device_types"]["A100-80GB"]["compute"] == "fitted"


def test_the_simulator_uses_the_entries_where_the_profile_has_them(cluster):
    model = _model()
    plan = megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=1, pp=2, dp=1,
                         micro_batch=2, recompute="none")
    base = analytic_profile(model, cluster)
    slow = Profile(devices=base.devices, device_types=base.device_types, links=base.links,
                   compute=tuple(ComputeEntry(**{**e.__dict__, "fwd_s": e.fwd_s * 3, "bwd_s": e.bwd_s * 3})
                                 for e in base.compute))
    fast = Simulator(model, cluster, profile=base).simulate(plan)
    three = Simulator(model, cluster, profile=slow).simulate(plan)
    assert [b["compute_s"] for b in three.breakdown] == pytest.approx([3 * b["compute_s"] for b in fast.breakdown])
    # only the blocks measured: the embedding and head stay analytic, and provenance counts them
    blocks = Profile(devices=base.devices, device_types=base.device_types,
                     compute=tuple(e for e in slow.compute if e.unit == "block"))
    partial = Simulator(model, cluster, profile=blocks).simulate(plan)
    assert fast.breakdown[0]["compute_s"] < partial.breakdown[0]["compute_s"] < three.breakdown[0]["compute_s"]
    assert partial.provenance["device_types"]["A100-80GB"]["units_measured"] == f"{model.num_units - 2} of {model.num_units}"


def test_a_profile_of_another_precision_or_model_leaves_the_analytic_terms(cluster):
    model = _model()
    plan = megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=1, pp=2, dp=1,
                         micro_batch=2, recompute="none")
    base = analytic_profile(model, cluster)
    other = Profile(devices=base.devices, device_types=base.device_types,
                    compute=tuple(ComputeEntry(**{**e.__dict__, "params": e.params + 1}) for e in base.compute))
    plain = Simulator(model, cluster).simulate(plan)
    assert Simulator(model, cluster, profile=other).simulate(plan).step_time_s == pytest.approx(plain.step_time_s)
    fp32 = Profile(devices=base.devices, device_types=base.device_types,
                   compute=tuple(ComputeEntry(**{**e.__dict__, "precision": "fp32", "fwd_s": 1.0}) for e in base.compute))
    p = Simulator(model, cluster, profile=fp32).simulate(plan)
    assert p.step_time_s == pytest.approx(plain.step_time_s)
    assert "nothing measured at bf16" in p.provenance["device_types"]["A100-80GB"]["profile"]


def test_a_cpu_stand_in_prices_every_precision_and_says_so(cluster):
    model = _model()
    plan = megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=1, pp=2, dp=1,
                         micro_batch=2, recompute="none")
    base = analytic_profile(model, cluster)
    cpu = Profile(devices={"cpu": DeviceClass("cpu", "cpu", "cpu: test", None)},
                  device_types={"A100-80GB": DeviceBinding("cpu", stand_in=True)},
                  compute=tuple(ComputeEntry(**{**e.__dict__, "device": "cpu", "precision": "fp32",
                                                "fwd_s": e.fwd_s * 100, "bwd_s": e.bwd_s * 100})
                                for e in base.compute))
    p = Simulator(model, cluster, profile=cpu).simulate(plan)
    q = Simulator(model, cluster, profile=base).simulate(plan)
    assert p.breakdown[0]["compute_s"] == pytest.approx(100 * q.breakdown[0]["compute_s"])
    prov = p.provenance["device_types"]["A100-80GB"]
    assert prov["compute"] == "measured" and prov["stand_in"] is True and prov["precision_measured"] == "fp32"
    assert "not on real A100-80GBs" in prov["note"]
    assert "from" in prov["error_band"]


def test_ranks_outnumbering_the_cores_share_them_where_they_compute(cluster):
    model = _model()
    base = analytic_profile(model, cluster)
    cpu = Profile(devices={"cpu": DeviceClass("cpu", "cpu", "cpu: test", 1e-9, 1e-4)},
                  device_types={"A100-80GB": DeviceBinding("cpu", stand_in=True)},
                  compute=tuple(ComputeEntry(**{**e.__dict__, "device": "cpu"}) for e in base.compute),
                  links=tuple(LinkEntry(**{**e.__dict__, "devices": ("cpu", "cpu")}) for e in base.links))
    assert cpu.sharing_cores(2, 2) is cpu and cpu.sharing_cores(1, 8) is cpu  # a core each: as measured
    shared = cpu.sharing_cores(4, 2)  # four ranks on two cores
    assert shared.compute == cpu.compute and shared.links == cpu.links  # the simulation shares the cores
    assert shared.devices["cpu"].adam_s_per_param == pytest.approx(2e-9)  # every rank steps at once
    assert shared.core_sharing == CoreSharing(processes=4, threads=1, cores=2)
    back = parse_profile(json.loads(json.dumps(shared.to_dict())))  # replayable, and not the unshared profile
    assert back.core_sharing == shared.core_sharing and back.fingerprint == shared.fingerprint != cpu.fingerprint

    def makespans(plan, profile):
        run = Simulator(model, cluster, overlap_grad_reduce=False, profile=profile)._run(plan)
        return [p.makespan for p in run.pipes]

    workload = Workload(8, 64, precision="bf16", recompute="none")
    # four replicas compute at once: each at half a core
    dp = megatron_plan(model, cluster, workload, tp=1, pp=1, dp=4, micro_batch=2, recompute="none")
    assert makespans(dp, shared) == pytest.approx([2 * t for t in makespans(dp, cpu)])
    # and reach the gradient all-reduce together, whose hops are CPU work: half a core each too
    ring = [Simulator(model, cluster, overlap_grad_reduce=False, profile=p).simulate(dp).breakdown[0]["dp_comm_s"]
            for p in (cpu, shared)]
    assert ring[1] == pytest.approx(2 * ring[0]) and ring[0] > 0
    # one micro-batch down four stages: one stage computes at a time, a core each
    pipe = megatron_plan(model, cluster, Workload(2, 64, precision="bf16", recompute="none"), tp=1, pp=4, dp=1,
                         micro_batch=2, recompute="none")
    assert makespans(pipe, shared) == pytest.approx(makespans(pipe, cpu))
    # two pipelines of two stages: slower than with a core each, faster than stretched whole
    mixed = megatron_plan(model, cluster, workload, tp=1, pp=2, dp=2, micro_batch=2, recompute="none")
    alone, together = makespans(mixed, cpu)[0], makespans(mixed, shared)[0]
    assert alone < together < 2 * alone
    traced = Simulator(model, cluster, overlap_grad_reduce=False, profile=shared).simulate(mixed)
    assert traced.step_time_s >= together
    for bad, match in [({"processes": 0, "threads": 1, "cores": 2}, r"core_sharing\.processes: must be >= 1"),
                       ({"processes": 4, "cores": 2}, r"core_sharing.*threads")]:
        with pytest.raises(SpecError, match=match):
            parse_profile({**shared.to_dict(), "core_sharing": bad})
    gpu = analytic_profile(model, cluster)  # a measured GPU is not shared
    assert gpu.sharing_cores(8, 2) is gpu


def test_interpolation_is_exact_at_measured_points_and_keeps_the_fixed_cost():
    xs, ts = [10.0, 20.0, 40.0], [2.0, 3.0, 5.0]  # 1 s fixed + 0.1 s per unit of work
    assert [_interp(xs, ts, x) for x in xs] == ts
    assert _interp(xs, ts, 30.0) == pytest.approx(4.0)
    assert _interp(xs, ts, 5.0) == pytest.approx(1.5)  # along the first segment: the fixed cost stays
    assert _interp(xs, ts, 80.0) == pytest.approx(10.0)  # beyond: in proportion
    assert _interp([10.0], [2.0], 5.0) == pytest.approx(1.0)


def test_latency_and_bandwidth_are_recovered_from_a_sweep():
    points = [(b, 50e-6 + b / 2e9) for b in (1e3, 1e4, 1e5, 1e6, 1e7)]
    lat, per_byte = fit_latency_bandwidth(points)
    assert lat == pytest.approx(50e-6, rel=1e-6) and 1 / per_byte == pytest.approx(2e9, rel=1e-6)


def test_round_trip(tmp_path, cluster):
    prof = analytic_profile(_model(), cluster)
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path)
    assert back.to_dict() == prof.to_dict()
    assert back.fingerprint == prof.fingerprint and back.source == str(path)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(format="other"), r"p\.json: format: 'other' is not 'hetpart-profile'"),
    (lambda d: d.update(version=9), r"p\.json: version: 9: this hetpart reads version 1"),
    (lambda d: d["compute"][0].update(fwd_s=-1), r"p\.json: compute\[0\]\.fwd_s \(seconds\): must be > 0"),
    (lambda d: d["compute"][0].update(precision="int4"), r"compute\[0\]\.precision: 'int4'; use one of"),
    (lambda d: d["compute"][0].update(device="gpu9"), r"compute\[0\]\.device: 'gpu9' is not under 'devices'"),
    (lambda d: d["compute"][0].pop("bwd_s"), r"compute\[0\]\.bwd_s: missing required field"),
    (lambda d: d["links"][0].update(scope="rack"), r"links\[0\]\.scope: 'rack'; use one of"),
    (lambda d: d["device_types"]["A100-80GB"].update(stand_in="yes"), r"device_types\.A100-80GB\.stand_in"),
])
def test_a_bad_profile_is_one_clear_line(tmp_path, cluster, edit, match):
    data = analytic_profile(_model(), cluster).to_dict()
    edit(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=match):
        load_profile(path)


def test_predict_with_a_bad_profile_exits_2_with_one_line(tmp_path, capsys, cluster):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "p.json").write_text("{not json")
    code, out, err = run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"),
                             "--global-batch", "8", "--seq-len", "64", "--tp", "1", "--pp", "2", "--dp", "1",
                             "--micro-batch", "2", "--profile", str(tmp_path / "p.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "p.json: not JSON" in err and "hetpart calibrate" in err


def test_predict_and_plan_take_a_profile(tmp_path, capsys, cluster):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    analytic_profile(_model(), cluster).save(tmp_path / "p.json")
    common = ["--model", "gpt2-small", "--cluster", str(tmp_path / "c.yaml"), "--global-batch", "8", "--seq-len", "64"]
    code, out, err = run_cli(capsys, "predict", *common, "--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2",
                             "--recompute", "none", "--profile", str(tmp_path / "p.json"), "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["provenance"]["device_types"]["A100-80GB"]["compute"] == "measured"
    assert "+profile:" in answer["predictor_version"]
    code, out, err = run_cli(capsys, "plan", *common, "--planner", "uniform", "--profile", str(tmp_path / "p.json"),
                             "--json")
    assert code == 0, err
    assert json.loads(out)["provenance"]["device_types"]["A100-80GB"]["compute"] == "measured"
    code, out, err = run_cli(capsys, "predict", *common, "--tp", "1", "--pp", "2", "--dp", "1", "--micro-batch", "2",
                             "--predictor", "learned", "--profile", str(tmp_path / "p.json"))
    assert code == 2 and "--profile: the 'learned' predictor takes no profile" in err


def test_unit_compute_matches_per_unit(cluster):
    model = _model()
    gpu = cluster.groups[0].gpu
    from hetpart.costmodel.profile import BoundProfile

    bound = BoundProfile(analytic_profile(model, cluster), model, cluster)
    fwd, bwd = unit_compute_s(model, gpu, 1, 2, "bf16", "none", kernels="fused")  # as analytic_profile
    f, b = bound.unit_compute_s(gpu, 1, 2, "bf16", "none", np.zeros_like(fwd), np.zeros_like(bwd))
    assert f == pytest.approx(fwd) and b == pytest.approx(bwd)


def test_a_measured_unit_recomputes_what_the_engine_recomputes(cluster):
    """A profile's units are measured without recomputation; under selective recomputation Megatron re-runs the
    attention core, hetpart's runtime the whole attention sublayer (compute.SELECTIVE_SCOPES): the backward gains
    that share of the measured forward. Measured on this CPU, the runtime's selective step took 1.14x and 1.20x
    its no-recompute step (two pairs, gpt2-small at width 512); priced by the core it came out 0.96x."""
    from hetpart.costmodel.compute import sublayer_recompute_flops
    from hetpart.costmodel.profile import BoundProfile

    model = _model()
    gpu = cluster.groups[0].gpu
    bound = BoundProfile(analytic_profile(model, cluster), model, cluster)
    zeros = np.zeros(model.num_units)
    f0, b0 = bound.unit_compute_s(gpu, 1, 2, "bf16", "none", zeros, zeros)
    _, core = bound.unit_compute_s(gpu, 1, 2, "bf16", "selective", zeros, zeros)
    _, sub = bound.unit_compute_s(gpu, 1, 2, "bf16", "selective", zeros, zeros, selective="sublayer")
    _, full = bound.unit_compute_s(gpu, 1, 2, "bf16", "full", zeros, zeros, selective="sublayer")
    fwd_flops = np.array([u.fwd_flops for u in model.units])
    core_flops = np.array([u.recompute_flops["selective"] for u in model.units])
    proj = sublayer_recompute_flops(model, "eager")[0]
    block = 1
    assert core[block] - b0[block] == pytest.approx(f0[block] * core_flops[block] / fwd_flops[block])
    assert sub[block] - b0[block] == pytest.approx(f0[block] * (core_flops[block] + proj[block]) / fwd_flops[block])
    assert core[block] < sub[block] < full[block] == pytest.approx(b0[block] + f0[block])
    assert sub[0] == core[0] == b0[0] and sub[-1] == b0[-1]  # embedding and head recompute nothing


def test_an_uneven_tensor_parallel_group_is_priced_from_the_profile_too(tmp_path):
    """Unlike devices in one TP group (a measured slow factor, an uneven split): each device's units come
    from the profile at its share, then its speed factor; a profile equal to the analytic terms changes
    nothing, a profile three times slower triples the compute."""
    from hetpart.plan import Plan, Replica, Stage, TPSplit

    path = tmp_path / "slow.yaml"
    path.write_text(CLUSTER + 'slow: {"0/0/1": 0.5}\n')
    cluster = load_cluster(str(path))
    model = _model()
    stage = Stage((0, model.num_units), ("0/0/0", "0/0/1"), tp=2, tp_split=TPSplit(heads=(8, 4), ffn=(2048, 1024)))
    plan = Plan(global_batch=8, micro_batch=2, seq_len=64, recompute="none", precision="bf16",
                replicas=(Replica(1.0, (stage,)),))
    base = analytic_profile(model, cluster)
    three = Profile(devices=base.devices, device_types=base.device_types, links=base.links,
                    compute=tuple(ComputeEntry(**{**e.__dict__, "fwd_s": e.fwd_s * 3, "bwd_s": e.bwd_s * 3})
                                  for e in base.compute))
    plain = Simulator(model, cluster).simulate(plan)
    same = Simulator(model, cluster, profile=base).simulate(plan)
    slow = Simulator(model, cluster, profile=three).simulate(plan)
    # the shares' work lies between measured micro-batches: interpolated linearly, close to the curve
    assert same.breakdown[0]["compute_s"] == pytest.approx(plain.breakdown[0]["compute_s"], rel=0.01)
    assert same.breakdown[0]["tp_comm_s"] == pytest.approx(plain.breakdown[0]["tp_comm_s"], rel=1e-6)
    assert slow.breakdown[0]["compute_s"] == pytest.approx(3 * same.breakdown[0]["compute_s"], rel=1e-9)


def with_tensor_parallel(model, cluster, extra_fwd=2e-3, extra_bwd=3e-3, micro_batches=(1, 2, 4),
                         engine="dtensor") -> Profile:
    """The analytic profile plus the block timed tensor-parallel 2 ways: its half of the curve, its two
    forward and two backward all-reduces as rings on the measured intra-node link, and ``extra`` more
    (what the engine pays beyond both)."""
    from dataclasses import replace

    from hetpart.costmodel.collectives import ring_allreduce_time_s

    base = analytic_profile(model, cluster, micro_batches)
    link = next(e for e in base.links if e.kind == "allreduce" and e.scope == "intra_node")
    block = model.units[1]
    entries = []
    for e in base.compute:
        if e.unit != "block":
            continue
        half = [_interp([x.fwd_flops for x in base.compute if x.unit == "block"],
                        [getattr(x, k) for x in base.compute if x.unit == "block"], e.fwd_flops / 2)
                for k in ("fwd_s", "bwd_s")]
        nbytes = 2 * model.seq_len * e.micro_batch * block.width  # bf16 activations of one micro-batch
        ring = ring_allreduce_time_s(nbytes, 2, link.bandwidth_gbyte_s, link.latency_us)
        entries.append(TensorParallelEntry(
            device="A100", precision="bf16", unit="block", params=e.params, seq_len=e.seq_len,
            micro_batch=e.micro_batch, fwd_flops=e.fwd_flops, tp=2, fwd_s=half[0] + 2 * ring + extra_fwd,
            bwd_s=half[1] + 2 * ring + extra_bwd, collective_fwd_s=2 * ring, collective_bwd_s=2 * ring,
            collectives_fwd=2, collectives_bwd=2, collective_bytes=nbytes, repeats=3, backend="nccl", engine=engine))
    return replace(base, tensor_parallel=tuple(entries))


def test_a_measured_tensor_parallel_unit_adds_what_the_engine_pays_beyond_its_share_and_all_reduces(cluster):
    model = _model()
    prof = with_tensor_parallel(model, cluster)
    bound = BoundProfile(prof, model, cluster)
    for mb in (1, 2, 3, 4, 8):  # measured, between (interpolated), beyond (the nearest kept)
        assert bound.tp_overhead_s("A100", "bf16", model.units[1], mb, 2) == pytest.approx((2e-3, 3e-3), rel=1e-9)
        assert bound.tp_overhead_s("A100", "bf16", model.units[1], mb, 8) == pytest.approx((2e-3, 3e-3), rel=1e-9)
    assert bound.tp_overhead_s("A100", "bf16", model.units[0], 2, 2) == (0.0, 0.0)  # the embedding: not measured
    blocks = sum(u.kind == "block" for u in model.units)
    w = Workload(16, 64, precision="bf16", recompute="none")
    plain_prof = analytic_profile(model, cluster)
    for tp, pp in ((2, 1), (2, 2)):
        plan = megatron_plan(model, cluster, w, tp=tp, pp=pp, dp=1, micro_batch=2, recompute="none")
        without, with_tp = (Simulator(model, cluster, overlap_grad_reduce=False, profile=p).simulate(plan)
                            for p in (plain_prof, prof))
        micro = plan.global_batch // plan.micro_batch
        # every block of every stage pays 5 ms more per micro-batch, nothing else moves
        assert sum(b["compute_s"] for b in with_tp.breakdown) - sum(b["compute_s"] for b in without.breakdown) \
            == pytest.approx(micro * blocks * 5e-3, rel=1e-6)
        assert [b["tp_comm_s"] for b in with_tp.breakdown] == pytest.approx([b["tp_comm_s"] for b in without.breakdown])
    one = megatron_plan(model, cluster, w, tp=1, pp=2, dp=2, micro_batch=2, recompute="none")
    assert Simulator(model, cluster, profile=prof).simulate(one).step_time_s == pytest.approx(
        Simulator(model, cluster, profile=plain_prof).simulate(one).step_time_s, rel=1e-12)


def test_an_uneven_split_pays_its_own_engines_price(tmp_path):
    """An uneven split runs Megatron-style by hand (hetpart.runtime.uneven_tp), an even one through DTensor:
    each pays what its engine was measured to cost, and nothing where that engine was not measured."""
    from dataclasses import replace

    from hetpart.plan import Plan, Replica, Stage, TPSplit

    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    cluster = load_cluster(str(path))
    model = _model()
    dtensor, plain_prof = with_tensor_parallel(model, cluster), analytic_profile(model, cluster)
    by_hand = with_tensor_parallel(model, cluster, 1e-3, 1e-3, engine="megatron")
    both = replace(dtensor, tensor_parallel=dtensor.tensor_parallel + by_hand.tensor_parallel)
    blocks = sum(u.kind == "block" for u in model.units)
    for split, paid in ((TPSplit(heads=(8, 4), ffn=(2048, 1024)), {"dtensor": 0.0, "both": 2e-3}),
                        (None, {"dtensor": 5e-3, "both": 5e-3})):
        stage = Stage((0, model.num_units), ("0/0/0", "0/0/1"), tp=2, tp_split=split)
        plan = Plan(global_batch=8, micro_batch=2, seq_len=64, recompute="none", precision="bf16",
                    replicas=(Replica(1.0, (stage,)),))
        base = Simulator(model, cluster, profile=plain_prof).simulate(plan).breakdown[0]["compute_s"]
        for name, prof in (("dtensor", dtensor), ("both", both)):
            got = Simulator(model, cluster, profile=prof).simulate(plan).breakdown[0]["compute_s"] - base
            # the uneven split's slowest device's share: its time, not the even half, comes from the curve
            assert got == pytest.approx(4 * blocks * paid[name], rel=1e-6, abs=1e-9), (split, name)


def test_tensor_parallel_entries_round_trip_and_are_checked(tmp_path, cluster):
    from dataclasses import replace

    model = _model()
    prof = with_tensor_parallel(model, cluster)
    path = tmp_path / "p.json"
    prof.save(path)
    assert load_profile(path).to_dict() == prof.to_dict() and load_profile(path).tensor_parallel == prof.tensor_parallel
    assert "tensor_parallel" not in analytic_profile(model, cluster).to_dict()  # older files read as before
    cpu = replace(prof, devices={"A100": replace(prof.devices["A100"], kind="cpu")})
    shared = cpu.sharing_cores(4, 2)  # timed with a core each: the simulation shares the cores, not the entries
    assert shared.tensor_parallel == prof.tensor_parallel and shared.core_sharing is not None
    for edit, match in [(lambda t: t.update(tp=1), r"tensor_parallel\[0\]\.tp: must be >= 2"),
                        (lambda t: t.pop("collective_fwd_s"), r"tensor_parallel\[0\]\.collective_fwd_s: missing"),
                        (lambda t: t.update(unit="layer"), r"tensor_parallel\[0\]\.unit: 'layer'; use one of"),
                        (lambda t: t.update(engine="jax"), r"tensor_parallel\[0\]\.engine: 'jax'; use one of")]:
        data = prof.to_dict()
        edit(data["tensor_parallel"][0])
        path.write_text(json.dumps(data))
        with pytest.raises(SpecError, match=match):
            load_profile(path)


def test_provenance_says_whether_tensor_parallelism_was_measured(cluster):
    model = _model()
    plan = megatron_plan(model, cluster, Workload(8, 64, precision="bf16", recompute="none"), tp=2, pp=1, dp=2,
                         micro_batch=2, recompute="none")
    said = {name: Simulator(model, cluster, profile=prof).simulate(plan).provenance["device_types"]["A100-80GB"]
            for name, prof in (("with", with_tensor_parallel(model, cluster)), ("without", analytic_profile(model, cluster)))}
    assert said["with"]["tensor_parallel"].startswith("dtensor at tp 2 measured")
    assert said["without"]["tensor_parallel"].startswith("not measured")
