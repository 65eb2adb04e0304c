"""The probing engine's Python API: one :class:`Engine` per endpoint (VF), prober and responder.

The engine is a C thread (csrc/engine.c) that probes its targets on a schedule, answers probes from
other engines, and writes one fixed-size record per probe into a bounded ring; :meth:`Engine.drain`
moves the records into a numpy array of :data:`skh.records.PROBE_DTYPE` without per-probe Python
objects; :meth:`Engine.drain_packed` hands them over as packed bytes
(:data:`skh.layout.PROBE_STRUCT`) without loading numpy, as the overlay agent does. RTTs use the
two-reply scheme, network RTT = (T5 - T2) - (T4 - T3), each difference on one clock;
``ts_source`` of each record names the weaker of the two clocks used.

Example::

    with Engine(port=0) as a, Engine(port=0) as b:     # entering starts the engine thread
        a.add_target(2, "127.0.0.1", b.local_port, interval_s=0.01)
        time.sleep(1)
        rows = a.drain()                                 # PROBE_DTYPE rows
"""

from __future__ import annotations

import errno
import ipaddress
import math
import numbers
import socket
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from skh import _fastprobe
from skh.errors import CapabilityError, EngineError, InvalidProbeSpec
from skh.layout import PROBE_RECORD_SIZE

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_BATCH_WINDOW_S",
    "DEFAULT_DIRECTION_WAIT_S",
    "DEFAULT_PORT",
    "DEFAULT_PROBE_BYTES",
    "MAX_TICK_S",
    "PROBE_MAX_BYTES",
    "PROBE_MIN_BYTES",
    "Engine",
    "EngineStats",
    "EngineThread",
    "capabilities",
]

#: UDP port of responders unless told otherwise (4791 is RoCEv2's, 18515 perftest's)
DEFAULT_PORT = 7471
#: PROBE sizes: from the smallest that its two replies never exceed to one MTU of UDP payload
PROBE_MIN_BYTES = _fastprobe.PROBE_MIN_LEN
PROBE_MAX_BYTES = _fastprobe.PROBE_MAX_LEN
DEFAULT_PROBE_BYTES = PROBE_MIN_BYTES
#: Probes due this close together leave in one send batch (one wake-up per round of a target list
#: rather than one per target); each probe's own send time is still recorded (``Engine``).
DEFAULT_BATCH_WINDOW_S = 500e-6
#: An unanswered probe's record waits at most this long past its timeout for a later answer to say
#: which direction lost it (REQUEST_LOST / REPLY_LOST); then it is LOST. 0: decide at the timeout
#: with the receipts at hand, so records reach an analyzer as early as before (docs/engine.md).
DEFAULT_DIRECTION_WAIT_S = _fastprobe.DEFAULT_DIRECTION_WAIT_NS / 1e9
#: The longest ``Engine`` tick: half the 10 ms a responder waits for its first reply's send stamp.
MAX_TICK_S = _fastprobe.MAX_TICK_NS / 1e9

_TRANSPORTS = ("udp", "verbs")
_U32 = 2**32 - 1


def capabilities() -> frozenset[str]:
    """What this machine offers: ``udp`` and ``kernel_timestamps`` always (Linux), ``verbs`` only
    when an RDMA device is usable."""
    caps = {"kernel_timestamps"}
    for name, rc in _fastprobe.transports().items():
        if rc == 0:
            caps.add(name)
    return frozenset(caps)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters of one engine since it was created (C names, csrc/engine.h). Invariants:
    ``sent + send_errors == decided + in_flight + awaiting_direction``,
    ``decided == records + ring_overflow`` and
    ``received == probes_received + acks_received + icmp_errors + drops``."""

    sent: int
    send_errors: int
    send_deferred: int
    received: int
    probes_received: int
    replies_sent: int
    reply_errors: int
    replies_user_stamps: int
    acks_received: int
    ok: int
    lost: int
    refused: int
    unreachable: int
    invalid: int
    request_lost: int
    reply_lost: int
    local_error: int
    icmp_errors: int
    tx_stamps: int
    tx_stamps_unmatched: int
    clock_steps: int
    records: int
    ring_overflow: int
    drop_truncated: int
    drop_bad_magic: int
    drop_bad_version: int
    drop_bad_type: int
    drop_malformed: int
    drop_unsolicited: int
    drop_replay: int
    drop_late: int
    in_flight: int
    awaiting_direction: int
    inflight_full: int
    wakeups: int
    probes_no_rtt: int

    @property
    def drops(self) -> int:
        """Received datagrams dropped as garbage, for any reason."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name.startswith("drop_"))

    @property
    def decided(self) -> int:
        """Probes with an outcome (a record, or a ring overflow)."""
        return (
            self.ok
            + self.lost
            + self.refused
            + self.unreachable
            + self.invalid
            + self.request_lost
            + self.reply_lost
            + self.local_error
        )

    @property
    def network_lost(self) -> int:
        """Probes lost in the network, whichever direction (LOSS_STATUSES)."""
        return self.lost + self.request_lost + self.reply_lost

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


if tuple(f.name for f in fields(EngineStats)) != _fastprobe.stat_names():  # pragma: no cover
    raise ImportError(
        "skh.probe.EngineStats is out of step with the engine's counters (csrc/engine.h)"
    )
if _fastprobe.RECORD_SIZE != PROBE_RECORD_SIZE:  # pragma: no cover
    raise ImportError("skh.layout.PROBE_FIELDS no longer matches the engine's skh_record")


def _bad(param: str, owner: str, must: str, got: Any) -> InvalidProbeSpec:
    return InvalidProbeSpec(
        f"The {param!r} parameter of {owner} must be {must}. Got {got!r} instead."
    )


def _check_int(value: Any, param: str, owner: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise _bad(param, owner, f"an int in the range [{lo}, {hi}]", value)
    return int(value)


def _check_seconds(value: Any, param: str, owner: str, lo: float = 1e-6) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < lo
    ):
        raise _bad(param, owner, f"a finite number of seconds >= {lo:g}", value)
    return float(value)


class EngineThread:
    """One thread for several engines (``Engine(thread=...)``): it runs their turns one after
    another and sleeps until the first of them needs it, so N engines cost one wake-up where
    they would cost N. The thread waits for the shortest ``tick_s`` among them. It starts with
    its first engine and ends when its last engine stops.

    Nothing an engine does on the thread blocks (sockets and verbs queues are non-blocking;
    addresses are resolved on the caller's thread in ``add_target``), so one endpoint in
    trouble does not hold the others' probes up."""

    def __init__(self) -> None:
        self._loop = _fastprobe.FastLoop()


class Engine:
    """One probing engine: a C thread owning one UDP socket (or verbs UD QP) that probes its targets
    and answers probes sent to it.

    Entering the context manager starts the thread; leaving it closes the engine. ``start``/``stop``
    may also be called directly, and ``stop``/``close`` are idempotent.

    Beyond the common contract: ``kernel_timestamps=False`` uses user-clock stamps only (labelled
    USER), ``probe_bytes`` sizes the PROBE datagrams (replies stay 48 B each), and ``max_in_flight``
    bounds the probes awaiting a decision (due probes wait for replies or timeouts beyond it); it
    should cover probes/s x timeout_s, and costs about 128 B of memory per unit.
    ``answer_slots`` bounds the answered probes whose second reply waits for the first's send
    stamp (each at most 10 ms; 0: ``MAX_ANSWER_SLOTS``, 1,024, about 200 B each): beyond it the
    oldest waiter's second reply leaves without that stamp.

    ``address_handles`` (verbs) bounds the address handles kept, one per peer and flow label in
    use (0: ``ADDRESS_HANDLES_DEFAULT``, 4,096); beyond it the least recently used idle one is
    destroyed and made again when needed.

    ``traffic_class`` is the IP TOS / IPv6 traffic class byte of the probes (``DSCP << 2``; over
    verbs the GRH traffic class) and ``priority`` their priority (UDP: ``SO_PRIORITY``, i.e. the
    egress queue and VLAN PCP; verbs: the service level): set them to the training traffic's class
    so probes share its queue (RoCE fabrics commonly run it as DSCP 26, priority 3:
    ``traffic_class=104, priority=3``; see docs/engine.md). Replies carry the DSCP their probe
    arrived with.

    Loss by direction: the engine asks responders for receipts (which of the stream's earlier
    probes they received), so an unanswered probe is ``REQUEST_LOST`` or ``REPLY_LOST`` when the
    receipts at its timeout tell (or, with ``direction_wait_s`` > 0, that long after it), and
    ``LOST`` when none do (a responder that sends no receipts, an outage). A probe with
    one of its two answers is ``REPLY_LOST``; one this host could not send, or whose answers its
    own reset receive queue lost, ``LOCAL_ERROR``. ``batch_window_s``
    > 0 batches probes: each target's probes fall on multiples of its interval (after the first,
    sent at once), so targets sharing an interval go out together however far apart they were
    added, and a probe due within the window of a batch joins it; a round of a target list then
    costs one wake-up and one send call instead of one per target. 0: each probe exactly on the
    schedule the target was added with.

    ``tick_s`` (0 .. ``MAX_TICK_S``, 5 ms) bounds the engine thread's wake-ups to one per tick:
    what arrives within a tick of the last one (peers' probes, answers, send stamps) is handled
    together at its end, with one receive and one send call per socket. RTTs do not move (the
    kernel or the NIC stamps the datagrams as they pass); the responder and prober delays, send
    times and timeout decisions may, by up to a tick. Applied only where the stamps are taken
    on the wire (``tick_s`` says whether: 0 with user-clock stamps, which a late read would put
    in the RTT). 0: wake up for every event. See docs/engine.md, "Wake-ups".

    ``wall_grid=True`` starts the batching grid at the wall clock's epoch instead of a random
    point of this engine's: engines on hosts whose clocks agree send at the same instants, so a
    responder gets its peers' probes of one interval together, answered in one wake-up, not one
    by one. Every such engine then probes in step with all others. Needs ``batch_window_s`` > 0.

    ``thread``: the :class:`EngineThread` the engine runs on, with the others given it (None: a
    thread of its own).

    """

    def __init__(
        self,
        *,
        endpoint_id: int = 0,
        bind: str = "0.0.0.0",
        port: int = 0,
        transport: str = "udp",
        timeout_s: float = 1.0,
        ring_records: int = 65536,
        hw_timestamps: bool = False,
        device: str | None = None,
        gid_index: int | None = None,
        netns_fd: int | None = None,
        kernel_timestamps: bool = True,
        probe_bytes: int = DEFAULT_PROBE_BYTES,
        max_in_flight: int = _fastprobe.DEFAULT_IN_FLIGHT,
        batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
        traffic_class: int = 0,
        priority: int = 0,
        direction_wait_s: float = DEFAULT_DIRECTION_WAIT_S,
        address_handles: int = 0,
        answer_slots: int = 0,
        tick_s: float = 0.0,
        wall_grid: bool = False,
        thread: EngineThread | None = None,
    ) -> None:
        owner = "Engine"
        endpoint_id = _check_int(endpoint_id, "endpoint_id", owner, 0, _U32)
        if transport not in _TRANSPORTS:
            raise _bad("transport", owner, f"one of {_TRANSPORTS}", transport)
        try:
            ipaddress.ip_address(bind)
        except (TypeError, ValueError):
            raise _bad("bind", owner, "an IPv4 or IPv6 address literal", bind) from None
        port = _check_int(port, "port", owner, 0, 65535)
        timeout_s = _check_seconds(timeout_s, "timeout_s", owner, 1e-3)
        ring_records = _check_int(ring_records, "ring_records", owner, 1, 1 << 24)
        if device is not None and (not isinstance(device, str) or not device):
            raise _bad("device", owner, "a non-empty device name or None", device)
        if gid_index is not None:
            gid_index = _check_int(gid_index, "gid_index", owner, 0, 255)
        if netns_fd is not None:
            netns_fd = _check_int(netns_fd, "netns_fd", owner, 0, 2**31 - 1)
        probe_bytes = _check_int(
            probe_bytes, "probe_bytes", owner, PROBE_MIN_BYTES, PROBE_MAX_BYTES
        )
        max_in_flight = _check_int(
            max_in_flight, "max_in_flight", owner, 1, _fastprobe.MAX_IN_FLIGHT
        )
        batch_window_s = _check_seconds(batch_window_s, "batch_window_s", owner, 0.0)
        traffic_class = _check_int(traffic_class, "traffic_class", owner, 0, 255)
        priority = _check_int(priority, "priority", owner, 0, 7)
        direction_wait_s = _check_seconds(direction_wait_s, "direction_wait_s", owner, 0.0)
        address_handles = _check_int(
            address_handles, "address_handles", owner, 0, _fastprobe.ADDRESS_HANDLES_MAX
        )
        answer_slots = _check_int(
            answer_slots, "answer_slots", owner, 0, _fastprobe.MAX_ANSWER_SLOTS
        )
        tick_s = _check_seconds(tick_s, "tick_s", owner, 0.0)
        if tick_s > MAX_TICK_S:
            raise _bad("tick_s", owner, f"at most {MAX_TICK_S:g} s", tick_s)
        if thread is not None and not isinstance(thread, EngineThread):
            raise _bad("thread", owner, "an EngineThread or None", thread)
        if wall_grid and batch_window_s == 0:
            raise _bad("wall_grid", owner, "batch_window_s > 0 (a grid to align)", wall_grid)
        if batch_window_s >= timeout_s:
            raise _bad(
                "batch_window_s", owner, f"shorter than timeout_s ({timeout_s:g} s)", batch_window_s
            )
        if hw_timestamps and transport == "udp" and device is None:
            raise _bad(
                "device",
                owner,
                "the netdev whose NIC stamps packets when hw_timestamps=True",
                device,
            )
        if transport == "verbs" and "verbs" not in capabilities():
            raise CapabilityError(
                errno.ENODEV,
                "the verbs transport is unavailable here: "
                + (_fastprobe.verbs_strerror() or "no RDMA device"),
            )

        self.endpoint_id = endpoint_id
        self.transport = transport
        self.timeout_s = timeout_s
        self.traffic_class = traffic_class
        self.priority = priority
        self.wall_grid = bool(wall_grid)
        self.thread = thread
        try:
            self._fe = _fastprobe.FastEngine(
                endpoint_id=endpoint_id,
                transport=transport,
                bind=bind,
                port=port,
                device=device or "",
                gid_index=-1 if gid_index is None else gid_index,
                netns_fd=-1 if netns_fd is None else netns_fd,
                hw_timestamps=bool(hw_timestamps),
                kernel_timestamps=bool(kernel_timestamps),
                timeout_ns=int(timeout_s * 1e9),
                ring_records=ring_records,
                probe_len=probe_bytes,
                max_in_flight=max_in_flight,
                batch_window_ns=int(batch_window_s * 1e9),
                traffic_class=traffic_class,
                priority=priority,
                direction_wait_ns=int(direction_wait_s * 1e9),
                address_handles=address_handles,
                answer_slots=answer_slots,
                tick_ns=round(tick_s * 1e9),
                wall_grid=bool(wall_grid),
            )
        except EngineError as exc:
            # the machine lacks what was asked: an RDMA device/GID (any verbs open failure), NIC
            # stamps, or the transport itself; other errors (EADDRINUSE, EPERM...) stay EngineError
            if (
                transport == "verbs"
                or exc.errno in (errno.EOPNOTSUPP, errno.ENODEV, errno.EPROTONOSUPPORT)
                or (hw_timestamps and exc.errno in (errno.EPERM, errno.EINVAL))
            ):
                raise CapabilityError(exc.errno, exc.strerror) from None
            raise
        addr = self.local_address()
        self.local_port: int = addr["port"] if "port" in addr else addr["qpn"]
        #: the tick applied: ``tick_s``, or 0 where the stamps are read from the user clock
        self.tick_s: float = tick_s if self._fe.caps & _fastprobe.CAP_WIRE_STAMPS else 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._fe.start(None if self.thread is None else self.thread._loop)

    def stop(self) -> None:
        if not self._fe.closed:
            self._fe.stop()

    def close(self) -> None:
        self._fe.close()

    @property
    def closed(self) -> bool:
        return self._fe.closed

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.transport} port {self.local_port}"
        return f"<Engine ep={self.endpoint_id} {state}>"

    # -- configuration ---------------------------------------------------------------------------
    @property
    def session(self) -> int:
        """Random id of this engine's life, carried in every probe and reply."""
        return self._fe.session

    @property
    def kernel_timestamps(self) -> bool:
        """Whether the transport delivers kernel (or NIC) send and receive stamps."""
        return self._fe.caps & (_fastprobe.CAP_TX_STAMPS | _fastprobe.CAP_RX_STAMPS) == (
            _fastprobe.CAP_TX_STAMPS | _fastprobe.CAP_RX_STAMPS
        )

    def local_address(self) -> dict[str, Any]:
        kind, host, port_or_qpn, gid_index = self._fe.local()
        if self.transport == "verbs":
            return {"gid": host, "qpn": port_or_qpn, "gid_index": gid_index}
        return {"ip": host, "port": port_or_qpn}

    def add_target(
        self,
        dst_ep: int,
        host: str,
        port: int,
        *,
        interval_s: float,
        path_id: int = 0,
        paths: int = 1,
        qpn: int = 0,
        gid: str = "",
        count: int = 0,
        sample_period_s: float = 0.0,
        sample_phase_ns: int = 0,
    ) -> None:
        """Probes ``dst_ep`` every ``interval_s`` from now on (first probe at once); after ``count``
        probes (0: no limit) the target retires by itself. Adding an existing ``dst_ep`` again
        replaces its address, interval, paths and count, and keeps its probe sequence.

        ``path_id`` pins the ECMP path and is echoed in the records: over UDP each non-zero path_id
        gets its own source port for the engine's life (at most 63 of them; path 0 is the bound
        port), over verbs it is the flow label. With ``paths`` > 1 the probes rotate over the path
        ids ``path_id .. path_id + paths - 1``, probe *k* of the target on ``path_id + k % paths``,
        so every ECMP path the ids hash onto is probed once per ``paths x interval_s``.

        ``sample_period_s`` > 0: only the probes whose OK could be the pair's latency sample (one
        per period, :func:`skh.analysis.sampling.period_samples`; periods start at
        ``sample_phase_ns`` mod the period: :func:`skh.analysis.rowthin.sample_phase_ns` of the
        pair key) ask for an RTT; the others ask the responder for one answer instead of two,
        take no send stamps, and are recorded OK with ``rtt_ns`` -1 (docs/engine.md, "One
        answer per probe"). 0: every probe asks."""
        owner = "Engine.add_target"
        dst_ep = _check_int(dst_ep, "dst_ep", owner, 0, _U32)
        interval_s = _check_seconds(interval_s, "interval_s", owner)
        path_id = _check_int(path_id, "path_id", owner, 0, 65535)
        paths = _check_int(paths, "paths", owner, 1, 65536 - path_id)
        qpn = _check_int(qpn, "qpn", owner, 0, (1 << 24) - 1)
        count = _check_int(count, "count", owner, 0, _U32)
        period_ns = round(_check_seconds(sample_period_s, "sample_period_s", owner, 0.0) * 1e9)
        hi = max(period_ns - 1, 0)
        sample_phase_ns = _check_int(sample_phase_ns, "sample_phase_ns", owner, 0, hi)
        if self.transport == "verbs":
            if not gid or not isinstance(gid, str):
                raise _bad("gid", owner, "the responder's GID for the verbs transport", gid)
            if qpn == 0:
                raise _bad(
                    "qpn", owner, "the responder's QPN (non-zero) for the verbs transport", qpn
                )
            host = host or ""
            port = 0
        else:
            port = _check_int(port, "port", owner, 1, 65535)
            host = self._resolve(host, owner)
        self._fe.add_target(
            dst_ep,
            host,
            port,
            gid or "",
            qpn,
            path_id,
            paths,
            int(interval_s * 1e9),
            count,
            period_ns,
            sample_phase_ns,
        )

    def _resolve(self, host: Any, owner: str) -> str:
        if not isinstance(host, str) or not host:
            raise _bad("host", owner, "an IP address or host name", host)
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        v4_only = ":" not in self.local_address()["ip"]
        try:
            infos = socket.getaddrinfo(
                host, None, socket.AF_INET if v4_only else socket.AF_UNSPEC, socket.SOCK_DGRAM
            )
        except socket.gaierror as exc:
            raise _bad("host", owner, f"a resolvable host name ({exc})", host) from None
        return str(infos[0][4][0])

    def remove_target(self, dst_ep: int) -> None:
        """Stops probing ``dst_ep``; its probes in flight are still decided. Unknown ids raise
        :class:`~skh.errors.InvalidProbeSpec`."""
        dst_ep = _check_int(dst_ep, "dst_ep", "Engine.remove_target", 0, _U32)
        try:
            self._fe.remove_target(dst_ep)
        except EngineError as exc:
            if exc.errno == errno.ENOENT:
                raise InvalidProbeSpec(
                    f"Engine.remove_target: no target {dst_ep} to remove."
                ) from None
            raise

    # -- results ---------------------------------------------------------------------------------
    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Moves up to ``max_records`` (default: all) records out of the ring, oldest first, as a
        ``PROBE_DTYPE`` array (``src_ep``: this engine's endpoint id, ``dst_ep``: the target's)."""
        # numpy is loaded here, not with the module: the overlay agent drains packed records
        import numpy as np

        from skh.records import PROBE_DTYPE

        return np.frombuffer(self.drain_packed(max_records), PROBE_DTYPE)

    def drain_packed(self, max_records: int | None = None) -> bytearray:
        """:meth:`drain`'s records as packed bytes, :data:`skh.layout.PROBE_STRUCT` each."""
        if max_records is None:
            max_records = 1 << 62
        else:
            max_records = _check_int(max_records, "max_records", "Engine.drain", 0, 1 << 62)
        return self._fe.drain(max_records)

    def pending_records(self) -> int:
        """Records waiting in the ring."""
        return int(self._fe.pending_records())

    def stats(self) -> EngineStats:
        return EngineStats(*self._fe.stats())

    def transport_stats(self) -> dict[str, int]:
        """The transport's own counters (verbs: ``qp_recoveries``, address handles created,
        evicted and failed, completion errors, datagrams without a GRH); zeros where they do not
        apply (UDP)."""
        return dict(zip(_fastprobe.transport_stat_names(), self._fe.transport_stats(), strict=True))
