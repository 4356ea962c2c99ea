"""The shared vocabulary: ModelShape, Hardware (Accelerator, Link), Layout, dtype policies."""

from shardlab.config.catalog import MODELS, get_model
from shardlab.config.dtypes import POLICIES, DtypePolicy, get_policy
from shardlab.config.hardware import ACCELERATORS, LINKS, Accelerator, Link, get_accelerator
from shardlab.config.layout import Layout, make_layout
from shardlab.config.model import ModelShape, MoE

__all__ = [
           "ACCELERATORS",
           "LINKS",
           "MODELS",
           "POLICIES",
           "Accelerator",
           "DtypePolicy",
           "Layout",
           "Link",
           "MoE",
           "ModelShape",
           "get_accelerator",
           "get_model",
           "get_policy",
           "make_layout",
]
