"""The real training loop every rank runs (:mod:`~shardlab.train.loop`), what a run is
(:mod:`~shardlab.train.config`), its update (:mod:`~shardlab.train.optimizer`), its
one-process parity reference (:mod:`~shardlab.train.reference`) and its predicted vs
measured report (:mod:`~shardlab.train.report`)."""
