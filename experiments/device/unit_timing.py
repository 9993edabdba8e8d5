"""One runtime block timed three ways on a GPU: the host's issue time (``perf_counter`` around a call, no
synchronisation, what a step's clock saw before it waited for the GPU), one synchronised call (what the
profile's CUDA events see: ``profile_units``, ``hetpart calibrate``, a run's in-run timing) and the mean of 50
back-to-back calls (a training step's steady state); plus ``profile_units`` itself at micro-batches 1 and 4.

    python experiments/device/unit_timing.py cuda 1024 512 out.json     # DEVICE HIDDEN SEQ OUT

Part of ``experiments/device/h200_session.sh``: whether the profile's single calls explain why the profile
measured on an H200 priced a real run 33% slow (docs/BENCHMARKS.md, "One H200")."""

import json
import statistics
import sys
import time

import torch

from hetpart.runtime.models import build_units, runnable_spec
from hetpart.runtime.profile import _unit_input, profile_units


def main(argv: list[str]) -> dict:
    dev, hidden, seq, out = torch.device(argv[0]), int(argv[1]), int(argv[2]), argv[3]
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    spec = runnable_spec("gpt2-small", hidden)
    res: dict = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "hidden": hidden, "seq": seq,
                 "torch": torch.__version__}
    rows = profile_units(spec, [1, 4], seq, "fp32", dev, warmup=1, repeats=10)  # as a run's ranks time them
    res["profile_units_ms"] = {f"{r.unit}/mb{r.micro_batch}": [round(r.fwd_s * 1e3, 3), round(r.bwd_s * 1e3, 3)]
                               for r in rows}
    unit = build_units(spec, [1], device=dev)[0]
    for mb in (1, 4):
        x = _unit_input(spec, 1, mb, seq, dev, torch.float32)
        with torch.no_grad():
            grad = torch.randn_like(unit(x)) * 1e-3

        def call(x: torch.Tensor = x, grad: torch.Tensor = grad) -> None:
            unit.zero_grad(set_to_none=True)
            unit(x).backward(grad)
            x.grad = None

        for _ in range(30):  # the clocks and the allocator warm
            call()
        sync()
        issue, single = [], []
        for _ in range(10):
            sync()
            t = time.perf_counter()
            call()
            issue.append(time.perf_counter() - t)
        sync()
        t = time.perf_counter()
        for _ in range(50):
            call()
        sync()
        back_to_back = (time.perf_counter() - t) / 50
        for _ in range(10):
            sync()
            t = time.perf_counter()
            call()
            sync()
            single.append(time.perf_counter() - t)
        res[f"block/mb{mb}"] = {"issue_ms": round(statistics.median(issue) * 1e3, 3),
                                "single_synced_ms": round(statistics.median(single) * 1e3, 3),
                                "back_to_back_ms": round(back_to_back * 1e3, 3)}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
