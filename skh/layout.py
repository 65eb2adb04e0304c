"""The probe record's layout and its status codes, without numpy.

:data:`skh.records.PROBE_DTYPE` is built from :data:`PROBE_FIELDS`, and the overlay agent, which
must not load numpy (~13 MB of each sidecar's resident memory, docs/probing.md), reads the
engine's records with :mod:`struct` through :data:`PROBE_STRUCT`: one definition for both.
"""

from __future__ import annotations

import struct
from enum import IntEnum

__all__ = [
    "LOSS_STATUSES",
    "PATH_STATUSES",
    "PROBE_FIELDS",
    "PROBE_RECORD_SIZE",
    "PROBE_STRUCT",
    "ProbeStatus",
    "TsSource",
]


class ProbeStatus(IntEnum):
    """Outcome of one probe, saying where it failed when it did.

    The engine's two-reply protocol lets the prober tell which direction lost a packet: the
    responder's replies acknowledge the requests it received (see ``csrc/proto.h``), so a probe
    with no reply whose request the responder saw is ``REPLY_LOST``, one it never saw
    ``REQUEST_LOST``. ``LOST`` remains for losses whose direction nobody can know (the
    responder never answered again before the record had to be written). All three are
    network loss (:data:`LOSS_STATUSES`); ``LOCAL_ERROR`` and ``INVALID`` are not.
    """

    OK = 0
    #: no reply before the timeout, direction unknown
    LOST = 1
    #: the destination host answered that nothing listens (ICMP port unreachable / ECONNREFUSED):
    #: the network works, the agent there does not
    REFUSED = 2
    #: the network answered that the destination cannot be reached (ICMP host/net unreachable,
    #: TTL exceeded in a loop)
    UNREACHABLE = 3
    #: replies arrived but their timestamps were unusable (mixed clocks, negative RTT, a
    #: realtime clock step during the probe): the network delivered, the RTT is unknown
    INVALID = 4
    #: the request never reached the responder (forward path loss)
    REQUEST_LOST = 5
    #: the responder received the request but no complete answer came back (reverse path loss:
    #: either reply lost)
    REPLY_LOST = 6
    #: the probe could not be sent (full send queue, socket buffer or address-handle cache, a
    #: queue pair in error state): the prober's own problem, never network loss
    LOCAL_ERROR = 7


#: Statuses that are network loss, whichever direction: what loss detection counts.
LOSS_STATUSES = (ProbeStatus.LOST, ProbeStatus.REQUEST_LOST, ProbeStatus.REPLY_LOST)
#: Statuses that say something about the network path (loss detection's denominator): a
#: ``LOCAL_ERROR``, ``REFUSED`` or ``INVALID`` probe says nothing about the path's loss rate.
PATH_STATUSES = (ProbeStatus.OK, ProbeStatus.UNREACHABLE, *LOSS_STATUSES)


class TsSource(IntEnum):
    """Which clock produced the T2..T5 stamps of a record. Values of two sources never mix."""

    NONE = 0
    #: user-space CLOCK_MONOTONIC reads around the send/receive calls
    USER = 1
    #: kernel software stamps (SO_TIMESTAMPING, SOF_TIMESTAMPING_*_SOFTWARE)
    KERNEL = 2
    #: NIC hardware stamps (CQE completion timestamps, or SOF_TIMESTAMPING_RAW_HARDWARE)
    HW = 3


#: One probe result, as shipped from agents to the analyzer: (field, :mod:`struct` code, numpy
#: type), little-endian, packed as the engine's ``struct skh_record`` (csrc/engine.h).
PROBE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("src_ep", "I", "<u4"),  # prober endpoint id (cluster model)
    ("dst_ep", "I", "<u4"),  # responder endpoint id
    ("seq", "I", "<u4"),
    ("path_id", "H", "<u2"),  # flow label / UDP source-port index that pins the ECMP path
    ("status", "B", "u1"),  # ProbeStatus
    ("ts_source", "B", "u1"),  # TsSource
    ("t_wall_ns", "q", "<i8"),  # CLOCK_REALTIME (PTP-disciplined where present) at send
    ("rtt_ns", "q", "<i8"),  # network RTT (T5-T2)-(T4-T3); -1 unless status == OK
    ("responder_delay_ns", "q", "<i8"),  # T4-T3; -1 when unknown
    ("prober_delay_ns", "q", "<i8"),  # (T6-T1)-(T5-T2); -1 when unknown
)
#: one record as a :class:`struct.Struct` (``iter_unpack`` gives a tuple per record)
PROBE_STRUCT = struct.Struct("<" + "".join(code for _, code, _ in PROBE_FIELDS))
PROBE_RECORD_SIZE = PROBE_STRUCT.size
