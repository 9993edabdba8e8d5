"""The catalogs hold what shared/CONTRACT.md promises, with published figures.

Parameter counts are checked against the model authors' published totals. GPU figures are checked
against the vendors' dense (never sparse) matrix peaks.
"""

from __future__ import annotations

import re

import pytest

from hetpart import load_cluster, load_model
from hetpart.catalog.hardware import GPU_CATALOG, LINK_CATALOG, NIC_CATALOG
from hetpart.catalog.models import MODEL_CATALOG
from hetpart.cluster import cluster_catalog

CONTRACT_MODELS = ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b",
                   "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                   "llama3-405b", "opt-350m", "bert-large"]
CONTRACT_GPUS = ["P100-16GB", "V100-16GB", "V100-32GB", "T4-16GB", "A10-24GB", "L4-24GB", "RTX3090-24GB",
                 "RTX4090-24GB", "A6000-48GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB",
                 "MI250X-GCD-64GB", "MI300X-192GB", "Ascend910B-64GB"]
CONTRACT_LINKS = ["PCIe3", "PCIe4", "PCIe5", "NVLink2", "NVLink3", "NVLink4", "xGMI", "HCCS"]
CONTRACT_NICS = ["Ethernet-10", "Ethernet-25", "Ethernet-100", "RoCE-100", "RoCE-200", "RoCE-400", "IB-EDR",
                 "IB-HDR", "IB-NDR"]

# Published totals with at least three significant digits: Hugging Face model cards / configs and
# the papers (GPT-2: HF; GPT-3 175B: Brown et al. 2020; Llama 2: Touvron et al. 2023; Llama 3: Meta).
PUBLISHED_PARAMS = {
    "gpt2-small": 124.44e6, "gpt2-medium": 354.82e6, "gpt2-large": 774.03e6, "gpt2-xl": 1557.6e6,
    "gpt3-175b": 174.6e9, "llama2-7b": 6.74e9, "llama2-13b": 13.02e9, "llama2-70b": 68.98e9,
    "llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.85e9, "opt-350m": 331.2e6,
    "bert-large": 336.2e6,
}
# Brown et al. (2020), Table 2.1 gives only the rounded model name for the smaller GPT-3 sizes.
GPT3_NOMINAL = {"gpt3-1.3b": 1.3e9, "gpt3-2.7b": 2.7e9, "gpt3-6.7b": 6.7e9}


def _closed_form_gpt_params(layers: int, hidden: int, vocab: int = 50257, positions: int = 2048) -> int:
    """GPT-2/3 parameters from the standard closed form (biases and LayerNorms included, tied head)."""
    return 12 * layers * hidden**2 + 13 * layers * hidden + (vocab + positions) * hidden + 2 * hidden


def test_every_contract_model_is_in_the_catalog() -> None:
    assert set(CONTRACT_MODELS) <= set(MODEL_CATALOG)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_within_one_percent_of_published(name: str) -> None:
    graph = load_model(name, seq_len=128)
    published = PUBLISHED_PARAMS[name]
    assert abs(graph.num_params - published) / published < 0.01, (name, graph.num_params, published)
    assert MODEL_CATALOG[name].published_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name, billions", [("llama2-7b", 6.74), ("llama2-70b", 68.98), ("gpt3-175b", 174.6)])
def test_headline_param_counts(name: str, billions: float) -> None:
    assert load_model(name, seq_len=128).num_params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("name", sorted(GPT3_NOMINAL))
def test_gpt3_small_sizes_round_to_their_published_name(name: str) -> None:
    # The paper's figure has two significant digits: the count must round to it.
    count = load_model(name, seq_len=128).num_params
    assert round(count / 1e9, 1) == pytest.approx(GPT3_NOMINAL[name] / 1e9)


def test_gpt3_13b_deviates_only_by_the_documented_width() -> None:
    # The paper's d_model 5140 is not divisible by its 40 heads; the catalog uses 5120 like every
    # implementation. The count must equal the closed form at 5120, and 5140 must give the 13.0B.
    cfg = MODEL_CATALOG["gpt3-13b"]
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads) == (5120, 40, 40)
    assert load_model("gpt3-13b", seq_len=128).num_params == _closed_form_gpt_params(40, 5120)
    assert _closed_form_gpt_params(40, 5140) / 1e9 == pytest.approx(13.0, rel=0.005)


@pytest.mark.parametrize("name", ["gpt2-small", "gpt3-6.7b", "gpt3-175b"])
def test_gpt_counts_match_the_closed_form(name: str) -> None:
    cfg = MODEL_CATALOG[name]
    expected = _closed_form_gpt_params(cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.max_positions)
    assert load_model(name, seq_len=128).num_params == expected


def test_catalog_models_are_consistent_shapes() -> None:
    for name, cfg in MODEL_CATALOG.items():
        assert cfg.hidden_size % cfg.num_heads == 0, name
        assert cfg.num_heads % cfg.kv_heads == 0, name
        graph = load_model(name, seq_len=64)
        assert graph.num_units == cfg.num_layers + 2, name
        assert [u.name for u in graph.units][:2] == ["embedding", "block_0"], name
        assert graph.units[-1].name == "head", name
        assert all(u.fwd_flops >= 0 and u.bwd_flops == pytest.approx(2 * u.fwd_flops) for u in graph.units), name


def test_llama_gqa_shapes_are_published_ones() -> None:
    assert MODEL_CATALOG["llama2-70b"].kv_heads == 8
    assert MODEL_CATALOG["llama2-7b"].kv_heads == 32
    assert MODEL_CATALOG["llama3-8b"].vocab_size == 128256
    assert not MODEL_CATALOG["llama2-7b"].tied_embeddings
    assert MODEL_CATALOG["gpt2-small"].tied_embeddings


# ------------------------------------------------------------------------------------------ hardware


def test_every_contract_hardware_name_is_in_the_catalog() -> None:
    assert set(CONTRACT_GPUS) <= set(GPU_CATALOG)
    assert set(CONTRACT_LINKS) <= set(LINK_CATALOG)
    assert set(CONTRACT_NICS) <= set(NIC_CATALOG)


# Dense bf16/fp16 tensor peaks from the vendors' datasheets (sparse figures are twice these).
DENSE_TFLOPS = {"H100-80GB": 989, "H200-141GB": 989, "A100-40GB": 312, "A100-80GB": 312, "V100-16GB": 125,
                "V100-32GB": 125, "L4-24GB": 121, "A10-24GB": 125, "A6000-48GB": 154.8, "MI300X-192GB": 1307.4,
                "MI250X-GCD-64GB": 191.5, "T4-16GB": 65}


@pytest.mark.parametrize("name, tflops", sorted(DENSE_TFLOPS.items()))
def test_gpu_peaks_are_dense_not_sparse(name: str, tflops: float) -> None:
    assert GPU_CATALOG[name].tflops_bf16 == pytest.approx(tflops, rel=0.01)


@pytest.mark.parametrize("name", sorted(GPU_CATALOG))
def test_gpu_entries_are_sane(name: str) -> None:
    gpu = GPU_CATALOG[name]
    assert gpu.name == name
    assert gpu.source, f"{name} has no source for its figures"
    assert gpu.vendor in ("nvidia", "amd", "huawei", "intel", "other")
    # 16-bit matrix units are faster than fp32 vector units on every listed part; no 16-bit figure
    # above the H100's 989 dense TFLOPS except the MI300X's 1307 (a larger chip, dense).
    assert gpu.tflops_fp32 < gpu.tflops_bf16 <= 1400
    assert 100 < gpu.hbm_gbyte_s < 10_000
    marketed = re.search(r"(\d+)GB$", name)
    assert marketed and float(marketed.group(1)) == gpu.memory_gb


def test_gpus_without_bf16_are_the_pre_ampere_nvidia_parts() -> None:
    no_bf16 = {n for n, g in GPU_CATALOG.items() if not g.supports_bf16}
    assert no_bf16 == {"P100-16GB", "V100-16GB", "V100-32GB", "T4-16GB", "RTX2080Ti-11GB", "TitanRTX-24GB"}


def test_fp8_and_tf32_exist_where_the_architecture_has_them() -> None:
    """fp8: Hopper, Ada, CDNA3 only; TF32: Ampere and later NVIDIA parts and CDNA3 (datasheets)."""
    fp8 = {g.arch for g in GPU_CATALOG.values() if g.supports_fp8}
    assert fp8 == {"hopper", "ada", "cdna3"}
    tf32 = {g.arch for g in GPU_CATALOG.values() if g.tflops_tf32 > 0}
    assert tf32 == {"ampere", "ada", "hopper", "cdna3"}
    for g in GPU_CATALOG.values():
        assert g.arch, f"{g.name} names no architecture"
        assert g.tflops_fp32 <= g.tflops("tf32") <= g.tflops_bf16, g.name
        assert not g.supports_fp8 or g.tflops_bf16 <= g.tflops_fp8, g.name
    h100 = GPU_CATALOG["H100-80GB"]
    assert (h100.tflops("fp8"), h100.tflops("tf32"), h100.tflops("fp32")) == (1979, 494.7, 67)
    assert GPU_CATALOG["V100-32GB"].tflops("tf32") == 15.7  # no TF32 units: the flag runs plain fp32
    with pytest.raises(ValueError, match="A100-80GB has no fp8 matrix units"):
        GPU_CATALOG["A100-80GB"].tflops("fp8")


def test_link_and_nic_figures() -> None:
    assert [LINK_CATALOG[n].bandwidth_gbyte_s for n in ("PCIe3", "PCIe4", "PCIe5")] == [15.75, 31.5, 63.0]
    assert [LINK_CATALOG[n].bandwidth_gbyte_s for n in ("NVLink2", "NVLink3", "NVLink4")] == [150, 300, 450]
    assert [NIC_CATALOG[n].bandwidth_gbit_s for n in ("IB-EDR", "IB-HDR", "IB-NDR")] == [100, 200, 400]
    assert NIC_CATALOG["IB-HDR"].bandwidth_gbyte_s == 25.0
    for nic in NIC_CATALOG.values():
        assert nic.rdma == (not nic.name.startswith("Ethernet")), nic.name
        assert nic.source and 0 < nic.latency_us < 100
    for link in LINK_CATALOG.values():
        assert link.source and 0 < link.latency_us < 100


def test_bundled_clusters_load_and_use_catalog_hardware() -> None:
    names = cluster_catalog()
    assert {"tiny-mixed", "a100-v100-16", "h100-a100-two-zones"} <= set(names)
    for name in names:
        cluster = load_cluster(name)
        assert cluster.num_devices == len(cluster.devices) > 0
        assert all(t in GPU_CATALOG for t in cluster.gpu_types), name
