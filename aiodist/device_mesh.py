"""torch's ``torch.distributed.device_mesh`` under its own name: ``DeviceMesh`` and ``init_device_mesh``.

``mesh = await aiodist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``;
``mesh = await aiodist.device_mesh.DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("dp", "tp"))``;
``mesh["dp"].get_group()``. See :mod:`aiodist.mesh`.
"""

from __future__ import annotations

from .mesh import DeviceMesh, init_device_mesh

__all__ = ["DeviceMesh", "init_device_mesh"]
