"""The streaming detector: probe-result batches in, suspect events out.

API (what the analyzer daemon calls each round)::

    det = Detector(DetectorConfig())
    det.ingest(batch)            # PROBE_DTYPE rows, any order, duplicates and late rows allowed
    det.heartbeat(eps, t_ns)     # agents' heartbeats (endpoint ids: int or array) at t_ns
    det.retire(eps)              # containers stopped on purpose: forget them for good, never alert
    det.link_state(counters)     # COUNTER_DTYPE rows: each VF's oper state (and
    det.set_endpoint_containers(containers)  # which VFs share a container)
    events = det.tick(now_ns)    # -> list[SuspectEvent]
    det.open_incidents()         # -> (pairs, endpoints) whose incidents are still open

Two clocks decide (paper §5.2, ``shared/DESIGN.md`` §6):

- **Fast path** (:mod:`skh.analysis.fastpath`), evaluated on every tick: outages (runs of
  failures of a pair, of one of its flows, or of most of an endpoint's pairs, improbable under
  the pairs' own loss baselines) and loss (more failures than the baseline explains, for the
  pair, its endpoints or the endpoint groups set with :meth:`Detector.set_endpoint_groups`),
  with failures excused where the far end's host stalled or its agent restarted.
- **Windows**, closed by a watermark: ``now - allowed_lateness_s``. A 30 s window of a pair is
  summarised by seven features (:mod:`skh.analysis.features`); the window *slides* every
  ``hop_s`` (5 s) and each slide is scored by batched LOF (:mod:`skh.analysis.lof`) against the
  pair's look-back: the last ``lookback_windows`` (10 → 5 min) tumbling 30 s windows that do
  not overlap it, less those its latency incident covered (a shift that persists past the
  look-back thus becomes the new baseline about six minutes on, and the long-term test owns
  it from there). Windows hold one RTT per pair and ``latency_sample_s``
  (:mod:`skh.analysis.sampling`), so a pair probed ten times a second for the fast path's
  sake keeps the same windows. Every ``block_s`` (30 min) the long-term Z-test runs
  (:mod:`skh.analysis.longterm`) on the pairs that had no short-term incident in that block
  (a one-minute outage or shift lifts a block's mean too, and was raised when it happened).

Streaming rules:

- Pairs get dense ids on first sight; all per-pair state lives in numpy structured arrays with
  a fixed size per pair (a ring of ``samples_per_pair`` recent RTTs, the look-back features in
  float32, the cached LOF fit, the long-term block sums), so memory is bounded by the number
  of live pairs: about 1.9 KB per pair with the defaults (the RTT ring is 384 B, the float32
  look-back 352 B, the fast path's runs of up to 64 path ids 576 B), so 360K pairs take
  about 700 MB, plus about 60 B per endpoint id for
  health. Pairs silent for ``retire_idle_s`` or touching a retired endpoint are dropped.
- Duplicates: per pair, an anti-replay window over ``seq`` (the highest seq and a 64-bit map
  below it); rows 64 or more probes older than the newest are dropped as stale. A row that
  does not advance the seq but was sent after the pair's newest row is a restarted prober
  (its engine numbers from 0 again): the pair's window restarts from it (``stats.restarts``),
  while replays and duplicates, which carry their original send times, stay dropped (a row
  that advances the seq but was sent before the pair's newest is a replay too). Rows whose
  send time is behind the watermark are dropped as late (counted): a window, once closed, is
  never revised.
- A window is scored only when it is *complete*: its prober's results have advanced past its
  end. A late agent's windows are therefore skipped, not read as empty, and loss is only ever
  inferred from reported failures, so a late agent cannot fake a network failure.
- Endpoint health comes first (:mod:`skh.analysis.health`): a pair whose prober or responder
  is unhealthy is not a network suspect; its verdicts are withheld and the endpoint is
  reported as ``agent`` instead. What the probes cannot tell there, link state can
  (:mod:`skh.analysis.linkstate`): an endpoint whose VF link reads down while another VF of
  its container reads up raises ``unreachable`` on its withheld pairs, naming the endpoint.

A new pair is judged by LOF once it has ``min_lookback_windows`` complete windows (3 min);
until then its latency is held against the fleet (the established pairs' look-backs: only a
shift beyond what any of them reaches shows), and the fast path and endpoint health cover it
from its first probe.

Events are incidents: a pair raises a kind once, then stays active while the condition keeps
being seen and clears after ``clear_after_s`` without it (``latency-long`` after a block).

Defaults and why (the paper gives no numbers; chosen on the simulator's healthy traffic with
its 12–16 µs RTTs, σ = 0.05, and checked against its fault magnitudes, the smallest being a
+10 µs shift):

- ``lof_k = 5``: half the 10-window look-back, the usual "k near the smallest cluster size"
  choice; a larger k averages the density over most of a look-back this small, a smaller one
  lets a single noisy window decide.
- ``lof_threshold = 5.0``: over 524K healthy windows (48 hosts, same-rail pairs, 25 min) LOF
  had median 1.01, 99th percentile 1.78, 99.99th 3.29 and maximum 4.46, so 5 sits above all of
  them; the fault suite's latency events had worst pairs at LOF 30 to 380, and raising the
  threshold from 2 to 5 delayed none of its detections.
- ``min_shift_us = 2.0`` and ``min_shift_rel = 0.10``: the effect-size gate, because LOF is
  scale-free and a very quiet pair would otherwise alert on a sub-microsecond change. A
  window's p75 must exceed the highest p75 of its look-back by both. The paper's "10 µs hurts
  training by 20 %" puts real failures far above; the p75 of 30 healthy samples (σ about
  0.7 µs each) moves by about 0.2 µs. With both guards the healthy runs raised nothing.
- ``min_window_samples = 8``: percentiles of fewer samples are too noisy to compare.
- ``min_sustained_s = 20``: the shift must hold (the newest samples above the gate, two
  misses allowed, or the newest samples of one flow) for 20 s. The field regime
  (:mod:`skh.sim.noise`) has benign congestion episodes of up to 10 s on a switch, and two on
  switches of one path can follow each other; at 12 s those chains raised false latency
  events on the training seeds, at 20 s none. This costs time to detect: latency faults are
  seen after about 25 s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from skh.analysis.fastpath import FastPathConfig, FastPathState
from skh.analysis.features import N_FEATURES, window_features
from skh.analysis.health import ALERTING, EndpointHealth, HealthConfig, HealthReason
from skh.analysis.linkstate import LinkState, LinkStateConfig
from skh.analysis.lof import LofFit, fit_lof, score_lof
from skh.analysis.longterm import LongTermConfig, LongTermState
from skh.analysis.sampling import (
    LATENCY_PATHS,
    LATENCY_SAMPLE_S,
    SAMPLE_STATE,
    blank_sample_state,
    period_samples,
    sample_spacing_ns,
)
from skh.errors import ConfigError
from skh.records import COUNTER_DTYPE, PROBE_DTYPE, ProbeStatus, TsSource, is_loss, pair_keys

__all__ = ["KINDS", "DetectorConfig", "SuspectEvent", "DetectorStats", "Detector"]

log = logging.getLogger(__name__)

#: event kinds; the first four are network verdicts, ``agent`` blames an endpoint's agent/host
KINDS: tuple[str, ...] = ("unreachable", "loss", "latency-short", "latency-long", "agent")
_NET_KINDS = KINDS[:4]
_P75 = 2  # index of p75 in FEATURE_NAMES
_P50 = 1


@dataclass(frozen=True, slots=True)
class SuspectEvent:
    """One new incident. ``pairs`` are ``(src_ep, dst_ep)``; for network kinds ``scores`` align
    with ``pairs`` (unreachable/loss: failed probes; latency-short: LOF; latency-long: z). An
    ``agent`` event names its ``endpoints``, its ``scores`` align with them (``HealthReason``
    bits), and its ``pairs`` are the pair verdicts it withheld. An ``unreachable`` event from
    link state (:mod:`skh.analysis.linkstate`) names the ``endpoints`` whose VF link is down;
    its pairs are those the endpoints' agents could not judge."""

    kind: str
    pairs: tuple[tuple[int, int], ...]
    scores: tuple[float, ...]
    first_seen_ns: int
    detected_ns: int
    explanation: str
    endpoints: tuple[int, ...] = ()
    #: unreachable: the outage came back within ``fast.flap_window_s`` of the last one (a port
    #: flapping); such a pair's open incident is raised once more with this set
    flapping: bool = False


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    window_s: float = 30.0
    hop_s: float = 5.0
    lookback_windows: int = 10
    min_lookback_windows: int = 6
    #: a pair younger than that is held against its ToR peers: the established pairs between
    #: the same two endpoint groups (:meth:`Detector.set_endpoint_groups`, the first grouping:
    #: the ToRs), at least ``young_peer_min_pairs`` of them; its p75 must clear this quantile of
    #: their usual p75 (the median of each one's look-back: a congestion episode lifts one
    #: window) plus the effect floor. Pairs between the same two ToRs run the same hops, so
    #: their healthy RTTs differ by cables and queues only (about 1 us in the simulator)
    young_peer_min_pairs: int = 3
    young_peer_quantile: float = 0.9
    #: without such peers, against the fleet's pairs that run as many hops (at least this
    #: many established pairs: within one ToR, within one pod, or between pods, as
    #: :meth:`Detector.set_endpoint_pods` tells; the whole fleet when it was not called): its
    #: p75 must clear this quantile of their usual p75 (each look-back's median) by the largest
    #: effect floor among them. A path length too few established pairs run is held to large
    #: shifts only, above the fleet's highest usual p75
    young_fleet_min_pairs: int = 50
    young_fleet_quantile: float = 0.999
    #: ... and a large shift, held ``large_sustained_s`` or recurring, must clear it by this
    #: much: twice the margin over its own or its peers' p75, since the fleet's reach is no
    #: baseline of its own (repetitive flow offloading, +104 us for 5-11 s again and again on
    #: a new job's pair with no ToR peers, passed unseen; CI draw 277862802 + 930980059)
    young_fleet_large_shift_us: float = 60.0
    lof_k: int = 5
    lof_threshold: float = 5.0
    min_shift_us: float = 2.0
    min_shift_rel: float = 0.10
    min_window_samples: int = 8
    #: a latency shift must be sustained this long: the newest samples above the gate, with
    #: at most ``sustained_gaps`` below it, must span it. A benign congestion episode lasts up
    #: to 10 s on one switch, and two on switches of one path can follow each other; a fault
    #: lasts (chosen on the field regime's training seeds, skh.sim.noise.TRAIN_SEEDS)
    min_sustained_s: float = 20.0
    sustained_gaps: int = 2
    #: a shift this far above the look-back, more than benign congestion stacked on every
    #: switch of a path can add, needs to hold only ``large_sustained_s``
    large_shift_us: float = 30.0
    large_sustained_s: float = 8.0
    #: ... or recur: at least ``burst_recur`` runs above it of ``burst_min_s`` or more each,
    #: adding up to ``large_sustained_s``, within the RTT ring (repetitive flow offloading:
    #: +100 us for 5-11 s, again and again, none lasting 8 s at a hop's end)
    burst_min_s: float = 3.0
    burst_recur: int = 2
    #: the latency features keep one RTT per pair and period (:mod:`skh.analysis.sampling`)
    latency_sample_s: float = LATENCY_SAMPLE_S
    #: flow slots of the RTT ring (``path_id % latency_paths``): the sampled RTT walks a pair's
    #: path ids in turn (:mod:`skh.analysis.sampling`), so a slow ECMP path shows in its slots
    latency_paths: int = LATENCY_PATHS
    #: RTT ring per pair; must hold a window plus a hop at one sample per ``latency_sample_s``
    samples_per_pair: int = 48
    allowed_lateness_s: float = 2.0
    clear_after_s: float = 30.0
    retire_idle_s: float = 600.0
    fast: FastPathConfig = field(default_factory=FastPathConfig)
    longterm: LongTermConfig = field(default_factory=LongTermConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    link: LinkStateConfig = field(default_factory=LinkStateConfig)

    def __post_init__(self) -> None:
        hop_ns, win_ns = int(self.hop_s * 1e9), int(self.window_s * 1e9)
        if hop_ns <= 0 or win_ns <= 0 or win_ns % hop_ns:
            raise ConfigError(
                "The 'window_s' parameter of DetectorConfig must be a positive multiple of "
                f"'hop_s'. Got {self.window_s!r} and {self.hop_s!r} instead."
            )
        if int(self.longterm.block_s * 1e9) % win_ns:
            raise ConfigError(
                "The 'longterm.block_s' parameter of DetectorConfig must be a multiple "
                f"of 'window_s'. Got {self.longterm.block_s!r} instead."
            )
        if not 2 <= self.min_lookback_windows <= self.lookback_windows:
            raise ConfigError(
                "The 'min_lookback_windows' parameter of "
                "DetectorConfig must be in [2, lookback_windows]. "
                f"Got {self.min_lookback_windows!r} "
                f"(lookback_windows={self.lookback_windows!r}) instead."
            )
        if (
            self.lof_k < 1
            or self.samples_per_pair < self.min_window_samples
            or self.min_window_samples < 1
        ):
            raise ConfigError(
                "DetectorConfig needs lof_k >= 1 and samples_per_pair >= min_window_samples >= 1. "
                f"Got lof_k={self.lof_k!r}, samples_per_pair={self.samples_per_pair!r}, "
                f"min_window_samples={self.min_window_samples!r} instead."
            )
        if self.young_fleet_min_pairs < 1 or not 0 < self.young_fleet_quantile <= 1:
            raise ConfigError(
                "DetectorConfig needs young_fleet_min_pairs >= 1 and 0 < young_fleet_quantile "
                f"<= 1. Got {self.young_fleet_min_pairs!r} and {self.young_fleet_quantile!r}."
            )
        if self.young_peer_min_pairs < 1 or not 0 < self.young_peer_quantile <= 1:
            raise ConfigError(
                "DetectorConfig needs young_peer_min_pairs >= 1 and 0 < young_peer_quantile "
                f"<= 1. Got {self.young_peer_min_pairs!r} and {self.young_peer_quantile!r}."
            )
        if self.burst_recur < 2 or not self.burst_min_s > 0:
            raise ConfigError(
                "DetectorConfig needs burst_recur >= 2 and burst_min_s > 0. "
                f"Got {self.burst_recur!r} and {self.burst_min_s!r} instead."
            )
        if self.latency_paths < 1:
            raise ConfigError(
                "The 'latency_paths' parameter of DetectorConfig must be >= 1. "
                f"Got {self.latency_paths!r} instead."
            )
        if not self.latency_sample_s > 0 or (
            self.samples_per_pair * self.latency_sample_s < self.window_s + self.hop_s
        ):
            raise ConfigError(
                "DetectorConfig needs latency_sample_s > 0 and samples_per_pair * "
                "latency_sample_s >= window_s + hop_s (the ring must hold a sliding window). "
                f"Got latency_sample_s={self.latency_sample_s!r}, "
                f"samples_per_pair={self.samples_per_pair!r} instead."
            )
        if self.window_s / self.latency_sample_s < self.min_window_samples:
            raise ConfigError(
                "DetectorConfig needs window_s / latency_sample_s >= min_window_samples (a "
                f"window must be able to hold enough samples). Got window_s={self.window_s!r}, "
                f"latency_sample_s={self.latency_sample_s!r}, "
                f"min_window_samples={self.min_window_samples!r} instead."
            )


@dataclass(slots=True)
class DetectorStats:
    records_in: int = 0
    duplicates: int = 0
    stale: int = 0
    late: int = 0
    #: pairs whose prober restarted (seq numbering from 0 again at a newer send time)
    restarts: int = 0
    retired_rows: int = 0
    windows_scored: int = 0
    pairs_live: int = 0


_NONE = np.iinfo(np.int64).min


def _runs(sorted_ids: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted array."""
    return np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])


class Detector:
    """Per-pair streaming state and the two-clock decision; see the module doc for the rules."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = cfg = config or DetectorConfig()
        self.stats = DetectorStats()
        self._hop_ns = int(cfg.hop_s * 1e9)
        self._win_ns = int(cfg.window_s * 1e9)
        self._hops_per_win = self._win_ns // self._hop_ns
        self._block_ns = int(cfg.longterm.block_s * 1e9)
        self._lateness_ns = int(cfg.allowed_lateness_s * 1e9)
        L, M = cfg.lookback_windows, cfg.samples_per_pair
        self._lb_slots = L + 1  # the look-back plus the newest window the sliding query overlaps
        self._dtype = np.dtype(
            [
                ("src", "<u4"),
                ("dst", "<u4"),
                ("seq_hi", "<i8"),
                ("seq_bits", "<u8"),
                ("last_rec_ns", "<i8"),
                ("dead", "?"),
                ("ring_rtt", "<f4", (M,)),
                ("ring_hop", "<i4", (M,)),
                ("ring_path", "<u1", (M,)),  # flow slot of each sample (path id % paths)
                ("ring_pos", "<i8"),
                *SAMPLE_STATE,  # which OK is the pair's latency sample of a period
                ("lb", "<f4", (self._lb_slots, N_FEATURES)),
                ("lb_win", "<i4", (self._lb_slots,)),
                ("fit_key", "<i8"),
                # the cached fit, in float32: a threshold decision does not need the last bits
                ("kdist", "<f4", (L,)),
                ("lrd", "<f4", (L,)),
                ("act_since", "<i8", (len(_NET_KINDS),)),
                ("act_last", "<i8", (len(_NET_KINDS),)),
                ("flap_raised", "?"),  # this unreachable incident was raised again as a flap
            ]
        )
        blank = np.zeros(1, self._dtype)
        blank["seq_hi"] = -1
        blank["ring_hop"] = -1
        blank["lb_win"] = -1
        blank["fit_key"] = _NONE
        blank["act_since"] = _NONE
        blank["act_last"] = _NONE
        self._blank = blank
        self.pairs = np.repeat(blank, 0)
        self._n = 0
        self._keys = np.empty(0, np.uint64)  # sorted pair keys (src << 32 | dst)
        self._key_pid = np.empty(0, np.int64)
        self.fast = FastPathState(cfg.fast)
        self.longterm = LongTermState(cfg.longterm)
        self.health = EndpointHealth(cfg.health)
        self.links = LinkState(cfg.link)
        self._any_retired = False
        #: newest hop end already scored, newest tumbling window closed, next long-term block
        self._scored_until_ns: int | None = None
        self._closed_win = -1
        self._lt_block: int | None = None
        #: endpoint -> last time it was seen unhealthy, while its agent incident is open
        self._agent_since: dict[int, int] = {}
        #: endpoint -> (from, to) ns of its agent's latest restart (its prober numbered anew):
        #: failures toward it then were its absence, not the network's
        self._restart_gap: dict[int, tuple[int, int]] = {}
        #: endpoint groupings for the fast path's corroboration (e.g. endpoint -> ToR)
        self._groups: list[np.ndarray] = []
        #: endpoint -> pod, for young pairs' path lengths (None: not told)
        self._pods: np.ndarray | None = None
        self._ticks = 0

    # ------------------------------------------------------------------ inputs

    def heartbeat(self, eps: int | np.ndarray, t_ns: int) -> None:
        """Heartbeats of the agents of endpoint(s) ``eps``, sent at (or after) ``t_ns``."""
        arr = np.atleast_1d(np.asarray(eps))
        if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() >= 2**32):
            raise ConfigError(
                "The 'eps' parameter of Detector.heartbeat must be u32 "
                f"endpoint id(s). Got {eps!r} instead."
            )
        arr = arr.astype(np.int64)
        # retirement is final (the cluster model never reuses an endpoint id): a stopping
        # container's last heartbeat may still arrive after the controller reported it gone
        self.health.heartbeat(arr[~self.health.is_retired(arr)], int(t_ns))

    def set_endpoint_groups(self, *groups: np.ndarray) -> None:
        """Groupings of endpoints whose pairs share links, for the fast path's loss
        corroboration: each an int array mapping endpoint id -> group id (-1: none), e.g. the
        ToR each endpoint's RNIC hangs off (the links above it). Replaces earlier ones."""
        out = []
        for g in groups:
            a = np.asarray(g)
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise ConfigError(
                    "Detector.set_endpoint_groups takes 1-D integer arrays (endpoint id -> "
                    f"group id). Got {a.dtype} of shape {a.shape} instead."
                )
            out.append(a.astype(np.int64))
        self._groups = out

    def set_endpoint_pods(self, pods: np.ndarray) -> None:
        """The pod of each endpoint: an int array mapping endpoint id -> pod id (-1: unknown),
        the ToRs joined through shared spines. With the first endpoint grouping (the ToRs) it
        tells a pair's path length (one ToR, a spine, or a core too), so a young pair without
        ToR peers is held against established pairs that run as many hops: a new job's pairs
        between pods (17 us healthy) were called slow against a fleet of pairs within pods
        (99.9 % of usual p75 16.3 us; full field seed 202281425)."""
        a = np.asarray(pods)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ConfigError(
                "Detector.set_endpoint_pods takes a 1-D integer array (endpoint id -> pod id). "
                f"Got {a.dtype} of shape {a.shape} instead."
            )
        self._pods = a.astype(np.int64)

    def set_endpoint_links(self, links: np.ndarray) -> None:
        """The access link of each endpoint: an int array mapping endpoint id -> the id of its
        RNIC (host and rail; -1: unknown), the same id for the same RNIC from call to call. The
        fast path keeps each link's loss history across the jobs that use it, so a new job's
        endpoint is judged against its link's past rather than a prior alone."""
        self.fast.set_links(links)

    def set_endpoint_containers(self, containers: np.ndarray) -> None:
        """The container of each endpoint: an int array mapping endpoint id -> container id (-1:
        unknown). A VF reading down counts as a link down only while another VF of its container
        reads up (:mod:`skh.analysis.linkstate`)."""
        self.links.set_containers(containers)

    def link_state(self, counters: np.ndarray) -> None:
        """Fold one batch of counter rows (``COUNTER_DTYPE``) in: each VF's oper state."""
        if not isinstance(counters, np.ndarray) or counters.dtype != COUNTER_DTYPE:
            got = counters.dtype if isinstance(counters, np.ndarray) else type(counters).__name__
            raise ConfigError(
                "The 'counters' parameter of Detector.link_state must be a "
                f"COUNTER_DTYPE array. Got {got} instead."
            )
        c = counters.ravel()
        if c.size and self._any_retired:
            c = c[~self.health.is_retired(c["ep"].astype(np.int64))]
        self.links.observe(c["ep"], c["oper_up"] != 0, c["t_ns"])

    def retire(self, eps: np.ndarray | list[int]) -> None:
        """Endpoints stopped on purpose (container churn): drop their pairs and state now."""
        eps = np.unique(np.asarray(eps, np.uint32))
        if eps.size == 0:
            return
        self._any_retired = True
        self.health.retire(eps.astype(np.int64))
        self.links.forget(eps)
        if self._n:
            p = self.pairs[: self._n]
            gone = np.isin(p["src"], eps) | np.isin(p["dst"], eps)
            p["dead"] |= gone
        for ep in eps.tolist():
            self._agent_since.pop(ep, None)

    def reuse(self, eps: np.ndarray | list[int]) -> None:
        """Retired endpoint ids given to new endpoints: what is left of their old pairs goes
        (they were dead: records of the new endpoints must not land in them) and they are
        neither retired nor remembered any more."""
        eps = np.unique(np.asarray(eps, np.int64))
        if eps.size == 0:
            return
        if self._n:
            p = self.pairs[: self._n]
            self._drop(np.isin(p["src"], eps) | np.isin(p["dst"], eps))
        self.health.forget(eps)
        self.links.forget(eps)
        for ep in eps.tolist():
            self._agent_since.pop(ep, None)
            self._restart_gap.pop(ep, None)

    def ready(self, eps: np.ndarray | list[int]) -> None:
        """Endpoints announced ready. A retired one among them is a container stopped on purpose
        and started again under its registration (same id): watched afresh, as a reused id is
        (:meth:`reuse`); the others are untouched (an agent back after a loss keeps its
        history)."""
        eps = np.unique(np.asarray(eps, np.int64))
        if eps.size and self._any_retired:
            self.reuse(eps[self.health.is_retired(eps)])

    def ingest(self, batch: np.ndarray) -> None:
        """Fold one batch of probe results into the per-pair state."""
        if not isinstance(batch, np.ndarray) or batch.dtype != PROBE_DTYPE:
            got = batch.dtype if isinstance(batch, np.ndarray) else type(batch).__name__
            raise ConfigError(
                "The 'batch' parameter of Detector.ingest must be a "
                f"PROBE_DTYPE array. Got {got} instead."
            )
        if batch.size == 0:
            return
        self.stats.records_in += batch.size
        b = batch.ravel()
        if self._any_retired:
            keep = ~(
                self.health.is_retired(b["src_ep"].astype(np.int64))
                | self.health.is_retired(b["dst_ep"].astype(np.int64))
            )
            self.stats.retired_rows += int((~keep).sum())
            b = np.compress(keep, b)
        if self._scored_until_ns is not None:
            late = b["t_wall_ns"] < self._scored_until_ns
            if late.any():
                self.stats.late += int(late.sum())
                b = np.compress(~late, b)
        if b.size == 0:
            return
        pid = self._pair_ids(b["src_ep"], b["dst_ep"])
        # one sort by (pair, send time); every per-pair step below works on its runs
        order = np.lexsort((b["t_wall_ns"], pid))
        # np.take, not fancy indexing: numpy gathers structured records a field at a time
        b, pid = np.take(b, order), pid[order]
        b, pid, advanced = self._dedupe(b, pid)
        if b.size == 0:
            return
        t = b["t_wall_ns"]
        status = b["status"]
        starts = _runs(pid)
        upid = pid[starts]
        p = self.pairs
        p["last_rec_ns"][upid] = np.maximum(p["last_rec_ns"][upid], np.maximum.reduceat(t, starts))
        self.health.observe(
            b["src_ep"].astype(np.int64),
            b["dst_ep"].astype(np.int64),
            t,
            status,
            b["prober_delay_ns"],
            b["responder_delay_ns"],
            int(ProbeStatus.REFUSED),
            b["ts_source"] >= TsSource.KERNEL,
        )
        # reply loss is loss: a lost answer is a packet the reverse path dropped
        failed = is_loss(status) | (status == ProbeStatus.UNREACHABLE)
        counted = failed | (status == ProbeStatus.OK)
        self.fast.update(
            pid[counted],
            t[counted],
            failed[counted],
            b["path_id"][counted],
            b["responder_delay_ns"][counted],
            advanced[counted],
        )
        self._excuse_restarts(t.max())
        # every OK tells its pair's interval and rotation; only those with an RTT can be its
        # latency sample (a prober asks for RTTs on the probes that may be: Engine.add_target)
        ok = status == ProbeStatus.OK
        if ok.any():
            self._store_samples(
                pid[ok], t[ok], b["rtt_ns"][ok] / 1e3, b["seq"][ok], b["path_id"][ok]
            )

    def open_incidents(self, now_ns: int | None = None) -> tuple[set[tuple[int, int]], set[int]]:
        """What is still open as of the last tick: pairs with a network incident of any kind,
        and endpoints with an agent incident (both clear after ``clear_after_s`` of quiet).

        With ``now_ns``, the endpoints also include those unhealthy at ``now_ns``: an alerting
        health reason, or results that stopped arriving (a dead agent dropped from its peers'
        lists is no longer refused, but it stays late until it is back)."""
        p = self.pairs[: self._n]
        act = (p["act_since"] != _NONE).any(axis=1) & ~p["dead"]
        eps = set(self._agent_since)
        if now_ns is not None:
            sick = self.health.evaluate(int(now_ns)) & int(ALERTING | HealthReason.LATE_RESULTS)
            eps.update(np.flatnonzero(sick).tolist())
        return set(zip(p["src"][act].tolist(), p["dst"][act].tolist(), strict=True)), eps

    # ------------------------------------------------------------------ pair index

    def _pair_ids(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        keys = pair_keys(src, dst)
        pos = np.searchsorted(self._keys, keys)
        found = pos < self._keys.size
        found[found] = self._keys[pos[found]] == keys[found]
        if not found.all():
            new = np.unique(keys[~found])
            ids = np.arange(self._n, self._n + new.size)
            self._grow(self._n + new.size)
            self.pairs["src"][ids] = (new >> np.uint64(32)).astype(np.uint32)
            self.pairs["dst"][ids] = (new & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            blank_sample_state(
                self.pairs[self._n : self._n + new.size],
                new,
                int(self.config.latency_sample_s * 1e9),
            )
            self._n += new.size
            allk = np.concatenate([self._keys, new])
            allp = np.concatenate([self._key_pid, ids])
            order = np.argsort(allk, kind="stable")
            self._keys, self._key_pid = allk[order], allp[order]
            pos = np.searchsorted(self._keys, keys)
        return self._key_pid[pos]

    def _grow(self, n: int) -> None:
        if n <= len(self.pairs):
            return
        cap = max(n, 2 * len(self.pairs), 1024)
        grown = np.empty(cap, self._dtype)
        grown[: self._n] = self.pairs[: self._n]
        grown[self._n :] = self._blank
        self.pairs = grown
        self.fast.resize(cap)
        self.longterm.resize(cap)

    def _compact(self, now_ns: int) -> None:
        p = self.pairs[: self._n]
        idle = p["last_rec_ns"] < now_ns - int(self.config.retire_idle_s * 1e9)
        self._drop(p["dead"] | idle)

    def _drop(self, drop: np.ndarray) -> None:
        """Forget the pairs ``drop`` marks (a mask over the live pair table)."""
        if not drop.any():
            return
        keep = np.flatnonzero(~drop)
        self.pairs = np.concatenate(
            [self.pairs[keep], np.repeat(self._blank, len(self.pairs) - keep.size)]
        )
        self.fast.take(np.concatenate([keep, np.arange(self._n, len(self.fast.state))]))
        self.longterm.take(np.concatenate([keep, np.arange(self._n, len(self.longterm.state))]))
        # the pair table keeps its capacity, so must the per-pair states (else ids in the freed
        # tail index past them once new pairs arrive without a _grow)
        self.fast.resize(len(self.pairs))
        self.longterm.resize(len(self.pairs))
        self.fast.clear_pairs(np.arange(keep.size, len(self.fast.state)))
        self.longterm.clear_pairs(np.arange(keep.size, len(self.longterm.state)))
        self._n = keep.size
        q = self.pairs[: self._n]
        keys = pair_keys(q["src"], q["dst"])
        order = np.argsort(keys)
        self._keys, self._key_pid = keys[order], order.astype(np.int64)
        log.debug("compacted pair state: %d dropped, %d live", int(drop.sum()), self._n)

    def _dedupe(self, b: np.ndarray, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Drop rows seen before (same pair and seq), keeping the (pair, time) order. Also
        returns, per row, how many probes its pair sent that were not counted before (the
        first row of each pair carries the pair's sequence-number advance; the agents forward
        only some OKs, so rows alone undercount), and notes agents that restarted."""
        seq = b["seq"].astype(np.int64)
        _, first = np.unique((pid << 32) | seq, return_index=True)
        if first.size != seq.size:
            self.stats.duplicates += seq.size - first.size
            first.sort()
            b, pid, seq = b[first], pid[first], seq[first]
        p = self.pairs
        known = p["seq_hi"][pid] >= 0
        newer = b["t_wall_ns"] > p["last_rec_ns"][pid]
        ahead = ((seq - p["seq_hi"][pid] + 2**31) % 2**32) - 2**31 > 0
        # within one prober session seq rises with send time, so a row that does not advance
        # the seq yet was sent after everything seen is a restarted prober numbering from 0
        # again, and a row that advances it but was sent before is a replay of an earlier
        # session (replays and duplicates carry their original send times)
        restart = known & ~ahead & newer
        drop = known & ahead & ~newer
        if restart.any():
            rp = np.unique(pid[restart])
            self.stats.restarts += rp.size
            log.info("%d pair(s) restarted their probe numbering (a restarted prober)", rp.size)
            # the agent was away from its last record of the old numbering to its first of the
            # new one: its responder answered nothing meanwhile
            first_new = np.full(pid.max() + 1, np.iinfo(np.int64).max)
            np.minimum.at(first_new, pid[restart], b["t_wall_ns"][restart])
            for e, a_ns, b_ns in zip(
                p["src"][rp].tolist(),
                p["last_rec_ns"][rp].tolist(),
                first_new[rp].tolist(),
                strict=True,
            ):
                old = self._restart_gap.get(e)
                if old is None or old[1] < b_ns:
                    self._restart_gap[e] = (int(a_ns), int(b_ns))
                else:
                    self._restart_gap[e] = (min(old[0], a_ns), max(old[1], b_ns))
            p["seq_hi"][rp] = -1
            drop |= np.isin(pid, rp) & ~newer  # what was sent before the restart
        if drop.any():
            self.stats.stale += int(drop.sum())
            b, pid, seq = b[~drop], pid[~drop], seq[~drop]
            if b.size == 0:
                return b, pid, np.zeros(0)
        starts = _runs(pid)
        upid = pid[starts]
        fresh = p["seq_hi"][upid] < 0
        if fresh.any():
            # a pair's first rows: its window starts at its lowest seq of this batch, which
            # counts as one probe sent
            p["seq_hi"][upid[fresh]] = (np.minimum.reduceat(seq, starts)[fresh] - 1) % 2**32
            p["seq_bits"][upid[fresh]] = 0
        hi = p["seq_hi"][pid]
        # serial-number arithmetic, so a u32 seq may wrap
        delta = ((seq - hi + 2**31) % 2**32) - 2**31
        stale = delta <= -64
        bit = np.left_shift(np.uint64(1), np.clip(-delta, 0, 63).astype(np.uint64))
        seen = (delta <= 0) & ~stale & ((p["seq_bits"][pid] & bit) != 0)
        keep = ~(stale | seen)
        if not keep.all():
            self.stats.stale += int(stale.sum())
            self.stats.duplicates += int(seen.sum())
            b, pid, delta = b[keep], pid[keep], delta[keep]
            if b.size == 0:
                return b, pid, np.zeros(0)
            starts = _runs(pid)
            upid = pid[starts]
        shift = np.maximum(np.maximum.reduceat(delta, starts), 0)
        advanced = np.zeros(pid.size)
        advanced[starts] = shift
        bits = p["seq_bits"][upid]
        bits = np.where(shift < 64, bits << np.minimum(shift, 63).astype(np.uint64), np.uint64(0))
        p["seq_hi"][upid] = (p["seq_hi"][upid] + shift) % 2**32
        pos = np.repeat(shift, np.diff(np.r_[starts, pid.size])) - delta  # below the new highest
        mark = np.where(
            pos < 64,
            np.left_shift(np.uint64(1), np.minimum(pos, 63).astype(np.uint64)),
            np.uint64(0),
        )
        p["seq_bits"][upid] = bits | np.bitwise_or.reduceat(mark, starts)
        return b, pid, advanced

    def _excuse_restarts(self, newest_ns: int) -> None:
        """Drop failures toward endpoints whose agent was restarting when they were sent."""
        if not self._restart_gap or not self._n:
            return
        horizon = int(newest_ns) - int(60e9)
        for e in [e for e, (_, b) in self._restart_gap.items() if b < horizon]:
            del self._restart_gap[e]
        if not self._restart_gap:
            return
        p = self.pairs[: self._n]
        eps = np.fromiter(self._restart_gap, np.int64, len(self._restart_gap))
        gaps = np.array(list(self._restart_gap.values()), np.int64).reshape(-1, 2)
        order = np.argsort(eps)
        eps, gaps = eps[order], gaps[order]
        dst = p["dst"].astype(np.int64)
        pos = np.minimum(np.searchsorted(eps, dst), eps.size - 1)
        toward = np.flatnonzero(eps[pos] == dst)
        if toward.size:
            g = gaps[pos[toward]]
            self.fast.excuse_toward(toward, g[:, 0], g[:, 1])

    def _store_samples(
        self,
        pid: np.ndarray,
        t_ns: np.ndarray,
        rtt_us: np.ndarray,
        seq: np.ndarray,
        path_id: np.ndarray,
    ) -> None:
        """``pid`` sorted by pair, then send time; ``rtt_us`` <= 0: an OK without an RTT."""
        p = self.pairs
        keep = period_samples(
            pid,
            t_ns,
            seq,
            path_id,
            p,
            period_ns=int(self.config.latency_sample_s * 1e9),
            has_rtt=rtt_us > 0,
        )
        if keep.size == 0:
            return
        pid, t_ns, rtt_us = pid[keep], t_ns[keep], rtt_us[keep]
        path = (path_id[keep].astype(np.int64) % self.config.latency_paths).astype(np.uint8)
        M = self.config.samples_per_pair
        start = _runs(pid)
        size = np.diff(np.r_[start, pid.size])
        rank = np.arange(pid.size) - np.repeat(start, size)
        pos = (p["ring_pos"][pid] + rank) % M
        p["ring_rtt"][pid, pos] = rtt_us
        p["ring_hop"][pid, pos] = (t_ns // self._hop_ns).astype(np.int32)
        p["ring_path"][pid, pos] = path
        p["ring_pos"][pid[start]] += size
        first_block = self._lt_block if self._lt_block is not None else np.iinfo(np.int64).min
        self.longterm.add(pid, t_ns, rtt_us, first_block)

    # ------------------------------------------------------------------ tick

    def tick(self, now_ns: int) -> list[SuspectEvent]:
        """Advance to ``now_ns``: close what the watermark allows, evaluate, return new events."""
        now_ns = int(now_ns)
        self._ticks += 1
        if self._ticks % 64 == 0:
            self._compact(now_ns)
        n = self._n
        p = self.pairs[:n]
        reasons = self.health.evaluate(now_ns)
        cand: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]]] = {
            k: [] for k in _NET_KINDS
        }

        wm = now_ns - self._lateness_ns
        e = (wm // self._hop_ns) * self._hop_ns
        if self._scored_until_ns is None:
            self._scored_until_ns = e
            self._closed_win = e // self._win_ns - 1
            self._lt_block = e // self._block_ns
        elif e > self._scored_until_ns and n:
            last_win = e // self._win_ns - 1
            for w in range(max(self._closed_win + 1, last_win - self._lb_slots + 1), last_win + 1):
                self._close_window(w)
            self._closed_win = last_win
            self._score_latency(e, cand)
            self._scored_until_ns = e
            while (self._lt_block + 1) * self._block_ns <= e:
                self._test_block(self._lt_block, cand)
                self._lt_block += 1
        elif e > self._scored_until_ns:
            self._scored_until_ns = e

        flaps = np.zeros(0, np.int64)
        if n:
            ff = self.fast.evaluate(
                now_ns,
                p["src"].astype(np.int64),
                p["dst"].astype(np.int64),
                max(self.health.n_endpoints, int(max(p["src"].max(), p["dst"].max())) + 1),
                self.health.state["progress_ns"],
                self._groups,
            )
            cand["unreachable"].append(
                (ff.unreachable, ff.unreachable_fails.astype(float), ff.unreachable_first_ns, [])
            )
            notes = [f"evidence 1e-{x:.0f}" for x in ff.loss_evidence]
            cand["loss"].append((ff.loss, ff.loss_fails.astype(float), ff.loss_first_ns, notes))
            flaps = ff.unreachable[ff.unreachable_flapping]
            # a pair in an outage does not teach its baseline (an outage's failures are dropped
            # anyway). Loss does, one to two stages late, so a fault is caught before its
            # failures are learned, while a benign bad link once flagged, by chance or beside a
            # fault, is learned at last rather than flagged for ever; a held pair does too, or
            # every benign failure near a batch's end would be forgotten
            busy = (p["act_since"][:, 0] != _NONE) | p["dead"]
            busy[ff.unreachable] = True
            self.fast.learn(
                now_ns, busy, p["src"].astype(np.int64), p["dst"].astype(np.int64), self._groups
            )
        self.stats.pairs_live = n
        return self._emit(now_ns, reasons, cand, flaps)

    def _close_window(self, w: int) -> None:
        """Summarise tumbling window ``w`` of every pair into its look-back slot."""
        cfg = self.config
        p = self.pairs[: self._n]
        slot = w % self._lb_slots
        lo, hi = w * self._hops_per_win, (w + 1) * self._hops_per_win
        hop = p["ring_hop"]
        valid = (hop >= lo) & (hop < hi)
        cnt = valid.sum(axis=1)
        end_ns = (w + 1) * self._win_ns
        # a window the pair's latency incident covers is not a baseline: a second fault soon
        # after a first would otherwise hide behind the first one's windows in the look-back.
        # A window not stored leaves the slot's older window in place, so the look-back is the
        # pair's last clean windows, however old, rather than shrinking to nothing
        shifted = p["act_last"][:, _NET_KINDS.index("latency-short")] >= w * self._win_ns
        rows = np.flatnonzero(
            (cnt >= cfg.min_window_samples) & self._complete(p, end_ns) & ~p["dead"] & ~shifted
        )
        if rows.size == 0:
            return
        feats, _ = window_features(p["ring_rtt"][rows], valid[rows])
        p["lb"][rows, slot] = feats.astype(np.float32)
        p["lb_win"][rows, slot] = w

    def _complete(self, p: np.ndarray, end_ns: int) -> np.ndarray:
        """Whether each pair's prober has reported past ``end_ns`` (so its window is whole)."""
        prog = self.health.state["progress_ns"]
        src = p["src"].astype(np.int64)
        ok = src < prog.size
        out = np.zeros(len(p), bool)
        out[ok] = prog[src[ok]] >= end_ns
        return out

    def _score_latency(self, e: int, cand: dict) -> None:
        cfg = self.config
        p = self.pairs[: self._n]
        L = cfg.lookback_windows
        w_lim = (e - self._win_ns) // self._win_ns - 1  # newest window not overlapping the query
        lbw = p["lb_win"]
        lbv = (lbw >= 0) & (lbw <= w_lim)  # (P, L + 1) stored windows before the query
        # at most the newest L: the slot of the window overlapping the query may hold an older one
        over = np.flatnonzero(lbv.sum(axis=1) > L)
        if over.size:
            oldest = np.where(lbv[over], lbw[over], np.iinfo(np.int32).max).argmin(axis=1)
            lbv[over, oldest] = False
        n_lb = lbv.sum(axis=1)
        hop_e = e // self._hop_ns
        hop = p["ring_hop"]
        qvalid = (hop >= hop_e - self._hops_per_win) & (hop < hop_e)
        qn = qvalid.sum(axis=1)
        ready = (qn >= cfg.min_window_samples) & self._complete(p, e) & ~p["dead"]
        elig = ready & (n_lb >= cfg.min_lookback_windows)
        rows = np.flatnonzero(elig)
        young = np.flatnonzero(ready & (n_lb < cfg.min_lookback_windows))
        if rows.size == 0:
            return
        query, _ = window_features(p["ring_rtt"][rows], qvalid[rows])
        lof = np.empty(rows.size)
        max_p75 = np.empty(rows.size)
        med_p50 = np.empty(rows.size)
        med_p75 = np.empty(rows.size)
        for nv in np.unique(n_lb[rows]):
            g = np.flatnonzero(n_lb[rows] == nv)
            pr = rows[g]
            train = p["lb"][pr][lbv[pr]].reshape(pr.size, nv, N_FEATURES)
            stale = p["fit_key"][pr] != w_lim
            if stale.any():
                f = fit_lof(train[stale], cfg.lof_k)
                sp = pr[stale]
                kd = np.zeros((sp.size, L))
                ld = np.zeros((sp.size, L))
                kd[:, :nv], ld[:, :nv] = f.kdist, f.lrd
                p["kdist"][sp] = kd
                p["lrd"][sp] = ld
                p["fit_key"][sp] = w_lim
            fit = LofFit(
                k=max(1, min(cfg.lof_k, int(nv) - 1)),
                kdist=p["kdist"][pr][:, :nv],
                lrd=p["lrd"][pr][:, :nv],
                negative_outlier_factor=None,
            )
            lof[g] = -score_lof(train, fit, query[g])
            max_p75[g] = train[:, :, _P75].max(axis=1)
            med_p50[g] = np.median(train[:, :, _P50], axis=1)
            med_p75[g] = np.median(train[:, :, _P75], axis=1)
        self.stats.windows_scored += rows.size
        excess = query[:, _P75] - max_p75
        floor = np.maximum(cfg.min_shift_us, cfg.min_shift_rel * med_p50)
        if young.size:
            self._score_young(young, qvalid[young], rows, max_p75, med_p75, floor, hop_e, cand)
        hit = (lof >= cfg.lof_threshold) & (excess >= floor)
        if hit.any():
            hi = np.flatnonzero(hit)
            hit[hi] = self._sustained(
                rows[hi], qvalid[rows[hi]], (max_p75 + floor)[hi], cfg.min_sustained_s
            ) | self._sustained(
                rows[hi], qvalid[rows[hi]], max_p75[hi] + cfg.large_shift_us, cfg.large_sustained_s
            )
        burst = self._recurring(rows, hop[rows], hop_e, max_p75 + cfg.large_shift_us)
        hit |= burst
        if not hit.any():
            return
        hp = rows[hit]
        # first seen: the earliest hop of the window with a sample above look-back p75 + floor
        thr = (max_p75 + floor)[hit]
        above = qvalid[hp] & (p["ring_rtt"][hp] > thr[:, None])
        first_hop = np.where(above, hop[hp], np.iinfo(np.int32).max).min(axis=1)
        first_ns = np.where(
            first_hop < np.iinfo(np.int32).max,
            first_hop.astype(np.int64) * self._hop_ns,
            e - self._win_ns,
        )
        notes = [
            (
                f"recurring bursts over {m + cfg.large_shift_us:.1f} us (look-back max p75 "
                f"{m:.1f} us + {cfg.large_shift_us:g})"
                if b
                else f"LOF {lo_:.1f} >= {cfg.lof_threshold:g} against {int(nl)} look-back "
                f"windows; p75 {q:.1f} us vs look-back max {m:.1f} us (+{x:.1f} us)"
            )
            for lo_, nl, q, m, x, b in zip(
                lof[hit],
                n_lb[hp],
                query[hit, _P75],
                max_p75[hit],
                excess[hit],
                burst[hit] & ~((lof[hit] >= cfg.lof_threshold) & (excess[hit] >= floor[hit])),
                strict=True,
            )
        ]
        cand["latency-short"].append((hp, lof[hit], first_ns, notes))

    def _score_young(
        self,
        rows: np.ndarray,
        qvalid: np.ndarray,
        est: np.ndarray,
        lb_p75: np.ndarray,
        usual_p75: np.ndarray,
        lb_floor: np.ndarray,
        hop_e: int,
        cand: dict,
    ) -> None:
        """Pairs too young for a look-back of their own (a job that just started) are held
        against their ToR peers' (``est``: the established pairs, with their look-backs'
        highest and median p75 and effect floors): the same shift, held as long, or the same
        recurring bursts, as an established pair's, above the peers' usual p75 rather than its
        own. A pair without enough such peers is held against the fleet: its p75 must clear the
        ``young_fleet_quantile`` of the established pairs' usual p75 (the median of each
        look-back: about the most-hop pairs' healthy p75, which a congestion episode does not
        lift) by the largest effect floor among them, held as long as any shift. Against the
        look-backs' *highest* p75 (congestion included), +20 us on a new job's pairs stayed
        under the bar (42 us; CI draw 758650935). The pair's own look-back takes over after
        ``min_lookback_windows``."""
        cfg = self.config
        p = self.pairs
        # the baseline p75 a young pair is held against, and the shift it must clear it by
        ref, floor = np.full(rows.size, np.nan), np.zeros(rows.size)
        if self._groups:
            ref, floor = self._peer_baseline(rows, est, usual_p75, lb_floor)
        peer = ~np.isnan(ref)
        if (~peer).any() and usual_p75.size >= cfg.young_fleet_min_pairs:
            # the usual p75 (not the look-backs' highest, which a congestion episode lifts by
            # up to 10 us) of the fleet's pairs as long as this one: about their healthy p75
            nope = np.flatnonzero(~peer)
            ref[nope], floor[nope] = self._fleet_baseline(rows[nope], est, usual_p75, lb_floor)
        elif not peer.any():
            return
        keep = ~np.isnan(ref)
        rows, qvalid, ref, floor, peer = (
            rows[keep],
            qvalid[keep],
            ref[keep],
            floor[keep],
            peer[keep],
        )
        query, _ = window_features(p["ring_rtt"][rows], qvalid)
        thr = ref + floor  # inf: a path length the fleet has too few pairs of
        hop = p["ring_hop"][rows]
        # a young pair's large shifts and bursts are held as an established pair's are, above
        # its peers' usual p75 or by a wider margin above the fleet's
        big = ref + np.where(peer, cfg.large_shift_us, cfg.young_fleet_large_shift_us)
        up = query[:, _P75] > np.minimum(thr, big)
        burst = self._recurring(rows, hop, hop_e, big)
        ok = np.zeros(rows.size, bool)
        if up.any():
            u = np.flatnonzero(up)
            ok[u] = self._sustained(rows[u], qvalid[u], thr[u], cfg.min_sustained_s)
            ok[u] |= self._sustained(rows[u], qvalid[u], big[u], cfg.large_sustained_s)
        ok |= burst
        if not ok.any():
            return
        rows, qvalid, q75, thr = rows[ok], qvalid[ok], query[ok, _P75], thr[ok]
        peer, ref, burst, big = peer[ok], ref[ok], burst[ok], big[ok]
        hop = hop[ok]
        above = qvalid & (p["ring_rtt"][rows] > np.minimum(thr, big)[:, None])
        first_hop = np.where(above, hop, np.iinfo(np.int32).max).min(axis=1)
        first_ns = np.where(
            first_hop < np.iinfo(np.int32).max,
            first_hop.astype(np.int64) * self._hop_ns,
            (hop_e - self._hops_per_win) * self._hop_ns,
        )
        notes = [
            (
                f"young pair (no look-back yet): p75 {q:.1f} us"
                + (" with recurring bursts" if b else "")
                + f" above its ToR peers' usual p75 {r:.1f} us"
                if pe
                else f"young pair (no look-back yet): recurring bursts over {r:.1f} us + "
                f"{cfg.young_fleet_large_shift_us:g}, the fleet's {cfg.young_fleet_quantile:.1%} "
                "usual p75"
                if b
                else f"young pair (no look-back yet): p75 {q:.1f} us above the fleet's "
                f"{cfg.young_fleet_quantile:.1%} usual p75 of pairs as long, plus its floor: "
                f"{t:.1f} us"
                if np.isfinite(t)
                else f"young pair (no look-back yet): p75 {q:.1f} us held over {r:.1f} us + "
                f"{cfg.young_fleet_large_shift_us:g}, the fleet's highest usual p75 (too few "
                "pairs as long to compare)"
            )
            for q, r, t, pe, b in zip(q75, ref, thr, peer, burst, strict=True)
        ]
        cand["latency-short"].append((rows, q75 / thr, first_ns, notes))

    def _fleet_baseline(
        self, rows: np.ndarray, est: np.ndarray, usual_p75: np.ndarray, floor: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per young pair in ``rows``: the ``young_fleet_quantile`` of the usual p75 of the
        established pairs ``est`` as long as it (:meth:`_path_class`), and the largest of their
        effect floors; where fewer than ``young_fleet_min_pairs`` are that long, the fleet's
        highest usual p75 and an infinite floor (large shifts only)."""
        cfg = self.config
        ref, fl = np.full(rows.size, usual_p75.max()), np.full(rows.size, np.inf)
        yc, ec = self._path_class(rows), self._path_class(est)
        for c in np.unique(yc).tolist():
            theirs = ec == c
            if theirs.sum() < cfg.young_fleet_min_pairs:
                continue
            mine = yc == c
            ref[mine] = np.quantile(usual_p75[theirs], cfg.young_fleet_quantile)
            fl[mine] = floor[theirs].max()
        return ref, fl

    def _path_class(self, pids: np.ndarray) -> np.ndarray:
        """Per pair: 0 within one ToR, 1 within one pod, 2 between pods, 3 not known (one class
        for every pair until :meth:`set_endpoint_pods` and a ToR grouping are set)."""
        if self._pods is None or not self._groups:
            return np.zeros(pids.size, np.int64)
        p = self.pairs
        s, d = p["src"][pids].astype(np.int64), p["dst"][pids].astype(np.int64)

        def of(g: np.ndarray, e: np.ndarray) -> np.ndarray:
            return np.where(e < g.size, g[np.minimum(e, g.size - 1)], -1)

        ts, td = of(self._groups[0], s), of(self._groups[0], d)
        ps, pd = of(self._pods, s), of(self._pods, d)
        return np.select(
            [(ts < 0) | (td < 0) | (ps < 0) | (pd < 0), ts == td, ps == pd], [3, 0, 1], 2
        )

    def _peer_baseline(
        self, rows: np.ndarray, est: np.ndarray, usual_p75: np.ndarray, floor: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per young pair in ``rows``: the ``young_peer_quantile`` of the usual p75 of the
        established pairs ``est`` between the same two groups of the first endpoint grouping,
        and the largest of their effect floors (NaN and 0 where fewer than
        ``young_peer_min_pairs`` such pairs are scored)."""
        cfg = self.config
        p = self.pairs
        g = self._groups[0]

        def key(pids: np.ndarray) -> np.ndarray:
            s, d = p["src"][pids].astype(np.int64), p["dst"][pids].astype(np.int64)
            gs = np.where(s < g.size, g[np.minimum(s, g.size - 1)], -1)
            gd = np.where(d < g.size, g[np.minimum(d, g.size - 1)], -1)
            return np.where((gs >= 0) & (gd >= 0), (gs << 32) | gd, -1)

        ref = np.full(rows.size, np.nan)
        fl = np.zeros(rows.size)
        ek, yk = key(est), key(rows)
        order = np.argsort(ek, kind="stable")
        ek, usual, efl = ek[order], usual_p75[order], floor[order]
        for k in np.unique(yk[yk >= 0]).tolist():
            a, b = np.searchsorted(ek, k), np.searchsorted(ek, k, side="right")
            if b - a < cfg.young_peer_min_pairs:
                continue
            mine = yk == k
            ref[mine] = np.quantile(usual[a:b], cfg.young_peer_quantile)
            fl[mine] = efl[a:b].max()
        return ref, fl

    def _sustained(
        self, rows: np.ndarray, valid: np.ndarray, thr: np.ndarray, span_s: float
    ) -> np.ndarray:
        """Per row: a run of its query window's samples lies above ``thr`` over at least
        ``span_s`` (first to last), allowing ``sustained_gaps`` samples below it (a heavy-tailed
        healthy sample can be high, a faulty one low; a short congestion episode is not a
        fault). The run may have ended: windows are scored once a hop, so a shift that held
        its span between two hops' ends was never the newest samples' at a hop (+104 us for
        10 s, short of 8 s at one hop's end and over two samples before the next; CI draw
        1535673014) — or the newest samples of one of its flows do (a slow ECMP path: the samples
        visit the flows in turn, so only every ``latency_paths``-th one is slow)."""
        cfg = self.config
        p = self.pairs
        M = cfg.samples_per_pair
        # ring positions oldest -> newest
        order = (p["ring_pos"][rows][:, None] + np.arange(M)[None, :]) % M
        v = np.take_along_axis(valid, order, axis=1)
        rtt = np.take_along_axis(p["ring_rtt"][rows], order, axis=1)
        up = v & (rtt > thr[:, None])
        miss = v & ~up
        # samples ``steps`` apart span ``span_s``, so the run needs one more than that (twenty
        # samples a second apart span 19 s: a chain of three benign congestion episodes on one
        # path, 19.1 s, passed for 20 s on field seed 338585251)
        steps = self._steps(rows, span_s)
        ok = self._longest_run(up, miss, cfg.sustained_gaps) >= steps + 1
        if cfg.latency_paths > 1 and not ok.all():
            path = np.take_along_axis(p["ring_path"][rows], order, axis=1)
            # per flow: samples visit the flows in turn, so one more than a turn's share spans
            # it when the turns are even; they need not be (a pair's flow labels and the
            # sampling period can beat), so the run must also span it in sample positions
            # (one sample per latency_sample_s): a flow sampled every other time shows a 10 s
            # congestion episode in six samples
            need_p = np.ceil(steps / cfg.latency_paths).astype(np.int64)
            pos = np.arange(M)[None, :]
            for j in range(cfg.latency_paths):
                vj = v & (path == j)
                mj = np.cumsum((vj & ~up)[:, ::-1], axis=1)[:, ::-1]
                # a run holds only while the flow is sampled: where two of its samples lie
                # more than two turns apart, it did not show what it did between them
                seen = np.where(vj, pos, -M)
                prev = np.maximum.accumulate(
                    np.pad(seen, ((0, 0), (1, 0)), constant_values=-M)[:, :-1], axis=1
                )
                gap = vj & (prev >= 0) & (pos - prev > 2 * cfg.latency_paths)
                start = np.where(gap, pos, 0).max(axis=1)
                run = up & vj & (mj == 0) & (pos >= start[:, None])
                first = np.where(run, pos, M).min(axis=1)
                last = np.where(vj, pos, -1).max(axis=1)
                cand = ~ok & (run.sum(axis=1) >= need_p + 1) & (last - first >= steps)
                if cand.any():
                    # the newest ``steps`` of the run, in halves: a slow path leaves another
                    # path below the gate in each; where one half saw every path rise, a
                    # pair-wide episode carried the run there
                    c = np.flatnonzero(cand)
                    lo = last[c, None] - steps[c, None]
                    mid = last[c, None] - steps[c, None] // 2
                    early = (pos >= lo) & (pos <= mid)
                    late = (pos >= mid) & (pos <= last[c, None])
                    ok[c] = self._other_flow_below(
                        v[c] & early, up[c], path[c], j
                    ) & self._other_flow_below(v[c] & late, up[c], path[c], j)
        return ok

    @staticmethod
    def _longest_run(up: np.ndarray, miss: np.ndarray, gaps: int) -> np.ndarray:
        """Per row: the most samples above the gate (``up``) in a stretch holding at most
        ``gaps`` below it (``miss``; samples neither up nor missed, outside the window, do
        not count): for each end, the ups since its ``gaps + 1``-th miss back."""
        pos = np.arange(up.shape[1])[None, :]
        last_miss = np.maximum.accumulate(np.where(miss, pos, -1), axis=1)
        back = last_miss
        for _ in range(gaps):
            back = np.where(
                back > 0,
                np.take_along_axis(last_miss, np.maximum(back - 1, 0), axis=1),
                -1,
            )
        ups = np.cumsum(up, axis=1)
        before = np.where(back >= 0, np.take_along_axis(ups, np.maximum(back, 0), axis=1), 0)
        return (ups - before).max(axis=1, initial=0)

    def _other_flow_below(
        self, v: np.ndarray, up: np.ndarray, path: np.ndarray, j: int
    ) -> np.ndarray:
        """Per row of samples (``v``: those within a stretch of a flow's run, ``up``: above the
        gate): some flow slot other than ``j`` sampled there, at most a quarter of its samples
        above the gate. A slow ECMP path leaves the pair's other paths as they were; when every
        path rose and fell with it, the shift is the pair's (congestion at a switch all its
        paths cross), and the pair's own test judges it, the samples between episodes counted.
        One flow's run alone bridged two benign episodes whenever its turn skipped the gap
        between them (full field seed 1143058633: a pair's two ToRs congested 4.7 s apart,
        its slot sampled every four seconds or so). Asked of each half of the run, since over the
        whole run a path off a spine passed that was below in the spine's episode but had risen
        with all the others in the ToR's just before (field draw 920230969 at 1992 s)."""
        below = np.zeros(v.shape[0], bool)
        for k in range(self.config.latency_paths):
            if k == j:
                continue
            vk = v & (path == k)
            n = vk.sum(axis=1)
            below |= (n >= 1) & (4 * (vk & up).sum(axis=1) <= n)
        return below

    def _steps(self, rows: np.ndarray, span_s: float) -> np.ndarray:
        """Per row: how many of its pair's latency samples apart span ``span_s``. A pair gets
        one sample per ``latency_sample_s``, or one per probe where it is probed about that
        often or less (:func:`skh.analysis.sampling.sample_spacing_ns`: a container with more
        peers than its probe budget pays for once a period, the busiest's 256 peers at 100
        probes/s, one every 2.56 s). Counted at one a period, a pair probed every 2 s needed
        21 samples, 40 s of them, to hold a 20 s shift."""
        sample_ns = sample_spacing_ns(
            self.pairs["lat_iv_ns"][rows], int(self.config.latency_sample_s * 1e9)
        )
        return np.ceil(span_s * 1e9 / sample_ns - 1e-9).astype(np.int64)

    def _recurring(
        self, rows: np.ndarray, hop: np.ndarray, hop_e: int, thr: np.ndarray
    ) -> np.ndarray:
        """Per row: its RTT ring (the samples before hop ``hop_e``) holds ``burst_recur`` or
        more runs in a row above ``thr`` of ``burst_min_s`` or longer, together spanning
        ``large_sustained_s``. One benign sample above a large shift is a rare spike; runs of
        them, again and again, are a fault that comes and goes."""
        cfg = self.config
        p = self.pairs
        M = cfg.samples_per_pair
        need = self._steps(rows, cfg.large_sustained_s)
        up = (hop >= 0) & (hop < hop_e) & (p["ring_rtt"][rows] > thr[:, None])
        out = np.zeros(rows.size, bool)
        cand = np.flatnonzero(up.sum(axis=1) >= need)
        if cand.size == 0:
            return out
        order = (p["ring_pos"][rows[cand]][:, None] + np.arange(M)[None, :]) % M
        u = np.take_along_axis(up[cand], order, axis=1).astype(np.int8)
        edge = np.diff(np.pad(u, ((0, 0), (1, 1))), axis=1)
        r0, c0 = np.nonzero(edge == 1)  # run starts, row-major: they pair with the ends
        _, c1 = np.nonzero(edge == -1)
        length = c1 - c0
        long_ = length >= self._steps(rows[cand], cfg.burst_min_s)[r0]
        runs = np.bincount(r0[long_], minlength=cand.size)
        span = np.bincount(r0[long_], weights=length[long_], minlength=cand.size)
        out[cand] = (runs >= cfg.burst_recur) & (span >= need[cand])
        return out

    def _test_block(self, block: int, cand: dict) -> None:
        p = self.pairs[: self._n]
        # a block that held a short-term incident is explained already: its mean is up because
        # of that outage or shift, which was raised when it happened, not because of a drift
        short = p["act_last"][:, : _NET_KINDS.index("latency-long")].max(axis=1)
        fl = self.longterm.test_block(
            block, ~p["dead"] & (short < block * self._block_ns - self._win_ns)
        )
        if fl.pids.size == 0:
            return
        first = np.full(fl.pids.size, block * self._block_ns, np.int64)
        notes = [
            f"mean ln RTT of block up {r:.0%} vs {lag} block(s) earlier: z={z:.1f}, d={d:.2f}"
            for r, lag, z, d in zip(fl.rel_increase, fl.lag_blocks, fl.z, fl.effect_d, strict=True)
        ]
        cand["latency-long"].append((fl.pids, fl.z, first, notes))

    # ------------------------------------------------------------------ events

    def _emit(
        self, now_ns: int, reasons: np.ndarray, cand: dict, flaps: np.ndarray
    ) -> list[SuspectEvent]:
        cfg = self.config
        p = self.pairs[: self._n]
        events: list[SuspectEvent] = []
        src = p["src"].astype(np.int64)
        dst = p["dst"].astype(np.int64)

        def reason_of(ep: np.ndarray) -> np.ndarray:
            out = np.zeros(ep.size, np.int64)
            ok = ep < reasons.size
            out[ok] = reasons[ep[ok]]
            return out

        withheld: dict[int, list[tuple[int, int]]] = {}
        clear_ns = {k: int(cfg.clear_after_s * 1e9) for k in _NET_KINDS}
        clear_ns["latency-long"] = self._block_ns + int(cfg.clear_after_s * 1e9)
        for ki, kind in enumerate(_NET_KINDS):
            since = p["act_since"][:, ki]
            last = p["act_last"][:, ki]
            expired = (since != _NONE) & (last < now_ns - clear_ns[kind])
            since[expired] = _NONE
            if kind == "unreachable":
                p["flap_raised"][expired] = False
            for pids, scores, first_ns, notes in cand[kind]:
                if pids.size == 0:
                    continue
                live = ~p["dead"][pids]
                pids, scores, first_ns = pids[live], scores[live], first_ns[live]
                notes = [n for n, lv in zip(notes, live, strict=True) if lv] if notes else notes
                bad = (reason_of(src[pids]) | reason_of(dst[pids])) != 0
                for i in np.flatnonzero(bad):
                    pi = int(pids[i])
                    for ep in (int(src[pi]), int(dst[pi])):
                        if ep < reasons.size and reasons[ep]:
                            withheld.setdefault(ep, []).append((int(src[pi]), int(dst[pi])))
                good = ~bad
                if kind == "loss":
                    # failures around an outage (its start, its recovery) belong to that outage
                    good &= p["act_since"][pids, _NET_KINDS.index("unreachable")] == _NONE
                new = good & (since[pids] == _NONE)
                last[pids[good]] = now_ns
                if not new.any():
                    continue
                # events list pairs in (src, dst) order, whatever order pairs were first seen in
                order = np.lexsort((dst[pids[new]], src[pids[new]]))
                np_ = pids[new][order]
                scores, first_ns = scores[new][order], first_ns[new][order]
                notes = [notes[i] for i in np.flatnonzero(new)[order]] if notes else []
                since[np_] = now_ns
                events.append(
                    SuspectEvent(
                        kind=kind,
                        pairs=tuple(zip(src[np_].tolist(), dst[np_].tolist(), strict=True)),
                        scores=tuple(float(x) for x in scores),
                        first_seen_ns=int(first_ns.min()),
                        detected_ns=now_ns,
                        explanation=self._explain(kind, np_, scores, notes),
                    )
                )
        events.extend(self._flap_events(now_ns, reasons, flaps))
        events.extend(self._link_events(now_ns, reasons))
        events.extend(self._agent_events(now_ns, reasons, withheld))
        # failures seen while an endpoint was unhealthy are its agent's story, not evidence of
        # a network loss once it recovers
        sick = (reason_of(src) | reason_of(dst)) != 0
        if sick.any():
            self.fast.clear_pairs(np.flatnonzero(sick))
        return events

    def _flap_events(self, now_ns: int, reasons: np.ndarray, flaps: np.ndarray) -> list:
        """Raise once more, as flapping, the open outages that came back after a recovery."""
        if flaps.size == 0:
            return []
        p = self.pairs[: self._n]
        src = p["src"].astype(np.int64)[flaps]
        dst = p["dst"].astype(np.int64)[flaps]
        sick = np.zeros(flaps.size, bool)
        for ep in (src, dst):
            ok = ep < reasons.size
            sick[ok] |= reasons[ep[ok]] != 0
        ki = _NET_KINDS.index("unreachable")
        new = flaps[
            ~sick
            & (p["act_since"][flaps, ki] != _NONE)
            & ~p["flap_raised"][flaps]
            & ~p["dead"][flaps]
        ]
        if new.size == 0:
            return []
        p["flap_raised"][new] = True
        order = np.lexsort((p["dst"][new], p["src"][new]))
        new = new[order]
        st = self.fast.state
        return [
            SuspectEvent(
                kind="unreachable",
                pairs=tuple(zip(p["src"][new].tolist(), p["dst"][new].tolist(), strict=True)),
                scores=tuple(float(x) for x in st["consec"][new]),
                first_seen_ns=int(p["act_since"][new, ki].min()),
                detected_ns=now_ns,
                explanation=(
                    f"{new.size} pair(s) unreachable again within "
                    f"{self.config.fast.flap_window_s:g} s of recovering: flapping"
                ),
                flapping=True,
            )
        ]

    def _link_events(self, now_ns: int, reasons: np.ndarray) -> list[SuspectEvent]:
        """Pairs whose verdicts health withholds (an agent on them is unhealthy) while an
        endpoint's VF link is down: unreachable, raised from link state. Pairs whose agents are
        healthy are the probes' to judge."""
        eps, since = self.links.down(now_ns)
        if eps.size == 0 or self._n == 0:
            return []
        p = self.pairs[: self._n]
        src = p["src"].astype(np.int64)
        dst = p["dst"].astype(np.int64)
        sick = np.zeros(self._n, bool)
        for ep in (src, dst):
            ok = ep < reasons.size
            sick[ok] |= reasons[ep[ok]] != 0
        on_src, on_dst = np.isin(src, eps), np.isin(dst, eps)
        rows = np.flatnonzero((on_src | on_dst) & sick & ~p["dead"])
        if rows.size == 0:
            return []
        ki = _NET_KINDS.index("unreachable")
        p["act_last"][rows, ki] = now_ns
        new = rows[p["act_since"][rows, ki] == _NONE]
        if new.size == 0:
            return []
        p["act_since"][new, ki] = now_ns
        new = new[np.lexsort((dst[new], src[new]))]
        down = np.union1d(src[new][on_src[new]], dst[new][on_dst[new]])
        since_of = dict(zip(eps.tolist(), since.tolist(), strict=True))
        first = min(since_of[e] for e in down.tolist())
        names = ", ".join(str(e) for e in down[:5].tolist()) + (
            f" (+{down.size - 5} more)" if down.size > 5 else ""
        )
        return [
            SuspectEvent(
                kind="unreachable",
                pairs=tuple(zip(src[new].tolist(), dst[new].tolist(), strict=True)),
                scores=tuple((now_ns - first) / 1e9 for _ in new.tolist()),
                first_seen_ns=int(first),
                detected_ns=now_ns,
                explanation=(
                    f"{new.size} pair(s) unreachable: the VF link of endpoint(s) {names} is down "
                    "while another VF of its container is up (oper state from the host); an "
                    "agent on the pairs is unhealthy, so their probes could not tell"
                ),
                endpoints=tuple(int(e) for e in down.tolist()),
            )
        ]

    def _explain(self, kind: str, pids: np.ndarray, scores: np.ndarray, notes: list[str]) -> str:
        cfg = self.config
        p = self.pairs
        i = int(np.argmax(scores))
        ex = f"{int(p['src'][pids[i]])}->{int(p['dst'][pids[i]])}"
        head = f"{pids.size} pair(s) {kind}"
        if kind == "unreachable":
            return (
                f"{head}: the pair's last {cfg.fast.unreachable_after}+ probes, or those of one "
                f"of its flows, all failed (worst {ex}: {int(scores[i])} in a row)"
            )
        if kind == "loss":
            why = f", {notes[i]}" if notes else ""
            return (
                f"{head}: more probes lost than the baseline explains (Poisson tail <= "
                f"{cfg.fast.alpha:g} for the pair, its endpoint or its group; worst {ex}: "
                f"{int(scores[i])} lost{why})"
            )
        return f"{head}; worst {ex}: {notes[i]}" if notes else head

    def _agent_events(
        self, now_ns: int, reasons: np.ndarray, withheld: dict[int, list[tuple[int, int]]]
    ) -> list[SuspectEvent]:
        bad = np.flatnonzero((reasons & int(ALERTING)) != 0).tolist()
        clear_ns = int(self.config.clear_after_s * 1e9)
        for ep in bad:
            if ep in self._agent_since:
                self._agent_since[ep] = now_ns
        # an agent incident ends after clear_after_s of health, so a flapping agent is one incident
        for ep, last in list(self._agent_since.items()):
            if last < now_ns - clear_ns:
                del self._agent_since[ep]
        new = [int(ep) for ep in bad if ep not in self._agent_since]
        if not new:
            return []
        for ep in new:
            self._agent_since[ep] = now_ns
        pairs = tuple(pr for ep in new for pr in withheld.get(ep, []))
        why = "; ".join(
            f"endpoint {ep}: {HealthReason(int(reasons[ep])).name or 'unhealthy'}" for ep in new[:5]
        )
        more = f" (+{len(new) - 5} more)" if len(new) > 5 else ""
        return [
            SuspectEvent(
                kind="agent",
                pairs=pairs,
                scores=tuple(float(reasons[ep]) for ep in new),
                first_seen_ns=now_ns,
                detected_ns=now_ns,
                explanation=(
                    f"{len(new)} endpoint(s) unhealthy, network verdicts "
                    f"on their pairs withheld: {why}{more}"
                ),
                endpoints=tuple(new),
            )
        ]
