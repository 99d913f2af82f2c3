"""``aiodist store serve``: run a standalone store server until Ctrl-C or SIGTERM.

Clients must prove the secret: by default the one the environment gives
(``AIODIST_SECRET``, ``AIODIST_SECRET_FILE``, else the user's own secret
file, see :func:`aiodist.auth.resolve_secret`), or the one in
``--secret-file`` (which must not be readable by other users);
``--insecure`` switches authentication off.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from .. import auth, tls
from .limits import StoreLimits, parse_size
from .server import StoreServer


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
    security = serve.add_mutually_exclusive_group()
    security.add_argument("--secret-file", metavar="PATH",
                          help="the secret clients must prove (a file readable by its owner only); "
                               "default: AIODIST_SECRET / AIODIST_SECRET_FILE / the user's own secret file")
    security.add_argument("--insecure", action="store_true",
                          help="no authentication: any process that reaches the port may read and change "
                               "every key (debugging only)")
    serve.add_argument("--tls-cert", metavar="PATH", help="serve over mutual TLS: this server's certificate "
                                                          "(with --tls-key and --tls-ca, the CA clients' certificates must have)")
    serve.add_argument("--tls-key", metavar="PATH", help="the server's private key")
    serve.add_argument("--tls-ca", metavar="PATH", help="the CA certificate clients must be signed by")
    d = StoreLimits()
    size = _size_arg
    serve.add_argument("--max-value-bytes", type=size, default=d.max_value_bytes, metavar="SIZE",
                       help=f"largest value a client may store; bigger requests are refused (default: {d.max_value_bytes})")
    serve.add_argument("--max-key-bytes", type=size, default=d.max_key_bytes, metavar="SIZE",
                       help=f"longest key a client may use (default: {d.max_key_bytes})")
    serve.add_argument("--max-connections", type=int, default=d.max_connections, metavar="N",
                       help=f"connections open at once (default: {d.max_connections})")
    serve.add_argument("--max-handshakes", type=int, default=d.max_handshakes, metavar="N",
                       help=f"connections in their handshake at once (default: {d.max_handshakes})")
    serve.add_argument("--max-client-bytes", type=size, default=d.max_client_bytes, metavar="SIZE",
                       help="keys and values one connection may keep stored (default: 1G; 'none': no quota)")
    serve.add_argument("--max-total-bytes", type=size, default=d.max_total_bytes, metavar="SIZE",
                       help="keys and values stored in total (default: 4G; 'none': no quota)")
    serve.add_argument("--max-waiter-bytes", type=size, default=d.max_waiter_bytes, metavar="SIZE",
                       help="keys of the blocked requests (get, wait, multi_get, queue_pop) one connection may keep "
                            "waiting, plus 64 bytes a key and 512 a request (default: 64M; 'none': no limit)")
    serve.add_argument("--max-outbox-bytes", type=size, default=d.max_outbox_bytes, metavar="SIZE",
                       help="replies waiting for one client before it is cut off (default: twice the frame limit)")
    serve.add_argument("--send-timeout", type=float, default=d.send_timeout, metavar="SECONDS",
                       help=f"how long a client may leave its replies unread (default: {d.send_timeout:g}; 0 disables)")
    serve.add_argument("--idle-timeout", type=float, default=d.idle_timeout, metavar="SECONDS",
                       help=f"close a client connection silent this long; 0 disables (default: {d.idle_timeout:g})")
    serve.add_argument("--handshake-timeout", type=float, default=d.handshake_timeout, metavar="SECONDS",
                       help=f"drop a new connection that has not completed its handshake, authentication "
                            f"included, in this time (default: {d.handshake_timeout:g})")
    serve.set_defaults(func=serve_main)
    store.set_defaults(func=lambda args: (store.print_help(), 2)[1])


def _size_arg(raw: str) -> int | None:
    try:
        return parse_size(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
        secret: Any = auth.FROM_ENVIRONMENT
        if args.insecure:
            secret = None
        elif args.secret_file:
            secret = auth.read_secret_file(args.secret_file)
        ssl = tls.from_environment(
            {tls.CERT_ENV: args.tls_cert or "", tls.KEY_ENV: args.tls_key or "", tls.CA_ENV: args.tls_ca or ""}
        )
        limits = StoreLimits(
            max_connections=args.max_connections,
            max_handshakes=args.max_handshakes,
            max_key_bytes=args.max_key_bytes,
            max_value_bytes=args.max_value_bytes,
            max_client_bytes=args.max_client_bytes,
            max_total_bytes=args.max_total_bytes,
            max_waiter_bytes=args.max_waiter_bytes,
            max_outbox_bytes=args.max_outbox_bytes,
            send_timeout=args.send_timeout or None,
            idle_timeout=args.idle_timeout or None,
            handshake_timeout=args.handshake_timeout,
        )
    except (ValueError, TypeError, OSError) as e:  # (SecretFileError; a TLS file that cannot be loaded)
        print(f"aiodist store: error: {e}", file=sys.stderr)
        return 2
    try:
        server = await StoreServer.start(args.host, args.port, secret=secret, ssl=ssl, limits=limits)
    except auth.SecretFileError as e:
        print(f"aiodist store: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(f"aiodist store: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    print(f"aiodist store: listening on {server.host}:{server.port}", flush=True)
    if not server.authenticated:
        print("aiodist store: WARNING: no authentication (--insecure): anyone who reaches the port can read "
              "and change every key", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
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
