"""The policy network: a PyTorch Geometric GNN over units and device pools with pointer-style logits.

:class:`PlanGNNExtractor` is an SB3 features extractor (``policy_kwargs=dict(features_extractor_class=...)``):

* units: a chain graph (:class:`torch_geometric.nn.DenseGraphConv` on padded rows with a mask),
  mean-pooled into a model embedding;
* pools: a graph whose edges are weighted by the link bandwidth between pools, each pool row
  holding its shared features, what has been decided about it, the model embedding and the context;
* a context embedding from the decision state, the model and the pools;
* **pointer logits**: one score per pool row (its embedding against the context) and one per
  option row (the option's features against the context), so the number of pools and options can
  vary and no weight belongs to a pool slot: one checkpoint serves every cluster.

It returns ``[logits (NUM_ACTIONS) | context (hidden)]``. :class:`PointerPolicy` is SB3's
``MaskableActorCriticPolicy`` whose action head takes those logits as they are (the value head is
an MLP on the whole feature vector); PPO itself is sb3-contrib's, unchanged.
"""

from __future__ import annotations

import torch
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from hetpart.policies.observation import SHAPES
from hetpart.policies.structure import NUM_ACTIONS, NUM_OPTIONS

__all__ = ["PlanGNNExtractor", "PointerPolicy", "logits_and_context", "model_embedding"]


def _mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, out))


def _masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Shapes: ``h`` [B, N, H], ``mask`` [B, N] -> [B, H]."""
    w = mask.unsqueeze(-1)
    return (h * w).sum(1) / w.sum(1).clamp(min=1.0)


class PlanGNNExtractor(BaseFeaturesExtractor):
    """GNN features extractor for the ``hetpart/Partition-v0`` observation.

    Args:
        observation_space: the environment's Dict space.
        hidden: embedding width.
        layers: message-passing rounds on each graph.

    Shapes:
        input: the flattened Dict of :data:`hetpart.policies.observation.SHAPES` with a batch dim;
        output: ``[B, NUM_ACTIONS + hidden]``.
    """

    def __init__(self, observation_space, hidden: int = 64, layers: int = 2) -> None:
        super().__init__(observation_space, NUM_ACTIONS + hidden)
        from torch_geometric.nn import DenseGraphConv

        units, unit_f = SHAPES["units"]
        pool_f, option_f, ctx_f = SHAPES["pools"][1], SHAPES["options"][1], SHAPES["context"][0]
        chain = torch.zeros(units, units)
        idx = torch.arange(units - 1)
        chain[idx, idx + 1] = chain[idx + 1, idx] = 1.0
        self.register_buffer("chain", chain)
        self.unit_in = nn.Linear(unit_f, hidden)
        self.unit_convs = nn.ModuleList(DenseGraphConv(hidden, hidden, aggr="mean") for _ in range(layers))
        self.pool_in = nn.Linear(pool_f + hidden + ctx_f, hidden)
        self.pool_convs = nn.ModuleList(DenseGraphConv(hidden, hidden, aggr="add") for _ in range(layers))
        self.context = _mlp(ctx_f + 2 * hidden, hidden, hidden)
        self.pointer = _mlp(2 * hidden, hidden, 1)
        self.option_in = nn.Linear(option_f, hidden)
        self.option = _mlp(2 * hidden, hidden, 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        logits, ctx = logits_and_context(self, obs)
        return torch.cat([logits, ctx], dim=-1)


def model_embedding(net: PlanGNNExtractor, units: torch.Tensor, unit_mask: torch.Tensor) -> torch.Tensor:
    """``[B, hidden]``: the unit chain's mean-pooled embedding (``units`` ``[B, MAX_UNITS, F]``, ``unit_mask``
    ``[B, MAX_UNITS]``). It depends on the model alone, so a decoder computes it once per scenario and passes
    it to :func:`logits_and_context` (the unit graph is most of the network's arithmetic)."""
    h = torch.relu(net.unit_in(units))
    adj = net.chain * unit_mask.unsqueeze(-1) * unit_mask.unsqueeze(-2)
    for conv in net.unit_convs:
        h = torch.relu(conv(h, adj, mask=unit_mask > 0)) + h
    return _masked_mean(h, unit_mask)


def logits_and_context(net: PlanGNNExtractor, obs: dict[str, torch.Tensor], model: torch.Tensor | None = None
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
