"""Headless Chromium for the browser tests: find or install it (README: `apt-get install -y chromium`),
dump a page's DOM after its scripts ran, take a screenshot.

When Chromium is missing and cannot be installed, the tests skip with the reason (printed by
pytest's ``-rs`` summary, which pyproject.toml turns on), never silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

SCREENSHOTS_ENV = "HETPART_SCREENSHOTS"
"""Set to a folder (``docs/screenshots``) to keep the tests' screenshots there (the README's images)."""


@lru_cache(maxsize=1)
def _find_or_install() -> tuple[str | None, str]:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found, ""
    if not shutil.which("apt-get"):
        return None, "chromium is not installed and there is no apt-get here (install Debian's 'chromium' package)"
    if os.geteuid() != 0:
        return None, "chromium is not installed and installing needs root: run `apt-get install -y chromium` as root"
    try:
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).split())[-200:]
                return None, f"`{' '.join(cmd)}` failed ({done.returncode}): {tail}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"installing chromium failed: {exc.__class__.__name__}: {exc}"
    found = shutil.which("chromium")
    return (found, "") if found else (None, "apt-get installed chromium but it is not on PATH")


def chromium() -> str:
    """The Chromium binary, installing Debian's package once if needed; skips the test with the reason."""
    path, why = _find_or_install()
    if path is None:
        print(f"\nbrowser tests skipped: {why}")
        pytest.skip(f"headless Chromium unavailable: {why}")
    return path


def _run(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="hetpart-chromium-") as profile:
        # a private profile: several Chromiums (other test runs on this machine) do not share a lock
        # software WebGL (SwiftShader) so that TensorBoard's line charts draw without a GPU
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
               "--disable-extensions", f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def dump_dom(url: str, budget_ms: int = 2000) -> str:
    """The page's DOM after ``budget_ms`` of virtual time (its scripts and fetches have run)."""
    done = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url])
    assert done.returncode == 0 and done.stdout.strip(), f"chromium --dump-dom {url}: {done.stderr[-500:]}"
    return done.stdout


def screenshot(url: str, path: Path, size: tuple[int, int] = (1400, 1400), budget_ms: int = 2000) -> Path:
    """A PNG of the page at ``size``; also copied to ``$HETPART_SCREENSHOTS`` when that is set."""
    done = _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
                 "--hide-scrollbars", f"--screenshot={path}", url])
    assert done.returncode == 0 and path.exists() and path.stat().st_size > 0, \
        f"chromium --screenshot {url}: {done.stderr[-500:]}"
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def dom_and_screenshot(url: str, path: Path, size: tuple[int, int] = (1400, 1400), budget_ms: int = 2000) -> str:
    """:func:`dump_dom` and :func:`screenshot` of one page load in one Chromium (each starts its own browser and
    loads the page again, seconds apiece): the DOM after ``budget_ms`` of virtual time, and the PNG at ``size``."""
    done = _run([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
                 "--hide-scrollbars", f"--screenshot={path}", "--dump-dom", url])
    assert done.returncode == 0 and done.stdout.strip(), f"chromium --dump-dom {url}: {done.stderr[-500:]}"
    assert path.exists() and path.stat().st_size > 0, f"chromium --screenshot {url}: {done.stderr[-500:]}"
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return done.stdout


def colour_bins(png: Path) -> int:
    """Distinct colours in a screenshot, in 32 levels per channel (a blank page has 1-3)."""
    import matplotlib.image as mpimg
    import numpy as np

    pixels = (mpimg.imread(str(png))[..., :3] * 255).astype(int) // 8
    return len(np.unique(pixels.reshape(-1, 3), axis=0))
