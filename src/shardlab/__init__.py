"""shardlab: plan, understand, check and run the parallel training of transformer LMs.

Three views of every parallel strategy, held against each other:
``estimate`` (closed-form cost model, no torch), ``simulate`` (virtual devices in
one process) and ``run`` (real processes through torch.distributed).
"""

__version__ = "0.1.0"
