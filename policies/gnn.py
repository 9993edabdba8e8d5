"""The policy network: a PyTorch Geometric GNN over units and device pools with pointer-style logits.

:class:`PlanGNN` is the network itself (torch only: :class:`DenseConv` is PyG's ``DenseGraphConv``, which
training uses):

* units: a chain graph (:class:`torch_geometric.nn.DenseGraphConv` on padded rows with a mask),
  mean-pooled into a model embedding;
* pools: a graph whose edges are weighted by the link bandwidth between pools, each pool row
  holding its shared features, what has been decided about it, the model embedding and the context;
* a context embedding from the decision state, the model and the pools;
* **pointer logits**: one score per pool row (its embedding against the context) and one per
  option row (the option's features against the context), so the number of pools and options can
  vary and no weight belongs to a pool slot: one checkpoint serves every cluster.

It returns ``[logits (NUM_ACTIONS) | context (hidden)]``. For training, :class:`PlanGNNExtractor` is the same
network as an SB3 features extractor (``policy_kwargs=dict(features_extractor_class=...)``) and
:class:`PointerPolicy` is SB3's ``MaskableActorCriticPolicy`` whose action head takes those logits as they are
(the value head is an MLP on the whole feature vector); PPO itself is sb3-contrib's, unchanged. Both are
built on first use (:func:`__getattr__`), so planning with a trained network imports neither SB3 nor
gymnasium: the planner reads the network's weights from a plain state-dict file beside the SB3 checkpoint
(:func:`save_network`, :func:`load_network`; the action of a pointer policy is its logits, so the rest of the
SB3 policy is not needed to decode). A checkpoint records the features it was trained on (the extractor's
``features`` keyword, :func:`~hetpart.policies.observation.feature_record`, saved by SB3 in the zip's ``data`` and
copied into the network file); :func:`check_features` refuses one of other features, or one that records none.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from hetpart.policies.observation import SHAPES
from hetpart.policies.structure import NUM_ACTIONS, NUM_OPTIONS

__all__ = ["PlanGNN", "DenseConv", "PlanGNNExtractor", "PointerPolicy",  # noqa: F822 (the last two: __getattr__)
           "logits_and_context", "model_embedding", "NETWORK_FORMAT", "network_path", "checkpoint_digest", "network_of",
           "save_network", "save_network_file", "load_network", "checkpoint_features", "features_difference",
           "check_features"]


def _mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, out))


def _masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Shapes: ``h`` [B, N, H], ``mask`` [B, N] -> [B, H]."""
    w = mask.unsqueeze(-1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1.0)


class DenseConv(nn.Module):
    """:class:`torch_geometric.nn.DenseGraphConv` (``add`` and ``mean`` aggregation) in plain torch, the same
    parameters under the same names and the same operations in the same order, so the same outputs bit for bit
    (``tests/test_policy_network_file.py``): importing PyG pulls in torch's compiler stack and more, several times
    torch's own import, which a planning process need not pay. Training uses PyG's layer itself."""

    def __init__(self, in_channels: int, out_channels: int, aggr: str = "add") -> None:
        super().__init__()
        if aggr not in ("add", "mean"):
            raise ValueError(f"DenseConv: aggr {aggr!r}; add or mean")
        self.aggr = aggr
        self.lin_rel = nn.Linear(in_channels, out_channels)
        self.lin_root = nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x: torch.Tensor, adj: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: ``x`` [B, N, F], ``adj`` [B, N, N], ``mask`` [B, N] -> [B, N, out]."""
        n = x.size(1)
        out = torch.matmul(adj, x)
        if self.aggr == "mean":
            out = out / adj.sum(dim=-1, keepdim=True).clamp_(min=1)
        out = self.lin_rel(out)
        out = out + self.lin_root(x)
        if mask is not None:
            out = out * mask.view(-1, n, 1).to(x.dtype)
        return out


def _build_layers(net: nn.Module, hidden: int, layers: int, conv: type | None = None) -> None:
    """The network's layers on ``net`` (:class:`PlanGNN` and :class:`PlanGNNExtractor` hold the same ones under the
    same names, so one state dict loads into either); ``conv``: the graph convolution (default PyG's
    ``DenseGraphConv``)."""
    if conv is None:
        from torch_geometric.nn import DenseGraphConv as conv

    units, unit_f = SHAPES["units"]
    pool_f, option_f, ctx_f = SHAPES["pools"][1], SHAPES["options"][1], SHAPES["context"][0]
    chain = torch.zeros(units, units)
    idx = torch.arange(units - 1)
    chain[idx, idx + 1] = chain[idx + 1, idx] = 1.0
    net.register_buffer("chain", chain)
    net.unit_in = nn.Linear(unit_f, hidden)
    net.unit_convs = nn.ModuleList(conv(hidden, hidden, aggr="mean") for _ in range(layers))
    net.pool_in = nn.Linear(pool_f + hidden + ctx_f, hidden)
    net.pool_convs = nn.ModuleList(conv(hidden, hidden, aggr="add") for _ in range(layers))
    net.context = _mlp(ctx_f + 2 * hidden, hidden, hidden)
    net.pointer = _mlp(2 * hidden, hidden, 1)
    net.option_in = nn.Linear(option_f, hidden)
    net.option = _mlp(2 * hidden, hidden, 1)


class PlanGNN(nn.Module):
    """The GNN over the ``hetpart/Partition-v0`` observation, without SB3 or PyG (what the planner decodes with:
    :class:`DenseConv` for PyG's layer).

    Args:
        hidden: embedding width.
        layers: message-passing rounds on each graph.

    Shapes:
        input: the flattened Dict of :data:`hetpart.policies.observation.SHAPES` with a batch dim;
        output: ``[B, NUM_ACTIONS + hidden]``.
    """

    def __init__(self, hidden: int = 64, layers: int = 2, features: dict | None = None) -> None:
        super().__init__()
        self.hidden, self.layers = hidden, layers
        self.features = features
        """The features it was trained on (:func:`~hetpart.policies.observation.feature_record`), None if unknown."""
        _build_layers(self, hidden, layers, DenseConv)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, ctx = logits_and_context(self, obs)
        return torch.cat([logits, ctx], dim=-1)


def model_embedding(net: nn.Module, units: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    """``[B, hidden]``: the unit chain's mean-pooled embedding (``units`` ``[B, MAX_UNITS, F]``, ``unit_mask``
    ``[B, MAX_UNITS]``). It depends on the model alone, so a decoder computes it once per scenario and passes
    it to :func:`logits_and_context` (the unit graph is most of the network's arithmetic)."""
    h = torch.relu(net.unit_in(units))
    adj = net.chain * unit_mask.unsqueeze(-1) * unit_mask.unsqueeze(-2)
    for conv in net.unit_convs:
        h = torch.relu(conv(h, adj, mask=unit_mask > 0)) + h
    return _masked_mean(h, unit_mask)


def logits_and_context(net: nn.Module, obs: dict[str, torch.Tensor], model: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [B, NUM_ACTIONS], context [B, hidden])`` of a batch of observations; ``model``: the batch's
    :func:`model_embedding` when every row holds the same model (``[1, hidden]``), else computed here."""
    b = obs["context"].shape[0]
    view = {k: obs[k].reshape(b, *SHAPES[k]) for k in SHAPES}
    pm = view["pool_mask"]
    if model is None:
        model = model_embedding(net, view["units"], view["unit_mask"])
    else:
        model = model.expand(b, -1)
    ctx_raw = view["context"]
    n = pm.shape[1]
    g = torch.cat([view["pools"], model.unsqueeze(1).expand(b, n, -1), ctx_raw.unsqueeze(1).expand(b, n, -1)], -1)
    g = torch.relu(net.pool_in(g))
    padj = view["pool_adj"] * pm.unsqueeze(-1) * pm.unsqueeze(-2)
    for conv in net.pool_convs:
        g = torch.relu(conv(g, padj, mask=pm > 0)) + g
    ctx = torch.relu(net.context(torch.cat([ctx_raw, model, _masked_mean(g, pm)], -1)))
    pointer = net.pointer(torch.cat([g, ctx.unsqueeze(1).expand(b, n, -1)], -1)).squeeze(-1)
    o = torch.relu(net.option_in(view["options"]))
    option = net.option(torch.cat([o, ctx.unsqueeze(1).expand(b, NUM_OPTIONS, -1)], -1)).squeeze(-1)
    return torch.cat([pointer, option], -1), ctx


class _Logits(nn.Module):
    """The action head: the first ``NUM_ACTIONS`` features are the logits already."""

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return latent[..., :NUM_ACTIONS]


@lru_cache(maxsize=1)
def _sb3_classes() -> dict[str, type]:
    """:class:`PlanGNNExtractor` and :class:`PointerPolicy`, defined on first use (importing SB3 and sb3-contrib
    costs seconds, which planning with a trained network does not need)."""
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class PlanGNNExtractor(BaseFeaturesExtractor):
        """:class:`PlanGNN` as an SB3 features extractor for the ``hetpart/Partition-v0`` observation.

        Args:
            observation_space: the environment's Dict space.
            hidden: embedding width.
            layers: message-passing rounds on each graph.

        Shapes:
            input: the flattened Dict of :data:`hetpart.policies.observation.SHAPES` with a batch dim;
            output: ``[B, NUM_ACTIONS + hidden]``.
        """

        def __init__(self, observation_space, hidden: int = 64, layers: int = 2, features: dict | None = None
                     ) -> None:
            super().__init__(observation_space, NUM_ACTIONS + hidden)
            self.hidden, self.layers = hidden, layers
            self.features = features
            """The features it was trained on (:func:`~hetpart.policies.observation.feature_record`): a keyword of
            ``features_extractor_kwargs``, so SB3 saves it in the checkpoint's ``data``; None for a checkpoint
            written before checkpoints recorded it."""
            _build_layers(self, hidden, layers)

        def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
            logits, ctx = logits_and_context(self, obs)
            return torch.cat([logits, ctx], dim=-1)

    class PointerPolicy(MaskableActorCriticPolicy):
        """MaskablePPO's actor-critic with the GNN extractor's pointer logits as the action head."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("features_extractor_class", PlanGNNExtractor)
            kwargs.setdefault("net_arch", dict(pi=[], vf=[64, 64]))
            kwargs.setdefault("ortho_init", False)
            super().__init__(*args, **kwargs)

        def _build(self, lr_schedule) -> None:
            super()._build(lr_schedule)
            self.action_net = _Logits()
            self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    out = {"PlanGNNExtractor": PlanGNNExtractor, "PointerPolicy": PointerPolicy}
    for name, cls in out.items():  # importable by these names (pickles and SB3's saved policy refer to them)
        cls.__module__, cls.__qualname__ = __name__, name
    return out


def __getattr__(name: str):
    if name in ("PlanGNNExtractor", "PointerPolicy"):
        return _sb3_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------- the weights file
NETWORK_FORMAT = "hetpart-policy-network/1"
"""The ``format`` of a network file (:func:`save_network`)."""


def network_path(checkpoint: str | Path) -> Path:
    """The network file beside an SB3 checkpoint: ``policy.zip`` -> ``policy.net.pt``."""
    return Path(checkpoint).with_suffix(".net.pt")


def checkpoint_digest(checkpoint: str | Path) -> str:
    """SHA-256 of the checkpoint's bytes: a network file is used only for the checkpoint it was taken from."""
    return hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()


def network_of(policy) -> PlanGNN:
    """The decoding network of a trained :class:`PointerPolicy`: its actor's features extractor as a
    :class:`PlanGNN` (the same weights). Raises ``ValueError`` for a policy whose action is not the extractor's
    logits as they are (an actor MLP or another action head), which :class:`PlanGNN` alone cannot reproduce."""
    extractor = policy.pi_features_extractor
    if not (isinstance(extractor, _sb3_classes()["PlanGNNExtractor"]) and isinstance(policy.action_net, _Logits)
            and not any(True for _ in policy.mlp_extractor.policy_net.parameters())):
        raise ValueError("not a pointer policy: its action is not the GNN extractor's logits as they are")
    net = PlanGNN(extractor.hidden, extractor.layers, getattr(extractor, "features", None))
    net.load_state_dict(extractor.state_dict())
    return net.eval()


def save_network(net: PlanGNN, path: str | Path, source_digest: str) -> None:
    """Write ``net``'s weights as a plain state dict (``torch.load(weights_only=True)`` reads it) with its size and
    the :func:`checkpoint_digest` of the checkpoint it was taken from; atomically (a reader never sees half a
    file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"format": NETWORK_FORMAT, "source_sha256": source_digest, "hidden": net.hidden, "layers": net.layers,
                "features": net.features, "state_dict": net.state_dict()}, tmp)
    os.replace(tmp, path)


def save_network_file(model, checkpoint: str | Path) -> None:
    """After ``model.save(checkpoint)``: write the decoding network of the MaskablePPO ``model`` beside it
    (:func:`network_path`), so that planning with that checkpoint never loads SB3. Nothing is written for a policy
    :class:`PlanGNN` cannot reproduce (planning loads such a checkpoint with SB3, as before)."""
    try:
        net = network_of(model.policy)
    except ValueError:
        return
    save_network(net, network_path(checkpoint), checkpoint_digest(checkpoint))


def load_network(path: str | Path, source_digest: str) -> PlanGNN | None:
    """The network of a file :func:`save_network` wrote, or None where there is none, it is of another format, it
    was taken from another checkpoint than the one of ``source_digest``, or its weights do not fit this code's
    network (the caller then reads the checkpoint itself)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 (unreadable: the checkpoint itself is read instead)
        return None
    if not isinstance(data, dict) or data.get("format") != NETWORK_FORMAT or data.get("source_sha256") != source_digest:
        return None
    net = PlanGNN(int(data["hidden"]), int(data["layers"]), data.get("features"))
    try:
        net.load_state_dict(data["state_dict"])
    except (RuntimeError, KeyError, TypeError):  # weights of another shape (an edited file): the checkpoint is read
        return None
    return net.eval()


# ------------------------------------------------------------------------------------------ the features' record
RETRAIN = "retrain with 'hetpart train-policy --config experiments/configs/policy.yaml' (or plan with --planner search)"
"""The fix a refused checkpoint's message names."""


def checkpoint_features(checkpoint: str | Path) -> tuple[bool, dict | None]:
    """``(readable, record)``: the feature record (:func:`~hetpart.policies.observation.feature_record`) a MaskablePPO
    checkpoint stores in its ``data`` entry, read without SB3; ``readable`` is False for a file that is not such a
    zip (its loader refuses it in its own words), ``record`` None for one written before checkpoints stored it."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(checkpoint) as z:
            data = json.loads(z.read("data"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return False, None
    kwargs = data.get("policy_kwargs") if isinstance(data, dict) else None
    extractor = kwargs.get("features_extractor_kwargs") if isinstance(kwargs, dict) else None
    return True, extractor.get("features") if isinstance(extractor, dict) else None


def features_difference(saved: dict | None) -> str | None:
    """What differs between the features a checkpoint was trained on (``saved``) and this code's, in words; None when
    they are the same."""
    from hetpart.policies.observation import feature_record

    current = feature_record()
    if not isinstance(saved, dict):
        return "no record of them"
    out = []
    if saved.get("version") != current["version"]:
        out.append(f"feature version {saved.get('version')!r}, this hetpart's is {current['version']}")
    for table, names in current.items():
        old = saved.get(table)
        if table == "version" or old == names:
            continue
        if not isinstance(old, list) or table == "rows":
            out.append(f"{table} {old!r}, this hetpart's {names!r}")
            continue
        gone, new = [n for n in old if n not in names], [n for n in names if n not in old]
        what = "; ".join(x for x in (f"trained with {', '.join(gone)}, gone here" if gone else "",
                                     f"new here: {', '.join(new)}" if new else "") if x)
        out.append(f"{table} features ({what or 'the same names in another order'})")
    return "; ".join(out) or None


def check_features(checkpoint: str | Path, source: str = "policy checkpoint", fix: str = RETRAIN) -> None:
    """Refuse (:class:`~hetpart.errors.SpecError`, one line naming ``source``, the file, what differs and the fix) a
    policy checkpoint trained on other features than this code observes, or one that does not record them (``fix``:
    what to do instead). A file that is not a MaskablePPO zip passes: its loader refuses it."""
    from hetpart.errors import SpecError

    readable, saved = checkpoint_features(checkpoint)
    if not readable:
        return
    if saved is None:
        raise SpecError(f"{source}: {checkpoint} records no feature version or names (written before policy "
                        "checkpoints recorded them, 2026-12-01), so the features it was trained on cannot be checked "
                        f"against this hetpart's; {fix}")
    differs = features_difference(saved)
    if differs is not None:
        raise SpecError(f"{source}: {checkpoint} was trained on other features than this hetpart's ({differs}); "
                        f"{fix}")
