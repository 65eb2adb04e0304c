"""The VXLAN outer UDP source port a probe flow actually leaves the host with.

Under a VXLAN overlay the underlay's ECMP hashes the *outer* header, whose UDP source port the
encapsulating VTEP derives from the inner flow: Linux's vxlan driver takes the skb's flow hash
(``udp_flow_src_port``: a per-socket random ``sk_txhash`` or the flow dissector's hash with a
per-boot seed) scaled into its port range, and a hardware VTEP uses its own hash. Nobody outside
the VTEP can compute it, so it is observed: :class:`OuterPortLearner` watches this host's
encapsulated skh probes leave (an ``AF_PACKET`` socket with a classic-BPF filter, so the kernel
hands up only VXLAN frames that carry an skh probe) and remembers, per inner flow (inner source,
inner destination, path id), the outer source port it was sent with. A trace pinned to that
outer 5-tuple crosses the underlay as the failing probes did
(:func:`skh.collect.trace.vxlan_trace`).

Capture runs only while someone waits for a flow, at most the wait asked for, and is shared by
every concurrent waiter: a localization round asks for many traces at once and each path id of
a pair is probed at least once per ``coverage_s``. Needs ``CAP_NET_RAW``.
"""

from __future__ import annotations

import ctypes
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "VXLAN_PORT",
    "InnerFlow",
    "Learned",
    "OuterPortLearner",
    "parse_probe_frame",
    "probe_filter",
]

VXLAN_PORT = 4789
SKH_MAGIC = 0x534B4850  # "SKHP" (csrc/proto.h)
SKH_MSG_PROBE, SKH_MSG_ACK1, SKH_MSG_ACK2 = 1, 2, 3
_ETH_P_ALL = 0x0003
_SO_ATTACH_FILTER = 26
_PACKET_OUTGOING = 4
_SNAP = 192  # outer Eth+IPv4+UDP+VXLAN, inner Eth+IPv4+UDP, the probe header's first 18 bytes


@dataclass(frozen=True, slots=True)
class InnerFlow:
    """One leg of a probe flow as the overlay sees it: from ``src`` to ``dst`` (overlay
    addresses) on the path id the prober pinned (the probe header carries it, its answers echo
    it). ``reply``: the answers' leg (the target's ACKs to the prober), else the probes'."""

    src: str
    dst: str
    path_id: int
    reply: bool = False


@dataclass(frozen=True, slots=True)
class Learned:
    """How a flow's frames leave: the outer UDP source port, and the bytes the outer UDP
    header is followed by up to the end of the inner UDP header (VXLAN 8, inner Ethernet 14,
    inner IPv4 20, inner UDP 8), which a trace copies so that whatever looks past the outer
    header (a switch hashing inner fields, a filter) treats the trace as it treats the flow."""

    sport: int
    inner: bytes


#: VXLAN header + inner Ethernet + inner IPv4 (no options) + inner UDP
INNER_HEADERS = 8 + 14 + 20 + 8

# classic BPF opcodes (linux/filter.h)
_LDH_ABS, _LDB_ABS, _LDXB_MSH = 0x28, 0x30, 0xB1
_LDW_IND, _LDH_IND, _LDB_IND = 0x40, 0x48, 0x50
_JEQ, _JSET, _RET = 0x15, 0x45, 0x06


def probe_filter(vxlan_port: int = VXLAN_PORT) -> list[tuple[int, int, int, int]]:
    """A classic-BPF program accepting an IPv4/UDP frame to ``vxlan_port`` whose inner frame is
    IPv4 (no options)/UDP starting with the skh magic; ``(code, jt, jf, k)`` rows. Offsets past
    the outer IP header are relative to X = its length (``ldxb 4*([14]&0xf)``)."""
    body: list[tuple[int, int, int]] = [  # (code, k, 1 = "compare: drop when it fails")
        (_LDH_ABS, 12, 0),
        (_JEQ, 0x0800, 1),  # outer IPv4
        (_LDB_ABS, 23, 0),
        (_JEQ, 17, 1),  # UDP
        (_LDH_ABS, 20, 0),
        (_JSET, 0x1FFF, 1),  # not a later fragment (JSET: drop when set, below)
        (_LDXB_MSH, 14, 0),
        (_LDH_IND, 16, 0),
        (_JEQ, vxlan_port, 1),  # outer UDP destination port
        (_LDH_IND, 42, 0),
        (_JEQ, 0x0800, 1),  # inner IPv4
        (_LDB_IND, 44, 0),
        (_JEQ, 0x45, 1),  # version 4, no options
        (_LDB_IND, 53, 0),
        (_JEQ, 17, 1),  # inner UDP
        (_LDW_IND, 72, 0),
        (_JEQ, SKH_MAGIC, 1),
    ]
    n = len(body)
    prog = []
    for i, (code, k, test) in enumerate(body):
        to_drop = n - i  # from the next row to the "drop" row after "accept"
        if not test:
            prog.append((code, 0, 0, k))
        elif code == _JSET:
            prog.append((code, to_drop, 0, k))
        else:
            prog.append((code, 0, to_drop, k))
    return [*prog, (_RET, 0, 0, _SNAP), (_RET, 0, 0, 0)]


def _attach(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
    rows = b"".join(struct.pack("=HBBI", *row) for row in prog)
    buf = ctypes.create_string_buffer(rows, len(rows))
    fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)


def parse_probe_frame(
    frame: bytes, vxlan_port: int = VXLAN_PORT
) -> tuple[str, InnerFlow, Learned] | None:
    """``(outer destination, inner flow, how it left)`` of an Ethernet frame carrying a
    VXLAN-encapsulated skh probe or answer, else None. Checks every field the filter checks
    (frames that reach the socket before the filter is attached are not filtered)."""
    try:
        off = 14
        (etype,) = struct.unpack_from("!H", frame, 12)
        if etype == 0x8100:  # an 802.1Q tag the NIC left in place
            (etype,) = struct.unpack_from("!H", frame, 16)
            off = 18
        if etype != 0x0800 or frame[off] >> 4 != 4 or frame[off + 9] != 17:
            return None
        ihl = (frame[off] & 0xF) * 4
        outer_dst = socket.inet_ntoa(frame[off + 16 : off + 20])
        sport, dport = struct.unpack_from("!HH", frame, off + ihl)
        if dport != vxlan_port:
            return None
        inner = off + ihl + 8 + 8 + 14
        (itype,) = struct.unpack_from("!H", frame, inner - 2)
        if itype != 0x0800 or frame[inner] != 0x45 or frame[inner + 9] != 17:
            return None
        src = socket.inet_ntoa(frame[inner + 12 : inner + 16])
        dst = socket.inet_ntoa(frame[inner + 16 : inner + 20])
        hdr = inner + 20 + 8
        magic, _ver, mtype = struct.unpack_from("!IBB", frame, hdr)
        (path_id,) = struct.unpack_from("!H", frame, hdr + 16)
    except (struct.error, IndexError, OSError):  # truncated: inet_ntoa of a short slice
        return None
    if magic != SKH_MAGIC or mtype not in (SKH_MSG_PROBE, SKH_MSG_ACK1, SKH_MSG_ACK2):
        return None
    start = off + ihl + 8
    flow = InnerFlow(src, dst, path_id, reply=mtype != SKH_MSG_PROBE)
    return outer_dst, flow, Learned(sport, bytes(frame[start:hdr]))


class OuterPortLearner:
    """How this host's encapsulated probe flows leave (:class:`Learned`), learned by watching.

    :meth:`lookup` answers from what was seen within ``ttl_s`` (an engine that restarts opens
    new inner ports, which hash anew), else captures until the flow shows up or ``wait_s``
    passes. One capture thread serves every waiter; it stops when the last wait ends. A flow
    not seen while the capture has run ``wait_s`` on end is not waited for again by a later
    lookup of the same round (a flow nobody probes, or a path id not in the rotation).
    """

    def __init__(
        self,
        *,
        ttl_s: float = 30.0,
        vxlan_port: int = VXLAN_PORT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.vxlan_port = vxlan_port
        self._clock = clock
        self._cv = threading.Condition()
        self._seen: dict[tuple[str, InnerFlow], tuple[Learned, float]] = {}
        self._until = 0.0
        self._since = 0.0  # when the running capture started
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why capture could not start (no CAP_NET_RAW...)
        self.frames = 0

    def lookup(self, outer_dst: str, flow: InnerFlow, wait_s: float) -> Learned | None:
        """How ``flow`` last left towards VTEP ``outer_dst``, or None when it was not seen
        within ``wait_s``."""
        key = (outer_dst, flow)
        deadline = self._clock() + wait_s
        with self._cv:
            if self._thread is not None:
                deadline = min(deadline, self._since + wait_s)
            while True:
                now = self._clock()
                hit = self._seen.get(key)
                if hit is not None and now - hit[1] <= self.ttl_s:
                    return hit[0]
                if now >= deadline:
                    return None
                self._until = max(self._until, deadline)
                if self._thread is None:
                    self.error = None
                    self._since = now
                    self._thread = threading.Thread(
                        target=self._capture, name="skh-vxlan-learn", daemon=True
                    )
                    self._thread.start()
                self._cv.wait(min(0.2, deadline - now))
                if self._thread is None and self.error is not None:
                    return None

    def add(self, outer_dst: str, flow: InnerFlow, learned: Learned) -> None:
        """Record one observation (what the capture does per frame)."""
        with self._cv:
            self._seen[(outer_dst, flow)] = (learned, self._clock())
            self._cv.notify_all()

    def _capture(self) -> None:
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        except OSError as exc:
            with self._cv:
                self.error = f"cannot watch VXLAN frames: {exc}"
                self._thread = None
                self._cv.notify_all()
            return
        try:
            _attach(sock, probe_filter(self.vxlan_port))
            sock.setblocking(False)
            while True:
                with self._cv:
                    left = self._until - self._clock()
                    if left <= 0:
                        self._thread = None
                        self._cv.notify_all()
                        return
                r, _, _ = select.select([sock], [], [], min(0.2, left))
                while r:
                    try:
                        frame, addr = sock.recvfrom(_SNAP)
                    except BlockingIOError:
                        break
                    if addr[2] != _PACKET_OUTGOING:
                        continue  # our own encapsulations only (a peer's come in)
                    got = parse_probe_frame(frame, self.vxlan_port)
                    if got is not None:
                        self.frames += 1
                        self.add(*got)
        except OSError as exc:
            with self._cv:
                self.error = f"watching VXLAN frames failed: {exc}"
                self._thread = None
                self._cv.notify_all()
        finally:
            sock.close()
