"""``hetpart run --nnodes``: one plan over several machines (torchrun's static rendezvous).

The real run starts two launchers on this machine (node ranks 0 and 1 over 127.0.0.1) and, at the
same time, the same plan on one machine: about a minute on a shared 2-core machine. The refusals
start no process.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest

from hetpart import load_cluster
from hetpart.plan import Plan, Replica, Stage
from hetpart.runtime.launch import Nodes, RunOptions, check_nodes, node_ranks, torchrun_command
from tests._cli import run_cli

pytestmark = pytest.mark.slow  # multi-process runs: `make test-slow` (CI runs it after `make test`)

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _plan() -> Plan:
    """gpt2-small on tiny-mixed: units 0-7 on an A100 of node 0/0, 8-13 on a V100 of node 1/0 (1 + 1 devices)."""
    return Plan(global_batch=4, micro_batch=1, seq_len=1024, schedule="1f1b", precision="fp16",
                replicas=(Replica(1.0, (Stage((0, 8), ("0/0/0",)), Stage((8, 14), ("1/0/0",)))),),
                meta={"model": "gpt2-small", "cluster": "tiny-mixed"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ no process started
def test_ranks_are_grouped_by_node_in_the_plans_rank_order():
    cluster = load_cluster("tiny-mixed")
    assert node_ranks(["0/0/0", "0/0/1", "1/0/0"], cluster) == [[0, 1], [2]]
    assert node_ranks(["1/0/0", "0/0/0", "1/0/1"], cluster) == [[0, 2], [1]]  # node order: first rank's node
    options = RunOptions(emulate=False)
    assert check_nodes(Nodes(2, 1), ["0/0/0", "0/0/1", "1/0/0"], cluster, options) == [2]
    assert check_nodes(Nodes(), ["0/0/0", "1/0/0"], cluster, RunOptions()) == [0, 1]


def test_static_rendezvous_command_names_the_node():
    cmd = torchrun_command("job.json", 2, "logs", nodes=Nodes(2, 1, "10.0.0.1", 29400))
    text = " ".join(cmd)
    assert "--nnodes 2 --rdzv-backend static --node-rank 1 --master-addr 10.0.0.1 --master-port 29400" in text
    assert "--nproc-per-node 2" in text and "--standalone" not in text
    assert "--standalone" in " ".join(torchrun_command("job.json", 2, "logs"))


def test_wrong_nnodes_or_node_rank_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    _plan().save(path)
    base = ("run", str(path), "--no-emulation", "--master-addr", "127.0.0.1")
    code, _, err = run_cli(capsys, *base, "--nnodes", "3")
    assert code == 2
    assert err.strip().splitlines() == ["hetpart: error: --nnodes: 3, but the plan uses 2 cluster nodes (0/0, 1/0); "
                                        "give --nnodes 2, one machine each"]
    code, _, err = run_cli(capsys, *base, "--nnodes", "2", "--node-rank", "2")
    assert code == 2
    assert err.strip().splitlines() == ["hetpart: error: --node-rank: 2 is out of range; with --nnodes 2 give 0 to 1 "
                                        "(0 on the --master-addr machine)"]
    code, _, err = run_cli(capsys, "run", str(path), "--nnodes", "2", "--time-factor", "10", "--master-addr", "h")
    assert code == 2 and "--time-factor: only shape the emulation" in err
    code, _, err = run_cli(capsys, "run", str(path), "--nnodes", "2")
    assert code == 2 and "--master-addr: needed with --nnodes 2" in err


# ------------------------------------------------------------------------------------ a real run
@pytest.mark.slow
def test_two_launchers_on_localhost_match_a_single_machine_run(tmp_path):
    path = tmp_path / "plan.json"
    _plan().save(path)
    cli = [sys.executable, "-m", "hetpart.cli.app", "run", str(path), "--scale", "tiny", "--steps", "2",
           "--no-emulation", "--json"]
    port = str(_free_port())
    multi = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    procs = [subprocess.Popen(cli + multi + ["--node-rank", str(k), "--run-dir", str(tmp_path / f"node{k}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    procs.append(subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-2000:]
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    node0, node1, single = outs
    m = node0["measured"]
    assert [(r["rank"], r["device"]) for r in m["ranks"]] == [(0, "0/0/0"), (1, "1/0/0")]
    assert all(r["step_time_s"] > 0 for r in m["ranks"]) and len(m["step_times_s"]) == 2
    assert len(m["losses"]) == 4 and all(math.isfinite(x) for x in m["losses"])
    assert m["losses"] == single["measured"]["losses"]  # same seed, same plan: the same training
    assert node0["nodes"]["ranks"] == [{"node_rank": 0, "ranks": [0], "devices": ["0/0/0"]},
                                       {"node_rank": 1, "ranks": [1], "devices": ["1/0/0"]}]
    assert [(r["rank"], r["device"], len(r["step_times_s"])) for r in node1["ranks"]] == [(1, "1/0/0", 2)]
    assert node1["ranks"][0]["losses"] == m["losses"][2:]
    # torchrun numbered the ranks node after node: its global rank is the plan's rank on both machines
    for k, rank in ((0, 0), (1, 1)):
        result = json.loads((tmp_path / f"node{k}" / f"rank{rank}.result.json").read_text())
        assert (result["torchrun_rank"], result["node_rank"]) == (rank, k)


@pytest.mark.slow
def test_torchrun_static_rendezvous_numbers_ranks_node_after_node_with_uneven_nodes(tmp_path):
    """Two agents of torchrun's static rendezvous on this machine, 2 and 1 processes: node rank 0's
    processes get global ranks 0-1, node rank 1's rank 2 (hetpart's workers take their plan rank from
    the job's local ranks anyway; this is torchrun's numbering that matches it)."""
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      "keys = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE')\n"
                      "path = os.path.join(sys.argv[1], 'n%s-l%s.json' % (os.environ['GROUP_RANK'], os.environ['LOCAL_RANK']))\n"
                      "open(path, 'w').write(json.dumps({k: int(os.environ[k]) for k in keys}))\n")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv-backend", "static",
                               "--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port", port,
                               "--nproc-per-node", str(n), str(script), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k, n in ((0, 2), (1, 1))]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-2000:]
    seen = {f.stem: json.loads(f.read_text()) for f in tmp_path.glob("n*-l*.json")}
    assert seen == {"n0-l0": {"RANK": 0, "LOCAL_RANK": 0, "GROUP_RANK": 0, "WORLD_SIZE": 3},
                    "n0-l1": {"RANK": 1, "LOCAL_RANK": 1, "GROUP_RANK": 0, "WORLD_SIZE": 3},
                    "n1-l0": {"RANK": 2, "LOCAL_RANK": 0, "GROUP_RANK": 1, "WORLD_SIZE": 3}}
