"""Columnar record layouts shared by the engine, the wire protocol, the simulator and the analyzer.

These dtypes are the contract between layers: the agent turns the engine's ring records into
``PROBE_DTYPE`` rows (endpoint ids instead of engine-local target ids), the simulator produces the
same rows directly, and the analyzer consumes them without caring where they came from.
Everything is little-endian and fixed-size so a batch travels as raw bytes.
"""

from __future__ import annotations

import numpy as np

from skh.layout import LOSS_STATUSES, PATH_STATUSES, PROBE_FIELDS, ProbeStatus, TsSource

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


def is_loss(status: np.ndarray) -> np.ndarray:
    """Boolean mask of the rows of ``status`` that are network loss (any direction)."""
    return np.isin(status, np.array(LOSS_STATUSES, np.uint8))


#: One probe result, as shipped from agents to the analyzer (:data:`skh.layout.PROBE_FIELDS`).
PROBE_DTYPE = np.dtype([(name, np_type) for name, _, np_type in PROBE_FIELDS])

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
