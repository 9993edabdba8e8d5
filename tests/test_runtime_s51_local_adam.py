"""The runtime's Adam on DTensor shards (:mod:`hetpart.runtime.local_adam`): the same update as torch's Adam on
the DTensors, run on their local shards; the state stays DTensors (what checkpoints save)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests._dist import run_distributed

pytestmark = pytest.mark.slow  # multi-process runs


def _job(rank: int, world: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from hetpart.runtime.local_adam import LocalShardAdam

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    whole = [torch.randn(6, 4, generator=gen), torch.randn(5, generator=gen)]  # 5 rows: uneven shards
    plain = torch.randn(3, generator=gen)  # a parameter outside DTensor (a tied weight) in the same group

    def params():
        shards = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)])) for w in whole]
        return shards + [torch.nn.Parameter(plain.clone())]

    ours, theirs = params(), params()
    opt_ours, opt_theirs = LocalShardAdam(ours, lr=1e-2), torch.optim.Adam(theirs, lr=1e-2, foreach=False)
    for step in range(3):
        grads = [torch.randn(w.shape, generator=torch.Generator().manual_seed(10 + step)) for w in whole + [plain]]
        for ps in (ours, theirs):
            for p, g in zip(ps, grads):
                p.grad = distribute_tensor(g, mesh, [Shard(0)]) if isinstance(p, DTensor) else g.clone()
        opt_ours.step()
        opt_theirs.step()
    local = lambda t: t.to_local() if isinstance(t, DTensor) else t  # noqa: E731
    same = [torch.equal(local(a.detach()), local(b.detach())) for a, b in zip(ours, theirs)]
    states = [isinstance(opt_ours.state[p]["exp_avg"], DTensor) for p in ours[:2]]
    moments = [torch.equal(local(opt_ours.state[a]["exp_avg_sq"]), local(opt_theirs.state[b]["exp_avg_sq"]))
               for a, b in zip(ours, theirs)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({"same": same, "states": states, "moments": moments}))


def test_local_shard_adam_steps_dtensors_exactly_as_torch_adam_and_keeps_dtensor_state() -> None:
    out = run_distributed(_job, 2, timeout_s=120)
    for rank in range(2):
        got = json.loads(Path(out, f"rank{rank}.json").read_text())
        assert got["same"] == [True, True, True]
        assert got["moments"] == [True, True, True]
        assert got["states"] == [True, True]


def _executor_job(rank: int, world: int, out: str) -> None:
    from torch.distributed.tensor import DTensor

    from hetpart.plan import Plan, Replica
    from hetpart.runtime.engine import Executor
    from hetpart.runtime.local_adam import LocalShardAdam
    from hetpart.runtime.models import RunnableSpec
    from tests.test_runtime_gate import SEQ, _gpt2, _st

    plan = Plan(global_batch=4, micro_batch=2, seq_len=SEQ, schedule="gpipe", zero=1,
                replicas=(Replica(0.5, (_st(0, 6, "0/0/0"),)), Replica(0.5, (_st(0, 6, "0/0/1"),))))
    ex = Executor(plan, RunnableSpec("gpt2", _gpt2(), impl="transformers"), rank, world)
    ex.step(0)
    sharded = [ex.params[k] for k in sorted(ex.sharded_keys)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "optimizer": type(ex.optimizer).__name__, "is_local": isinstance(ex.optimizer, LocalShardAdam),
        "sharded": len(sharded), "dtensor_states": sum(isinstance(ex.optimizer.state[p]["exp_avg"], DTensor)
                                                       for p in sharded)}))


def test_a_zero_1_executor_steps_its_fsdp_shards_with_local_shard_adam() -> None:
    out = run_distributed(_executor_job, 2, timeout_s=120)
    for rank in range(2):
        got = json.loads(Path(out, f"rank{rank}.json").read_text())
        assert got["is_local"] is True and got["optimizer"] == "LocalShardAdam"
        assert got["sharded"] > 0
        assert got["dtensor_states"] == got["sharded"]  # the state checkpoints save stays DTensors


def _mixed_job(rank: int, world: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from hetpart.runtime.local_adam import LocalShardAdam

    mesh = init_device_mesh("cpu", (world,))

    def params():
        torch.manual_seed(0)
        a = torch.nn.Parameter(distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]))
        a.grad = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
        b = torch.nn.Parameter(DTensor.from_local(torch.randn(4), mesh, [Replicate()]))
        b.grad = DTensor.from_local(torch.randn(4), mesh, [Partial()])  # a gradient laid out otherwise
        return [a, b]

    done = {}
    for foreach in (False, True):  # foreach is torch's default on GPUs
        ours, theirs = params(), params()
        LocalShardAdam(ours, lr=1e-2, foreach=foreach).step()
        torch.optim.Adam(theirs, lr=1e-2, foreach=foreach).step()
        done[str(foreach)] = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(ours, theirs))
    Path(out, f"rank{rank}.json").write_text(json.dumps(done))


def test_a_group_with_a_dtensor_laid_out_otherwise_keeps_dtensors_path_under_foreach() -> None:
    """A review found a group mixing a shard stepped locally and a DTensor with a ``Partial`` gradient handed
    torch's foreach kernels plain tensors beside DTensors ("got mixed torch.Tensor and DTensor"): such a group
    now keeps DTensor's own path, with the same update as torch's Adam."""
    out = run_distributed(_mixed_job, 1, timeout_s=120)
    assert json.loads(Path(out, "rank0.json").read_text()) == {"False": True, "True": True}
