"""``hetpart run``: emulation arithmetic, refusals before any process starts, a real emulated run, resume.

The runs start real torchrun jobs of 2 CPU processes (about 10 s each on a shared 2-core machine);
the rest checks pure functions.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from hetpart import load_cluster
from hetpart.cli.app import main
from hetpart.errors import HetpartError, PlanError, RuntimeFault
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.emulation import ArrivalBoard, Emulator, emulated_cluster, speed_ratios
from hetpart.runtime.launch import RunOptions, check_capacity, prepare_run, run_plan
from hetpart.runtime.measure import summarize, warmup_tflops

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _pipeline_plan(**meta) -> Plan:
    """gpt2-small (14 units) on tiny-mixed: units 0-7 on an A100, 8-13 on a V100 of the other node."""
    return Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed", **meta})


# ------------------------------------------------------------------------------------ emulation math
def test_speed_ratios_follow_dense_peaks_of_the_real_precision():
    cluster = load_cluster("tiny-mixed")
    ratios = speed_ratios(_pipeline_plan(), cluster)
    a100, v100 = cluster.device("0/0/0").gpu, cluster.device("1/0/0").gpu
    assert ratios["0/0/0"] == 1.0
    assert ratios["1/0/0"] == pytest.approx(a100.tflops_bf16 / v100.tflops_bf16)
    fp32 = speed_ratios(_pipeline_plan(), cluster, precision="fp32")
    assert fp32["1/0/0"] == pytest.approx(a100.tflops_fp32 / v100.tflops_fp32)


def test_emulated_cluster_dilates_links_and_scales_devices():
    real = load_cluster("tiny-mixed")
    plan = _pipeline_plan()
    emu = emulated_cluster(real, plan, peak_tflops=0.02, time_factor=500.0, memory_gbyte_s=5.0)
    assert [d.id for d in emu.devices] == [d.id for d in real.devices]
    assert emu.device("0/0/0").gpu.tflops("fp32") == pytest.approx(0.02)
    assert emu.device("1/0/0").gpu.tflops("fp32") == pytest.approx(0.02 / speed_ratios(plan, real)["1/0/0"])
    for a, b in (("0/0/0", "0/0/1"), ("0/0/0", "1/0/0")):
        r, e = real.link_between(a, b), emu.link_between(a, b)
        assert e.bandwidth_gbyte_s == pytest.approx(r.bandwidth_gbyte_s / 500.0)
        assert e.latency_us == pytest.approx(r.latency_us * 500.0)


def test_emulator_sleeps_scale_measured_time_and_dilated_transfers():
    from hetpart.costmodel.collectives import p2p_time_s

    real = load_cluster("tiny-mixed")
    plan = _pipeline_plan()
    emu = emulated_cluster(real, plan, 0.02, 500.0, 5.0)
    devices = tuple(plan.devices)
    slow = Emulator(emu, devices, rank=1, speed_ratio=2.5)
    assert slow.compute_delay_s(0.01) == pytest.approx(0.015)  # runs at 1/2.5 of the measured speed
    assert Emulator(emu, devices, rank=0, speed_ratio=1.0).compute_delay_s(0.01) == 0.0
    # A transfer on the emulated cluster takes T times as long as on the real one.
    real_s = p2p_time_s(8192, real.link_between("0/0/0", "1/0/0"))
    assert slow.send_delay_s(8192, peer_rank=0) == pytest.approx(500.0 * real_s)
    assert slow.collective_delay_s("all_reduce", 8192, [1]) == 0.0
    assert slow.collective_delay_s("all_reduce", 8192, [0, 1]) > slow.send_delay_s(8192, 0)
    with pytest.raises(ValueError, match="speed_ratio must be >= 1"):
        Emulator(emu, devices, rank=0, speed_ratio=0.5)


class _Beat:
    """A heartbeat that counts what WorkerHooks tell it (outside a worker)."""

    def __init__(self) -> None:
        self.beats, self.busy_s = 0, 0.0

    def progress(self, step=None):
        self.beats += 1

    def busy(self, seconds):
        self.busy_s += seconds


def test_collective_sleep_is_the_emulated_time_less_the_real_transport():
    from hetpart.runtime.worker import WorkerHooks

    emu = Emulator(emulated_cluster(load_cluster("tiny-mixed"), _pipeline_plan(), 0.02, 500.0, 5.0),
                   ("0/0/0", "1/0/0"), rank=0, speed_ratio=1.0)
    full = emu.collective_delay_s("all_reduce", 4096, [0, 1])
    beat = _Beat()
    hooks = WorkerHooks(emu, None, beat, None, rank=0, transport={((0, 1), 4096): 0.25 * full})
    hooks.on_collective("all_reduce", 4096, (1, 0))
    assert hooks.account.emulated_comm_s == pytest.approx(0.75 * full)
    assert beat.busy_s == pytest.approx(0.75 * full) and beat.beats == 1  # the watchdog knows it sleeps
    hooks.on_collective("all_reduce", 8192, (0, 1))  # a size never timed: the whole emulated time
    assert hooks.account.emulated_comm_s == pytest.approx(0.75 * full + emu.collective_delay_s("all_reduce", 8192, [0, 1]))
    slow = WorkerHooks(emu, None, _Beat(), None, rank=0, transport={((0, 1), 4096): 2 * full})
    slow.on_collective("all_reduce", 4096, (0, 1))  # the real transport was slower still: no sleep
    assert slow.account.emulated_comm_s == 0.0


def test_arrival_board_is_fifo_per_pair(tmp_path):
    sender, receiver = ArrivalBoard(tmp_path, rank=0), ArrivalBoard(tmp_path, rank=1)
    sender.post(1, 10.0)
    sender.post(1, 11.5)
    assert receiver.next_arrival(0) == 10.0
    assert receiver.next_arrival(0) == 11.5
    with pytest.raises(TimeoutError, match="no emulated transfer posted by rank 0"):
        receiver.next_arrival(0, timeout_s=0.01)
    sender.close()
    receiver.close()


def test_arrival_waits_follow_interleaved_virtual_stages(tmp_path):
    from hetpart.runtime.worker import WorkerHooks

    asked = []

    class Board:
        def next_arrival(self, src_rank):
            asked.append(src_rank)
            return 0.0  # long arrived: no wait

    emu = Emulator(emulated_cluster(load_cluster("tiny-mixed"), _pipeline_plan(), 0.02, 500.0, 5.0),
                   ("0/0/0", "1/0/0"), rank=1, speed_ratio=1.0)
    hooks = WorkerHooks(emu, Board(), _Beat(), None, rank=1)
    hooks.attach((0, 1), tp=1, num_stages=4)  # rank 1 runs virtual stages 1 and 3 of 0/1/2/3
    for stage, kind in ((1, "fwd"), (3, "fwd"), (3, "bwd"), (1, "bwd"), (3, "loss")):
        hooks.on_compute(stage, kind, 0.0)
    # stage 1 <- 0 (rank 0), stage 3 <- 2 (rank 0); backward: stage 3 is last (nothing), stage 1 <- 2.
    assert asked == [0, 0, 0]


# ------------------------------------------------------------------------------------ refusals
def test_capacity_refusal_says_what_fits():
    with pytest.raises(RuntimeFault, match=r"needs 100000 processes .* at most \d+ \(\d+ cores x 4"):
        check_capacity(100_000, per_process_gb=0.5)


def test_activation_bound_counts_what_each_schedule_holds_at_once():
    """The per-process activation bound: the busiest process's units, times the micro-batches its schedule
    holds at once (1F1B: ``pp - stage``; GPipe: all), not every micro-batch through the whole model."""
    from dataclasses import replace

    from hetpart.graph import load_model
    from hetpart.runtime.launch import _activation_gb

    graph = load_model("gpt2-small", seq_len=64, precision="fp32")
    act = [u.act_bytes["none"] for u in graph.units]
    plan = replace(_pipeline_plan(), global_batch=16, micro_batch=2, seq_len=64)  # 8 micro-batches
    first, second = sum(act[:8]) * 2, sum(act[8:]) * 2  # per micro-batch of 2 sequences
    assert _activation_gb(graph, plan) == pytest.approx(max(2 * first, second) / 1e9)
    assert _activation_gb(graph, replace(plan, schedule="gpipe")) == pytest.approx(8 * max(first, second) / 1e9)
    single = replace(plan, replicas=(Replica(1.0, (Stage((0, 14), ("0/0/0",)),)),))
    assert _activation_gb(graph, single) == pytest.approx((first + second) / 1e9)  # 1F1B on one stage: one


def test_plan_for_more_devices_than_the_machine_hosts_is_refused(tmp_path):
    cluster = load_cluster("a100-v100-16")
    devices = [d.id for d in cluster.devices]
    stages = tuple(Stage((i, i + 1), (devices[i],)) for i in range(13)) + (Stage((13, 14), tuple(devices[13:14])),)
    plan = Plan(global_batch=16, micro_batch=1, seq_len=1024, replicas=(Replica(1.0, stages),))
    cores = len(os.sched_getaffinity(0))
    if 14 <= cores * 4:
        pytest.skip("this machine can host 14 processes")
    with pytest.raises(RuntimeFault, match="needs 14 processes"):
        prepare_run(plan, "gpt2-small", "a100-v100-16", RunOptions())


def test_bad_plan_is_refused_before_any_process_starts(tmp_path):
    bad = Plan(global_batch=4, micro_batch=1, seq_len=1024,
               replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 12), ("1/0/0",)))),))
    run_dir = tmp_path / "run"
    with pytest.raises(PlanError, match="every unit must be covered"):
        run_plan(bad, "gpt2-small", "tiny-mixed", RunOptions(steps=1), run_dir=run_dir)
    assert not run_dir.exists()
    unnamed = Plan(global_batch=4, micro_batch=1, seq_len=1024, replicas=_pipeline_plan().replicas)
    with pytest.raises(PlanError, match=r"meta.model: missing .* give --model"):
        run_plan(unnamed, None, "tiny-mixed", RunOptions(steps=1), run_dir=run_dir)
    assert main(["run", str(tmp_path / "missing.json"), "--steps", "1"]) == 2
    # torch's interleaved schedule cannot run 5 micro-batches in rounds of 2: a rule of hetpart.rules, so
    # Plan.check refuses it before anything starts.
    A, V = "0/0/0", "1/0/0"
    odd = Plan(global_batch=5, micro_batch=1, seq_len=1024, schedule="interleaved", interleave=2, replicas=(
        Replica(1.0, (Stage((0, 4), (A,)), Stage((4, 7), (V,)), Stage((7, 11), (A,)), Stage((11, 14), (V,)))),))
    with pytest.raises(PlanError, match=r"plan: replicas\[0\]: 5 micro-batches is not a multiple"):
        run_plan(odd, "gpt2-small", "tiny-mixed", RunOptions(steps=1), run_dir=run_dir)
    assert not run_dir.exists()


def test_prepare_shrinks_the_model_but_keeps_its_units():
    prep = prepare_run(_pipeline_plan(), "gpt2-small", "tiny-mixed", RunOptions(scale="tiny"))
    assert prep.run_graph.num_units == prep.full_graph.num_units == 14
    assert prep.run_graph.num_params < prep.full_graph.num_params / 100
    assert prep.run_plan.replicas == prep.plan.replicas
    assert prep.run_plan.seq_len < prep.plan.seq_len and prep.run_plan.precision == "fp32"
    assert prep.rank_devices == ("0/0/0", "1/0/0")


# ------------------------------------------------------------------------------------ summaries
def _rank_result(rank, device, times, compute):
    steps = [{"time_s": t, "compute_s": c, "measured_compute_s": c, "comm_s": 0.0, "optimizer_s": 0.0,
              "idle_s": t - c, "slowdown_s": 0.0, "emulated_comm_s": 0.0} for t, c in zip(times, compute)]
    return {"rank": rank, "device": device, "steps": steps, "losses": [1.0] * len(times),
            "peak_memory_bytes": 10**6 * (rank + 1), "memory_method": "rss_peak_delta"}


def test_summarize_takes_the_slowest_rank_per_measured_step():
    plan = _pipeline_plan()
    results = [_rank_result(0, "0/0/0", [9.0, 1.0, 2.0], [1, 0.5, 0.5]),
               _rank_result(1, "1/0/0", [9.0, 1.5, 1.0], [1, 0.5, 0.5])]
    m = summarize(results, plan, load_cluster("tiny-mixed"), seq_len=32, warmup=1)
    assert m.step_times_s == (1.5, 2.0)
    assert m.step_time_s == pytest.approx(1.75)
    assert m.tokens_per_s == pytest.approx(4 * 32 / 1.75)
    assert m.peak_memory_gb == {"A100-40GB": pytest.approx(1e-3), "V100-16GB": pytest.approx(2e-3)}
    assert [s["stage"] for s in m.stages] == [0, 1]


def test_warmup_rate_counts_each_ranks_units():
    prep = prepare_run(_pipeline_plan(), "gpt2-small", "tiny-mixed", RunOptions())
    graph, plan = prep.run_graph, prep.run_plan
    flops0 = sum(u.fwd_flops + u.bwd_flops for u in graph.units[:8]) * 4
    flops1 = sum(u.fwd_flops + u.bwd_flops for u in graph.units[8:]) * 4
    results = [_rank_result(0, "0/0/0", [5.0, 1.0], [5.0, flops0 / 1e10]),
               _rank_result(1, "1/0/0", [5.0, 1.0], [5.0, flops1 / 2e10])]
    assert warmup_tflops(results, graph, plan, warmup=2) == pytest.approx((0.01 + 0.02) / 2)
    assert warmup_tflops(results, graph, plan, warmup=0) is None


# ------------------------------------------------------------------------------------ real runs
@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory):
    """One emulated run of the 2-stage plan through the CLI (2 processes)."""
    tmp = tmp_path_factory.mktemp("run")
    plan_path, out = tmp / "plan.json", tmp / "m.jsonl"
    replace(_pipeline_plan(), precision="fp16").save(plan_path)  # the V100 has no bf16: run refuses it, as predict

    proc = subprocess.run([sys.executable, "-m", "hetpart.cli.app", "run", str(plan_path), "--steps", "2",
                           "--warmup", "1", "--time-factor", "200", "--out", str(out), "--json",
                           "--run-dir", str(tmp / "ranks")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), [json.loads(line) for line in out.read_text().splitlines()]


def test_run_json_has_measured_and_predicted(emulated_run):
    summary, _ = emulated_run
    for block in ("measured", "predicted"):
        for key in ("step_time_s", "tokens_per_s", "samples_per_s"):
            assert math.isfinite(summary[block][key]) and summary[block][key] > 0, (block, key)
    m = summary["measured"]
    assert m["tokens_per_s"] == pytest.approx(4 * summary["model"]["seq_len"] / m["step_time_s"])
    assert summary["steps"] == 2 and len(m["step_times_s"]) == 2 and len(m["losses"]) == 3
    assert summary["model"]["shrunken"] and summary["model"]["hidden_size"] == 64
    assert summary["model"]["num_units"] == 14
    assert summary["emulation"]["time_factor"] == 200.0


def test_run_emulates_the_slower_device(emulated_run):
    summary, _ = emulated_run
    ranks = {r["device"]: r for r in summary["measured"]["ranks"]}
    assert ranks["0/0/0"]["emulated_slowdown_s"] == 0.0  # the fastest type runs at the machine's speed
    assert ranks["1/0/0"]["emulated_slowdown_s"] > 0.0   # the V100 sleeps after every compute
    assert all(r["emulated_comm_s"] > 0 for r in ranks.values())  # the cross-node link is emulated
    assert {s["stage"] for s in summary["measured"]["stages"]} == {0, 1}


def test_run_writes_a_complete_jsonl_record(emulated_run):
    from hetpart.cluster import load_cluster, parse_cluster
    from hetpart.records import RunRecord

    summary, lines = emulated_run
    assert len(lines) == 1
    rec = RunRecord.from_dict(lines[0], "m.jsonl:1")
    assert rec.original_plan["seq_len"] == 1024 and rec.plan["seq_len"] == summary["model"]["seq_len"]
    assert rec.model.graph["num_units"] == 14 and rec.model.spec == "gpt2-small" and rec.model.scale == "tiny"
    assert rec.model.run_config["hidden_size"] == 64 and rec.model.config["hidden_size"] == 768
    assert parse_cluster(rec.cluster) == load_cluster("tiny-mixed")  # lossless, catalog parts by name
    assert rec.emulated and rec.emulation.time_factor == 200.0
    assert rec.emulation.cluster["nodes"][0]["gpu"]["name"] == "emu-A100-40GB"
    assert rec.emulation.gpu_names == {"emu-A100-40GB": "A100-40GB", "emu-V100-16GB": "V100-16GB"}
    assert rec.measured.step_time_s == pytest.approx(summary["measured"]["step_time_s"])
    assert [r.device for r in rec.measured.ranks] == ["0/0/0", "1/0/0"] and len(rec.measured.stages) == 2
    options = rec.predicted.options
    assert rec.predicted.predictor == "simulator" and options["overlap_grad_reduce"] is False
    assert options["profile"]["source"] == "measured by the ranks before and after their steps"
    assert {e["unit"] for e in options["profile"]["compute"]} == {"embedding", "block", "head"}
    assert rec.predicted.step_time_s == summary["predicted"]["step_time_s"]
    assert rec.workload == {"global_batch": 4, "seq_len": rec.plan["seq_len"], "precision": "fp32",
                            "recompute": "none", "optimizer": "adam", "attention": "fused"}
    assert rec.environment.devices == ("cpu", "cpu") and rec.environment.torch.startswith("2.")
    # The tied embedding / LM head bucket (fp32, 1 x the tiny vocabulary x 64) crosses the emulated link:
    # each rank timed gloo's own all-reduce of it, which the emulated delay then includes.
    transport = rec.emulation.details["real_transport_s"]
    assert sorted(transport) == ["0", "1"]
    for entries in transport.values():
        assert [(e["ranks"], e["bytes"]) for e in entries] == [([0, 1], summary["model"]["vocab_size"] * 64 * 4)]
        assert entries[0]["seconds"] > 0 and math.isfinite(entries[0]["seconds"])  # a time; no bound (shared machine)


def test_a_record_reloads_and_repredicts_to_the_recorded_step_time(emulated_run, tmp_path):
    summary, lines = emulated_run
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines * 2))
    proc = subprocess.run([sys.executable, "-m", "hetpart.cli.app", "predict", "--records", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["record"] for o in out] == [1, 2]
    for o in out:
        assert o["metrics"]["step_time_s"] == summary["predicted"]["step_time_s"]  # exactly
        assert o["graph_matches_record"] and o["recorded"]["step_time_s"] == summary["predicted"]["step_time_s"]
        assert o["comparable_with_measured"] and o["measured"]["step_time_s"] == summary["measured"]["step_time_s"]


def test_checkpoint_resume_continues_the_same_losses(emulated_run, tmp_path):
    summary, _ = emulated_run
    uninterrupted = summary["measured"]["losses"]  # steps 0, 1, 2 (emulation does not change numbers)
    plan = _pipeline_plan()
    ckpt = tmp_path / "ckpt"
    first = run_plan(plan, options=RunOptions(steps=1, warmup=0, emulate=False, checkpoint_dir=str(ckpt)),
                     run_dir=tmp_path / "first")
    assert (ckpt / "hetpart_checkpoint.json").exists()
    resumed = run_plan(plan, options=RunOptions(steps=2, warmup=0, emulate=False, checkpoint_dir=str(ckpt)),
                       run_dir=tmp_path / "resumed")
    assert first.measured.losses == pytest.approx(uninterrupted[:1], rel=1e-6)
    assert resumed.measured.losses == pytest.approx(uninterrupted[1:3], rel=1e-6)
    meta = json.loads((ckpt / "hetpart_checkpoint.json").read_text())
    assert meta["next_step"] == 3
    # the workers keep the identity of the model that ran, which the launcher checks before another run starts
    ident = prepare_run(plan, "gpt2-small", "tiny-mixed", RunOptions(steps=1)).checkpoint_identity
    assert ident and {k: meta[k] for k in ident} == ident
    with pytest.raises(HetpartError, match="holds a checkpoint of another size of the model .* run with --scale tiny"):
        run_plan(plan, options=RunOptions(steps=1, warmup=0, emulate=False, scale="small", checkpoint_dir=str(ckpt)),
                 run_dir=tmp_path / "other")


def test_run_prints_a_readable_summary(emulated_run, capsys):
    from hetpart.cli import run_cmd

    summary, _ = emulated_run

    class _Result:
        def summary(self):
            return summary

    run_cmd._show(_Result())
    text = " ".join(capsys.readouterr().out.split())
    assert "gpt2-small ran SHRUNKEN (tiny): hidden 64, 14 units" in text
    assert "emulated 200x slower than real" in text and "predicted" in text and "error" in text


def build_sequential_mlp():
    """A ``python:`` model for the run test: five sequential children."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))
    return model, (torch.randn(4, 32),)


def test_a_python_model_runs_as_given(tmp_path):
    plan = Plan(global_batch=4, micro_batch=1, seq_len=16, schedule="gpipe",
                replicas=(Replica(1.0, (Stage((0, 3), ("0/0/0",)), Stage((3, 5), ("1/0/0",)))),))
    result = run_plan(plan, "python:tests.test_runtime_run:build_sequential_mlp", "tiny-mixed",
                      RunOptions(steps=1, warmup=1, time_factor=100.0), run_dir=tmp_path / "run")
    summary = result.summary()
    assert not summary["model"]["shrunken"] and summary["model"]["num_units"] == 5
    assert summary["measured"]["step_time_s"] > 0 and summary["predicted"]["step_time_s"] > 0


def test_netem_shapes_real_traffic_or_is_refused_cleanly(tmp_path):
    from hetpart.runtime.netem import netem_unavailable

    why = netem_unavailable()
    options = RunOptions(steps=1, warmup=1, time_factor=300.0, netem=True, startup_timeout_s=120)
    if why is not None:
        with pytest.raises(RuntimeFault, match="--netem: .*; run without --netem"):
            run_plan(_pipeline_plan(), options=options, run_dir=tmp_path / "run")
        return
    result = run_plan(_pipeline_plan(), options=options, run_dir=tmp_path / "run")
    summary = result.summary()
    assert summary["emulation"]["links"] in ("bandwidth", "all")
    assert summary["measured"]["step_time_s"] > 0 and summary["predicted"]["step_time_s"] > 0
    import subprocess

    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"hp{os.getpid() % 100000}r0" not in namespaces  # the run removed its namespaces
