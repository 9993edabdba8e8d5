"""The GNN policy: permutation invariance over pools, one network for every cluster size, the planner."""

import numpy as np
import pytest
import torch

from hetpart import Workload, load_cluster, load_model
from hetpart.envs import PartitionEnv
from hetpart.policies.observation import SHAPES
from hetpart.policies.structure import MAX_POOLS


def _extractor():
    from hetpart.policies.gnn import PlanGNNExtractor

    torch.manual_seed(0)
    return PlanGNNExtractor(PartitionEnv().observation_space, hidden=16).eval()


def _obs(cluster: str):
    env = PartitionEnv(scenario=(load_model("gpt2-small", seq_len=256), load_cluster(cluster), Workload(16, 256)))
    env.reset(seed=0)
    obs, *_ = env.step(MAX_POOLS)  # mixed pipelines: the next decision is a pointer over the pools
    assert env.state.phase == "pick"
    return obs


def _permuted(obs, perm):
    out = {k: v.copy() for k, v in obs.items()}
    pools = obs["pools"].reshape(SHAPES["pools"]).copy()
    adj = obs["pool_adj"].reshape(SHAPES["pool_adj"]).copy()
    full = np.arange(MAX_POOLS)
    full[: len(perm)] = perm
    out["pools"] = pools[full].ravel()
    out["pool_mask"] = obs["pool_mask"][full]
    out["pool_adj"] = adj[np.ix_(full, full)].ravel()
    return out, full


def test_pointer_logits_follow_a_permutation_of_the_pools():
    net = _extractor()
    obs = _obs("three-generations")
    perm = np.array([2, 0, 1])
    moved, full = _permuted(obs, perm)
    batch = lambda o: {k: torch.as_tensor(v)[None] for k, v in o.items()}  # noqa: E731
    with torch.no_grad():
        a, b = net(batch(obs))[0], net(batch(moved))[0]
    torch.testing.assert_close(b[:MAX_POOLS][: len(perm)], a[:MAX_POOLS][torch.as_tensor(perm)])
    torch.testing.assert_close(b[MAX_POOLS:], a[MAX_POOLS:])  # options and context do not move


def test_one_network_serves_clusters_of_any_size():
    net = _extractor()
    with torch.no_grad():
        for cluster in ("a100-8", "tiny-mixed", "three-generations"):
            out = net({k: torch.as_tensor(v)[None] for k, v in _obs(cluster).items()})
            assert out.shape[-1] == net.features_dim and torch.isfinite(out).all()


def test_the_model_embedding_computed_once_gives_the_networks_own_features():
    """The decoder computes the unit graph once per scenario (it depends on the model alone) and passes it
    to every pass: the features must be the extractor's own, for a batch of different decision states."""
    from hetpart.policies.gnn import logits_and_context, model_embedding

    net = _extractor()
    env = PartitionEnv(scenario=(load_model("gpt2-small", seq_len=256), load_cluster("three-generations"),
                                 Workload(16, 256)))
    rows = [env.reset(seed=0)[0]]
    for action in (MAX_POOLS, 0):  # mixed pipelines, then a pointer to the first pool
        rows.append(env.step(action)[0])
    batch = {k: torch.as_tensor(np.stack([r[k] for r in rows])) for k in rows[0]}
    with torch.no_grad():
        whole = net(batch)
        model = model_embedding(net, batch["units"][:1].reshape(1, *SHAPES["units"]), batch["unit_mask"][:1])
        once = torch.cat(logits_and_context(net, batch, model), dim=-1)
    assert len({r["context"].tobytes() for r in rows}) == len(rows)  # three different states
    torch.testing.assert_close(once, whole, rtol=0, atol=0)


@pytest.mark.slow
def test_policy_planner_plans_that_fit_and_pass_the_runtime_rules():
    from hetpart.policies import plan

    model, cluster = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed")
    result = plan(model, cluster, Workload(16, 256), "policy")
    assert result.prediction.fits_in_memory and result.planner == "policy"
    assert result.plan.validate(model, cluster) == []
    from hetpart.policies.policy_planner import decode

    found = decode(model, cluster, Workload(16, 256), samples=4)
    assert found.greedy is not None and found.sampled.tokens_per_s >= found.greedy.tokens_per_s


@pytest.mark.slow
def test_policy_planner_never_returns_less_than_the_proportional_baseline():
    from hetpart.policies.plan_proportional import plan_proportional
    from hetpart.policies.policy_planner import decode

    model, cluster, work = load_model("llama2-7b", seq_len=2048), load_cluster("consumer-mix"), Workload(128, 2048)
    base = plan_proportional(model, cluster, work)
    found = decode(model, cluster, work, samples=2, refine=False)  # no climb: the baseline itself must count
    assert found.baseline is not None and found.baseline.tokens_per_s == pytest.approx(base.tokens_per_s, rel=1e-9)
    assert found.best.tokens_per_s >= base.tokens_per_s * (1 - 1e-9)
    assert found.sampled is None or found.best.tokens_per_s >= found.sampled.tokens_per_s
    climbed = decode(model, cluster, work, samples=2)
    assert climbed.best.tokens_per_s >= base.tokens_per_s * (1 - 1e-9)
    alone = decode(model, cluster, work, samples=2, refine=False, baseline=False)
    assert alone.baseline is None and alone.best is alone.sampled  # the network's own plan, reported apart


def test_policy_planner_refuses_unknown_options():
    from hetpart.errors import PlanError
    from hetpart.policies import plan

    with pytest.raises(PlanError, match="temperature"):
        plan(load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"), Workload(16, 256), "policy",
             temperature=2.0)


@pytest.mark.slow
def test_policy_baseline_computed_in_a_child_gives_the_sequential_answer(monkeypatch):
    """The forked baseline (a second core plans ``proportional`` while the network decodes) returns what the
    sequential call returns, with and without refinement, where the baseline wins and where it loses."""
    import hetpart.policies.policy_planner as pp

    if not pp._can_fork(pp.Evaluator(load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"),
                                     Workload(16, 256))):
        pytest.skip("needs Linux and a second core")
    cases = [(load_model("llama2-7b", seq_len=2048), load_cluster("consumer-mix"), Workload(128, 2048)),
             (load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"), Workload(16, 256))]
    for model, cluster, work in cases:
        for refine in (False, True):
            forked = pp.decode(model, cluster, work, samples=2, refine=refine)
            assert forked.timings_s["baseline_forked"] is True
            monkeypatch.setattr(pp, "PARALLEL_BASELINE", False)
            alone = pp.decode(model, cluster, work, samples=2, refine=refine)
            monkeypatch.setattr(pp, "PARALLEL_BASELINE", True)
            assert alone.timings_s["baseline_forked"] is False
            assert (forked.baseline is None) == (alone.baseline is None)
            if alone.baseline is not None:
                assert forked.baseline.plan == alone.baseline.plan
            assert forked.best.plan == alone.best.plan


@pytest.mark.slow
def test_policy_baseline_child_that_fails_is_redone_and_one_left_behind_is_reaped(monkeypatch):
    import importlib
    import os

    import hetpart.policies.policy_planner as pp

    prop = importlib.import_module("hetpart.policies.plan_proportional")  # the module, not the function

    model, cluster, work = load_model("gpt2-small", seq_len=256), load_cluster("tiny-mixed"), Workload(16, 256)
    if not pp._can_fork(pp.Evaluator(model, cluster, work)):
        pytest.skip("needs Linux and a second core")
    parent, real = os.getpid(), prop.plan_proportional

    def fails_in_the_child(*args, **kwargs):
        if os.getpid() != parent:
            raise RuntimeError("the child broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(prop, "plan_proportional", fails_in_the_child)
    monkeypatch.setattr(pp, "PARALLEL_BASELINE", False)
    expected = pp.decode(model, cluster, work, samples=2, refine=False)
    monkeypatch.setattr(pp, "PARALLEL_BASELINE", True)
    redone = pp.decode(model, cluster, work, samples=2, refine=False)
    assert redone.timings_s["baseline_forked"] is False and redone.best.plan == expected.best.plan

    children = []
    real_init = pp._PendingBaseline.__init__

    def kept(self, *args):
        real_init(self, *args)
        children.append((self, self.pid))

    def broken(*args, **kwargs):
        raise RuntimeError("the decode broke")

    monkeypatch.setattr(pp._PendingBaseline, "__init__", kept)
    monkeypatch.setattr(pp, "_decode_structures", broken)
    with pytest.raises(RuntimeError, match="the decode broke"):
        pp.decode(model, cluster, work, samples=2)
    (pending, pid), = children
    assert pending.forked and pid and pending.pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped already
