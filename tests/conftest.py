"""Suite-wide settings: hypothesis without per-example deadlines (2 shared cores are noisy)."""

from hypothesis import settings

settings.register_profile("shardlab", deadline=None, max_examples=60)
settings.load_profile("shardlab")
