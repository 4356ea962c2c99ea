"""Real-process experiments: each checks one claim of PyTorch's sharding on N ranks."""
