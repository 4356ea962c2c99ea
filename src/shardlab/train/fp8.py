"""fp8 training through torchao's float8: the linear layers multiply in fp8, the rest in bf16.

``shardlab train --dtype fp8`` is a bf16 run (FSDP2's bf16 parameter copies, or bf16
autocast) whose attention projections and MLP matrices are torchao ``Float8Linear``
modules (``torchao.float8.convert_to_float8_training``): tensorwise dynamic scaling, the
input and weight cast to E4M3 and the output gradient to E5M2 at every matmul, each
scale the tensor's absolute maximum over the format's largest value (torchao's default
``Float8LinearConfig``, the recipe torchtitan's ``float8`` converter runs). What stays in
bf16, as torchtitan and Transformer Engine leave it: the output head (torchtitan filters
``output``; here ``lm_head``), the MoE router (its logits pick the experts) and the
routed experts' grouped weights (no ``nn.Linear``), the norms and the attention core.
A linear whose two dimensions are not both multiples of 16 stays in bf16 too: fp8's
``torch._scaled_mm`` needs them so.

By default FSDP2 gathers the bf16 copies as in a bf16 run (torchao's fp8 all-gather is
off, torchtitan's default), so a run's communication is the bf16 run's byte for byte;
``--fp8-all-gather`` (``TrainConfig.fp8_all_gather``) turns it on: each converted
weight's shard cast to E4M3 before FSDP gathers it, its scale from one all-reduce of the
weights' amaxes before each step (:func:`refresh_fp8_scales`), the bytes the report
predicts with :func:`shardlab.train.report_cp.fp8_gathered`.

Where it runs: an fp8 matmul is fast only on an fp8 tensor core (CUDA compute capability
8.9 or newer: L4, H100, H200, B200), so ``train`` refuses fp8 elsewhere
(:func:`fp8_refusal`). torch also has a CPU ``_scaled_mm``; ``--fp8-on-cpu`` runs it, to
check a run's wiring and its loss against the one-process reference at laptop scale, never
for speed.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
from torch import nn

from shardlab.estimate.fp8 import fp8_matmul_fits, tp_rank_shape
from shardlab.train.config import torchao_missing

FP8_MIN_CAPABILITY = (8, 9)
"""The first CUDA compute capability with fp8 tensor cores (Ada; Hopper is 9.0)."""
KEPT_IN_BF16 = ("lm_head", "router")
"""Linear modules (by attribute name) that keep bf16: the output head and the MoE router."""


def fp8_linear(module: nn.Module, fqn: str, tp: int = 1) -> bool:
    """Whether torchao converts ``module`` (at ``fqn``): an ``nn.Linear``, not one of
    :data:`KEPT_IN_BF16`, both dimensions of the matmul each rank runs multiples of 16
    (with ``tp`` ranks: a row-parallel linear's input width over tp, another's output
    width over tp)."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] in KEPT_IN_BF16:
        return False
    return fp8_matmul_fits(*tp_rank_shape(fqn, module.out_features, module.in_features, tp))


QUIET_ON_IMPORT = ("torchao", "torch.utils._pytree")
"""Loggers silenced while torchao is imported: torchao warns of each of its compiled kernels
built for another torch release (float8 training uses none of them), and torch of an enum
torchao registers with its pytree (a deprecation, no error)."""


@functools.cache
def _float8() -> Any:
    """torchao.float8, imported once, without the warnings of :data:`QUIET_ON_IMPORT`."""
    logs = [logging.getLogger(name) for name in QUIET_ON_IMPORT]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        # Here, not at the top: torchao's import takes about 1.8 s, which only fp8 runs pay.
        import torchao.float8 as float8
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)
    return float8


def convert_fp8_linears(model: nn.Module, all_gather: bool = False, tp: int = 1) -> list[str]:
    """Swap ``model``'s eligible linear layers (:func:`fp8_linear`, for ``tp``
    tensor-parallel ranks) for torchao ``Float8Linear`` modules in place, before it is laid
    out; the converted modules' names, in order. ``all_gather``: FSDP2 gathers their
    weights in fp8 (torchao's ``enable_fsdp_float8_all_gather``; :func:`refresh_fp8_scales`
    after each step). Tensor parallelism then gives them torchao's float8 styles
    (:func:`shardlab.distributed.tensor_parallel.block_plan`)."""
    names = [fqn for fqn, m in model.named_modules() if fp8_linear(m, fqn, tp)]
    float8 = _float8()
    config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    float8.convert_to_float8_training(model, config=config,
                                      module_filter_fn=lambda m, fqn: fp8_linear(m, fqn, tp))
    return names


def refresh_fp8_scales(modules: list[nn.Module]) -> None:
    """After the optimizer step of a run that gathers fp8 weights: each module's weight
    scales from its updated shards, one all-reduce (max) of the amaxes per module over
    the shard group (torchao ``precompute_float8_dynamic_scale_for_fsdp``), so the next
    forward casts each shard before its all-gather with the whole weight's scale."""
    float8 = _float8()
    for module in modules:
        float8.precompute_float8_dynamic_scale_for_fsdp(module)


def fp8_on_gpu() -> bool:
    """Whether the ranks will run on CUDA (the launcher picks NCCL and CUDA when any GPU is
    visible: :func:`shardlab.distributed.launch.backend_for_this_machine`)."""
    return torch.cuda.is_available()


def fp8_refusal(on_cpu: bool) -> str | None:
    """Why this machine cannot run ``--dtype fp8`` (one line), or None when it can:
    torchao missing, or no CUDA device with fp8 tensor cores unless ``on_cpu``
    (``--fp8-on-cpu``: torch's CPU fp8 matmul, for checking)."""
    missing = torchao_missing()
    if missing is not None:
        return missing
    if torch.cuda.is_available():
        # The device this process's rank will run on: torchrun's LOCAL_RANK, else the first.
        device = int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1)
        cap = torch.cuda.get_device_capability(device)
        if cap < FP8_MIN_CAPABILITY:
            return (f"needs fp8 tensor cores (CUDA compute capability 8.9 or newer: L4, "
                    f"H100, H200, B200); {torch.cuda.get_device_name(device)} is "
                    f"{cap[0]}.{cap[1]}")
        return None
    if on_cpu:
        return None
    return ("fp8 training runs on CUDA GPUs with fp8 tensor cores (H100, H200, B200); this "
            "machine has no CUDA device (--fp8-on-cpu runs torch's CPU fp8 matmul, to check "
            "a run, not for speed)")
