"""A dry run as a page: each role's memory, the cost model's beside the dry run's, as
stacked bars against the device; per role the table ``shardlab dryrun`` prints, the
peak's moment and the bytes sent per mesh dim; what the trackers cannot see.

It reads the document ``shardlab dryrun --json`` prints (saved to a file, or made by
``shardlab report dryrun`` itself): JSON only, checked key by key before anything is
drawn, so a file that is not one is one line naming the first thing missing. No torch.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from shardlab.errors import SpecError
from shardlab.report import charts
from shardlab.report.dryrun_view import at_peak
from shardlab.report.html import Raw, Section, esc, heading, para, table_html, verdict
from shardlab.units import human, human_seconds

CATEGORIES = (("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer"),
              ("activations", "activations"), ("temporaries", "temporaries"))
"""A role's memory categories (the document's key, the chart's part: its colour)."""

ROWS = (("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer state"),
        ("activations", "activations saved"), ("activations_tracked", "activations held"),
        ("temporaries", "temporaries"), ("peak_bytes", "peak"))
"""The rows of each role's table, as ``shardlab dryrun`` prints them."""

MAX_DOCUMENT_BYTES = 64 * 2**20
"""A document larger than this (64 MiB) is refused unread: a dry run's is a few kB per role."""

LINES_FROM = 0.05
"""The capacity lines are drawn when the tallest bar reaches this share of the device's
memory; below it they would squash every bar to a sliver, and the caption says so."""

HINT = "must be a document `shardlab dryrun --json` wrote"


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _number_or_none(v: Any) -> bool:
    return v is None or _number(v)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


class _Checker:
    """Walks a document and raises one SpecError naming the first key that is missing or
    of the wrong kind (``roles[1].by_category.params``)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, why: str) -> SpecError:
        return SpecError("from", self.source, f"{HINT}; {where} {why}")

    def dict(self, obj: Any, where: str) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(where or "the document", "is not an object")
        return obj

    def get(self, obj: dict[str, Any], key: str, test: Any, kind: str, where: str) -> Any:
        at = f"{where}.{key}" if where else key
        if key not in obj:
            raise self.fail(at, "is missing")
        if not test(obj[key]):
            raise self.fail(at, f"is not {kind}")
        return obj[key]

    def figures(self, obj: Any, keys: Any, test: Any, kind: str, where: str) -> None:
        d = self.dict(obj, where)
        for k in keys:
            self.get(d, k, test, kind, where)


def check_document(doc: Any, source: str) -> dict[str, Any]:
    """``doc`` when it has everything the page reads, of the right kind; SpecError naming
    ``--from`` (``source``) and the first thing missing otherwise."""
    c = _Checker(source)
    d = c.dict(doc, "")
    for key, test, kind in (("model", _str, "text"), ("layout", _str, "text"),
                            ("gpus", _int, "an integer"), ("seconds", _number, "a number"),
                            ("flops", _number, "a number")):
        c.get(d, key, test, kind, "")
    c.get(d, "roles_run", lambda v: isinstance(v, list) and all(map(_int, v)),
          "a list of ranks", "")
    c.get(d, "unseen", lambda v: isinstance(v, list) and all(map(_str, v)), "a list of text",
          "")
    if d.get("gpu") is not None:
        c.get(d, "gpu", _str, "text", "")
    roles = c.get(d, "roles", lambda v: isinstance(v, list) and v, "a list of roles", "")
    cats = [k for k, _ in CATEGORIES]
    for n, raw in enumerate(roles):
        at = f"roles[{n}]"
        r = c.dict(raw, at)
        for key in ("rank", "pp_rank", "layers"):
            c.get(r, key, _int, "an integer", at)
        c.get(r, "stages", lambda v: isinstance(v, list) and all(map(_int, v)),
              "a list of stages", at)
        c.get(r, "peak_bytes", _number, "a number", at)
        c.figures(c.get(r, "by_category", lambda v: True, "", at), cats, _number, "a number",
                  f"{at}.by_category")
        for part in ("predicted", "measured"):
            c.figures(c.get(r, part, lambda v: True, "", at), [*cats, "peak_bytes"], _number,
                      "a number", f"{at}.{part}")
        c.figures(c.get(r, "ratio", lambda v: True, "", at), [*cats, "peak_bytes"],
                  _number_or_none, "a number or null", f"{at}.ratio")
        c.figures(c.get(r, "peak_at", lambda v: True, "", at), ("phase", "module"), _str,
                  "text", f"{at}.peak_at")
        dims = c.dict(c.get(r, "by_dim", lambda v: True, "", at), f"{at}.by_dim")
        for dim, v in dims.items():
            c.figures(v, ("predicted", "measured"), _number, "a number", f"{at}.by_dim.{dim}")
    if d.get("fit") is not None:
        fit = c.dict(d["fit"], "fit")
        for key in ("capacity_bytes", "allowance_bytes", "needed_bytes", "headroom_bytes"):
            c.get(fit, key, _number, "a number", "fit")
        for key in ("fits", "predicted_fits"):
            c.get(fit, key, _bool, "true or false", "fit")
    return d


def _read_file(p: Path, path: str) -> bytes:
    if p.is_dir():
        raise SpecError("from", path, f"{HINT}; it is a folder")
    if not p.exists():
        raise SpecError("from", path, f"{HINT}; no such file")
    if not p.is_file():
        raise SpecError("from", path, f"{HINT}; it is not a regular file")
    size = p.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise SpecError("from", path, f"{HINT}; it is {size:,} bytes, a dry run's is a few "
                        f"kB (at most {MAX_DOCUMENT_BYTES:,})")
    return p.read_bytes()


def load_dryrun(path: str) -> dict[str, Any]:
    """The document in file ``path`` (``-``: standard input), checked
    (:func:`check_document`); SpecError naming ``--from`` when it cannot be read or is not
    UTF-8 JSON text, or not a dry run's document. JSON only: nothing else is parsed."""
    if path == "-":
        try:
            data = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
        except OSError as e:  # no standard input to read (closed, or a test's capture)
            raise SpecError("from", path, f"standard input cannot be read ({e})") from None
    else:
        try:
            data = _read_file(Path(path).expanduser(), path)
        except OSError as e:  # a name too long, a loop of links, no permission, ...
            raise SpecError("from", path, f"cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise SpecError("from", path, f"{HINT}; it is over {MAX_DOCUMENT_BYTES:,} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SpecError("from", path, f"{HINT}; it is not UTF-8 text (byte {e.start} is "
                        f"0x{data[e.start]:02x})") from None
    except json.JSONDecodeError as e:
        raise SpecError("from", path, f"{HINT}; it is not JSON ({e.msg}, line {e.lineno})"
                        ) from None
    except (ValueError, RecursionError) as e:  # a 5,000-digit number, nesting 10,000 deep
        raise SpecError("from", path, f"{HINT}; it is not JSON that can be read "
                        f"({type(e).__name__})") from None
    return check_document(doc, path)


# -- the page ----------------------------------------------------------------------------------


def _bytes(x: float | None) -> str:
    return "-" if x is None else human(x, "B")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _moment(at: dict[str, str]) -> str:
    return f"in the {at['phase'] or 'step'}" + (f", inside {at['module']}" if at["module"]
                                                 else "")


def _role_name(r: dict[str, Any]) -> str:
    stages = ", ".join(map(str, r["stages"]))
    return (f"Rank {r['rank']} (pipeline rank {r['pp_rank']}, stage{'s' * (len(r['stages']) > 1)}"
            f" {stages}, {r['layers']} layer{'s' * (r['layers'] != 1)})")


def dryrun_title(doc: dict[str, Any]) -> tuple[str, list[str]]:
    """The page's title and subtitle lines: model, ranks, layout, roles run and time."""
    ranks = ", ".join(map(str, doc["roles_run"]))
    return (f"Dry run: {doc['model']} on {doc['gpus']} ranks",
            [doc["layout"], f"dry-ran rank{'s' * (len(doc['roles_run']) != 1)} {ranks} on "
             f"fake tensors in {human_seconds(doc['seconds'])}"])


def fit_text(doc: dict[str, Any]) -> Raw | str:
    """The verdict on the device (a coloured word and its sum), or why there is none."""
    fit = doc.get("fit")
    if fit is None:
        return "no device given (`shardlab dryrun --gpu NAME` adds the verdict)"
    peak = fit["needed_bytes"] - fit["allowance_bytes"]
    return Raw(verdict(fit["fits"], "fits", "does NOT fit") + esc(
        f": peak {_bytes(peak)} + CUDA context {_bytes(fit['allowance_bytes'])} = "
        f"{_bytes(fit['needed_bytes'])} of {_bytes(fit['capacity_bytes'])} (headroom "
        f"{_bytes(fit['headroom_bytes'])}); the cost model says it "
        + ("fits" if fit["predicted_fits"] else "does not fit")))


def dryrun_sections(doc: dict[str, Any], prefix: str = "dryrun") -> list[Section]:
    """The sections of a dry run's page; ``prefix`` keeps anchors and chart names apart
    when several reports share one page."""
    return [_overview(doc, prefix), _memory(doc, prefix), _roles(doc, prefix),
            _unseen(doc, prefix)]


def _overview(doc: dict[str, Any], prefix: str) -> Section:
    busiest = doc["roles"][0]
    s = Section(f"{prefix}-overview", "Dry run: the answer")
    device = "fit" if doc.get("gpu") is None else f"fit on {doc['gpu']}"
    s.add(table_html(("what", "value"), [
        ("model", doc["model"]),
        ("layout", doc["layout"]),
        ("ranks", f"{doc['gpus']:,}"),
        ("roles dry-run", f"rank{'s' * (len(doc['roles_run']) != 1)} "
                          f"{', '.join(map(str, doc['roles_run']))}, in "
                          f"{human_seconds(doc['seconds'])} on fake tensors"),
        ("busiest rank", _role_name(busiest)),
        ("its peak: dry run / predicted", f"{_bytes(busiest['peak_bytes'])} / "
                                          f"{_bytes(busiest['predicted']['peak_bytes'])} "
                                          f"(ratio {_ratio(busiest['ratio']['peak_bytes'])})"),
        ("the peak's moment", _moment(busiest["peak_at"])),
        ("its step's FLOPs", human(doc["flops"], "FLOP")),
        (device, fit_text(doc)),
    ], left=2))
    return s


def _scale(top: float) -> tuple[float, str]:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if top >= scale:
            return scale, unit
    return 1.0, "bytes"


def memory_bars(doc: dict[str, Any]) -> tuple[list[str], dict[str, list[float]]]:
    """The chart's bars: per role, the cost model's categories (``predicted``: they sum to
    its ``peak_bytes``) and the dry run's breakdown at its peak (``by_category``: it sums
    to the role's ``peak_bytes``); labels and parts (chart part -> one value per bar)."""
    labels: list[str] = []
    parts: dict[str, list[float]] = {part: [] for _, part in CATEGORIES}
    for r in doc["roles"]:
        for which, figures in (("predicted", r["predicted"]), ("dry run", r["by_category"])):
            labels.append(f"rank {r['rank']} {which}")
            for key, part in CATEGORIES:
                parts[part].append(float(figures[key]))
    return labels, parts


def _memory(doc: dict[str, Any], prefix: str) -> Section:
    roles = doc["roles"]
    s = Section(f"{prefix}-memory", "Memory per role")
    labels, parts = memory_bars(doc)
    top = max(sum(v[i] for v in parts.values()) for i in range(len(labels)))
    scale, unit = _scale(top)
    fit = doc.get("fit")
    caption = (f"Each role's memory ({unit}, decimal): the cost model's categories "
               "(predicted) beside the dry run's at the moment of its peak (dry run: the "
               "parts sum to the peak).")
    lines: dict[str, Any] = {}
    if fit is not None:
        usable = fit["capacity_bytes"] - fit["allowance_bytes"]
        if top >= LINES_FROM * fit["capacity_bytes"]:
            lines = {"limit": fit["capacity_bytes"], "limit_label": "capacity",
                     "more_limits": [(usable, "capacity less the CUDA context")]}
            caption += (f" The dashed line is the device's memory "
                        f"({_bytes(fit['capacity_bytes'])}), the dotted one that less the "
                        f"CUDA context's allowance ({_bytes(usable)}).")
        else:
            caption += (f" The device's memory ({_bytes(fit['capacity_bytes'])}; "
                        f"{_bytes(usable)} less the CUDA context) is off this scale: the "
                        f"largest bar is {100 * top / fit['capacity_bytes']:.2g}% of it.")
    s.chart(charts.stacked_bars(f"{prefix}-memory", caption, labels, parts, horizontal=True,
                                scale=scale, unit=f"{unit} (decimal)", **lines))
    s.add(table_html(("rank", "pipeline rank", "stages", "layers", "the peak's moment",
                      "peak (dry run)", "predicted", "ratio"),
                     [(r["rank"], r["pp_rank"], ", ".join(map(str, r["stages"])), r["layers"],
                       _moment(r["peak_at"]), _bytes(r["peak_bytes"]),
                       _bytes(r["predicted"]["peak_bytes"]), _ratio(r["ratio"]["peak_bytes"]))
                      for r in roles], left=5,
                     caption="Every role dry-run, the busiest first."))
    return s


def _roles(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-roles", "Cost model vs dry run, per role")
    s.add(para("Weights, gradients and optimizer state are what the rank holds after its "
               "backward; activations saved: what one micro-batch saves for backward x the "
               "micro-batches in flight; held: the step's largest activation figure (also "
               "a stage's outputs and the loss's inputs); 'at the peak' is the "
               "breakdown at the peak's moment (the chart's dry-run bar). The cost model has "
               "no term for temporaries (gathered weights, communication buffers, activation "
               "gradients).", "note"))
    for n, r in enumerate(doc["roles"]):
        s.add(heading(_role_name(r) + (": the busiest" if n == 0 else "")))
        s.add(table_html(("", "predicted", "dry run", "dry run / predicted", "at the peak"),
                         [(label, _bytes(r["predicted"].get(key, r["predicted"]["activations"])),
                           _bytes(r["measured"][key]), _ratio(r["ratio"][key]),
                           _bytes(at_peak(r, key)))
                          for key, label in ROWS if key in r["measured"]]))
        s.add(para(f"Peak {_moment(r['peak_at'])}.", "note"))
        dims = r["by_dim"]
        if dims:
            s.add(table_html(("mesh dim", "predicted", "dry run", "ratio"),
                             [(d, f"{v['predicted']:,.0f}", f"{v['measured']:,.0f}",
                               _ratio(v["measured"] / v["predicted"] if v["predicted"]
                                      else None)) for d, v in dims.items()],
                             caption=f"Bytes rank {r['rank']} sends per step, per mesh dim."))
        else:
            s.add(para(f"Rank {r['rank']} sends nothing: no mesh dim has more than one rank.",
                       "note"))
    return s


def _unseen(doc: dict[str, Any], prefix: str) -> Section:
    s = Section(f"{prefix}-unseen", "What the trackers cannot see")
    s.add("<ul>" + "".join(f"<li>{esc(u)}</li>" for u in doc["unseen"]) + "</ul>")
    fit = doc.get("fit")
    if fit is not None:
        s.add(para(f"The verdict adds {_bytes(fit['allowance_bytes'])} for the CUDA context "
                   "and kernels, a published measurement (shardlab.dryrun.compare."
                   "CUDA_CONTEXT_BYTES); NCCL's buffers and the allocator's fragmentation "
                   "come on top.", "note"))
    return s
