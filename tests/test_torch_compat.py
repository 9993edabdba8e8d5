"""Every torch internal hetpart uses, one test each; and no module but the compat module touches one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hetpart import _torch_compat as compat

REPO = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"torch(\.\w+)*\._[a-zA-Z]\w*|from torch(\.\w+)* import .*\b_[a-zA-Z]|\._local_tensor\b"
                     r"|\._cdata\b|\._overloadpacket\b")
"""A private torch module or attribute (``torch._C``, ``torch.utils._pytree``, ``DTensor._local_tensor``)."""


def test_no_module_but_the_compat_module_touches_torch_internals() -> None:
    offenders = []
    for folder in ("hetpart", "costmodel", "policies", "envs", "runtime", "experiments", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents if p != REPO) or path.name in (
                    "_torch_compat.py", "test_torch_compat.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if PRIVATE.search(code):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "use hetpart._torch_compat instead:\n" + "\n".join(offenders)


def test_fake_tensor_mode_gives_shapes_without_data() -> None:
    with compat.FakeTensorMode():
        x = torch.empty(1024, 1024, 1024)  # 4 GiB real, nothing fake
        y = x @ x
    assert y.shape == (1024, 1024, 1024) and type(y).__name__ == "FakeTensor"


def test_dispatch_mode_sees_every_aten_op_with_its_overload_packet() -> None:
    seen = []

    class Record(compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket)
            return func(*args, **(kwargs or {}))

    with Record():
        torch.ones(2, 3) @ torch.ones(3, 4)
    assert torch.ops.aten.mm in seen


def test_autograd_node_and_backward_flag_inside_a_backward() -> None:
    x = torch.ones(3, requires_grad=True)
    seen = {}

    def hook(grad):
        seen["node"], seen["backward"] = compat.current_autograd_node(), compat.in_backward()
        return grad

    y = (x * 2).sum()
    x.register_hook(hook)
    assert compat.current_autograd_node() is None and not compat.in_backward()
    y.backward()
    assert seen["backward"] is True and seen["node"] is not None


def test_storage_key_is_shared_by_views_also_of_fake_tensors() -> None:
    a = torch.zeros(4, 4)
    assert compat.storage_key(a) == compat.storage_key(a[1:]) != compat.storage_key(a.clone())
    with compat.FakeTensorMode():
        f = torch.zeros(4, 4)
        assert compat.storage_key(f) == compat.storage_key(f.t())


def test_pytree_flattens_nested_containers() -> None:
    leaves, spec = compat.pytree.tree_flatten({"a": (1, [2, 3])})
    assert leaves == [1, 2, 3] and compat.pytree.tree_unflatten(leaves, spec) == {"a": (1, [2, 3])}


def test_local_tensor_is_the_shard_itself(tmp_path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    plain = torch.ones(2)
    assert compat.local_tensor(plain) is plain
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        param = torch.nn.Parameter(distribute_tensor(torch.arange(4.0), mesh, [Replicate()]))
        local = compat.local_tensor(param)
        local.copy_(torch.full((4,), 7.0))  # writes through to the parameter's shard
        assert not local.requires_grad or not torch.is_grad_enabled() or local.grad_fn is None
        assert torch.equal(compat.local_tensor(param), torch.full((4,), 7.0))
    finally:
        dist.destroy_process_group()


def test_functional_collectives_is_what_tensor_parallelism_issues_through() -> None:
    """DTensor's placements reduce through this module (a Partial made Replicate calls its ``all_reduce``), so
    the runtime gate's count of all-reduces, taken there, sees every one tensor parallelism issues."""
    from torch.distributed.tensor import placement_types

    funcol = compat.functional_collectives()
    assert funcol.__name__ == "torch.distributed._functional_collectives"
    assert placement_types.funcol is funcol and callable(funcol.all_reduce)


@pytest.mark.parametrize("method,params", [("_send_meta", ["self", "meta", "dst_stage"]),
                                           ("_warmup_forward_vote", ["self", "has_backward", "received_acc"]),
                                           ("_warmup_backward_result", ["self", "received_result"])])
def test_the_pipeline_stage_methods_fan_out_overrides(method: str, params: list[str]) -> None:
    """PipelineFanOut overrides these PipelineStage internals (the mixed-TP gate cases run them)."""
    import inspect

    from torch.distributed.pipelining import PipelineStage

    assert list(inspect.signature(getattr(PipelineStage, method)).parameters) == params
    assert getattr(compat.PipelineFanOut, method).__qualname__.startswith("PipelineFanOut.")


def test_a_pipeline_stage_refuses_a_group_larger_than_its_stages_and_maps_stages_explicitly() -> None:
    """Why adopt_pipeline_group exists: the check, and the attributes it sets, as torch has them."""
    import inspect

    from torch.distributed.pipelining import stage as stage_module

    source = inspect.getsource(stage_module._PipelineStageBase.__init__)
    assert "self.group_size > self.num_stages" in source
    for attribute in ("self.group_rank =", "self.group_size =", "self.stage_index_to_group_rank"):
        assert attribute in source, attribute


def test_fsdp_default_collectives_are_what_fsdp2_runs_and_take_its_setters() -> None:
    from torch.distributed.fsdp import FSDPModule

    from hetpart._torch_compat import fsdp_default_collectives

    all_gather, reduce_scatter = fsdp_default_collectives()
    assert callable(all_gather()) and callable(reduce_scatter())
    assert hasattr(FSDPModule, "set_custom_all_gather") and hasattr(FSDPModule, "set_custom_reduce_scatter")


def test_grouped_mm_multiplies_each_group_of_rows_by_its_own_matrix() -> None:
    a = torch.randn(16, 8, dtype=torch.bfloat16)
    b = torch.randn(2, 8, 8, dtype=torch.bfloat16)
    got = compat.grouped_mm(a, b, torch.tensor([4, 16], dtype=torch.int32))
    assert torch.equal(got, torch.cat([a[:4] @ b[0], a[4:] @ b[1]]))
