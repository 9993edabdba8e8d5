"""Device memory: Korthikanti accounting, micro-batches in flight, and the simulator's fast tables."""

import pytest

from hetpart import Plan, Replica, Stage, load_cluster, load_model
from hetpart.catalog.hardware import GPU_CATALOG
from hetpart.costmodel import Simulator, in_flight_microbatches, memory_capacity_gb, megatron_plan, \
    stage_memory_gb, stage_params_per_device
from hetpart.costmodel.memory import FRAMEWORK_OVERHEAD_GB, state_bytes_per_param
from hetpart.workload import Workload

S = 128
WORK = 2 * 2 * 4 * 768 * S
"""A gpt2-small block's backward working set per sequence: two 16-bit f-wide gradients (f = 4 h)."""
BF16_ADAM = 18
"""Adam under bf16: 16-bit weights (2), fp32 gradients (4), fp32 master (4) and moments (8)."""


@pytest.mark.parametrize("precision, optimizer, zero, expected", [
    # Megatron-LM's distributed-optimizer table (docs/source/distrib_optimizer.md): d replicas shard
    ("bf16", "adam", 0, 18.0), ("bf16", "adam", 1, 6 + 12 / 8), ("fp32", "adam", 0, 16.0),
    ("fp32", "adam", 1, 8 + 8 / 8),
    # the ZeRO paper's fp16 accounting (Rajbhandari et al. 2020: 2 + 2 + K, K = 12)
    ("fp16", "adam", 0, 16.0), ("fp16", "adam", 1, 4 + 12 / 8), ("fp16", "adam", 2, 2 + 14 / 8),
    ("fp16", "adam", 3, 16 / 8),
    ("bf16", "sgd", 0, 2 + 4 + 4 + 4), ("bf16", "adam8bit", 0, 2 + 4 + 4 + 2), ("fp32", "sgd", 0, 12.0),
])
def test_state_bytes_follow_the_engines_tables(precision, optimizer, zero, expected):
    from hetpart.costmodel.sharding import sharded_state_bytes

    assert sharded_state_bytes(1.0, precision, zero, 1 / 8, optimizer) == pytest.approx(expected)
    if zero == 0:
        assert state_bytes_per_param(optimizer, precision) == pytest.approx(expected)


def test_bf16_gradients_are_kept_in_the_bytes_the_all_reduce_moves():
    """The data-parallel reduction and the memory model price one gradient dtype: what the simulator reduces
    is what the devices hold (fp32 under bf16, Megatron-LM's main-gradient buffer; fp16 under fp16)."""
    from hetpart.costmodel.memory import GRAD_BYTES
    from hetpart.costmodel.sharding import state_bytes
    from hetpart.costmodel.simulator import grad_reduce_bytes

    for precision in ("bf16", "fp16", "fp32", "fp8"):
        assert state_bytes(precision)[1] == grad_reduce_bytes(precision) == GRAD_BYTES[precision]


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2-small", seq_len=S)


def test_block_memory_is_korthikanti_per_mode(gpt2):
    h, a, b = 768, 12, 2
    block = gpt2.units[1]
    states = block.params * BF16_ADAM + WORK * b  # + the running block's working set
    # eager attention stores the a s^2 scores and softmax (Korthikanti et al. 2022)
    none = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=1, recompute="none", attention="eager")
    assert none * 1e9 == pytest.approx(states + (34 * S * h + 5 * a * S * S) * b)
    selective = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=1, recompute="selective")
    # fused attention (the default): flash keeps an fp32 log-sum-exp per head and token
    assert selective * 1e9 == pytest.approx(states + (34 * S * h + 4 * a * S) * b)
    full = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=3, recompute="full", attention="eager")
    # 2sbh kept per micro-batch in flight, plus one layer's activations live while it is recomputed
    assert full * 1e9 == pytest.approx(states + 2 * S * h * b * 3 + (34 * S * h + 5 * a * S * S) * b)


def test_fused_attention_stores_no_score_matrix(gpt2):
    """Flash / SDPA attention (the default) keeps no a s^2 term, with or without recomputation."""
    h, a, b = 768, 12, 2
    states = gpt2.units[1].params * BF16_ADAM + WORK * b
    none = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=1, recompute="none")
    assert none * 1e9 == pytest.approx(states + (34 * S * h + 4 * a * S) * b)  # + flash's fp32 log-sum-exp
    full = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=3, recompute="full")
    assert full * 1e9 == pytest.approx(states + 2 * S * h * b * 3 + (34 * S * h + 4 * a * S) * b)
    eager = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=b, in_flight=1, recompute="none", attention="eager")
    assert eager > none


@pytest.mark.parametrize("optimizer, state_bytes", [("adam", 16), ("sgd", 12), ("adam8bit", 10)])
def test_optimizer_sets_the_model_state_bytes(gpt2, optimizer, state_bytes):
    block = gpt2.units[1]
    adam = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=1, in_flight=1, recompute="full")
    other = stage_memory_gb(gpt2, 1, 2, tp=1, micro_batch=1, in_flight=1, recompute="full", optimizer=optimizer)
    assert (adam - other) * 1e9 == pytest.approx(block.params * (16 - state_bytes))


def test_tensor_parallelism_divides_states_and_activations(gpt2):
    one = stage_memory_gb(gpt2, 1, 5, tp=1, micro_batch=1, in_flight=2, recompute="selective")
    four = stage_memory_gb(gpt2, 1, 5, tp=4, micro_batch=1, in_flight=2, recompute="selective")
    assert four == pytest.approx(one / 4)


def test_tied_embedding_copy_counts_on_the_head_stage_only_without_the_embedding(gpt2):
    n = gpt2.num_units
    vocab_rows = gpt2.units[-1].shared_params
    assert vocab_rows > 0
    alone = stage_params_per_device(gpt2, n - 1, n, tp=1)
    together = stage_params_per_device(gpt2, 0, n, tp=1)
    assert alone == gpt2.units[-1].params + vocab_rows
    assert together == gpt2.num_params


@pytest.mark.parametrize("schedule,stage,expected", [("gpipe", 2, 12), ("1f1b", 0, 4), ("1f1b", 3, 1),
                                                     ("1f1b", 1, 3)])
def test_in_flight_microbatches(schedule, stage, expected):
    assert in_flight_microbatches(schedule, stage, 4, 12) == expected


def test_in_flight_is_capped_by_the_microbatches():
    assert in_flight_microbatches("1f1b", 0, 8, 3) == 3


def test_interleaving_costs_korthikantis_extra_factor_on_the_first_stage():
    pp, v, m = 4, 3, 24
    assert in_flight_microbatches("interleaved", 0, pp, m, v) == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_capacity_counts_marketed_gib_and_leaves_room_for_the_framework():
    a100 = GPU_CATALOG["A100-80GB"]
    physical_gb = 80 * 2**30 / 1e9  # "80GB" of HBM is 80 GiB (nvidia-smi: 81,920 MiB)
    assert memory_capacity_gb(a100) < physical_gb - FRAMEWORK_OVERHEAD_GB
    assert memory_capacity_gb(a100) > 0.9 * physical_gb - FRAMEWORK_OVERHEAD_GB
    assert memory_capacity_gb(a100) > a100.memory_gb - FRAMEWORK_OVERHEAD_GB - 0.5  # not the 10^9-byte reading


def test_simulator_memory_matches_the_reference_accounting(gpt2):
    cluster = load_cluster("a100-8")
    plan = Plan(global_batch=8, micro_batch=2, seq_len=S, recompute="full", replicas=(
        Replica(1.0, (Stage((0, 5), ("0/0/0", "0/0/1"), 2), Stage((5, 9), ("0/0/2",), 1),
                      Stage((9, 14), ("0/0/3", "0/0/4"), 2))),))
    pred = Simulator(gpt2, cluster).simulate(plan)
    m = 4
    for d, stage in enumerate(plan.replicas[0].stages):
        flight = in_flight_microbatches("1f1b", d, 3, m)
        ref = stage_memory_gb(gpt2, *stage.layers, stage.tp, 2, flight, "full")
        for dev in stage.devices:
            assert pred.memory_gb[dev] == pytest.approx(ref, rel=1e-12)
    assert pred.metrics["peak_memory_gb"] == {"A100-80GB": pytest.approx(max(pred.memory_gb.values()))}


def test_a_model_too_big_for_the_device_does_not_fit():
    model = load_model("llama2-13b", seq_len=1024)
    cluster = load_cluster("tiny-mixed")
    plan = megatron_plan(model, cluster, Workload(4, 1024), tp=1, pp=1, dp=1, micro_batch=1)
    pred = Simulator(model, cluster).simulate(plan)
    assert not pred.fits_in_memory and not pred.metrics["fits_in_memory"]
    assert pred.memory_gb["0/0/0"] > 13e9 * 16 / 1e9


def test_prefix_tables_match_the_reference_on_seeded_random_stages():
    import random

    from hetpart.costmodel.memory import PrefixTables

    rng = random.Random(5)
    for name in ("gpt2-small", "llama2-7b"):  # tied and untied embeddings
        model = load_model(name, seq_len=S)
        tables = PrefixTables(model)
        n = model.num_units
        for _ in range(200):
            a = rng.randrange(n)
            z = rng.randrange(a + 1, n + 1)
            tp, mb, flight = rng.choice([1, 2, 4]), rng.choice([1, 3]), rng.choice([1.0, 2.5, 7.0])
            mode = rng.choice(["none", "selective", "full"])
            opt, att = rng.choice(["adam", "sgd", "adam8bit"]), rng.choice(["fused", "eager"])
            prec = rng.choice(["bf16", "fp16", "fp32"])
            assert tables.memory_gb(a, z, tp, mb, flight, mode, opt, att, precision=prec) == pytest.approx(
                stage_memory_gb(model, a, z, tp, mb, flight, mode, prec, optimizer=opt, attention=att), rel=1e-12)
            assert tables.params_per_device(a, z, tp) == pytest.approx(stage_params_per_device(model, a, z, tp),
                                                                       rel=1e-12)
