"""Tied embeddings' gradients as the engine syncs them (``Simulator._tied_pairs``).

Megatron-LM (kernels ``fused``) reduces the head's copy of the word embedding with the rest of the last stage's
gradients in that stage's data-parallel buffer, then ``finalize_model_grads`` all-reduces it with the embedding
in each pipeline's 2-member embedding group, after ``finish_grad_sync``; hetpart's runtime (kernels ``torch``)
reduces the tied weight once, in one bucket over every rank holding a copy."""

from __future__ import annotations

import pytest

from hetpart import load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.collectives import allreduce_time_s
from hetpart.costmodel.simulator import Simulator, grad_reduce_bytes
from hetpart.plan import Plan, Replica, Stage

TWO_NODES = {"name": "two-3090-nodes", "nodes": [
    {"count": 2, "gpus_per_node": 4, "gpu": "RTX3090-24GB", "intra_node": "PCIe4", "nic": "Ethernet-10"}]}


def _pipelines(dp: int) -> Plan:
    """``dp`` two-stage replicas: stage 0 on node 0, stage 1 on node 1 (the embedding and its copy apart)."""
    return Plan(global_batch=8 * dp, micro_batch=1, seq_len=1024, replicas=tuple(
        Replica(1.0 / dp, (Stage((0, 13), (f"0/0/{r}",)), Stage((13, 26), (f"0/1/{r}",)))) for r in range(dp)))


@pytest.fixture(scope="module")
def case():
    return load_model("gpt2-medium", seq_len=1024), parse_cluster(TWO_NODES)


def test_megatron_reduces_the_copy_in_its_stage_then_one_pair_per_pipeline(case):
    model, cluster = case
    plan = _pipelines(4)
    fused, torch = Simulator(model, cluster, kernels="fused"), Simulator(model, cluster, kernels="torch")
    copy_bytes = model.units[-1].shared_params * grad_reduce_bytes(plan.precision)
    assert copy_bytes == 50257 * 1024 * 4  # vocabulary x hidden, fp32 gradients
    runs = {False: None, True: None}
    for sim, pairs in ((fused, True), (torch, False)):
        segments = sim._dp_segments_small(plan)
        tied = [seg for seg in segments if seg.a < 0]
        head_run = next(seg for seg in segments if seg.a == 13)
        runs[pairs] = head_run.nbytes
        if pairs:  # one pair per pipeline: its two stages
            assert [sorted(seg.holders) for seg in tied] == [[(r, 0), (r, 1)] for r in range(4)]
        else:  # one ring over every replica's first and last stage
            assert len(tied) == 1 and len(tied[0].holders) == 8
        assert all(seg.nbytes == copy_bytes for seg in tied)
    assert runs[True] - runs[False] == pytest.approx(copy_bytes)  # the copy rides in its stage's buffer


def test_the_pairs_follow_the_data_parallel_sync_and_cost_a_two_member_all_reduce(case):
    model, cluster = case
    plan = _pipelines(4)
    sim = Simulator(model, cluster, kernels="fused")
    events = [e for e in sim.simulate(plan, trace=True).timeline if e["kind"] == "dp_sync"]
    by_device: dict = {}
    for e in events:
        by_device.setdefault((e["replica"], e["stage"]), []).append((e["start_s"], e["end_s"]))
    for spans in by_device.values():  # the stage's ring, then its pair: one after the other
        assert len(spans) == 2 and spans[1][0] >= spans[0][1] - 1e-12
    # one pipeline alone: its pair is a 2-member all-reduce across the Ethernet link
    alone = _pipelines(1)
    pair = [e for e in Simulator(model, cluster).simulate(alone, trace=True).timeline if e["kind"] == "dp_sync"][0]
    nbytes = model.units[-1].shared_params * grad_reduce_bytes(alone.precision)
    assert pair["end_s"] - pair["start_s"] == pytest.approx(allreduce_time_s(nbytes, ("0/0/0", "0/1/0"), cluster))


def test_four_pairs_share_the_nic_where_one_ring_shared_it_once(case):
    """Four pairs leave node 0 at once (each moves the whole copy), where the one ring over eight members moved
    about twice the copy per NIC: Megatron's pairs cost more over a slow link (gpt2-medium, 10 Gbit/s)."""
    model, cluster = case
    plan = _pipelines(4)
    fused = Simulator(model, cluster, kernels="fused").simulate(plan)
    torch = Simulator(model, cluster, kernels="torch").simulate(plan)
    dp = {k: max(b["dp_comm_s"] for b in p.breakdown) for k, p in (("fused", fused), ("torch", torch))}
    assert dp["fused"] > 1.5 * dp["torch"]
