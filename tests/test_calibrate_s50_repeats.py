"""``hetpart calibrate --repeats N`` sets the link sweeps' repeats too (they were fixed at 20 and 8, whatever was asked)."""

from __future__ import annotations

import json

import importlib

calibrate = importlib.import_module("hetpart.runtime.calibrate")  # the package exports a function of that name


def test_the_link_sweeps_take_the_repeats_asked_for(monkeypatch) -> None:
    seen = []

    def fake_start(worker, args, nprocs, join, start_method):
        seen.append(args)
        sizes = [{"bytes": b, "seconds": 1e-5 + b / 1e9} for b in calibrate._SWEEP_BYTES]
        with open(args[3], "w") as f:
            json.dump({"p2p": sizes, "allreduce": sizes}, f)

    import torch.multiprocessing as mp

    monkeypatch.setattr(mp, "start_processes", fake_start)
    entries = calibrate._measure_links(False, "cpu", lambda *_: None, 5)
    assert seen[0][-1] == 5 and [e.kind for e in entries] == ["p2p", "allreduce"]
    calibrate._measure_links(False, "cpu", lambda *_: None)
    assert seen[1][-1] is None  # the defaults: 20 repeats up to 1 MiB, 8 above
