"""``shardlab dryrun``: the real sharded program of any rank of an N-rank job, run on fake
tensors in one CPU process, beside the cost model's figures."""
