"""Probe B (2026-11-30) findings F6, F8, F9, F11, F12: inputs refused in one line (exit 2) that name the real cause."""

from __future__ import annotations

from pathlib import Path

from tests._cli import cli_json, run_cli

G_FAST = "{name: G, tflops_bf16: 300, memory_gb: 80, hbm_gbyte_s: 2000, vendor: nvidia}"
G_SLOW = "{name: G, tflops_bf16: 30, memory_gb: 16, hbm_gbyte_s: 300, vendor: nvidia}"


def _error(capsys, *argv: str) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("hetpart: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def _cluster(tmp_path: Path, *nodes: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nnodes:\n" + "".join(f"  - {n}\n" for n in nodes))
    return str(path)


def test_f6_two_inline_gpus_with_one_name_and_other_specs_are_refused(capsys, tmp_path: Path) -> None:
    path = _cluster(tmp_path, f"{{count: 1, gpus_per_node: 4, gpu: {G_FAST}, intra_node: NVLink3, nic: IB-HDR}}",
                    f"{{count: 1, gpus_per_node: 4, gpu: {G_SLOW}, intra_node: PCIe4, nic: IB-HDR}}")
    err = _error(capsys, "inspect", "cluster", path)
    assert err == (f"hetpart: error: {path}: nodes[1].gpu.name: 'G' is already defined with other specs "
                   "(nodes[0].gpu); give it another name\n")
    err = _error(capsys, "plan", "-m", "gpt2-small", "-c", path, "--global-batch", "16", "--seq-len", "512")
    assert "nodes[1].gpu.name: 'G' is already defined with other specs" in err


def test_f6_inside_a_mixed_node_list_too(capsys, tmp_path: Path) -> None:
    path = _cluster(tmp_path, f"{{count: 1, gpus: [{{gpu: {G_FAST}, count: 2}}, {{gpu: {G_SLOW}, count: 2}}], "
                              "intra_node: PCIe4, nic: IB-HDR}")
    err = _error(capsys, "inspect", "cluster", path)
    assert "nodes[0].gpus[1].gpu.name: 'G' is already defined with other specs (nodes[0].gpus[0].gpu)" in err


def test_f6_one_name_with_identical_specs_stays_fine(capsys, tmp_path: Path) -> None:
    path = _cluster(tmp_path, f"{{count: 1, gpus_per_node: 2, gpu: {G_FAST}, intra_node: NVLink3, nic: IB-HDR}}",
                    f"{{count: 1, gpus_per_node: 2, gpu: {G_FAST}, intra_node: PCIe4, nic: IB-HDR}}")
    code, _, err = run_cli(capsys, "inspect", "cluster", path)
    assert code == 0, err


def test_f8_devices_below_the_reserve_are_named_not_given_negative_gigabytes(capsys, tmp_path: Path) -> None:
    tiny = "{name: Tiny, tflops_bf16: 10, memory_gb: 0.05, hbm_gbyte_s: 100, vendor: nvidia}"
    path = _cluster(tmp_path, f"{{count: 1, gpus_per_node: 2, gpu: {tiny}, intra_node: PCIe4, nic: Ethernet-10}}")
    for planner in ("search", "uniform"):
        err = _error(capsys, "plan", "-m", "gpt2-small", "-c", path, "--global-batch", "16", "--seq-len", "512",
                     "--planner", planner)
        assert err == (f"hetpart: error: {planner} planner: no plan for gpt2-small fits x: the devices' memory "
                       "(Tiny 0.05 GB) is below the runtime's reserve (1.5 GB of framework overhead plus 5% for "
                       "fragmentation), so nothing can be placed on them; check memory_gb (GiB, e.g. 80 for an "
                       "80 GB card) or use GPUs with more memory\n")
        assert "-" not in err.split("fits x:")[1].split("GB")[0]
