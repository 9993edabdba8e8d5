"""Imitation warm start: the search planner's best structure as a sequence of the environment's actions.

For a scenario, the search's structures (its ``top_k`` estimates and every group's best) are
simulated and the fastest one is replayed through :class:`~hetpart.policies.structure.StructureState`,
recording ``(observation, mask, action)`` at every decision. Behaviour cloning on these pairs
(:func:`behaviour_clone`) gives PPO a starting policy that already makes the search's choices on
the scenarios it was shown (Doppler's recipe: imitation, then RL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from hetpart.policies.observation import StaticFeatures, observe
from hetpart.policies.structure import MAX_POOLS, STOP, Scenario, StructureState

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Demonstration", "expert_key", "demonstrate", "behaviour_clone"]


@dataclass(frozen=True)
class Demonstration:
    """One decision of the expert."""

    obs: dict[str, np.ndarray]
    mask: np.ndarray
    action: int


def expert_key(scenario: Scenario) -> tuple | None:
    """The search-space key of the structure whose plan the simulator finds fastest (no refinement)."""
    from hetpart.policies.plan_search import _top_scored

    best, key = None, None
    for scored in _top_scored(scenario.ctx):
        found = scenario.evaluator.best(scored.build())
        if found is not None and (best is None or found.tokens_per_s > best.tokens_per_s):
            best, key = found, scored.key
    return key


def _actions(state: StructureState, key: tuple) -> Iterable[int]:
    """The actions that rebuild ``key`` from a fresh state (a generator: it reads the state as it goes)."""
    s = state.scenario
    index = {p.key: i for i, p in enumerate(s.pools)}

    def option(value) -> int:
        return MAX_POOLS + state.option_values().index(value)

    if key[0] == "mixed":
        _, pools, tps, dp, mb, rc = key[:6]
        yield MAX_POOLS
        for p, t in zip(pools, tps):
            yield index[p]
            yield option(t)
        yield STOP
        yield option(dp)
        yield option(mb)
        yield option(rc)
        return
    _, chosen, mb, rc = key[:4]
    by_pool = {index[p]: (t, pp) for p, t, pp in chosen}
    yield MAX_POOLS + 1
    yield option(mb)
    yield option(rc)
    while not state.done:
        if state.pool in by_pool:
            t, pp = by_pool[state.pool]
            yield option(t)
            yield option(pp)
        else:
            yield MAX_POOLS  # unused


def demonstrate(scenario: Scenario) -> list[Demonstration]:
    """The expert's decisions for ``scenario`` (empty when its structure leaves the masked space)."""
    key = expert_key(scenario)
    if key is None:
        return []
    state, static = StructureState(scenario), StaticFeatures(scenario)
    out = []
    try:
        for action in _actions(state, key):
            mask = state.action_mask()
            if not mask[action]:
                return []
            out.append(Demonstration(observe(state, static), mask, action))
            state.step(action)
    except ValueError:  # a value the state does not offer (an option list was capped)
        return []
    return out if state.done else []


def behaviour_clone(policy, demos: list[Demonstration], epochs: int = 30, batch_size: int = 256, lr: float = 1e-3,
                    seed: int = 0, log=None) -> float:
    """Train ``policy`` (a :class:`~hetpart.policies.gnn.PointerPolicy`) to pick the expert's actions
    under the masks (cross-entropy on the masked logits); returns the final accuracy."""
    import torch

    if not demos:
        return 0.0
    obs = {k: torch.as_tensor(np.stack([d.obs[k] for d in demos])) for k in demos[0].obs}
    masks = torch.as_tensor(np.stack([d.mask for d in demos]))
    actions = torch.as_tensor([d.action for d in demos])
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    acc = 0.0
    for epoch in range(epochs):
        perm = torch.randperm(len(demos), generator=gen)
        correct, total_loss = 0, 0.0
        for start in range(0, len(demos), batch_size):
            idx = perm[start:start + batch_size]
            logits = _masked_logits(policy, {k: v[idx] for k, v in obs.items()}, masks[idx])
            loss = torch.nn.functional.cross_entropy(logits, actions[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((logits.argmax(-1) == actions[idx]).sum())
            total_loss += float(loss.detach()) * len(idx)
        acc = correct / len(demos)
        if log is not None:
            log({"imitation/loss": total_loss / len(demos), "imitation/accuracy": acc}, epoch)
    return acc


def _masked_logits(policy, obs: dict[str, "torch.Tensor"], mask: "torch.Tensor") -> "torch.Tensor":
    import torch

    features = policy.extract_features(obs, policy.pi_features_extractor)
    logits = policy.action_net(policy.mlp_extractor.forward_actor(features))
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
