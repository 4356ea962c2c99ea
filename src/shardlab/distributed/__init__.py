"""Real processes through torch.distributed: the launcher (later: mesh, parallelize, checkpoint)."""
