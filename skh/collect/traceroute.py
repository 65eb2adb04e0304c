"""Traceroute results: the plain data the underlay vote takes, and a parser of ``traceroute -n``.

``traceroute -n`` (Linux "modern traceroute" 2.x) prints one line per TTL::

    traceroute to 10.9.2.1 (10.9.2.1), 8 hops max, 60 byte packets
     1  10.9.1.254  0.050 ms  0.009 ms  0.008 ms
     2  10.200.0.0  0.477 ms 10.201.0.0  0.066 ms 10.200.0.0  0.012 ms
     3  * * *
     4  10.9.1.254  0.041 ms !N  0.012 ms !N

Several addresses on one line happen when its probes took different ECMP paths; the flow-pinned
trace of :mod:`skh.collect.trace` never mixes them. Annotations ``!H !N !P !X !S !F !V !C !<n>``
are ICMP unreachable codes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from skh.analysis.localize import Trace

__all__ = [
    "TraceHop",
    "TraceResult",
    "parse_traceroute",
    "parse_paris_json",
    "trace_nodes",
    "as_trace",
]

# traceroute's annotation → ICMP unreachable code (RFC 792 / 1812)
_UNREACH = {"!N": 0, "!H": 1, "!P": 2, "!F": 4, "!S": 5, "!X": 13, "!V": 14, "!C": 15}


@dataclass(frozen=True, slots=True)
class TraceHop:
    ttl: int
    #: the (first) address that answered at this TTL; ``None`` when nothing answered
    addr: str | None
    rtt_ms: tuple[float, ...] = ()
    #: "time-exceeded", "unreachable", "reply", "sendfail" or "" when unknown (plain traceroute)
    icmp: str = ""
    code: int = -1
    #: further addresses seen at this TTL (ECMP mixing in non-pinned traceroute)
    alt_addrs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TraceResult:
    dst: str
    hops: tuple[TraceHop, ...] = field(default=())
    #: the destination itself answered
    reached: bool = False

    @property
    def addrs(self) -> tuple[str | None, ...]:
        return tuple(h.addr for h in self.hops)


def _is_addr(tok: str) -> bool:
    try:
        ipaddress.ip_address(tok)
    except ValueError:
        return False
    return True


def parse_traceroute(text: str) -> TraceResult:
    """Parse ``traceroute -n`` output. Odd or truncated lines are skipped, never fatal."""
    dst = ""
    hops: list[TraceHop] = []
    for line in text.splitlines():
        if line.startswith("traceroute to "):
            m = re.search(r"\(([^)]+)\)", line)
            parts = line.split()
            dst = m.group(1) if m else (parts[2] if len(parts) > 2 else "")
            continue
        toks = line.split()
        if not toks or not toks[0].isdigit():
            continue
        ttl = int(toks[0])
        addrs: list[str] = []
        rtts: list[float] = []
        code = -1
        for i, tok in enumerate(toks[1:], 1):
            if _is_addr(tok):
                if tok not in addrs:
                    addrs.append(tok)
            elif tok == "ms" and i >= 2:
                try:
                    rtts.append(float(toks[i - 1]))
                except ValueError:
                    pass
            elif tok.startswith("!"):
                code = _UNREACH.get(tok, int(tok[1:]) if tok[1:].isdigit() else 3)
        icmp = "unreachable" if code >= 0 else ("time-exceeded" if addrs else "")
        hops.append(
            TraceHop(ttl, addrs[0] if addrs else None, tuple(rtts), icmp, code, tuple(addrs[1:]))
        )
    reached = bool(dst) and any(h.addr == dst or dst in h.alt_addrs for h in hops)
    if reached:
        # the destination answers with port unreachable (!P is not printed for the final hop)
        hops = [
            TraceHop(
                h.ttl,
                h.addr,
                h.rtt_ms,
                "unreachable" if h.addr == dst else h.icmp,
                3 if h.addr == dst else h.code,
                h.alt_addrs,
            )
            for h in hops
        ]
    return TraceResult(dst=dst, hops=tuple(hops), reached=reached)


def parse_paris_json(text: str) -> TraceResult:
    """Parse the JSON line of ``python -m skh.collect.trace``. Garbage gives an empty result."""
    try:
        obj = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
    except (json.JSONDecodeError, IndexError):
        return TraceResult(dst="")
    if not isinstance(obj, dict):
        return TraceResult(dst="")
    hops = []
    for h in obj.get("hops", ()):
        if not isinstance(h, dict) or not isinstance(h.get("ttl"), int):
            continue
        hops.append(
            TraceHop(
                h["ttl"],
                h.get("addr") if isinstance(h.get("addr"), str) else None,
                tuple(float(x) for x in h.get("rtt_ms", ()) if isinstance(x, (int, float))),
                str(h.get("icmp", "")),
                int(h.get("code", -1)) if isinstance(h.get("code", -1), int) else -1,
            )
        )
    return TraceResult(
        dst=str(obj.get("dst", "")), hops=tuple(hops), reached=bool(obj.get("reached", False))
    )


def trace_nodes(
    result: TraceResult, addr_to_node: Mapping[str, str], *, src_node: str
) -> tuple[str | None, ...]:
    """Translate a trace into fabric node names for the vote: ``src_node`` first, then one entry
    per TTL (``None`` for a silent hop or an address the map does not know). Trailing silent
    hops are dropped: the vote treats the path as ending at the last node that answered."""
    nodes: list[str | None] = [src_node]
    for h in result.hops:
        nodes.append(addr_to_node.get(h.addr) if h.addr else None)
    while len(nodes) > 1 and nodes[-1] is None:
        nodes.pop()
    return tuple(nodes)


def as_trace(
    pair: tuple[int, int], result: TraceResult, addr_to_node: Mapping[str, str], *, src_node: str
) -> Trace:
    """A trace result as the underlay vote's :class:`~skh.analysis.localize.Trace`."""
    return Trace(pair, trace_nodes(result, addr_to_node, src_node=src_node), result.reached)
