"""Trace arguments are JSON values: bytes in a traced header (a handshake's nonce and proof) are hex digits,
not Python's ``b'...'`` text (probe: a user's tools had to parse Python literals out of the trace)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiodist
import sim
from sim.trace import json_value, write_chrome


def test_bytes_are_hex_digits() -> None:
    assert json_value(b"\x01\xff") == {"hex": "01ff"}
    assert json_value({"nonce": bytearray(b"\x00"), "n": [1, 2.5, None]}) == {"nonce": {"hex": "00"}, "n": [1, 2.5, None]}


def test_handshake_nonces_in_a_trace_are_hex(tmp_path: Path) -> None:
    async def main() -> Any:
        await aiodist.init_process_group(timeout=5)
        await aiodist.barrier()
        await aiodist.destroy_process_group()

    res = sim.run(main, world_size=2, seed=0, trace=True)
    assert res.ok, res.summary()
    out = tmp_path / "t.json"
    write_chrome(res.trace, str(out), ops=res.ops)
    text = out.read_text()
    assert "b'" not in text and 'b\\"' not in text
    headers = [e["args"]["header"] for e in json.loads(text)["traceEvents"] if e.get("name") == "send"]
    nonces = [h["nonce"] for h in headers if isinstance(h, dict) and "nonce" in h]
    assert nonces and all(set(n) == {"hex"} and len(n["hex"]) == 64 for n in nonces)
