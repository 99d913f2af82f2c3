"""The environment a launched rank receives (pure: no I/O, no clock).

The variable names are torchrun's, so a program written for torchrun (or for
``aiodist.init_process_group(init_method="env://")``) runs unchanged; the
``AIODIST_*`` names duplicate the elastic ones under aiodist's own prefix.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["RANK_ENV_NAMES", "rank_env", "merged_env"]

RANK_ENV_NAMES: tuple[str, ...] = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "AIODIST_RESTART_COUNT",
    "AIODIST_MAX_RESTARTS",
    "AIODIST_RUN_ID",
)
"""Every variable :func:`rank_env` sets, in the order it sets them."""


def rank_env(
    *,
    local_rank: int,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str,
    master_port: int,
    restart_count: int = 0,
    max_restarts: int = 0,
    run_id: str = "none",
    role: str = "default",
) -> dict[str, str]:
    """The variables for local rank ``local_rank`` of node ``node_rank``.

    Global rank is ``node_rank * nproc_per_node + local_rank`` and the world
    size ``nnodes * nproc_per_node`` (every node runs the same number of ranks,
    as with torchrun's static rendezvous). ``role`` is torchrun's ``--role``
    (``ROLE_NAME``); with one role per job, the role's ranks are the job's.
    """
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    if nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be in [0, {nnodes}), got {node_rank}")
    if not 0 <= local_rank < nproc_per_node:
        raise ValueError(f"local_rank must be in [0, {nproc_per_node}), got {local_rank}")
    if not 0 <= master_port <= 65535:
        raise ValueError(f"master_port must be in [0, 65535], got {master_port}")
    if restart_count < 0 or max_restarts < 0:
        raise ValueError("restart_count and max_restarts must be >= 0")
    if not role:
        raise ValueError("role must not be empty")
    world_size = nnodes * nproc_per_node
    rank = node_rank * nproc_per_node + local_rank
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(node_rank),
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(nproc_per_node),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": role,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "AIODIST_RESTART_COUNT": str(restart_count),
        "AIODIST_MAX_RESTARTS": str(max_restarts),
        "AIODIST_RUN_ID": run_id,
    }


def merged_env(base: Mapping[str, str], rank_vars: Mapping[str, str], *, nproc_per_node: int) -> dict[str, str]:
    """``base`` (usually the launcher's own environment) overlaid with ``rank_vars``.

    Also sets ``PYTHONUNBUFFERED=1`` so that a rank's output reaches the
    launcher line by line through its pipe, and, like torchrun, defaults
    ``OMP_NUM_THREADS`` to 1 when several ranks share the node (a value already
    in ``base`` is kept).
    """
    env = dict(base)
    env.update(rank_vars)
    env["PYTHONUNBUFFERED"] = "1"
    if nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
