"""The closed-form cost model: pure Python, never imports torch (so ``budget`` answers at once).

params -> flops -> activations/memory -> comm -> timing -> inference -> operators,
assembled by :func:`shardlab.estimate.budget.model_budget`.
"""
