"""The shared vocabulary: ModelShape, Hardware (Accelerator, Link), Layout, dtype policies."""

from shardlab.spec.catalog import MODELS, get_model
from shardlab.spec.dtypes import POLICIES, DtypePolicy, get_policy
from shardlab.spec.hardware import ACCELERATORS, LINKS, Accelerator, Link, get_accelerator
from shardlab.spec.layout import Layout, make_layout
from shardlab.spec.model import ModelShape, MoE

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
