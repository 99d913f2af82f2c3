"""Frame headers as the peer would see them after a msgpack round trip.

The simulator passes frames as objects (no encoding), but a header must come
out the way aiodist's wire codec (msgpack, ``use_bin_type=True``,
``raw=False``) would deliver it: tuples become lists, bytearrays/memoryviews
become bytes, int/float/str subclasses become the base type, anything else is
refused with the same TypeError the real sender raises. So code that works in
the simulator does not break on TCP over a tuple-vs-list difference.
"""

from __future__ import annotations

from typing import Any

from aiodist.net.base import Header

_SCALARS = (int, float, str, bool, type(None), bytes)


def _wire_value(v: Any) -> Any:
    """``v`` as msgpack (use_bin_type, raw=False, use_list=True) would give it back."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is tuple or t is list:
        out = list(v)
        for i, x in enumerate(out):
            if type(x) not in _SCALARS:
                out[i] = _wire_value(x)
        return out
    if t is dict:
        return {(k if type(k) in _SCALARS else _wire_key(k)): (x if type(x) in _SCALARS else _wire_value(x))
                for k, x in v.items()}
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (list, tuple)):
        return [_wire_value(x) for x in v]
    if isinstance(v, dict):
        return {_wire_key(k): _wire_value(x) for k, x in v.items()}
    raise TypeError(f"frame header is not serializable: can not serialize {type(v).__name__!r} object")


def _wire_key(k: Any) -> Any:
    # msgpack would decode an array key as a list and fail (unhashable); keep such keys as tuples.
    return tuple(_wire_value(k)) if isinstance(k, (tuple, list)) else _wire_value(k)


_SCALAR_TYPES = frozenset(_SCALARS)


def wire_header(header: Header) -> Header:
    """A fresh copy of ``header`` as the peer would decode it from msgpack.

    Fast path (every frame aiodist sends): copy the dict once, then replace
    in place the few values that change (tuples become lists), instead of
    building a second dict. Replacing the value of an existing key while
    iterating is safe: the dict does not change size.
    """
    if type(header) is not dict:
        raise TypeError("frame header must be a dict")
    scalars = _SCALAR_TYPES
    out = header.copy()
    for k, v in out.items():
        if type(k) not in scalars:
            return _wire_header_slow(header)  # keys change too: rebuild
        t = type(v)
        if t in scalars:
            continue
        if t is tuple or t is list:
            for x in v:
                if type(x) not in scalars:
                    out[k] = _wire_value(v)
                    break
            else:
                out[k] = list(v)
        else:
            out[k] = _wire_value(v)
    return out


def _wire_header_slow(header: Header) -> Header:
    return {(k if type(k) in _SCALAR_TYPES else _wire_key(k)): _wire_value(v) for k, v in header.items()}
