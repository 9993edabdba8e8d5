"""The memory model's terms for hetpart's runtime (``torch`` kernels) against live tensor bytes.

One micro-batch of the tiny gpt2-small runs forward and backward in this process, as a pipeline stage runs
it (its output, the logits, referenced until the backward as ``torch.distributed.pipelining`` keeps it), under
:class:`hetpart.runtime.live_memory.LiveTensorBytes`; the prediction is the weights, the gradients the
backward allocates, what the units keep and the largest working set."""

import pytest

torch = pytest.importorskip("torch")

from hetpart.costmodel.activations import (unit_held_bytes, unit_kept_bytes, unit_params_split,  # noqa: E402
                                           unit_replicated_bytes, unit_saved_bytes, unit_working_bytes)
from hetpart.costmodel.memory import PrefixTables, stage_memory_gb, stage_params_per_device  # noqa: E402
from hetpart.graph.transformer import transformer_graph  # noqa: E402


@pytest.fixture(scope="module")
def spec():
    from hetpart.runtime.models import runnable_spec

    return runnable_spec("gpt2-small", "tiny")


@pytest.fixture(scope="module")
def tiny(spec):
    return transformer_graph(spec.config, "gpt2-small@tiny", 32, 4)


def test_the_head_holds_its_logits_under_torch_only(tiny):
    v, s = tiny.config.vocab_size, tiny.seq_len
    assert unit_held_bytes(tiny, "torch")[-1] == 4 * v * s
    assert sum(unit_held_bytes(tiny, "torch")[:-1]) == 0
    assert unit_held_bytes(tiny, "fused") == [0.0] * tiny.num_units
    kept = unit_kept_bytes(tiny, "none", "fused", "torch")
    assert kept[-1] == unit_saved_bytes(tiny, "none", "fused", "torch")[-1] + 4 * v * s


def test_runtime_tensor_parallelism_keeps_embedding_head_and_residual_stream_whole(tiny):
    split = unit_params_split(tiny, "torch")
    assert split == [u.kind == "block" for u in tiny.units]
    assert unit_params_split(tiny, "fused") == [True] * tiny.num_units
    h, s = tiny.config.hidden_size, tiny.seq_len
    whole = unit_replicated_bytes(tiny, "none", "fused", "torch")
    assert whole[1] == (16 * h + 16) * s  # fp32: two residual sums, two norm outputs, the norms' statistics
    assert whole[-1] == unit_kept_bytes(tiny, "none", "fused", "torch")[-1]
    assert unit_replicated_bytes(tiny, "none", "fused", "fused") == [0.0] * tiny.num_units
    emb, head = tiny.units[0].params, tiny.units[-1].params
    blocks = sum(u.params for u in tiny.units[1:-1])
    assert stage_params_per_device(tiny, 0, tiny.num_units, 2, "torch") == pytest.approx(emb + head + blocks / 2)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_prefix_tables_match_the_stage_sums_under_torch(tiny, recompute, tp):
    import numpy as np

    t = PrefixTables(tiny, "torch")
    for a, z in ((0, 14), (0, 7), (7, 14), (3, 9)):
        want = stage_memory_gb(tiny, a, z, tp, 2, 3, recompute, "fp32", kernels="torch")
        assert t.memory_gb(a, z, tp, 2, 3, recompute, precision="fp32") == pytest.approx(want, rel=1e-12)
    a, z = np.array([0, 0, 7, 3]), np.array([14, 7, 14, 9])
    code = ("none", "selective", "full").index(recompute)
    many = t.working_gb_many(a, z, np.full(4, float(tp)), np.full(4, 2.0), np.full(4, code))
    one = [t.working_gb(int(x), int(y), tp, 2, recompute) for x, y in zip(a, z)]
    assert many.tolist() == pytest.approx(one, rel=1e-12)


def test_one_micro_batch_peak_is_predicted_to_one_percent(spec, tiny):
    """Weights and gradients (4 bytes each, fp32), the units' kept activations and the largest working set,
    against the live bytes of a second micro-batch's forward and backward (b = 2, s = 32)."""
    from hetpart.runtime.engine import loss_fn_for
    from hetpart.runtime.live_memory import LiveTensorBytes
    from hetpart.runtime.models import build_units

    torch.manual_seed(0)
    b, s = 2, tiny.seq_len
    units = build_units(spec, range(tiny.num_units))
    owners = {key: u.get_parameter(local) for u in units for local, key in u.canonical_names().items()
              if local.removeprefix("body.") not in u.tied}
    for u in units:  # the head uses the embedding's tensor, as the runtime ties them (Executor._tie_local)
        for short, key in u.tied.items():
            parent, _, leaf = f"body.{short}".rpartition(".")
            setattr(u.get_submodule(parent), leaf, owners[key])
    params = list({id(p): p for u in units for p in u.parameters()}.values())
    loss_fn = loss_fn_for(spec, 1.0)
    ids = torch.randint(0, spec.config.vocab_size, (b, s))

    def micro_batch():
        x = ids
        for u in units:
            x = u(x)
        loss_fn(x, ids).backward()  # x, the logits, stays referenced as the pipeline's forward cache keeps it

    micro_batch()  # the gradients exist from the first micro-batch's backward on: the second one peaks
    with LiveTensorBytes().hold(params + [p.grad for p in params]) as mem:
        micro_batch()
    n = sum(p.numel() for p in params)
    assert n == tiny.num_params
    kept = sum(unit_kept_bytes(tiny, "none", "fused", "torch")) * b
    work = max(unit_working_bytes(tiny, "none", "fused", "torch")) * b
    predicted = n * 4 + n * 4 + kept + work
    assert predicted == pytest.approx(mem.peak_bytes, rel=0.01)
