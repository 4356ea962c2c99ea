"""The device mesh a run lays its model out on, with its dims by name.

Dense runs: ``(pp, dp, tp)``. With expert parallelism (``ep > 1``) the data-parallel
ranks are split in two, ``(pp, edp, ep, tp)``, ep innermost, as torchtitan's
``efsdp`` x ``ep`` (``torchtitan/distributed/parallel_dims.py``): the ep ranks of one
expert-parallel group are consecutive data-parallel ranks, and ``dp`` is the flattened
``(edp, ep)``, over which FSDP shards the dense parameters (and the data is split).

torch deprecates slicing a flattened dim from its root mesh (2.11 onwards): the caller
keeps the flattened mesh itself. :class:`RunMesh` does that bookkeeping, so ``mesh["dp"]``
is the same whichever way the mesh was built.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


class RunMesh:
    """A :class:`DeviceMesh` and the dims it flattened, indexed by name (``mesh["dp"]``)."""

    def __init__(self, root: DeviceMesh, flattened: dict[str, DeviceMesh] | None = None) -> None:
        self.root = root
        self.flattened = dict(flattened or {})

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """The root's dims and the flattened ones."""
        return tuple(self.root.mesh_dim_names or ()) + tuple(self.flattened)

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda``."""
        return self.root.device_type

    def __getitem__(self, name: str | tuple[str, ...]) -> Any:
        """The sub-mesh of dim ``name`` (1-D), or of the root's dims ``name`` (a tuple)."""
        if isinstance(name, str) and name in self.flattened:
            return self.flattened[name]
        return self.root[name]


def make_mesh(device_type: str, pp: int, dp: int, tp: int, ep: int = 1,
              experts: bool = False) -> RunMesh:
    """The run's mesh (module docstring); the default process group must have
    ``pp * dp * tp`` ranks, and ``ep`` divide ``dp``. ``experts``: the ``(pp, edp, ep,
    tp)`` form even with ep = 1 (experts split over tp need the ``(ep, tp)`` dims)."""
    if ep == 1 and not experts:
        return RunMesh(init_device_mesh(device_type, (pp, dp, tp),
                                        mesh_dim_names=("pp", "dp", "tp")))
    root = init_device_mesh(device_type, (pp, dp // ep, ep, tp),
                            mesh_dim_names=("pp", "edp", "ep", "tp"))
    return RunMesh(root, {"dp": root["edp", "ep"]._flatten("dp")})
