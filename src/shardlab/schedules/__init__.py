"""Pipeline schedules as data: generate, validate, time, draw (Python and numpy, no torch).

:mod:`actions` holds the vocabulary (Action, Schedule, stage placement),
:mod:`generators` builds GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, ZB-V and
DualPipeV, :mod:`simulate` places every action in time, :mod:`closed_forms` holds
the papers' bubble formulas, :mod:`draw` renders ASCII and PNG/SVG, :mod:`stream`
writes every action as JSON (timeline rows, JSON lines, a Chrome trace).
"""
