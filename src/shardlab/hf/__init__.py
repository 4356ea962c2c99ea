"""Hugging Face interop for weights: export a checkpoint as a transformers folder, import
one as a starting point (:mod:`~shardlab.hf.weights`). The config.json translation, which
needs no torch, is vocabulary: :mod:`shardlab.config.hf_config`."""
