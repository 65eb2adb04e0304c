"""Userspace delay relay: the testbed's stand-in for a flow that fell off the RNIC's fast path.

The fault injector redirects the selected frames (tc clsact egress filter, ``mirred egress
redirect``) from the slow device into one end of a private veth pair; this process reads them
from the other end (``--in``) with an AF_PACKET socket, holds each for ``delay ± jitter`` and
sends it out of ``--out`` with ``PACKET_QDISC_BYPASS``, which skips ``--out``'s tc egress hook so
the frame is not redirected a second time. The injector owns the veth pair and the filter; this
process only moves frames, so killing it at any moment leaves nothing to undo but what the
injector removes anyway.

Run inside the namespace of both devices: ``python -m skh.testbed.relay --in DEV --out DEV
--delay-ms D [--jitter-ms J]``. Prints ``ready`` once it receives.
"""

from __future__ import annotations

import argparse
import heapq
import random
import select
import signal
import socket
import sys
import time

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_QDISC_BYPASS = 20
_PACKET_OUTGOING = 4


def relay(dev_in: str, dev_out: str, delay_s: float, jitter_s: float) -> None:
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind((dev_in, _ETH_P_ALL))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    tx.setsockopt(_SOL_PACKET, _PACKET_QDISC_BYPASS, 1)
    tx.bind((dev_out, 0))
    heap: list[tuple[float, int, bytes]] = []
    seq = 0
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            frame = heapq.heappop(heap)[2]
            try:
                tx.send(frame)
            except OSError:
                pass  # the out device is down (a concurrent link fault): the frame is lost
        timeout = max(0.0, heap[0][0] - time.monotonic()) if heap else None
        ready, _, _ = select.select([rx], [], [], timeout)
        if not ready:
            continue
        while True:
            try:
                frame, addr = rx.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] == _PACKET_OUTGOING:
                continue
            seq += 1
            due = (
                time.monotonic()
                + delay_s
                + (random.uniform(-jitter_s, jitter_s) if jitter_s else 0.0)
            )
            heapq.heappush(heap, (due, seq, frame))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m skh.testbed.relay", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--in", dest="dev_in", required=True)
    ap.add_argument("--out", dest="dev_out", required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    a = ap.parse_args(argv)
    if a.delay_ms < 0 or a.jitter_ms < 0 or a.jitter_ms > a.delay_ms:
        ap.error("need 0 <= jitter-ms <= delay-ms")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    relay(a.dev_in, a.dev_out, a.delay_ms / 1e3, a.jitter_ms / 1e3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
