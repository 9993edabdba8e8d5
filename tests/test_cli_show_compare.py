"""``show --compare`` without ``--html`` is refused in one line (the comparison lives in the HTML report)."""

import subprocess
import sys
from pathlib import Path


def test_compare_without_html_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    made = subprocess.run([sys.executable, "-m", "hetpart", "plan", "--model", "gpt2-small", "--cluster", "tiny-mixed",
                           "--global-batch", "8", "--seq-len", "128", "--planner", "uniform", "--out", str(plan)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    proc = subprocess.run([sys.executable, "-m", "hetpart", "show", str(plan), "--compare", "uniform"],
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
    assert "--compare" in lines[0] and "--html" in lines[0]
