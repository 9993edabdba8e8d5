"""torch.distributed.pipelining's per-micro-batch receive buffers, which a stage keeps between steps (``torch``
kernel set): the rule, and the simulator counting it for hetpart's runtime only."""

import pytest

from hetpart.costmodel.memory import in_flight_microbatches, pipeline_recv_buffer_bytes
from hetpart.graph.transformer import TransformerConfig, transformer_graph


@pytest.fixture(scope="module")
def graph():
    return transformer_graph(TransformerConfig("gpt2", 4, 64, 4, 128, 64), "gpt2-4l", 32, 4)


def test_each_stage_keeps_a_buffer_per_micro_batch_for_what_it_receives(graph):
    one = graph.units[1].out_act_bytes * 2  # one boundary activation of a 2-sequence micro-batch
    stages = [(0, 2), (2, 4), (4, 6)]
    m = 8
    flight = [in_flight_microbatches("1f1b", d, 3, m) for d in range(3)]
    got = [pipeline_recv_buffer_bytes(graph, stages, d, 3, 2, m, flight[d]) for d in range(3)]
    # first: its output's gradients only; middle: inputs past the 2 in flight (counted as saved) and gradients;
    # last: inputs past the 1 in flight
    assert got == pytest.approx([8 * one, 6 * one + 8 * one, 7 * one])
    assert pipeline_recv_buffer_bytes(graph, [(0, 6)], 0, 1, 2, m, 1.0) == 0.0


def test_an_interleaved_device_sums_its_chunks(graph):
    one = graph.units[1].out_act_bytes
    stages = [(0, 1), (1, 2), (2, 3), (3, 4)]  # 2 devices, 2 chunks each: device 0 holds stages 0 and 2
    assert pipeline_recv_buffer_bytes(graph, stages, 0, 2, 1, 4, 4.0) == pytest.approx(4 * one + 4 * one)
    assert pipeline_recv_buffer_bytes(graph, stages, 1, 2, 1, 4, 4.0) == pytest.approx(4 * one + 0 * one)
