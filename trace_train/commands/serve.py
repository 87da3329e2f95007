"""``trace serve``: TRACE environments over OpenEnv's HTTP and WebSocket API.

    trace serve                                  # every registered id, on 127.0.0.1:8000
    trace serve trace/tau_airline-v0 --port 9000 # only this id (also the default at reset)
    trace serve --registry ws/ --max-sessions 16 --idle-timeout 120 --token SECRET
    trace serve --ui                             # and the web playground at /ui
    trace serve --transcript full                # the whole transcript in every observation

A client opens ``ws://HOST:PORT/ws`` (one env per connection) and resets with an ``env_id`` and
a ``seed``; see docs/serve.md for each client (OpenEnv's EnvClient and MCPToolClient, a raw
WebSocket, JSON-RPC over ``POST /mcp``). ``--token`` (or TRACE_SERVE_TOKEN) makes every request
carry ``Authorization: Bearer <token>``. SIGINT/SIGTERM close every session's env (an SWE
session's container with it); after a SIGKILL, ``trace swe cleanup --only-dead`` removes what is left.
``trace serve --build-image`` builds the server's Docker image (no registry needed).
"""

from __future__ import annotations

import argparse
import os

from . import CommandError
from .rollout import REGISTRY_HELP, check_env_ids, load_registries


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve environments over OpenEnv's HTTP/WebSocket API",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env_ids", nargs="*", metavar="ID",
                   help="the ids a session may reset to (default: every registered id; one id is also the "
                        "default when a reset names none)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1; 0.0.0.0 exposes it to the network: set a token)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions (envs) at most (default: 64)")
    p.add_argument("--idle-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="close a session after this long without a message (default: 600; 0 = never)")
    p.add_argument("--max-message-bytes", type=int, default=4 * 1024 * 1024,
                   help="largest request or WebSocket message accepted (default: 4 MiB)")
    p.add_argument("--token", default=None,
                   help="require 'Authorization: Bearer TOKEN' on every request (default: $TRACE_SERVE_TOKEN)")
    p.add_argument("--ui", action="store_true", help="also serve the web playground at /ui")
    p.add_argument("--transcript", choices=["delta", "full"], default="delta",
                   help="what a step's observation carries of the transcript when the session's reset does not say: "
                        "'delta', the messages new this turn (default), or 'full', the whole transcript and the tool "
                        "schemas on every step (for clients that read them from each observation)")
    p.add_argument("--ws-compression", action="store_true",
                   help="offer permessage-deflate on WebSockets (saves bandwidth on slow links; costs server CPU)")
    p.add_argument("--build-image", action="store_true",
                   help="build the server's Docker image (Dockerfile at the repository root; no registry needed) "
                        "and print its tag, instead of serving")
    p.add_argument("--from-registry", metavar="IMAGE",
                   help="with --build-image: build the base from this registry image (e.g. python:3.11-slim)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=REGISTRY_HELP)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    if args.build_image:
        from trace_envs.adapters.serve_image import build_serve_image

        try:
            print(build_serve_image(from_registry=args.from_registry))
        except Exception as exc:  # no engine, no debootstrap: say what is missing
            raise CommandError(f"building the server image failed: {exc}") from exc
        return 0
    if args.max_sessions < 1:
        raise CommandError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if args.max_message_bytes < 1024:
        raise CommandError(f"--max-message-bytes must be at least 1024, got {args.max_message_bytes}")
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be in 0..65535, got {args.port}")
    trace_envs = load_registries(args.registry)
    check_env_ids(trace_envs, args.env_ids)
    try:
        from trace_envs.adapters.openenv_server import TOKEN_ENV_VAR, serve
    except ImportError as exc:
        raise CommandError(str(exc)) from exc
    token = args.token or os.environ.get(TOKEN_ENV_VAR) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        print(f"trace serve: warning: listening on {args.host} without a token; anyone who reaches it can run "
              "episodes (set --token or TRACE_SERVE_TOKEN)", flush=True)
    serve(args.env_ids, host=args.host, port=args.port, max_sessions=args.max_sessions,
          idle_timeout_s=args.idle_timeout or None, max_message_bytes=args.max_message_bytes, token=token,
          ui=args.ui, ws_compression=args.ws_compression, log_level=args.log_level, transcript=args.transcript)
    return 0
