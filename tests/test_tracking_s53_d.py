"""A tracked run records the git commit hetpart runs from, and whether tracked files differ from it (s53 d,
probe 2026-12-01: runs recorded no commit, so a result could not be traced to the code that made it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from hetpart.experiments import tracking
from hetpart.experiments.tracking import git_state, make_tracker


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def _checkout(tmp_path: Path) -> Path:
    """A git repository holding a package folder ``pkg`` whose ``__init__.py`` is committed."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "pkg/__init__.py")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_tracked_run_saves_the_commit_of_this_checkout(tmp_path):
    import hetpart

    here = Path(hetpart.__file__).resolve().parent
    with make_tracker("tensorboard", "demo", 0, root=tmp_path) as t:
        pass
    saved = yaml.safe_load((t.run_dir / "config.yaml").read_text())
    assert saved["git"]["commit"] == _git(here, "rev-parse", "HEAD")
    dirty = bool(_git(here, "status", "--porcelain", "--untracked-files=no"))
    assert saved["git"]["dirty"] is dirty


def test_dirty_means_a_tracked_file_differs(tmp_path):
    repo = _checkout(tmp_path)
    head = _git(repo, "rev-parse", "HEAD")
    assert git_state(repo / "pkg") == {"commit": head, "dirty": False}
    (repo / "pkg" / "new.py").write_text("y = 2\n")  # untracked: not counted
    assert git_state(repo / "pkg") == {"commit": head, "dirty": False}
    (repo / "pkg" / "__init__.py").write_text("x = 2\n")
    assert git_state(repo / "pkg") == {"commit": head, "dirty": True}


def test_no_checkout_records_nothing_and_raises_nothing(tmp_path, monkeypatch):
    plain = tmp_path / "site-packages" / "pkg"
    plain.mkdir(parents=True)
    (plain / "__init__.py").write_text("")
    assert git_state(plain) is None
    # a package folder inside another repository, not tracked there (a virtualenv in a user's project)
    repo = _checkout(tmp_path)
    inside = repo / ".venv" / "pkg"
    inside.mkdir(parents=True)
    (inside / "__init__.py").write_text("")
    assert git_state(inside) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git at all
    assert git_state(repo / "pkg") is None
    with make_tracker("tensorboard", "demo", 0, root=tmp_path / "runs") as t:
        pass
    saved = yaml.safe_load((t.run_dir / "config.yaml").read_text())
    assert "git" not in saved and saved["experiment"] == "demo"
    assert tracking.git_state() is None
