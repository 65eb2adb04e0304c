"""Flow-pinned (Paris-style) UDP traceroute without raw sockets.

Every probe of one trace carries the same 5-tuple (source address and port, destination address
and port, UDP), so ECMP hashes all of them onto one path: the path the monitored flow takes. Only
the TTL grows. ICMP time-exceeded and unreachable errors come back through ``IP_RECVERR`` on the
socket's error queue (``MSG_ERRQUEUE``), which needs neither root nor a raw socket. For VXLAN
the underlay flow is the outer packet, so pin the trace with the outer UDP source port the
overlay flow hashes to.

All TTLs are sent at once and told apart by their payload, which an ICMP error quotes (RFC 1812
routers quote up to 576 bytes; the error queue hands back the quoted payload): a trace costs one
timeout however many hops stay silent, instead of one per silent hop, which is what a trace into
a dead link is made of. Where a hop quotes too little to tell which probe it answers, the trace
is taken again one TTL at a time.

Run as a module inside a namespace for a JSON trace on stdout::

    python -m skh.collect.trace --src 10.0.0.1 --dst 10.1.1.1 --sport 40002
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from skh.collect.traceroute import TraceHop, TraceResult
from skh.errors import ConfigError

__all__ = ["paris_trace", "vxlan_trace", "main"]

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
    all_at_once: bool = True,
    hops_needed: Callable[[], int | None] | None = None,
) -> TraceResult:
    """Trace ``dst`` with a fixed 5-tuple; one probe per TTL, up to the destination or max_ttl.

    The destination answers with port-unreachable (nothing listens on ``dport``) or with a UDP
    reply (an echo responder); either ends the trace with ``reached=True``. A silent hop is
    recorded as ``addr=None``. ``all_at_once``: every TTL in flight together, waiting
    ``timeout_s`` once (falls back to one TTL at a time, ``timeout_s`` each, when the answers
    cannot be told apart). ``hops_needed``: says, once it knows, that the destination is ``n``
    hops away and does not answer this trace: it stops as soon as hops ``1 .. n - 1`` answered
    instead of waiting out ``timeout_s`` for a silent last hop.
    """
    if not 1 <= max_ttl <= 64:
        raise ConfigError(
            f"The 'max_ttl' parameter of paris_trace must be in [1, 64]. Got {max_ttl!r} instead."
        )
    if not 0 <= sport < 65536 or not 0 < dport < 65536:
        raise ConfigError(
            f"The 'sport'/'dport' parameters of paris_trace must be ports (sport 0: any free"
            f" one). Got {sport!r}/{dport!r}."
        )
    if all_at_once:
        with _socket(src, sport) as s:
            res = _all_at_once(s, dst, dport, max_ttl, timeout_s, payload, hops_needed)
        if res is not None:
            return res
    with _socket(src, sport) as s:
        return _one_by_one(s, dst, dport, max_ttl, timeout_s, payload)


#: a VXLAN-pinned probe when nothing of the flow's inner headers is known: an 8-byte VXLAN header
#: with the I flag clear, which a receiving VTEP must drop (RFC 7348)
_VXLAN_SAFE = bytes(8)
_MARK = b"skh-trace"
#: plain traces that look for the destination: one hashed onto a path that is broken elsewhere
#: stays unanswered; with half of the paths broken all eight miss 1 time in 256 (the seven after
#: the first run together)
_CONFIRM_TRIES = 8


def vxlan_trace(
    dst: str,
    *,
    src: str,
    outer_sport: int,
    inner: bytes = b"",
    vxlan_port: int = 4789,
    max_ttl: int = 16,
    timeout_s: float = 1.0,
) -> TraceResult:
    """The underlay path of one VXLAN flow: every probe carries the flow's outer 5-tuple
    (``src``:``outer_sport`` -> ``dst``:``vxlan_port``, UDP), so ECMP hashes it where the flow's
    frames go, followed by ``inner``, the flow's own VXLAN and inner headers
    (:mod:`skh.collect.vxlan` learns both), so whatever looks deeper sees the flow too. The
    VXLAN header's I flag is cleared: the destination VTEP drops the probe instead of handing
    it to the peer's responder.

    The destination VTEP listens on ``vxlan_port`` and drops such probes silently, so the
    pinned trace alone never reaches it. Its last link is every flow's (the destination RNIC's
    one port), so plain traces from free source ports (up to eight, the seven after the first
    together and waiting a quarter as long: one may hash onto the broken path being looked for)
    say how far the destination is and whether it answers: when the pinned trace got answers up
    to the hop before it, the destination's answer completes it; otherwise it stopped where the
    flow stops.
    """
    # the first plain trace runs beside the pinned one, and once it reached the destination the
    # pinned one stops at the hop before it: nothing answers the pinned trace's last hop, so it
    # waited out its whole timeout (a demo round of 182 pinned traces took 8.4 s)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            paris_trace, dst, src=src, sport=0, max_ttl=max_ttl, timeout_s=timeout_s
        )

        def hops_needed() -> int | None:
            if not first.done() or first.exception() is not None or not first.result().reached:
                return None
            return len(first.result().hops)

        pinned = paris_trace(
            dst,
            src=src,
            sport=outer_sport,
            dport=vxlan_port,
            max_ttl=max_ttl,
            timeout_s=timeout_s,
            payload=(bytes([inner[0] & ~0x08]) + inner[1:] if inner else _VXLAN_SAFE) + _MARK,
            hops_needed=hops_needed,
        )
        plain = first.result()
    if not plain.reached:
        # the others at once: one after the other, a flow whose destination no trace reaches
        # (its access link down) took 1.75 s more each, and a link-down round of 61 such flows
        # 8.3 s in the demo
        with concurrent.futures.ThreadPoolExecutor(_CONFIRM_TRIES - 1) as pool:
            tries = [
                pool.submit(
                    paris_trace, dst, src=src, sport=0, max_ttl=max_ttl, timeout_s=timeout_s / 4
                )
                for _ in range(_CONFIRM_TRIES - 1)
            ]
            plain = next((r for f in tries if (r := f.result()).reached), plain)
    if not plain.reached:
        return pinned
    n = len(plain.hops)  # the destination answered at TTL n
    head = pinned.hops[: n - 1]
    if len(head) == n - 1 and (n == 1 or head[-1].addr is not None):
        return TraceResult(dst=dst, hops=(*head, plain.hops[-1]), reached=True)
    return TraceResult(dst=dst, hops=pinned.hops[:n], reached=False)


def _socket(src: str, sport: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
        s.setblocking(False)
        s.bind((src, sport))
    except BaseException:
        s.close()
        raise
    return s


def _ends(hop: TraceHop, dst: str) -> tuple[bool, bool]:
    """(the trace ends at this hop, it reached the destination)."""
    if hop.icmp in ("reply", "unreachable") and hop.addr == dst:
        return True, True
    # a router said no: nothing beyond it will answer
    return hop.icmp in ("unreachable", "sendfail"), False


def _all_at_once(
    s: socket.socket,
    dst: str,
    dport: int,
    max_ttl: int,
    timeout_s: float,
    payload: bytes,
    hops_needed: Callable[[], int | None] | None = None,
) -> TraceResult | None:
    """Every TTL in flight together; ``None`` when an answer cannot be matched to its probe."""
    sent: dict[int, float] = {}
    got: dict[int, TraceHop] = {}
    for ttl in range(1, max_ttl + 1):
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        sent[ttl] = time.perf_counter()
        if not _send(s, payload + bytes([ttl]), (dst, dport)):
            # a local error (no route) is itself the answer: the first hop is missing
            got[ttl] = TraceHop(ttl, None, (), "sendfail")
            break
    deadline = time.perf_counter() + timeout_s
    while not _complete(got, sent, dst):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        if hops_needed is not None:
            n = hops_needed()
            if n is not None and all(t in got for t in range(1, n)):
                break  # the rest is the silent destination
            left = min(left, 0.02)  # look again soon: the answer may come from elsewhere
        r, _, x = select.select([s], [], [s], left)
        if not r and not x:
            continue
        answer = _receive(s)
        if answer is None:
            continue
        data, hop = answer
        if len(data) <= len(payload) or not data.startswith(payload):
            return None  # quoted too little to say which probe this answers
        ttl = data[len(payload)]  # (an RFC 4884 quote is padded: the TTL byte stays in place)
        if ttl in sent and ttl not in got:
            rtt_ms = (round((time.perf_counter() - sent[ttl]) * 1e3, 3),)
            got[ttl] = TraceHop(ttl, hop.addr, rtt_ms, hop.icmp, hop.code)
    hops: list[TraceHop] = []
    reached = False
    for ttl in sorted(sent):
        hop = got.get(ttl, TraceHop(ttl, None))
        hops.append(hop)
        end, reached = _ends(hop, dst)
        if end:
            break
    return TraceResult(dst=dst, hops=tuple(hops), reached=reached)


def _send(s: socket.socket, data: bytes, to: tuple[str, int]) -> bool:
    """Send one probe. An ICMP error of an earlier probe makes the next send fail once with
    its errno (the socket's pending error; the error itself waits in the error queue): that
    send is tried again, and only a second failure is a local error."""
    for _ in range(2):
        try:
            s.sendto(data, to)
            return True
        except OSError:
            continue
    return False


def _complete(got: dict[int, TraceHop], sent: dict[int, float], dst: str) -> bool:
    """Every hop up to where the trace ends has answered."""
    for ttl in sorted(sent):
        hop = got.get(ttl)
        if hop is None:
            return False
        if _ends(hop, dst)[0]:
            return True
    return True


def _receive(s: socket.socket) -> tuple[bytes, TraceHop] | None:
    """One answer: an ICMP error from the error queue (with the payload it quotes), or a UDP
    reply from an echo responder at the destination (with the payload it echoes)."""
    try:
        data, anc, _flags, _addr = s.recvmsg(512, 512, socket.MSG_ERRQUEUE)
    except BlockingIOError:
        try:
            data, addr = s.recvfrom(512)
        except (BlockingIOError, ConnectionRefusedError):
            return None
        return data, TraceHop(0, addr[0], (), "reply")
    err = _parse_recverr(anc)
    if err is None:
        return None
    if err.type == _ICMP_TIME_EXCEEDED:
        return data, TraceHop(0, err.offender, (), "time-exceeded")
    icmp = "unreachable" if err.type == _ICMP_UNREACH else f"icmp-{err.type}"
    return data, TraceHop(0, err.offender, (), icmp, err.code)


def _one_by_one(
    s: socket.socket, dst: str, dport: int, max_ttl: int, timeout_s: float, payload: bytes
) -> TraceResult:
    hops: list[TraceHop] = []
    reached = False
    for ttl in range(1, max_ttl + 1):
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        t0 = time.perf_counter()
        if not _send(s, payload, (dst, dport)):
            hops.append(TraceHop(ttl, None, (), "sendfail"))
            break
        hop = _await_hop(s, ttl, t0, timeout_s)
        hops.append(hop)
        end, reached = _ends(hop, dst)
        if end:
            break
    return TraceResult(dst=dst, hops=tuple(hops), reached=reached)


def _await_hop(s: socket.socket, ttl: int, t0: float, timeout_s: float) -> TraceHop:
    while True:
        left = timeout_s - (time.perf_counter() - t0)
        if left <= 0:
            return TraceHop(ttl, None)
        r, _, x = select.select([s], [], [s], left)
        if not r and not x:
            continue
        answer = _receive(s)
        if answer is not None:
            hop = answer[1]
            rtt_ms = (round((time.perf_counter() - t0) * 1e3, 3),)
            return TraceHop(ttl, hop.addr, rtt_ms, hop.icmp, hop.code)


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
