"""A ring across nodes leaves each node over the NICs of all its members there."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.config.dtypes import get_policy
from shardlab.config.hardware import get_accelerator
from shardlab.plan.comm_time import members_per_node, pick_link
from shardlab.plan.search import device_of

H100 = get_accelerator("H100 SXM")


def test_members_per_node_follow_the_stride() -> None:
    # dp 48 over tp 1, 2, 4, 8 (Megatron's order: tensor ranks innermost) on 8-GPU nodes.
    got = members_per_node(np.array([48, 48, 48, 48]), np.array([1, 2, 4, 8]), 8)
    assert got.tolist() == [8, 4, 2, 1]
    assert members_per_node(4, 1, 8).tolist() == 4  # a group smaller than the node
    assert members_per_node(2, 16, 8).tolist() == 1  # stride past the node: one each


def test_ring_bandwidth_is_k_nics_capped_by_the_intra_node_link() -> None:
    inside = np.array([False, False, False, True])
    k = np.array([1.0, 4.0, 8.0, 8.0])
    _, bw = pick_link(inside, H100.intra_link, H100.inter_link, 1.0, k)
    # 1 NIC of 50 GB/s; 4 of them; 8 x 50 = 400 < NVLink's 450; inside: NVLink.
    assert bw.tolist() == pytest.approx([50e9, 200e9, 400e9, 450e9])


def test_all_to_all_and_send_get_one_nic() -> None:
    dev, _ = device_of(H100, get_policy("bf16"), 64)
    out = np.array([False])
    ring = dev.link("all_gather", out, np.array([8.0]))[1]
    a2a = dev.link("all_to_all", out, np.array([8.0]))[1]
    send = dev.link("send", out, np.array([8.0]))[1]
    assert ring[0] == pytest.approx(8 * a2a[0]) and a2a[0] == pytest.approx(send[0])


def test_a_ring_step_pays_the_network_latency_on_one_step_in_k() -> None:
    # k members per node: one ring step in k crosses the network (10 µs), the others NVLink
    # (5 µs), as NCCL's tuning model splits a ring's steps; a send or all-to-all (k = 1)
    # and a ring alone in its node pay the network's; inside a node, NVLink's.
    inside = np.array([False, False, False, True])
    k = np.array([1.0, 2.0, 8.0, 8.0])
    lat, _ = pick_link(inside, H100.intra_link, H100.inter_link, 1.0, k)
    assert lat.tolist() == pytest.approx([10e-6, 7.5e-6, 5.625e-6, 5e-6])
