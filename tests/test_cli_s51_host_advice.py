"""The no-plan advice counts host memory: offload is advised only where the nodes' host memory holds what it
moves there, and an offloaded workload that host memory cannot hold says so (the user-journey probe of
2026-12-01: llama3-405b on tiny-mixed was told to offload, then, offloaded, "the states alone need 0.0 GB ...
try a smaller --global-batch", while 6,494 GB of states met 240 GB of host memory)."""

from __future__ import annotations

from pathlib import Path

from tests._cli import one_line_exit_2, run_cli

PLAN = ["plan", "--model", "llama3-405b", "--cluster", "tiny-mixed", "--global-batch", "8", "--no-bound"]


def test_no_offload_advice_where_host_memory_cannot_hold_the_states(capsys) -> None:
    code, _, err = run_cli(capsys, *PLAN)
    line = one_line_exit_2(code, err, "offload cannot help: --offload optimizer needs 6493.7 GB of host memory and "
                                      "the nodes hold 240.5 GB in all")
    assert "keep the optimizer in host memory" not in line and "--offload full with --zero 3" not in line


def test_an_offloaded_workload_says_host_memory_binds(capsys) -> None:
    code, _, err = run_cli(capsys, *PLAN, "--offload", "full", "--zero", "3")
    line = one_line_exit_2(code, err, "host memory binds: --offload full needs 7305.4 GB of host memory and the "
                                      "nodes hold 240.5 GB in all", "host_memory_gb")
    assert "need 0.0 GB" not in line and "--global-batch" not in line


def test_offload_is_still_advised_where_host_memory_holds_it(capsys, tmp_path: Path) -> None:
    cluster = tmp_path / "big-host.yaml"
    cluster.write_text("name: big-host\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: RTX4090-24GB, intra_node: "
                       "PCIe4, nic: Ethernet-25, host_memory_gb: 256}\n")
    code, _, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--cluster", str(cluster), "--global-batch", "64",
                           "--seq-len", "2048", "--no-bound")
    assert one_line_exit_2(code, err, "keep the optimizer in host memory (--offload optimizer")
