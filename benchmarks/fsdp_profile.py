"""What FSDP2 costs over DDP on CPU: one step broken down, and FSDP variants side by side.

The model, batches and layout of ``benchmarks/fsdp_pair.py`` (4-layer llama, d 256, seq
128, global batch 16, dp 2 on loopback gloo, one thread per rank, fp32, AdamW, clipping),
built and stepped by shardlab's own ``build_rank`` and ``train_step``, with a tweak per
variant:

* ``ddp``: composable ``replicate`` (shardlab's ``--dp-mode ddp``);
* ``fsdp``: shardlab's FSDP as it is (``fully_shard`` per block and the root, every group
  resharded after forward);
* ``fsdp-zero2``: ``reshard_after_forward=False`` everywhere (``--dp-mode fsdp-zero2``);
* ``fsdp-root-kept``: the root group (embedding, final norm, output) not resharded after
  forward, FSDP2's own default for the root (its parameters are needed again first
  thing in backward);
* ``fsdp-keep-last``: the root and the last block not resharded (torchtitan's default);
* ``fsdp-prefetch``: explicit prefetch one block ahead (``set_modules_to_forward_prefetch``,
  ``set_modules_to_backward_prefetch``);
* ``fsdp-prefetch-async``: the same, with the unshards issued ``async_op=True`` (FSDP2's
  private ``_set_unshard_async_op``), so that a gather runs on gloo's thread while the
  block before it computes (on CPU, FSDP2's collectives are otherwise synchronous);
* ``fsdp-one-group``: one ``fully_shard`` of the whole model, no per-block groups (one
  flat group, resharded after forward as shardlab asks: 2 gathers and 1 reduce a step).

Every variant lives in the same two rank processes, one model each (same seed, same
batches), and their steps alternate (A, B, C, then B, C, A, ...: each round starts one
variant later), so a slow spell of the shared machine falls on all alike. A variant's
step is the median of rank 0's steps after its first two (FSDP's lazy init, DDP's bucket
rebuild), over ``--steps`` rounds in each of ``--launches`` launches. Then
``--profiled`` more alternating rounds run under torch.profiler and :func:`breakdown`
splits rank 0's step: the main thread's time by disjoint category, and the collectives'
own spans on gloo's threads (a blocking collective's span includes the time spent
waiting for the other rank). Last, AdamW's step on FSDP's DTensor shards against the
same shards as plain tensors, and DDP's (:func:`optimizer_step_s`).

Run: ``python benchmarks/fsdp_profile.py [--launches 2] [--steps 8] [--profiled 2]
[--only fsdp,ddp] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

import shardlab.distributed.data_parallel as data_parallel
import shardlab.train.rank as rank_module
from shardlab.config.host import cpu_model
from shardlab.config.model import ModelShape
from shardlab.distributed.launch import launch
from shardlab.nn.data import batches
from shardlab.nn.garden import garden_documents, garden_vocab
from shardlab.train.config import TrainConfig
from shardlab.train.optimizer import make_optimizer

VARIANTS = ("ddp", "fsdp", "fsdp-zero2", "fsdp-root-kept", "fsdp-keep-last", "fsdp-prefetch",
            "fsdp-prefetch-async", "fsdp-one-group")
WARM_STEPS = 2  # FSDP's lazy init, DDP's bucket rebuild: not timed
CLIP = "bench::clip"  # the profiler's name for shardlab's clip_grad_norm

MAIN_CATEGORIES: tuple[tuple[str, Callable[[str], bool]], ...] = (
    # Claimed in this order: an instant of the main thread goes to the first category
    # whose event covers it (the copies inside FSDP's gather and reduce regions first).
    ("all-gather copy-in", lambda n: n == "fsdp::all_gather_copy_in"),
    ("all-gather copy-out", lambda n: n == "fsdp::split_with_sizes_copy"),
    ("reduce-scatter copy-in", lambda n: n == "fsdp::chunk_cat"),
    ("all-gather (+ wait)", lambda n: n.startswith("FSDP::all_gather")),
    ("reduce-scatter (+ wait)", lambda n: n.startswith("FSDP::post_backward_reduce")),
    ("DDP reducer", lambda n: n.startswith(("torch.distributed.ddp.reducer::",
                                             "torch::distributed::reducer::"))),
    ("optimizer step", lambda n: n.startswith("Optimizer.step")),
    ("clip (grad norm)", lambda n: n == CLIP),
    ("zero_grad", lambda n: n.startswith("Optimizer.zero_grad")),
    ("other FSDP hooks", lambda n: n.startswith("FSDP::")),
)
REST = "compute (the rest)"
"""What no category claims: forward and backward arithmetic, autograd, and any wait
that has no region of its own (DDP's reducer waits for its last bucket in backward)."""

Spans = list[tuple[float, float]]


def _union(spans: Iterable[tuple[float, float]]) -> Spans:
    out: Spans = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _minus(a: Spans, b: Spans) -> Spans:
    """The parts of merged spans ``a`` outside merged spans ``b``."""
    out: Spans = []
    for start, end in a:
        for b_start, b_end in b:
            if b_end <= start or b_start >= end:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def _length(spans: Spans) -> float:
    return sum(end - start for start, end in spans)


def breakdown(events: Any, label: str, steps: int) -> dict[str, dict[str, float]]:
    """One profiled step of rank 0, in ms (the mean over the ``steps`` regions named
    ``label``): ``main_ms``, the main thread's step time by :data:`MAIN_CATEGORIES` and
    :data:`REST` (disjoint, they add up to ``step``); ``gloo_ms`` and ``gloo_calls``, per
    gloo collective (``gloo:all_gather``, ...) the union of its spans on gloo's threads
    and its calls, within those steps."""
    window = _union((e.time_range.start, e.time_range.end) for e in events
                    if e.name == label)
    main = {e.thread for e in events if e.name == label}

    def inside(spans: Iterable[tuple[float, float]]) -> Spans:
        merged = _union(spans)
        return _minus(merged, _minus(merged, window))  # clipped to the steps

    claimed: Spans = []
    main_ms: dict[str, float] = {}
    for name, match in MAIN_CATEGORIES:
        own = _minus(inside((e.time_range.start, e.time_range.end) for e in events
                            if e.thread in main and match(e.name)), claimed)
        main_ms[name] = _length(own) / 1e3 / steps  # profiler times are in µs
        claimed = _union(claimed + own)
    main_ms["step"] = _length(window) / 1e3 / steps
    main_ms[REST] = main_ms["step"] - _length(claimed) / 1e3 / steps
    gloo_ms: dict[str, float] = {}
    gloo_calls: dict[str, float] = {}
    for op in {e.name for e in events if e.name.startswith("gloo:")}:
        spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == op]
        gloo_ms[op] = _length(inside(spans)) / 1e3 / steps
        gloo_calls[op] = sum(any(w0 <= start < w1 for w0, w1 in window)
                             for start, _ in spans) / steps
    return {"main_ms": main_ms, "gloo_ms": gloo_ms, "gloo_calls": gloo_calls}


def config(steps: int, dp_mode: str) -> TrainConfig:
    """fsdp_pair.py's job: the same shape, batch, data and seed."""
    shape = ModelShape("bench", 4, 256, 8, garden_vocab().size, 128, d_ff=1024,
                       style="llama", tied=False)
    return TrainConfig(shape=shape, global_batch=16, seq=128, steps=steps, warmup=1,
                       docs=garden_documents(2000, 0), dp=2, dp_mode=dp_mode)


def dp_mode(variant: str) -> str:
    """The shardlab ``--dp-mode`` a variant starts from."""
    return variant if variant in ("ddp", "fsdp-zero2") else "fsdp"


def build(cfg: TrainConfig, variant: str, device: str) -> rank_module.RankProgram:
    """shardlab's rank program for ``variant`` (module docstring)."""
    if variant == "fsdp-one-group":
        # apply_fsdp with no block groups: its policy and force-sum probe, the root only.
        blocks = data_parallel.named_blocks
        data_parallel.named_blocks = lambda model: []
        try:
            return rank_module.build_rank(cfg, device)
        finally:
            data_parallel.named_blocks = blocks
    program = rank_module.build_rank(cfg, device)
    model = program.modules[0]
    blocks = list(model.blocks)
    if variant in ("fsdp-root-kept", "fsdp-keep-last"):
        model.set_reshard_after_forward(False, recurse=False)
    if variant == "fsdp-keep-last":
        blocks[-1].set_reshard_after_forward(False, recurse=False)
    if variant.startswith("fsdp-prefetch"):
        for i, block in enumerate(blocks):
            if i + 1 < len(blocks):
                block.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                block.set_modules_to_backward_prefetch([blocks[i - 1]])
        if variant == "fsdp-prefetch-async":
            model._set_unshard_async_op(True)
    return program


def _step(program: rank_module.RankProgram, stream: Any, label: str,
          zero: bool = True) -> float:
    batch = next(stream)
    share = batch.split(program.cfg.dp)[program.dp_rank]
    dist.barrier()  # as train's loop: a step starts with both ranks
    start = time.perf_counter()
    with record_function(label):
        rank_module.train_step(program, share, batch.real_tokens)
        if zero:
            program.opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def optimizer_step_s(program: rank_module.RankProgram, repeats: int = 7) -> dict[str, float]:
    """Median seconds of one AdamW step, three ways, on this rank's gradients: ``program``,
    shardlab's optimizer (single-tensor path) on its parameters (DTensor shards under
    FSDP, whole tensors under DDP); ``foreach``, torch's multi-tensor path on the same
    parameters; ``plain_copies``, shardlab's path on plain-tensor copies of their local
    parts. Each made its state in one untimed step; the timed steps alternate. Call with
    gradients; it changes the parameters."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in program.params]
    plain = [torch.nn.Parameter(t.detach().clone()) for t in local]
    for copy, p in zip(plain, program.params, strict=True):
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        copy.grad = grad.detach().clone()
    cfg = program.cfg
    opts = {"program": program.opt,
            "foreach": torch.optim.AdamW(program.params, lr=cfg.lr, betas=(0.9, 0.95),
                                         eps=1e-8, weight_decay=cfg.weight_decay,
                                         foreach=True),
            "plain_copies": make_optimizer(plain, cfg)[0]}
    times: dict[str, list[float]] = {k: [] for k in opts}
    for opt in opts.values():
        opt.step()  # state creation
    for _ in range(repeats):
        for name, opt in opts.items():
            start = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def profile_rank(ctx: Any, variants: list[str], steps: int, profiled: int
                 ) -> dict[str, Any] | None:
    """One rank: every variant built, ``steps`` alternating rounds timed, ``profiled``
    rounds profiled, then the optimizer probe of the first FSDP and DDP variants."""
    programs, streams = {}, {}
    for v in variants:  # built in the same order on every rank (the meshes' groups)
        cfg = config(steps + WARM_STEPS, dp_mode(v))
        programs[v] = build(cfg, v, ctx.device)
        streams[v] = batches(cfg.docs, cfg.global_batch, cfg.seq, seed=cfg.seed)
    clip = rank_module.clip_grad_norm

    def labelled_clip(*args: Any, **kwargs: Any) -> Any:
        with record_function(CLIP):
            return clip(*args, **kwargs)

    rank_module.clip_grad_norm = labelled_clip  # this rank's process only
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(steps + WARM_STEPS):
        # Each round starts one variant later: none always follows the same one.
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            times[v].append(_step(programs[v], streams[v], f"bench::step {v}"))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            for v in variants:
                _step(programs[v], streams[v], f"bench::step {v}")
    optimizer = {}
    for v in ("fsdp", "ddp"):
        if v in programs:
            _step(programs[v], streams[v], "bench::probe", zero=False)
            optimizer[v] = optimizer_step_s(programs[v])
    if ctx.rank != 0:
        return None
    events = prof.events()
    return {"step_s": {v: t[WARM_STEPS:] for v, t in times.items()},
            "breakdown": {v: breakdown(events, f"bench::step {v}", profiled)
                          for v in variants},
            "optimizer": optimizer}


def _median(docs: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over launches (a key missing in one counts 0)."""
    keys = {k for d in docs for k in d}
    return {k: statistics.median(d.get(k, 0.0) for d in docs) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=2, help="2-rank launches")
    ap.add_argument("--steps", type=int, default=8,
                    help=f"timed steps per variant and launch (after {WARM_STEPS} untimed)")
    ap.add_argument("--profiled", type=int, default=2, help="profiled steps per variant")
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    variants = [v for v in args.only.split(",") if v]
    for name, value, ok, allowed in (
            ("launches", args.launches, args.launches >= 1, "an integer >= 1"),
            ("steps", args.steps, args.steps >= 1, "an integer >= 1"),
            ("profiled", args.profiled, args.profiled >= 1, "an integer >= 1"),
            ("only", args.only, variants and set(variants) <= set(VARIANTS)
             and len(set(variants)) == len(variants),
             f"a comma-separated list of distinct {', '.join(VARIANTS)}")):
        if not ok:
            sys.stderr.write(f"fsdp_profile: error: --{name}={value!r}: must be {allowed}\n")
            return 2
    load = os.getloadavg()
    runs = [launch("fsdp_profile:profile_rank", 2, (variants, args.steps, args.profiled),
                   timeout_s=900, threads=1)[0] for _ in range(args.launches)]
    step = {v: statistics.median(t for r in runs for t in r["step_s"][v]) for v in variants}
    doc = {"processor": cpu_model(), "cores": os.cpu_count(),
           "load_average": {"before": load, "after": os.getloadavg()},
           "launches": args.launches, "steps": args.steps, "profiled": args.profiled,
           "step_s": step,
           "breakdown": {v: {part: _median([r["breakdown"][v][part] for r in runs])
                             for part in ("main_ms", "gloo_ms", "gloo_calls")}
                         for v in variants},
           "optimizer_s": {v: _median([r["optimizer"][v] for r in runs])
                           for v in runs[0]["optimizer"]}}
    if "fsdp" in step:
        doc["step_vs_fsdp"] = {v: step[v] / step["fsdp"] for v in variants}
        # The same ratio per launch: how far the launches agree.
        doc["launch_step_vs_fsdp"] = {
            v: [statistics.median(r["step_s"][v]) / statistics.median(r["step_s"]["fsdp"])
                for r in runs] for v in variants}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        report(doc, variants)
    return 0


def report(doc: dict[str, Any], variants: list[str]) -> None:
    load = doc["load_average"]
    print(f"processor: {doc['processor']} ({doc['cores']} cores); load average "
          f"{load['before'][0]:.2f} before, {load['after'][0]:.2f} after; "
          f"{doc['launches']} launches x {doc['steps']} timed steps per variant, "
          "alternating; median step of rank 0")
    for v in variants:
        rel = ""
        if "step_vs_fsdp" in doc:
            per = " ".join(f"{x:.3f}" for x in doc["launch_step_vs_fsdp"][v])
            rel = f"  x{doc['step_vs_fsdp'][v]:.3f} of fsdp (per launch: {per})"
        print(f"{v:20s} step {doc['step_s'][v] * 1e3:7.1f} ms{rel}")
    print(f"\nrank 0's main thread per profiled step, ms ({doc['profiled']} per variant and "
          "launch, profiler on: steps run slower):")
    print(f"{'':26s}" + "".join(f"{v[-13:]:>14s}" for v in variants))
    for cat in [*(name for name, _ in MAIN_CATEGORIES), REST, "step"]:
        row = [doc["breakdown"][v]["main_ms"].get(cat, 0.0) for v in variants]
        print(f"{cat:26s}" + "".join(f"{x:14.1f}" for x in row))
    print("\ngloo's threads per profiled step: span ms (calls); a blocking collective's "
          "span includes waiting for the other rank")
    ops = sorted({k for v in variants for k in doc["breakdown"][v]["gloo_ms"]})
    for op in ops:
        cells = [f"{doc['breakdown'][v]['gloo_ms'].get(op, 0.0):8.1f} "
                 f"({doc['breakdown'][v]['gloo_calls'].get(op, 0.0):2.0f})" for v in variants]
        print(f"{op:26s}" + "".join(f"{c:>14s}" for c in cells))
    print()
    for v, o in doc["optimizer_s"].items():
        print(f"AdamW step ({v}), median ms: shardlab's {o['program'] * 1e3:.1f} on its "
              f"parameters, foreach {o['foreach'] * 1e3:.1f} on them, shardlab's "
              f"{o['plain_copies'] * 1e3:.1f} on plain copies of the local tensors "
              f"(shardlab's / plain copies x{o['program'] / o['plain_copies']:.2f})")


if __name__ == "__main__":
    sys.exit(main())
