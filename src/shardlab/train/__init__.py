"""The real training loop every rank runs (:mod:`~shardlab.train.loop`) and its predicted
vs measured report (:mod:`~shardlab.train.report`)."""
