"""Seconds of the collectives a layout runs, vectorised over layouts (alpha-beta, ring).

Ring algorithms on p ranks and an n-byte buffer (Thakur, Rabenseifner & Gropp 2005),
α the link latency, B its bandwidth times the fraction collectives reach
(:class:`shardlab.config.hardware.Efficiency`):

* all-reduce: 2(p-1)·α + 2·(p-1)/p·n/B;
* reduce-scatter or all-gather: (p-1)·α + (p-1)/p·n/B;
* point-to-point send: α + n/B.

These are the formulas of :mod:`shardlab.estimate.comm`, over numpy arrays so that a
search times every layout at once. Which link a group uses follows Megatron-LM's rank
order (tensor fastest, then data, then pipeline; Narayanan et al. 2021): a tensor
group stays in a node while t <= devices per node, a data group while t·d does, and
neighbouring pipeline stages share a node only when the whole job fits in one.

**A ring across nodes uses every NIC its members hold** (:func:`members_per_node`). NCCL
builds one ring per channel and leaves each node through a different member's NIC, so a
ring all-reduce, reduce-scatter or all-gather whose group has k members in each node moves
its inter-node bytes over k NICs at once: bandwidth k x the device's share of the network,
no more than the intra-node link the bytes also cross. NCCL's maintainers: "On an Nvidia
DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW"
(NVIDIA/nccl issue 812, quoted in issue 1576: eight NICs of 25 GB/s); "add more NICs and
you should get more bandwidth, up to 160GB/s which is the NVLink intra-node bandwidth"
(NVIDIA/nccl issue 412). The groups that share a node share its NICs: with k members of
each group in a node, the node holds devices/k such groups, each on k NICs. An all-to-all
or a point-to-point send gets one NIC: "Alltoall cannot aggregate the bandwidth of multiple
NICs, so the performance you should see is the performance of a single NIC"
(NVIDIA/nccl-tests issue 267).
"""

from __future__ import annotations

import numpy as np

from shardlab.config.hardware import Link


def _arr(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, float)


def allreduce_seconds(nbytes: np.ndarray | float, p: np.ndarray | int, latency: np.ndarray,
                      bandwidth: np.ndarray) -> np.ndarray:
    """Ring all-reduce: 2(p-1)α + 2(p-1)/p·n/B; 0 for p = 1."""
    p = _arr(p)
    t = 2 * (p - 1) * latency + 2 * (p - 1) / p * _arr(nbytes) / bandwidth
    return np.where(p > 1, t, 0.0)


def gather_seconds(nbytes: np.ndarray | float, p: np.ndarray | int, latency: np.ndarray,
                   bandwidth: np.ndarray) -> np.ndarray:
    """Ring reduce-scatter or all-gather: (p-1)α + (p-1)/p·n/B; 0 for p = 1."""
    p = _arr(p)
    t = (p - 1) * latency + (p - 1) / p * _arr(nbytes) / bandwidth
    return np.where(p > 1, t, 0.0)


def send_seconds(nbytes: np.ndarray | float, latency: np.ndarray,
                 bandwidth: np.ndarray) -> np.ndarray:
    """One point-to-point message: α + n/B."""
    return latency + _arr(nbytes) / bandwidth


def members_per_node(group: np.ndarray | int, stride: np.ndarray | int,
                     gpus_per_node: int) -> np.ndarray:
    """Members of a group of ``group`` ranks, ``stride`` apart in the rank order, that share
    one node of ``gpus_per_node`` devices: min(group, devices // stride), at least 1."""
    per = np.asarray(gpus_per_node, float) // np.maximum(np.asarray(stride, float), 1.0)
    return np.clip(np.minimum(per, np.asarray(group, float)), 1.0, None)


def pick_link(inside: np.ndarray, intra: Link, inter: Link, link_fraction: float,
              per_node: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(latency per ring step, achievable bandwidth) per layout: the intra-node link where
    ``inside``, else ``per_node`` NICs' worth of the inter-node link (a ring over a group
    with that many members per node: module docstring), no faster than the intra-node link.
    Such a ring crosses the network on one step in ``per_node`` and NVLink on the others,
    so its step latency is the mean of the two links' (NCCL's own tuning model charges a
    ring (nsteps - nInterSteps) x the intra-node and nInterSteps = nNodes - 1 x the network
    latency: NVIDIA/nccl src/graph/tuning.cc)."""
    k = np.maximum(np.asarray(per_node, float), 1.0)
    latency = np.where(inside, intra.latency, intra.latency * (1 - 1 / k) + inter.latency / k)
    across = np.minimum(inter.bandwidth * np.asarray(per_node, float), intra.bandwidth)
    bandwidth = np.where(inside, intra.bandwidth, across) * link_fraction
    return latency, bandwidth
