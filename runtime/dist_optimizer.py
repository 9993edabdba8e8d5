"""A distributed optimizer with uneven shards: sharding levels 1 and 2 for replicas holding unequal fractions.

FSDP2 cuts every parameter into equal ``torch.chunk`` pieces, so a replica cannot hold a chosen
fraction of the states there (:mod:`hetpart.runtime.sharded`). This optimizer does what Megatron-LM's
distributed optimizer does, with uneven ranges: the parameters of one unit held by one set of ranks
(a gradient bucket of :mod:`hetpart.runtime.groups`) form one flat index space, and member ``j`` owns
the contiguous range ``[start_j, start_j + length_j)`` of it, ``length_j`` in proportion to its
replica's ``shard_fractions`` entry (normalised over the bucket's members). Each rank's owned ranges,
unit after unit, are its shard: the optimizer's fp32 states (Adam's two moments, and the fp32 master
copy where the parameters are 16-bit) exist only for it.

What each level runs:

* 1 (optimizer states): gradients accumulate whole over the micro-batches; after the last backward
  each bucket's flat gradient is reduce-scattered into the uneven ranges;
* 2 (+ gradients): each unit's gradient is reduce-scattered as soon as a micro-batch's backward has
  produced it (a post-accumulate-grad hook on its parameters) and added to the rank's gradient shard;
  the whole gradient is freed at once, so one unit's full gradient is alive at a time.

Then every rank steps its shard with Adam (torch's own functional ``adam``, so the arithmetic is the
reference's, element by element) and the updated ranges are all-gathered back into every member's
parameters.

Uneven pieces: gloo's ``reduce_scatter``/``all_gather`` of lists refuse unequal sizes. ``padded`` pads
every piece to the largest (``reduce_scatter_tensor`` / ``all_gather_into_tensor`` on ``n * max(length)``
elements, what the simulator prices, :func:`hetpart.costmodel.sharding.collective_pad`; the default on
NCCL); ``all_to_all`` sends each member exactly its piece with ``all_to_all_single`` (the default on gloo,
where it measured cheapest: ``experiments/bench_dist_optimizer.py``); ``all_reduce`` all-reduces the whole
bucket.

Buckets are processed in the layout's global order (unit, then ranks), so ranks that share several
buckets issue their collectives in one order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.runtime.engine import Executor

__all__ = ["uneven_ranges", "ShardedAdam", "uses_sharded_adam"]

Method = Literal["padded", "all_to_all", "all_reduce"]


def uses_sharded_adam(plan) -> bool:
    """Whether ``plan`` runs on this optimizer: levels 1-2 with uneven shard fractions (even shards run
    on FSDP2, :mod:`hetpart.runtime.sharded`)."""
    return plan.zero in (1, 2) and plan.shard_fractions is not None and len(set(plan.shard_fractions)) > 1


def uneven_ranges(numel: int, fractions: list[float]) -> list[tuple[int, int]]:
    """``(start, length)`` of each member's contiguous range of ``numel`` elements, in proportion to
    ``fractions`` (normalised; boundaries rounded from the cumulative sums, so they add up exactly).

    Example:
        >>> uneven_ranges(10, [0.5, 0.3, 0.2])
        [(0, 5), (5, 3), (8, 2)]
    """
    total = sum(fractions)
    bounds, acc = [0], 0.0
    for f in fractions[:-1]:
        acc += f / total
        bounds.append(min(numel, max(bounds[-1], round(numel * acc))))
    bounds.append(numel)
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


@dataclass
class _Bucket:
    """The parameters of one unit held by one set of ranks, and this rank's range of their flat space."""

    ranks: tuple[int, ...]
    keys: tuple[str, ...]
    params: list[torch.nn.Parameter]
    ranges: list[tuple[int, int]]
    """Per member (in ``ranks`` order): ``(start, length)`` in the bucket's flat space."""
    me: int
    shard_at: int
    """Where this rank's range starts in its shard (the owned ranges of its buckets, one after another)."""
    group: Any
    pending: int = 0
    """Level 2: parameters whose gradient this micro-batch's backward has produced so far."""
    numels: list[int] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def mine(self) -> tuple[int, int]:
        return self.ranges[self.me]


def _local(t: torch.Tensor) -> torch.Tensor:
    from hetpart._torch_compat import local_tensor

    return local_tensor(t)


class ShardedAdam:
    """Adam over uneven shards of the parameters ``keys`` of ``ex`` (see the module docstring).

    Args:
        ex: the executor (its plan, layout, process groups and parameters).
        keys: the canonical keys this optimizer owns (sharded among two or more holders, not tied).
        lr, betas, eps: Adam's (torch's defaults, as the executor's unsharded Adam).
        method: how uneven pieces cross the backend: ``all_to_all`` (default on gloo, the cheapest there:
            ``experiments/bench_dist_optimizer.py``), ``padded`` (default on NCCL, whose reduce-scatter and
            all-gather are native) or ``all_reduce``.
    """

    def __init__(self, ex: "Executor", keys: set[str], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, method: Method | None = None):
        if method is None:
            method = "padded" if ex.device.type == "cuda" else "all_to_all"
        self.ex, self.lr, self.betas, self.eps, self.method = ex, lr, betas, eps, method
        self.level = ex.plan.zero
        self.buckets: list[_Bucket] = []
        at = 0
        for b in ex.layout.buckets:
            if ex.rank not in b.ranks:
                continue
            mine = tuple(k for k in b.keys if k in keys)
            if not mine:
                continue
            params = [ex.params[k] for k in mine]
            numels = [_local(p).numel() for p in params]
            fractions = [ex.plan.shard_fraction(ex.layout.roles[r].replica) for r in b.ranks]
            ranges = uneven_ranges(sum(numels), fractions)
            me = b.ranks.index(ex.rank)
            self.buckets.append(_Bucket(b.ranks, mine, params, ranges, me, at, ex.groups.group(b.ranks),
                                        numels=numels))
            at += ranges[me][1]
        self.numel = at
        """Elements of this rank's shard."""
        dtype = self.buckets[0].params[0].dtype if self.buckets else torch.float32
        self.keeps_master = dtype != torch.float32
        device = ex.device
        self.exp_avg = torch.zeros(at, dtype=torch.float32, device=device)
        self.exp_avg_sq = torch.zeros(at, dtype=torch.float32, device=device)
        self.step_count = torch.tensor(0.0, dtype=torch.float32)
        self.master = self._owned_params() if self.keeps_master else None
        """fp32 master copy of the shard (16-bit parameters only; fp32 parameters are their own master)."""
        self.grad_shard: torch.Tensor | None = None
        self.comm_s = 0.0
        self._hooks = []
        if self.level == 2:
            for bucket in self.buckets:
                for p in bucket.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook_for(bucket)))

    # --------------------------------------------------------------------------- gradients
    def start_step(self) -> None:
        """Before a step's first forward: no gradient shard yet (level 2 accumulates into a fresh one)."""
        self.grad_shard = torch.zeros(self.numel, dtype=torch.float32, device=self.ex.device) if self.level == 2 else None
        for bucket in self.buckets:
            bucket.pending = 0

    def _hook_for(self, bucket: _Bucket):
        def hook(_param: torch.Tensor) -> None:
            bucket.pending += 1
            if bucket.pending == len(bucket.params):
                self._reduce_into_shard(bucket)
        return hook

    def finish_backward(self) -> None:
        """After the last backward: level 1 reduce-scatters every bucket's accumulated gradient; level 2
        reduces what no hook has (a parameter that got no gradient this micro-batch), in bucket order."""
        if self.level == 1:
            self.grad_shard = torch.zeros(self.numel, dtype=torch.float32, device=self.ex.device)
            for bucket in self.buckets:
                self._reduce_into_shard(bucket)
        else:
            for bucket in self.buckets:
                if bucket.pending:
                    self._reduce_into_shard(bucket)

    def _reduce_into_shard(self, bucket: _Bucket) -> None:
        flat = torch.cat([_local(p.grad).reshape(-1) if p.grad is not None else
                          torch.zeros(n, dtype=p.dtype, device=self.ex.device) for p, n in zip(bucket.params, bucket.numels)])
        for p in bucket.params:
            p.grad = None  # freed: the shard holds what this rank owns of it
        piece = self._reduce_scatter(bucket, flat)
        start, length = bucket.mine
        self.grad_shard[bucket.shard_at: bucket.shard_at + length] += piece.float()
        bucket.pending = 0

    def _reduce_scatter(self, bucket: _Bucket, flat: torch.Tensor) -> torch.Tensor:
        begin = time.perf_counter()
        n, (start, mine) = len(bucket.ranks), bucket.mine
        if self.method == "all_reduce":
            flat = flat.clone()
            dist.all_reduce(flat, group=bucket.group)
            piece = flat[start: start + mine]
        elif self.method == "all_to_all":
            out = torch.empty(n * mine, dtype=flat.dtype, device=flat.device)
            dist.all_to_all_single(out, flat, output_split_sizes=[mine] * n,
                                   input_split_sizes=[length for _, length in bucket.ranges], group=bucket.group)
            piece = out.view(n, mine).sum(0) if mine else out[:0]
        else:
            most = max(length for _, length in bucket.ranges)
            send = torch.zeros(n * most, dtype=flat.dtype, device=flat.device)
            for j, (start, length) in enumerate(bucket.ranges):
                send[j * most: j * most + length] = flat[start: start + length]
            out = torch.empty(most, dtype=flat.dtype, device=flat.device)
            dist.reduce_scatter_tensor(out, send, group=bucket.group)
            piece = out[:mine]
        self._report("reduce_scatter", flat, bucket, begin)
        return piece

    def _all_gather(self, bucket: _Bucket, piece: torch.Tensor) -> torch.Tensor:
        begin = time.perf_counter()
        n = len(bucket.ranks)
        if self.method == "all_reduce":
            start, mine = bucket.mine
            flat = torch.zeros(bucket.numel, dtype=piece.dtype, device=piece.device)
            flat[start: start + mine] = piece
            dist.all_reduce(flat, group=bucket.group)
        elif self.method == "all_to_all":
            flat = torch.empty(bucket.numel, dtype=piece.dtype, device=piece.device)
            dist.all_to_all_single(flat, piece.repeat(n), output_split_sizes=[length for _, length in bucket.ranges],
                                   input_split_sizes=[piece.numel()] * n, group=bucket.group)
        else:
            most = max(length for _, length in bucket.ranges)
            send = torch.zeros(most, dtype=piece.dtype, device=piece.device)
            send[: piece.numel()] = piece
            out = torch.empty(n * most, dtype=piece.dtype, device=piece.device)
            dist.all_gather_into_tensor(out, send, group=bucket.group)
            flat = torch.cat([out[j * most: j * most + length] for j, (_, length) in enumerate(bucket.ranges)])
        self._report("all_gather", flat, bucket, begin)
        return flat

    def _report(self, kind: str, flat: torch.Tensor, bucket: _Bucket, begin: float) -> None:
        # what the simulator prices: the bucket padded to n x the largest range (an emulated run pays that)
        padded = len(bucket.ranks) * max(length for _, length in bucket.ranges)
        self.ex.hooks.on_collective(kind, padded * flat.element_size(), bucket.ranks)
        elapsed = time.perf_counter() - begin
        self.comm_s += elapsed
        # level 2 runs from the backward's hooks, inside a compute chunk: this is not compute (an emulated
        # slow device would otherwise stretch the collective and its emulated link time by its slowdown)
        self.ex.clock.communicated(elapsed)

    # --------------------------------------------------------------------------- the step
    def _owned_params(self) -> torch.Tensor:
        """This rank's ranges of the parameters, in fp32 (a new tensor)."""
        pieces = []
        for bucket in self.buckets:
            start, length = bucket.mine
            flat = torch.cat([_local(p).detach().reshape(-1) for p in bucket.params])
            pieces.append(flat[start: start + length].float())
        return torch.cat(pieces) if pieces else torch.zeros(0)

    def step(self) -> None:
        """Adam on the shard, then the updated ranges all-gathered into every member's parameters."""
        from torch.optim.adam import adam

        if self.grad_shard is None:
            raise RuntimeError("ShardedAdam.step before finish_backward")
        shard = self.master if self.keeps_master else self._owned_params()
        adam([shard], [self.grad_shard], [self.exp_avg], [self.exp_avg_sq], [], [self.step_count], foreach=False,
             amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=self.lr, weight_decay=0.0, eps=self.eps,
             maximize=False)
        self.grad_shard = None
        with torch.no_grad():
            for bucket in self.buckets:
                _, length = bucket.mine
                dtype = bucket.params[0].dtype
                flat = self._all_gather(bucket, shard[bucket.shard_at: bucket.shard_at + length].to(dtype))
                for p, piece in zip(bucket.params, torch.split(flat, bucket.numels)):
                    _local(p).copy_(piece.view_as(_local(p)))

    # --------------------------------------------------------------------------- inspection, checkpoints
    def full_gradients(self) -> dict[str, torch.Tensor]:
        """The summed gradient of every owned key, whole (all-gathered from the shards; a collective)."""
        if self.grad_shard is None:
            raise RuntimeError("ShardedAdam.full_gradients before finish_backward")
        out = {}
        for bucket in self.buckets:
            _, length = bucket.mine
            flat = self._all_gather(bucket, self.grad_shard[bucket.shard_at: bucket.shard_at + length])
            for key, p, piece in zip(bucket.keys, bucket.params, torch.split(flat, bucket.numels)):
                out[key] = piece.view_as(_local(p)).to(p.dtype)
        return out

    def owned(self) -> dict[str, tuple[int, int, int]]:
        """Key -> ``(offset in the shard, offset in the key's flat tensor, length)`` of each owned piece."""
        out = {}
        for bucket in self.buckets:
            start, length = bucket.mine
            at = 0
            for key, n in zip(bucket.keys, bucket.numels):
                lo, hi = max(start, at), min(start + length, at + n)
                if hi > lo:
                    out[key] = (bucket.shard_at + lo - start, lo - at, hi - lo)
                at += n
        return out

    def state_pieces(self) -> dict[str, torch.Tensor]:
        """``name -> tensor`` views of the shard's states per owned piece (``exp_avg``, ``exp_avg_sq`` and
        ``master`` where kept), for checkpoints."""
        out = {}
        for key, (at, _, length) in self.owned().items():
            out[f"{key}.exp_avg"] = self.exp_avg[at: at + length]
            out[f"{key}.exp_avg_sq"] = self.exp_avg_sq[at: at + length]
            if self.master is not None:
                out[f"{key}.master"] = self.master[at: at + length]
        return out

    def whole_states(self) -> dict[str, torch.Tensor]:
        """Adam's states of every owned key as whole tensors, shaped as the parameter this rank holds
        (``optim.<key>.exp_avg`` / ``.exp_avg_sq`` / ``.step``), all-gathered from the shards: a checkpoint
        written so does not depend on the fractions (a collective; every holder gets the same values)."""
        out: dict[str, torch.Tensor] = {}
        for name, shard in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            for bucket in self.buckets:
                _, length = bucket.mine
                flat = self._all_gather(bucket, shard[bucket.shard_at: bucket.shard_at + length])
                for key, p, piece in zip(bucket.keys, bucket.params, torch.split(flat, bucket.numels)):
                    out[f"optim.{key}.{name}"] = _like_param(piece.view_as(_local(p)).clone(), p)
        for bucket in self.buckets:
            for key in bucket.keys:
                out[f"optim.{key}.step"] = self.step_count.clone()
        return out

    def load_whole_states(self, states: dict[str, torch.Tensor]) -> None:
        """Cut this rank's ranges out of :meth:`whole_states`' tensors (as loaded from a checkpoint)."""
        with torch.no_grad():
            for name, shard in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                for bucket in self.buckets:
                    start, length = bucket.mine
                    flat = torch.cat([_local(states[f"optim.{key}.{name}"]).reshape(-1) for key in bucket.keys])
                    shard[bucket.shard_at: bucket.shard_at + length] = flat[start: start + length]
            if self.buckets:
                self.step_count.copy_(states[f"optim.{self.buckets[0].keys[0]}.step"])
            if self.master is not None:
                self.master = self._owned_params()


def _like_param(t: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``t`` (this rank's local shape) as the parameter is held: a DTensor on its mesh under TP."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        return DTensor.from_local(t, param.device_mesh, param.placements, run_check=False)
    return t
