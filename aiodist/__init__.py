"""aiodist: an asyncio-native distributed runtime.

A key-value store, rendezvous, process groups, every torch.distributed
collective and a launcher, all ``await``-able. See ``README.md`` and
``shared/API.md`` for the contract. The simulator lives in the ``sim`` package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import (
        abort,
        all_gather,
        all_gather_into_tensor,
        all_gather_object,
        all_reduce,
        all_to_all,
        all_to_all_single,
        barrier,
        broadcast,
        broadcast_object_list,
        destroy_process_group,
        finish_rank,
        gather,
        gather_object,
        get_backend,
        get_global_rank,
        get_group_rank,
        get_node_local_rank,
        get_process_group_ranks,
        get_rank,
        get_world_size,
        init_process_group,
        irecv,
        is_available,
        is_gloo_available,
        is_initialized,
        is_mpi_available,
        is_nccl_available,
        is_torchelastic_launched,
        isend,
        monitored_barrier,
        new_group,
        new_subgroups,
        new_subgroups_by_enumeration,
        recv,
        reduce,
        reduce_scatter,
        reduce_scatter_tensor,
        scatter,
        scatter_object_list,
        send,
        split_group,
    )
    from .operations import all_gather_coalesced, all_reduce_coalesced, recv_object_list, send_object_list
    from .arguments import Backend
    from .batch_p2p import P2POp, batch_isend_irecv
    from .group_member import GroupMember
    from .collectives.ops import ReduceOp, _make_nccl_premul_sum, reduce_op
    from .elastic import ElasticRendezvous, ElasticRound
    from .errors import (
        AbortedError,
        AiodistError,
        CollectiveMismatchError,
        CollectiveTimeoutError,
        ConnectionClosedError,
        ConnectionClosedLocally,
        ConnectionLost,
        EvictedError,
        FrameTooLargeError,
        GroupError,
        InvalidArrayError,
        InvalidRankError,
        LaunchError,
        LaunchTimeoutError,
        PeerFailureError,
        PeerRefusedError,
        RankFailedError,
        ProtocolError,
        RendezvousError,
        RendezvousTimeoutError,
        StoreConnectionLost,
        StoreConnectTimeoutError,
        StoreError,
        StoreRequestError,
        StoreTimeoutError,
        UnsupportedReduceOpError,
    )
    from .compute import compute
    from .eventloop import run
    from .group import ProcessGroup
    from .work import Work
    from .errors import UnawaitedOperationError
    from .unawaited import clear_unawaited, unawaited_operations
    from .mesh import DeviceMesh, init_device_mesh
    from .store import MemoryStore, PrefixStore, Store, StoreLimits, StoreServer, TCPStore
    from .net.shmseg import SharedMemoryError
    from .shared import empty, is_shared, shared_array, zeros

# Names are imported on first use (PEP 562): ``import aiodist`` stays cheap for
# what needs only a part of it (the launcher's bootstrap of every rank, the CLI).
_LAZY: dict[str, str] = {
    "AbortedError": "aiodist.errors",
    "Backend": "aiodist.arguments",
    "GroupMember": "aiodist.group_member",
    "P2POp": "aiodist.batch_p2p",
    "_make_nccl_premul_sum": "aiodist.collectives.ops",
    "all_gather_coalesced": "aiodist.api",
    "all_reduce_coalesced": "aiodist.api",
    "batch_isend_irecv": "aiodist.batch_p2p",
    "get_backend": "aiodist.api",
    "get_node_local_rank": "aiodist.api",
    "is_available": "aiodist.api",
    "is_gloo_available": "aiodist.api",
    "is_mpi_available": "aiodist.api",
    "is_nccl_available": "aiodist.api",
    "is_torchelastic_launched": "aiodist.api",
    "new_subgroups": "aiodist.api",
    "new_subgroups_by_enumeration": "aiodist.api",
    "recv_object_list": "aiodist.api",
    "reduce_op": "aiodist.collectives.ops",
    "send_object_list": "aiodist.api",
    "split_group": "aiodist.api",
    "AiodistError": "aiodist.errors",
    "CollectiveMismatchError": "aiodist.errors",
    "CollectiveTimeoutError": "aiodist.errors",
    "ConnectionClosedError": "aiodist.errors",
    "ConnectionClosedLocally": "aiodist.errors",
    "ConnectionLost": "aiodist.errors",
    "EvictedError": "aiodist.errors",
    "DeviceMesh": "aiodist.mesh",
    "ElasticRendezvous": "aiodist.elastic",
    "ElasticRound": "aiodist.elastic",
    "FrameTooLargeError": "aiodist.errors",
    "GroupError": "aiodist.errors",
    "InvalidArrayError": "aiodist.errors",
    "InvalidRankError": "aiodist.errors",
    "LaunchError": "aiodist.errors",
    "LaunchTimeoutError": "aiodist.errors",
    "MemoryStore": "aiodist.store",
    "PeerFailureError": "aiodist.errors",
    "PeerRefusedError": "aiodist.errors",
    "PrefixStore": "aiodist.store",
    "ProcessGroup": "aiodist.group",
    "ProtocolError": "aiodist.errors",
    "RankFailedError": "aiodist.errors",
    "ReduceOp": "aiodist.collectives.ops",
    "RendezvousError": "aiodist.errors",
    "RendezvousTimeoutError": "aiodist.errors",
    "Store": "aiodist.store",
    "StoreConnectTimeoutError": "aiodist.errors",
    "StoreConnectionLost": "aiodist.errors",
    "StoreError": "aiodist.errors",
    "StoreRequestError": "aiodist.errors",
    "StoreLimits": "aiodist.store",
    "StoreServer": "aiodist.store",
    "StoreTimeoutError": "aiodist.errors",
    "TCPStore": "aiodist.store",
    "UnawaitedOperationError": "aiodist.errors",
    "UnsupportedReduceOpError": "aiodist.errors",
    "Work": "aiodist.work",
    "abort": "aiodist.api",
    "all_gather": "aiodist.api",
    "all_gather_into_tensor": "aiodist.api",
    "all_gather_object": "aiodist.api",
    "all_reduce": "aiodist.api",
    "all_to_all": "aiodist.api",
    "all_to_all_single": "aiodist.api",
    "barrier": "aiodist.api",
    "broadcast": "aiodist.api",
    "broadcast_object_list": "aiodist.api",
    "clear_unawaited": "aiodist.unawaited",
    "compute": "aiodist.compute",
    "destroy_process_group": "aiodist.api",
    "finish_rank": "aiodist.api",
    "gather": "aiodist.api",
    "gather_object": "aiodist.api",
    "get_global_rank": "aiodist.api",
    "get_group_rank": "aiodist.api",
    "get_process_group_ranks": "aiodist.api",
    "get_rank": "aiodist.api",
    "get_world_size": "aiodist.api",
    "init_device_mesh": "aiodist.mesh",
    "init_process_group": "aiodist.api",
    "irecv": "aiodist.api",
    "is_initialized": "aiodist.api",
    "isend": "aiodist.api",
    "monitored_barrier": "aiodist.api",
    "new_group": "aiodist.api",
    "recv": "aiodist.api",
    "reduce": "aiodist.api",
    "reduce_scatter": "aiodist.api",
    "reduce_scatter_tensor": "aiodist.api",
    "run": "aiodist.eventloop",
    "scatter": "aiodist.api",
    "scatter_object_list": "aiodist.api",
    "send": "aiodist.api",
    "unawaited_operations": "aiodist.unawaited",
    "SharedMemoryError": "aiodist.net.shmseg",
    "empty": "aiodist.shared",
    "is_shared": "aiodist.shared",
    "shared_array": "aiodist.shared",
    "zeros": "aiodist.shared",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule: aiodist.api, aiodist.work, ...
            value: Any = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"


def spawn(fn: Any, world_size: int, args: tuple[Any, ...] = (), **kwargs: Any) -> Any:
    """Run ``fn(*args)`` in ``world_size`` processes with the launcher's environment.

    See :func:`aiodist.launch.spawn` for the options; imported lazily so that
    importing aiodist does not load the launcher.
    """
    from .launch import spawn as _spawn

    return _spawn(fn, world_size, args=args, **kwargs)


__all__ = [
    "AbortedError",
    "Backend",
    "GroupMember",
    "P2POp",
    "all_gather_coalesced",
    "all_reduce_coalesced",
    "batch_isend_irecv",
    "device_mesh",
    "get_backend",
    "get_node_local_rank",
    "group",
    "is_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "recv_object_list",
    "reduce_op",
    "send_object_list",
    "split_group",
    "ElasticRendezvous",
    "ElasticRound",
    "abort",
    "AiodistError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "ConnectionClosedError",
    "ConnectionClosedLocally",
    "ConnectionLost",
    "DeviceMesh",
    "EvictedError",
    "FrameTooLargeError",
    "GroupError",
    "InvalidArrayError",
    "InvalidRankError",
    "LaunchError",
    "LaunchTimeoutError",
    "MemoryStore",
    "PeerFailureError",
    "PeerRefusedError",
    "PrefixStore",
    "ProcessGroup",
    "ProtocolError",
    "RankFailedError",
    "ReduceOp",
    "RendezvousError",
    "RendezvousTimeoutError",
    "Store",
    "StoreConnectionLost",
    "StoreConnectTimeoutError",
    "StoreError",
    "StoreRequestError",
    "StoreLimits",
    "StoreServer",
    "StoreTimeoutError",
    "TCPStore",
    "UnawaitedOperationError",
    "UnsupportedReduceOpError",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "clear_unawaited",
    "compute",
    "destroy_process_group",
    "finish_rank",
    "gather",
    "gather_object",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "init_device_mesh",
    "init_process_group",
    "irecv",
    "is_initialized",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "run",
    "scatter",
    "scatter_object_list",
    "send",
    "spawn",
    "unawaited_operations",
    "SharedMemoryError",
    "empty",
    "is_shared",
    "shared_array",
    "zeros",
]
