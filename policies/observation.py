"""The environment's observation: padded arrays of the shared features plus the decision state.

SB3 has no graph space, so a scenario is a Dict of fixed-size arrays with masks: unit rows
(:func:`hetpart.costmodel.features.unit_features`), pool rows
(:func:`~hetpart.costmodel.features.pool_features` plus what has been decided about each pool),
a pool-to-pool link matrix, one row per option slot of the current decision, and a context vector
(phase, workload, what is decided so far). Features come from the shared featurizer; only the
decision state is added here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from hetpart.costmodel.features import (LINK_FEATURES, POOL_FEATURES, UNIT_FEATURES, link_features, pool_features,
                                        unit_features)
from hetpart.policies.structure import MAX_POOLS, NUM_OPTIONS, PHASES, RECOMPUTE

if TYPE_CHECKING:  # pragma: no cover
    from hetpart.policies.structure import Scenario, StructureState

__all__ = ["SHAPES", "BOUND", "MAX_UNITS", "POOL_STATE", "OPTION_FEATURES", "CONTEXT_FEATURES", "StaticFeatures", "observation_space",
           "observe", "FEATURE_VERSION", "feature_record"]

BOUND = 10.0
"""Every feature is clipped to [-BOUND, BOUND] (they are shares, ratios and centred logarithms)."""
MAX_UNITS = 128
"""Unit rows; a longer model is averaged into this many consecutive bins."""
POOL_STATE = ("picked", "pipeline_position", "log_tp", "pickable", "current", "typed_log_tp", "typed_log_pp",
              "link_from_last", "same_zone_as_last", "state_share_of_memory")
OPTION_FEATURES = ("log_value", "value_over_max", "rank", "stop", "mixed", "typed", *(f"rc_{m}" for m in RECOMPUTE),
                   "unused", "stages_over_units", "replicas_share", "microbatches_per_stage")
CONTEXT_FEATURES = (*(f"phase_{p}" for p in PHASES), "family_mixed", "family_typed", "log_global_batch",
                    "log_seq_len", "log_params", "states_over_cluster_memory", "units_share", "log_dp",
                    "log_micro_batch", *(f"rc_{m}" for m in RECOMPUTE), "pools_share", "stages_over_units",
                    "microbatches_used")

FEATURE_VERSION = 1
"""The version of the observation's features, recorded in every policy checkpoint (:func:`feature_record`). Bump it
when a feature changes its meaning under the same name (another scale, another source, another formula, the
``pool_adj`` weights): a checkpoint of another version is refused, as one of other names is."""


def feature_record() -> dict:
    """What a policy checkpoint records of the features it was trained on: :data:`FEATURE_VERSION`, the names of each
    table's columns in order (``units``, ``pools``, ``options``, ``context``, and ``links``, which ``pool_adj`` is
    computed from) and the tables' row counts (plain JSON)."""
    return {"version": FEATURE_VERSION, "units": list(UNIT_FEATURES), "pools": [*POOL_FEATURES, *POOL_STATE],
            "options": list(OPTION_FEATURES), "context": list(CONTEXT_FEATURES), "links": list(LINK_FEATURES),
            "rows": {"units": MAX_UNITS, "pools": MAX_POOLS, "options": NUM_OPTIONS}}


class StaticFeatures:
    """What does not change during an episode, computed once per scenario."""

    def __init__(self, scenario: "Scenario") -> None:
        s = scenario
        self.units, self.unit_mask = _pad_units(unit_features(s.model))
        self.pools = pool_features(s.cluster, s.workload.precision)
        index, links = link_features(s.cluster)
        p = len(s.pools)
        bandwidth = np.clip((links[:, 0] + 2.0) / 4.0, 0.0, 1.0) * (1.0 - links[:, 4])
        self.adj = np.zeros((MAX_POOLS, MAX_POOLS), dtype=np.float32)
        self.adj[index[0], index[1]] = bandwidth
        self.num_pools = p
        states_gb = s.model.num_params * 16 / 1e9
        self.state_share = np.array([states_gb / (pool.num_devices * pool.gpu.memory_gb) for pool in s.pools])
        total_gb = sum(pool.num_devices * pool.gpu.memory_gb for pool in s.pools)
        wl = s.workload
        self.context = [math.log2(wl.global_batch) / 12, math.log2(wl.seq_len) / 16,
                        math.log10(max(s.model.num_params, 1)) / 12, min(states_gb / total_gb, 4.0),
                        min(s.model.num_units / MAX_UNITS, 4.0)]


def _pad_units(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(rows)
    out = np.zeros((MAX_UNITS, len(UNIT_FEATURES)), dtype=np.float32)
    mask = np.zeros(MAX_UNITS, dtype=np.float32)
    if n > MAX_UNITS:
        bins = np.array_split(np.arange(n), MAX_UNITS)
        rows = np.stack([rows[b].mean(axis=0) for b in bins])
        n = MAX_UNITS
    out[:n], mask[:n] = rows, 1.0
    return out, mask


SHAPES: dict[str, tuple[int, ...]] = {
    "units": (MAX_UNITS, len(UNIT_FEATURES)), "unit_mask": (MAX_UNITS,),
    "pools": (MAX_POOLS, len(POOL_FEATURES) + len(POOL_STATE)), "pool_mask": (MAX_POOLS,),
    "pool_adj": (MAX_POOLS, MAX_POOLS), "options": (NUM_OPTIONS, len(OPTION_FEATURES)),
    "context": (len(CONTEXT_FEATURES),),
}
"""Each observation entry's array shape; the space holds them flattened (SB3's checker wants 1-D boxes)."""


def observation_space():
    """The gymnasium Dict space of :func:`observe` (flattened :data:`SHAPES`)."""
    from gymnasium import spaces

    def box(key):
        low = 0.0 if key.endswith(("mask", "adj")) else -BOUND
        return spaces.Box(low=low, high=1.0 if low == 0.0 else BOUND, shape=(math.prod(SHAPES[key]),),
                          dtype=np.float32)

    return spaces.Dict({key: box(key) for key in SHAPES})


def observe(state: "StructureState", static: StaticFeatures) -> dict[str, np.ndarray]:
    """The observation of ``state`` (arrays in :func:`observation_space`'s shapes, float32)."""
    p = static.num_pools
    pools = np.zeros((MAX_POOLS, len(POOL_FEATURES) + len(POOL_STATE)), dtype=np.float32)
    pools[:p, :len(POOL_FEATURES)] = static.pools
    pools[:p, len(POOL_FEATURES):] = _pool_state(state, static)
    mask = np.zeros(MAX_POOLS, dtype=np.float32)
    mask[:p] = 1.0
    obs = {"units": static.units, "unit_mask": static.unit_mask, "pools": pools, "pool_mask": mask,
           "pool_adj": static.adj, "options": _options(state), "context": _context(state, static)}
    return {k: np.clip(v, -BOUND, BOUND).astype(np.float32).ravel() for k, v in obs.items()}


def _pool_state(state: "StructureState", static: StaticFeatures) -> np.ndarray:
    s = state.scenario
    p = static.num_pools
    out = np.zeros((p, len(POOL_STATE)), dtype=np.float32)
    pickable = set(s.pickable(state.order)) if state.phase == "pick" else set()
    last = state.order[-1] if state.order else None
    for i, pool in enumerate(s.pools):
        if i in state.order:
            k = state.order.index(i)
            out[i, 0], out[i, 1] = 1.0, (k + 1) / len(s.pools)
            out[i, 2] = math.log2(state.tps[k]) / 3 if k < len(state.tps) else 0.0
        out[i, 3] = float(i in pickable)
        out[i, 4] = float(state.phase in ("ttp", "tpp") and i == state.pool) or float(
            state.phase == "tp" and i == last)
        for q, tp, pp in state.typed:
            if q == i:
                out[i, 5], out[i, 6] = math.log2(tp) / 3, math.log2(pp) / 6
        if last is not None:
            out[i, 7] = static.adj[last, i]
            out[i, 8] = float(s.pools[last].zone == pool.zone)
        out[i, 9] = min(static.state_share[i], 4.0)
    return out


def _options(state: "StructureState") -> np.ndarray:
    s = state.scenario
    out = np.zeros((NUM_OPTIONS, len(OPTION_FEATURES)), dtype=np.float32)
    values = state.option_values()
    numeric = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    top = max(numeric) if numeric else 1
    for i, v in enumerate(values[:NUM_OPTIONS]):
        row = out[i]
        row[2] = i / max(len(values) - 1, 1)
        if isinstance(v, str):
            row[3], row[4], row[5] = v == "stop", v == "mixed", v == "typed"
            if v in RECOMPUTE:
                row[6 + RECOMPUTE.index(v)] = 1.0
            continue
        if v == 0:
            row[9] = 1.0  # typed replicas: the pool stays unused
            continue
        row[0], row[1] = math.log2(v) / 6, v / top
        if state.phase == "dp":
            stages = sum(g // v for g in s.groups(state.order, state.tps))
            row[10], row[11] = stages / s.model.num_units, v / s.workload.global_batch
        elif state.phase == "mb":
            row[12] = min(s.workload.global_batch / ((state.dp or 1) * v) / 64, 4.0)
        elif state.phase == "tpp":
            row[10] = v / s.model.num_units
            row[11] = s.pools[state.pool].num_devices / (state.pending_tp * v) / s.workload.global_batch
    return out


def _context(state: "StructureState", static: StaticFeatures) -> np.ndarray:
    s = state.scenario
    phase = [float(state.phase == ph) for ph in PHASES]
    family = [float(state.family == "mixed"), float(state.family == "typed")]
    rc = [float(state.rc == m) for m in RECOMPUTE]
    stages = (sum(s.groups(state.order, state.tps)) // (state.dp or 1)) if state.order else 0
    used = sum(s.pools[q].num_devices // (tp * pp) for q, tp, pp in state.typed)
    micro = used / s.total_microbatches(state.mb) if state.mb else 0.0
    row = [*phase, *family, *static.context, math.log2(state.dp or 1) / 10, math.log2(state.mb or 1) / 4, *rc,
           static.num_pools / MAX_POOLS, min(stages / s.model.num_units, 4.0), micro]
    return np.asarray(row, dtype=np.float32)
