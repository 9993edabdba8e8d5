"""Probe s46, finding 3: where the model states bind a planner's own space, its failure advice leads with
what shrinks the states (offload, checked by the planner's own memory rule; --planner search; more
devices) and says nothing of a smaller batch, which cannot help."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpart import Workload, load_cluster, load_model
from hetpart.errors import WorkloadError
from hetpart.policies.common import no_plan_error
from hetpart.policies.planner import plan

LAB = ("name: lab-4090-a6000\nnodes:\n"
       "  - {count: 1, gpus_per_node: 4, gpu: RTX4090-24GB, intra_node: PCIe4, nic: Ethernet-25}\n"
       "  - {count: 1, gpus_per_node: 2, gpu: A6000-48GB, intra_node: PCIe4, nic: Ethernet-25}\n")


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> tuple:
    path = tmp_path_factory.mktemp("lab") / "lab.yaml"
    path.write_text(LAB)
    return load_model("llama3-8b", seq_len=2048), load_cluster(path)


@pytest.mark.parametrize("planner", ["uniform", "proportional"])
def test_states_bound_advice_leads_with_offload_and_never_the_batch(lab, planner) -> None:
    model, cluster = lab
    with pytest.raises(WorkloadError) as info:
        plan(model, cluster, Workload(64, 2048), planner)
    text = str(info.value)
    assert "so a smaller --global-batch cannot help" in text
    assert "try --offload optimizer (the optimizer in host memory: a plan of this planner then fits), --planner search" in text
    assert "try a smaller --global-batch" not in text and "--recompute full" not in text
    # what it says works does; what it says cannot help does not (the probe's --global-batch 8 and --zero 3)
    offloaded = plan(model, cluster, Workload(64, 2048, offload="optimizer"), planner)
    assert offloaded.prediction.metrics["fits_in_memory"] is True and offloaded.plan.offload == "optimizer"
    for smaller in (Workload(8, 2048), Workload(64, 2048, zero=3)):
        with pytest.raises(WorkloadError, match="cannot help"):
            plan(model, cluster, smaller, planner)


def test_search_fits_where_the_baselines_say_it_may(lab) -> None:
    model, cluster = lab
    found = plan(model, cluster, Workload(64, 2048), "search")
    assert found.prediction.metrics["fits_in_memory"] is True and found.plan.offload == "none"


def test_activation_bound_advice_keeps_the_batch_and_recompute(lab) -> None:
    model, cluster = lab
    small = load_model("gpt2-small", seq_len=1024)  # fits the lab easily: what binds is the workload
    text = str(no_plan_error(small, cluster, Workload(64, 1024, recompute="none"), "uniform", "nothing fits"))
    assert "try --recompute full (or auto), a smaller --global-batch" in text and "cannot help" not in text
    assert text.endswith(", or keep the optimizer in host memory (--offload optimizer)")
    assert model.num_params > small.num_params


def test_offload_auto_drops_the_offload_advice(lab) -> None:
    model, cluster = lab
    text = str(no_plan_error(model, cluster, Workload(64, 2048, offload="optimizer"), "uniform", "nothing fits"))
    assert "--offload optimizer" not in text  # offloaded already: the advice is about what is left
    assert "the 16-bit weights (the rest offloaded) alone need 16.1 GB" in text


def test_states_beyond_all_memory_lead_with_offload_where_the_weights_fit(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    # 256 GB of host memory holds the offloaded 128.5 GB (the assumed 2x device memory, 103 GB, would not)
    path.write_text("name: two\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: RTX4090-24GB, intra_node: PCIe4, "
                    "nic: Ethernet-25, host_memory_gb: 256}\n")
    model, cluster = load_model("llama3-8b", seq_len=2048), load_cluster(path)
    text = str(no_plan_error(model, cluster, Workload(64, 2048), "search", "the model states alone exceed"))
    assert "alone need 144.5 GB and the cluster's devices hold 46.0 GB usable in all; keep the optimizer in host " \
           "memory (--offload optimizer: ZeRO-Offload leaves the 16-bit weights, 16.1 GB, on the devices), use a " \
           "smaller model" in text
