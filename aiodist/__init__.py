"""aiodist: an asyncio-native distributed runtime.

A key-value store, rendezvous, process groups, every torch.distributed
collective and a launcher, all ``await``-able. See ``README.md`` and
``shared/API.md`` for the contract. The simulator lives in the ``sim`` package.
"""

from __future__ import annotations

from typing import Any

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
    gather,
    gather_object,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    irecv,
    is_initialized,
    isend,
    monitored_barrier,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
)
from .collectives.ops import ReduceOp
from .elastic import ElasticRendezvous, ElasticRound
from .errors import (
    AbortedError,
    AiodistError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ConnectionClosedError,
    ConnectionClosedLocally,
    ConnectionLost,
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
    UnawaitedOperationError,
    UnsupportedReduceOpError,
)
from .eventloop import run
from .group import ProcessGroup, Work
from .mesh import DeviceMesh, init_device_mesh
from .store import MemoryStore, PrefixStore, Store, StoreServer, TCPStore
from .net.shmseg import SharedMemoryError
from .shared import empty, is_shared, shared_array, zeros

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
    "UnawaitedOperationError",
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
    "StoreServer",
    "StoreTimeoutError",
    "TCPStore",
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
    "destroy_process_group",
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
    "SharedMemoryError",
    "empty",
    "is_shared",
    "shared_array",
    "zeros",
]
