"""DDP with a loss weighted by the global real-token count equals one process on the batch.

The global batch holds garden documents of very different lengths, arranged so that the
first rank gets the shortest and the last rank the longest (the uneven case that matters).
Each rank wraps the same tiny shardlab :class:`TransformerLM` in
:class:`torch.nn.parallel.DistributedDataParallel` and takes one SGD step on its
:meth:`Batch.split` share, with

    loss_r = lm_loss_sum(share_r) * world / N        (N = real target tokens, all ranks)

DDP *averages* gradients (it all-reduces a sum and divides by the world size), so the
factor ``world`` cancels that division: the applied gradient is
``sum_r grad(lm_loss_sum(share_r)) / N``, the gradient of the mean loss over every real
token, which is what one process computes on the whole batch. Every rank also builds an
unwrapped copy of the model (same seed) and steps it on the whole batch: the reference.

Checks (rank 0's are reported; the runner requires every rank to pass):

* ``global_token_count``: the per-rank real-token counts, all-gathered, sum to N (a data
  loader that sees only its share learns N this way);
* ``weighted_loss_equals_full_batch`` / ``weighted_grad_equals_full_batch``: the ranks'
  weighted losses summed, and DDP's averaged gradient, match the reference (fp32,
  relative to the reference's largest value; 1e-6 and 1e-5);
* ``params_equal_full_batch_step``: after the step, max |param - reference param| divided
  by max |reference param| (the parameter scale) is <= 1e-5 in fp32;
* ``mean_of_means_differs``: a second DDP model trained on each rank's own mean loss
  (the common mistake) has a gradient whose relative difference from the reference
  exceeds 1e-3: the check passes when the mistake is *visible* (one rank: not applicable);
* ``params_identical_across_ranks``: the flat parameters, all-gathered after the step,
  are bit-identical on every rank (DDP's invariant: same start, same averaged gradient).

Collectives, in the same order on every rank: one all-gather of token counts, DDP's
broadcast and gradient all-reduce (twice: weighted and mean-of-means models), one
all-reduce of loss values, one all-gather of parameters. Writes nothing to ``work_dir``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shardlab.config.model import ModelShape
from shardlab.distributed.launch import RankContext
from shardlab.nn.data import Batch, global_token_normalizer, make_batch
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.nn.loss import lm_loss_sum
from shardlab.nn.model import TransformerLM
from shardlab.verify.registry import GLOBAL_BATCH, check

SHAPE = ModelShape("ddp-tiny", 2, 32, 4, garden_vocab().size, 64, style="llama", tied=False)
MODEL_SEED = 7  # every copy of the model starts from these weights
DOC_SEED = 2  # the garden documents the batch is drawn from
POOL = 64  # documents drawn; the batch takes GLOBAL_BATCH of them, spread over lengths
LR = 0.5  # large enough that the step moves parameters visibly
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-6, 1e-5, 1e-5  # fp32, relative
MEAN_OF_MEANS_MIN = 1e-3  # the mistake must change the gradient by more than this


def uneven_batch(size: int = GLOBAL_BATCH) -> Batch:
    """``size`` garden documents from shortest to longest (evenly spaced in length order),
    so consecutive shares, one per rank, hold very different numbers of real tokens."""
    if size < 2:
        raise ValueError(f"size must be >= 2 (got {size})")
    pool = sorted(garden_documents(POOL, seed=DOC_SEED), key=len)
    picks = [pool[round(i * (len(pool) - 1) / (size - 1))] for i in range(size)]
    return make_batch(picks, max(map(len, picks)) - 1)


def _flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _flat_grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def _on(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(t.to(device) for t in (batch.input_ids, batch.targets, batch.loss_mask,
                                          batch.pad_mask)))


def _loss_sum(model: nn.Module, batch: Batch) -> torch.Tensor:
    return lm_loss_sum(model(batch.input_ids, batch.pad_mask), batch.targets, batch.loss_mask)


def _ddp(ctx: RankContext, device: torch.device) -> DistributedDataParallel:
    model = TransformerLM(SHAPE, seed=MODEL_SEED).to(device)
    ids = [ctx.local_rank] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _gather(flat: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's 1-D ``flat``, as rows [world, n]. Gloo takes only the concatenated
    output form (a stacked [world, n] output is refused in torch 2.13), hence the view."""
    out = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    dist.all_gather_single(out, flat)
    return out.view(world, -1)


def _step(model: nn.Module) -> None:
    torch.optim.SGD(model.parameters(), lr=LR).step()


def run(ctx: RankContext, work_dir: str) -> list[dict[str, object]]:
    """One token-weighted DDP step and one mean-of-means step against the full batch."""
    device, world, rank = torch.device(ctx.device), ctx.world_size, ctx.rank
    batch = _on(uneven_batch(), device)
    local = batch.chunk(rank, world)
    n_global = global_token_normalizer(batch)

    counts = _gather(torch.tensor([local.real_tokens], dtype=torch.int64, device=device), world)
    per_rank = counts.reshape(-1).tolist()

    # The reference: one process, the whole batch, the mean over every real token.
    ref = TransformerLM(SHAPE, seed=MODEL_SEED).to(device)
    ref_loss = _loss_sum(ref, batch) / n_global
    ref_loss.backward()
    ref_grad = _flat_grads(ref)
    start = _flat_params(ref)  # a copy (torch.cat allocates)
    _step(ref)
    ref_params = _flat_params(ref)

    # Token-weighted DDP. DDP divides the all-reduced gradient sum by `world`, so the local
    # sum is scaled by world / N: the ranks' contributions then add up to sum / N.
    ddp = _ddp(ctx, device)
    weighted = _loss_sum(ddp, local) * world / n_global
    weighted.backward()
    ddp_grad = _flat_grads(ddp.module)
    _step(ddp.module)
    ddp_params = _flat_params(ddp.module)

    # The mistake: each rank's own mean; DDP then averages the ranks' means.
    naive = _ddp(ctx, device)
    local_mean = _loss_sum(naive, local) / local.real_tokens
    local_mean.backward()
    naive_grad = _flat_grads(naive.module)

    losses = torch.stack([weighted.detach() / world, local_mean.detach() / world]).double()
    dist.all_reduce(losses)  # [sum of shares / N, mean of the ranks' means]
    weighted_total, mean_of_means = losses.tolist()

    every = _gather(ddp_params, world)
    spread = float((every - every[0]).abs().max())

    full = float(ref_loss.detach())
    naive_rel = _rel(naive_grad, ref_grad)
    per_seq = batch.loss_mask.sum(dim=1).tolist()
    return [
        check("global_token_count", abs(sum(per_rank) - n_global), 0,
              detail=f"real target tokens by rank {per_rank} (by sequence {per_seq}); "
                     f"all-gathered sum {sum(per_rank)}, whole batch N = {n_global}"),
        check("weighted_loss_equals_full_batch", abs(weighted_total - full) / abs(full),
              LOSS_TOL, detail=f"sum over ranks of lm_loss_sum(share)/N = {weighted_total:.7f}; "
                               f"full batch {full:.7f} (relative, fp32)"),
        check("weighted_grad_equals_full_batch", _rel(ddp_grad, ref_grad), GRAD_TOL,
              detail="DDP-averaged gradient of lm_loss_sum(share) * world / N vs one process "
                     "on the whole batch: max |diff| / max |reference grad| (fp32)"),
        check("params_equal_full_batch_step", _rel(ddp_params, ref_params), PARAM_TOL,
              detail=f"after one SGD step (lr {LR}): max |param diff| / max |param| = "
                     f"{_rel(ddp_params, ref_params):.2e} (parameter scale "
                     f"{float(ref_params.abs().max()):.3f}; fp32); relative to the update "
                     f"itself {_rel(ddp_params - start, ref_params - start):.2e}"),
        check("mean_of_means_differs", naive_rel, MEAN_OF_MEANS_MIN,
              passed=naive_rel > MEAN_OF_MEANS_MIN if world > 1 else True,
              detail=(f"passes when the relative gradient difference exceeds "
                      f"{MEAN_OF_MEANS_MIN:g}: it is {naive_rel:.3e}; loss: mean of the ranks' "
                      f"means {mean_of_means:.5f} vs full batch {full:.5f}, because every rank "
                      f"weighs the same however many tokens it holds")
              if world > 1 else "not applicable on one rank: its mean is the full-batch mean"),
        check("params_identical_across_ranks", spread, 0.0,
              detail=f"max |rank r's params - rank 0's| over {world} ranks, "
                     f"{ddp_params.numel()} parameters, after the step"),
    ]
