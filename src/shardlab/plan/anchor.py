"""One measured run anchors the matmul efficiency curve: ``shardlab plan --measured-step``.

The catalog's curves (:mod:`shardlab.config.hardware`) are fitted on published runs of
several software stacks; on held-out runs they leave about 8% of step-time error on
average (``docs/validation.md``), and a stack or release the catalog never saw can sit
further off (NeMo 25.04's fp8 on GB200: 13-23% slower than the curve says). A team that has
run one layout on its own cluster knows more than any catalog: its measured seconds per
step. :func:`anchor_efficiency` finds the share of the dense peak (``peak_fraction``, or
with fp8 ``fp8_peak_fraction``) at which the planner prices that layout at exactly the
measured step, and the search then ranks every other layout on that curve: the same
one-number fit :func:`shardlab.plan.published.fit` makes on calibration runs, on the
user's run instead. What one such run buys on published families is measured by
:func:`shardlab.plan.published_anchor.anchored_table` (``docs/validation.md``, "What one
measured run buys").

The predicted step falls monotonically as the share rises (every matmul's time is its FLOPs
over peak x share x I/(I + half); the rest does not move), so a bracketed root search
finds it: false position on 1/share (the step is close to a + b/share), with the Illinois
step against a stalled end (Dowell & Jarratt 1971). A measured step the layout could not
take at any share in :data:`SPAN` is bad input: one line naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from shardlab.config.hardware import Efficiency
from shardlab.errors import SpecError

SPAN: tuple[float, float] = (0.05, 1.0)
"""Shares of the dense peak an anchored curve may take: a matmul at 5% of the peak is an
idle device or a wrong layout, beyond 100% a wrong measurement."""

FIELDS: tuple[str, ...] = ("peak_fraction", "fp8_peak_fraction")
"""The fields an anchor fits: the bf16 share, or with fp8 the fp8 linear matmuls' share
(an fp8 attention kernel's core, ``flash_kernel=fp8``, below its cap takes it too)."""

TOLERANCE = 1e-5
"""Relative step error at which the search stops."""


@dataclass(frozen=True)
class Anchor:
    """An anchored curve: the measured ``layout`` took ``measured_step`` seconds; the
    catalog's ``field`` (``catalog``) priced it at ``predicted_before``; ``fitted`` prices it
    at the measurement; ``fits``: the layout's memory by the planner's count."""

    measured_step: float
    layout: str
    field: str
    catalog: float
    fitted: float
    predicted_before: float
    fits: bool = True
    """Whether the measured layout fits the device by the planner's count."""

    def as_dict(self) -> dict[str, float | str | bool]:
        return asdict(self)


def share(eff: Efficiency, field: str) -> float:
    """The curve's ``field`` as the step model reads it: an unset fp8 share (0) is
    :meth:`~shardlab.config.hardware.Efficiency.fp8_curve`'s."""
    return eff.fp8_curve().peak_fraction if field == "fp8_peak_fraction" else getattr(eff,
                                                                                     field)


def anchor_efficiency(step_at: Callable[[Efficiency], float], eff: Efficiency, field: str,
                      measured: float) -> tuple[Efficiency, float]:
    """``eff`` with ``field`` set so that ``step_at`` (the planner's step seconds of the
    measured layout on a curve) equals ``measured``; and the step at ``eff`` as given.
    SpecError (field ``measured_step``) when no share in :data:`SPAN` gets there."""
    if field not in FIELDS:
        raise ValueError(f"field must be one of {FIELDS}")
    at = lambda x: step_at(replace(eff, **{field: x}))  # noqa: E731
    before = step_at(eff)
    lo, hi = SPAN[0], max(SPAN[1], share(eff, field))  # a measured CPU may exceed 1
    slow, fast = at(lo), at(hi)
    if not slow > fast:
        raise SpecError("measured_step", measured, f"this layout's predicted step does not "
                        f"depend on {field} here ({fast:.4g} s at any share), so no share "
                        "can be fitted to it")
    if measured < fast:
        raise SpecError("measured_step", measured, f"faster than the planner can price this "
                        f"layout even at the whole dense peak ({fast:.4g} s at {field} "
                        f"{hi:g}): check the layout, the global batch and the step's units")
    if measured > slow:
        raise SpecError("measured_step", measured, f"slower than the planner prices this "
                        f"layout at {lo:.0%} of the dense peak ({slow:.4g} s): check the "
                        "layout, the global batch and the step's units")
    # False position on u = 1/share (step ≈ a + b·u), Illinois-damped.
    u = (1 / hi, 1 / lo)
    f = (fast - measured, slow - measured)
    side = -1  # the end the last step replaced (0: the fast one, 1: the slow one)
    x, fn = hi, f[0]
    for _ in range(60):
        if f[1] == f[0]:
            break
        un = (u[0] * f[1] - u[1] * f[0]) / (f[1] - f[0])
        x = 1 / un
        fn = at(x) - measured
        if abs(fn) <= TOLERANCE * measured:
            break
        if fn < 0:  # still too fast: the share is lower, u higher
            u, f = (un, u[1]), (fn, f[1] / 2 if side == 0 else f[1])
            side = 0
        else:
            u, f = (u[0], un), (f[0] / 2 if side == 1 else f[0], fn)
            side = 1
    if abs(fn) > 1e-3 * measured:  # a step that jumps: no share prices it at the measurement
        raise SpecError("measured_step", measured, f"no {field} prices this layout at it: "
                        f"the closest is {fn + measured:.4g} s at {x:.3f}")
    return replace(eff, **{field: x}), before
