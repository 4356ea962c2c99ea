"""Real processes through torch.distributed: the launcher, the device mesh's parallelisms
(tensor parallel, activation checkpointing, FSDP2/DDP), pipeline stages, distributed
checkpoints and the meters of a run."""
