"""Device meshes: the world's ranks laid out as an n-dimensional array, a group per dimension.

``init_device_mesh((2, 4), mesh_dim_names=("dp", "tp"))`` arranges ranks
0..7 row-major as ``[[0, 1, 2, 3], [4, 5, 6, 7]]``; ``get_group("tp")`` is the
group of this rank's row (the ranks that differ only in the "tp"
coordinate), ``get_group("dp")`` the group of its column. Like torch, every
rank creates every group of every dimension (``new_group`` is collective),
in a fixed order, and keeps the ones it belongs to.

``mesh["dp"]`` (or ``mesh["dp", "tp"]``, names in the mesh's order) is the sub-mesh of this rank's slice
along those dimensions, sharing their groups: ``mesh["dp"].get_group()`` is
``mesh.get_group("dp")``. ``aiodist.device_mesh`` is the same under torch's
module name (``torch.distributed.device_mesh``).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from .context import get_default_group
from .current import world
from .errors import GroupError, InvalidArgumentError, InvalidArgumentTypeError
from .group import ProcessGroup


class DeviceMesh:
    """The ranks of the world as an array (``.mesh``), with one group per dimension for this rank.

    ``await init_device_mesh("cpu", (2, 4), mesh_dim_names=...)`` makes one (ranks row-major);
    torch's constructor, ``await DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=...)``, lays out
    the ranks as given (each rank of the world once): awaiting it creates the groups, collectively,
    as ``init_device_mesh`` does. A mesh not awaited has no groups yet (its methods raise).
    """

    def __init__(self, device_type: str, mesh: Any, *, mesh_dim_names: Sequence[str] | None = None) -> None:
        layout = np.asarray(mesh)
        if layout.dtype.kind not in "iu" and layout.size:
            raise InvalidArgumentTypeError(f"DeviceMesh: the mesh must hold integer ranks, not {layout.dtype}")
        self.mesh: np.ndarray = layout.astype(np.int64)
        self.mesh_dim_names: tuple[str, ...] | None = _names(mesh_dim_names, self.mesh.ndim)
        self.device_type = device_type
        self._groups: list[ProcessGroup] = []
        self._rank = -1
        self._coordinate: tuple[int, ...] | None = None
        self._made = False

    @classmethod
    def _of(cls, mesh: np.ndarray, dim_names: tuple[str, ...] | None, groups: list[ProcessGroup], rank: int,
            device_type: str = "cpu") -> DeviceMesh:
        """A mesh whose groups exist (``groups``: this rank's, one per dimension)."""
        self = cls.__new__(cls)
        self.mesh = mesh
        self.mesh_dim_names = dim_names
        self.device_type = device_type
        self._place(groups, rank)
        return self

    def _place(self, groups: list[ProcessGroup], rank: int) -> None:
        self._groups = groups
        self._rank = rank
        where = np.argwhere(self.mesh == rank)
        self._coordinate = tuple(int(c) for c in where[0]) if len(where) else None
        self._made = True

    def __await__(self) -> Generator[Any, None, DeviceMesh]:
        """torch's constructor form: create the groups of every dimension (every rank must), then the mesh."""
        if not self._made:
            yield from _make_groups(self).__await__()
        return self

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh of this rank's slice along the named dimensions (torch's ``mesh["dp"]``, ``mesh["dp", "tp"]``)."""
        self._check_made()
        wanted = (names,) if isinstance(names, str) else tuple(names)
        if not wanted:
            raise KeyError("name at least one mesh dimension")
        dims = [self._dim(n) if isinstance(n, str) else self._named_only(n) for n in wanted]
        if len(set(dims)) != len(dims):
            raise KeyError(f"mesh dimensions {wanted} repeat one")
        if dims != sorted(dims):  # (torch refuses a transposed slice too)
            raise KeyError(f"mesh dimensions {wanted} are not in the mesh's order {self.mesh_dim_names}: "
                           f"name them in that order")
        if self._coordinate is None:
            raise InvalidArgumentError(f"rank {self._rank} is not in this mesh")
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.mesh.ndim))
        sub = self.mesh[index]
        sub_names = tuple(self.mesh_dim_names[d] for d in dims) if self.mesh_dim_names else None
        return DeviceMesh._of(sub, sub_names, [self._groups[d] for d in dims], self._rank, self.device_type)

    def __eq__(self, other: object) -> bool:
        """The same layout of the same ranks, with the same names, on the same device type (as torch compares)."""
        if not isinstance(other, DeviceMesh):
            return NotImplemented
        return (self.device_type == other.device_type and self.mesh_dim_names == other.mesh_dim_names
                and self.mesh.shape == other.mesh.shape and bool((self.mesh == other.mesh).all()))

    def __hash__(self) -> int:
        return hash((self.device_type, self.mesh_dim_names, self.mesh.shape, tuple(self.mesh.ravel().tolist())))

    def _named_only(self, name: object) -> int:
        raise KeyError(f"mesh dimensions are indexed by name (mesh_dim_names={self.mesh_dim_names}), not {name!r}")

    def get_rank(self) -> int:
        """This rank's global rank."""
        self._check_made()
        return self._rank

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh({self.device_type!r}, {self.mesh.tolist()}{names})"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Number of ranks in the mesh, or along one dimension."""
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, mesh_dim: int | str | None) -> int:
        if mesh_dim is None:
            if self.mesh.ndim != 1:
                raise InvalidArgumentError(f"this mesh has {self.mesh.ndim} dimensions: name the one you want")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"no mesh dimension named {mesh_dim!r} (names: {self.mesh_dim_names})")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.mesh.ndim <= mesh_dim < self.mesh.ndim:
            raise IndexError(f"mesh dimension {mesh_dim} out of range for {self.mesh.ndim} dimensions")
        return mesh_dim % self.mesh.ndim

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """This rank's group along ``mesh_dim`` (name or index)."""
        self._check_made()
        return self._groups[self._dim(mesh_dim)]

    def _check_made(self) -> None:
        if not self._made:
            raise GroupError("this DeviceMesh has no groups yet: await DeviceMesh(...) (it creates them, on every rank)")

    def get_all_groups(self) -> list[ProcessGroup]:
        self._check_made()
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's rank in its group along ``mesh_dim``, as torch's: the order in which that group's
        collectives place the ranks (an ``all_gather`` over it puts this rank's part at this index). Its
        coordinate along ``mesh_dim`` is the same unless the mesh lists that dimension's ranks out of order
        (``[[3, 0], [1, 2]]``: groups keep their ranks sorted, as ``new_group`` does)."""
        self._check_made()
        if self._coordinate is None:
            raise InvalidArgumentError(f"rank {self._rank} is not in this mesh")
        return int(self._groups[self._dim(mesh_dim)].rank)

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinates in the mesh."""
        self._check_made()
        return self._coordinate


def mesh_groups(shape: Sequence[int], dim: int) -> list[list[int]]:
    """The rank lists of dimension ``dim``'s groups of a row-major mesh of ``shape``, in the order every rank
    creates them."""
    return _slices(np.arange(math.prod(shape)).reshape(tuple(shape)), dim)


def _slices(layout: np.ndarray, dim: int) -> list[list[int]]:
    """The rank lists of dimension ``dim``'s groups of the mesh ``layout``, in the order every rank creates them."""
    return [row.tolist() for row in np.moveaxis(layout, dim, -1).reshape(-1, layout.shape[dim])]


async def init_device_mesh(
    mesh_shape: Sequence[int] | int | str,
    torch_shape: Sequence[int] | int | None = None,
    *,
    mesh_dim_names: Sequence[str] | None = None,
) -> DeviceMesh:
    """Lay the world out as ``mesh_shape`` and create the group of every dimension.

    The product of the shape must equal the world size. Every rank must call
    it (it creates groups collectively). torch's form
    ``init_device_mesh("cpu", (2, 4), mesh_dim_names=...)`` works too (the
    device type is ignored). Without a default group it first initializes one,
    ``init_process_group()`` from the environment, as torch does. Cancellation
    may leave some groups created on this rank and not on others: destroy the
    world group then.
    """
    device_type = "cpu"
    if isinstance(mesh_shape, str):
        if torch_shape is None:
            raise InvalidArgumentTypeError("init_device_mesh(device_type, mesh_shape): the mesh shape is missing")
        device_type, mesh_shape = mesh_shape, torch_shape
    elif torch_shape is not None:
        raise InvalidArgumentTypeError("init_device_mesh takes one mesh shape")
    shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(int(s) for s in mesh_shape)
    if not shape or any(s < 1 for s in shape):
        raise InvalidArgumentError(f"mesh shape {shape} must have positive dimensions")
    w = await _world()
    if math.prod(shape) != w.size:
        raise InvalidArgumentError(f"mesh shape {shape} holds {math.prod(shape)} ranks but the world has {w.size}")
    return await DeviceMesh(device_type, np.arange(w.size).reshape(shape), mesh_dim_names=mesh_dim_names)


async def _world() -> Any:
    """The world group; without a default group, ``init_process_group()`` from the environment first, as torch
    does (the TP/FSDP tutorials make the mesh first)."""
    if get_default_group() is None:
        from .api import init_process_group

        await init_process_group()
    return world()


def _names(mesh_dim_names: Sequence[str] | None, ndim: int) -> tuple[str, ...] | None:
    if mesh_dim_names is None:
        return None
    names = tuple(mesh_dim_names)
    if len(names) != ndim:
        raise InvalidArgumentError(f"mesh_dim_names {names} must name each of the {ndim} dimensions")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"mesh_dim_names {names} must be unique")
    return names


async def _make_groups(mesh: DeviceMesh) -> None:
    """Create the group of every slice of every dimension of ``mesh`` (every rank, in the same order) and keep
    this rank's; the mesh must hold each rank of the world once. Cancellation: as :func:`init_device_mesh`."""
    from .api import destroy_process_group
    from .subgroups import new_group

    w = await _world()
    layout = mesh.mesh
    if layout.ndim == 0 or sorted(layout.ravel().tolist()) != list(range(w.size)):
        raise InvalidArgumentError(f"a DeviceMesh must hold each rank of the world ({w.size}) once, got "
                                   f"{layout.tolist()}")
    me = w.rank
    mine: list[ProcessGroup] = []
    for dim in range(layout.ndim):
        chosen: ProcessGroup | None = None
        for ranks in _slices(layout, dim):
            g = await new_group(ranks)
            if me in ranks:
                chosen = g
            else:  # a slice without this rank: nothing of it is needed here, and the caller has no handle to it
                await destroy_process_group(g)
        assert chosen is not None
        mine.append(chosen)
    mesh._place(mine, me)


__all__ = ["DeviceMesh", "init_device_mesh", "mesh_groups"]
