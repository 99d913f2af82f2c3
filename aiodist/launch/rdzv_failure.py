"""What the elastic agent says when the rendezvous itself fails (no round with this node, the store gone).

These end ``aiodist run`` with one paragraph (what happened, whose fault, what to do), as a
:class:`~aiodist.errors.LaunchError`, not a traceback: they are not bugs but a job started wrongly or
a node arriving too late.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import AiodistError, LaunchError, RendezvousTimeoutError, StoreConnectionLost, StoreConnectTimeoutError
from .round_watch import HOST_FINISHED

__all__ = ["rendezvous_errors", "rendezvous_failure"]


@contextlib.contextmanager
def rendezvous_errors(*, where: str, nnodes: str, rdzv_timeout: float) -> Iterator[None]:
    """Turn an error of the rendezvous (its store's included) into :func:`rendezvous_failure`'s LaunchError."""
    try:
        yield
    except LaunchError:
        raise
    except (AiodistError, OSError, TimeoutError) as exc:
        raise rendezvous_failure(exc, where=where, nnodes=nnodes, rdzv_timeout=rdzv_timeout) from exc


def rendezvous_failure(exc: BaseException, *, where: str, nnodes: str, rdzv_timeout: float) -> LaunchError:
    """The error that ends this agent after ``exc``, raised while it joined a round at ``where`` (host:port)."""
    same = (f"every node must be started with the same --nnodes {nnodes}, --master-addr/--master-port "
            f"(or --rdzv-endpoint) and --rdzv-id")
    if isinstance(exc, RendezvousTimeoutError):
        return LaunchError(
            f"no complete round formed with this node at the elastic rendezvous {where} within --rdzv-timeout "
            f"{rdzv_timeout:g}s: too few nodes joined, or this node came after the round had formed and no new "
            f"one opened [{exc}]. Start the other nodes within --rdzv-timeout of this one ({same}), or give a "
            f"longer --rdzv-timeout.")
    if isinstance(exc, StoreConnectionLost) and HOST_FINISHED in str(exc):
        return LaunchError(
            f"the job finished on the other nodes without this node: the node hosting the elastic rendezvous "
            f"store at {where} (the first one started) finished and closed it while this node waited to join a "
            f"round. A node that arrives after a round formed waits for the next round, which only a failure "
            f"opens: start every node of a job before its round forms (within --rdzv-last-call).")
    if isinstance(exc, StoreConnectionLost):
        return LaunchError(
            f"lost the elastic rendezvous store at {where} while joining a round ({exc}): the node hosting it "
            f"(the first one started) left or failed, and no round can be formed without it. See that node's "
            f"output; the job must be started again, that node first.")
    if isinstance(exc, (StoreConnectTimeoutError, ConnectionRefusedError)):
        return LaunchError(
            f"cannot reach the elastic rendezvous store at {where} ({exc}): the first node started hosts it. "
            f"Check --master-addr/--master-port (or --rdzv-endpoint) and that the address is reachable from "
            f"this host; {same}.")
    return LaunchError(
        f"the elastic rendezvous at {where} failed: {type(exc).__name__}: {exc}. Check that {same} (and the same "
        f"secret), then start the job again.")
