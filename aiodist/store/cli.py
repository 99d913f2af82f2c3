"""``aiodist store serve``: run a standalone store server until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from .server import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, StoreServer
from .state import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES


def add_cli(subparsers: Any) -> None:
    """Add ``store serve`` to an argparse sub-parsers object (``func(args) -> int``)."""
    store = subparsers.add_parser("store", help="the key-value store (aiodist store serve --help)",
                                  description="The key-value store. Its one subcommand, serve, runs a store server.")
    sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    serve = sub.add_parser("serve", help="run a standalone store server",
                           description="Run a standalone store server (what rank 0 hosts in a job) until Ctrl-C "
                                       "or SIGTERM; ranks reach it with init_process_group(store=...) or "
                                       "TCPStore.connect(host, port).")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=29500, help="port (default: 29500; 0 picks a free one)")
    serve.add_argument("--max-value-bytes", type=int, default=DEFAULT_MAX_VALUE_BYTES, metavar="N",
                       help=f"largest value a client may store; bigger requests are refused "
                            f"(default: {DEFAULT_MAX_VALUE_BYTES})")
    serve.add_argument("--max-key-bytes", type=int, default=DEFAULT_MAX_KEY_BYTES, metavar="N",
                       help=f"longest key a client may use (default: {DEFAULT_MAX_KEY_BYTES})")
    serve.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT, metavar="SECONDS",
                       help=f"close a client connection silent this long; 0 disables (default: {DEFAULT_IDLE_TIMEOUT:g})")
    serve.add_argument("--handshake-timeout", type=float, default=DEFAULT_HANDSHAKE_TIMEOUT, metavar="SECONDS",
                       help=f"drop a new connection that has not completed its handshake in this time "
                            f"(default: {DEFAULT_HANDSHAKE_TIMEOUT:g})")
    serve.set_defaults(func=serve_main)
    store.set_defaults(func=lambda args: (store.print_help(), 2)[1])


def serve_main(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status."""
    from ..eventloop import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        return run(_serve(args))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 130


async def _serve(args: argparse.Namespace) -> int:
    try:
        server = await StoreServer.start(
            args.host,
            args.port,
            max_key_bytes=args.max_key_bytes,
            max_value_bytes=args.max_value_bytes,
            handshake_timeout=args.handshake_timeout,
            idle_timeout=args.idle_timeout or None,
        )
    except Exception as e:
        print(f"aiodist store: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    print(f"aiodist store: listening on {server.host}:{server.port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread / no signals here
            pass
    try:
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await server.close()
    print("aiodist store: stopped", flush=True)
    return 0
