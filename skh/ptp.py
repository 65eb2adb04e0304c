"""PTP state of a host, from linuxptp's ``pmc``, for the optional one-way delay.

RTT never depends on any of this: each of its two differences is taken on one host's one clock.
A one-way delay (T3 - T2) compares two hosts' clocks, so it is reported only when both ends say
their clock is locked to a grandmaster, with the two reported offsets as its error bar.

Time scales: a PHC disciplined by ptp4l runs on TAI (the PTP timescale) while CLOCK_REALTIME is
UTC; ``currentUtcOffset`` (37 s since 2017) converts between them. NIC wall-clock stamps follow the
PHC, so they must be shifted by that offset before they are compared with CLOCK_REALTIME.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from skh.errors import CapabilityError, ConfigError

__all__ = [
    "PtpStatus",
    "OneWay",
    "query",
    "parse_pmc",
    "one_way_delays",
    "phc_to_utc_ns",
    "kernel_tai_offset_s",
]

log = logging.getLogger(__name__)

#: an offset from the grandmaster above this is not "locked" (ptp4l's servo holds tens of ns on
#: hardware stamps; microseconds mean it is still converging or on software stamps)
DEFAULT_MAX_OFFSET_NS = 1_000

_PMC_QUERIES = ("GET TIME_STATUS_NP", "GET TIME_PROPERTIES_DATA_SET", "GET PORT_DATA_SET")
_RESPONSE = re.compile(r"^\s*(\S+)-\d+ seq \d+ RESPONSE MANAGEMENT (\S+)\s*$")
_FIELD = re.compile(r"^\s+(\w+)\s+(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class PtpStatus:
    """What ptp4l reports about this host's clock."""

    #: the clock follows a grandmaster within ``max_offset_ns`` (or is the grandmaster)
    locked: bool
    #: why it is or is not locked, for humans
    reason: str
    #: ptp4l's master_offset (ns), None when unknown
    offset_ns: int | None = None
    gm_present: bool = False
    #: e.g. "SLAVE", "MASTER", "LISTENING", "UNCALIBRATED"; None when unknown
    port_state: str | None = None
    #: currentUtcOffset (TAI - UTC, s) when ptp4l says it is valid, else None
    utc_offset_s: int | None = None
    #: the clock runs on the PTP (TAI) timescale
    ptp_timescale: bool = False


@dataclass(frozen=True, slots=True)
class OneWay:
    """One-way delays on a common PTP time base, with the error bar that time base allows."""

    delay_ns: np.ndarray
    #: |offset of prober| + |offset of responder|: the delays are only known to within this
    error_ns: int


def _as_bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def parse_pmc(output: str, *, max_offset_ns: int = DEFAULT_MAX_OFFSET_NS) -> PtpStatus:
    """Turns ``pmc -u -b 0 'GET TIME_STATUS_NP' 'GET TIME_PROPERTIES_DATA_SET' 'GET
    PORT_DATA_SET'`` output into a :class:`PtpStatus`. Only answers of the local clock count
    (``-b 0``); no answer at all means no ptp4l."""
    sections: dict[str, dict[str, str]] = {}
    identities: dict[str, str] = {}
    current: dict[str, str] | None = None
    for line in output.splitlines():
        m = _RESPONSE.match(line)
        if m:
            identities[m.group(2)] = m.group(1)
            current = sections.setdefault(m.group(2), {})
            continue
        f = _FIELD.match(line)
        if f and current is not None:
            current[f.group(1)] = f.group(2)
        elif not line.startswith(("\t\t", "        ")):
            current = None
    ts = sections.get("TIME_STATUS_NP")
    if ts is None:
        return PtpStatus(
            locked=False, reason="no answer from ptp4l (not running, or no access to its socket)"
        )
    props = sections.get("TIME_PROPERTIES_DATA_SET", {})
    port = sections.get("PORT_DATA_SET", {})
    offset = int(ts["master_offset"]) if "master_offset" in ts else None
    gm_present = _as_bool(ts.get("gmPresent", "false"))
    state = port.get("portState")
    utc_valid = _as_bool(props.get("currentUtcOffsetValid", "0"))
    utc = int(props["currentUtcOffset"]) if utc_valid and "currentUtcOffset" in props else None
    common = dict(
        offset_ns=offset,
        gm_present=gm_present,
        port_state=state,
        utc_offset_s=utc,
        ptp_timescale=_as_bool(props.get("ptpTimescale", "0")),
    )
    own = identities.get("TIME_STATUS_NP", "")
    if state == "MASTER" and ts.get("gmIdentity") == own:
        return PtpStatus(locked=True, reason="this clock is the grandmaster", **common)
    if not gm_present:
        return PtpStatus(locked=False, reason="no grandmaster present", **common)
    if state != "SLAVE":
        return PtpStatus(
            locked=False, reason=f"port state {state or 'unknown'}, not SLAVE", **common
        )
    if offset is None or abs(offset) > max_offset_ns:
        return PtpStatus(
            locked=False, reason=f"offset {offset} ns exceeds {max_offset_ns} ns", **common
        )
    return PtpStatus(
        locked=True, reason=f"locked to {ts.get('gmIdentity', '?')}, offset {offset} ns", **common
    )


def query(
    *,
    uds_address: str | None = None,
    domain: int = 0,
    timeout_s: float = 2.0,
    max_offset_ns: int = DEFAULT_MAX_OFFSET_NS,
    pmc: str = "pmc",
) -> PtpStatus:
    """Asks the local ptp4l (over its UNIX socket) whether this host's clock is locked.
    Raises :class:`~skh.errors.CapabilityError` when linuxptp's ``pmc`` is not installed."""
    if timeout_s <= 0:
        raise ConfigError(
            f"The 'timeout_s' parameter of ptp.query must be > 0. Got {timeout_s!r} instead."
        )
    exe = shutil.which(pmc)
    if exe is None:
        raise CapabilityError(2, f"linuxptp's {pmc!r} is not installed (apt-get install linuxptp)")
    cmd = [exe, "-u", "-b", "0", "-d", str(domain)]
    if uds_address:
        cmd += ["-s", uds_address]
    try:
        out = subprocess.run(
            [*cmd, *_PMC_QUERIES], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return PtpStatus(locked=False, reason=f"pmc did not answer within {timeout_s} s")
    status = parse_pmc(out.stdout, max_offset_ns=max_offset_ns)
    log.debug("ptp: %s", status.reason)
    return status


def one_way_delays(
    t_send_ns: np.ndarray, t_recv_ns: np.ndarray, sender: PtpStatus, receiver: PtpStatus
) -> OneWay | None:
    """``t_recv - t_send`` when both clocks are locked to PTP, else None (never a guess).
    Both stamp arrays must already be on one time scale (see :func:`phc_to_utc_ns`)."""
    if not (sender.locked and receiver.locked):
        return None
    t_send = np.asarray(t_send_ns, dtype=np.int64)
    t_recv = np.asarray(t_recv_ns, dtype=np.int64)
    if t_send.shape != t_recv.shape:
        raise ConfigError(
            "one_way_delays needs stamp arrays of one shape."
            f" Got {t_send.shape} and {t_recv.shape}."
        )
    error = abs(sender.offset_ns or 0) + abs(receiver.offset_ns or 0)
    return OneWay(delay_ns=t_recv - t_send, error_ns=error)


def phc_to_utc_ns(phc_ns: np.ndarray | int, status: PtpStatus) -> np.ndarray:
    """NIC (PHC, TAI) wall-clock stamps on CLOCK_REALTIME's UTC scale."""
    if not status.ptp_timescale:
        # an ARB-timescale PHC is already whatever its master runs: nothing to shift
        return np.asarray(phc_ns, dtype=np.int64)
    if status.utc_offset_s is None:
        raise CapabilityError(
            61, "ptp4l reports the PTP timescale but no valid UTC offset"
        )  # ENODATA
    return np.asarray(phc_ns, dtype=np.int64) - np.int64(status.utc_offset_s) * 1_000_000_000


def kernel_tai_offset_s() -> int:
    """The kernel's TAI - UTC (set by phc2sys -w or ntpd); 0 when nobody set it."""
    return round(
        (time.clock_gettime_ns(time.CLOCK_TAI) - time.clock_gettime_ns(time.CLOCK_REALTIME)) / 1e9
    )
