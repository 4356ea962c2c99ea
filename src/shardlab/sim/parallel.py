"""The layout the simulator runs, where each device sits in it, and the optimizer it runs.

Device (d, c, s, t) is data-parallel replica d, context-parallel rank c, pipeline stage s,
tensor-parallel rank t. A replica's cp ranks each run its micro-batches on their own
tokens, so the simulator calls (d, c) a *lane*, l = d·cp + c: lanes run the pipeline
side by side, and the global id of a device is (l·pp + s)·tp + t (with cp = 1, l = d).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Parallel:
    """The layout the simulator runs: degrees, ZeRO stage, sequence parallel, schedule, the
    expert-parallel degree (ep divides dp; experts stay whole on every tensor rank), the
    context-parallel degree, the layers of each pipeline stage (empty: the even split)
    and the HSDP replicas (dp_replicate divides dp; ZeRO shards inside each)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    sp: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"
    ep: int = 1
    cp: int = 1
    stage_layers: tuple[int, ...] = ()
    dp_replicate: int = 1

    @property
    def expert_dp(self) -> int:
        """Replicas holding the same experts: dp / ep."""
        return self.dp // self.ep

    @property
    def dp_shard(self) -> int:
        """Replicas inside one HSDP replica group: dp / dp_replicate."""
        return self.dp // self.dp_replicate

    @property
    def lanes(self) -> int:
        """(replica, cp rank) pairs, each running the pipeline on its own tokens: dp x cp."""
        return self.dp * self.cp

    def rank(self, lane: int, s: int, t: int) -> int:
        """Global id of the device of ``lane`` on stage s, tensor rank t."""
        return (lane * self.pp + s) * self.tp + t

    def place(self, rank: int) -> tuple[int, int, int, int]:
        """(d, c, s, t) of global id ``rank``: the inverse of :meth:`rank`."""
        lane, rest = divmod(rank, self.pp * self.tp)
        return lane // self.cp, lane % self.cp, rest // self.tp, rest % self.tp


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW hyper-parameters (Loshchilov & Hutter 2019), the same for the reference."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    # Adam divides by sqrt(v) + eps: for gradients near zero it magnifies the ~1e-7 fp32
    # rounding of differently ordered sums by up to |g|/eps. With 1e-8 a correct layout's
    # parameters drift ~5e-5 of their scale from one device's in 5 steps (measured); with
    # 1e-6 about 1e-6, inside the 1e-5 check. float64 runs are exact either way.
    eps: float = 1e-6
    weight_decay: float = 0.1

    def make(self, params: list[torch.Tensor]) -> torch.optim.AdamW:
        """torch's AdamW, single-tensor path, so flat shards and whole tensors do the same
        arithmetic element by element."""
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps,
                                 weight_decay=self.weight_decay, foreach=False)


DEFAULT_ADAMW = AdamWConfig()
