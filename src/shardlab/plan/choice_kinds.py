"""What kind of choice two ways of running one job make, and how well the planner has
priced such choices on published runs (:mod:`shardlab.plan.published_pairs`).

A plan that prices two layouts side by side (``shardlab plan --layout A --versus B``) says
what kind of change B is and how far off the planner's ratio has been on published pairs
of that kind; :data:`CHOOSER` keeps those figures as ``python -m
shardlab.plan.published_pairs`` prints them (``tests/plan/test_published_pairs.py``
recomputes them and fails when the two part). Run-free: the plan command imports this,
not the published runs.
"""

from __future__ import annotations

from shardlab.plan import search

OVERLAP_KEYS = frozenset({"overlap_tp", "overlap_dp", "overlap_ep", "overlap_pp"})
KERNEL_KEYS = frozenset({"fused_norm", "fused_loss", "flash_kernel"})
PRECISION_KEYS = frozenset({"dtype", "fp8_params", "fp8_recipe"})
LAYOUT_KEYS = frozenset({*search.LAYOUT_KEYS, "virtual_stages", "recompute_modules",
                         "offload_layers"})
"""The keys of a layout proper: ``--layout``'s own (:data:`shardlab.plan.search.LAYOUT_KEYS`:
mesh, schedule, ZeRO, recompute, micro-batch, MoE), a priced plan entry's name for the
virtual stages, and the two step keys that choose what to recompute or offload."""

CHOICES = ("precision", "overlap", "kernels", "mixed", "layout")
"""The kinds of pair that are one job run two ways."""


def kind_of(changes: dict[str, tuple[str, str]]) -> str:
    """In a scale series (:func:`shardlab.plan.published_pairs.series`): ``weak`` when the
    device count and the global batch change, ``strong`` when only the device count does,
    ``batch`` when only the global batch does. Otherwise ``layout`` when any key of
    :data:`LAYOUT_KEYS` changes (a layout choice, whatever else its stack changed with it),
    ``precision`` when only the dtype does (with fp8's own ``fp8_params`` and
    ``fp8_recipe``; these two, or an fp8 attention kernel, without it: ``other``),
    ``overlap`` when only
    communication-overlap keys do, ``kernels`` when only fused-kernel keys do, ``mixed``
    when these three kinds mix (two effects in one ratio), else ``other`` (a
    gradient-reduction dtype, a dispatcher, ...: no published pair changed one alone)."""
    keys = set(changes)
    if "gpus" in keys:
        return "weak" if "global_batch" in keys else "strong"
    if "global_batch" in keys:
        return "batch"
    if keys & LAYOUT_KEYS:
        return "layout"
    fp8_kernel = "fp8" in changes.get("flash_kernel", ())
    if keys - PRECISION_KEYS - OVERLAP_KEYS - KERNEL_KEYS or (
            (keys & PRECISION_KEYS or fp8_kernel) and "dtype" not in keys):
        # fp8's own keys (an fp8 attention kernel among them) without the dtype: no
        # published pair changed one alone.
        return "other"
    for kind, own in (("precision", PRECISION_KEYS), ("overlap", OVERLAP_KEYS),
                      ("kernels", KERNEL_KEYS)):
        if keys <= own:
            return kind
    return "mixed"


CHOOSER: dict[str, tuple[int, float, int, int]] = {
    "precision": (23, 0.061, 23, 23),
    "overlap": (8, 0.055, 8, 8),
    "kernels": (2, 0.065, 2, 2),
    "mixed": (7, 0.03, 7, 7),
    "layout": (7, 0.239, 6, 3),
    "strong": (11, 0.024, 6, 6),
    "weak": (21, 0.02, 1, 1),
    "batch": (6, 0.017, 6, 6),
}
"""Per kind of :data:`CHOICES` (and the scaling kinds): published pairs, the mean absolute
error of the planner's ratio (a fraction, rounded to 0.1%), pairs scored (not within 3%)
and how many of those it ordered as measured."""
