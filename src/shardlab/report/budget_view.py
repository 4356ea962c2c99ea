"""Terminal view of a budget document (the dict from :mod:`shardlab.estimate.budget`)."""

from __future__ import annotations

from typing import Any

from shardlab.report.fit_view import print_fit
from shardlab.report.tables import show, table
from shardlab.units import human, human_bytes, human_gib, human_seconds

PARTS = ("attention", "mlp", "experts", "router", "norms", "embedding", "position", "head",
         "mtp")


def _pct(x: float, total: float) -> str:
    return f"{100 * x / total:.1f}%" if total else "-"


def print_budget(b: dict[str, Any]) -> None:
    """Print every section of the budget that ``b`` holds."""
    lay, hw, a = b["layout"], b["hardware"], b["assumptions"]
    if "model" in b:
        show(f"[bold]{b['model']['name']}[/bold]: {b['model']['describe']}",
             f"  source: {b['model']['source']}",
             f"[bold]layout[/bold]: {lay['describe']}")
    else:
        show(f"[bold]{human(b['params']['total'])} parameters[/bold] (no shape: states, 6ND, "
             f"time and DP traffic only); dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
             f"zero={lay['zero']} dtype={lay['dtype']}")
    show(f"[bold]hardware[/bold]: {lay['gpus']} x {hw['name']}, "
         f"{human(hw['peak_flops'], 'FLOP/s')} dense {hw['compute_dtype']}, "
         f"{human_bytes(hw['memory_bytes'])}, {human(hw['memory_bandwidth'], 'B/s')}")
    if hw.get("linear_dtype") == "fp8":
        share = hw.get("linear_flop_share") or 1.0
        show(f"[bold]fp8[/bold]: linear layers ({share:.0%} of the FLOPs) at "
             f"{human(hw['linear_peak_flops'], 'FLOP/s')} fp8, attention core, head and router "
             f"in {hw['compute_dtype']}: MFU applies to the blended "
             f"{human(hw['effective_peak_flops'], 'FLOP/s')}; fp8 runs on CUDA GPUs only")
    _params(b)
    _flops(b)
    _memory(b)
    if b.get("moe"):
        _moe(b)
    if b.get("cp"):
        _cp(b)
    if b.get("fit"):
        print_fit(b["fit"])
    _time(b)
    _comm(b)
    if "inference" in b:
        _inference(b)
        _operators(b)
    show(f"[dim]assumptions: MFU {a['mfu']:.0%}, {human(a['tokens'])} training tokens"
         + (" (20 per parameter, Chinchilla)" if a.get("tokens_default") else "")
         + f", ${a['price_per_gpu_hour']:.2f} per device-hour"
         + (f"; {a['flops_convention']}" if "flops_convention" in a else "") + "[/dim]")


def _params(b: dict[str, Any]) -> None:
    p = b["params"]
    total = p["total"]
    rows = [(k, f"{p[k]:,}", _pct(p[k], total)) for k in PARTS if p.get(k)]
    rows.append(("total", f"{total:,.0f}", human(total)))
    if p.get("active_per_token", total) != total:
        rows.append(("active per token", f"{p['active_per_token']:,.0f}",
                     human(p["active_per_token"])))
    rows.append(("per device (busiest rank)", f"{p['per_device']:,.0f}", human(p["per_device"])))
    if p.get("per_device_experts"):
        rows.append(("  of which routed experts", f"{p['per_device_experts']:,.0f}",
                     human(p["per_device_experts"])))
    show(table("Parameters", ("part", "count", "share"), rows))


def _flops(b: dict[str, Any]) -> None:
    f = b["flops"]
    rows = []
    for key, label in (("forward_per_token", "forward per token"),
                       ("train_per_token", "train per token (model, 3x fwd)"),
                       ("hardware_train_per_token", "train per token with recompute (hardware)"),
                       ("per_step", "per optimizer step (model)"),
                       ("train_total", "whole run, exact (model)"),
                       ("hardware_train_total", "whole run, with recompute (hardware)"),
                       ("train_6nd", "whole run, 6ND")):
        if key in f and (key != "train_total" or "forward_per_token" in f):
            rows.append((label, human(f[key], "FLOP")))
    show(table("FLOPs", ("what", "FLOPs"), rows))


def _memory(b: dict[str, Any]) -> None:
    mem = b["memory"]
    d = mem["per_device"]
    rows = [(k, human(d[k], "B"), human_gib(d[k]))
            for k in ("weights", "gradients", "optimizer", "activations") if d[k] is not None]
    rows.append(("total", human(d["total"], "B"), human_gib(d["total"])))
    rows.append(("capacity", human(mem["capacity"], "B"), human_gib(mem["capacity"])))
    verdict = "[green]fits[/green]" if mem["fits"] else "[red]does not fit[/red]"
    show(table(f"Memory per device ({verdict})", ("what", "decimal", "binary"), rows))
    if "activations_per_layer" in mem:
        show(f"  activations: {human_bytes(mem['activations_per_layer'])} per layer per "
             f"micro-batch x {mem['inflight_microbatches']:g} in flight on stage "
             f"{mem['peak_stage']} (the busiest)")
    if mem.get("framework"):
        f = mem["framework"]
        fd = f["per_device"]
        fits = "[green]fits[/green]" if f["fits"] else "[red]does not fit[/red]"
        show(f"  at {f['name']}'s peak (plan --framework): activations "
             f"{human_bytes(fd['activations'])}, + {human_bytes(fd['transient'])} held only "
             f"for a moment (its loss, one layer's recompute, unsharded layers): "
             f"{human_bytes(fd['total'])} per device, {fits}")
    z = mem["by_zero_stage"]
    show(table("Model states per device by ZeRO stage (decimal)", ("stage", "weights", "gradients",
                                                          "optimizer", "total"),
               [(f"ZeRO-{s}", human(v["weights"], "B"), human(v["gradients"], "B"),
                 human(v["optimizer"], "B"), human(v["total"], "B")) for s, v in z.items()]))
    if len(mem.get("per_stage", [])) > 1:
        show(table("Per pipeline stage (decimal)", ("stage", "layers", "params", "states",
                                                     "activations", "in flight", "total"),
                   [(s["stage"], s["layers"], human(s["params"]),
                     human(s["weights"] + s["gradients"] + s["optimizer"], "B"),
                     human(s["activations"], "B"), f"{s['inflight']:g}",
                     human(s["total"], "B")) for s in mem["per_stage"]]))


def _time(b: dict[str, Any]) -> None:
    t = b["time"]
    rows = [("wall time", f"{t['train_days']:.1f} days"),
            ("device-hours", human(t["gpu_hours"])),
            ("cost", f"${t['cost']:,.0f}"),
            ("energy (board power)", f"{t['energy_kwh'] / 1000:,.1f} MWh")]
    if "step_seconds" in t:
        rows.insert(0, ("step time", human_seconds(t["step_seconds"])))
        rows.insert(1, ("throughput", human(t["tokens_per_s"], "tokens/s")))
        rows.insert(2, ("MFU / HFU (with recompute)", f"{t['mfu']:.1%} / {t['hfu']:.1%}"))
    show(table("Training time and money", ("what", "value"), rows))


def _comm(b: dict[str, Any]) -> None:
    c = b["comm"]
    rows = [(f"{k} per step", human(c[f"{k}_bytes_per_step"], "B"))
            for k in ("dp", "tp", "pp", "ep", "cp") if c.get(f"{k}_bytes_per_step") is not None
            and (k not in ("ep", "cp") or c[f"{k}_bytes_per_step"])]
    if c.get("dp_replica_bytes_per_step"):
        rows += [(f"  dp inside the shard group ({c['dp_link']})",
                  human(c["dp_shard_group_bytes_per_step"], "B")),
                 (f"  dp across HSDP replicas ({c['dp_replica_link']})",
                  human(c["dp_replica_bytes_per_step"], "B"))]
    rows += [(f"dp with ZeRO-{z}", human(v, "B"))
             for z, v in c["dp_bytes_per_step_by_zero"].items()]
    if "dp_allreduce_seconds" in c:
        rows.append((f"one gradient all-reduce ({c.get('dp_replica_link', c['dp_link'])})",
                     human_seconds(c["dp_allreduce_seconds"])))
    if c.get("dp_replica_allreduce_seconds"):
        rows.append((f"one all-reduce of the shard across replicas ({c['dp_replica_link']})",
                     human_seconds(c["dp_replica_allreduce_seconds"])))
    if c.get("ep_alltoall_seconds"):
        rows.append((f"all-to-alls of one step ({c['ep_link']})",
                     human_seconds(c["ep_alltoall_seconds"])))
    if c.get("cp_seconds"):
        rows.append((f"K/V all-gathers and reduce-scatters of one step ({c['cp_link']})",
                     human_seconds(c["cp_seconds"])))
    show(table("Communication sent per device (decimal bytes)", ("what", "value"), rows))


def _cp(b: dict[str, Any]) -> None:
    c = b["cp"]
    rows = [("chunks of each sequence (rank 0 holds)",
             f"{c['chunks']} of {c['chunk_tokens']:,} tokens ({c['rank0_chunks'][0]} and "
             f"{c['rank0_chunks'][1]})"),
            ("tokens per rank", f"{c['tokens_per_rank']:,}"),
            ("K/V all-gather sent per layer per micro-batch (forward)",
             human_bytes(c["kv_gather_bytes_per_layer"])),
            ("dK/dV reduce-scatter sent per layer per micro-batch (backward)",
             human_bytes(c["kv_grad_bytes_per_layer"])),
            ("gathered K/V kept per layer per micro-batch (not divided by cp)",
             human_bytes(c["gathered_kv_bytes_per_layer"])),
            ("K/V bytes sent per step", human_bytes(c["bytes_per_step"])),
            ("causal work, busiest rank / mean (zigzag; contiguous split)",
             f"{c['causal_imbalance']:.3f}; {c['causal_imbalance_contiguous']:.3f}")]
    show(table(f"Context parallel (cp={c['cp']}, per rank, {c['link']})", ("what", "value"),
               rows))


def _moe(b: dict[str, Any]) -> None:
    e = b["moe"]
    cap = e["capacity_per_expert"]
    rows = [("experts (routed, top-k, shared)",
             f"{e['experts']}, top-{e['top_k']}, {e['shared_experts']} shared"),
            ("expert parallel ep / etp / expert dp", f"{e['ep']} / {e['etp']} / {e['expert_dp']}"),
            ("experts per rank", f"{e['experts_per_rank']}"),
            ("capacity per expert per source rank",
             "dropless" if cap is None else f"{cap:,} tokens (factor {e['capacity_factor']:g})"),
            ("tokens routed per rank per micro-batch", f"{e['routed_tokens_per_microbatch']:,}"),
            (f"rows the busiest rank's experts take (imbalance {e['routing_imbalance']:g})",
             f"{e['routed_rows_per_microbatch']:,.0f}"),
            ("routed activations per MoE layer per micro-batch",
             human_bytes(e["routed_activation_bytes_per_layer"])),
            ("all-to-all sent per step (dispatch + combine, fwd + bwd)",
             human_bytes(e["alltoall_bytes_per_step"])),
            ("all-to-all calls per step", f"{e['alltoall_calls_per_step']:,}")]
    show(table("Mixture of experts (per rank)", ("what", "value"), rows))


def inference_rows(i: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, value) rows of a budget's ``inference`` section: KV cache, memory, rooflines."""
    rows = [("KV cache per token", human_bytes(i["kv_bytes_per_token"])),
            (f"KV cache (batch {i['batch']} x {i['context']} tokens)",
             human_bytes(i["kv_cache_bytes"])),
            (f"memory per device (tp={i['devices']})", human_bytes(i["memory_per_device"])),
            ("largest batch that fits", f"{i['max_batch']:,}")]
    for k in ("prefill", "decode"):
        s = i[k]
        rows.append((f"{k} step ({s['bound']}-bound)", human_seconds(s["seconds"])))
        rows.append((f"{k} tokens/s", human(s["tokens_per_s"])))
    return rows


def _inference(b: dict[str, Any]) -> None:
    i = b["inference"]
    rows = inference_rows(i)
    show(table("Inference (roofline lower bounds)", ("what", "value"), rows))


def _operators(b: dict[str, Any]) -> None:
    ops = b["operators"]["train"]
    lay = b["layout"]
    tokens = (f"{lay['seq'] // lay['cp']} of {lay['seq']} tokens (cp={lay['cp']})"
              if lay.get("cp", 1) > 1 else f"{lay['seq']} tokens")
    show(table(f"One layer's forward operators (batch {lay['micro_batch']} x {tokens}, "
               "unfused)",
               ("operator", "kind", "FLOPs", "bytes", "FLOP/B", "roofline", "bound"),
               [(o["name"], o["kind"], human(o["flops"]), human(o["bytes"], "B"),
                 f"{o['intensity']:.1f}", human_seconds(o["seconds"]), o["bound"])
                for o in ops]))
