"""What one virtual device holds: its parameters (whole, or ZeRO's flat shards), gradients
and optimizer.

A device's parameters fall in up to two buckets, each flattened and sharded by ZeRO
over its own data-parallel group (:mod:`.data_parallel`): the dense ones over the dp x cp
lanes (of its HSDP replica), a MoE model's routed experts over the expert_dp = dp/ep
replicas that hold the same experts (torchtitan's FSDP over ``dp_shard_mod_ep``;
Megatron-LM's expert data-parallel group).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shardlab.sim.shard import is_expert

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Bucket:
    """Parameters reduced (and ZeRO-sharded) together: their names, in the model's order,
    and whether they are routed experts (then over expert_dp, else over dp)."""

    names: list[str]
    experts: bool


def buckets_of(names: list[str]) -> list[Bucket]:
    """The dense bucket, then the routed experts' (only where the device holds experts)."""
    experts = [n for n in names if is_expert(n)]
    out = [Bucket([n for n in names if not is_expert(n)], False)]
    return [*out, Bucket(experts, True)] if experts else out


@dataclass
class Device:
    """One virtual device: replica d, pipeline stage s, tensor rank t, global id ``rank``;
    context-parallel rank c of its replica, and its lane d·cp + c (:mod:`.parallel`)."""

    rank: int
    d: int
    s: int
    t: int
    names: list[str]
    shapes: dict[str, torch.Size]
    buckets: list[Bucket]
    c: int = 0
    lane: int = 0
    params: Params = field(default_factory=dict)  # whole local tensors (ZeRO 0-2)
    shards: list[torch.Tensor] = field(default_factory=list)  # per bucket (ZeRO 1-3)
    grads: Params = field(default_factory=dict)  # accumulated over micro-batches
    grad_shards: list[torch.Tensor] = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None

    def numel(self) -> int:
        """Elements of every local parameter (this device's slice of the model)."""
        return sum(s.numel() for s in self.shapes.values())

    def flatten(self, tensors: Params, names: list[str]) -> torch.Tensor:
        """Concatenate ``tensors`` in the order of ``names``."""
        return torch.cat([tensors[n].reshape(-1) for n in names])

    def unflatten(self, flat: torch.Tensor, names: list[str]) -> Params:
        """Split a flat tensor back into the named local tensors ``names``."""
        out, i = {}, 0
        for n in names:
            k = self.shapes[n].numel()
            out[n] = flat[i:i + k].view(self.shapes[n])
            i += k
        return out

    def accumulate(self, params: Params) -> None:
        """Add the gradients ``params`` got in one micro-batch's backward to this device's
        accumulator, and clear them."""
        for n, v in params.items():
            if v.grad is not None:
                self.grads[n] = self.grads[n] + v.grad if n in self.grads else v.grad.clone()
                v.grad = None

    def set_grads(self, names: list[str], flat: torch.Tensor) -> None:
        """Replace the gradients of ``names`` by their slices of ``flat`` (a reduction's)."""
        for n, g in self.unflatten(flat, names).items():
            self.grads[n] = g.clone()

    def state_bytes(self, zero: int, el: int) -> dict[str, int]:
        """Bytes of weights, gradients and AdamW moments held after a step under ZeRO
        ``zero`` (``el`` bytes an element): the whole local tensors, or only the flat
        shards this device owns."""
        own = sum(x.numel() for x in self.shards) if self.shards else self.numel()
        weights = own if zero >= 3 else self.numel()
        grads = own if zero >= 2 else self.numel()
        assert self.optimizer is not None
        moments = sum(v.numel() for st in self.optimizer.state.values()
                      for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))
        return {"weights": weights * el, "gradients": grads * el, "optimizer": moments * el}
