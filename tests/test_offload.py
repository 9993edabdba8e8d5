"""Model states in host memory (plan key ``offload``; issue 10): ZeRO-Offload's optimizer on the CPU and FSDP2's
CPU offload of everything, in the plan schema, the cluster file, the simulator, the planners and the CLI.
(The runtime's gradient gate for offloaded plans is in ``tests/test_runtime_sharded.py``.)"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hetpart import Plan, Replica, Stage, load_model
from hetpart.cluster import cluster_to_dict, load_cluster, parse_cluster
from hetpart.costmodel import Simulator
from hetpart.costmodel.memory import optimizer_step_bytes
from hetpart.costmodel.offload import DEFAULT_HOST_MEMORY_GBYTE_S, host_link_gbyte_s, host_memory_gb
from hetpart.errors import PlanError, SpecError, WorkloadError
from hetpart.workload import Workload
from tests._cli import cli_json, run_cli

S = 256


def _cluster(host: str = "", gpus: int = 2, gpu: str = "RTX4090-24GB"):
    return parse_cluster({"name": "box", "nodes": [
        {"count": 1, "gpus_per_node": gpus, "gpu": gpu, "intra_node": "PCIe4", "nic": "Ethernet-25",
         **(json.loads(host) if host else {})}]}, "box.yaml")


@pytest.fixture(scope="module")
def model():
    return load_model("gpt2-medium", seq_len=S)


def _dp2(model, zero: int, offload: str, **kw) -> Plan:
    n = model.num_units
    return Plan(global_batch=8, micro_batch=2, seq_len=S, recompute="full", zero=zero, offload=offload,
                replicas=tuple(Replica(0.5, (Stage((0, n), (f"0/0/{i}",), 1),)) for i in range(2)), **kw)


def _row(pred) -> dict:
    return pred.breakdown[0]


def test_the_plan_carries_offload_and_refuses_what_cannot_run(model) -> None:
    cluster = _cluster()
    plan = _dp2(model, 2, "optimizer")
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again == plan and again.offload == "optimizer"
    assert "offload" not in _dp2(model, 2, "none").to_dict()  # plans written before offload read the same
    assert not plan.validate(model, cluster)
    assert any("offload: 'full'" in p and "needs zero 3 (not 2)" in p
               for p in replace(plan, offload="full").validate(model, cluster))
    with pytest.raises(PlanError, match=r"offload.*unknown offload 'disk'; use none, optimizer, full"):
        Plan.from_dict(plan.to_dict() | {"offload": "disk"}, "p.json")
    with pytest.raises(WorkloadError, match=r"--offload: 'full' .* needs --zero 3 \(not 1\)"):
        Workload(8, S, zero=1, offload="full")
    assert "offload" not in Workload(8, S).to_dict()


def test_the_device_keeps_what_each_level_leaves_it(model) -> None:
    """ZeRO-Offload accounting: at level 2 the device keeps only its 16-bit weights (2 of Adam's 18 bytes per
    parameter under bf16); the rest (the fp32 gradient shard, master weights, moments) is in host memory."""
    cluster = _cluster()
    sim = Simulator(model, cluster)
    params = model.range_params(0, model.num_units, 1)
    base = sim.simulate(_dp2(model, 2, "none"))
    off = sim.simulate(_dp2(model, 2, "optimizer"))
    # level 2 keeps 2 + (4 + 12) / 2 bytes per parameter; offloaded, 2
    assert _row(base)["memory_gb"] - _row(off)["memory_gb"] == pytest.approx(params * 8 / 1e9, rel=1e-9)
    assert off.metrics["host_memory_gb"] == pytest.approx(2 * params * 16 / 2 / 1e9, rel=1e-9)
    full = sim.simulate(_dp2(model, 3, "full"))
    z3 = sim.simulate(_dp2(model, 3, "none"))
    assert _row(z3)["memory_gb"] - _row(full)["memory_gb"] == pytest.approx(params * 9 / 1e9, rel=1e-9)
    assert full.metrics["host_memory_gb"] == pytest.approx(2 * params * 18 / 2 / 1e9, rel=1e-9)
    assert "host_memory_gb" not in base.metrics


def test_the_cpu_step_and_the_copies_are_priced(model) -> None:
    """The step runs at the node's memory bandwidth shared by its offloading devices, plus the gradient to the
    host and the 16-bit weights back over each device's PCIe link."""
    share = model.range_params(0, model.num_units, 1)  # level 0: each device steps all its parameters
    slow, fast = (Simulator(model, _cluster(json.dumps({"host_memory_gbyte_s": bw}))) for bw in (50.0, 100.0))
    got = {bw: _row(sim.simulate(_dp2(model, 0, "optimizer")))["optimizer_s"] for bw, sim in ((50, slow), (100, fast))}
    link = host_link_gbyte_s(load_cluster_gpu()) * 1e9
    copies = share * 4 / link + share * 2 / link  # the fp32 gradient out, the 16-bit weights back
    step = optimizer_step_bytes("adam", "bf16")  # 30: the fp32 gradient, master and moments read, then written
    assert step == 30
    assert got[50] == pytest.approx(share * step / (50e9 / 2) + copies, rel=1e-9)
    assert got[100] == pytest.approx(share * step / (100e9 / 2) + copies, rel=1e-9)
    # the default host bandwidth is the documented assumption
    default = _row(Simulator(model, _cluster()).simulate(_dp2(model, 0, "optimizer")))["optimizer_s"]
    assert default == pytest.approx(share * step / (DEFAULT_HOST_MEMORY_GBYTE_S * 1e9 / 2) + copies, rel=1e-9)


def load_cluster_gpu():
    from hetpart.catalog.hardware import GPU_CATALOG

    return GPU_CATALOG["RTX4090-24GB"]


def test_full_offload_copies_every_unit_every_micro_batch(model) -> None:
    """Each unit's shard crosses PCIe before its gathers (forward and backward) and its gradient after its
    reduce-scatter, every micro-batch: more exposed per-unit time than level 3 on the device, and it grows
    as the host link narrows (PCIe 3 against PCIe 4)."""
    z3 = _row(Simulator(model, _cluster()).simulate(_dp2(model, 3, "none")))
    full = _row(Simulator(model, _cluster()).simulate(_dp2(model, 3, "full")))
    assert full["zero_comm_s"] > z3["zero_comm_s"]
    old = _row(Simulator(model, _cluster(gpu="TitanRTX-24GB")).simulate(_dp2(model, 3, "full")))
    old_z3 = _row(Simulator(model, _cluster(gpu="TitanRTX-24GB")).simulate(_dp2(model, 3, "none")))
    assert old["zero_comm_s"] - old_z3["zero_comm_s"] > full["zero_comm_s"] - z3["zero_comm_s"]


def test_host_memory_that_does_not_hold_the_states_does_not_fit(model) -> None:
    plan = _dp2(model, 0, "optimizer")
    roomy = Simulator(model, _cluster()).simulate(plan)
    assert roomy.fits_in_memory and roomy.metrics["host_capacity_gb"] == pytest.approx(host_memory_gb(
        _cluster().groups[0]))
    tight = Simulator(model, _cluster(json.dumps({"host_memory_gb": 1}))).simulate(plan)
    assert not tight.fits_in_memory and tight.metrics["host_memory_gb"] > tight.metrics["host_capacity_gb"] == 1.0
    assert not Simulator(model, _cluster(json.dumps({"host_memory_gb": 1}))).estimate(plan).fits_in_memory


def test_the_cluster_file_takes_host_memory_and_its_bandwidth(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, "
                    "nic: IB-HDR, host_memory_gb: 1024, host_memory_gbyte_s: 300}\n")
    cluster = load_cluster(str(path))
    assert (cluster.groups[0].host_memory_gb, cluster.groups[0].host_memory_gbyte_s) == (1024.0, 300.0)
    assert parse_cluster(cluster_to_dict(cluster), "again").groups[0] == cluster.groups[0]
    assert cluster.summary()["node_groups"][0]["host_memory_gb"] == 1024.0  # hetpart inspect cluster --json
    path.write_text("name: c\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, "
                    "nic: IB-HDR, host_memory_gb: -4}\n")
    with pytest.raises(SpecError, match=r"c.yaml.*nodes\[0\].host_memory_gb.*must be > 0"):
        load_cluster(str(path))


def test_search_with_offload_fits_what_does_not_fit_without(capsys, tmp_path: Path) -> None:
    """gpt3-1.3b's 21 GB of Adam states do not fit one 16 GB T4 at any level (one replica shards nothing);
    with the optimizer on the host it plans, and the plan says so."""
    path = tmp_path / "t4.yaml"
    path.write_text("name: t4\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: T4-16GB, intra_node: PCIe3, "
                    "nic: Ethernet-10, host_memory_gb: 128}\n")
    common = ["plan", "--model", "gpt3-1.3b", "--cluster", str(path), "--global-batch", "8", "--seq-len", "512"]
    code, out, err = run_cli(capsys, *common)
    assert code == 2 and "states alone need 21.1 GB" in err and "--offload optimizer" in err, err
    out = cli_json(capsys, *common, "--offload", "optimizer", "--json")
    assert out["metrics"]["fits_in_memory"] is True and out["plan"]["offload"] == "optimizer"
    # fp16 on a T4: the host's gradient is fp32 all the same (offload.HOST_GRAD_BYTES), with 12 of Adam's states
    assert out["metrics"]["host_memory_gb"] == pytest.approx(1.32e9 * 16 / 1e9, rel=0.02)


def test_predict_takes_offload_and_the_learned_predictor_leaves_it_to_the_simulator(capsys, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: c\nnodes:\n  - {count: 1, gpus_per_node: 4, gpu: RTX4090-24GB, intra_node: PCIe4, "
                    "nic: Ethernet-25}\n")
    grid = ["predict", "--model", "gpt3-6.7b", "--cluster", str(path), "--global-batch", "32", "--seq-len", "2048",
            "--tp", "1", "--pp", "1", "--dp", "4", "--micro-batch", "1", "--recompute", "full", "--zero", "2"]
    plain = cli_json(capsys, *grid, "--json")["metrics"]
    off = cli_json(capsys, *grid, "--offload", "optimizer", "--json")["metrics"]
    assert not plain["fits_in_memory"] and off["fits_in_memory"]
    assert off["step_time_s"] > plain["step_time_s"]  # the CPU step and the copies cost time
    code, out, err = run_cli(capsys, *grid, "--offload", "full")
    assert code == 2 and "--offload: 'full'" in err and "needs --zero 3 (not 2)" in err
    learned = cli_json(capsys, *grid, "--offload", "optimizer", "--predictor", "learned", "--json")["metrics"]
    assert learned["priced_by"] == "simulator" and learned["step_time_s"] == pytest.approx(off["step_time_s"])
    assert learned["host_memory_gb"] == pytest.approx(off["host_memory_gb"])


def test_export_names_each_engines_offload(model) -> None:
    from hetpart.export import export_plan

    plan = _dp2(model, 3, "full")
    ds = export_plan(plan, model, "deepspeed")
    assert ds.data["config"]["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds.data["config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert export_plan(plan, model, "torchtitan").data["training"]["enable_cpu_offload"] is True
    mg = export_plan(replace(plan, zero=1, offload="optimizer"), model, "megatron")
    assert mg.data["--optimizer-cpu-offload"] is True and not any("offload" in p for p in mg.cannot_express)


def test_the_benchmark_prices_every_case_and_says_which_fit() -> None:
    from hetpart.experiments.bench_offload import CASES, _fitting, prediction_rows

    rows = prediction_rows()
    assert len(rows) == sum(len(c[-1]) for c in CASES)
    t4 = {r["offload"]: r for r in rows if r["model"] == "gpt3-1.3b"}
    assert not t4["none"]["fits"] and t4["optimizer"]["fits"] and t4["none"]["host_gb"] is None
    assert "gpt3-1.3b on one-t4 fits only at zero 0 + optimizer" in _fitting(rows)


def test_the_report_names_the_sharding_and_the_host_memory(model) -> None:
    from hetpart.report import plan_report

    cluster = _cluster()
    plan = _dp2(model, 2, "optimizer")
    page = plan_report(plan, cluster, model, Simulator(model, cluster).simulate(plan, trace=True))
    assert "ZeRO 2, offload optimizer" in page and "host memory (offloaded states)" in page


def test_one_gpu_zero_offload_keeps_only_its_weights(model) -> None:
    """ZeRO-Offload on a lone GPU (Ren et al. 2021: 13 B parameters on one 32 GB V100) streams its gradients to
    the host as at level 2, so the device keeps 2 bytes per parameter; at level 0 the gradients stay whole
    (Megatron-Core's CPU offload). Every path that prices memory agrees on both."""
    from hetpart.costmodel.evaluator import Evaluator
    from hetpart.costmodel.sharding_reference import reference_memory_gb

    cluster = _cluster(gpus=1)
    n = model.num_units
    one = Plan(global_batch=8, micro_batch=2, seq_len=S, recompute="full", zero=2, offload="optimizer",
               replicas=(Replica(1.0, (Stage((0, n), ("0/0/0",), 1),)),))
    params = model.range_params(0, n, 1)
    sim = Simulator(model, cluster)
    streamed, whole = (sim.simulate(replace(one, zero=z)).breakdown[0]["memory_gb"] for z in (2, 0))
    largest = max(model.range_params(u, u + 1, 1) for u in range(n))
    # the fp32 gradients (bf16 training), less the one unit's in flight
    assert whole - streamed == pytest.approx((params * 4 - largest * 4) / 1e9, rel=1e-9)
    for plan in (one, replace(one, zero=0)):
        want = sim.simulate(plan).breakdown[0]["memory_gb"]
        assert reference_memory_gb(model, plan)[(0, 0)] == pytest.approx(want, rel=1e-12)
        assert Evaluator(model, cluster, Workload(8, S)).device_memory_gb(plan)[(0, 0)] == pytest.approx(want, rel=1e-12)


def test_the_host_link_follows_the_bus_and_grace_hopper_has_its_own() -> None:
    from hetpart.catalog.hardware import GPU_CATALOG

    got = {name: host_link_gbyte_s(GPU_CATALOG[name]) for name in ("V100-16GB", "A100-80GB", "H100-80GB",
                                                                    "GH200-96GB")}
    assert got == {"V100-16GB": 12.0, "A100-80GB": 24.0, "H100-80GB": 50.0, "GH200-96GB": 450.0}


def test_planners_shard_an_offloaded_optimizer_from_level_one() -> None:
    """At level 0 every replica would step all the parameters on its node's CPU; the planners start an offloaded
    optimizer at level 1 (and parameters on the host at 3) unless the workload names a level."""
    from hetpart.policies.common import offload_level
    from hetpart.policies.plan_search import zero_levels

    assert zero_levels(Workload(8, S)) == (0, 1, 2, 3)
    assert zero_levels(Workload(8, S, offload="optimizer")) == (1, 2, 3)
    assert zero_levels(Workload(8, S, offload="full")) == (3,)
    assert zero_levels(Workload(8, S, zero=0, offload="optimizer")) == (0,)
    assert offload_level(Workload(8, S, offload="optimizer")).zero == 1
    assert offload_level(Workload(8, S, offload="full")).zero == 3
    assert offload_level(Workload(8, S)).zero is None


def test_plan_offload_auto_offloads_only_where_nothing_fits_otherwise(capsys, tmp_path: Path) -> None:
    path = tmp_path / "t4.yaml"
    path.write_text("name: t4\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: T4-16GB, intra_node: PCIe3, "
                    "nic: Ethernet-10, host_memory_gb: 128}\n")
    common = ["plan", "--cluster", str(path), "--global-batch", "8", "--seq-len", "512", "--offload", "auto", "--json"]
    big = cli_json(capsys, *common[:1], "--model", "gpt3-1.3b", *common[1:])
    assert big["plan"]["offload"] == "optimizer" and big["metrics"]["fits_in_memory"]
    assert big["plan"]["meta"]["workload"]["offload"] == "optimizer"
    small = cli_json(capsys, *common[:1], "--model", "gpt2-small", *common[1:])
    assert "offload" not in small["plan"] and small["metrics"]["fits_in_memory"]
    code, out, err = run_cli(capsys, *common[:-1], "--model", "llama2-70b")
    assert code == 2 and "(--offload auto: nor with the optimizer or everything in host memory)" in err
    assert "keep the optimizer in host memory" not in err  # what auto tried is not suggested back
    code, out, err = run_cli(capsys, "predict", "--model", "gpt2-small", "--cluster", str(path), "--tp", "1",
                             "--pp", "1", "--dp", "1", "--micro-batch", "1", "--offload", "auto")
    assert code == 2 and "'auto' lets a planner choose" in err
