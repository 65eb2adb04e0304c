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

The host agent runs the capture all the time (:meth:`OuterPortLearner.start`), so a localization
round finds every flow probed in the last ``ttl_s`` already learned and never waits for frames
(each path id of a pair is probed at least once per ``coverage_s``); without it, capture runs
only while someone waits for a flow, at most the wait asked for. Its cost: the kernel filter
rejects every other frame (and skh probes' second answers, ACK2, which share ACK1's 5-tuple, and
frames coming in), and a frame of a flow whose port is already known costs a slice and a dict
lookup (``bench/vxlan_learn.py`` measures it per frame). Needs ``CAP_NET_RAW``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
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
_SKF_AD_PKTTYPE = 0xFFFFF000 + 4  # SKF_AD_OFF + SKF_AD_PKTTYPE: the frame's packet type
_BATCH_S = 0.05  # capture reads what gathered in this long at once
_RCVBUF = 1 << 20  # holds a batch of a busy host's frames (~200 B each, ~1 KB in the kernel)
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
_LDW_ABS, _LDH_ABS, _LDB_ABS, _LDXB_MSH = 0x20, 0x28, 0x30, 0xB1
_LDW_IND, _LDH_IND, _LDB_IND = 0x40, 0x48, 0x50
_JEQ, _JSET, _RET = 0x15, 0x45, 0x06


def probe_filter(vxlan_port: int = VXLAN_PORT) -> list[tuple[int, int, int, int]]:
    """A classic-BPF program accepting an outgoing IPv4/UDP frame to ``vxlan_port`` whose inner
    frame is IPv4 (no options)/UDP carrying an skh probe or first answer (not the second, ACK2:
    same 5-tuple as the first); ``(code, jt, jf, k)`` rows. Offsets past the outer IP header are
    relative to X = its length (``ldxb 4*([14]&0xf)``)."""
    # (code, k, test): 0 = a load, 1 = a compare that drops the frame when it fails, 2 = a
    # compare that drops it when it holds
    body: list[tuple[int, int, int]] = [
        (_LDW_ABS, _SKF_AD_PKTTYPE, 0),
        (_JEQ, _PACKET_OUTGOING, 1),  # this host's frames leaving (a peer's come in)
        (_LDH_ABS, 12, 0),
        (_JEQ, 0x0800, 1),  # outer IPv4
        (_LDB_ABS, 23, 0),
        (_JEQ, 17, 1),  # UDP
        (_LDH_ABS, 20, 0),
        (_JSET, 0x1FFF, 2),  # not a later fragment
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
        (_LDB_IND, 77, 0),
        (_JEQ, SKH_MSG_ACK2, 2),
    ]
    n = len(body)
    prog = []
    for i, (code, k, test) in enumerate(body):
        to_drop = n - i  # from the next row to the "drop" row after "accept"
        if not test:
            prog.append((code, 0, 0, k))
        elif test == 2:
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


def _fast_key(frame: bytes) -> bytes | None:
    """The fields that name a flow and its outer port in the usual frame (no VLAN tag, no outer
    IP options), where they sit at fixed offsets: outer destination and source port, inner
    addresses, message type, path id. None for any other layout (parsed in full)."""
    if frame[12:15] != b"\x08\x00\x45" or len(frame) < 110:
        return None
    return frame[30:36] + frame[76:84] + frame[97:98] + frame[108:110]


class OuterPortLearner:
    """How this host's encapsulated probe flows leave (:class:`Learned`), learned by watching.

    :meth:`lookup` answers from what was seen within ``ttl_s`` (an engine that restarts opens
    new inner ports, which hash anew). Started (:meth:`start`, the host agent does it), one
    capture thread watches until the last :meth:`stop`, and a lookup waits only while the capture
    has run less than the wait asked for (a flow not seen by then is not being probed). Not
    started, a lookup captures until the flow shows up or ``wait_s`` passes; one capture thread
    serves every waiter and stops when the last wait ends; a flow not seen while the capture has
    run ``wait_s`` on end is not waited for again by a later lookup of the same round.
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
        #: :func:`_fast_key` -> when that flow's frame was last recorded under that port
        self._fast: dict[bytes, float] = {}
        self._until = 0.0
        self._since = 0.0  # when the running capture started
        self._users = 0  # start() calls not yet stopped: capture runs on
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why capture could not start (no CAP_NET_RAW...)
        self.frames = 0  # frames the filter let through
        self.recorded = 0  # of them, those that told something new (parsed in full)

    def start(self) -> None:
        """Capture from now until :meth:`stop` (counted: as many stops as starts)."""
        with self._cv:
            self._users += 1
            self._until = math.inf
            self._ensure_capture(self._clock())

    def stop(self) -> None:
        with self._cv:
            self._users = max(0, self._users - 1)
            if not self._users:
                self._until = self._clock()  # lookups still waiting keep nothing running

    def _ensure_capture(self, now: float) -> None:
        if self._thread is None:
            self.error = None
            self._since = now
            self._thread = threading.Thread(
                target=self._capture, name="skh-vxlan-learn", daemon=True
            )
            self._thread.start()

    def lookup(self, outer_dst: str, flow: InnerFlow, wait_s: float) -> Learned | None:
        """How ``flow`` last left towards VTEP ``outer_dst``, or None when it was not seen
        within ``wait_s`` of capture."""
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
                self._ensure_capture(now)
                self._cv.wait(min(0.2, deadline - now))
                if self._thread is None and self.error is not None:
                    return None

    def flows(self) -> int:
        """Flows learned (not yet forgotten)."""
        with self._cv:
            return len(self._seen)

    def add(self, outer_dst: str, flow: InnerFlow, learned: Learned) -> None:
        """Record one observation (what the capture does per frame it parses)."""
        with self._cv:
            self._seen[(outer_dst, flow)] = (learned, self._clock())
            self._cv.notify_all()

    def _frame(self, frame: bytes, now: float) -> None:
        """One captured frame: recorded unless its flow was recorded with the same outer port
        within a tenth of ``ttl_s`` (the common case costs a slice and a dict lookup)."""
        self.frames += 1
        fast = _fast_key(frame)
        if fast is not None and now - self._fast.get(fast, -math.inf) < self.ttl_s / 10:
            return
        got = parse_probe_frame(frame, self.vxlan_port)
        if got is None:
            return
        self.recorded += 1
        self.add(*got)
        if fast is not None:
            self._fast[fast] = now

    def _prune(self, now: float) -> None:
        """Forget what is older than ``ttl_s`` (flows no longer probed, ports no longer used)."""
        with self._cv:
            for k in [k for k, (_l, t) in self._seen.items() if now - t > self.ttl_s]:
                del self._seen[k]
        for k in [k for k, t in self._fast.items() if now - t > self.ttl_s]:
            del self._fast[k]

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
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            _attach(sock, probe_filter(self.vxlan_port))
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:  # frames queued before the filter was attached: any direction
                    sock.recv(_SNAP)
            next_prune = self._clock() + self.ttl_s
            while True:
                with self._cv:
                    now = self._clock()
                    left = self._until - now
                    if left <= 0:
                        self._thread = None
                        self._cv.notify_all()
                        return
                if now >= next_prune:
                    next_prune = now + self.ttl_s
                    self._prune(now)
                r, _, _ = select.select([sock], [], [], min(1.0, left))
                if not r:
                    continue
                with contextlib.suppress(BlockingIOError):
                    while True:
                        self._frame(sock.recv(_SNAP), now)
                # frames gather in the socket meanwhile: one wake-up per batch, not per frame
                time.sleep(_BATCH_S)
        except OSError as exc:
            with self._cv:
                self.error = f"watching VXLAN frames failed: {exc}"
                self._thread = None
                self._cv.notify_all()
        finally:
            sock.close()
