"""The human view of ``shardlab plan``: the top layouts with their step-time breakdown."""

from __future__ import annotations

from typing import Any

from shardlab.report.fit_view import print_fit
from shardlab.report.tables import show, table
from shardlab.units import human, human_bytes

_SHORT = {"compute": "compute", "recompute": "recomp", "tp_comm": "tp", "pp_comm": "pp",
          "ep_comm": "ep", "cp_comm": "cp", "dp_comm": "dp", "bubble": "bubble",
          "optimizer": "optim", "overhead": "fixed", "offload": "offload"}


_SCHED = {"interleaved-1f1b": "interleaved", "dualpipev": "dualpipev"}


def accuracy_line(acc: dict[str, Any], gpu: str, dtype: str, anchored: bool = False) -> str:
    """The plan's ``accuracy`` (:mod:`shardlab.plan.accuracy`) in one line: each slice's
    mean absolute error, run count and signed mean; said when no held-out run was on
    ``gpu`` or in ``dtype``, when ``gpu``'s curve is assumed (its error is then unknown),
    and when ``--measured-step`` anchored the curve (the figures are the catalog curve's)."""
    parts = [f"{'warning: ' if s.get('warning') else ''}{s['slice']} "
             f"{s['mean_abs_error']:.1%} over {s['runs']} runs "
             f"({s['mean_error']:+.1%} signed{', thin' if s['thin'] else ''})"
             for s in acc["slices"]]
    if not acc["curve_fitted"]:
        head = (f"held-out step-time error: unknown on {gpu}, whose efficiency curve is "
                "assumed, not fitted on published runs; on calibrated accelerators, runs "
                "like this (mean |error|; signed below 0: predicted fast; docs/validation.md)")
    else:
        head = ("held-out step-time error of published runs like this (mean |error|; signed "
                "below 0: predicted fast; docs/validation.md)")
        missing = [what for what, held in ((f"on {gpu}", acc["accelerator_held_out"]),
                                           (f"in {dtype}", acc["dtype_held_out"])) if not held]
        if missing:
            head += f": none ran {' or '.join(missing)}, so these are runs that differ in that"
    tail = ("; these are the catalog curve's figures, and --measured-step anchored it on "
            "your run" if anchored else "")
    return head + ": " + "; ".join(parts) + tail


_KIND = {"precision": "a precision", "overlap": "an overlap", "kernels": "a kernel",
         "mixed": "a mixed", "layout": "a layout", "other": "another kind of"}


def versus_line(v: dict[str, Any]) -> str:
    """The ``versus`` object in one line: B's step, its ratio to A's and the chooser's
    record on published pairs of that kind."""
    b, c = v["best"], v["chooser"]
    fits = "" if b["fits"] else ", does not fit"
    record = ("no published pair changed only this kind of thing, so the ratio's error is "
              "unknown" if c is None else
              f"on {c['pairs']} published pairs of that kind the planner's ratio was off by "
              f"{c['ratio_error']:.1%} on average and ordered {c['agreed']} of {c['scored']} "
              "as measured (docs/validation.md)")
    return (f"versus \"{v['layout']}\": {b['step_seconds']:.3f} s, {v['ratio']:.3f}x "
            f"--layout's{fits} ({_KIND.get(v['kind'], v['kind'])} change); {record}")


def anchor_line(a: dict[str, Any]) -> str:
    """One line of the plan's ``anchor`` (``--measured-step``, :mod:`shardlab.plan.anchor`):
    the share that moved and the measured layout's step before and after."""
    return (f"anchored on your measured run: {a['field']} {a['catalog']:.3f} -> "
            f"{a['fitted']:.3f}, so that \"{a['layout']}\" takes {a['measured_step']:.4g} s as "
            f"measured (the catalog's curve: {a['predicted_before']:.4g} s, "
            f"{a['predicted_before'] / a['measured_step'] - 1:+.1%})")


def _mesh(b: dict[str, Any], moe: bool) -> list[str]:
    """Short layout cells: dp·cp·tp·pp (HSDP: dp as replicas x shards), (MoE: ep·etp,) v,
    schedule (with uneven stages: the split's ends), zero, sp, recompute, micro-batch x
    count."""
    sched = _SCHED.get(b["schedule"], b["schedule"]) if b["pp"] > 1 else "-"
    split = b.get("stage_layers") or ()
    if split:
        sched += f" {split[0]}..{split[-1]}"
    rep = b.get("dp_replicate", 1)
    dp = f"{rep}x{b['dp'] // rep}" if rep > 1 else str(b["dp"])
    return [f"{dp}·{b.get('cp', 1)}·{b['tp']}·{b['pp']}",
            *([f"{b['ep']}·{b['etp']}"] if moe else []),
            str(b["virtual_stages"]), sched, str(b["zero"]), str(int(b["sp"])), b["recompute"],
            f"{b['micro_batch']}x{b['microbatches']}"]


def _dry_cell(dry: dict[str, Any] | None) -> str:
    """A plan entry's dry-run column: its real peak and verdict, or why it was not run."""
    if dry is None:
        return "-"
    if "skipped" in dry:
        return "not run"
    return human_bytes(dry["peak_bytes"]).split(" (")[0] + (" ok" if dry["fits"] else " NO")


def _cap(doc: dict[str, Any]) -> str:
    """The stated cluster facts that differ from the catalog (a power cap, the NICs)."""
    link = doc.get("inter_node_link") or {}
    nics = f", {link['name']} between nodes" if "per node" in link.get("name", "") else ""
    return (f" at {doc['power_watts']:g} W" if "capped" in doc.get("gpu_source", "")
            else "") + nics


def _options_line(doc: dict[str, Any]) -> str:
    """The step-time options priced, and the framework whose defaults they start from."""
    o = doc.get("step_options") or {}
    if not o:
        return ""
    fw = doc.get("framework") or "none given"
    keys = doc.get("step_keys_from") or "--layout"
    return (f"step options ({fw}; {keys} keys override): overlap_dp {o['overlap_dp']}, "
            f"overlap_tp {o['overlap_tp']}, overlap_pp {o['overlap_pp']}, "
            + ("overlap_ep 1, " if o.get("overlap_ep") else "") + "fused_norm "
            f"{int(o['fused_norm'])}, attention {o['flash_kernel'] if o['flash'] else 'eager'}"
            + (f", gradients reduced in {8 * o['grad_reduce_bytes']}-bit"
               if o.get("grad_reduce_bytes") else "")
            + (f", Adam state {doc['optimizer_bytes_per_param']} B per parameter"
               if doc.get("optimizer_dtype") else "")
            + (f", offload_layers {o['offload_layers']}" if o.get("offload_layers") else "")
            + (", backward_prefetch post" if o.get("backward_prefetch") == "post" else "")
            + (f", fp8_recipe {o['fp8_recipe']} ({o['fp8_cast_bytes']} B a cast element)"
               if o.get("fp8_recipe") else "")
            + (", recompute_modules " + "+".join(o["recompute_modules"])
               if o.get("recompute_modules") else "")
            + _runs_text(doc.get("framework"), doc.get("framework_runs")))


def _runs_text(name: str | None, runs: dict[str, Any] | None) -> str:
    """What the named framework runs, which the search and a given layout keep to (""
    without one)."""
    if not runs:
        return ""
    parts = []
    if runs["schedules"] is not None:
        parts.append("schedules " + ", ".join(runs["schedules"]))
    if runs["zero"] is not None:
        parts.append("ZeRO " + ", ".join(map(str, runs["zero"])))
    if runs["pipeline_max_zero"] is not None:
        parts.append(f"ZeRO <= {runs['pipeline_max_zero']} with pp > 1")
    if not runs["context_parallel"]:
        parts.append("no cp")
    return f"; {name} runs only: " + ", ".join(parts) if parts else ""


def print_plan(doc: dict[str, Any]) -> None:
    """Print the plan document: header, the top layouts, rejections, the train command."""
    e = doc["efficiency"]
    lines = [
        f"{doc['model']}: {doc['model_shape']}",
        f"cluster: {doc['gpus']} x {doc['gpu']} ({doc['gpus_per_node']} per node), "
        f"{human(doc['peak_flops_per_device'], 'FLOP/s')} dense "
        + (f"bf16 (linear layers fp8: {human(doc['linear_peak_flops_per_device'], 'FLOP/s')})"
           if doc["dtype"] == "fp8" else doc["dtype"]) + f" each{_cap(doc)}, "
        f"{human_bytes(doc['usable_memory_per_device'])} usable",
        f"job: global batch {doc['global_batch']} x seq {doc['seq']} = "
        f"{doc['global_batch'] * doc['seq']:,} tokens per step",
        f"searched {doc['candidates_evaluated']:,} layouts in {doc['seconds'] * 1e3:.0f} ms "
        f"({doc['candidates_evaluated'] / max(doc['seconds'], 1e-9):,.0f} layouts/s): "
        f"{doc['feasible']:,} fit",
        *(f"note: {n}" for n in doc.get("notes", [])),
    ]
    show(*lines)
    rows, parts = [], []
    # The runtime's fixed costs are measured for this machine only: no column elsewhere;
    # the all-to-alls of expert parallelism for a mixture-of-experts model only.
    moe = bool(doc.get("moe"))
    short = {k: v for k, v in _SHORT.items()
             if (k not in ("overhead", "cp_comm", "offload")
                 or any(b["breakdown"].get(k) for b in doc["best"]))
             and (k != "ep_comm" or moe)}
    dry = bool(doc.get("dry_run_top"))
    # Communication overlapped with compute: a "hidden" column beside each part that has any.
    # (the parts the step-time model can hide: the keys of each entry's "hidden")
    hidden = [k for k in (doc["best"][0].get("hidden", {}) if doc["best"] else {})
              if any(b["hidden"][k] > 5e-4 for b in doc["best"])]
    for i, b in enumerate(doc["best"], 1):
        mem = human_bytes(b["memory_per_device"]).split(" (")[0]
        rows.append([i, *_mesh(b, moe), f"{b['step_seconds']:.4g}",
                     f"{b['tokens_per_second']:,.0f}", f"{b['mfu']:.1%}",
                     mem + ("" if b["fits"] else " (does not fit)")]
                    + ([_dry_cell(b.get("dry_run"))] if dry else []))
        parts.append([i, *(f"{b['breakdown'][k]:.3f}" for k in short),
                      *(f"{b['hidden'][k]:.3f}" for k in hidden)])
    show(table("Fastest layouts", ["#", "dp·cp·tp·pp", *(["ep·etp"] if moe else []), "v",
                                   "schedule", "zero", "sp", "recompute", "mb x m", "step s",
                                   "tokens/s", "MFU", "memory/device"]
               + (["dry run peak"] if dry else []), rows, left=8 + moe),
         table("Where the step goes (seconds; communication and bubble: the exposed part; "
               "'hidden': communication overlapped with compute, not in the step)",
               ["#", *short.values(), *(f"{_SHORT[k]} hidden" for k in hidden)], parts),
         _options_line(doc),
         f"matmul efficiency: {e['peak_fraction']:.3f} x peak x I/(I + "
         f"{e['half_intensity']:.0f}) at intensity I; {e['op_overhead'] * 1e6:.2g} µs per "
         f"operator; {e['link_fraction']:.0%} of link bandwidth ({e['source']})",
         *([anchor_line(doc["anchor"])] if doc.get("anchor") else []),
         *([versus_line(doc["versus"])] if doc.get("versus") else []),
         *([] if doc.get("accuracy") is None else [
             accuracy_line(doc["accuracy"], doc["gpu"], doc["dtype"],
                           anchored=bool(doc.get("anchor")))]),
         *([] if not doc.get("runtime") else [
             "fixed: the runtime's fixed costs per step and gloo's rate per collective, both "
             "measured by `shardlab hardware --measure` with real ranks"]))
    if doc["rejected"]:
        show(table("Rejected", ["reason", "layouts"],
                   [[k, f"{v:,}"] for k, v in sorted(doc["rejected"].items(),
                                                     key=lambda kv: -kv[1])]))
    if doc["best"]:
        b = doc["best"][0]
        mb = b["memory_breakdown"]
        if b.get("stage_layers"):
            show("winner's layers per model chunk: " + "+".join(map(str, b["stage_layers"])))
        show(f"winner's memory per device (stage {mb['stage']}): weights "
             f"{human_bytes(mb['weights'])}, gradients {human_bytes(mb['gradients'])}, "
             f"optimizer {human_bytes(mb['optimizer'])}, activations "
             f"{human_bytes(mb['activations'])}"
             + (f", framework's transient peak {human_bytes(mb['transient'])}"
                if mb.get("transient") else "")
             + (f"; offloaded to host memory {human_bytes(mb['offloaded_to_host'])} per "
                "micro-batch" if mb.get("offloaded_to_host") else ""))
        if b["train_command"]:
            show(f"run it: {b['train_command']}")
    if doc.get("dry_run_top"):
        show(f"dry run peak: the {doc['dry_run_top']} fastest layouts that fit, every role on "
             "fake tensors (shardlab train's program); ok / NO: the peak + the CUDA context's "
             "allowance against the device's whole memory; layouts whose dry run does not fit "
             "are ranked last")
    if doc.get("fit"):
        print_fit(doc["fit"])
