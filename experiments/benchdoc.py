"""docs/BENCHMARKS.md as independent, generated sections.

Each benchmark owns one block of the file, delimited by markers::

    <!-- BEGIN SECTION planners -->
    ## Planners
    _Generated 2026-11-24 12:40 UTC by `make bench BENCH=planners`; machine ...; load average ..._
    ...
    <!-- END SECTION planners -->

:func:`write_section` replaces the block of one key and leaves everything else (other sections,
blocks someone else added, text outside any block) as it is; a new key is appended at the end.
So sections are regenerated one at a time (``make bench BENCH=planners``) and a section that was
not rerun keeps its numbers and the date they were measured.
"""

from __future__ import annotations

import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Section", "Machine", "machine", "render", "write_section", "read_sections", "bench_main", "DOC"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "BENCHMARKS.md"
_BEGIN = "<!-- BEGIN SECTION {key} -->"
_END = "<!-- END SECTION {key} -->"
_BLOCK = re.compile(r"<!-- BEGIN SECTION (?P<key>[\w.-]+) -->\n(?P<body>.*?)<!-- END SECTION (?P=key) -->\n?", re.S)


@dataclass(frozen=True)
class Machine:
    """Where a benchmark ran."""

    cpu: str
    cores: int
    memory_gib: float
    gpu: str
    """GPU name(s) from torch when one is visible, else ``"none"``."""
    python: str
    load_before: tuple[float, float, float]
    """1/5/15-minute load averages when the benchmark started (other jobs on a shared machine)."""

    def line(self, load_after: tuple[float, float, float] | None = None) -> str:
        load = f"load average {self.load_before[0]:.1f} / {self.load_before[1]:.1f} / {self.load_before[2]:.1f} " \
               "(1/5/15 min) at the start"
        if load_after is not None:
            load += f", {load_after[0]:.1f} / {load_after[1]:.1f} / {load_after[2]:.1f} at the end"
        return (f"{self.cpu}, {self.cores} cores, {self.memory_gib:.0f} GiB, GPU {self.gpu}, "
                f"Python {self.python}; {load}")


def machine() -> Machine:
    """This machine, now."""
    return Machine(cpu=_cpu(), cores=os.cpu_count() or 0, memory_gib=_memory_gib(), gpu=_gpu(),
                   python=platform.python_version(), load_before=load())


def load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        return (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Section:
    """One generated block of docs/BENCHMARKS.md."""

    key: str
    """Marker key (``planners``); also what ``make bench BENCH=...`` selects."""
    title: str
    """The ``##`` heading."""
    body: str
    """Markdown below the provenance line (tables, ``###`` subsections, what the numbers mean)."""
    command: str
    """The benchmark command behind it (``make bench BENCH=<key>`` runs it and rewrites the block)."""
    machine: Machine
    load_after: tuple[float, float, float] | None = None
    generated_utc: str = ""
    """``YYYY-MM-DD HH:MM``; now when empty."""
    level: int = 2
    """Heading level: 2 for a section, 3 for a block inside another section's text."""


def render(section: Section) -> str:
    """The block's markdown: heading, provenance line, body."""
    when = section.generated_utc or time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    head = (f"{'#' * section.level} {section.title}\n\n_Generated {when} UTC by `make bench BENCH={section.key}` "
            f"(`{section.command}`) on {section.machine.line(section.load_after)}._\n\n")
    return head + section.body.strip() + "\n"


def read_sections(path: Path = DOC) -> dict[str, str]:
    """The current blocks of ``path`` by key (their markdown, markers excluded)."""
    text = path.read_text() if path.exists() else ""
    return {m.group("key"): m.group("body") for m in _BLOCK.finditer(text)}


def write_section(section: Section | tuple[str, str], path: Path = DOC) -> Path:
    """Replace (or append) the block of ``section.key`` in ``path``; the rest of the file is kept.

    ``section`` may also be ``(key, markdown)`` for an already rendered block.
    """
    key, markdown = (section.key, render(section)) if isinstance(section, Section) else section
    block = f"{_BEGIN.format(key=key)}\n{markdown.rstrip()}\n{_END.format(key=key)}\n"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    match = next((m for m in _BLOCK.finditer(text) if m.group("key") == key), None)
    if match is not None:
        text = text[:match.start()] + block + text[match.end():]
    else:
        text = text.rstrip() + "\n\n" + block
    path.write_text(text)
    return path


def bench_main(description: str, section: "Callable[[], Section]", preview: Callable[[], str],
               argv: list[str] | None = None) -> int:
    """The command line of a benchmark module: ``--write`` rewrites its block of docs/BENCHMARKS.md from
    ``section()``; without it, prints ``preview()`` (its table, nothing written)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    print(write_section(section()) if args.write else preview())
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:  # pragma: no cover
        pass
    return 0.0


def _gpu() -> str:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return "none"
    return ", ".join(dict.fromkeys(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
