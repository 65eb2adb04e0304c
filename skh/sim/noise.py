"""Benign noise: what a healthy production fabric does to probes, and the named regimes that set it.

A :class:`NoiseRegime` holds every noise knob with its magnitude; :data:`REGIMES` names the
regimes (``lab``: none, today's clean simulator; ``field``: the default of ``skh eval``;
``field-heavy``: a harsher one held out of all calibration). :attr:`NoiseRegime.sources` says,
per knob, where its magnitude comes from — a public measurement, the paper, or "assumed" where
nobody publishes one. :class:`NoiseModel` turns a regime into per-probe effects inside
:class:`skh.sim.scenario.Simulation` and counts what it produced (:meth:`NoiseModel.measured`),
so a run can print the noise it really had and a regime cannot quietly shrink.

Sources of benign noise (all seeded; draws keyed by (seed, second) like the rest of the simulator):

- **benign loss** per link and direction, log-normal over links with a share of bad links, so
  some paths lose far more than others; a probe crosses its path's links twice (request, reply)
  and is ``REQUEST_LOST`` or ``REPLY_LOST`` accordingly;
- **heavy-tailed RTT jitter**: the log-normal body of :class:`skh.sim.probes.ProbeModel`, plus
  exponential queueing blips and rare Pareto spikes;
- **host CPU stalls** (Poisson per host, log-normal lengths): a stalled prober sends nothing
  (its schedule moves on; a share of the probes right after the stall fail to be posted,
  ``LOCAL_ERROR``); a stalled responder answers late (responder delay grows) and, past the
  prober's timeout, not in time at all (``REPLY_LOST``);
- **clock steps** (NTP/chrony stepping a host's clock): every later send time the host stamps
  is off by the accumulated step;
- **benign congestion** on a ToR or spine: episodes of at most ``congestion_max_s`` adding at most
  ``congestion_max_ns`` to the pairs through the switch, started where a job is bursting (the
  jobs' own all-reduce), unlike fault 19 (congestion control off: sustained, ≥ +30 µs);
- **agent restarts** (a crash and supervisor restart, or a rolling upgrade): the container's
  agent is gone for a second or two — it sends nothing, answers nothing, misses heartbeats —
  and its prober numbers its probes from 0 again;
- **localization answers**: :attr:`NoiseRegime.answers`, an
  :class:`skh.sim.answers.AnswerNoise` (what the simulated agents answer localization:
  traceroute hops that never answer or are rate limited, host reports and flags missing or
  stale, flow-table dumps racing), with its own sources in :data:`skh.sim.answers.ANSWER_SOURCES`.

Container churn (jobs arriving and ending) is the evaluation profile's ``arrivals_per_min``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np
from scipy.special import ndtri

from skh.errors import ConfigError
from skh.sim.answers import FIELD_ANSWERS, QUIET, AnswerNoise
from skh.sim.topology import EndpointTable, FabricIndex, mix_hash, rng_for

__all__ = ["NoiseRegime", "REGIMES", "regime", "NoiseModel", "TRAIN_SEEDS"]

_DAY_S = 86400.0
_U64 = 1.0 / 2**64


@dataclass(frozen=True, slots=True)
class NoiseRegime:
    """Every benign-noise knob of the simulator (see the module doc); zeros switch a source off."""

    name: str
    summary: str = ""
    # -- benign loss, per link and direction (a probe crosses each link of its path twice)
    link_loss_median: float = 0.0
    #: log-normal sigma of the per-link rate over links
    link_loss_sigma: float = 0.0
    #: share of links that are bad (dirty optics, a marginal cable) and their rate multiplier
    bad_link_share: float = 0.0
    bad_link_factor: float = 1.0
    link_loss_max: float = 1e-3
    # -- RTT jitter
    #: log-normal sigma of a healthy RTT around its pair's base
    rtt_sigma: float = 0.05
    #: probability of an exponential queueing blip, and its mean
    blip_p: float = 0.0
    blip_mean_ns: float = 0.0
    #: probability of a Pareto spike, its scale (minimum), tail index and cap
    spike_p: float = 0.0
    spike_min_ns: float = 0.0
    spike_alpha: float = 1.5
    spike_max_ns: float = 0.0
    # -- host CPU stalls
    stalls_per_host_h: float = 0.0
    stall_median_s: float = 0.03
    stall_sigma: float = 1.3
    stall_max_s: float = 5.0
    #: the prober's timeout (the agent's ``probe_timeout_s``): a reply later than this is lost
    probe_timeout_s: float = 1.0
    #: share of the probes due in the 50 ms after a stall of over 100 ms that cannot be posted
    local_error_share: float = 0.0
    # -- clock steps
    clock_steps_per_host_day: float = 0.0
    clock_step_min_s: float = 0.001
    clock_step_max_s: float = 0.2
    # -- benign congestion
    congestion_per_switch_h: float = 0.0
    congestion_min_s: float = 1.0
    congestion_max_s: float = 10.0
    congestion_min_ns: float = 2_000.0
    congestion_max_ns: float = 10_000.0
    # -- agent restarts
    agent_restarts_per_container_day: float = 0.0
    agent_restart_min_s: float = 0.3
    agent_restart_max_s: float = 2.0
    #: what the simulated agents answer localization (skh.sim.answers reads it)
    answers: AnswerNoise = QUIET
    #: knob -> where its magnitude comes from
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and (not math.isfinite(v) or v < 0):
                raise ConfigError(
                    f"The '{f.name}' knob of NoiseRegime must be finite and >= 0. Got {v!r}."
                )
        for nm in (
            "link_loss_median",
            "link_loss_max",
            "bad_link_share",
            "blip_p",
            "spike_p",
            "local_error_share",
        ):
            if getattr(self, nm) > 1.0:
                raise ConfigError(f"The '{nm}' knob of NoiseRegime must be in [0, 1].")
        if not self.rtt_sigma < 1 or self.bad_link_factor < 1 or self.spike_alpha <= 0:
            raise ConfigError(
                "NoiseRegime needs rtt_sigma < 1, bad_link_factor >= 1 and spike_alpha > 0."
            )
        for lo, hi in (
            ("clock_step_min_s", "clock_step_max_s"),
            ("congestion_min_s", "congestion_max_s"),
            ("congestion_min_ns", "congestion_max_ns"),
            ("agent_restart_min_s", "agent_restart_max_s"),
        ):
            if getattr(self, lo) > getattr(self, hi):
                raise ConfigError(f"NoiseRegime: {lo} must be <= {hi}.")
        if self.probe_timeout_s <= 0:
            raise ConfigError("NoiseRegime: probe_timeout_s must be > 0.")

    @property
    def quiet(self) -> bool:
        """True when the regime adds nothing to the probes (the jitter body aside)."""
        return not (
            self.link_loss_median
            or self.blip_p
            or self.spike_p
            or self.stalls_per_host_h
            or self.clock_steps_per_host_day
            or self.congestion_per_switch_h
            or self.agent_restarts_per_container_day
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def scaled(self, name: str, factor: float, summary: str = "") -> NoiseRegime:
        """A harsher (or milder) copy: every rate and magnitude of noise times ``factor``."""
        f = float(factor)
        return replace(
            self,
            name=name,
            summary=summary or f"{self.name} with every noise rate and magnitude x{f:g}",
            link_loss_median=min(self.link_loss_median * f, 1.0),
            link_loss_max=min(self.link_loss_max * f, 1.0),
            bad_link_share=min(self.bad_link_share * f, 1.0),
            blip_p=min(self.blip_p * f, 1.0),
            spike_p=min(self.spike_p * f, 1.0),
            stalls_per_host_h=self.stalls_per_host_h * f,
            clock_steps_per_host_day=self.clock_steps_per_host_day * f,
            congestion_per_switch_h=self.congestion_per_switch_h * f,
            agent_restarts_per_container_day=self.agent_restarts_per_container_day * f,
            answers=self.answers.scaled(name, f),
        )


_FIELD_SOURCES = {
    "link_loss_median": "Pingmesh (Guo et al., SIGCOMM 2015): typical data-center drop rate 1e-5 "
    "to 1e-4 per packet; 1.5e-5 per link and direction gives about 2e-4 per probe over a "
    "4-link path (request + reply), at the upper end of that range",
    "link_loss_sigma": "assumed: links differ (Pingmesh compares drop rates of NIC and ToR "
    "segments); sigma 1 spreads per-link rates over about a decade",
    "bad_link_share": "assumed: 1% of links bad (dirty optics, marginal cables) at 20x, which "
    "puts a few paths near the issue's 1e-3 per-probe upper end",
    "rtt_sigma": "the simulator's RTT anchor (12-16 us, SkeletonHunter sample records); 6% body",
    "blip_p": "assumed: 2% of probes meet a queue (a few us, exponential), as PFC/ECN fabrics "
    "under training bursts do",
    "spike_p": "assumed: 1e-3 of probes see a Pareto(1.5) spike from 5 us up to 500 us (host "
    "interrupts, PCIe stalls); our own engine on a loaded 2-core host measured p99 5-8x the "
    "median (bench/probe_overhead.py)",
    "stalls_per_host_h": "assumed: R-Pingmesh's authors name CPU overload and Linux locks as "
    "false-positive sources but publish no rates; 6 stalls per host-hour, median 30 ms, sigma "
    "1.3 (about 0.4% exceed the 1 s probe timeout)",
    "clock_steps_per_host_day": "assumed: one NTP/chrony step per host-day, 1-200 ms "
    "log-uniform (chrony's makestep threshold is 1 s; ntpd steps above 128 ms)",
    "congestion_per_switch_h": "the issue's bound: episodes <= 10 s, <= +10 us, started where a "
    "job bursts; 1 per switch-hour assumed",
    "agent_restarts_per_container_day": "the paper: 20+ online agent updates in 10 months "
    "(~0.07 restarts/agent-day); 0.5 per container-day adds crash-restarts; down 0.3-2 s",
    "answers": "skh.sim.answers.ANSWER_SOURCES, knob by knob",
}

#: the named regimes (see the module doc)
REGIMES: dict[str, NoiseRegime] = {}


def _register(r: NoiseRegime) -> NoiseRegime:
    REGIMES[r.name] = r
    return r


LAB = _register(
    NoiseRegime(
        "lab",
        "no benign noise: loss 0, jitter a 5% log-normal body only (the simulator before the "
        "field regimes)",
        sources={"rtt_sigma": "the simulator's original body"},
    )
)
FIELD = _register(
    NoiseRegime(
        "field",
        "a production fabric on a quiet day: benign loss ~2e-4 per probe with bad links, "
        "heavy-tailed jitter, CPU stalls, clock steps, short congestion episodes, agent "
        "restarts, noisy traceroutes and host reports",
        link_loss_median=1.5e-5,
        link_loss_sigma=1.0,
        bad_link_share=0.01,
        bad_link_factor=20.0,
        link_loss_max=1e-3,
        rtt_sigma=0.06,
        blip_p=0.02,
        blip_mean_ns=1_500.0,
        spike_p=1e-3,
        spike_min_ns=5_000.0,
        spike_alpha=1.5,
        spike_max_ns=500_000.0,
        stalls_per_host_h=6.0,
        stall_median_s=0.03,
        stall_sigma=1.3,
        stall_max_s=5.0,
        probe_timeout_s=1.0,
        local_error_share=0.2,
        clock_steps_per_host_day=1.0,
        clock_step_min_s=0.001,
        clock_step_max_s=0.2,
        congestion_per_switch_h=1.0,
        congestion_min_s=1.0,
        congestion_max_s=10.0,
        congestion_min_ns=2_000.0,
        congestion_max_ns=10_000.0,
        agent_restarts_per_container_day=0.5,
        agent_restart_min_s=0.3,
        agent_restart_max_s=2.0,
        answers=FIELD_ANSWERS,
        sources=_FIELD_SOURCES,
    )
)
FIELD_HEAVY = _register(
    replace(
        FIELD.scaled(
            "field-heavy",
            3.0,
            "held out of all calibration: the field regime with every noise rate and "
            "magnitude x3 (benign loss ~6e-4 per probe, 18 stalls per host-hour, ...)",
        ),
        # magnitudes with a physical bound keep it: congestion episodes stay short and small
        # (a longer or larger one is fault 19), a probe's timeout is the agent's setting
        congestion_max_ns=FIELD.congestion_max_ns,
        congestion_max_s=FIELD.congestion_max_s,
        sources=_FIELD_SOURCES,
    )
)

#: seeds the detector's thresholds were chosen on (regime ``field``); evaluations draw others
TRAIN_SEEDS: tuple[int, ...] = (101, 102, 103)


def regime(name: str | NoiseRegime | None) -> NoiseRegime:
    """A regime by name (None: ``lab``, the plain simulator)."""
    if isinstance(name, NoiseRegime):
        return name
    if name is None:
        return LAB
    try:
        return REGIMES[name]
    except KeyError:
        raise ConfigError(
            f"The 'noise' parameter must be one of {sorted(REGIMES)}. Got {name!r} instead."
        ) from None


# --------------------------------------------------------------------------------------- model


@dataclass(slots=True)
class _Ledger:
    """What the noise model produced (sums; :meth:`NoiseModel.measured` turns them into rates)."""

    probes: int = 0
    seconds: int = 0
    req_lost: int = 0
    rep_lost: int = 0
    blips: int = 0
    spikes: int = 0
    rtt_ratio: list = field(default_factory=list)  # healthy RTT / base, subsampled
    stalls: int = 0
    stall_s: list = field(default_factory=list)
    stall_skipped: int = 0
    stall_late_replies: int = 0
    stall_timeouts: int = 0
    local_errors: int = 0
    clock_steps: int = 0
    clock_step_abs_s: list = field(default_factory=list)
    congestion: int = 0
    congestion_s: list = field(default_factory=list)
    congestion_us: list = field(default_factory=list)
    congestion_rows: int = 0
    restarts: int = 0
    restart_s: list = field(default_factory=list)
    restart_lost: int = 0


class NoiseModel:
    """A regime applied to one simulation: per-flow benign loss, stall/step/congestion/restart
    schedules drawn per second, and the ledger of what was produced."""

    def __init__(
        self, regime_: NoiseRegime, index: FabricIndex, eps: EndpointTable, seed: int
    ) -> None:
        self.regime = regime_
        self.index = index
        self.eps = eps
        self.seed = int(seed)
        self.ledger = _Ledger()
        n_host = len(index.host_names)
        self.clock_offset_s = np.zeros(n_host)
        #: active episodes: (host, start, end) stalls; (switch, start, end, extra_ns) congestion;
        #: (container, start, end) agent restarts
        self.stalls: list[tuple[int, float, float]] = []
        self.congestion: list[tuple[int, float, float, float]] = []
        self.restarts: list[tuple[int, float, float]] = []
        self._switch_rows: dict[int, np.ndarray] = {}

    # -- per-link loss -------------------------------------------------------------------------
    def link_loss(self, a: np.ndarray, b: np.ndarray, kind: int) -> np.ndarray:
        """Per-direction loss of links keyed by two ids (``kind`` separates access links, keyed
        by RNIC, from switch links, keyed by switch ids); the same both ways."""
        r = self.regime
        if r.link_loss_median <= 0:
            return np.zeros(np.broadcast(a, b).shape)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        u = mix_hash(lo, hi, np.uint64(kind), np.uint64(self.seed), np.uint64(0x1055))
        z = ndtri(np.clip((u >> np.uint64(11)).astype(np.float64) / 2**53, 1e-12, 1 - 1e-12))
        p = r.link_loss_median * np.exp(r.link_loss_sigma * z)
        bad = (mix_hash(u, np.uint64(7)).astype(np.float64) * _U64) < r.bad_link_share
        p = np.where(bad, p * r.bad_link_factor, p)
        return np.minimum(p, r.link_loss_max)

    def flow_loss(
        self, src_rnic: np.ndarray, dst_rnic: np.ndarray, nodes: np.ndarray
    ) -> np.ndarray:
        """One-way loss of each flow's path (``nodes``: route switch ids, -1 where unused)."""
        if self.regime.link_loss_median <= 0:
            return np.zeros(len(nodes))
        tor = self.index.rnic_tor
        keep = np.ones(len(nodes))
        keep *= 1.0 - self.link_loss(src_rnic, tor[src_rnic], 0)
        keep *= 1.0 - self.link_loss(dst_rnic, tor[dst_rnic], 0)
        for x, y in ((0, 1), (1, 2), (2, 3), (3, 4)):
            u, v = nodes[:, x], nodes[:, y]
            ok = (u >= 0) & (v >= 0) & (u != v)
            if ok.any():
                keep[ok] *= 1.0 - self.link_loss(u[ok], v[ok], 1)
        return 1.0 - keep

    # -- schedules ----------------------------------------------------------------------------
    def _poisson_starts(self, tag: int, t: float, rate_per_s: float, n: int, rng=None):
        """(ids in range(n), start times in [t, t + 1)) of a Poisson process per id."""
        if rate_per_s <= 0 or n == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        g = rng or rng_for(self.seed, tag, int(t))
        k = int(g.poisson(rate_per_s * n))
        if k == 0:
            return np.zeros(0, np.int64), np.zeros(0)
        return g.integers(0, n, k), t + g.random(k)

    def advance(self, t: float, live_containers: np.ndarray) -> None:
        """Draw the episodes that start in ``[t, t + 1)`` and drop those that ended."""
        r = self.regime
        L = self.ledger
        L.seconds += 1
        horizon = t - max(r.stall_max_s, r.congestion_max_s, r.agent_restart_max_s) - 1.0
        self.stalls = [s for s in self.stalls if s[2] > horizon - 120]
        self.congestion = [c for c in self.congestion if c[2] > horizon]
        self.restarts = [x for x in self.restarts if x[2] > horizon - 120]
        n_host = len(self.index.host_names)
        g = rng_for(self.seed, 0x57A1, int(t))
        hosts, starts = self._poisson_starts(0, t, r.stalls_per_host_h / 3600.0, n_host, g)
        if hosts.size:
            d = np.minimum(
                r.stall_median_s * np.exp(r.stall_sigma * g.standard_normal(hosts.size)),
                r.stall_max_s,
            )
            for h, s, dd in zip(hosts.tolist(), starts.tolist(), d.tolist(), strict=True):
                self.stalls.append((h, s, s + dd))
                L.stalls += 1
                L.stall_s.append(dd)
        hosts, starts = self._poisson_starts(0, t, r.clock_steps_per_host_day / _DAY_S, n_host, g)
        if hosts.size:
            mag = np.exp(
                g.uniform(np.log(r.clock_step_min_s), np.log(r.clock_step_max_s), hosts.size)
            )
            step = mag * np.where(g.random(hosts.size) < 0.5, -1.0, 1.0)
            np.add.at(self.clock_offset_s, hosts, step)
            L.clock_steps += hosts.size
            L.clock_step_abs_s.extend(mag.tolist())
        if live_containers.size:
            idx, starts = self._poisson_starts(
                0, t, r.agent_restarts_per_container_day / _DAY_S, live_containers.size, g
            )
            if idx.size:
                d = g.uniform(r.agent_restart_min_s, r.agent_restart_max_s, idx.size)
                for c, s, dd in zip(
                    live_containers[idx].tolist(), starts.tolist(), d.tolist(), strict=True
                ):
                    self.restarts.append((c, s, s + dd))
                    L.restarts += 1
                    L.restart_s.append(dd)

    def start_congestion(self, t: float, bursting_rows: np.ndarray, nodes: np.ndarray) -> None:
        """Episodes starting this second on ToRs/spines that carry a bursting job's probed flow:
        ``bursting_rows`` index ``nodes`` (route switch ids of every probed flow). The fabric's
        episodes (``congestion_per_switch_h`` times its switches) go to those switches
        uniformly, so each sees about its share: picking a bursting flow first and then a
        switch on it would pile them on the spines, which most flows cross (a spine had four
        episodes in 50 s, chaining into a 24 s one)."""
        r = self.regime
        if r.congestion_per_switch_h <= 0 or bursting_rows.size == 0:
            return
        g = rng_for(self.seed, 0xC0B6, int(t))
        n_sw = len(self.index.switch_names)
        k = int(g.poisson(r.congestion_per_switch_h / 3600.0 * n_sw))
        if k == 0:
            return
        on = nodes[bursting_rows]
        cand = np.unique(on[on >= 0])
        busy = {c[0] for c in self.congestion if c[2] > t}
        for _ in range(k):
            sw = int(cand[int(g.integers(cand.size))])
            d = float(g.uniform(r.congestion_min_s, r.congestion_max_s))
            x = float(g.uniform(r.congestion_min_ns, r.congestion_max_ns))
            if sw in busy:
                continue  # one episode per switch at a time: a longer one would be a fault
            busy.add(sw)
            s = t + float(g.random())
            self.congestion.append((sw, s, s + d, x))
            L = self.ledger
            L.congestion += 1
            L.congestion_s.append(d)
            L.congestion_us.append(x / 1e3)

    def switch_flows(self, sw: int, nodes: np.ndarray) -> np.ndarray:
        m = self._switch_rows.get(sw)
        if m is None:
            m = self._switch_rows[sw] = (nodes == sw).any(axis=1)
        return m

    def forget_flows(self) -> None:
        """The probed flows changed: per-switch flow masks are stale."""
        self._switch_rows.clear()

    # -- jitter -------------------------------------------------------------------------------
    def tail_ns(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Blips and spikes added to ``n`` healthy network RTTs."""
        r = self.regime
        out = np.zeros(n)
        if r.blip_p > 0:
            b = rng.random(n) < r.blip_p
            out[b] += rng.exponential(r.blip_mean_ns, int(b.sum()))
            self.ledger.blips += int(b.sum())
        if r.spike_p > 0:
            s = rng.random(n) < r.spike_p
            k = int(s.sum())
            if k:
                u = rng.random(k)
                out[s] += np.minimum(r.spike_min_ns * u ** (-1.0 / r.spike_alpha), r.spike_max_ns)
                self.ledger.spikes += k
        return out

    # -- report ----------------------------------------------------------------------------------
    def measured(self) -> dict[str, Any]:
        """The noise this simulation really produced (rates and quantiles)."""
        L = self.ledger
        n = max(L.probes, 1)

        def q(v: list, ps=(50, 99, 100)) -> dict[str, float] | None:
            if not v:
                return None
            a = np.asarray(v, float)
            return {f"p{p}": round(float(np.percentile(a, p)), 6) for p in ps}

        rr = np.asarray(L.rtt_ratio, float)
        jit = (
            {f"p{p}": round(float(np.percentile(rr, p)), 4) for p in (50, 90, 99, 99.9, 99.99)}
            | {"max": round(float(rr.max()), 3), "samples": int(rr.size)}
            if rr.size
            else None
        )
        return {
            "regime": self.regime.name,
            "probes": L.probes,
            "benign_loss_per_probe": round((L.req_lost + L.rep_lost) / n, 7),
            "request_lost": L.req_lost,
            "reply_lost": L.rep_lost,
            "rtt_over_base": jit,
            "blip_share": round(L.blips / n, 5),
            "spike_share": round(L.spikes / n, 6),
            "cpu_stalls": L.stalls,
            "cpu_stall_s": q(L.stall_s),
            "stall_skipped_probes": L.stall_skipped,
            "stall_late_replies": L.stall_late_replies,
            "stall_timeouts": L.stall_timeouts,
            "local_errors": L.local_errors,
            "clock_steps": L.clock_steps,
            "clock_step_abs_s": q(L.clock_step_abs_s),
            "congestion_episodes": L.congestion,
            "congestion_s": q(L.congestion_s),
            "congestion_us": q(L.congestion_us),
            "congestion_probes": L.congestion_rows,
            "agent_restarts": L.restarts,
            "agent_restart_s": q(L.restart_s),
            "agent_restart_lost_probes": L.restart_lost,
            "hours": round(L.seconds / 3600.0, 3),
        }
