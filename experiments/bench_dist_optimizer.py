"""Benchmark: how uneven shards cross gloo -- padded collectives against ``all_to_all_single`` (issue 10).

hetpart's distributed optimizer (:mod:`hetpart.runtime.dist_optimizer`) reduce-scatters each unit's
gradient into uneven ranges and all-gathers the updated ranges back. gloo's list collectives refuse
unequal sizes, so there are two ways: pad every piece to the largest (``reduce_scatter_tensor`` /
``all_gather_into_tensor`` on ``n * max(length)`` elements: what the simulator prices) or send each member
exactly its piece with ``all_to_all_single`` (the reduce-scatter then sums the ``n`` received copies
locally; the all-gather sends its piece ``n`` times), or an ``all_reduce`` of the whole bucket (the
reduce keeps its range; the gather all-reduces a zero bucket holding each member's range). This times
one reduce-scatter and one all-gather of a flat fp32 bucket through
:class:`~hetpart.runtime.dist_optimizer.ShardedAdam`'s own code paths, per method and fraction vector, on
CPU processes joined by gloo over localhost.

Run: ``OMP_NUM_THREADS=1 python -m hetpart.experiments.bench_dist_optimizer`` (about a minute).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from datetime import timedelta

__all__ = ["FRACTIONS", "METHODS", "measure", "main"]

METHODS = ("padded", "all_to_all", "all_reduce")

FRACTIONS = ((0.5, 0.5), (0.75, 0.25), (0.9, 0.1), (1 / 3, 1 / 3, 1 / 3), (0.5, 0.3, 0.2))
"""The fraction vectors timed (even ones for reference)."""


class _Bucket:
    """The parts of :class:`~hetpart.runtime.dist_optimizer._Bucket` the collectives read."""

    def __init__(self, ranks, ranges, me, group, numel):
        self.ranks, self.ranges, self.me, self.group, self.numel = ranks, ranges, me, group, numel

    @property
    def mine(self):
        return self.ranges[self.me]


class _Opt:
    """Just enough of a ShardedAdam to call its collectives (hooks and clock of a bare executor)."""

    def __init__(self, method: str):
        from types import SimpleNamespace

        from hetpart.runtime.dist_optimizer import ShardedAdam

        self.method, self.comm_s = method, 0.0
        from hetpart.runtime.engine import _Clock

        self.ex = SimpleNamespace(hooks=SimpleNamespace(on_collective=lambda *a: None), clock=_Clock())
        self._reduce_scatter = ShardedAdam._reduce_scatter.__get__(self)
        self._all_gather = ShardedAdam._all_gather.__get__(self)
        self._report = ShardedAdam._report.__get__(self)


def _worker(rank: int, world: int, port: int, numel: int, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from hetpart.runtime.dist_optimizer import uneven_ranges

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    group = dist.new_group(list(range(world)))
    flat = torch.randn(numel)
    out = {}
    for fractions in (f for f in FRACTIONS if len(f) == world):
        ranges = uneven_ranges(numel, list(fractions))
        bucket = _Bucket(tuple(range(world)), ranges, rank, group, numel)
        for method in METHODS:
            opt = _Opt(method)
            rs, ag = [], []
            for _ in range(repeats + 1):
                dist.barrier(group)
                start = time.perf_counter()
                piece = opt._reduce_scatter(bucket, flat)
                mid = time.perf_counter()
                dist.barrier(group)
                mid2 = time.perf_counter()
                opt._all_gather(bucket, piece)
                rs.append(mid - start)
                ag.append(time.perf_counter() - mid2)
            out[(fractions, method, "rs")] = statistics.median(rs[1:])
            out[(fractions, method, "ag")] = statistics.median(ag[1:])
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def measure(world: int, numel: int, repeats: int) -> dict:
    """Median seconds per (fractions, method) on ``world`` gloo processes (rank 0's clock)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, numel, repeats, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join(60)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=4_000_000, help="fp32 elements of the bucket (default 4M = 16 MB)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"bucket {args.numel:,} fp32 elements ({args.numel * 4 / 1e6:.0f} MB); median of {args.repeats}; "
          f"load {os.getloadavg()[0]:.1f}")
    print("| ranks | fractions | " + " | ".join(f"{m} RS / AG (ms)" for m in METHODS) + " |")
    print("|---|---|" + "---|" * len(METHODS))
    for world in (2, 3):
        res = measure(world, args.numel, args.repeats)
        for fractions in (f for f in FRACTIONS if len(f) == world):
            cells = [f"{res[(fractions, m, 'rs')] * 1e3:.1f} / {res[(fractions, m, 'ag')] * 1e3:.1f}" for m in METHODS]
            print(f"| {world} | {'/'.join(f'{f:.2f}' for f in fractions)} | " + " | ".join(cells) + " |")
    print(f"load after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
