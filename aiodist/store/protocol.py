"""The store's messages over aiodist frames (see :mod:`aiodist.wire`).

Pure: builds and checks frame headers, no I/O.

Handshake: four frames, which carry the mutual authentication of
:mod:`aiodist.auth` (purpose ``"store"``; the fields ``nonce``/``proof`` are
absent on a side that runs without a secret)::

    client: {"op": "hello", "proto": "aiodist-store", "v": 2, "nonce": Nc}
    server: {"op": "challenge", "nonce": Ns, "proof": P_server}
    client: {"op": "answer", "proof": P_client}
    server: {"op": "hello", "proto": "aiodist-store", "v": 2,
             "idle": <seconds or None>, "max_key": <bytes>, "max_value": <bytes>}

The client refuses a server that cannot prove the secret; the server answers a
client that cannot with ``{"op": "error", "err": "refused", "msg":
"authentication failed"}`` and closes: a refusal says nothing about the
job, its keys or why. Until the client has proved itself, the server takes
frames of at most a few KiB (and so does the client until the server has).
A wrong handshake is answered with ``{"op": "error", "err":
"bad_handshake", "msg": ...}``, a server at its connection limit with
``{"op": "error", "err": "busy", ...}`` (the client retries), and closed.

Requests carry ``"op"``, a client-chosen request id ``"id"`` (an int; many may
be in flight on one connection) and per-op fields: ``"k"`` a key, ``"ks"`` a
list of keys, ``"n"`` an integer amount, ``"t"`` a timeout in seconds for
blocking ops (``None``: wait forever). Byte values travel either in the header
as ``"v"`` (a list of bin) when small, or concatenated in the frame payload
with their lengths in ``"l"`` when large (headers are limited in size).

Replies carry ``"id"`` and one of: ``"r"`` a scalar result (int, bool, nil),
``"v"``/``"l"`` byte value(s) as above, or ``"err"`` (code), ``"msg"`` and
optionally ``"key"`` for a refused request. Replies may come in any order.

Control messages (no ``"id"``): ``{"op": "cancel", "c": id}`` withdraws a
waiting request and is acknowledged by ``{"op": "cancelled", "c": id}``, which
the server sends after any reply it already owed for ``id`` (so a client knows
when a reply that crossed its cancel can no longer come); ``{"op": "unpop",
"k": key, "v": [value]}`` puts a popped queue value back at the head of its
queue (its caller was cancelled before it got it; no reply; checked like
``queue_push``: a key or value over its limit closes the connection as a bad
request, a value over a quota is dropped and logged); ``{"op": "ping"}``
is answered by ``{"op": "pong"}`` and keeps an idle connection alive. A server
that closes for a reason says it first: ``{"op": "error", "err": "closing",
"msg": why}`` (e.g. that its host left the job after a failure, then with
``"h"``: the host's rank, ``"r"``: the rank whose failure it was, ``"w"``: how
it failed); the client puts it in the error of every call the close then fails
(and those fields in its attributes: see ``StoreConnectionLost``).

Size limits: a frame header is at most 1 MiB (see :mod:`aiodist.wire`), so
keys (at most 8 KiB each by default) of one request must fit in it; the
server's frame limit admits two values of the maximum size plus a header.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from ..errors import StoreRequestError
from ..shown import brief

PROTO: Final = "aiodist-store"
VERSION: Final = 2

HEADER_VALUES_LIMIT: Final = 32 * 1024
"""Byte values whose total size is at most this travel inside the header."""

# ops that block (carry a timeout "t")
BLOCKING_OPS: Final = ("get", "wait", "multi_get", "queue_pop")

# error codes used by the protocol layer (the state machine has its own)
BAD_HANDSHAKE: Final = "bad_handshake"
REFUSED: Final = "refused"  # authentication failed (says nothing more, on purpose)
BUSY: Final = "busy"  # the server is at its connection limit: retry later
BAD_REQUEST: Final = "bad_request"
UNKNOWN_OP: Final = "unknown_op"
TIMEOUT: Final = "timeout"


class BadMessage(Exception):
    """A message violates the protocol (wrong type, missing field, unknown op).

    ``request`` is the request id when it could be read (so the peer can be
    answered), ``code`` a protocol error code.
    """

    def __init__(self, message: str, *, code: str = BAD_REQUEST, request: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request = request


AUTH_PURPOSE: Final = "store"
AUTH_BINDING: Final = f"{PROTO}/{VERSION}".encode()
"""What both ends bind their proofs to. Not the address: clients may reach a store through
forwarded ports and other names; a lured client is defeated by the proofs themselves (see README)."""


def hello(auth: dict[str, Any] | None = None) -> dict[str, Any]:
    """The client's first frame (``auth``: the :class:`aiodist.auth.Dialer`'s hello fields)."""
    return {"op": "hello", "proto": PROTO, "v": VERSION, **(auth or {})}


def challenge(auth: dict[str, Any]) -> dict[str, Any]:
    """The server's answer to a good hello (``auth``: the :class:`aiodist.auth.Acceptor`'s challenge fields)."""
    return {"op": "challenge", **auth}


def answer(auth: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to the challenge."""
    return {"op": "answer", **auth}


def refusal() -> dict[str, Any]:
    """The one refusal of a client that did not authenticate: nothing in it tells it anything."""
    return error_frame(REFUSED, "authentication failed")


def busy() -> dict[str, Any]:
    return error_frame(BUSY, "the store server is at its connection limit; try again later")


def hello_reply(*, idle: float | None, max_key: int, max_value: int) -> dict[str, Any]:
    """The server's answer to a good handshake."""
    return {"op": "hello", "proto": PROTO, "v": VERSION, "idle": idle, "max_key": max_key, "max_value": max_value}


def check_hello(header: dict[str, Any]) -> None:
    """Raise :class:`BadMessage` unless ``header`` is a handshake of this protocol version."""
    if header.get("op") != "hello" or header.get("proto") != PROTO:
        raise BadMessage(f"expected a store handshake, got a frame with op {brief(header.get('op'))}", code=BAD_HANDSHAKE)
    if header.get("v") != VERSION:
        raise BadMessage(f"store protocol version {brief(header.get('v'))} is not supported (this side speaks {VERSION})", code=BAD_HANDSHAKE)


def error_frame(
    code: str,
    message: str,
    *,
    request: int | None = None,
    key: str | None = None,
    limit: str | None = None,
    maximum: int | None = None,
    culprit: int | None = None,
    host: int | None = None,
    cause: str | None = None,
    missing: list[str] | None = None,
) -> dict[str, Any]:
    """A refusal: answering request ``request`` or, without one, the connection as a whole.

    ``limit``/``maximum``: the server limit that refused it and its value (fields ``limit``, ``max``);
    ``missing``: a timeout's keys that did not exist (several keys asked for; at most 8 given).
    A closing notice's ``host`` (field ``h``): the rank hosting the store, which leaves the job after the
    failure of rank ``culprit`` (``r``; None: unknown), described as ``cause`` (``w``).
    """
    h: dict[str, Any] = {"err": code, "msg": message}
    if request is not None:
        h["id"] = request
    else:
        h["op"] = "error"
    if key is not None:
        h["key"] = key
    if missing is not None:
        h["missing"] = missing
    if limit is not None:
        h["limit"] = limit
        h["max"] = maximum
    if host is not None:
        h["h"] = host
        if culprit is not None:
            h["r"] = culprit
        if cause is not None:
            h["w"] = cause
    return h


# ------------------------------------------------------------------ byte values


def pack_values(header: dict[str, Any], values: Sequence[bytes]) -> bytes | None:
    """Put ``values`` into ``header`` (small) or return them as the payload (large)."""
    total = 0
    for v in values:
        total += len(v)
    if total <= HEADER_VALUES_LIMIT:
        header["v"] = values if isinstance(values, list) else list(values)
        return None
    header["l"] = [len(v) for v in values]
    return values[0] if len(values) == 1 else b"".join(values)


def unpack_values(header: dict[str, Any], payload: memoryview | None) -> list[bytes]:
    """The byte values of a message (inverse of :func:`pack_values`); BadMessage if malformed."""
    vs = header.get("v")
    if vs is not None:
        if type(vs) is not list:
            raise BadMessage("field 'v' must be a list of bytes", request=_rid(header))
        for v in vs:
            if type(v) is not bytes:
                raise BadMessage("field 'v' must be a list of bytes", request=_rid(header))
        return vs
    lens = header.get("l")
    if type(lens) is not list:
        raise BadMessage("message carries no values ('v' or 'l')", request=_rid(header))
    size = payload.nbytes if payload is not None else 0
    out: list[bytes] = []
    pos = 0
    for n in lens:
        if type(n) is not int or n < 0 or pos + n > size:
            raise BadMessage("field 'l' does not match the payload", request=_rid(header))
        out.append(bytes(payload[pos : pos + n]) if payload is not None else b"")
        pos += n
    if pos != size:
        raise BadMessage("field 'l' does not match the payload", request=_rid(header))
    return out


def _rid(header: dict[str, Any]) -> int | None:
    rid = header.get("id")
    return rid if type(rid) is int else None


# ------------------------------------------------------------------ field access (server side)


def field_key(header: dict[str, Any]) -> str:
    key = header.get("k")
    if type(key) is not str:
        raise BadMessage(f"field 'k' (key) must be a string, got {type(key).__name__}", request=_rid(header))
    return key


def field_keys(header: dict[str, Any]) -> list[str]:
    keys = header.get("ks")
    if type(keys) is not list:
        raise BadMessage(f"field 'ks' (keys) must be a list of strings, got {type(keys).__name__}", request=_rid(header))
    for key in keys:
        if type(key) is not str:
            raise BadMessage("field 'ks' (keys) must be a list of strings", request=_rid(header))
    return keys


def field_int(header: dict[str, Any]) -> int:
    n = header.get("n")
    if type(n) is not int:
        raise BadMessage(f"field 'n' (amount) must be an integer, got {type(n).__name__}", request=_rid(header))
    return n


def field_timeout(header: dict[str, Any]) -> float | None:
    t = header.get("t")
    if t is None:
        return None
    if type(t) not in (int, float) or not t >= 0 or t != t or t == float("inf"):
        raise BadMessage(f"field 't' (timeout) must be a non-negative number or nil, got {brief(t)}", request=_rid(header))
    return float(t)


def field_id(header: dict[str, Any]) -> int:
    rid = header.get("id")
    if type(rid) is not int:
        raise BadMessage(f"field 'id' (request id) must be an integer, got {type(rid).__name__}")
    return rid


# ------------------------------------------------------------------ replies (client side)


MAX_REPLY_TEXT: Final = 1000
"""Characters of a refusal's text (and code) kept in the exception raised for it."""


def reply_error(header: dict[str, Any], op: str) -> StoreRequestError:
    """The exception a refusal reply stands for."""
    code = str(header.get("err"))[:MAX_REPLY_TEXT]
    key = header.get("key")
    limit = header.get("limit")
    maximum = header.get("max")
    said = str(header.get("msg", code))
    if len(said) > MAX_REPLY_TEXT:  # (what a server says goes into an exception: bounded)
        said = said[:MAX_REPLY_TEXT] + f"... ({len(said) - MAX_REPLY_TEXT} more characters)"
    return StoreRequestError(
        f"store refused {op}: {said}",
        code=code,
        op=op,
        key=key[:MAX_REPLY_TEXT] if isinstance(key, str) else None,
        limit=limit if isinstance(limit, str) else None,
        limit_value=maximum if type(maximum) is int else None,
    )
