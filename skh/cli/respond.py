"""``skh respond``: answer skh probes (the responder half of an engine, with no targets)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from skh.cli.probe import add_class_options, class_of_service
from skh.probe import DEFAULT_PORT, Engine

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    done = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        done.set()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Engine(
            bind=args.bind,
            port=args.port,
            transport=args.transport,
            device=args.device,
            gid_index=args.gid_index,
            **class_of_service(args),
        ) as engine:
            addr = engine.local_address()
            where = (
                f"{addr['ip']}:{addr['port']}" if "ip" in addr else f"{addr['gid']}/{addr['qpn']}"
            )
            print(
                f"skh respond: answering on {where} ({args.transport}, "
                f"{'kernel' if engine.kernel_timestamps else 'user'} stamps, "
                f"session {engine.session:#010x})",
                file=sys.stderr,
                flush=True,
            )
            deadline = time.monotonic() + args.duration if args.duration else None
            while True:
                timeout = args.stats_interval or 3600.0
                if deadline is not None:
                    timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0 or done.wait(timeout):
                    break
                if args.stats_interval:
                    log.info("responder stats %s", engine.stats().as_dict())
            stats = engine.stats()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    keys = (
        "received",
        "probes_received",
        "replies_sent",
        "reply_errors",
        "replies_user_stamps",
        "drops",
    )
    summary = {k: getattr(stats, k) for k in keys} | {"engine": stats.as_dict()}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"skh respond: {stats.probes_received} probes answered "
            f"with {stats.replies_sent} replies, "
            f"{stats.drops} garbage datagrams dropped",
            file=sys.stderr,
        )
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "respond",
        help="answer skh probes",
        description="Run a responder: answers every valid probe with two replies (ACK1 at once, "
        "ACK2 "
        "with its kernel receive/send stamps). Never sends more bytes than it receives.",
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"UDP port (default {DEFAULT_PORT}; 0 = any)"
    )
    p.add_argument(
        "--bind", default="0.0.0.0", help="local address (default 0.0.0.0; '::' for IPv6 too)"
    )
    p.add_argument("--transport", choices=("udp", "verbs"), default="udp")
    p.add_argument("--device", default=None, help="RDMA device or its netdev (verbs)")
    p.add_argument(
        "--gid-index",
        type=int,
        default=None,
        help="GID table index (verbs; default: the RoCE v2 GID of the bind address family)",
    )
    add_class_options(p)
    p.add_argument("--duration", type=float, default=None, help="exit after this many seconds")
    p.add_argument(
        "--stats-interval", type=float, default=None, help="log counters every N seconds (-v)"
    )
    p.add_argument("--json", action="store_true", help="print the final counters as JSON on stdout")
    p.set_defaults(func=run)
