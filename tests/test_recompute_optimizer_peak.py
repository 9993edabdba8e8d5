"""Two terms of the ``torch`` memory model for hetpart's runtime under full recomputation.

* The runtime checkpoints only units with an attention sublayer (``UnitModule.set_recompute``): the head's
  working set is its cross-entropy gradients alone, not its activations a second time.
* ``torch.optim.Adam``'s step holds a temporary of the second moments' square roots (4 bytes a parameter,
  foreach) beside every state, the activations freed: a full-recompute first stage peaked there (measured
  180.4 MB, 190.9 before the runtime's unit profile stopped leaking a block's forward, against 167.1 predicted
  without it, 2-stage small gpt2-small). torch's pipelining keeps its receive buffers through the step."""

import pytest

from hetpart import Plan, Replica, Stage, load_cluster, load_model
from hetpart.costmodel import Simulator
from hetpart.costmodel.activations import _head_outputs, unit_saved_bytes, unit_working_bytes
from hetpart.costmodel.memory import pipeline_recv_buffer_bytes

S = 128


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S, precision="fp32")


def test_full_recompute_adds_no_second_copy_of_the_heads_activations_under_torch(gpt2):
    work = unit_working_bytes(gpt2, "full", "fused", "torch")
    v = _head_outputs(gpt2.config)
    assert work[-1] == 8 * v * S  # the cross-entropy's gradients only (8 bytes a logit, measured)
    assert work[0] == 0.0
    block = unit_saved_bytes(gpt2, "none", "fused", "torch")[1]
    assert work[1] == block + 2 * 4 * gpt2.config.ffn * S  # a block is recomputed: its activations again
    fused = unit_working_bytes(gpt2, "full", "fused", "fused")  # Megatron's accounting unchanged
    assert fused[-1] == unit_saved_bytes(gpt2, "none", "fused", "fused")[-1] + 4 * v * S


def test_an_unsharded_full_recompute_stage_peaks_at_the_optimizer_step_under_torch(gpt2):
    plan = Plan(global_batch=8, micro_batch=4, seq_len=S, precision="fp32", recompute="full",
                replicas=(Replica(1.0, (Stage((0, 7), ("0/0/0",)), Stage((7, 14), ("0/0/1",)))),))
    cluster = load_cluster("tiny-mixed")
    params = sum(u.params for u in gpt2.units[:7])
    torch_gb = Simulator(gpt2, cluster, kernels="torch").simulate(plan).memory_gb["0/0/0"]
    buffers = pipeline_recv_buffer_bytes(gpt2, [(0, 7), (7, 14)], 0, 2, 4, 2, 2.0)  # 2 output gradients
    assert buffers == 2 * 4 * S * gpt2.config.hidden_size * 4
    # fp32 Adam: 16 bytes + the sqrt temporary
    assert torch_gb == pytest.approx((params * (16 + 4) + buffers) / 1e9, rel=1e-12)
    fused_gb = Simulator(gpt2, cluster).simulate(plan).memory_gb["0/0/0"]
    assert fused_gb < params * 20 / 1e9
