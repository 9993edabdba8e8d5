"""The planner's network without SB3 or PyG: the plain state-dict file beside the checkpoint gives the SB3
policy's own action logits bit for bit, is used only for the checkpoint it was taken from, and a planning
process that reads it imports neither SB3, gymnasium nor PyG."""

import shutil
import subprocess
import sys

import numpy as np
import torch

from hetpart import Workload, load_cluster, load_model
from hetpart.policies.observation import StaticFeatures, observe
from hetpart.policies.structure import Scenario, StructureState


def _observations(cluster: str, model: str, batch: int, seq: int, steps: int = 40, seed: int = 0) -> list[dict]:
    """Observations of seeded random legal decodes (every phase of both families)."""
    scenario = Scenario(load_model(model, seq_len=seq), load_cluster(cluster), Workload(batch, seq))
    static = StaticFeatures(scenario)
    rng = np.random.default_rng(seed)
    rows = []
    state = StructureState(scenario)
    for _ in range(steps):
        if state.done:
            state = StructureState(scenario)
        rows.append(observe(state, static))
        state.step(int(rng.choice(np.flatnonzero(state.action_mask()))))
    return rows


def _batch(rows: list[dict]) -> dict:
    return {k: torch.as_tensor(np.stack([r[k] for r in rows])) for k in rows[0]}


def _sb3_policy(path):
    from sb3_contrib import MaskablePPO

    from hetpart.policies.gnn import PointerPolicy

    return MaskablePPO.load(str(path), device="cpu", custom_objects={"policy_class": PointerPolicy}).policy.eval()


def test_the_network_file_gives_the_sb3_policys_action_logits_bit_for_bit(tmp_path):
    from hetpart.policies.gnn import load_network, logits_and_context, model_embedding, network_path
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT, load_policy
    from hetpart.policies.observation import SHAPES

    checkpoint = tmp_path / "policy.zip"
    shutil.copy(DEFAULT_CHECKPOINT, checkpoint)
    derived = load_policy(str(checkpoint))  # no file yet: loaded with SB3, the file written
    assert network_path(checkpoint).is_file()
    from hetpart.policies.gnn import checkpoint_digest

    net = load_network(network_path(checkpoint), checkpoint_digest(checkpoint))
    assert net is not None and type(net).__name__ == "PlanGNN"
    policy = _sb3_policy(checkpoint)
    for cluster, model, batch, seq in (("three-generations", "gpt2-medium", 64, 1024),
                                       ("a100-v100-16", "llama2-7b", 256, 2048), ("tiny-mixed", "gpt2-small", 16, 256)):
        obs = _batch(_observations(cluster, model, batch, seq))
        with torch.no_grad():
            features = policy.extract_features(obs, policy.pi_features_extractor)
            expected = policy.action_net(policy.mlp_extractor.forward_actor(features))
            embedding = model_embedding(net, obs["units"][:1].reshape(1, *SHAPES["units"]), obs["unit_mask"][:1])
            for candidate in (derived, net):
                assert torch.equal(logits_and_context(candidate, obs)[0], expected)
                assert torch.equal(logits_and_context(candidate, obs, embedding)[0], expected)
        assert expected.shape == (40, 32)


def test_the_torch_layer_is_pygs_dense_graph_conv_bit_for_bit():
    from torch_geometric.nn import DenseGraphConv

    from hetpart.policies.gnn import DenseConv

    torch.manual_seed(0)
    for aggr in ("add", "mean"):
        ref = DenseGraphConv(8, 6, aggr=aggr)
        ours = DenseConv(8, 6, aggr=aggr)
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(5, 7, 8)
        adj = (torch.rand(5, 7, 7) > 0.5).float() * torch.rand(5, 7, 7)
        mask = torch.rand(5, 7) > 0.3
        assert torch.equal(ours(x, adj, mask=mask), ref(x, adj, mask=mask))
        assert torch.equal(ours(x, adj), ref(x, adj))


def test_a_network_file_of_another_checkpoint_is_not_used(tmp_path):
    from hetpart.policies.gnn import checkpoint_digest, load_network, network_path, save_network
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT, load_policy

    checkpoint = tmp_path / "policy.zip"
    shutil.copy(DEFAULT_CHECKPOINT, checkpoint)
    net = load_policy(str(checkpoint))
    digest = checkpoint_digest(checkpoint)
    save_network(net, network_path(checkpoint), "0" * 64)  # as if taken from another checkpoint
    assert load_network(network_path(checkpoint), digest) is None
    assert load_network(network_path(checkpoint), "0" * 64) is not None
    assert load_network(tmp_path / "missing.net.pt", digest) is None


def test_planning_with_the_shipped_network_imports_neither_sb3_gymnasium_nor_pyg():
    from hetpart.policies.gnn import checkpoint_digest, load_network, network_path
    from hetpart.policies.policy_planner import DEFAULT_CHECKPOINT

    # the shipped checkpoint ships its network file (derived once: load_policy writes it where it is missing)
    assert load_network(network_path(DEFAULT_CHECKPOINT), checkpoint_digest(DEFAULT_CHECKPOINT)) is not None
    code = ("import sys\n"
            "from hetpart import Workload, load_cluster, load_model\n"
            "from hetpart.policies import plan\n"
            "r = plan(load_model('gpt2-small', seq_len=256), load_cluster('tiny-mixed'), Workload(16, 256), 'policy')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'stable_baselines3', 'sb3_contrib', 'gymnasium', "
            "'torch_geometric'}), r.prediction.metrics['tokens_per_s'] > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] True"
