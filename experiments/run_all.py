"""``make bench``: rerun benchmarks and rewrite their sections of docs/BENCHMARKS.md.

``python -m hetpart.experiments.run_all [KEY ...]`` (``make bench BENCH="planners scaling"``) runs the
named sections, or :data:`DEFAULT` when none is named, and writes each as its own
marker-delimited block (:mod:`hetpart.experiments.benchdoc`): sections not rerun keep their numbers
and the date they were measured. ``--list`` shows every key and whether it is generated.

The Runtime section (``bench_runtime``: real multi-process training of 13 plans, many minutes) has
no generator yet and keeps the numbers it was measured with; the hand-written descriptions (the
simulator's assumptions) are blocks without a generator.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from hetpart.experiments.benchdoc import Section, read_sections, write_section

__all__ = ["GENERATORS", "DEFAULT", "main"]


def _planners() -> Section:
    from hetpart.experiments.bench import suite_section

    return suite_section()


def _scaling() -> Section:
    from hetpart.experiments.scaling import section

    return section()


def _simulator_speed() -> Section:
    from hetpart.experiments.bench_simulator import section

    return section()


def _simulator_calibration() -> Section:
    from hetpart.experiments.bench_calibration import section

    return section()


def _nic_sensitivity() -> Section:
    from hetpart.experiments.bench_nic import section

    return section()


def _nccl_choice() -> Section:
    from hetpart.experiments.bench_nccl import section

    return section()


def _simulator_validation() -> Section:
    from hetpart.experiments.bench_validation import section

    return section()


def _engine() -> Section:
    from hetpart.experiments.bench_engine import section

    return section()


def _loop() -> Section:
    from hetpart.experiments.bench_loop import section

    return section()


def _uneven_tp() -> Section:
    from hetpart.experiments.bench_uneven_tp import section

    return section()


def _uneven_tp_mixed() -> Section:
    from hetpart.experiments.bench_uneven_mixed import section

    return section()


def _sharded() -> Section:
    from hetpart.experiments.bench_sharded import section

    return section()


def _memory_validation() -> Section:
    from hetpart.experiments.bench_memory import section

    return section()


def _profile_truth() -> Section:
    from hetpart.experiments.bench_profile_truth import section

    return section()


def _context_parallel() -> Section:
    from hetpart.experiments.bench_context_parallel import section

    return section()


def _host_overlap() -> Section:
    from hetpart.experiments.bench_host_overlap import section

    return section()


def _offload() -> Section:
    from hetpart.experiments.bench_offload import section

    return section()


def _loop_correction() -> Section:
    from hetpart.experiments.bench_correction import section

    return section()


def _arch_efficiency() -> Section:
    from hetpart.experiments.bench_arch_curves import section

    return section()


def _search_estimate() -> Section:
    from hetpart.experiments.bench_search_estimate import section

    return section()


GENERATORS: dict[str, Callable[[], Section]] = {
    "planners": _planners,
    "scaling": _scaling,
    "simulator-calibration": _simulator_calibration,
    "simulator-validation": _simulator_validation,
    "simulator-speed": _simulator_speed,
    "engine": _engine,
    "loop": _loop,
    "uneven-tp": _uneven_tp,
    "uneven-tp-mixed": _uneven_tp_mixed,
    "nic-sensitivity": _nic_sensitivity,
    "nccl-choice": _nccl_choice,
    "sharded": _sharded,
    "profile-truth": _profile_truth,
    "memory-validation": _memory_validation,
    "context-parallel": _context_parallel,
    "arch-efficiency": _arch_efficiency,
    "host-overlap": _host_overlap,
    "loop-correction": _loop_correction,
    "offload": _offload,
    "search-estimate": _search_estimate,
}
"""Key -> function that runs the benchmark and returns its section."""

DEFAULT = ("simulator-calibration", "simulator-validation", "host-overlap", "planners", "simulator-speed", "engine",
           "scaling")
"""What ``make bench`` reruns when no section is named: every generated section but the runtime and
``uneven-tp`` (real multi-process runs: ``make bench BENCH=uneven-tp``, about 15 minutes); about 30 minutes
on the shared 2-core development machine, most of it the scaling study's 4,096-GPU search."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", help=f"sections to regenerate (default: {' '.join(DEFAULT)})")
    parser.add_argument("--list", action="store_true", help="list the sections of docs/BENCHMARKS.md and exit")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    existing = read_sections()
    if args.list:
        for key in dict.fromkeys([*GENERATORS, *existing]):
            how = "generated by make bench" if key in GENERATORS else "kept as written (no generator)"
            print(f"{key}: {how}")
        return 0
    keys = [k for arg in (args.keys or DEFAULT) for k in arg.replace(",", " ").split()]
    unknown = [k for k in keys if k not in GENERATORS]
    if unknown:
        print(f"run_all: unknown section {unknown[0]!r}; generated sections: {', '.join(GENERATORS)} "
              f"(kept as measured: {', '.join(k for k in existing if k not in GENERATORS) or 'none'})",
              file=sys.stderr)
        return 2
    for key in keys:
        print(f"run_all: {key} ...", flush=True)
        path = write_section(GENERATORS[key]())
        print(f"run_all: {key} written to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
