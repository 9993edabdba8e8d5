"""The shared featurizer: shapes, per-instance normalisation, no dependence on device labels."""

import numpy as np

from hetpart import load_cluster, load_model
from hetpart.cluster import parse_cluster
from hetpart.costmodel.features import LINK_FEATURES, POOL_FEATURES, STAGE_FEATURES, UNIT_FEATURES, \
    cluster_pools, link_features, pool_features, stage_features, unit_features
from hetpart.plan import Plan, Replica, Stage


def test_unit_features_shape_and_shares():
    model = load_model("gpt2-small", seq_len=128)
    x = unit_features(model)
    assert x.shape == (model.num_units, len(UNIT_FEATURES)) and x.dtype == np.float32
    assert np.isfinite(x).all()
    share = x[:, UNIT_FEATURES.index("fwd_flops_share")]
    np.testing.assert_allclose(share.sum(), 1.0, rtol=1e-5)
    assert np.abs(x).max() < 10  # log magnitudes are centred and scaled


def test_unit_features_do_not_grow_with_depth():
    small, deep = load_model("gpt2-small", seq_len=128), load_model("gpt2-medium", seq_len=128)
    assert unit_features(small).shape[1] == unit_features(deep).shape[1]


def test_pools_not_devices():
    cluster = load_cluster("a100-v100-16")
    pools = cluster_pools(cluster)
    x = pool_features(cluster, "bf16", pools)
    assert x.shape == (len(pools.pools), len(POOL_FEATURES)) and len(pools.pools) < cluster.num_devices
    np.testing.assert_allclose(x[:, POOL_FEATURES.index("devices_share")].sum(), 1.0, rtol=1e-5)
    assert x[:, POOL_FEATURES.index("tflops_over_max")].max() == 1.0
    index, links = link_features(cluster, pools)
    assert index.shape == (2, len(pools.pools) ** 2) and links.shape[1] == len(LINK_FEATURES)


def _plan(devs):
    return Plan(global_batch=8, micro_batch=1, seq_len=128, replicas=(
        Replica(0.5, (Stage((0, 7), devs[0:2], 2), Stage((7, 14), devs[2:4], 2))),
        Replica(0.5, (Stage((0, 7), devs[4:6], 2), Stage((7, 14), devs[6:8], 2)))))


def test_stage_features_invariant_to_relabelling_devices():
    model = load_model("gpt2-small", seq_len=128)
    cluster = parse_cluster({"name": "two-by-two", "nodes": [
        {"count": 2, "gpus_per_node": 8, "gpu": "A100-40GB", "intra_node": "NVLink3", "nic": "IB-HDR"},
        {"count": 2, "gpus_per_node": 4, "gpu": "V100-16GB", "intra_node": "NVLink2", "nic": "IB-EDR"}]})
    pools = cluster_pools(cluster)
    a = ("0/0/0", "0/0/1", "0/0/2", "0/0/3", "1/0/0", "1/0/1", "1/1/0", "1/1/1")
    b = ("0/1/5", "0/1/4", "0/1/7", "0/1/6", "1/1/3", "1/1/2", "1/0/2", "1/0/3")  # other nodes, other slots
    fa, ca = stage_features(model, _plan(a), pools)
    fb, cb = stage_features(model, _plan(b), pools)
    assert fa.shape == (4, len(STAGE_FEATURES)) and ca.shape == (4, len(pools.pools))
    np.testing.assert_array_equal(fa, fb)
    np.testing.assert_array_equal(ca, cb)
