"""Flow-pinned (Paris-style) UDP traceroute without raw sockets.

Every probe of one trace carries the same 5-tuple (source address and port, destination address
and port, UDP), so ECMP hashes all of them onto one path: the path the monitored flow takes. Only
the TTL grows. ICMP time-exceeded and unreachable errors come back through ``IP_RECVERR`` on the
socket's error queue (``MSG_ERRQUEUE``), which needs neither root nor a raw socket. For VXLAN
the underlay flow is the outer packet, so pin the trace with the outer UDP source port the
overlay flow hashes to.

Run as a module inside a namespace for a JSON trace on stdout::

    python -m skh.collect.trace --src 10.0.0.1 --dst 10.1.1.1 --sport 40002
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from skh.collect.traceroute import TraceHop, TraceResult
from skh.errors import ConfigError

__all__ = ["paris_trace", "main"]

IP_RECVERR = 11
SO_EE_ORIGIN_ICMP = 2
_ICMP_TIME_EXCEEDED = 11
_ICMP_UNREACH = 3
# struct sock_extended_err: errno, origin, type, code, pad, info, data; then the offender's
# sockaddr_in
_EE = struct.Struct("=IBBBBII")


@dataclass(frozen=True, slots=True)
class _Err:
    type: int
    code: int
    offender: str | None


def _parse_recverr(ancdata: Sequence[tuple[int, int, bytes]]) -> _Err | None:
    for level, typ, data in ancdata:
        if level == socket.IPPROTO_IP and typ == IP_RECVERR and len(data) >= _EE.size:
            _errno, origin, etype, ecode, _pad, _info, _data = _EE.unpack_from(data)
            if origin != SO_EE_ORIGIN_ICMP:
                return None
            off = socket.inet_ntoa(data[20:24]) if len(data) >= 24 else None
            return _Err(etype, ecode, off)
    return None


def paris_trace(
    dst: str,
    *,
    src: str = "0.0.0.0",
    sport: int = 40000,
    dport: int = 33434,
    max_ttl: int = 16,
    timeout_s: float = 1.0,
    payload: bytes = b"skh-trace",
) -> TraceResult:
    """Trace ``dst`` with a fixed 5-tuple; one probe per TTL, stop at the destination or max_ttl.

    The destination answers with port-unreachable (nothing listens on ``dport``) or with a UDP
    reply (an echo responder); either ends the trace with ``reached=True``. A silent hop is
    recorded as ``addr=None``.
    """
    if not 1 <= max_ttl <= 64:
        raise ConfigError(
            f"The 'max_ttl' parameter of paris_trace must be in [1, 64]. Got {max_ttl!r} instead."
        )
    if not 0 < sport < 65536 or not 0 < dport < 65536:
        raise ConfigError(
            f"The 'sport'/'dport' parameters of paris_trace must be ports. Got {sport!r}/{dport!r}."
        )
    hops: list[TraceHop] = []
    reached = False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        s.setblocking(False)
        s.bind((src, sport))
        for ttl in range(1, max_ttl + 1):
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            t0 = time.perf_counter()
            try:
                s.sendto(payload, (dst, dport))
            except OSError:
                # a local error (no route) is itself the answer: the first hop is missing
                hops.append(TraceHop(ttl, None, (), "sendfail"))
                break
            hop = _await_hop(s, ttl, t0, timeout_s)
            hops.append(hop)
            if hop.icmp in ("reply", "unreachable") and hop.addr == dst:
                reached = True
                break
            if hop.icmp == "unreachable":
                break  # a router said no: nothing beyond it will answer
    return TraceResult(dst=dst, hops=tuple(hops), reached=reached)


def _await_hop(s: socket.socket, ttl: int, t0: float, timeout_s: float) -> TraceHop:
    while True:
        left = timeout_s - (time.perf_counter() - t0)
        if left <= 0:
            return TraceHop(ttl, None)
        r, _, x = select.select([s], [], [s], left)
        if not r and not x:
            continue
        try:
            _data, anc, _flags, _addr = s.recvmsg(512, 512, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            try:  # a real UDP answer from an echo responder at the destination
                _data, addr = s.recvfrom(512)
            except (BlockingIOError, ConnectionRefusedError):
                continue
            return TraceHop(ttl, addr[0], (round((time.perf_counter() - t0) * 1e3, 3),), "reply")
        err = _parse_recverr(anc)
        if err is None:
            continue
        rtt_ms = (round((time.perf_counter() - t0) * 1e3, 3),)
        if err.type == _ICMP_TIME_EXCEEDED:
            return TraceHop(ttl, err.offender, rtt_ms, "time-exceeded")
        if err.type == _ICMP_UNREACH:
            return TraceHop(ttl, err.offender, rtt_ms, "unreachable", err.code)
        return TraceHop(ttl, err.offender, rtt_ms, f"icmp-{err.type}", err.code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m skh.collect.trace", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--dst", required=True)
    ap.add_argument("--src", default="0.0.0.0")
    ap.add_argument("--sport", type=int, default=40000)
    ap.add_argument("--dport", type=int, default=33434)
    ap.add_argument("--max-ttl", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=1.0, help="seconds to wait per hop")
    a = ap.parse_args(argv)
    res = paris_trace(
        a.dst, src=a.src, sport=a.sport, dport=a.dport, max_ttl=a.max_ttl, timeout_s=a.timeout
    )
    print(
        json.dumps({"dst": res.dst, "reached": res.reached, "hops": [asdict(h) for h in res.hops]})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
