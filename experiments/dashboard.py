"""TensorBoard over the tracked runs, on 127.0.0.1 only, started and stopped cleanly.

``hetpart dashboard`` runs :class:`Dashboard` until Ctrl-C; tests use it as a context manager:

    with Dashboard("runs", port=0) as board:   # port 0: a free port
        print(board.url)

TensorBoard runs as a child process in its own session, so stopping it (or the test that
started it failing) ends it and everything it started, and nothing else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from hetpart.errors import RuntimeFault, SpecError

__all__ = ["Dashboard", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Dashboard:
    """TensorBoard serving ``logdir`` at ``http://127.0.0.1:<port>/``.

    Args:
        logdir: the runs folder (``runs/`` by default in the CLI); created when missing.
        port: the port; 0 picks a free one.
        reload_interval_s: how often TensorBoard rereads the runs (new runs and scalars appear live).
    """

    host = "127.0.0.1"

    def __init__(self, logdir: str | Path, port: int = 6006, reload_interval_s: int = 5) -> None:
        self.logdir = Path(logdir)
        if port < 0 or port > 65535:
            raise SpecError(f"--port: {port} is not a TCP port; give 1-65535 (or 0 for a free one)")
        self.port = port or free_port(self.host)
        self.reload_interval_s = reload_interval_s
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self, timeout_s: float = 90.0) -> "Dashboard":
        """Start TensorBoard and wait until it answers; raises :class:`RuntimeFault` with its output if not."""
        if self.logdir.exists() and not self.logdir.is_dir():
            raise SpecError(f"--logdir: {self.logdir} is a file; give the runs folder")
        self.logdir.mkdir(parents=True, exist_ok=True)
        if _listening(self.host, self.port):
            raise SpecError(f"--port: {self.port} is already in use on {self.host}; choose another port")
        self._log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(self.logdir), "--host", self.host,
               "--port", str(self.port), "--reload_interval", str(self.reload_interval_s)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                out = self._output()
                self.stop()
                raise RuntimeFault(f"dashboard: TensorBoard exited with code {self._proc.returncode}: {out}")
            if _answers(self.url):
                return self
            time.sleep(0.3)
        out = self._output()
        self.stop()
        raise RuntimeFault(f"dashboard: TensorBoard did not answer on {self.url} within {timeout_s:.0f} s: {out}")

    def wait(self) -> int:
        """Block until TensorBoard exits (Ctrl-C raises ``KeyboardInterrupt`` here); its exit code."""
        if self._proc is None:
            raise RuntimeError("dashboard: wait() before start()")
        return self._proc.wait()

    def stop(self) -> None:
        """End TensorBoard (SIGTERM to its session, SIGKILL after 10 s)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-400:] or "(no output)"

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # its own session: only TensorBoard and its children
    except ProcessLookupError:
        pass


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False
