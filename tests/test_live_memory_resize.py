"""Live tensor bytes count a storage resized in place: FSDP2 allocates and frees each unsharded parameter by
``untyped_storage().resize_`` (``alloc_storage`` / ``free_storage``), which no dispatch mode sees."""

import pytest

torch = pytest.importorskip("torch")

from hetpart.runtime.live_memory import LiveTensorBytes  # noqa: E402


def test_in_place_storage_resizes_count_as_fsdp2_gathers_do():
    gathered = torch.empty(1000)  # fp32: 4,000 bytes, freed to 0 bytes between uses as FSDP2 does
    gathered.untyped_storage().resize_(0)
    with LiveTensorBytes().hold([gathered]) as mem:
        gathered.untyped_storage().resize_(4000)  # the all-gather's destination
        allocated = mem.live_bytes
        extra = torch.ones(100)  # + 400 beside it
        gathered.untyped_storage().resize_(0)  # resharded
        freed = mem.live_bytes
        del extra
    assert (allocated, freed, mem.peak_bytes, mem.live_bytes) == (4000, 400, 4400, 0)
    assert "resize_" not in vars(torch.UntypedStorage)  # the wrapper is gone again


def test_a_storage_first_seen_at_its_resize_is_counted_and_freed():
    with LiveTensorBytes() as mem:
        t = torch.empty(0)
        t.untyped_storage().resize_(800)
        grown = mem.live_bytes
        del t
    assert (grown, mem.peak_bytes, mem.live_bytes) == (800, 800, 0)
