"""Model-state bytes per device under ZeRO: weights, gradients and optimizer state.

ZeRO paper (Rajbhandari et al. 2020, Sec. 5.1) for Ψ parameters on a model-parallel
rank, data-parallel degree N_d and the dtype policy's bytes w (weight), g (gradient),
o (optimizer):

  stage 0: (w + g + o)·Ψ          stage 2: w·Ψ + (g + o)·Ψ/N_d
  stage 1: (w + g)·Ψ + o·Ψ/N_d    stage 3: (w + g + o)·Ψ/N_d

which for bf16 with fp32 master Adam (2 + 2 + 12) is the paper's 16Ψ, 4Ψ + 12Ψ/N_d,
2Ψ + 14Ψ/N_d and 16Ψ/N_d.

A mixture-of-experts rank holds two kinds of parameters that ZeRO shards over two
different groups: the dense ones (attention, norms, router, shared experts,
embedding) are replicated on all dp ranks and sharded over dp; the routed experts are
replicated only on the expert_dp = dp / ep ranks that hold the same experts, and are
sharded over those (torchtitan's FSDP over ``dp_shard_mod_ep`` for experts;
Megatron-LM's distributed optimizer over the expert data-parallel group).

Context parallelism and HSDP change the groups, not the formulas (:func:`zero_groups`):
the cp ranks of a replica hold the same parameters, so ZeRO/FSDP folds cp into its shard
group (torchtitan's ``dp_shard_cp`` mesh: states over dp x cp); HSDP (``dp_replicate`` =
R > 1, FSDP2 on a 2-D mesh) shards over the dp/R ranks of one replica times cp and keeps R
replicas of each shard. Routed experts shard over expert_dp x cp, or under HSDP over the
(dp/R)/ep expert replicas of one replica times cp when ep divides dp/R (else HSDP leaves
the experts sharded over all their expert_dp x cp replicas, one replica of the shard).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.config.dtypes import DtypePolicy
from shardlab.config.layout import Layout


@dataclass(frozen=True)
class StateBytes:
    """Bytes of weights, gradients and optimizer state on one device."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """Sum of the three."""
        return self.weights + self.gradients + self.optimizer

    def __add__(self, other: StateBytes) -> StateBytes:
        return StateBytes(self.weights + other.weights, self.gradients + other.gradients,
                          self.optimizer + other.optimizer)


def zero_state_bytes(params: float, policy: DtypePolicy, zero: int, dp: int) -> StateBytes:
    """Model-state bytes per device under ZeRO ``zero`` over ``dp`` devices (module docstring)."""
    w = params * policy.weight_bytes
    g = params * policy.grad_bytes
    o = params * policy.optimizer_bytes
    return StateBytes(w / dp if zero >= 3 else w, g / dp if zero >= 2 else g,
                      o / dp if zero >= 1 else o)


def split_state_bytes(dense: float, experts: float, policy: DtypePolicy, zero: int, dp: int,
                      expert_dp: int) -> StateBytes:
    """States of ``dense`` parameters sharded over ``dp`` plus ``experts`` parameters
    sharded over ``expert_dp`` (module docstring); = :func:`zero_state_bytes` of the sum
    when expert_dp = dp (no expert parallelism)."""
    return (zero_state_bytes(dense, policy, zero, dp)
            + zero_state_bytes(experts, policy, zero, expert_dp))


@dataclass(frozen=True)
class ZeroGroups:
    """Ranks ZeRO/FSDP shards each kind of parameter over, and the replicas of each shard
    (module docstring). ZeRO-0's gradient all-reduce runs over ``dense * replicas`` (= dp x
    cp) and ``experts * expert_replicas`` (= expert_dp x cp) ranks."""

    dense: int
    experts: int
    replicas: int
    expert_replicas: int


def zero_groups(lay: Layout) -> ZeroGroups:
    """:class:`ZeroGroups` of a layout: dense parameters over dp_shard x cp with
    dp_replicate replicas (:func:`shardlab.estimate.context.shard_group` reads it),
    routed experts over expert_dp x cp, or (dp_shard/ep) x cp with dp_replicate replicas
    when ep divides dp_shard under HSDP; with :attr:`~shardlab.config.layout.Layout.
    expert_fold` over tp·cp·dp/(ep·etp) (tp·cp·dp_shard/(ep·etp) per HSDP replica)."""
    r = lay.dp_replicate
    fold = lay.cp * (lay.tp // lay.etp) if lay.expert_fold else 1  # ranks per dp rank
    after = 1 if lay.expert_fold else lay.cp  # unfolded, expert shards also span cp
    if r > 1 and lay.dp_shard * fold % lay.ep == 0:
        return ZeroGroups(lay.dp_shard * lay.cp, lay.dp_shard * fold // lay.ep * after, r, r)
    return ZeroGroups(lay.dp_shard * lay.cp, lay.expert_replicas, r, 1)
