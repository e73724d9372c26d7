"""The cluster model (`zaya_jax.planning.cluster`) against hand-computed α–β costs, and the device groups of HLO
collectives (`zaya_jax.planning.hlo_collectives`)."""

from __future__ import annotations

import pytest

from zaya_jax.planning.cluster import Cluster, Stage, price
from zaya_jax.planning.hlo_collectives import CollectiveOp, parse_groups

GB = 1e9
LINK, NIC = 48e9, 0.9 * 50e9  # the defaults: achieved xGMI link, NIC line rate × efficiency
AX, AN = 5e-6, 10e-6  # α per step: xGMI, network


@pytest.fixture(scope="module")
def cluster():
    return Cluster()


def test_defaults_are_the_paper_cluster(cluster):
    assert (cluster.gpus_per_node, cluster.xgmi_links, cluster.link, cluster.nic) == (8, 7, LINK, NIC)
    text = "\n".join(cluster.describe())
    for needle in (
        "GPUs per node 8",
        "7 links x 48 GB/s",
        "50 GB/s x efficiency 0.9",
        "alpha xGMI 5 us",
        "alpha network 10 us",
        "rails-only",
        "i // gpus_per_node",
    ):
        assert needle in text
    with pytest.raises(ValueError, match="fully connected"):
        Cluster(gpus_per_node=8, xgmi_links=4)


def test_reduce_scatter_inside_one_node_uses_xgmi_only(cluster):
    # 8 GB input per GPU: each GPU sends 1 GB to each of its 7 peers, one link each, in one step
    cost = cluster.reduce_scatter(8 * GB, range(8))
    assert (cost.latency, cost.nic) == (AX, 0.0)
    assert cost.xgmi == pytest.approx(1 * GB / LINK)


def test_reduce_scatter_across_nodes_is_hierarchical(cluster):
    # 64 GPUs = 8 nodes: intra-node RS of 8 GB (1 GB per peer), then a ring over 8 nodes per rail on 1 GB
    cost = cluster.reduce_scatter(8 * GB, range(64))
    assert cost.latency == pytest.approx(AX + 7 * AN)
    assert cost.xgmi == pytest.approx(1 * GB / LINK)
    assert cost.nic == pytest.approx(7 / 8 * 1 * GB / NIC)
    assert cluster.all_gather(8 * GB, range(64)) == cost  # all-gather mirrors it


def test_all_reduce_at_1024_gpus(cluster):
    # intra RS (1 GB / 8 per peer) -> inter RS over 128 nodes on 1/8 GB -> inter AG -> intra AG
    seconds = cluster.all_reduce(1 * GB, range(1024)).seconds
    one_way = AX + 0.125 * GB / LINK + 127 * AN + 127 / 128 * 0.125 * GB / NIC
    assert seconds == pytest.approx(2 * one_way)


def test_one_gpu_per_node_rides_one_rail_or_pays_a_hop(cluster):
    same_rail = tuple(range(0, 64, 8))  # GPU 0 of 8 nodes: one rail switch
    cost = cluster.all_gather(2 * GB, same_rail)
    assert (cost.latency, cost.xgmi) == (pytest.approx(7 * AN), 0.0)
    assert cost.nic == pytest.approx(7 / 8 * 2 * GB / NIC)
    cross = tuple(range(0, 72, 9))  # GPU k of node k: different rails, one xGMI hop to the right rail first
    hop = cluster.all_gather(2 * GB, cross)
    assert hop.seconds == pytest.approx(cost.seconds + AX + 2 * GB / LINK)


def test_all_to_all_and_permute(cluster):
    s = 16 * GB
    inside = cluster.all_to_all(s, range(8))  # 2 GB to each of 7 peers over 7 links
    assert inside.seconds == pytest.approx(AX + 2 * GB / LINK)
    two_nodes = cluster.all_to_all(s, range(16))  # 1 GB per peer; 8 GB leave through this GPU's NIC
    xgmi = (1 * GB + 8 * GB / 8) / LINK  # 7 local peers + forwarding the remote half to the right rails
    assert two_nodes.seconds == pytest.approx(AX + xgmi + AN + 8 * GB / NIC)
    assert cluster.permute(1 * GB, [(0, 1), (1, 2)]).seconds == pytest.approx(AX + 1 * GB / LINK)
    assert cluster.permute(1 * GB, [(0, 0), (8, 8)]) == Stage()  # to itself: a local copy
    assert CollectiveOp("collective-permute", "cp", GB, ((0, 0), (1, 1))).wire_bytes == 0
    assert cluster.permute(1 * GB, [(0, 8)]).seconds == pytest.approx(AN + 1 * GB / NIC)
    assert cluster.permute(1 * GB, [(0, 9)]).seconds == pytest.approx(AN + 1 * GB / NIC + AX + 1 * GB / LINK)


def test_hlo_ops_are_priced_by_kind(cluster):
    shard = 0.5 * GB  # all-gather operand = the per-device input shard; output = 16 × shard
    gather = CollectiveOp("all-gather", "ag", shard, (tuple(range(16)),))
    assert cluster.collective(gather) == cluster.all_gather(16 * shard, range(16))
    scatter = CollectiveOp("reduce-scatter", "rs", 8 * GB, (tuple(range(8)), tuple(range(8, 16))))
    assert cluster.collective(scatter) == cluster.reduce_scatter(8 * GB, range(8))  # two nodes, each inside
    alone = CollectiveOp("all-reduce", "ar", GB, ((0,), (1,)))
    assert cluster.collective(alone) == Stage()
    by_kind = price(cluster, [(gather, 3.0), (scatter, 2.0)])
    assert by_kind["all-gather"].seconds == pytest.approx(3 * cluster.collective(gather).seconds)
    assert by_kind["reduce-scatter"].seconds == pytest.approx(2 * cluster.collective(scatter).seconds)


def test_parse_replica_groups():
    assert parse_groups("all-reduce", "channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add", 4) == (
        (0, 1),
        (2, 3),
    )
    assert parse_groups("all-reduce", "replica_groups={}, to_apply=%add", 4) == ((0, 1, 2, 3),)
    assert parse_groups("all-gather", "replica_groups=[2,4]<=[8], dimensions={0}", 8) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert parse_groups("all-gather", "replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}", 8) == (
        (0, 2, 4, 6),
        (1, 3, 5, 7),
    )
    mesh = "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, use_global_device_ids=true"
    assert parse_groups("all-reduce", mesh, 8) == ((0, 4), (1, 5), (2, 6), (3, 7))
    permuted = (
        "replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}, use_global_device_ids=true"
    )
    assert parse_groups("all-reduce", permuted, 8) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert parse_groups("collective-permute", "source_target_pairs={{0,1},{1,2}}", 4) == ((0, 1), (1, 2))
