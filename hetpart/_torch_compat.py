"""The one place hetpart touches torch internals (private modules and attributes).

torch gives no public API for these; each is wrapped here so that a torch upgrade that moves one
breaks one function with one test (``tests/test_torch_compat.py``), and no other module imports a
private torch name (the same test scans the repository). Where a public API exists it is used.

This module imports torch: only modules that need torch import it (never ``import hetpart``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FakeTensorMode", "TorchDispatchMode", "pytree", "current_autograd_node", "in_backward",
           "storage_key", "local_tensor", "functional_collectives"]


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
