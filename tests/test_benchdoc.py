"""docs/BENCHMARKS.md's blocks: one section is rewritten, every other line stays; `make bench` names sections."""

from __future__ import annotations

from pathlib import Path

from hetpart.experiments import run_all
from hetpart.experiments.benchdoc import Machine, Section, read_sections, render, write_section

_MACHINE = Machine("Test CPU", 2, 24.0, "none", "3.11.7", (1.0, 2.0, 3.0))


def _doc(tmp_path: Path) -> Path:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nintro\n\n<!-- BEGIN SECTION a -->\n## A\nold a\n<!-- END SECTION a -->\n\n"
                   "## Someone else's section\nby hand\n\n<!-- BEGIN SECTION b -->\n## B\nold b\n"
                   "<!-- END SECTION b -->\n")
    return doc


def test_a_section_is_rewritten_in_place_and_nothing_else_changes(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    before = doc.read_text()
    write_section(Section("a", "A", "| x |\n|---|\n| 1 |", "python -m x", _MACHINE, (0.5, 0.5, 0.5),
                          generated_utc="2026-11-24 12:00"), doc)
    after = doc.read_text()
    assert read_sections(doc)["b"] == "## B\nold b\n"
    assert after.replace(read_sections(doc)["a"], "") == before.replace("## A\nold a\n", "")
    block = read_sections(doc)["a"]
    assert block.startswith("## A\n\n_Generated 2026-11-24 12:00 UTC by `make bench BENCH=a` (`python -m x`) on "
                            "Test CPU, 2 cores, 24 GiB, GPU none")
    assert "load average 1.0 / 2.0 / 3.0 (1/5/15 min) at the start, 0.5 / 0.5 / 0.5 at the end" in block
    assert "Someone else's section\nby hand" in after


def test_a_new_section_is_appended_and_a_block_can_be_a_subsection(tmp_path: Path) -> None:
    doc = _doc(tmp_path)
    write_section(Section("c", "C", "body", "cmd", _MACHINE, level=3), doc)
    assert list(read_sections(doc)) == ["a", "b", "c"]
    assert read_sections(doc)["c"].startswith("### C\n")
    assert render(Section("c", "C", "body", "cmd", _MACHINE)).endswith("body\n")


def test_run_all_lists_sections_and_refuses_unknown_ones(capsys) -> None:
    assert run_all.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for key in ("planners", "scaling", "simulator-calibration", "simulator-speed", "engine", "runtime"):
        assert key in listed
    assert run_all.main(["nonsense"]) == 2
    assert "unknown section 'nonsense'" in capsys.readouterr().err
