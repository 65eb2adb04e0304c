"""Endpoint health: rule out the agents before blaming the network.

A pair's probes travel prober agent → network → responder agent → network → prober agent. When
either agent is dead or slow, the pair looks broken although the network is fine. Per endpoint
this module tracks:

- **heartbeat**: the last heartbeat (from the orchestrator). An endpoint that has sent heartbeats
  and misses them for ``heartbeat_timeout_s`` is *dead*. Already after ``heartbeat_overdue_s``
  (one missed beat) its pairs' network verdicts are held back, without an alert of its own: a
  crashed container's probes fail within a second, before a timeout could confirm the death,
  and blaming the network for that second would be wrong. An endpoint whose heartbeats come
  back overdue (``heartbeat_overdue_s`` past its own usual gap: an agent that ships every 2 s
  is not late every time) ``late_beats`` times within ``late_beats_window_s`` is a *late
  agent*: alive, but stuck again and again (CPU-starved, throttled, paging). A benign host
  stall or an agent restart is one overdue beat, and those are rare enough that three in half
  a minute are not benign. Its delays need not show it: a wire-stamped endpoint's engine tick
  (5 ms) hides a late agent's 2 ms, and before this check the simulator's late agents were
  found only by the loss their late answers left, never named end to end (0 of 5 on the full
  profile).
- **progress**: the newest send time of the probes it reported as a prober. An endpoint whose
  results stop arriving for ``late_after_s`` while others' do is *late* (its agent, host or
  uplink to the analyzer is stuck); its windows are then incomplete, never "lossy".
- **refused**: probes to it answered ``REFUSED``: the network delivered them and its host said
  nobody listens: the agent there is gone.
- **delays**: prober delay ``(T6-T1)-(T5-T2)`` when it probes and responder delay ``T4-T3``
  when it answers. Each batch's *median* delay well above a slow average (``delay_factor``
  times and by at least ``delay_floor_us``), in every batch for ``delay_persist_s``, means an
  overloaded host, whose user-space stamps inflate RTTs. The median and the persistence keep
  benign stalls out: a host that stalls for a moment (a page-fault storm, a lock) answers a
  few probes late and is fine again, while a late agent is late on every probe. An endpoint
  whose records are stamped on the wire (kernel or NIC stamps) runs its engine on a tick
  (``agent.engine_tick_s``) and answers and reads up to a tick late on every probe by design, so
  its rises must also exceed ``delay_tick_us``: one sample a second (the latency sample the
  agents forward) wanders over the whole tick, and a baseline learnt from a low one would
  read every later one as a rise.

Endpoints retired by the orchestrator (a container stopped on purpose) are forgotten, so churn
never reads as a dead agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag

import numpy as np

from skh.errors import ConfigError
from skh.policy import ENGINE_TICK_S

__all__ = ["HealthConfig", "HealthReason", "ALERTING", "EndpointHealth"]


class HealthReason(IntFlag):
    OK = 0
    MISSED_HEARTBEATS = 1
    LATE_RESULTS = 2
    REFUSED = 4
    PROBER_DELAY = 8
    RESPONDER_DELAY = 16
    #: one heartbeat missed: hold verdicts, do not alert yet
    HEARTBEAT_OVERDUE = 32
    #: heartbeats overdue again and again, each time coming back: alive but late
    LATE_HEARTBEATS = 64


#: reasons that are an alert of their own; the others (late results, one missed heartbeat) only
#: hold back the network verdicts of the endpoint's pairs
ALERTING = (
    HealthReason.MISSED_HEARTBEATS
    | HealthReason.REFUSED
    | HealthReason.PROBER_DELAY
    | HealthReason.RESPONDER_DELAY
    | HealthReason.LATE_HEARTBEATS
)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    heartbeat_overdue_s: float = 1.5
    #: longer than a benign host stall lasts (multi-second freezes from reclaim or a lock are
    #: not rare on busy GPU hosts; the field regime's reach 5 s): a frozen agent is silent as a
    #: dead one, and its pairs' verdicts are already withheld from ``heartbeat_overdue_s``
    heartbeat_timeout_s: float = 6.0
    late_after_s: float = 5.0
    #: this many heartbeats each overdue (``heartbeat_overdue_s`` past the agent's usual gap
    #: after the one before), all within ``late_beats_window_s``, make a late agent: alive,
    #: but late again and again
    late_beats: int = 3
    late_beats_window_s: float = 30.0
    #: a REFUSED reply marks the responder unhealthy for this long
    refused_hold_s: float = 10.0
    delay_factor: float = 3.0
    delay_floor_us: float = 50.0
    #: the agents' engine tick (``agent.engine_tick_s``): how far a wire-stamped endpoint's
    #: delays wander on their own; its rises must exceed the floor and this
    delay_tick_us: float = ENGINE_TICK_S * 1e6
    #: EWMA weight per batch of the slow delay average (the baseline)
    delay_slow_alpha: float = 0.01
    #: a delay rise alerts once it has lasted this long
    delay_persist_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_overdue_s <= self.heartbeat_timeout_s:
            raise ConfigError(
                "The 'heartbeat_overdue_s' parameter of HealthConfig "
                "must be in (0, heartbeat_timeout_s]. "
                f"Got {self.heartbeat_overdue_s!r} instead."
            )
        if not (isinstance(self.late_beats, int) and self.late_beats >= 1):
            raise ConfigError(
                "The 'late_beats' parameter of HealthConfig must be an int >= 1. "
                f"Got {self.late_beats!r} instead."
            )
        for name in (
            "heartbeat_timeout_s",
            "late_beats_window_s",
            "late_after_s",
            "refused_hold_s",
            "delay_factor",
            "delay_persist_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"The '{name}' parameter of HealthConfig must be > 0. "
                    f"Got {getattr(self, name)!r} instead."
                )
        if not self.delay_tick_us >= 0:
            raise ConfigError(
                "The 'delay_tick_us' parameter of HealthConfig must be >= 0. "
                f"Got {self.delay_tick_us!r} instead."
            )
        if not 0 < self.delay_slow_alpha <= 1:
            raise ConfigError(
                "The 'delay_slow_alpha' parameter of HealthConfig must be in (0, 1]. "
                f"Got {self.delay_slow_alpha!r} instead."
            )


_NEVER = np.iinfo(np.int64).min


class EndpointHealth:
    """Health of every endpoint id seen, in arrays indexed by endpoint id (the cluster model's
    dense ids; about 60 bytes per id)."""

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self._dtype = np.dtype(
            [
                ("heartbeat_ns", "<i8"),
                ("progress_ns", "<i8"),
                ("refused_ns", "<i8"),
                ("retired", "?"),
                ("pd_slow", "<f8"),
                ("rd_slow", "<f8"),
                ("pd_rise_ns", "<i8"),  # since when every batch's median has been up (or never)
                ("rd_rise_ns", "<i8"),
                ("beat_gap_ns", "<f8"),  # its usual heartbeat gap (an average; nan: none yet)
                # when its newest ``late_beats`` overdue heartbeats came, oldest first
                ("late_beat_ns", "<i8", (config.late_beats,)),
            ]
        )
        self._blank = np.zeros(1, self._dtype)
        for f in (
            "heartbeat_ns",
            "progress_ns",
            "refused_ns",
            "pd_rise_ns",
            "rd_rise_ns",
            "late_beat_ns",
        ):
            self._blank[f] = _NEVER
        for f in ("pd_slow", "rd_slow", "beat_gap_ns"):
            self._blank[f] = np.nan
        self.state = np.repeat(self._blank, 0)

    @property
    def n_endpoints(self) -> int:
        return len(self.state)

    def ensure(self, max_ep: int) -> None:
        if max_ep < len(self.state):
            return
        grown = np.repeat(self._blank, max(max_ep + 1, 2 * len(self.state)))
        grown[: len(self.state)] = self.state
        self.state = grown

    def heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        if eps.size == 0:
            return
        self.ensure(int(eps.max()))
        eps = np.unique(eps)
        s = self.state
        last = s["heartbeat_ns"][eps]
        gap = np.where(last != _NEVER, t_ns - last, 0).astype(np.float64)
        usual = s["beat_gap_ns"][eps]
        # overdue past the agent's own cadence (an agent that ships every 2 s is not late
        # every time); the usual gap does not learn the late ones it is meant to tell apart
        overdue = gap > usual + self.config.heartbeat_overdue_s * 1e9
        learn = (gap > 0) & ~overdue
        s["beat_gap_ns"][eps[learn]] = np.where(
            np.isnan(usual[learn]), gap[learn], usual[learn] + 0.1 * (gap[learn] - usual[learn])
        )
        if overdue.any():
            late = eps[overdue]
            ring = s["late_beat_ns"][late]
            s["late_beat_ns"][late] = np.c_[ring[:, 1:], np.full(late.size, t_ns)]
        s["heartbeat_ns"][eps] = np.maximum(last, t_ns)

    def retire(self, eps: np.ndarray) -> None:
        self.ensure(int(eps.max(initial=0)))
        self.state[eps] = self._blank
        self.state["retired"][eps] = True

    def forget(self, eps: np.ndarray) -> None:
        """Ids given to new endpoints: back to nothing known (not retired)."""
        self.ensure(int(eps.max(initial=0)))
        self.state[eps] = self._blank

    def is_retired(self, eps: np.ndarray) -> np.ndarray:
        out = np.zeros(eps.size, bool)
        known = eps < len(self.state)
        out[known] = self.state["retired"][eps[known]]
        return out

    def observe(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        t_ns: np.ndarray,
        status: np.ndarray,
        prober_delay_ns: np.ndarray,
        responder_delay_ns: np.ndarray,
        refused_code: int,
        wire_stamped: np.ndarray,
    ) -> None:
        """Fold one batch in (after de-duplication); ``wire_stamped``: per record, whether its
        stamps were taken on the wire (its engines tick)."""
        if len(src) == 0:
            return
        self.ensure(int(max(src.max(), dst.max())))
        s = self.state
        order = np.argsort(src, kind="stable")
        ss = src[order]
        starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
        ep = ss[starts]
        s["progress_ns"][ep] = np.maximum(
            s["progress_ns"][ep], np.maximum.reduceat(t_ns[order], starts)
        )
        refused = status == refused_code
        if refused.any():
            np.maximum.at(s["refused_ns"], dst[refused], t_ns[refused])
        cfg = self.config
        t_now = int(t_ns.max())
        for who, delay, slow, rise in (
            (src, prober_delay_ns, "pd_slow", "pd_rise_ns"),
            (dst, responder_delay_ns, "rd_slow", "rd_rise_ns"),
        ):
            ok = delay >= 0
            if not ok.any():
                continue
            eps, med_us, ticks = _median_by(who[ok], delay[ok] / 1e3, wire_stamped[ok])
            s_cur = s[slow][eps]
            floor_us = cfg.delay_floor_us + np.where(ticks, cfg.delay_tick_us, 0.0)
            with np.errstate(invalid="ignore"):
                high = (med_us > cfg.delay_factor * s_cur) & (med_us - s_cur > floor_us)
            # the baseline does not learn a rise it is meant to detect
            s[slow][eps] = np.where(
                np.isnan(s_cur),
                med_us,
                np.where(high, s_cur, s_cur + cfg.delay_slow_alpha * (med_us - s_cur)),
            )
            r = s[rise][eps]
            s[rise][eps] = np.where(high, np.where(r == _NEVER, t_now, r), _NEVER)

    def evaluate(self, now_ns: int) -> np.ndarray:
        """``HealthReason`` bits per endpoint id (0: healthy or unknown)."""
        cfg = self.config
        s = self.state
        reasons = np.zeros(len(s), np.int64)
        live = ~s["retired"]
        hb = s["heartbeat_ns"]
        known = live & (hb != _NEVER)
        reasons |= np.where(
            known & (hb < now_ns - int(cfg.heartbeat_timeout_s * 1e9)),
            int(HealthReason.MISSED_HEARTBEATS),
            0,
        )
        reasons |= np.where(
            known & (hb < now_ns - int(cfg.heartbeat_overdue_s * 1e9)),
            int(HealthReason.HEARTBEAT_OVERDUE),
            0,
        )
        # the oldest of the newest few overdue beats: a host stall or an agent restart is one
        lb = s["late_beat_ns"][:, 0]
        reasons |= np.where(
            live & (lb != _NEVER) & (lb >= now_ns - int(cfg.late_beats_window_s * 1e9)),
            int(HealthReason.LATE_HEARTBEATS),
            0,
        )
        pr = s["progress_ns"]
        reasons |= np.where(
            live & (pr != _NEVER) & (pr < now_ns - int(cfg.late_after_s * 1e9)),
            int(HealthReason.LATE_RESULTS),
            0,
        )
        rf = s["refused_ns"]
        reasons |= np.where(
            live & (rf != _NEVER) & (rf >= now_ns - int(cfg.refused_hold_s * 1e9)),
            int(HealthReason.REFUSED),
            0,
        )
        persist = int(cfg.delay_persist_s * 1e9)
        for rise, bit in (
            ("pd_rise_ns", HealthReason.PROBER_DELAY),
            ("rd_rise_ns", HealthReason.RESPONDER_DELAY),
        ):
            r = s[rise]
            lasted = (r != _NEVER) & (r <= now_ns - persist)
            reasons |= np.where(live & lasted, int(bit), 0)
        return reasons


def _median_by(
    key: np.ndarray, v: np.ndarray, flag: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique keys, the median of ``v`` per key (the lower one of an even count), whether any
    ``flag`` of the key is set)."""
    order = np.lexsort((v, key))
    k, vs = key[order], v[order]
    start = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    cnt = np.diff(np.r_[start, k.size])
    return k[start], vs[start + (cnt - 1) // 2], np.logical_or.reduceat(flag[order], start)
