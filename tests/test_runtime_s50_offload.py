"""Host offloads the runtime runs on CPU ranks only: one rule in :mod:`hetpart.rules`, read by the engine, by
``hetpart run`` before any process starts, and by ``hetpart plan`` for a note.

Probe B item 12: ``plan --offload full`` gave one replica at TP 2, and the engine refused it on CUDA inside
every rank, with a rule that was nowhere in ``hetpart.rules``. The plan stays valid (DeepSpeed's
``offload_param`` runs it on one GPU; CPU ranks run it), so it is not part of ``Plan.validate``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetpart import load_cluster, load_model
from hetpart.errors import PlanError
from hetpart.plan import Plan, Replica, Stage
from hetpart.rules import RULES, accelerator_problems, check
from tests._cli import run_cli

ONE_REPLICA = Plan(global_batch=8, micro_batch=2, seq_len=128, zero=3, offload="full", replicas=(
    Replica(1.0, (Stage((0, 14), ("0/0/0", "0/0/1"), 2),)),))
TWO_REPLICAS = Plan(global_batch=8, micro_batch=2, seq_len=128, zero=3, offload="full", replicas=(
    Replica(0.5, (Stage((0, 14), ("0/0/0",)),)), Replica(0.5, (Stage((0, 14), ("1/0/0",)),))))


def test_the_rule_names_each_offload_the_accelerator_runtime_refuses() -> None:
    assert RULES.accelerator_offloads == ("none", "full") and RULES.accelerator_full_offload_min_replicas == 2
    one = accelerator_problems(ONE_REPLICA)
    assert one == ["offload: 'full' runs on FSDP2's CPUOffloadPolicy, which offloads what FSDP shards, and 1 replica "
                   "shards nothing; use 2 or more replicas, run on CPU ranks (--device cpu), or predict the plan"]
    assert accelerator_problems(TWO_REPLICAS) == []
    assert accelerator_problems(dataclasses.replace(ONE_REPLICA, offload="none", zero=0)) == []
    optimizer = accelerator_problems(dataclasses.replace(TWO_REPLICAS, offload="optimizer", zero=1))
    assert len(optimizer) == 1 and "offload: 'optimizer' keeps the optimizer on the host" in optimizer[0]


def test_the_plan_stays_valid() -> None:
    model, cluster = load_model("gpt2-small", seq_len=128), load_cluster("tiny-mixed")
    assert check(ONE_REPLICA, model, cluster) == [] and ONE_REPLICA.validate(model, cluster) == []


def test_run_refuses_it_on_gpus_before_any_process_starts(monkeypatch) -> None:
    from hetpart.runtime import launch

    monkeypatch.setattr(launch, "run_device", lambda options, ranks: "cuda")
    monkeypatch.setattr(launch, "check_gpu_memory", lambda *a: pytest.fail("refused after the memory check"))
    with pytest.raises(PlanError, match=r"^p\.json: offload: 'full' runs on FSDP2's CPUOffloadPolicy, .* and 1 "
                                        r"replica shards nothing; use 2 or more replicas"):
        launch.prepare_run(ONE_REPLICA, "gpt2-small", "tiny-mixed", launch.RunOptions(scale="tiny"), source="p.json")
    monkeypatch.setattr(launch, "check_gpu_memory", lambda *a: None)
    prep = launch.prepare_run(TWO_REPLICAS, "gpt2-small", "tiny-mixed", launch.RunOptions(scale="tiny"))
    assert prep.run_plan.offload == "full"


def test_cpu_ranks_still_run_it() -> None:
    from hetpart.runtime.launch import RunOptions, prepare_run

    prep = prepare_run(ONE_REPLICA, "gpt2-small", "tiny-mixed", RunOptions(scale="tiny", device="cpu"))
    assert (prep.run_plan.zero, prep.run_plan.offload, prep.run_plan.dp) == (3, "full", 1)


def test_plan_notes_a_plan_that_runs_on_cpu_ranks_only(capsys, tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("name: one\nnodes:\n"
                                       "  - {count: 1, gpus_per_node: 1, gpu: A100-80GB, intra_node: NVLink3, "
                                       "nic: IB-HDR}\n")
    common = ("plan", "--model", "gpt2-small", "--cluster", str(tmp_path / "one.yaml"), "--global-batch", "4",
              "--seq-len", "128", "--no-bound", "--json")
    code, _, err = run_cli(capsys, *common, "--offload", "full")
    assert code == 0, err
    assert err.count("hetpart: note: hetpart run executes this plan on CPU ranks only, and refuses it on GPUs: "
                     "offload: 'full'") == 1
    code, _, err = run_cli(capsys, *common)
    assert code == 0 and "CPU ranks only" not in err
