"""Activation offloading to host memory (``--layout offload_layers=N``), as Megatron-Core
runs it: the saved activations of N of a rank's layers copied to the host in forward and
back in backward, on streams of their own beside the compute.

Megatron-Core (``--cpu-offloading-num-layers N``, ``TransformerConfig.cpu_offloading``)
wraps each layer in Transformer Engine's ``get_cpu_offload_context``; TE v1.10 to v2.9
spread the N offloads over the M layers of the rank, each offload finished (and its GPU
memory freed) M/N layers later and reloaded as far ahead in backward (``layer_window_map``,
two-way ``wait_stream`` between the copy and compute streams, no host sync), so about M - N
layers' activations stay on the device (TE v2.10's docstring: "(num_layers -
num_offloaded_layers) * T"). Megatron-Core refuses it with pipeline parallelism
("Currently there is no support for Pipeline parallelism with CPU offloading"), with
activation recomputation, and for N >= the layers.

Memory (:func:`shardlab.plan.memory.memory_arrays`): the rank's layer activations times
(M - N)/M stay; the rest, N/M of them, is the bytes held on the host per micro-batch.

Time, per micro-batch and direction: each offloaded layer's activations (offloaded/N
bytes) cross the host link (``Accelerator.host_link``, per device and direction) while the
next M/N layers compute; only what the copy takes beyond that window is exposed:

    exposed = N · (max(0, c − (M/N)·f) + max(0, c − (M/N)·b)),   c = (offloaded / N) / B

with f and b one layer's forward and backward seconds and B the link's bandwidth at the
curve's link fraction; the rest of the 2·N·c is hidden.
"""

from __future__ import annotations

import numpy as np

from shardlab.config.hardware import Link
from shardlab.config.layout import RECOMPUTE
from shardlab.errors import SpecError
from shardlab.plan.space import Candidates


def offload_refused(c: Candidates, n: int) -> np.ndarray:
    """The layouts of ``c`` that cannot offload ``n`` layers: Megatron-Core refuses CPU
    offloading with a pipeline and with activation recomputation
    (``TransformerConfig.__post_init__``; :data:`shardlab.plan.rules.R_OFFLOAD`); none when
    ``n`` is 0."""
    if n <= 0:
        return np.zeros(len(c), bool)
    return (c.pp > 1) | (c.recompute != RECOMPUTE.index("none"))


def check_offload(n: int, layers: int, host_link: Link | None, accelerator: str) -> None:
    """SpecError for ``offload_layers=n`` a model of ``layers`` layers on ``accelerator``
    cannot take: n must be below the layers (Megatron-Core: ``cpu_offloading_num_layers``
    less than ``num_layers``) and the device must have a host link in the catalog."""
    if n <= 0:
        return
    if n >= layers:
        raise SpecError("offload_layers", n, f"must be below the model's {layers} layers "
                        "(at least one layer stays on the device)")
    if host_link is None:
        raise SpecError("offload_layers", n, f"{accelerator} has no host link to copy over "
                        "(a --hardware-file entry states one as host_link)")


def offload_seconds(offloaded: np.ndarray, n: int, layers: float, forward: np.ndarray,
                    backward: np.ndarray, link: Link | None, fraction: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) seconds per micro-batch of offloading ``n`` of ``layers`` layers
    whose activations are ``offloaded`` bytes in all (module docstring); ``forward`` and
    ``backward``: one layer's seconds; ``link``: the host link, at ``fraction`` of its
    bandwidth each way (the curve's link fraction)."""
    if n <= 0 or link is None:
        zero = np.zeros(len(np.atleast_1d(offloaded)))
        return zero, zero
    copy = np.asarray(offloaded, float) / n / (link.bandwidth * fraction)
    window = layers / n
    exposed = n * (np.maximum(0.0, copy - window * forward)
                   + np.maximum(0.0, copy - window * backward))
    return exposed, 2.0 * n * copy - exposed
