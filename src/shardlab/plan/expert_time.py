"""Mixture-of-experts pieces of the step-time model (:mod:`shardlab.plan.step_time`),
vectorised over layouts: the tokens each rank routes, the assignments it keeps under a
capacity factor, and the seconds of the expert-parallel all-to-alls.

The formulas are :mod:`shardlab.estimate.expert`'s balanced case (GShard, Lepikhin et
al. 2020; Switch Transformer, Fedus et al. 2022, for the capacity), over numpy arrays.
An all-to-all in which each rank sends n bytes to its p - 1 peers costs
(p-1)·α + n/B (pairwise exchange, Thakur, Rabenseifner & Gropp 2005). The ep group spans
ep·etp consecutive ranks (expert tensor innermost, then ep: Megatron-LM's expert mesh,
where with etp = 1 the tensor-parallel ranks join the ep group, as in torchtitan): inside
a node while ep·etp <= devices
per node, else across the inter-node link.
"""

from __future__ import annotations

import numpy as np

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import RECOMPUTE
from shardlab.config.model import ModelShape
from shardlab.plan.space import Candidates


def kept_rows(model: ModelShape, tokens: np.ndarray, capacity_factor: np.ndarray
              ) -> np.ndarray:
    """Assignments a rank routing ``tokens`` keeps per micro-batch with balanced routing:
    T·k, or E·min(T·k/E, ceil(c·T·k/E)) with capacity factor c > 0
    (:func:`shardlab.estimate.expert.expert_alltoall_bytes`'s balanced case)."""
    e = model.moe
    assert e is not None
    assigned = tokens * e.experts_per_token
    cap = np.ceil(capacity_factor * assigned / e.experts) * e.experts
    return np.where(capacity_factor > 0, np.minimum(assigned, cap), assigned)


def routed_tokens(c: Candidates, seq: int) -> np.ndarray:
    """T per rank and micro-batch (:func:`shardlab.estimate.expert.layout_tokens`): b·s/cp,
    over tp under sequence parallelism with whole experts."""
    tokens = c.micro_batch * seq / c.cp
    return np.where(c.sp & (c.etp == 1), tokens / c.tp, tokens)


def alltoall_layer_seconds(m: ModelShape, c: Candidates, seq: int, policy: DtypePolicy,
                           latency: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
    """Seconds of one layer's expert-parallel all-to-alls per micro-batch (dispatch and
    combine, forward, backward and, under full recompute, forward again) on the link of
    ``latency`` (s) and ``bandwidth`` (bytes/s) per layout, averaged over the model's
    layers (dense ones have none)."""
    if m.moe is None or not m.moe_layers:
        return np.zeros(len(c))
    ep = c.ep.astype(float)
    sent = (ep - 1) / ep * kept_rows(m, routed_tokens(c, seq), c.capacity_factor) * (
        m.d_model * policy.activation_bytes)
    one = (ep - 1) * latency + sent / bandwidth
    calls = 2.0 * np.where(c.recompute == RECOMPUTE.index("full"), 3.0, 2.0)
    return np.where(c.ep > 1, calls * one, 0.0) * (m.moe_layers / m.layers)
