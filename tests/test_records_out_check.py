"""``--out`` is tried, not guessed: root passes ``os.access`` on /proc and read-only mounts, and a run then lost
its record after every step had run (a QA probe: ``hetpart run ... --out /proc/x.jsonl``)."""

from pathlib import Path

import pytest

from hetpart.errors import HetpartError
from hetpart.records import check_records_target


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_a_new_file_where_none_can_be_created_is_refused():
    with pytest.raises(HetpartError) as err:
        check_records_target("/proc/hetpart-probe-out.jsonl")
    assert "--out: cannot create /proc/hetpart-probe-out.jsonl" in str(err.value)
    assert not Path("/proc/hetpart-probe-out.jsonl").exists()


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_an_existing_file_that_cannot_be_appended_to_is_refused():
    with pytest.raises(HetpartError) as err:
        check_records_target("/proc/version")
    assert "is not writable" in str(err.value)


def test_the_check_leaves_nothing_behind(tmp_path):
    target = tmp_path / "deeper" / "runs.jsonl"
    check_records_target(target)
    check_records_target(tmp_path / "runs.jsonl")
    assert sorted(p.name for p in tmp_path.rglob("*")) == []
    kept = tmp_path / "old.jsonl"
    kept.write_text("")
    before = kept.stat().st_mtime_ns
    check_records_target(kept)
    assert kept.read_text() == "" and kept.stat().st_mtime_ns == before
