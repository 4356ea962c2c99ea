"""What a named framework runs: the pipeline schedules, ZeRO stages and context
parallelism of :class:`shardlab.plan.overlap.Framework`, applied to ``plan``'s search and
checked against a given layout (``plan --layout``, ``budget --framework``), so a plan
never ranks, and a budget never prices, a layout its framework cannot run."""

from __future__ import annotations

from typing import Any

from shardlab.errors import SpecError
from shardlab.plan.overlap import Framework


def framework_keeps(fw: Framework, knob: str, asked: tuple[Any, ...], explicit: bool
                    ) -> tuple[Any, ...]:
    """The values of ``asked`` for ``knob`` (``schedules`` or ``zero``) that ``fw`` runs
    (:attr:`Framework.schedules`, :attr:`Framework.zero`). With ``explicit`` (the user
    named them), one it does not run is a one-line SpecError rather than dropped."""
    runs = getattr(fw, knob)
    if runs is None:
        return asked
    if explicit:
        for value in asked:
            if value not in runs:
                raise SpecError(knob, value, runs_text(fw, knob))
    return tuple(x for x in asked if x in runs)


def check_framework_runs(fw: Framework, pp: int, schedule: str, shards: int, zero: int,
                         cp: int = 1, virtual: int = 1) -> None:
    """A one-line SpecError where a given layout (``pp`` stages on ``schedule`` with
    ``virtual`` chunks a rank, ZeRO ``zero`` over ``shards`` = dp x cp ranks, context
    parallel ``cp``) is one ``fw`` does not run."""
    if cp > 1 and not fw.context_parallel:
        raise SpecError("cp", cp, NO_CP.format(fw.name))
    if pp > 1 and fw.schedules is not None and schedule not in fw.schedules:
        # Virtual stages alone make a layout interleaved: say where the schedule came from.
        came = (f" (virtual={virtual} makes it {schedule})"
                if virtual > 1 and schedule == "interleaved-1f1b" else "")
        raise SpecError("schedule", schedule, runs_text(fw, "schedules") + came)
    if shards > 1 and fw.zero is not None and zero not in fw.zero:
        raise SpecError("zero", zero, runs_text(fw, "zero"))
    if pp > 1 and fw.pipeline_max_zero is not None and zero > fw.pipeline_max_zero:
        raise SpecError("zero", zero, f"--framework {fw.name} pipelines with ZeRO "
                        f"0-{fw.pipeline_max_zero} only (pp={pp})")


NO_CP = ("--framework {} runs no context parallelism the planner prices (its sequence "
         "parallelism is DeepSpeed-Ulysses' all-to-all over heads): cp must be 1")


def framework_cp(fw: Framework, asked: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The context-parallel degrees to search under ``fw``: ``asked`` (None: the search's
    own), or (1,) where it runs none; a cp > 1 asked of such a framework is a SpecError."""
    if fw.context_parallel:
        return asked
    for c in asked or ():
        if c > 1:
            raise SpecError("cp", c, NO_CP.format(fw.name))
    return (1,)


def runs_text(fw: Framework, knob: str) -> str:
    """What ``fw`` runs of ``knob``, said in an error line."""
    runs = getattr(fw, knob)
    if knob == "zero":
        return f"--framework {fw.name} runs ZeRO {', '.join(map(str, runs))}"
    return f"--framework {fw.name} runs {', '.join(runs)}"
