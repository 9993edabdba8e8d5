"""Micro-batches in flight per model chunk of an interleaved device (``memory.chunk_in_flight``): the counts
behind every path's memory of an interleaved plan (issue 9)."""

import pytest

from hetpart.costmodel.memory import chunk_in_flight, in_flight_microbatches


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (16, 16, 4), (8, 64, 4)])
def test_alike_chunks_hold_what_the_whole_stage_rule_says(pp, m, v):
    for d in range(pp):
        counts = chunk_in_flight("interleaved", d, pp, m, v, (1.0,) * v)
        assert len(counts) == v
        assert all(0 <= c <= m for c in counts)
        assert sum(counts) / v == pytest.approx(in_flight_microbatches("interleaved", d, pp, m, v))


def test_the_last_device_holds_more_of_its_first_chunk():
    # pp 2, 2 chunks, 4 micro-batches: the last device runs micro-batches 0 and 1 through its first chunk, then 0
    # through its second (the last of the model), whose backward comes first: (2, 1) in flight, not 1.5 of each
    assert chunk_in_flight("interleaved", 1, 2, 4, 2, (1.0, 2.0)) == (2.0, 1.0)
    # a heavier first chunk peaks later, at three of its micro-batches while the second holds none
    assert chunk_in_flight("interleaved", 1, 2, 4, 2, (2.0, 1.0)) == (3.0, 0.0)
    # the first device warms up 2 (pp - 1) + pp = 4 forwards, and holds 5 chunks' micro-batches at its peak
    assert sum(chunk_in_flight("interleaved", 0, 2, 4, 2, (1.0, 2.0))) == 5.0


def test_a_llama3_405b_like_last_device_holds_one_micro_batch_of_its_head_chunk():
    # pp 16, 4 chunks, 16 micro-batches: 48 warm-up forwards fill its first three chunks with 16 each, then one
    # forward of its last chunk (with the head) before the first backward: the rule before gave 12.25 of each
    heavy_head = (1.0, 1.0, 1.0, 1.6)
    assert chunk_in_flight("interleaved", 15, 16, 16, 4, heavy_head) == (16.0, 16.0, 16.0, 1.0)
    assert in_flight_microbatches("interleaved", 15, 16, 16, 4) * 4 == 49.0


def test_other_schedules_have_one_count():
    assert chunk_in_flight("1f1b", 0, 4, 8, 1, (1.0,)) == (4.0,)
    assert chunk_in_flight("gpipe", 3, 4, 8, 1, (1.0,)) == (8.0,)
