"""Run records: one schema for a measured run, one JSON line each, and one loader.

``hetpart run --out runs.jsonl`` appends a :class:`RunRecord`; :func:`load_records` reads a file of
them back (a bad line names the file, the line and the field); ``hetpart predict --records`` re-predicts
each. A record is lossless: the cluster in the cluster YAML schema (:func:`hetpart.cluster.cluster_to_dict`,
catalog parts by name, anything else inline), the emulated cluster the prediction used likewise (its
``emu-*`` GPUs inline, mapped back to their catalog names in ``emulation.gpu_names``), the model's
spec with its full and run-time transformer configs and its unit graph, the plan as it ran and as
given, the workload, typed measurements, the prediction with its predictor's name and version, and
the environment. The learned cost model trains on these lines.

Example:
    >>> rec = RunRecord.from_dict(json.loads(EXAMPLE_LINE), "<example>")
    >>> rec.measured.step_time_s, rec.predicted.predictor, rec.emulated
    (1.5, 'simulator', False)
    >>> RunRecord.from_dict(rec.to_dict()) == rec
    True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from hetpart import _validate as v
from hetpart.errors import HetpartError

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.cluster import Cluster
    from hetpart.graph.model_graph import ModelGraph
    from hetpart.plan import Plan

__all__ = ["SCHEMA", "RecordError", "StageTimes", "RankTimes", "Measured", "Predicted", "ModelSpec", "Emulation",
           "Environment", "RunRecord", "load_records", "iter_records", "append_record", "check_records_target",
           "holds_run_records"]

SCHEMA = "hetpart.run/2"
"""Schema id written in every record (``schema``); a loader refuses records of another schema."""


class RecordError(HetpartError):
    """A run record (a line of a ``--out`` JSON lines file) is malformed."""


@dataclass(frozen=True)
class StageTimes:
    """One stage of one replica, seconds per step (mean over its ranks and the measured steps)."""

    replica: int
    stage: int
    layers: tuple[int, int]
    """Units ``[first, last)``."""
    devices: tuple[str, ...]
    ranks: tuple[int, ...]
    compute_s: float
    comm_s: float
    optimizer_s: float
    idle_s: float


@dataclass(frozen=True)
class RankTimes:
    """One rank, seconds per step (mean over the measured steps)."""

    rank: int
    device: str
    step_time_s: float
    compute_s: float
    """Compute of every micro-batch (emulated slowdown included)."""
    comm_s: float
    optimizer_s: float
    idle_s: float
    peak_memory_gb: float
    """Peak memory of the rank in a step (see :attr:`Measured.memory_method`)."""
    wall_step_time_s: float = 0.0
    cpu_step_time_s: float = 0.0
    emulated_slowdown_s: float = 0.0
    """Sleep added to emulate a slower device."""
    measured_compute_s: float = 0.0
    """The rank's own compute, waiting inside tensor-parallel all-reduces excluded and before any emulated
    slowdown (0 in records written before it was kept); with ``emulated_slowdown_s``, what its device
    computed (:mod:`hetpart.runtime.speeds`)."""
    emulated_comm_s: float = 0.0
    """Sleep added to emulate links."""
    rss_peak_delta_gb: float | None = None
    """On CPU, the growth of the rank's resident set during a measured step (GB; None where not read). What
    ``peak_memory_gb`` held before ``live_tensors``; it misses tensors placed in pages already resident."""


@dataclass(frozen=True)
class Measured:
    """What the run measured (warm-up steps excluded)."""

    step_time_s: float
    """Mean over the measured steps of the slowest rank's step time."""
    tokens_per_s: float
    samples_per_s: float
    step_times_s: tuple[float, ...]
    """Per measured step, the slowest rank's time."""
    step_time_std_s: float
    losses: tuple[float, ...]
    """Global mean loss of every step, warm-up included."""
    stages: tuple[StageTimes, ...]
    ranks: tuple[RankTimes, ...]
    peak_memory_gb: dict[str, float]
    """Per device type of the plan's cluster, the largest peak over its ranks (GB)."""
    memory_method: str
    """How the peaks were read: ``live_tensors`` (on CPU: the bytes of live tensors at their peak in one extra,
    untimed step, :mod:`hetpart.runtime.live_memory`), ``cuda_max_allocated`` (the CUDA allocator's peak over
    the measured steps), or in older records ``rss_peak_delta``/``rss_peak_since_start`` (resident-set growth)."""
    steps: int
    warmup: int
    rss_peak_delta_gb: dict[str, float] = field(default_factory=dict)
    """On CPU, per device type: the largest growth of a rank's resident set during a measured step (GB;
    empty in records written before it was kept)."""


@dataclass(frozen=True)
class Predicted:
    """A predictor's answer for exactly what ran (the run-time model on the emulated cluster)."""

    predictor: str
    """Registry name of the predictor (``simulator``)."""
    version: str
    """The predictor's version (a re-prediction with another version may differ)."""
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    """The predictor's other metrics (CONTRACT.md ``metrics``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Options the prediction used (``overlap_grad_reduce: false``: the runtime syncs after the backward)."""


@dataclass(frozen=True)
class ModelSpec:
    """The model: how it was asked for, its shapes, and the unit graph of what ran."""

    spec: str
    """The ``--model`` argument (catalog name, config.json path, ``python:MODULE:FUNCTION``)."""
    name: str
    config: dict[str, Any] | None
    """Full-size transformer config (``TransformerConfig`` fields); None for ``python:`` models."""
    config_json: dict[str, Any] | None
    """The config.json content when ``spec`` is a file (None otherwise)."""
    run_config: dict[str, Any] | None
    """The transformer config that RAN (shrunken by ``scale``); None for ``python:`` models."""
    scale: str
    """``tiny``, ``small``, a hidden size, or "" when the model ran as given."""
    impl: str
    """``transformers`` or ``hetpart`` (which implementation ran)."""
    full_num_params: int
    graph: dict[str, Any]
    """Unit graph of the model that ran, at the run's sequence length and fp32 (``ModelGraph.summary()``)."""


@dataclass(frozen=True)
class Emulation:
    """How the run emulated its cluster on this machine."""

    time_factor: float
    """``T``: the emulation ran ``T`` times slower than the real cluster (links: bandwidth / T, latency x T)."""
    peak_tflops: float
    """Emulated peak of the plan's fastest device type (calibrated)."""
    achieved_tflops: float
    memory_gbyte_s: float
    precision: str
    """Precision of the real cluster, whose peaks set the device speed ratios."""
    cluster: dict[str, Any]
    """The emulated cluster, cluster YAML schema with every GPU, link and NIC inline."""
    gpu_names: dict[str, str]
    """Emulated GPU name -> the catalog (or inline) GPU of ``RunRecord.cluster`` it emulates."""
    details: dict[str, Any] = field(default_factory=dict)
    """Calibrations, this machine's transport times, host rates, how links were emulated."""


@dataclass(frozen=True)
class Environment:
    """Where and when the run happened."""

    torch: str
    python: str
    host: str
    platform: str
    devices: tuple[str, ...]
    """Device name of each rank's process (``cpu`` or the CUDA device name)."""
    cores: int
    backend: str
    time_utc: str
    """ISO 8601, e.g. ``2026-11-24T12:00:00Z``."""


@dataclass(frozen=True)
class RunRecord:
    """One measured run (one JSON line)."""

    cluster: dict[str, Any]
    """The plan's (real) cluster, cluster YAML schema."""
    model: ModelSpec
    plan: dict[str, Any]
    """The plan as it ran (the run's sequence length, fp32)."""
    original_plan: dict[str, Any]
    """The plan as given (full-size model)."""
    workload: dict[str, Any]
    """What ran: ``global_batch``, ``seq_len``, ``precision``, ``recompute``, ``optimizer``."""
    measured: Measured
    predicted: Predicted | None
    """None when the run was not emulated (nothing to compare with)."""
    emulated: bool
    emulation: Emulation | None
    environment: Environment
    options: dict[str, Any] = field(default_factory=dict)
    """The ``hetpart run`` options (steps, warm-up, scale, seed, ...)."""
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def to_json(self) -> str:
        """One line; a diverged run's NaN loss is kept (as Python's json writes and reads it)."""
        return json.dumps(self.to_dict())

    def prediction_cluster(self, source: str = "<record>") -> "Cluster":
        """The cluster the prediction is for: the emulated one when emulated, else the plan's."""
        from hetpart.cluster import parse_cluster

        if self.emulation is not None:
            return parse_cluster(self.emulation.cluster, f"{source}: emulation.cluster")
        return parse_cluster(self.cluster, f"{source}: cluster")

    def run_plan(self, source: str = "<record>") -> "Plan":
        """The plan as it ran."""
        from hetpart.plan import Plan

        return Plan.from_dict(self.plan, f"{source}: plan")

    def model_graph(self) -> "ModelGraph":
        """The unit graph of the model that ran, rebuilt from the record (``python:`` models are imported
        again from ``model.spec``). :meth:`graph_matches` says whether it equals the recorded one."""
        seq_len, dtype_bytes = int(self.plan["seq_len"]), int(self.model.graph.get("dtype_bytes", 4))
        if self.model.run_config is not None:
            from hetpart.graph.transformer import TransformerConfig, transformer_graph

            name = self.model.graph.get("name") or self.model.name
            return transformer_graph(TransformerConfig(**self.model.run_config), name, seq_len, dtype_bytes,
                                     source=self.model.graph.get("source", ""))
        from hetpart.graph import load_model

        return load_model(self.model.spec, seq_len=seq_len, precision=self.workload.get("precision", "fp32"))

    def graph_matches(self, graph: "ModelGraph") -> bool:
        """Whether ``graph`` has the recorded units (names, FLOPs, parameters, activation bytes)."""
        return _plain(graph.summary()["units"]) == _plain(self.model.graph.get("units"))

    @classmethod
    def from_dict(cls, data: Any, source: str = "<record>") -> "RunRecord":
        """Parse one record; a problem raises :class:`RecordError` naming ``source`` and the field."""
        data = v.require_mapping(RecordError, data, source, "")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise v.fail(RecordError, source, "schema", f"{v.show(schema)} is not {SCHEMA!r}; write the record with "
                         "this version's 'hetpart run --out'")
        return _build(cls, data, source, "")


# ----------------------------------------------------------------------------------- parsing
_NESTED: dict[str, Any] = {}


def _build(cls: Any, data: Any, source: str, where: str) -> Any:
    """A dataclass from a mapping, field by field, with nested records, tuples and type checks."""
    data = v.require_mapping(RecordError, data, source, where)
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    v.require_keys(RecordError, data, source, where, required, [f.name for f in fields])
    kwargs = {}
    for f in fields:
        if f.name in data:
            kwargs[f.name] = _value(str(f.type), data[f.name], source, f"{where}.{f.name}" if where else f.name)
    return cls(**kwargs)


def _value(kind: str, value: Any, source: str, where: str) -> Any:
    optional = kind.endswith("| None")
    if value is None:
        if optional:
            return None
        raise v.fail(RecordError, source, where, "missing value (null); write the record again")
    kind = kind.removesuffix(" | None")
    if kind in _NESTED:
        return _build(_NESTED[kind], value, source, where)
    if kind.startswith("tuple["):
        if not isinstance(value, list):
            raise v.fail(RecordError, source, where, f"expected a list, got {v.show(value)}")
        inner = kind[len("tuple["):-1].split(",")[0].strip()
        return tuple(_value(inner, x, source, f"{where}[{i}]") for i, x in enumerate(value))
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise v.fail(RecordError, source, where, f"expected a number, got {v.show(value)}")
        try:
            return float(value)
        except OverflowError:  # a JSON integer beyond any float
            raise v.fail(RecordError, source, where, f"number out of range: {v.show(value)}") from None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise v.fail(RecordError, source, where, f"expected a whole number, got {v.show(value)}")
        return value
    if kind == "bool":
        return v.boolean(RecordError, value, source, where)
    if kind == "str":
        if not isinstance(value, str):
            raise v.fail(RecordError, source, where, f"expected a string, got {v.show(value)}")
        return value
    if kind.startswith("dict["):
        return v.require_mapping(RecordError, value, source, where)
    raise AssertionError(f"records: no parser for field type {kind}")  # pragma: no cover - a schema bug


_NESTED.update({c.__name__: c for c in (StageTimes, RankTimes, Measured, Predicted, ModelSpec, Emulation,
                                        Environment)})


def _plain(obj: Any) -> Any:
    """JSON-ready: tuples as lists, recursively."""
    if isinstance(obj, dict):
        return {k: _plain(x) for k, x in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    return obj


# ----------------------------------------------------------------------------------- files
def iter_records(path: str | Path) -> Iterator[tuple[int, RunRecord]]:
    """``(line number, record)`` for every non-empty line of the JSON lines file ``path``.

    Raises:
        RecordError: the file cannot be read, or a line is not JSON or not a valid record
            (``runs.jsonl:3: measured.step_time_s: expected a number, got 'x'``).
    """
    path = Path(path)
    name = str(path)
    try:
        if not path.is_file():
            reason = ("is a directory" if path.is_dir() else "is not a regular file" if v.path_exists(path)
                      else "no such file")
            raise RecordError(f"{name}: cannot read the run records: {reason}; give a file written by "
                              "'hetpart run --out'")
        handle = path.open("rb")
    except OSError as err:
        raise RecordError(f"{name}: cannot read the run records: {err.strerror or err}; check the path") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{name}:{number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise RecordError(f"{where}: not UTF-8 text; give a file written by 'hetpart run --out'") from None
            if not text.strip():
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{where}: invalid JSON at column {exc.colno}: {exc.msg}; each line must be one "
                                  "record written by 'hetpart run --out'") from None
            except (RecursionError, ValueError) as exc:
                raise RecordError(f"{where}: unreadable JSON ({exc.__class__.__name__}); fix or drop the line") \
                    from None
            yield number, RunRecord.from_dict(data, where)


def load_records(path: str | Path) -> list[RunRecord]:
    """Every record of ``path`` (see :func:`iter_records`)."""
    return [rec for _, rec in iter_records(path)]


def append_record(path: str | Path, record: RunRecord) -> None:
    """Append ``record`` as one JSON line (creating the file and its folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = record.to_json()
    with path.open("a+b") as f:
        f.seek(0, 2)
        if f.tell():  # a file whose last line has no newline: the record starts a line of its own
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write((line + "\n").encode("utf-8"))


def holds_run_records(path: str | Path) -> bool | None:
    """Whether the file ``path`` holds run records: its first non-blank line is a JSON object with a
    ``hetpart.run/...`` schema (any version: an older store is records too). None for a file with no line.

    Raises:
        OSError: the file cannot be read.
    """
    with Path(path).open("rb") as f:
        first = next((raw for raw in f if raw.strip()), None)
    if first is None:
        return None
    try:
        data = json.loads(first.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    schema = data.get("schema") if isinstance(data, dict) else None
    return isinstance(schema, str) and schema.startswith(SCHEMA.split("/")[0] + "/")


def check_records_target(path: str | Path, flag: str = "--out") -> None:
    """Refuse, before a run starts, a place :func:`append_record` cannot append to: a directory or other
    non-file, an unwritable file or folder (tried: the file opened for appending, or a file created in the
    folder and removed), or a file that does not hold run records (its first line is not a JSON object with a
    ``hetpart.run/...`` schema). Leaves nothing behind.

    Raises:
        RecordError: naming ``flag``, the path, what is wrong and the fix.
    """
    path = Path(path)
    fix = "give a .jsonl file written by 'hetpart run --out', or a new file's path"
    if v.path_exists(path):
        if path.is_dir():
            raise RecordError(f"{flag}: {path} is a directory; {fix} (e.g. {path / 'runs.jsonl'})")
        if not path.is_file():
            raise RecordError(f"{flag}: {path} is not a regular file; {fix}")
        try:  # opened for appending, as append_record will (os.access says yes to root on read-only mounts)
            with path.open("ab"):
                pass
        except OSError as err:
            raise RecordError(f"{flag}: {path} is not writable ({err.strerror or err}); {fix}") from None
        try:
            holds = holds_run_records(path)
        except OSError as err:
            raise RecordError(f"{flag}: cannot read {path} ({err.strerror or err}); {fix}") from None
        if holds is False:
            raise RecordError(f"{flag}: {path} does not hold hetpart run records (its first line is not one); "
                              f"{fix}")
        return
    v.check_creatable(RecordError, path, flag, fix)  # append_record creates the missing folders


EXAMPLE_LINE = json.dumps({
    "schema": SCHEMA, "cluster": {"name": "one", "nodes": [{"count": 1, "gpus_per_node": 1, "gpu": "A100-80GB",
                                                              "intra_node": "NVLink3", "nic": "IB-HDR"}]},
    "model": {"spec": "gpt2-small", "name": "gpt2-small", "config": None, "config_json": None, "run_config": None,
              "scale": "", "impl": "transformers", "full_num_params": 1, "graph": {}},
    "plan": {}, "original_plan": {}, "workload": {},
    "measured": {"step_time_s": 1.5, "tokens_per_s": 1.0, "samples_per_s": 1.0, "step_times_s": [1.5],
                 "step_time_std_s": 0.0, "losses": [2.0], "stages": [], "ranks": [], "peak_memory_gb": {},
                 "memory_method": "", "steps": 1, "warmup": 0},
    "predicted": {"predictor": "simulator", "version": "0", "step_time_s": 1.4, "tokens_per_s": 1.0,
                  "samples_per_s": 1.0},
    "emulated": False, "emulation": None,
    "environment": {"torch": "", "python": "", "host": "", "platform": "", "devices": ["cpu"], "cores": 1,
                    "backend": "gloo", "time_utc": ""}})
"""A minimal valid record line (for the docstring example and tests)."""
