"""hetpart's runtime shards no tied weight: the ``torch`` kernel set keeps a tied embedding's states whole.

The runtime leaves a key that several units hold (GPT-2's token embedding, owned by the embedding and copied
by the head) out of FSDP2 and out of the uneven distributed optimizer (``_tied_keys`` in
:mod:`hetpart.runtime.sharded`); measured on 2-rank ZeRO-1 runs its weight and two Adam moments were whole on
the rank holding 0.25 of the shards (51.5 MB of 115 held). Megatron's distributed optimizer shards them like
any other's, so the default ``fused`` accounting shards them."""

import pytest

from hetpart import Plan, Replica, Stage, load_cluster, load_model
from hetpart.costmodel import Simulator
from hetpart.costmodel.sharding import tied_params_held

S = 128


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S, precision="fp32")


def _plan(zero: int, fractions=(0.75, 0.25)) -> Plan:
    return Plan(global_batch=8, micro_batch=2, seq_len=S, precision="fp32", zero=zero, shard_fractions=fractions,
                replicas=tuple(Replica(0.5, (Stage((0, 14), (d,)),)) for d in ("0/0/0", "0/0/1")))


def test_tied_params_held_counts_the_embedding_once_where_owner_or_copy_is(gpt2):
    tied = gpt2.units[-1].shared_params
    assert tied == 50257 * 768
    assert tied_params_held(gpt2, 0, 14) == tied  # owner and copy on one device: once
    assert tied_params_held(gpt2, 0, 1) == tied
    assert tied_params_held(gpt2, 13, 14) == tied  # the head's copy
    assert tied_params_held(gpt2, 1, 13) == 0.0


@pytest.mark.parametrize("zero, sharded_bytes", [(1, 8), (2, 12)])
def test_only_untied_states_follow_the_shard_fraction_under_torch(gpt2, zero, sharded_bytes):
    cluster = load_cluster("tiny-mixed")
    params, tied = sum(u.params for u in gpt2.units), gpt2.units[-1].shared_params
    for kernels, sharded in (("torch", params - tied), ("fused", params)):
        mem = Simulator(gpt2, cluster, kernels=kernels).simulate(_plan(zero)).memory_gb
        # fp32 Adam: the moments (8 bytes) at level 1, the gradient too (12) at level 2, by 0.75 - 0.25
        assert mem["0/0/0"] - mem["0/0/1"] == pytest.approx(sharded * sharded_bytes * 0.5 / 1e9, rel=1e-9)
