"""The planner: search every layout of a model on a cluster, keep what fits, rank by step time.

:mod:`space` lists the layouts and the rule each invalid one breaks, :mod:`memory`
sizes them (the estimate's formulas over numpy arrays), :mod:`efficiency`,
:mod:`comm_time`, :mod:`bubble`, :mod:`memory_bound` and :mod:`overlap` (communication
overlap and each framework's defaults) feed :mod:`step_time`, the step-time model, and
:mod:`search` puts them together (:func:`search.plan`). :mod:`published` calibrates
and validates the efficiency curves on the published runs of :mod:`runs_papers`,
:mod:`runs_nvidia` and :mod:`runs_pytorch` (:class:`published_run.PublishedRun`). Pure Python and
numpy: no torch.
"""
