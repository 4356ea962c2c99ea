"""A dry run beside the cost model: per role and category, predicted, dry-run and ratio.

Torch-free: it reads the roles :func:`shardlab.dryrun.role.run_role` returned and prices
the same shape, layout and dtype with the cost model ``shardlab train`` prints beside
its measurement (:mod:`shardlab.train.report`: ZeRO states of each pipeline rank's
parameters, activations of shardlab's eager LM times the micro-batches in flight, ring
bytes per mesh dim).

Which dry-run figure meets which prediction:

* ``params``, ``grads``, ``optimizer``: what the rank holds after its backward
  (``state_bytes``, as ``train`` counts it): the cost model's states, which it adds up
  as if all were alive at the peak;
* ``activations``: what one micro-batch saves for backward (saved-tensor hooks, as
  ``train`` counts it) x the micro-batches in flight at the peak, against the same in
  the cost model; ``activations_tracked``: the largest activation figure of the step
  (the trackers' ``Activation`` and ``Inputs`` types), which also holds what autograd
  does not save (a stage's outputs kept by the schedule, the loss's inputs);
* ``temporaries``: what else is alive at the peak (FSDP's gathered weights and
  gradients, communication buffers, the loss's working tensors, activation gradients):
  the cost model counts the loss's tensors beyond its saved log-probabilities, the units
  FSDP2 keeps gathered from forward to backward, and what FSDP keeps gathered for the
  whole step inside a pipeline (:mod:`shardlab.train.report_temporaries`); not a layer's
  backward working set;
* ``peak_bytes``: the tracker's peak, against the cost model's sum.

Beyond the trackers' sight (on a GPU): the CUDA context and kernels
(:data:`CUDA_CONTEXT_BYTES`, added as a documented allowance to the fit verdict),
NCCL's communication buffers and workspaces, and the caching allocator's
fragmentation (reserved minus allocated).
"""

from __future__ import annotations

from typing import Any

from shardlab.errors import SpecError
from shardlab.train.report import comm_table, held_microbatches, predicted_state_bytes
from shardlab.train.report_activations import predicted_activation_bytes
from shardlab.train.report_temporaries import predicted_temporary_bytes

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")
"""The categories of a role's memory, in the cost model's terms."""

CUDA_CONTEXT_BYTES = 1343 * 2**20
"""The CUDA context and kernels a process holds once it has touched the GPU, outside
PyTorch's allocator: 1343 MiB measured by Hugging Face ("Model training anatomy",
transformers docs, docs/source/en/model_memory_anatomy.md: "the kernels alone take up
1.3GB", on a V100 with CUDA 11.2), the allowance the fit verdict adds."""


def check_dry_runnable(cfg: Any) -> None:
    """SpecError for a job the dry run cannot run: DDP over more than one rank (``zero=0``).
    torch's DDP builds its C++ reducer's buckets from the parameters' storage at its first
    forward (``_verify_param_shape_across_processes``, then the bucket views), which fake
    tensors do not have; FSDP2, tensor, pipeline and context parallelism run on them."""
    if cfg.dp_mode == "ddp" and cfg.grad_ranks > 1:
        raise SpecError("zero", 0, "DDP's C++ reducer needs real tensors, which the dry run "
                        "does not allocate: dry-run zero=2 or 3 (FSDP2), or run it with "
                        "`shardlab train --dp-mode ddp`")


def role_ranks(cfg: Any) -> list[int]:
    """One rank per distinct role: each pipeline rank's first (dp 0, cp 0, tp 0) rank, on
    train's row-major ``(pp, dp, cp, tp)`` mesh. Ranks that differ only in their data-,
    context- or tensor-parallel index run the same program on shards of equal size (FSDP2
    pads the last shard; tensor parallelism needs even splits; every cp rank holds two
    chunks of s/2cp tokens and all s keys), so their figures are equal; under expert
    parallelism with contiguous routing the dp rank holding the first experts takes the
    most rows (expert e takes one more than the last when e < T·k mod E), so dp 0 is the
    busiest of its stage."""
    return [p * cfg.dp * cfg.cp * cfg.tp for p in range(cfg.pp)]


def predicted_role(cfg: Any, pp_rank: int, role: dict[str, Any] | None = None
                   ) -> dict[str, float]:
    """The cost model's bytes of a rank on pipeline rank ``pp_rank`` (``role``'s own shards
    of the parameters, when given), by category, and their sum (``peak_bytes``)."""
    states = predicted_state_bytes(cfg, pp_rank, role)
    out = {"params": float(states.weights), "grads": float(states.gradients),
           "optimizer": float(states.optimizer),
           "activations": held_microbatches(cfg, pp_rank)
           * predicted_activation_bytes(cfg, pp_rank),
           "temporaries": predicted_temporary_bytes(cfg, pp_rank)}
    out["peak_bytes"] = sum(out[c] for c in CATEGORIES)
    return out


def measured_role(cfg: Any, role: dict[str, Any]) -> dict[str, float]:
    """The dry-run figure that meets each prediction (see the module docstring)."""
    held = role["state_bytes"]
    saved = role.get("saved_bytes_per_microbatch") or 0
    return {"params": float(held["params"]), "grads": float(held["grads"]),
            "optimizer": float(held["optimizer"]),
            "activations": float(saved * held_microbatches(cfg, role["pp_rank"])),
            "activations_tracked": float(role["activation_peak_bytes"]),
            "temporaries": float(role["by_category"]["temporaries"]),
            "peak_bytes": float(role["peak_bytes"])}


def ratios(measured: dict[str, float], predicted: dict[str, float]) -> dict[str, float | None]:
    """dry-run / predicted per key (None where the cost model predicts nothing); the
    trackers' activation figure meets the same prediction as the saved bytes."""
    pred = {**predicted, "activations_tracked": predicted["activations"]}
    return {k: (measured[k] / pred[k] if pred[k] else None) for k in measured}


def ep_members(cfg: Any, role: dict[str, Any]) -> list[dict[str, Any]]:
    """``role`` and the other ranks of its expert-parallel group, as ``train``'s comm table
    reads a group (:func:`shardlab.train.report_moe.ep_groups`): the dry run routes
    contiguously, so every member routed the counts ``role`` recorded (the same tokens
    per forward, :mod:`shardlab.nn.moe_contiguous`); each is ``role`` at its own ep
    index (ep innermost in dp: global rank + dp offset x cp x tp)."""
    if cfg.shape.moe is None or cfg.ep == 1:
        return [role]
    first = role["dp_rank"] - role["ep_rank"]
    return [{**role, "ep_rank": j, "dp_rank": first + j,
             "rank": role["rank"] + (first + j - role["dp_rank"]) * cfg.cp * cfg.tp}
            for j in range(cfg.ep)]


def compare(cfg: Any, roles: list[dict[str, Any]], capacity: float | None = None,
            allowance: float = CUDA_CONTEXT_BYTES) -> dict[str, Any]:
    """Every role with its prediction and ratios, the busiest first; comm bytes per dim
    beside the cost model's (``train``'s table); the fit verdict on a device of
    ``capacity`` bytes (None: no verdict) with ``allowance`` added to the peak."""
    members = [m for r in roles for m in ep_members(cfg, r)]
    comm = {row["rank"]: row for row in comm_table(cfg, members)}
    out = []
    for role in sorted(roles, key=lambda r: -r["peak_bytes"]):
        predicted = predicted_role(cfg, role["pp_rank"], role)
        measured = measured_role(cfg, role)
        entry = {**role, "predicted": predicted, "measured": measured,
                 "ratio": ratios(measured, predicted)}
        row = comm[role["rank"]]
        entry["by_dim"] = {d: row[d] for d in ("dp", "dp_replicate", "cp", "tp", "pp", "ep",
                                               "edp") if d in row}
        out.append(entry)
    busiest = out[0]
    doc: dict[str, Any] = {
        "roles": out, "busiest_rank": busiest["rank"],
        "peak_bytes": busiest["peak_bytes"], "by_category": busiest["by_category"],
        "by_dim": busiest["by_dim"],
        "flops": sum(busiest["flops_by_op"].values()),
        "predicted": {"rank": busiest["rank"], "peak_bytes": busiest["predicted"]["peak_bytes"],
                      "by_category": {c: busiest["predicted"][c] for c in CATEGORIES}},
        "ratio": busiest["ratio"],
        "unseen": ["CUDA context and kernels (allowance below)", "NCCL buffers and "
                   "workspaces", "allocator fragmentation (reserved - allocated)"],
    }
    if capacity is not None:
        need = busiest["peak_bytes"] + allowance
        doc["fit"] = {"capacity_bytes": capacity, "allowance_bytes": allowance,
                      "needed_bytes": need, "headroom_bytes": capacity - need,
                      "fits": need <= capacity,
                      "predicted_fits": busiest["predicted"]["peak_bytes"] + allowance
                      <= capacity}
    return doc
