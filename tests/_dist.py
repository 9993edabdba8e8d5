"""Run a function in N CPU processes joined by gloo on a free localhost port, with a timeout.

``run_distributed(fn, world_size, *args)`` starts ``world_size`` spawned processes; each calls
``fn(rank, world_size, out_dir, *args)`` after ``init_process_group("gloo")`` with one torch thread,
and may write results under ``out_dir``. A process that fails, or a job that outlives ``timeout_s``,
kills every process and raises ``AssertionError`` with the failing rank's traceback, so a broken
test never hangs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

__all__ = ["run_distributed", "free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    # A fork server that imports torch and transformers once per test session: each later job forks
    # ready processes from it (spawning 4 fresh interpreters costs ~10 s of imports on 2 cores), and
    # the server itself never ran torch code, so forking it is safe.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed.pipelining", "torch.distributed.tensor.parallel",
                                 "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
                                 "hetpart.runtime.engine"])
    return ctx


def _worker(fn: Callable, rank: int, world_size: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=60))
        fn(rank, world_size, out_dir, *args)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        Path(out_dir, f"error_{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1) from None


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout_s: float = 90.0,
                    out_dir: str | None = None) -> Path:
    """Run ``fn`` on ``world_size`` ranks; returns the output folder (a new temp folder by default)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="hetpart_dist_"))
    ctx = _context()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, str(out), args), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while any(p.is_alive() for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
    errors = sorted(out.glob("error_*.txt"))
    if errors:
        raise AssertionError(f"rank failed:\n{errors[0].read_text()}")
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        why = f"did not finish within {timeout_s:.0f} s" if timed_out else "failed"
        raise AssertionError(f"ranks {bad} {why} (exit codes {[procs[r].exitcode for r in bad]})")
    return out
