"""What every skh daemon shares: SIGTERM/SIGINT handling, socket set-up with high-water marks and
a message-size cap, bind addresses that may ask for an ephemeral port (``tcp://127.0.0.1:0``), and
a client socket that tries again after its key was refused (:class:`RetryRefused`), and the
poll timeout of a loop that sleeps until its next timer (:func:`poll_ms`)."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import struct
import threading
from collections.abc import Callable

import zmq

__all__ = ["install_stop_signals", "make_socket", "bind", "poll_ms", "RetryRefused"]

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


def poll_ms(wait_s: float) -> int:
    """A zmq poll timeout (ms) that sleeps at least ``wait_s``: rounded up, never down.

    Rounded to the nearest ms, a wait of 700.4 ms woke the loop 0.4 ms before its timer, and the
    rest, 0.4 ms, rounded to a zero timeout: the loop polled without sleeping, turn after turn,
    until the timer fell due (a loaded CI run caught an idle agent taking a dozen turns in
    0.15 ms; a wait that is always 0.4 ms took 42,000 turns in half a second)."""
    return math.ceil(max(wait_s, 0.0) * 1000)


class RetryRefused:
    """Connect ``sock`` to ``address`` afresh every ``retry_s`` while the server refuses its key.

    libzmq never reconnects a socket whose CURVE handshake the server's ZAP handler refused
    (zeromq/libzmq#2329; pyzmq's bundled 4.3.5 does the same): the connection is gone for good.
    A key the server does not know *yet* is routine — a sidecar enrols its key with the
    controller and connects to the analyzer before the analyzer's key mirror (a 0.5 s poll) has
    seen it, and after an analyzer restart every enrolled key is unknown until its first poll —
    so without this an agent's results would have nowhere to go until it restarts. A key refused
    for good (revoked) costs one handshake per ``retry_s``. Call :meth:`tick` from the owner's
    loop (the monitor socket is not thread-safe either)."""

    def __init__(self, sock: zmq.Socket, address: str, *, retry_s: float = 1.0) -> None:
        self.sock, self.address, self.retry_s = sock, address, retry_s
        self.refusals = 0
        self._retry_at: float | None = None
        self._mon = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )

    @property
    def monitor(self) -> zmq.Socket:
        """The handshake monitor, for the owner's poller: an event wakes its loop."""
        return self._mon

    def due(self) -> float:
        """When :meth:`tick` next has a reconnect to make (monotonic s; infinity: none)."""
        return float("inf") if self._retry_at is None else self._retry_at

    def tick(self, now: float) -> None:
        while self._mon.poll(0):
            # a monitor event's first frame: u16 event id, u32 value (zmq_socket_monitor);
            # decoded here because zmq.utils.monitor imports asyncio into every agent
            event = struct.unpack("=hi", self._mon.recv_multipart()[0][:6])[0]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._retry_at = None
            elif self._retry_at is None:
                self.refusals += 1
                if self.refusals == 1 or self.refusals % 60 == 0:
                    log.warning(
                        "%s refused this client's key (%d times so far); trying again every %g s",
                        self.address,
                        self.refusals,
                        self.retry_s,
                    )
                self._retry_at = now + self.retry_s
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            with contextlib.suppress(zmq.ZMQError):  # no such endpoint left: connect alone
                self.sock.disconnect(self.address)
            self.sock.connect(self.address)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self._mon.close(0)
