"""``--netem``: the ranks' bytes really cross slower links (network namespaces, veth pairs, ``tc``).

Each rank runs in its own network namespace with one veth interface on a private bridge. Egress of
every namespace is shaped per destination with ``tc``: an HTB class at the emulated link's
bandwidth and, where the kernel has ``sch_netem``, a ``netem`` delay of its latency, for each peer
rank (the links of the EMULATED cluster, already dilated by ``T``). Compute is still slowed by
sleeps; the transfer sleeps keep only what tc does not shape (the latency, without sch_netem).

Needs root, ``ip`` and ``tc`` (iproute2) and namespaces the kernel allows; :func:`netem_unavailable`
says why not, and the launcher refuses ``--netem`` with that reason. Everything created is named
``hp<pid>...`` and removed when the run ends, also when it fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from hetpart.cluster import Cluster
from hetpart.errors import RuntimeFault

__all__ = ["netem_unavailable", "NetemNetwork"]

_SUBNET = "10.213"


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)


def netem_unavailable() -> str | None:
    """Why ``--netem`` cannot work here (None when it can)."""
    if os.geteuid() != 0:
        return "network namespaces and tc need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    probe = f"hp{os.getpid()}probe"
    made = _run("ip", "netns", "add", probe)
    _run("ip", "netns", "del", probe)
    if made.returncode != 0:
        return f"creating a network namespace failed: {made.stderr.strip()[:120]}"
    return None


@dataclass
class NetemNetwork:
    """The namespaces, bridge and shaping of one run (a context manager).

    Args:
        cluster: the EMULATED cluster (links already dilated).
        rank_devices: device id of each rank.
        run_dir: where the worker wrapper script goes.
    """

    cluster: Cluster
    rank_devices: Sequence[str]
    run_dir: Path
    prefix: str = field(default_factory=lambda: f"hp{os.getpid() % 100000}")
    latency_by_tc: bool = False
    """Whether ``tc netem`` shapes latency too (the ``sch_netem`` module may be missing: then the
    ranks sleep the latency and tc shapes only the bandwidth)."""
    _created: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def shaped(self) -> str:
        """What the network emulates itself: ``all`` or ``bandwidth`` (see :class:`Emulator`)."""
        return "all" if self.latency_by_tc else "bandwidth"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_ip(self) -> str:
        return f"{_SUBNET}.{os.getpid() % 250}.1"

    def ip(self, rank: int) -> str:
        return f"{_SUBNET}.{os.getpid() % 250}.{rank + 2}"

    def namespace(self, rank: int) -> str:
        return f"{self.prefix}r{rank}"

    def __enter__(self) -> "NetemNetwork":
        try:
            self._make_bridge()
            for rank in range(len(self.rank_devices)):
                self._make_rank(rank)
            self.latency_by_tc = _run("ip", "netns", "exec", self.namespace(0), "tc", "qdisc", "add", "dev", "lo",
                                      "root", "netem", "delay", "1us").returncode == 0
            for rank in range(len(self.rank_devices)):
                self._shape(rank)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _sh(self, *cmd: str) -> None:
        done = _run(*cmd)
        if done.returncode != 0:
            raise RuntimeFault(f"runtime: --netem: '{' '.join(cmd)}' failed: {done.stderr.strip()[:200]}; "
                               "run without --netem")

    def _make_bridge(self) -> None:
        self._sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._created.append(("ip", "link", "del", self.bridge))
        self._sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        self._sh("ip", "link", "set", self.bridge, "up")

    def _make_rank(self, rank: int) -> None:
        ns, host_end = self.namespace(rank), f"{self.prefix}v{rank}"
        self._sh("ip", "netns", "add", ns)
        self._created.append(("ip", "netns", "del", ns))
        self._sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._created.append(("ip", "link", "del", host_end))
        self._sh("ip", "link", "set", host_end, "master", self.bridge)
        self._sh("ip", "link", "set", host_end, "up")
        inside = ("ip", "netns", "exec", ns)
        self._sh(*inside, "ip", "addr", "add", f"{self.ip(rank)}/24", "dev", "eth0")
        self._sh(*inside, "ip", "link", "set", "eth0", "up")
        self._sh(*inside, "ip", "link", "set", "lo", "up")
        self._sh(*inside, "ip", "route", "add", "default", "via", self.host_ip)

    def _shape(self, rank: int) -> None:
        """Egress of ``rank``: one HTB class + netem delay per peer; other traffic (rendezvous) unshaped."""
        inside = ("ip", "netns", "exec", self.namespace(rank), "tc")
        self._sh(*inside, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
        self._sh(*inside, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit")
        for peer, device in enumerate(self.rank_devices):
            if peer == rank:
                continue
            link = self.cluster.link_between(self.rank_devices[rank], device)
            if link is None:
                continue
            kbit = max(8, int(link.bandwidth_gbyte_s * 8e6))
            cid = f"1:{peer + 10}"
            self._sh(*inside, "class", "add", "dev", "eth0", "parent", "1:", "classid", cid, "htb",
                     "rate", f"{kbit}kbit", "ceil", f"{kbit}kbit")
            if self.latency_by_tc:
                self._sh(*inside, "qdisc", "add", "dev", "eth0", "parent", cid, "handle", f"{peer + 10}:", "netem",
                         "delay", f"{max(1, int(link.latency_us))}us", "limit", "100000")
            self._sh(*inside, "filter", "add", "dev", "eth0", "protocol", "ip", "parent", "1:", "prio", "1", "u32",
                     "match", "ip", "dst", f"{self.ip(peer)}/32", "flowid", cid)

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind((self.host_ip, 0))
            return s.getsockname()[1]

    def wrapper(self) -> Path:
        """A script torchrun starts per rank: it enters the rank's namespace and runs the worker."""
        path = Path(self.run_dir) / "netem_worker.sh"
        path.write_text("#!/bin/sh\n"
                        f'exec ip netns exec "{self.prefix}r$LOCAL_RANK" env GLOO_SOCKET_IFNAME=eth0 '
                        f'MASTER_ADDR={self.host_ip} '
                        f'"{sys.executable}" -m hetpart.runtime.worker "$@"\n')
        path.chmod(0o755)
        return path

    def close(self) -> None:
        for cmd in reversed(self._created):
            _run(*cmd)
        self._created.clear()
