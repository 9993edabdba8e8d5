"""``hetpart predict --records FILE``: re-predict every run record of a ``hetpart run --out`` file."""

from __future__ import annotations

from pathlib import Path

from hetpart.cli.common import console, json_text

__all__ = ["predict_records"]


def predict_records(path: Path, predictor: str | None, json_out: bool) -> None:
    """One line per record, in file order: the re-predicted ``metrics`` beside the recorded prediction and
    the measurement. The whole file is read first: a bad line stops everything with its line number."""
    from hetpart.costmodel.replay import repredict
    from hetpart.errors import HetpartError
    from hetpart.records import iter_records

    records = list(iter_records(path))
    if not records:
        from hetpart.records import RecordError

        raise RecordError(f"--records: {path}: the file holds no run record; give a file written by "
                          "'hetpart run --out'")
    con = None if json_out else console()
    for line, record in records:
        where = f"{path}:{line}"
        try:
            out = repredict(record, predictor, where)
        except HetpartError as exc:
            out = {"error": " ".join(str(exc).split())}
        recorded = record.predicted
        # A run that did not emulate its cluster ran at this machine's speed: nothing predicts that.
        out |= {"record": line, "comparable_with_measured": record.emulated, "recorded": {"predictor": recorded.predictor, "version": recorded.version,
                                             "step_time_s": recorded.step_time_s} if recorded else None,
                "measured": {"step_time_s": record.measured.step_time_s, "tokens_per_s": record.measured.tokens_per_s}}
        if con is None:
            print(json_text(out), flush=True)  # a diverged run's NaN loss: null
        else:
            con.print(_line(where, out))


def _line(where: str, out: dict) -> str:
    if "error" in out:
        return f"{where}: [red]{out['error']}[/]"
    now, rec, meas = out["metrics"]["step_time_s"], out["recorded"], out["measured"]["step_time_s"]
    was = (f"recorded {rec['step_time_s']:.4f} s ({rec['predictor']} {rec['version']})" if rec
           else "no recorded prediction")
    graph = "" if out["graph_matches_record"] else " [yellow](model graph differs from the recorded one)[/]"
    error = (f"{100 * (now / meas - 1):+.1f}%" if out["comparable_with_measured"]
             else "not emulated: ran at this machine's speed, not comparable")
    return f"{where}: predicted {now:.4f} s, {was}, measured {meas:.4f} s ({error}){graph}"
