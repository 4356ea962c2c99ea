"""Measuring this machine: matmul peaks, memory bandwidth, gloo's rates and the runtime's
fixed costs, each phase within its own time budget. It launches ranks of ``shardlab
train``, so it sits above the trainer; the vocabulary (:mod:`shardlab.config.measured`)
reads what it stores."""
