"""The planner: search every layout of a model on a cluster, keep what fits, rank by step time.

:mod:`space` lists the layouts and the rule each invalid one breaks, :mod:`memory`
sizes them (the estimate's formulas over numpy arrays), :mod:`efficiency`,
:mod:`comm_time` and :mod:`bubble` feed :mod:`step_time`, the step-time model, and
:mod:`search` puts them together (:func:`search.plan`). :mod:`published` holds the
published runs the efficiency curves are calibrated and validated on. Pure Python and
numpy: no torch.
"""
