"""Notes that the user-journey probe of 2026-12-01 missed or found out of place: an inline GPU without
``tflops_fp32`` is priced at a guessed bf16/8 with one note saying so (it was silent: a 4x error on Ada cards in
fp32), and a command that fails prints its error line alone, with no note before it (``run --nnodes 3`` printed
its no-emulation remark, then the refusal)."""

from __future__ import annotations

from pathlib import Path

from tests._cli import cli_json, one_line_exit_2, run_cli

INLINE = """name: inl
nodes:
  - count: 1
    gpus_per_node: 2
    gpu: {{name: X1, tflops_bf16: 100, memory_gb: 24, hbm_gbyte_s: 900, vendor: nvidia{extra}}}
    intra_node: PCIe4
    nic: Ethernet-10
"""
GRID = ["--model", "gpt2-small", "--global-batch", "8", "--seq-len", "128", "--pp", "1", "--dp", "1",
        "--micro-batch", "1", "--json"]


def test_an_inline_gpu_without_fp32_is_noted_once(capsys, tmp_path: Path) -> None:
    cluster = tmp_path / "inl.yaml"
    cluster.write_text(INLINE.format(extra=""))
    code, _, err = run_cli(capsys, "predict", "--cluster", str(cluster), "--tp", "1", *GRID)
    assert code == 0
    assert err == (f"hetpart: note: {cluster}: nodes[0].gpu: X1 gives no tflops_fp32; assumed 12.5 (tflops_bf16 100 "
                   "/ 8); set nodes[0].gpu.tflops_fp32 (the card's dense fp32 TFLOPS, from its data sheet) to price "
                   "fp32 work right\n")
    cluster.write_text(INLINE.format(extra=", tflops_fp32: 50"))
    code, _, err = run_cli(capsys, "predict", "--cluster", str(cluster), "--tp", "1", *GRID)
    assert code == 0 and err == ""


def test_a_failure_prints_its_error_line_alone(capsys, tmp_path: Path) -> None:
    cluster = tmp_path / "inl.yaml"
    cluster.write_text(INLINE.format(extra=""))
    code, _, err = run_cli(capsys, "predict", "--cluster", str(cluster), "--tp", "5", *GRID)
    assert one_line_exit_2(code, err, "--tp: 5")


def test_run_over_machines_refused_prints_no_remark_first(capsys, tmp_path: Path) -> None:
    cluster = tmp_path / "one.yaml"
    cluster.write_text("name: one\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: A100-80GB, intra_node: NVLink3, "
                       "nic: Ethernet-10}\n")
    plan = tmp_path / "p.json"
    cli_json(capsys, "plan", "--model", "gpt2-small", "--cluster", str(cluster), "--global-batch", "8", "--seq-len",
             "64", "--planner", "uniform", "--no-bound", "--out", str(plan), "--json")
    code, _, err = run_cli(capsys, "run", str(plan), "--steps", "1", "--nnodes", "3", "--master-addr", "127.0.0.1")
    assert one_line_exit_2(code, err, "--nnodes: 3, but the plan uses 1 cluster node")
