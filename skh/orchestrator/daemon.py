"""What every skh daemon shares: SIGTERM/SIGINT handling, socket set-up with high-water marks and
a message-size cap, and bind addresses that may ask for an ephemeral port (``tcp://127.0.0.1:0``)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

import zmq

__all__ = ["install_stop_signals", "make_socket", "bind"]

log = logging.getLogger(__name__)


def install_stop_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM and SIGINT set ``stop`` (the daemon finishes its loop iteration and exits cleanly).
    Returns a function restoring the previous handlers."""
    old = {}

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        old[sig] = signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return restore


def make_socket(
    ctx: zmq.Context, kind: int, *, hwm: int, linger_ms: int = 0, max_msg_bytes: int = -1
) -> zmq.Socket:
    """A socket with its high-water marks and linger set. ``max_msg_bytes`` (ZMQ_MAXMSGSIZE):
    a peer announcing a larger message is disconnected before anything is allocated for it."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    return sock


def bind(sock: zmq.Socket, address: str) -> str:
    """Bind and return the real endpoint; ``:0`` picks an ephemeral port (zmq spells it ``*``)."""
    if address.startswith("tcp://") and address.endswith(":0"):
        address = address[:-1] + "*"
    sock.bind(address)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
