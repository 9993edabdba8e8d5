"""``predict --plans`` reads, resolves and checks each line once, in whichever process scores it, and its
predictor skips a second check of the plan (:func:`hetpart.costmodel.batch.pricer` with ``validate=False``).
The answers must be exactly those of the full path, which parses each plan again and has the predictor
check it, on the seeded random plans of ``tests/fixtures/sim_reference.py`` and on broken lines."""

from __future__ import annotations

import json
from pathlib import Path

from hetpart import load_model
from hetpart.costmodel import Simulator
from hetpart.costmodel.batch import predict_lines
from tests._cli import run_cli
from tests.fixtures import sim_reference as ref


def test_plans_checked_once_answer_what_the_checking_predictor_answers(capsys, tmp_path: Path) -> None:
    # in fp16, which every device of the reference cluster has (the V100s lack bf16)
    lines = [json.dumps(dict(plan.to_dict(), precision="fp16")) for plan in ref.random_plans()]
    unknown = json.loads(lines[0])
    unknown["replicas"][0]["stages"][0]["devices"] = ["9/0/0"]  # no such device: the check refuses it
    lines[2:2] = ["{not json", json.dumps(unknown), ""]
    path = tmp_path / "plans.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(ref.CLUSTER))
    args = ["predict", "--model", "gpt2-small", "--cluster", str(cluster), "--precision", "fp16",
            "--plans", str(path), "--json"]
    by_jobs = []
    for jobs in ("1", "2"):
        code, out, err = run_cli(capsys, *args, "--jobs", jobs)
        assert code == 0, err
        by_jobs.append([json.loads(line) for line in out.splitlines()])
    assert by_jobs[0] == by_jobs[1]
    full = list(predict_lines(lines, Simulator(load_model("gpt2-small", seq_len=ref.SEQ_LEN, precision="fp16"), ref.cluster()), source=str(path)))
    assert len(full) == len(by_jobs[0]) == len(lines) - 1  # the blank line is no plan
    assert [answer.get("metrics") for answer in by_jobs[0]] == [answer.get("metrics") for answer in full]
    assert sum("metrics" in answer for answer in full) == len(lines) - 3
    assert [answer["line"] for answer in by_jobs[0]] == [n for n, line in enumerate(lines, 1) if line]
    assert by_jobs[0][2] == {"line": 3} | full[2] and by_jobs[0][2]["error"].startswith(f"{path}:3: invalid JSON")
    assert "'9/0/0' does not exist" in by_jobs[0][3]["error"] and "'9/0/0' does not exist" in full[3]["error"]

