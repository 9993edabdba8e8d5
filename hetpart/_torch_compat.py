"""The one place hetpart touches torch internals (private modules and attributes).

torch gives no public API for these; each is wrapped here so that a torch upgrade that moves one
breaks one function with one test (``tests/test_torch_compat.py``), and no other module imports a
private torch name (the same test scans the repository). Where a public API exists it is used.

This module imports torch: only modules that need torch import it (never ``import hetpart``).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass as _is_wrapper_subclass

__all__ = ["FakeTensorMode", "TorchDispatchMode", "pytree", "fake_tensor_log_silenced", "current_autograd_node",
           "in_backward", "storage_key", "local_tensor", "functional_collectives", "PipelineFanOut", "adopt_pipeline_group",
           "fsdp_default_collectives", "grouped_mm", "is_wrapper_subclass"]


@contextmanager
def fake_tensor_log_silenced() -> Iterator[None]:
    """Mute FakeTensorMode's logger while the block runs: it logs a whole traceback for an op that fails on
    fake tensors (a user module whose example inputs do not fit it) before raising, and the caller reports
    that error itself, in one line."""
    log = logging.getLogger(FakeTensorMode.__module__)  # torch._subclasses.fake_tensor
    disabled, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = disabled


def current_autograd_node() -> Any:
    """The autograd node whose backward is running now (None outside a backward)."""
    return torch._C._current_autograd_node()


def in_backward() -> bool:
    """Whether this thread is running an autograd graph task (a backward pass)."""
    return torch._C._current_graph_task_id() != -1


def storage_key(t: torch.Tensor) -> int:
    """A key equal for tensors that share storage (views), fake tensors included (``data_ptr`` is not
    defined for those)."""
    return t.untyped_storage()._cdata


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """One matmul per group (the experts of a mixture of experts: rows of ``a`` cut by ``offs``, one matrix of
    ``b`` each): ``torch._grouped_mm``, which transformers 5 calls and torch does not yet make public."""
    return torch._grouped_mm(a, b, offs=offs)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local shard of a DTensor (the tensor itself otherwise), as a plain tensor sharing its
    storage: public ``DTensor.to_local()``, outside autograd so that it is the shard itself."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t
    with torch.no_grad():
        return t.to_local()


def functional_collectives() -> Any:
    """``torch.distributed._functional_collectives``: what DTensor's tensor parallelism issues its
    all-reduces through (tests count them there)."""
    import torch.distributed._functional_collectives as funcol

    return funcol


# ----------------------------------------------------------------------------------- pipelining
class PipelineFanOut:
    """Mixin for a ``torch.distributed.pipelining.PipelineStage`` subclass (put it first in the bases)
    whose one-off sends go to several peers: the shape inference's metadata (``_send_meta``) and the
    warm-up vote (``_warmup_forward_vote``, ``_warmup_backward_result``), to ``fan_forward`` (the next
    stage's ranks) and ``fan_backward`` (the previous stage's), global ranks. None (the default) keeps
    torch's one peer per stage. Receives stay torch's (from ``stage_index_to_group_rank``); the
    sends of each step are public P2P ops, retargeted by the caller."""

    fan_forward: tuple[int, ...] | None = None
    fan_backward: tuple[int, ...] | None = None

    def _send_meta(self, meta: Any, dst_stage: int) -> None:
        import torch.distributed as dist

        if self.fan_forward is None:
            return super()._send_meta(meta, dst_stage)  # type: ignore[misc]
        peers = self.fan_forward if dst_stage > self.stage_index else self.fan_backward
        for peer in peers or ():
            dist.send_object_list([meta], dst=peer, group=self.group, device=self.device, use_batch=True)

    def _warmup_forward_vote(self, has_backward: bool, received_acc: torch.Tensor | None = None):
        import torch.distributed as dist

        if self.fan_forward is None or self.is_last:
            return super()._warmup_forward_vote(has_backward, received_acc)  # type: ignore[misc]
        with _mapped_to_self(self, self.stage_index + 1):  # torch sends nothing; we fan out
            acc = super()._warmup_forward_vote(has_backward, received_acc)  # type: ignore[misc]
        for peer in self.fan_forward:
            dist.send(acc, dst=peer, group=self.group)
        return acc

    def _warmup_backward_result(self, received_result: torch.Tensor | None = None):
        import torch.distributed as dist

        if self.fan_backward is None or self.is_first:
            return super()._warmup_backward_result(received_result)  # type: ignore[misc]
        with _mapped_to_self(self, self.stage_index - 1):
            result = super()._warmup_backward_result(received_result)  # type: ignore[misc]
        for peer in self.fan_backward:
            dist.send(result, dst=peer, group=self.group)
        return result


class _mapped_to_self:
    """Map ``stage_index`` to this rank for a moment, so that torch treats it as local and sends nothing."""

    def __init__(self, stage: Any, stage_index: int) -> None:
        self.mapping, self.index, self.rank = stage.stage_index_to_group_rank, stage_index, stage.group_rank

    def __enter__(self) -> None:
        self.saved = self.mapping.get(self.index)
        self.mapping[self.index] = self.rank

    def __exit__(self, *exc: Any) -> None:
        self.mapping[self.index] = self.saved


def adopt_pipeline_group(stage: Any, group: Any) -> None:
    """Give a built ``PipelineStage`` the process group ``group``. torch refuses, at construction, a
    group larger than the number of stages (it maps stage ``i`` to group rank ``i % size`` by
    default); a stage with an explicit ``stage_index_to_group_rank`` is built on a smaller group
    holding its rank, then handed the larger one here."""
    import torch.distributed as dist

    stage.group, stage.group_rank, stage.group_size = group, dist.get_rank(group), dist.get_world_size(group)


def fsdp_default_collectives() -> tuple[type, type]:
    """FSDP2's default all-gather and reduce-scatter classes (``DefaultAllGather``, ``DefaultReduceScatter``):
    what ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` take, subclassed by the runtime so that the
    emulation sees each collective. torch exports the setters but not these defaults."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    return DefaultAllGather, DefaultReduceScatter


def is_wrapper_subclass(t: Any) -> bool:
    """Whether ``t`` is a tensor subclass that wraps inner tensors (DTensor and the like), whose bytes are its
    inner tensors' (``t.__tensor_flatten__()`` names them)."""
    return bool(_is_wrapper_subclass(t))
