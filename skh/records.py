"""Columnar record layouts shared by the engine, the wire protocol, the simulator and the analyzer.

These dtypes are the contract between layers: the agent turns the engine's ring records into
``PROBE_DTYPE`` rows (endpoint ids instead of engine-local target ids), the simulator produces the
same rows directly, and the analyzer consumes them without caring where they came from.
Everything is little-endian and fixed-size so a batch travels as raw bytes.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = [
    "ProbeStatus",
    "LOSS_STATUSES",
    "PATH_STATUSES",
    "is_loss",
    "TsSource",
    "PROBE_DTYPE",
    "COUNTER_DTYPE",
    "empty_probes",
    "empty_counters",
    "pair_keys",
    "split_pair_keys",
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


def is_loss(status: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows of ``status`` that are network loss (any direction)."""
    return np.isin(status, np.array(LOSS_STATUSES, np.uint8))


class TsSource(IntEnum):
    """Which clock produced the T2..T5 stamps of a record. Values of two sources never mix."""

    NONE = 0
    #: user-space CLOCK_MONOTONIC reads around the send/receive calls
    USER = 1
    #: kernel software stamps (SO_TIMESTAMPING, SOF_TIMESTAMPING_*_SOFTWARE)
    KERNEL = 2
    #: NIC hardware stamps (CQE completion timestamps, or SOF_TIMESTAMPING_RAW_HARDWARE)
    HW = 3


#: One probe result, as shipped from agents to the analyzer.
PROBE_DTYPE = np.dtype(
    [
        ("src_ep", "<u4"),  # prober endpoint id (cluster model)
        ("dst_ep", "<u4"),  # responder endpoint id
        ("seq", "<u4"),
        ("path_id", "<u2"),  # flow label / UDP source-port index that pins the ECMP path
        ("status", "u1"),  # ProbeStatus
        ("ts_source", "u1"),  # TsSource
        ("t_wall_ns", "<i8"),  # CLOCK_REALTIME (PTP-disciplined where present) at send
        ("rtt_ns", "<i8"),  # network RTT (T5-T2)-(T4-T3); -1 unless status == OK
        ("responder_delay_ns", "<i8"),  # T4-T3; -1 when unknown
        ("prober_delay_ns", "<i8"),  # (T6-T1)-(T5-T2); -1 when unknown
    ]
)

#: One 1 Hz counter sample of an endpoint's VF/representor (input of skeleton inference).
COUNTER_DTYPE = np.dtype(
    [
        ("ep", "<u4"),
        ("oper_up", "u1"),
        ("_pad", "u1", (3,)),
        ("t_ns", "<i8"),  # CLOCK_REALTIME of the sample
        ("tx_bytes", "<u8"),
        ("rx_bytes", "<u8"),
        ("tx_dropped", "<u8"),
        ("rx_dropped", "<u8"),
    ]
)


def empty_probes(n: int = 0) -> np.ndarray:
    """A zeroed probe batch of ``n`` rows (``rtt_ns`` and delays set to -1)."""
    out = np.zeros(n, dtype=PROBE_DTYPE)
    out["rtt_ns"] = -1
    out["responder_delay_ns"] = -1
    out["prober_delay_ns"] = -1
    return out


def empty_counters(n: int = 0) -> np.ndarray:
    """A zeroed counter batch of ``n`` rows."""
    return np.zeros(n, dtype=COUNTER_DTYPE)


def pair_keys(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One ``uint64`` per ordered endpoint pair, ``src << 32 | dst``: pairs sort, search and
    set-combine as plain integers."""
    return (np.asarray(src).astype(np.uint64) << np.uint64(32)) | np.asarray(dst).astype(np.uint64)


def split_pair_keys(keys: np.ndarray) -> np.ndarray:
    """The ``(n, 2)`` ``uint32`` (src, dst) pairs of :func:`pair_keys`."""
    keys = np.asarray(keys, np.uint64)
    return np.stack([keys >> np.uint64(32), keys & np.uint64(0xFFFFFFFF)], axis=1).astype(np.uint32)
