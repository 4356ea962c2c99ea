"""Dry-run one rank of an N-rank training job in this process, on fake tensors.

:func:`run_role` builds rank R's program with :func:`shardlab.train.rank.build_rank`
(the one ``shardlab train`` runs) on torch's fake process group, with the model on the
meta device materialised as fake tensors, and runs two full optimizer steps of
:func:`shardlab.train.rank.train_step` (micro-batches or the pipeline schedule,
clipping, AdamW) on a fake batch. The second step is measured, as ``train`` measures a
step past FSDP's lazy initialisation and the optimizer's first (state-creating) step:

* peak memory by category and its moment (:mod:`shardlab.dryrun.tracker`);
* what one micro-batch saves for backward (saved-tensor hooks, as ``train`` measures it);
* what the rank holds after the backward (parameters, gradients, optimizer state:
  :func:`shardlab.distributed.measure.state_bytes`, as ``train`` counts them);
* bytes sent per collective kind and mesh dim (:class:`~shardlab.distributed.measure.CommMeter`);
* FLOPs (:class:`~shardlab.distributed.measure.FlopMeter`);
* a mixture of experts' routing, as ``train`` records it
  (:class:`~shardlab.distributed.expert_parallel.RoutingRecorder`): the dry run routes
  contiguously (:mod:`shardlab.nn.moe_contiguous`), whose counts are known without values.

Which ranks are worth running (one per pipeline rank) is ``shardlab dryrun``'s
``--all-roles`` (:func:`shardlab.cli.dryrun.role_ranks`); each runs in its own process
(:mod:`shardlab.dryrun.pool`).
"""

from __future__ import annotations

import contextlib
import resource
import time
from typing import Any

import torch
from torch import nn

from shardlab.distributed.expert_parallel import RoutingRecorder
from shardlab.distributed.measure import CommMeter, FlopMeter, state_bytes
from shardlab.dryrun.fake import (
    check_all_fake,
    fake_mode,
    fake_world,
    fp8_weight_flatten,
    materialize,
    skip_pipeline_vote,
    strict,
)
from shardlab.dryrun.tracker import peak_breakdown, role_tracker
from shardlab.nn.data import Batch
from shardlab.train.config import TrainConfig, fsdp_mixed_precision
from shardlab.train.rank import bf16_autocast, build_rank, train_step

STEPS = 2
"""Optimizer steps a dry run takes; the last is measured."""


def coordinates(cfg: TrainConfig, rank: int) -> dict[str, int]:
    """``rank``'s pipeline, data-, context-, tensor- and expert-parallel indices (the
    mesh's row-major ``(pp, dp, cp, tp)`` order, ep innermost in dp:
    :mod:`shardlab.distributed.mesh`)."""
    pp_rank, rest = divmod(rank, cfg.dp * cfg.cp * cfg.tp)
    dp_rank, rest = divmod(rest, cfg.cp * cfg.tp)
    cp_rank, tp_rank = divmod(rest, cfg.tp)
    return {"pp_rank": pp_rank, "dp_rank": dp_rank, "cp_rank": cp_rank, "tp_rank": tp_rank,
            "ep_rank": dp_rank % cfg.ep}


def fake_batch(cfg: TrainConfig, dp_rank: int) -> Batch:
    """A data-parallel rank's share of the global batch, all tokens real (call under the
    fake mode: the tensors are fake). As in ``train``'s loop, every rank holds the whole
    global batch and takes its share as a view of it."""
    ids = torch.zeros((cfg.global_batch, cfg.seq), dtype=torch.int64)
    ones = torch.ones((cfg.global_batch, cfg.seq), dtype=torch.int64)
    batch = Batch(input_ids=ids, targets=ids.clone(), loss_mask=ones, pad_mask=ones.clone())
    return batch.split(cfg.dp)[dp_rank]


def run_role(cfg: TrainConfig, rank: int) -> dict[str, Any]:
    """Dry-run ``rank`` of ``cfg``'s job; its figures as a JSON-ready dict."""
    start = time.perf_counter()
    mode = fake_mode()
    torchao_weights = (fp8_weight_flatten() if cfg.fp8_all_gather
                       else contextlib.nullcontext())
    with fake_world(rank, cfg.world), torchao_weights:
        program = build_rank(cfg, "cpu", meta=True, force_sum=False,
                             materialize=lambda modules: materialize(mode, modules))
        check_all_fake(program.modules)
        if program.schedule is not None:
            skip_pipeline_vote(program.schedule)
        autocast = (bf16_autocast(cfg, "cpu") if not fsdp_mixed_precision(cfg)
                    else contextlib.nullcontext())
        with mode:
            share = fake_batch(cfg, program.dp_rank)
        tokens = cfg.global_batch * cfg.seq
        for _ in range(STEPS - 1):
            with strict(mode), autocast:
                train_step(program, share, tokens)
                program.opt.zero_grad(set_to_none=True)
        with strict(mode):
            # Entered inside the fake mode: the tracker counts the local ops under it and
            # skips DTensor's nested shape-propagation mode.
            tracker = role_tracker(program.modules, program.opt,
                                   (share.input_ids, share.targets, share.pad_mask,
                                    share.loss_mask))
            meter, flops = CommMeter(program.dims(), program.meter_groups()), FlopMeter()
            recorder = RoutingRecorder().attach(program.modules)
            with tracker, meter, flops, autocast:
                # What one micro-batch saves for backward, counted as train counts it.
                saved = train_step(program, share, tokens, measure_saved=True).activation_bytes
                held = state_bytes(nn.ModuleList(program.modules), program.opt)
                program.opt.zero_grad(set_to_none=True)
            routing = recorder.detach()
        peak, by_category, raw = peak_breakdown(tracker)
        stages = [int(getattr(m, "stage_index", 0)) for m in program.modules]
        layers = sum(len(getattr(m, "layer_ids", ())) or cfg.shape.layers
                     for m in program.modules)
    return {"rank": rank, **coordinates(cfg, rank), "stages": stages, "layers": layers,
            "peak_bytes": peak, "by_category": by_category, "by_tracker": raw,
            "peak_at": tracker.moment, "activation_peak_bytes": tracker.activation_peak,
            "saved_bytes_per_microbatch": saved,
            "state_bytes": held, "comm_step": meter.summary(), "routing": routing,
            "flops_by_op": {str(k): int(v) for k, v in flops.get_flop_counts()["Global"].items()},
            "seconds": time.perf_counter() - start,
            # The role process's high-water resident set (Linux reports KiB): what the
            # dry run of this rank took of the host, torch's pages included.
            "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
