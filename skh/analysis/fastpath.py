"""Fast path: outages and loss, decided on every tick from the failed probes received so far,
with statistical evidence against each pair's own baseline.

A healthy production fabric loses a probe now and then (Pingmesh measured 1e-5 to 1e-4 per
packet; some links lose far more), so one lost probe is not a fault: at ten probes a second on
thousands of pairs, benign losses arrive every second. What is a fault:

- **outage** (``unreachable``): the pair's last ``k`` probes all failed and they span at least
  ``unreachable_after_s``, or the same holds for one *flow* of it (the pair's probes of one
  path id, ``path_id % paths``; ``paths`` is the longest rotation a probe plan hands out, so
  each id is its own flow): an ECMP path through a dead link fails every time it comes round
  while the pair's other paths work. ``k`` is the shortest run the pair's baseline makes improbable
  (the posterior mean of ``rate**k`` at most ``alpha``), at least ``unreachable_after``: 3 on
  a quiet pair, more on a lossy one.
- **loss**: more failures than the baseline explains. For each scope — the pair, each endpoint
  (all its pairs, both directions: an RNIC or its access link) and each group of endpoints the
  caller names (e.g. the ToR: the links above it) — the failures ``F`` seen in a window ``W``
  are tested against what the scope's baseline makes likely: the scope is lossy when
  ``P(X >= F) <= alpha``, where ``X`` counts the failures of the probes it sent in ``W`` at a
  loss rate drawn from the baseline's Gamma posterior (a negative binomial: a young baseline
  knows little, so its tail is wide). An endpoint or group pools its pairs' history into one
  rate (they share links). A pair is
  flagged when its own test fires, or when it lost ``loss_count`` probes in the window of a
  scope whose test fired (corroboration: a 2 % CRC on an access link shows as three failures
  a second over the endpoint's pairs while each pair has lost a few; not one: a scope's excess
  may be a switch dead on some path ids of many pairs, beside which another pair's benign
  lost probe is none of its story). Scopes explain away from narrow to
  wide: pairs lossy on their own are left out of their endpoints' tests, and pairs of a lossy
  endpoint out of the groups' (that access link's CRC lifts its ToR's count, but the ToR's
  other pairs, which merely lost a probe, are not corroborated by it). A scope's loss is
  shared: a group's must hold without its worst endpoint, and an endpoint corroborates a pair
  only if what it lost without its pairs to the one other peer it lost most with is still
  improbable (a lossy link on those pairs' path, or the peer's, is their story, not its
  other pairs'). Only *settled*
  failures take part: while a pair's latest probe, or the latest probe of one of its flows,
  failed, the failures since that run began wait until it resolves — an OK makes them loss,
  more failures an outage — so a dead ECMP path is not first called loss, nor does it lift its
  group's count for pairs that merely lost a probe; the pair's earlier failures count.
- an endpoint whose pairs (at least ``endpoint_outage_share`` of them) are all failing, with
  runs jointly improbable under their baselines, is down: those pairs are unreachable, even
  probed once a second.

The **baseline** of a pair is its long-run loss, learned from what it probed (the probe count
comes from sequence numbers, so the agents' thinning of OK results does not bias it) with a
prior of ``prior_loss`` worth ``prior_probes`` probes and forgotten over ``baseline_tau_s``;
the caller stops the learning while a pair is under an incident (:meth:`FastPathState.learn`).
An endpoint's rate is its pairs' pooled baselines, or, where the caller names each endpoint's
access link (its RNIC: :meth:`FastPathState.set_links`) and that link's history is longer, the
link's: every pair that touched the RNIC learned into it the same way, and it outlives the jobs,
so a new job's endpoint is judged against what its link did before (clean or lossy), not
against the prior alone — unless its pairs have already lost more than the link explains (they
cross other lossy links). In the endpoint's test each pair expects its own learned loss, with
that rate as its prior and never less than it: a pair through bad spine links does not lift its
endpoint's count above what the clean pairs beside it set. Where the caller names groups (the
ToR), each group also keeps what its pairs crossing its edge lost (its uplinks), outliving the
jobs too: a young pair through a lossy uplink expects that, not its clean access link's rate.

Failures that are the far end's own story are **excused**, not counted:

- a run of failures toward a responder that ends with a late answer (responder delay at least
  ``stall_evidence_ms``): the responder's host stalled, and answered when it woke;
- failures toward an endpoint whose agent restarted (its prober's numbering began again) while
  they happened (:meth:`FastPathState.excuse_toward`);
- while the responder's own agent has reported nothing sent after a pair's run of failures
  began (it may be dead, stalled or restarting), the pair is **held**: no verdict either way
  yet. A dead agent stays held, and endpoint health speaks for it. The same holds for a run
  already ended: two or more failures sent after the responder's newest report wait for it
  (up to ``hold_max_s``), since its restarted prober's records, which excuse them, may come a
  batch after the peers' OKs.

**Flapping**: an outage that starts within ``flap_window_s`` of the pair's previous outage
ending (a port going down and up) is flagged as such; the flows of a pair still failing when
the OK that ended its outage came (not probed since) are that outage, not a new one.

Only failures that were *reported* count: a missing record is never a loss. ``REFUSED`` and
``LOCAL_ERROR`` are not failures (the network delivered, or the probe never left).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln
from scipy.stats import nbinom

from skh.analysis.sampling import FLOW_SLOTS
from skh.errors import ConfigError

__all__ = ["FastPathConfig", "FastPathState", "FastFlags"]

_NEVER = np.iinfo(np.int64).min
_NO_RUN = np.iinfo(np.int64).max
#: a flow's run is capped here (u1); far above any run an outage needs
_FLOW_CAP = 255
#: an endpoint's pairs whose learned failures are this improbable under its access link's
#: history are judged by their own (see FastPathState._endpoint_pooled)
_LOSSIER_ALPHA = 1e-3
_LOG_LOSSIER_ALPHA = float(np.log(_LOSSIER_ALPHA))


@dataclass(frozen=True, slots=True)
class FastPathConfig:
    #: an outage: this many failures in a row, of the pair or of one of its flows ...
    unreachable_after: int = 3
    #: ... spanning at least this much send time
    unreachable_after_s: float = 0.3
    #: significance of each test (tail probability of what was seen, under the baseline)
    alpha: float = 1e-9
    #: fewest failures a loss verdict rests on
    loss_count: int = 2
    #: the pair's loss test looks back this long and six times as long
    loss_window_s: float = 10.0
    #: endpoint and group tests look back this long, five and fifteen times as long
    group_window_s: float = 2.0
    #: baseline prior: loss per probe, and how many probes' worth of weight it has
    prior_loss: float = 2e-4
    prior_probes: float = 2500.0
    #: the baseline forgets with this time constant ...
    baseline_tau_s: float = 3600.0
    #: ... and learns what a pair probed one to two of these later, if it stayed unflagged
    learn_stage_s: float = 30.0
    #: an OK ending a failure run with a responder delay this large: the responder stalled
    stall_evidence_ms: float = 100.0
    #: a lossy endpoint with at least this share of its pairs failing right now is down
    endpoint_outage_share: float = 0.5
    #: a pair is held at most this long: a responder silent for longer is endpoint health's
    #: case (missed heartbeats withhold its pairs), else its agent is alive but probes nothing
    hold_max_s: float = 3.0
    #: how far two hosts' clocks may disagree (NTP steps of up to a few hundred ms): a pair is
    #: held unless its responder reported this far past the run's start, and a restart's gap
    #: excuses failures this far around it
    clock_skew_s: float = 0.25
    #: an outage starting within this long of the pair's previous outage ending is a flap
    flap_window_s: float = 120.0
    #: failure send times kept per pair
    history: int = 16
    #: flow slots per pair (path ids are folded modulo this; the agents' thinner forwards the OK
    #: that ends a failure run of each)
    paths: int = FLOW_SLOTS

    def __post_init__(self) -> None:
        for name in ("unreachable_after", "loss_count", "history", "paths"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"The '{name}' parameter of FastPathConfig must be >= 1. "
                    f"Got {getattr(self, name)!r} instead."
                )
        for name in ("unreachable_after_s", "stall_evidence_ms", "hold_max_s", "clock_skew_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(
                    f"The '{name}' parameter of FastPathConfig must be >= 0. "
                    f"Got {getattr(self, name)!r} instead."
                )
        for name in (
            "loss_window_s",
            "group_window_s",
            "baseline_tau_s",
            "learn_stage_s",
            "flap_window_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"The '{name}' parameter of FastPathConfig must be > 0. "
                    f"Got {getattr(self, name)!r} instead."
                )
        if not 0 < self.alpha < 1 or not 0 < self.prior_loss < 1 or not self.prior_probes > 0:
            raise ConfigError(
                "FastPathConfig needs 0 < alpha < 1, 0 < prior_loss < 1 and prior_probes > 0. "
                f"Got alpha={self.alpha!r}, prior_loss={self.prior_loss!r}, "
                f"prior_probes={self.prior_probes!r} instead."
            )
        if self.history < self.loss_count:
            raise ConfigError(
                "The 'history' parameter of FastPathConfig must be >= loss_count "
                f"({self.loss_count}). Got {self.history!r} instead."
            )

    @property
    def pair_windows_s(self) -> tuple[float, ...]:
        return (self.loss_window_s, 6 * self.loss_window_s)

    @property
    def group_windows_s(self) -> tuple[float, ...]:
        return (self.group_window_s, 5 * self.group_window_s, 15 * self.group_window_s)


@dataclass(frozen=True, slots=True)
class FastFlags:
    """Pairs the fast path flags now, by kind, with the first failure of the episode."""

    unreachable: np.ndarray
    unreachable_first_ns: np.ndarray
    unreachable_fails: np.ndarray
    loss: np.ndarray
    loss_first_ns: np.ndarray
    loss_fails: np.ndarray
    #: per unreachable pair: its outage restarted within flap_window_s of the last one ending
    unreachable_flapping: np.ndarray
    #: per loss pair: -log10 of the strongest test's tail probability (the evidence)
    loss_evidence: np.ndarray
    #: pairs held for their responder's reports
    held: np.ndarray


class FastPathState:
    def __init__(self, config: FastPathConfig, n_pairs: int = 0) -> None:
        self.config = config
        P = config.paths
        self._dtype = np.dtype(
            [
                ("consec", "<i4"),  # failures since the last OK (by send time)
                ("run_first_ns", "<i8"),  # send time of the first failure of that run
                ("last_t_ns", "<i8"),  # newest send time seen, to keep runs in order
                ("flow_consec", "<u1", (P,)),  # the same per flow (path id % paths) ...
                ("flow_first_ns", "<i8", (P,)),
                ("flow_out", "?", (P,)),  # the flow's current run was called an outage
                ("flow_max", "<i2"),  # ... and over the pair's flows: the longest run, and
                ("flow_run_ns", "<i8"),  # the first failure of any run (_NO_RUN: none)
                ("fail_pos", "<i8"),
                ("fail_ns", "<i8", (config.history,)),  # ring of counted failure send times
                ("rate_hz", "<f4"),  # probes per second (sequence numbers over send time)
                ("base_n", "<f8"),  # baseline: probes and failures, forgetting
                ("base_f", "<f8"),
                ("new_n", "<f8"),  # counted since the stage began ...
                ("new_f", "<f8"),
                ("new_busy", "?"),  # ... and whether the pair was flagged meanwhile
                ("stage_n", "<f8"),  # the previous stage, learned once it stays clean
                ("stage_f", "<f8"),
                ("stage_busy", "?"),
                ("out_end_ns", "<i8"),  # when the pair's previous outage ended
                ("was_out", "?"),  # the current run was called an outage
                ("out_seen_ns", "<i8"),  # when the pair was last seen in an outage
            ]
        )
        self._blank = np.zeros(1, self._dtype)
        self._blank["run_first_ns"] = -1
        self._blank["last_t_ns"] = -1
        self._blank["flow_first_ns"] = -1
        self._blank["flow_run_ns"] = _NO_RUN
        self._blank["fail_ns"] = -1
        self._blank["out_end_ns"] = _NEVER
        self._blank["out_seen_ns"] = _NEVER
        self.state = np.repeat(self._blank, n_pairs)
        self._learned_ns: int | None = None
        # per access link (an RNIC: host and rail), what its endpoints' pairs probed, learned
        # and forgotten as the pairs' baselines are; it outlives the jobs that used the RNIC
        self._ep_link = np.zeros(0, np.int64)
        self._link_n = np.zeros(0)
        self._link_f = np.zeros(0)
        # per grouping the caller names (the ToR: the links above it), what its pairs that
        # cross a group's edge probed, per group: they outlive the jobs too
        self._cross_n: list[np.ndarray] = []
        self._cross_f: list[np.ndarray] = []

    def resize(self, n_pairs: int) -> None:
        grown = np.repeat(self._blank, n_pairs)
        keep = min(n_pairs, len(self.state))
        grown[:keep] = self.state[:keep]
        self.state = grown

    def take(self, keep: np.ndarray) -> None:
        self.state = self.state[keep]

    def clear_pairs(self, pids: np.ndarray) -> None:
        """Forget the pairs' failures and runs (their baseline and rate stay)."""
        s = self.state
        for f in ("consec", "flow_consec", "flow_max", "fail_pos", "flow_out"):
            s[f][pids] = 0
        for f in ("run_first_ns", "flow_first_ns", "fail_ns"):
            s[f][pids] = -1
        s["flow_run_ns"][pids] = _NO_RUN

    def set_links(self, ep_link: np.ndarray) -> None:
        """The access link of each endpoint id: an int per RNIC (host and rail), -1 unknown.
        The ids are the caller's and must name the same RNIC from call to call: they index the
        links' histories, which outlive the endpoints."""
        a = np.asarray(ep_link)
        if a.ndim != 1 or a.dtype.kind not in "iu" or (a.size and a.min() < -1):
            raise ConfigError(
                "FastPathState.set_links takes a 1-D integer array (endpoint id -> link id, "
                f"-1: unknown). Got {a.dtype} of shape {a.shape} instead."
            )
        self._ep_link = a.astype(np.int64)
        m = int(a.max(initial=-1)) + 1
        if m > self._link_n.size:
            self._link_n = np.r_[self._link_n, np.zeros(m - self._link_n.size)]
            self._link_f = np.r_[self._link_f, np.zeros(m - self._link_f.size)]

    def _links_of(self, eps: np.ndarray) -> np.ndarray:
        return _group_of(eps, self._ep_link)

    # ------------------------------------------------------------------ input

    def update(
        self,
        pids: np.ndarray,
        t_ns: np.ndarray,
        failed: np.ndarray,
        path_id: np.ndarray,
        responder_delay_ns: np.ndarray,
        advanced: np.ndarray | None = None,
    ) -> None:
        """Fold one batch of probe outcomes in (``failed``: loss or UNREACHABLE; the rest: OK),
        sorted by pair then send time. ``advanced`` gives, per row, how many probes its pair
        sent since its previous row (from sequence numbers; None: one each).

        A record older than the pair's newest one still lands in the failure history but does
        not reorder the current run."""
        if len(pids) == 0:
            return
        cfg = self.config
        s = self.state
        adv = np.ones(len(pids)) if advanced is None else np.asarray(advanced, np.float64)
        # probe counts and rates
        starts = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]])
        up = pids[starts]
        n_adv = np.add.reduceat(adv, starts)
        s["new_n"][up] += n_adv
        prev_t = s["last_t_ns"][up]
        span_s = np.maximum.reduceat(t_ns, starts) - np.where(prev_t > 0, prev_t, t_ns[starts])
        span_s = span_s / 1e9
        ok_rate = span_s > 0
        r = np.where(ok_rate, n_adv / np.where(ok_rate, span_s, 1.0), 0.0)
        old = s["rate_hz"][up]
        s["rate_hz"][up] = np.where(
            ok_rate, np.where(old > 0, old + 0.3 * (r - old), r), old
        ).astype(np.float32)

        fresh = t_ns > s["last_t_ns"][pids]
        late = ~fresh
        # late rows: failures still land in the history (runs are not reordered)
        if (late & failed).any():
            self._add_failures(pids[late & failed], t_ns[late & failed])
        p, t, f = pids[fresh], t_ns[fresh], failed[fresh]
        path = (path_id[fresh].astype(np.int64) % cfg.paths) if len(p) else path_id[:0]
        rd = responder_delay_ns[fresh]
        if len(p) == 0:
            return
        n = len(p)
        idx = np.arange(n)
        first = np.r_[True, p[1:] != p[:-1]]
        pair_start = np.maximum.accumulate(np.where(first, idx, 0))
        # the last OK (or the pair's first row - 1) at or before each row
        base = np.maximum(np.maximum.accumulate(np.where(~f, idx, -1)), pair_start - 1)
        carried = s["consec"][p] > 0  # per row: the pair's stored run continues into the batch
        prev_same = np.r_[False, ~first[1:]]
        prev = np.maximum(idx - 1, 0)
        # an OK right after failures (of this batch, or of the stored run) ends a run
        ends_run = ~f & ((prev_same & f[prev]) | (first & carried))
        # a run that ends with a late answer was the responder stalling: excuse it
        stalled = ends_run & (rd >= cfg.stall_evidence_ms * 1e6)
        counted = f.copy()
        if stalled.any():
            # failures of this batch that belong to a stalled run: the next OK is a stalled ender
            nxt_ok = np.minimum.accumulate(np.where(~f, idx, n)[::-1])[::-1]
            pend = np.r_[np.flatnonzero(first)[1:], n]
            last_row = np.repeat(pend, np.diff(np.r_[np.flatnonzero(first), n])) - 1
            ender = np.where(nxt_ok <= last_row, nxt_ok, -1)
            counted &= ~((ender >= 0) & stalled[np.maximum(ender, 0)])
            # runs carried over from earlier batches: their stored failures are excused too
            carried_stall = stalled & first & carried
            if carried_stall.any():
                cp = p[carried_stall]
                self._drop_failures(cp, s["run_first_ns"][cp], t[carried_stall])
        if counted.any():
            self._add_failures(p[counted], t[counted])
        # an outage that ends: when (for flapping); its failures were the outage, not loss
        out_end = ends_run & ~stalled & s["was_out"][p]
        if out_end.any():
            oe = np.flatnonzero(out_end)
            s["out_end_ns"][p[oe]] = t[oe]
            in_batch_first = np.where(prev_same[oe], t[np.minimum(base[prev[oe]] + 1, n - 1)], -1)
            from_stored = ~prev_same[oe] | (base[prev[oe]] == pair_start[oe] - 1)
            run_first = np.where(from_stored, s["run_first_ns"][p[oe]], in_batch_first)
            self._drop_failures(p[oe], run_first, t[oe])

        # pair-level run state at the end of the batch
        pstart = np.flatnonzero(first)
        ok_idx = np.where(~f, idx, -1)
        last_ok = np.maximum.reduceat(ok_idx, pstart)
        has_ok = last_ok >= pstart
        pend = np.r_[pstart[1:], n]
        trailing = pend - 1 - last_ok
        upair = p[pstart]
        n_fail = np.add.reduceat(f.astype(np.int64), pstart)
        old_c = s["consec"][upair]
        first_fail = np.where(f, idx, n)
        ffi = np.minimum.reduceat(first_fail, pstart)
        run_first_new = np.where(trailing > 0, t[np.minimum(last_ok + 1, n - 1)], -1)
        cont_first = np.where(
            old_c > 0, s["run_first_ns"][upair], np.where(ffi < pend, t[np.minimum(ffi, n - 1)], -1)
        )
        s["was_out"][upair] &= ~has_ok
        s["consec"][upair] = np.where(has_ok, trailing, old_c + n_fail)
        s["run_first_ns"][upair] = np.where(has_ok, run_first_new, cont_first)
        s["last_t_ns"][upair] = t[pend - 1]

        # per-flow runs: the same, by (pair, path slot), in send order within each flow
        key = p.astype(np.int64) * cfg.paths + path
        order = np.lexsort((t, key))
        k2, f2, t2 = key[order], f[order], t[order]
        fstart = np.flatnonzero(np.r_[True, k2[1:] != k2[:-1]])
        fend = np.r_[fstart[1:], k2.size]
        idx2 = np.arange(k2.size)
        last_ok2 = np.maximum.reduceat(np.where(~f2, idx2, -1), fstart)
        has_ok2 = last_ok2 >= fstart
        trail2 = fend - 1 - last_ok2
        nf2 = np.add.reduceat(f2.astype(np.int64), fstart)
        fp, fs = k2[fstart] // cfg.paths, k2[fstart] % cfg.paths
        oldf = s["flow_consec"][fp, fs].astype(np.int64)
        ffirst = np.minimum.reduceat(np.where(f2, idx2, k2.size), fstart)
        # a flow's outage that ends (its first OK since): its run's failures were that outage,
        # not loss. The pair's outage flag falls with that OK, and failures of the run sent
        # after the last tick that saw the flag up (while the pair was held, or in the batch
        # that brought the OK) otherwise stay in the look-back: at an offline spine's return
        # they lifted the endpoint and ToR tests, and a lossy neighbour was corroborated
        was_out = has_ok2 & (oldf > 0) & s["flow_out"][fp, fs]
        if was_out.any():
            fok = np.minimum.reduceat(np.where(~f2, idx2, k2.size), fstart)[was_out]
            self._drop_failures(fp[was_out], s["flow_first_ns"][fp, fs][was_out], t2[fok])
        s["flow_out"][fp[has_ok2], fs[has_ok2]] = False
        newf = np.minimum(np.where(has_ok2, trail2, oldf + nf2), _FLOW_CAP)
        s["flow_consec"][fp, fs] = newf
        s["flow_first_ns"][fp, fs] = np.where(
            has_ok2,
            np.where(trail2 > 0, t2[np.minimum(last_ok2 + 1, k2.size - 1)], -1),
            np.where(
                oldf > 0,
                s["flow_first_ns"][fp, fs],
                np.where(ffirst < fend, t2[np.minimum(ffirst, k2.size - 1)], -1),
            ),
        )
        if stalled.any():
            # a stalled responder's flows start over too
            sp = np.unique(p[stalled])
            reset = s["consec"][sp] == 0
            s["flow_consec"][sp[reset]] = 0
            s["flow_first_ns"][sp[reset]] = -1
            s["flow_out"][sp[reset]] = False
        # the pair's summary over its flows, for the pairs whose flows had or have a run (a
        # pair rotates over up to 64 path ids: evaluate reads the summary, not every flow)
        touched = np.unique(fp[(oldf > 0) | (newf > 0)])
        if stalled.any():
            touched = np.union1d(touched, sp)
        self._summarise_flows(touched)

    def _hold_unvouched(
        self, ring: np.ndarray, dst: np.ndarray, progress_ns: np.ndarray, now_ns: int
    ) -> np.ndarray:
        """``ring`` without the failures a pair's responder cannot vouch for yet, where it has
        two or more: sent after the newest send time the responder's own agent reported (less
        the clock skew), within ``hold_max_s``. A run ended by the next OK is no longer held as
        a pair, but the responder may have been restarting while it failed: its restarted
        prober's first records, which excuse those failures (:meth:`excuse_toward`), can come
        a batch after the peers' OKs (a false loss event on the held-out draw 595757148: an
        agent away 1.4 s, five and six lost on each of three pairs toward one endpoint, its
        restart seen a second after the tick that fired). One such failure is counted: a CRC
        loses one at a time, and the agents' thinning leaves a responder's reports up to a
        second behind. A responder that never reported (its agent probes no one) is not waited
        for: nothing would vouch."""
        cfg = self.config
        prog = np.full(len(dst), _NEVER)
        ok = dst < progress_ns.size
        prog[ok] = progress_ns[dst[ok]]
        skew = int(cfg.clock_skew_s * 1e9)
        # a responder whose agent never reported (it probes no one) has nothing to wait for
        unvouched = (ring >= 0) & (ring + skew > prog[:, None]) & (prog[:, None] > 0)
        unvouched &= ring > now_ns - int(cfg.hold_max_s * 1e9)
        hold = unvouched.sum(axis=1) >= 2
        if not hold.any():
            return ring
        ring = ring.copy()
        ring[hold] = np.where(unvouched[hold], -1, ring[hold])
        return ring

    def _summarise_flows(self, pids: np.ndarray) -> None:
        if pids.size == 0:
            return
        s = self.state
        fc = s["flow_consec"][pids]
        s["flow_max"][pids] = fc.max(axis=1)
        s["flow_run_ns"][pids] = np.where(fc > 0, s["flow_first_ns"][pids], _NO_RUN).min(axis=1)

    def _add_failures(self, p: np.ndarray, t: np.ndarray) -> None:
        s = self.state
        h = self.config.history
        start = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        cnt = np.diff(np.r_[start, len(p)])
        rank = np.arange(len(p)) - np.repeat(start, cnt)
        pos = (s["fail_pos"][p] + rank) % h
        s["fail_ns"][p, pos] = t
        s["fail_pos"][p[start]] += cnt
        np.add.at(s["new_f"], p, 1.0)

    def _drop_failures(self, pids: np.ndarray, from_ns: np.ndarray, to_ns: np.ndarray) -> None:
        """Take the failures of ``pids`` sent in ``[from_ns, to_ns]`` (per row) out of the
        loss history (and out of what the baseline learns). A pair may come several times (runs
        of one batch, flows): its intervals add up (a write per row would keep only the last
        row's drop)."""
        if pids.size == 0:
            return
        s = self.state
        order = np.argsort(pids, kind="stable")
        pids, from_ns, to_ns = pids[order], from_ns[order], to_ns[order]
        ring = s["fail_ns"][pids]
        gone = (ring >= from_ns[:, None]) & (ring <= to_ns[:, None]) & (ring >= 0)
        start = np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]])
        up = pids[start]
        gone = np.logical_or.reduceat(gone, start, axis=0)
        ring = s["fail_ns"][up]
        ring[gone] = -1
        s["fail_ns"][up] = ring
        s["new_f"][up] -= gone.sum(axis=1)

    def excuse_toward(self, pids: np.ndarray, from_ns: np.ndarray, to_ns: np.ndarray) -> None:
        """Failures of ``pids`` sent in ``[from_ns, to_ns]`` (per pair) were the responder's
        absence (its agent restarted): drop them, and any run they started, the pair's or a
        flow's. The first OK after the absence ends the pair's run but not its other flows':
        each stays in its run until its own path id comes round (at 83 probes a second over
        eight ids, a 0.4 s restart left four in a row on each, an outage of one flow at the
        next tick: a false unreachable event on full-profile seed 750876007)."""
        if pids.size == 0:
            return
        s = self.state
        skew = int(self.config.clock_skew_s * 1e9)
        from_ns, to_ns = from_ns - skew, to_ns + skew
        self._drop_failures(pids, from_ns, to_ns)
        rf = s["run_first_ns"][pids]
        in_run = (s["consec"][pids] > 0) & (rf >= from_ns) & (rf <= to_ns)
        rp = pids[in_run]
        s["consec"][rp] = 0
        s["run_first_ns"][rp] = -1
        ff = s["flow_first_ns"][pids]
        gone = (s["flow_consec"][pids] > 0) & (ff >= from_ns[:, None]) & (ff <= to_ns[:, None])
        gone |= in_run[:, None]
        fp, fs = np.nonzero(gone)
        s["flow_consec"][pids[fp], fs] = 0
        s["flow_first_ns"][pids[fp], fs] = -1
        s["flow_out"][pids[fp], fs] = False
        self._summarise_flows(np.unique(pids[fp]))

    def learn(
        self,
        now_ns: int,
        busy: np.ndarray,
        src: np.ndarray | None = None,
        dst: np.ndarray | None = None,
        groups: list[np.ndarray] | None = None,
    ) -> None:
        """Let the baselines learn. ``busy`` marks the first ``len(busy)`` pairs flagged, held
        or under an incident now. What a pair probed is learned only after a whole stage
        (``learn_stage_s``) followed it without the pair being busy, so the failures of a
        fault, counted before the fault was recognised, do not become its baseline. With the
        pairs' endpoint ids (``src``/``dst``), the access links of their ends (:meth:`set_links`)
        learn it too, and with ``groups`` (as :meth:`evaluate` takes them; a group id must name
        the same group from call to call) so do the groups of both ends of each pair crossing
        from one group to another."""
        s = self.state[: len(busy)]
        s["new_busy"] |= busy
        stage_ns = int(self.config.learn_stage_s * 1e9)
        if self._learned_ns is None:
            self._learned_ns = now_ns
            return
        if now_ns - self._learned_ns < stage_ns:
            return
        decay = np.exp(-(now_ns - self._learned_ns) / 1e9 / self.config.baseline_tau_s)
        self._learned_ns = now_ns
        clean = ~(s["stage_busy"] | s["new_busy"])
        add_n = np.where(clean, s["stage_n"], 0.0)
        add_f = np.where(clean, np.maximum(s["stage_f"], 0.0), 0.0)
        s["base_n"] = s["base_n"] * decay + add_n
        s["base_f"] = s["base_f"] * decay + add_f
        self._link_n *= decay
        self._link_f *= decay
        if src is not None and dst is not None and self._link_n.size:
            la, lb = self._links_of(np.asarray(src)), self._links_of(np.asarray(dst))
            self._link_n += _per_group(la, lb, add_n, self._link_n.size)
            self._link_f += _per_group(la, lb, add_f, self._link_f.size)
        for i in range(len(self._cross_n)):
            self._cross_n[i] *= decay
            self._cross_f[i] *= decay
        if src is not None and dst is not None and groups:
            del self._cross_n[len(groups) :], self._cross_f[len(groups) :]
            for i, g in enumerate(groups):
                ga, gb = _cross(np.asarray(src), np.asarray(dst), g)
                m = int(max(ga.max(initial=-1), gb.max(initial=-1))) + 1
                if i == len(self._cross_n):
                    self._cross_n.append(np.zeros(0))
                    self._cross_f.append(np.zeros(0))
                if m > self._cross_n[i].size:
                    grow = m - self._cross_n[i].size
                    self._cross_n[i] = np.r_[self._cross_n[i], np.zeros(grow)]
                    self._cross_f[i] = np.r_[self._cross_f[i], np.zeros(grow)]
                self._cross_n[i] += _per_group(ga, gb, add_n, self._cross_n[i].size)
                self._cross_f[i] += _per_group(ga, gb, add_f, self._cross_f[i].size)
        s["stage_n"], s["stage_f"], s["stage_busy"] = s["new_n"], s["new_f"], s["new_busy"]
        s["new_n"] = 0.0
        s["new_f"] = 0.0
        s["new_busy"] = False

    # ------------------------------------------------------------------ decision

    def baseline(self, pids: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's benign loss per probe as a Gamma posterior: (shape, rate) — failures
        and probes seen, plus the prior's ``prior_loss * prior_probes`` and ``prior_probes``.
        The prior's shape (0.5 by default) is small on purpose: a fresh pair may sit on a bad
        link, losing ten times the typical rate, and must not be called faulty for that."""
        cfg = self.config
        s = self.state[pids]
        return s["base_f"] + cfg.prior_loss * cfg.prior_probes, s["base_n"] + cfg.prior_probes

    def evaluate(
        self,
        now_ns: int,
        src: np.ndarray,
        dst: np.ndarray,
        n_endpoints: int,
        progress_ns: np.ndarray | None = None,
        groups: list[np.ndarray] | None = None,
    ) -> FastFlags:
        """Which pairs are unreachable or lossy at ``now_ns``. ``src``/``dst`` are the endpoint
        ids of the first ``len(src)`` pairs (the live ones); ``progress_ns`` per endpoint id,
        the newest send time its own agent reported (to hold pairs whose responder is silent);
        ``groups``: per grouping, an array mapping endpoint id → group id (-1: none)."""
        cfg = self.config
        s = self.state[: len(src)]
        n = len(src)
        m_ep = max(n_endpoints, int(max(src.max(initial=-1), dst.max(initial=-1))) + 1)
        consec = s["consec"]
        flow_max = s["flow_max"].astype(np.int64)
        failing = consec > 0
        # a flow or the pair failing right now: an outage in the making, or a loss whose next
        # probe has not said so yet; such a pair waits for its run to resolve
        running = failing | (flow_max > 0)
        held = np.zeros(n, bool)
        if progress_ns is not None and running.any():
            prog = np.full(n, _NEVER)
            ok = dst < progress_ns.size
            prog[ok] = progress_ns[dst[ok]]
            # the first failure of what is running now: the pair's run (any OK before it came
            # from the responder, alive), else the flows' runs
            first = np.where(failing, s["run_first_ns"], s["flow_run_ns"])
            # send times come from two hosts' clocks: allow for their skew
            skew = int(cfg.clock_skew_s * 1e9)
            held = running & (prog < first + skew) & (first > now_ns - int(cfg.hold_max_s * 1e9))
        a_p, b_p = self.baseline(slice(0, n))
        log_alpha = np.log(cfg.alpha)

        # outages: a run the baseline makes improbable, of the pair or of one of its flows
        span_ns = np.where(failing, s["last_t_ns"] - s["run_first_ns"], -1)
        min_span = int(cfg.unreachable_after_s * 1e9)
        k_run = _run_needed(a_p, b_p, log_alpha, cfg.unreachable_after)
        # a pair's flows are so many tests of a run, each at the pair's baseline: the one of
        # them that would be a false outage once in 1/alpha pair tests comes ``paths`` times
        # as often (a flow losing 1.5e-3 of its probes to benign loss lost 3 in a row: field
        # CI draw 1556988735 + 1007480917)
        k_flow = _run_needed(a_p, b_p, log_alpha - np.log(cfg.paths), cfg.unreachable_after)
        pair_out = (consec >= k_run) & (span_ns >= min_span)
        flow_out = flow_max >= k_flow
        outage = (pair_out | flow_out) & ~held
        out_first = np.where(pair_out, s["run_first_ns"], _NO_RUN)
        fo = np.flatnonzero(flow_out & ~pair_out)
        if fo.size:
            hit = s["flow_consec"][fo] >= k_flow[fo, None]
            out_first[fo] = np.where(hit, s["flow_first_ns"][fo], _NO_RUN).min(axis=1)
        fu = np.flatnonzero(flow_out & ~held)
        if fu.size:
            # the flows whose run is an outage: when it ends, its failures leave the look-back
            s["flow_out"][fu] |= s["flow_consec"][fu] >= k_flow[fu, None]
        out_fails = np.maximum(consec, flow_max)
        # ... or of an endpoint: most of its pairs failing together, improbable jointly
        live_n = np.bincount(src, minlength=m_ep) + np.bincount(dst, minlength=m_ep)
        joint = failing & ~held & ~outage
        if joint.any():
            # the endpoint's pairs share its access link: one rate for all of them, from their
            # pooled history, and the probability that its runs all happened by chance
            k_ep = np.bincount(src, weights=np.where(joint, consec, 0), minlength=m_ep)
            k_ep += np.bincount(dst, weights=np.where(joint, consec, 0), minlength=m_ep)
            A, B = self._endpoint_pooled(src, dst, m_ep)
            lp_ep = gammaln(A + k_ep) - gammaln(A) - k_ep * np.log(B)
            f_ep = np.bincount(src[joint], minlength=m_ep) + np.bincount(dst[joint], minlength=m_ep)
            # as many failures in all as a pair's outage needs: two pairs that each lost their
            # latest probe at once are a coincidence a 2 % CRC makes every few minutes
            down = (
                (lp_ep <= log_alpha)
                & (f_ep >= 2)
                & (k_ep >= cfg.unreachable_after)
                & (f_ep >= cfg.endpoint_outage_share * live_n)
            )
            ep_out = joint & (down[src] | down[dst])
            if ep_out.any():
                out_first = np.where(ep_out, s["run_first_ns"], out_first)
                outage |= ep_out

        # loss: failures beyond the baseline, from the runs that have resolved. Failures sent
        # while the pair was in an outage were that outage (raised as such): an ECMP path dead
        # under a switch fails one flow in four, and those failures outlive the outage in the
        # look-back (they raised loss half a minute after the switch came back)
        s["out_seen_ns"][np.flatnonzero(outage)] = now_ns
        wmax = int(max(max(cfg.pair_windows_s), max(cfg.group_windows_s)) * 1e9)
        # a run still open (the pair's, or one of its flows') waits with every failure sent
        # since it began; the pair's failures before it count. Setting the whole pair aside
        # held a lossy link's evidence back: a failure keeps its flow in a run until its path
        # id comes round (14 ids at 40/s: 0.35 s; 45 ids: 1.1 s), so at 2 % the link's pairs
        # sat out the tick that had the evidence (a CRC called a tick late, bench/crc_ttd.py)
        open_ns = np.minimum(np.where(failing, s["run_first_ns"], _NO_RUN), s["flow_run_ns"])
        f_ns = s["fail_ns"]
        ring = np.where((f_ns > s["out_seen_ns"][:, None]) & (f_ns < open_ns[:, None]), f_ns, -1)
        if progress_ns is not None:
            ring = self._hold_unvouched(ring, dst, progress_ns, now_ns)
        cand = np.flatnonzero((ring >= now_ns - wmax).any(axis=1))
        flagged = np.zeros(n, bool)
        evidence = np.zeros(n)
        first_ns = np.full(n, np.iinfo(np.int64).max)
        fails = np.zeros(n, np.int64)
        if cand.size:
            rate = s["rate_hz"].astype(np.float64)
            rc = ring[cand]
            for w in cfg.pair_windows_s:
                in_w = rc >= now_ns - int(w * 1e9)
                F = in_w.sum(axis=1)
                ls = _nb_logsf(F, rate[cand] * w, a_p[cand], b_p[cand])
                hit = (F >= cfg.loss_count) & (ls <= log_alpha)
                self._mark(hit, cand, rc, in_w, F, ls, flagged, evidence, first_ns, fails)
            scopes = [(src, dst, m_ep, None)]
            for g in groups or []:
                gs, gd = _group_of(src, g), _group_of(dst, g)
                m_g = int(max(gs.max(initial=-1), gd.max(initial=-1))) + 1
                eg = np.full(m_ep, -1, np.int64)
                eg[: min(m_ep, g.size)] = g[: min(m_ep, g.size)]
                scopes.append((gs, gd, m_g, eg))
            # scopes from narrow to wide, each explaining away what it found: a pair lossy on
            # its own, or touching a lossy endpoint, is that scope's story and is set aside from
            # wider ones (a CRC on one access link lifts its ToR's count too, but the ToR's
            # other pairs did not lose with it). What a scope expects: the probes of its pairs
            # not explained (a pair in a run counts all it sent: what its open run lost is not
            # counted yet, so the scope expects more than it sees, never less)
            explained = flagged.copy()
            crossing = self._crossing_mean(src, dst, groups or [])
            # pairs whose own history still weighs less than the prior
            young = s["base_n"] < cfg.prior_probes
            for a, b, m, ep_group in scopes:
                if m <= 0:
                    continue
                ca, cb = a[cand], b[cand]
                if ep_group is None:
                    A_g, B_g = self._endpoint_pooled(a, b, m)
                else:
                    A_g, B_g = self._pooled(a, b, m)
                use = ~explained
                lossy = np.zeros(m, bool)
                for w in cfg.group_windows_s:
                    in_w = rc >= now_ns - int(w * 1e9)
                    F_p = in_w.sum(axis=1)
                    if not F_p.any():
                        continue
                    n_g = _per_group(a, b, np.where(use, rate * w, 0.0), m)
                    F_g = _per_group(ca, cb, np.where(use[cand], F_p, 0).astype(np.float64), m)
                    busy = np.flatnonzero(F_g >= cfg.loss_count)
                    if busy.size == 0:
                        continue
                    A_w, B_w = A_g, B_g
                    if ep_group is None:
                        A_w, B_w = self._endpoint_rate_by_pair(
                            a, b, np.where(use, rate * w, 0.0), n_g, A_g, B_g, crossing
                        )
                    ls_g = _nb_logsf(F_g[busy], n_g[busy], A_w[busy], B_w[busy])
                    if ep_group is not None:
                        # a group's loss is shared: it must hold without its worst endpoint.
                        # A young pair on one lossy access link (its own and its endpoint's
                        # baselines too short to call it) lifted its ToR's count on its own,
                        # and the ToR's pairs that merely lost a probe were called lossy with it
                        F_e = _per_group(
                            src[cand], dst[cand], np.where(use[cand], F_p, 0).astype(float), m_ep
                        )
                        n_e = _per_group(src, dst, np.where(use, rate * w, 0.0), m_ep)
                        top_f, top_n = np.zeros(m), np.zeros(m)
                        order = np.argsort(-F_e, kind="stable")
                        order = order[(ep_group[order] >= 0) & (F_e[order] > 0)]
                        gi, first = np.unique(ep_group[order], return_index=True)
                        top_f[gi], top_n[gi] = F_e[order[first]], n_e[order[first]]
                        F_o = np.maximum(F_g[busy] - top_f[busy], 0.0)
                        n_o = np.maximum(n_g[busy] - top_n[busy], 0.0)
                        ls_o = _nb_logsf(F_o, n_o, A_g[busy], B_g[busy])
                        ls_g = np.where(F_o >= cfg.loss_count, np.maximum(ls_g, ls_o), 0.0)
                        ls_g = np.maximum(
                            ls_g,
                            self._young_or_known(
                                a, b, cand, use, young, busy, rate * w, F_p, A_g, B_g
                            ),
                        )
                    sig = busy[ls_g <= log_alpha]
                    if sig.size == 0:
                        continue
                    ls_full = np.zeros(m)
                    ls_full[sig] = ls_g[ls_g <= log_alpha]
                    if ep_group is None and sig.size > 1:
                        sig = self._explain_endpoints(
                            a, b, cand, use, rate * w, F_p, F_g, n_g, A_w, B_w, ls_full, log_alpha
                        )
                        if sig.size == 0:
                            continue
                    lossy[sig] = True
                    la = np.where(ca >= 0, ls_full[np.maximum(ca, 0)], 0.0)
                    lb = np.where(cb >= 0, ls_full[np.maximum(cb, 0)], 0.0)
                    if ep_group is None:
                        ok_a, ok_b = self._corroborates(
                            a, b, cand, use, rate * w, F_p, F_g, n_g, A_w, B_w, sig
                        )
                        la, lb = np.where(ok_a, la, 0.0), np.where(ok_b, lb, 0.0)
                    ls_pair = np.minimum(la, lb)
                    # a scope corroborates only pairs that lost more than once: its excess may
                    # be another story (a switch dead or flapping on some path ids of many
                    # pairs: each lost one or two, and the other pairs of their endpoints and
                    # ToRs, with a benign lost probe each in the window, were called lossy
                    # beside them); one lost probe is no fault, corroborated or not
                    hit = (ls_pair < 0) & (F_p >= cfg.loss_count)
                    self._mark(
                        hit, cand, rc, in_w, F_p, ls_pair, flagged, evidence, first_ns, fails
                    )
                explained |= ((a >= 0) & lossy[np.maximum(a, 0)]) | (
                    (b >= 0) & lossy[np.maximum(b, 0)]
                )
        loss = flagged & ~outage
        u = np.flatnonzero(outage)
        s["was_out"][u] = True
        lo = np.flatnonzero(loss)
        prev_end = s["out_end_ns"][u]
        # a flap is a new outage, begun after the last one ended: a flow whose run began
        # before the OK that ended the pair's outage (not probed since) is that same outage
        gap = out_first[u] - prev_end
        flap = (prev_end != _NEVER) & (gap > 0) & (gap <= int(cfg.flap_window_s * 1e9))
        return FastFlags(
            unreachable=u,
            unreachable_first_ns=out_first[u],
            unreachable_fails=out_fails[u].astype(np.int64),
            loss=lo,
            loss_first_ns=first_ns[lo],
            loss_fails=fails[lo],
            unreachable_flapping=flap,
            loss_evidence=evidence[lo],
            held=np.flatnonzero(held),
        )

    def _young_or_known(self, a, b, cand, use, young, busy, n_p, F_p, A_g, B_g) -> np.ndarray:
        """Per busy group, the log tail probability of its excess in whichever part holds it
        more strongly: its pairs with a history of their own, against the group's rate, or its
        young pairs, whose rate is known only as well as the prior says (one rate for all of
        them: their paths share the group's links, and often the links beyond). A group with
        both must have its excess in one of them (-inf where it has not both, or its young
        pairs lost nothing: the whole group's test decides). A new job's 84 pairs from one ToR
        to four ToRs in other pods, all through a core link losing 1.8e-3 (benign: the field
        regime's bad links), lost 30 in 30 s against the ToR's clean history from its older
        pairs (7.3e-5: 1e-23), which lost 2, and the ToR corroborated each young pair that had
        lost two (a false loss event on full-profile seed 1268465575)."""
        cfg = self.config
        s = self.state[: len(a)]
        m = A_g.size
        ca, cb = a[cand], b[cand]
        yu, ku = use & young, use & ~young
        F_y = _per_group(ca, cb, np.where(yu[cand], F_p, 0).astype(np.float64), m)[busy]
        n_k = _per_group(a, b, np.where(ku, n_p, 0.0), m)[busy]
        out = np.full(busy.size, -np.inf)
        split = (F_y > 0) & (n_k > 0)
        if not split.any():
            return out
        F_k = _per_group(ca, cb, np.where(ku[cand], F_p, 0).astype(np.float64), m)[busy]
        n_y = _per_group(a, b, np.where(yu, n_p, 0.0), m)[busy]
        prior_f = cfg.prior_probes * A_g[busy] / B_g[busy]
        A_y = _per_group(a, b, np.where(yu, s["base_f"], 0.0), m)[busy] + prior_f
        B_y = _per_group(a, b, np.where(yu, s["base_n"], 0.0), m)[busy] + cfg.prior_probes
        ls_y = np.where(F_y >= cfg.loss_count, _nb_logsf(F_y, n_y, A_y, B_y), 0.0)
        ls_k = np.where(F_k >= cfg.loss_count, _nb_logsf(F_k, n_k, A_g[busy], B_g[busy]), 0.0)
        return np.where(split, np.minimum(ls_y, ls_k), out)

    def _explain_endpoints(
        self, a, b, cand, use, n_p, F_p, F_g, n_g, A_g, B_g, ls_e, log_alpha
    ) -> np.ndarray:
        """The lossy endpoints once the stronger of two lossy ends explains their pairs: a pair
        between two of them counts only toward the end whose test is stronger, and the weaker
        end is retested without it. A CRC on one access link fails that endpoint's pairs, so
        each peer's own test rises by the failures of its one pair to it (18 of 21 on held-out
        seed 1566380108): the peer is not lossy for that, and its other pairs, which lost a
        benign probe or three, are not corroborated by it. ``ls_e``: the endpoints' log tail
        probabilities (0 where not significant), updated in place."""
        on = ls_e < 0
        both = use & on[a] & on[b]
        weak_a = both & (ls_e[a] > ls_e[b])
        weak_b = both & (ls_e[b] > ls_e[a])
        m = ls_e.size
        n_drop = np.bincount(a[weak_a], n_p[weak_a], m) + np.bincount(b[weak_b], n_p[weak_b], m)
        wa, wb = weak_a[cand], weak_b[cand]
        ca, cb = a[cand], b[cand]
        f_drop = np.bincount(ca[wa], F_p[wa], m) + np.bincount(cb[wb], F_p[wb], m)
        retest = np.flatnonzero(on & (n_drop > 0))
        if retest.size:
            F2 = np.maximum(F_g[retest] - f_drop[retest], 0.0)
            n2 = np.maximum(n_g[retest] - n_drop[retest], 0.0)
            ls2 = _nb_logsf(F2, n2, A_g[retest], B_g[retest])
            ls_e[retest] = np.where((F2 >= self.config.loss_count) & (ls2 <= log_alpha), ls2, 0.0)
        return np.flatnonzero(ls_e < 0)

    def _corroborates(
        self, a, b, cand, use, n_p, F_p, F_g, n_g, A_g, B_g, sig
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate pair, whether its first and its second end, where lossy (``sig``),
        corroborate it: what the end lost without its pairs (both ways) to the peer it lost
        most with, that pair's peer aside (then the next one), is still improbable
        (:data:`_LOSSIER_ALPHA`). An endpoint's loss is shared by its pairs; where one peer's
        pairs hold nearly all of it, they are the story (a lossy link on their path, or the
        peer's), not its other pairs. On held-out draw 2010081224 a young endpoint lost 13 of
        its 15 failures in 30 s on its pairs to one peer behind an access link losing 3e-3
        each way; its test, stronger than that peer's (whose expectation was higher), called
        its pair from a third endpoint lossy, which had lost 2 probes in those 30 s. A CRC on
        an access link fails all of its endpoint's pairs: two failures of one pair in 2 s are
        improbable on their own, whichever peer lost more."""
        m = F_g.size
        on = np.zeros(m, bool)
        on[sig] = True
        ca, cb = a[cand], b[cand]
        # each lossy endpoint's two peers it lost most with, their failures and probes
        top = np.full((m, 2), -1, np.int64)
        top_f, top_n = np.zeros((m, 2)), np.zeros((m, 2))
        k = use[cand] & (F_p > 0)
        e, q = np.r_[ca[k], cb[k]], np.r_[cb[k], ca[k]]
        f = np.r_[F_p[k], F_p[k]].astype(np.float64)
        keep = on[e]
        key, inv = np.unique(e[keep] * m + q[keep], return_inverse=True)
        f_k = np.bincount(inv, f[keep], key.size)
        ke, kq = key // m, key % m
        order = np.lexsort((-f_k, ke))
        ke, kq, f_k = ke[order], kq[order], f_k[order]
        at = np.arange(ke.size)
        rank = at - np.maximum.accumulate(np.where(np.r_[True, ke[1:] != ke[:-1]], at, 0))
        for r in (0, 1):
            sel = rank == r
            top[ke[sel], r], top_f[ke[sel], r] = kq[sel], f_k[sel]
            pa, pb = use & (top[a, r] == b), use & (top[b, r] == a)
            top_n[:, r] = np.bincount(a[pa], n_p[pa], m) + np.bincount(b[pb], n_p[pb], m)

        def side(end: np.ndarray, peer: np.ndarray) -> np.ndarray:
            ok = on[end].copy()
            i = np.flatnonzero(ok)
            en = end[i]
            r = (top[en, 0] == peer[i]).astype(np.int64)  # the pair's own peer is not left out
            F2 = np.maximum(F_g[en] - top_f[en, r], 0.0)
            n2 = np.maximum(n_g[en] - top_n[en, r], 0.0)
            ok[i] = _nb_logsf(F2, n2, A_g[en], B_g[en]) <= _LOG_LOSSIER_ALPHA
            return ok

        return side(ca, cb), side(cb, ca)

    def _endpoint_rate_by_pair(
        self,
        a: np.ndarray,
        b: np.ndarray,
        n_p: np.ndarray,
        n_g: np.ndarray,
        A_g: np.ndarray,
        B_g: np.ndarray,
        crossing: tuple[np.ndarray, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The Gamma shape and rate that give each endpoint's test its pairs' own expectations:
        each pair expects its own learned loss on the probes ``n_p`` it sent, rather than all
        of them the endpoint's pooled rate. A pair through bad spine links among clean ones
        (its 1.6e-3 beside the pooled 2e-4), losing eleven in half a minute, lifted its
        endpoint's test and was corroborated by it: a false loss event on CI draw 1635903697.
        The mean is the sum.

        A pair expects at least the endpoint's rate, or what pairs crossing the same group edges
        lost (``crossing``, :meth:`_crossing_mean`) where that is higher: a young pair knows
        nothing of its own yet, and its endpoint's access link may be clean while the ToR
        uplinks it crosses are not (CI draw 1810287075: a new job's endpoint whose two peers
        sat behind a ToR uplink at 1e-3 per direction, six lost in 15 s where its clean link's
        history expected 0.03).

        The shape says how well the mean is known: the endpoint's, or, where crossing histories
        set part of the mean, the moments of the two parts matched (the crossing history is
        long and its mean well known; a clean link's few failures leave its rate uncertain, and
        its shape alone had a 2 % CRC behind a lossy uplink wait for 33 failures). The history that
        set the mean is other paths', though: the links of a young pair's path that their own
        histories know less well (a fresh far end's; under a crossing, the near end's) bound
        the shape by their variances too."""
        cfg = self.config
        s = self.state[: len(a)]
        m = B_g.size
        mean_e = A_g / B_g
        c_mean, c_shape = crossing
        mu = np.zeros(m)
        mu_c = np.zeros(m)  # the part the crossing histories set ...
        shape_c = np.full(m, np.inf)  # ... and the least known of them
        mu_f = np.zeros(m)  # the part the far ends' rates set, and its variance
        var_f = np.zeros(m)
        # the parts of a pair's path less known than the history that set its mean: that
        # history is other paths' (the crossing's, or the near link's under earlier jobs), and
        # knew neither a young far end's link nor, under a crossing, the near end's own
        mu_near_x = np.zeros(m)
        var_far_x = np.zeros(m)
        for end, far in ((a, b), (b, a)):
            # the pair's own posterior, the endpoint's rate its prior; never below that rate: the
            # pair's probes are in it already, and counted twice they pulled a clean pair's
            # expectation ten times under its endpoint's (a false loss event on held-out draw
            # 305340123: a 40/s pair with 10k clean probes expected 4e-6, lost 5 in 30 s)
            own = (s["base_f"] + cfg.prior_probes * mean_e[end]) / (s["base_n"] + cfg.prior_probes)
            rate_p = np.maximum(own, mean_e[end])
            # nor below its far end's rate: the pair crosses that end's access link too. A new
            # job's pair whose far end sat on a fresh RNIC (the prior alone) behind a benign bad
            # link lost 9 in 10 s at 83/s, judged against its near end's long clean history
            # (1.9e-4, shape 25): 1e-22 (a false loss event, session 24, quick draw 1560214748
            # with access links at 160/s). Each far end's rate is known as well as its shape
            # says, independently of the others': their variances add
            hi = np.maximum(rate_p, c_mean)
            by_f = mean_e[far] > hi
            by_c = (c_mean > rate_p) & ~by_f
            e = n_p * np.maximum(hi, mean_e[far])
            mu += np.bincount(end, e, m)
            mu_c += np.bincount(end[by_c], e[by_c], m)
            np.minimum.at(shape_c, end[by_c], c_shape[by_c])
            mu_f += np.bincount(end[by_f], e[by_f], m)
            var_f += np.bincount(end[by_f], e[by_f] ** 2 / A_g[far[by_f]], m)
            set_shape = np.where(by_f, A_g[far], np.where(by_c, c_shape, A_g[end]))
            near_x = by_c & (A_g[end] < set_shape)
            mu_near_x += np.bincount(end[near_x], n_p[near_x] * rate_p[near_x], m)
            # a pair's two directions share its far end: their parts add before squaring,
            # bounded here by twice the sum of squares (no pairing of directions needed)
            far_x = ~by_f & (A_g[far] < set_shape)
            e_far = n_p[far_x] * mean_e[far[far_x]]
            var_far_x += np.bincount(end[far_x], 2.0 * e_far**2 / A_g[far[far_x]], m)
        var_c = np.where(mu_c > 0, mu_c**2 / np.where(mu_c > 0, shape_c, 1.0), 0.0)
        var = (mu - mu_c) ** 2 / A_g + var_c
        A_w = np.where((mu_c > 0) & (var > 0), mu**2 / np.maximum(var, 1e-300), A_g)
        # the far ends only ever widen the test: independent parts' variances add in
        # quadrature, so many well-known far ends would narrow it past what the near end knows
        var = (mu - mu_c - mu_f) ** 2 / A_g + var_c + var_f
        A_w = np.where(
            (mu_f > 0) & (var > 0), np.minimum(A_w, mu**2 / np.maximum(var, 1e-300)), A_w
        )
        # the history that set the mean is other pairs' paths: it knows what they share, not
        # the links of a young pair its own history knows less well than that (it stood for
        # the whole path: a fresh far RNIC on a bad link, 15 lost in 30 s at
        # 3.4e-3 against 3.4e-4 of shape 104, a false loss event on quick draw 1616493882)
        var = (mu - mu_c - mu_f + mu_near_x) ** 2 / A_g + var_c + var_f + var_far_x
        A_w = np.where(
            ((mu_near_x > 0) | (var_far_x > 0)) & (var > 0),
            np.minimum(A_w, mu**2 / np.maximum(var, 1e-300)),
            A_w,
        )
        return A_w, np.where(mu > 0, A_w * n_g / np.maximum(mu, 1e-300), B_g)

    def _crossing_mean(
        self, src: np.ndarray, dst: np.ndarray, groups: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per pair, the highest loss per probe learned from pairs crossing the same edge of a
        group (each end's group, each grouping: a ToR's uplinks) and that history's Gamma
        shape; 0 where the pair crosses none or no such history outweighs the prior yet (a
        group's history with nothing learned would only say the prior again, and blunt a new
        job's test against its clean access link)."""
        cfg = self.config
        prior_f = cfg.prior_loss * cfg.prior_probes
        mean_out, shape_out = np.zeros(len(src)), np.zeros(len(src))
        for i, g in enumerate(groups[: len(self._cross_n)]):
            n_h, f_h = self._cross_n[i], self._cross_f[i]
            known = np.where(n_h >= cfg.prior_probes, (f_h + prior_f) / (n_h + cfg.prior_probes), 0)
            ga, gb = _cross(src, dst, g)
            for x in (ga, gb):
                ok = np.flatnonzero((x >= 0) & (x < known.size))
                hi = known[x[ok]] > mean_out[ok]
                mean_out[ok[hi]] = known[x[ok[hi]]]
                shape_out[ok[hi]] = f_h[x[ok[hi]]] + prior_f
        return mean_out, shape_out

    def _pooled(self, a: np.ndarray, b: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """A group's rate as one Gamma posterior: its pairs' pooled history under one prior
        (its pairs share links, so a bad link makes all of them lossy together)."""
        cfg = self.config
        s = self.state[: len(a)]
        A = _per_group(a, b, s["base_f"], m) + cfg.prior_loss * cfg.prior_probes
        B = _per_group(a, b, s["base_n"], m) + cfg.prior_probes
        return A, B

    def _endpoint_pooled(
        self, src: np.ndarray, dst: np.ndarray, m_ep: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each endpoint's rate: its pairs' pooled history, or its access link's where that is
        longer. A new job's endpoint has only the prior, wide on purpose (it may sit on a bad
        link), so its tests needed 13-22 failures of a 2 % CRC (12 s, bench/crc_ttd.py); its
        RNIC's history from the jobs before says whether the link is bad.

        The link's history speaks for the access link alone: where the pairs' own history has
        lost more than it explains (:data:`_LOSSIER_ALPHA`), they cross some other lossy link
        and keep their own rate. A new job's pairs through bad spine links (~1 % benign,
        learned over minutes) were judged against their RNICs' clean past from earlier jobs:
        false loss events on the CI draw 1635903697 + 1968304191."""
        A, B = self._pooled(src, dst, m_ep)
        if self._link_n.size:
            cfg = self.config
            prior_f = cfg.prior_loss * cfg.prior_probes
            lk = self._links_of(np.arange(m_ep))
            i = np.maximum(lk, 0)
            A_l = self._link_f[i] + prior_f
            B_l = self._link_n[i] + cfg.prior_probes
            use = (lk >= 0) & (B_l > B)
            if use.any():
                own_f, own_n = A[use] - prior_f, B[use] - cfg.prior_probes
                lossier = _nb_logsf(own_f, own_n, A_l[use], B_l[use]) <= _LOG_LOSSIER_ALPHA
                use[np.flatnonzero(use)[lossier]] = False
            A = np.where(use, A_l, A)
            B = np.where(use, B_l, B)
        return A, B

    @staticmethod
    def _mark(hit, cand, rc, in_w, F, ls, flagged, evidence, first_ns, fails) -> None:
        if not hit.any():
            return
        rows = cand[hit]
        flagged[rows] = True
        evidence[rows] = np.maximum(evidence[rows], -ls[hit] / np.log(10))
        fw = np.where(in_w[hit], rc[hit], np.iinfo(np.int64).max).min(axis=1)
        first_ns[rows] = np.minimum(first_ns[rows], fw)
        fails[rows] = np.maximum(fails[rows], F[hit])


def _nb_logsf(k: np.ndarray, n: np.ndarray, shape: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """log P(X >= k) for the failures X of ``n`` probes whose loss rate is Gamma(shape, rate):
    a negative binomial (the Poisson's tail, widened by what the baseline does not know)."""
    p = rate / (rate + np.maximum(n, 1e-12))
    return nbinom.logsf(np.asarray(k) - 1, shape, p)


def _run_needed(shape: np.ndarray, rate: np.ndarray, log_alpha: float, least: int) -> np.ndarray:
    """Per pair, the shortest run of failures whose probability under the baseline (the
    Gamma mean of rate**k) is at most alpha, and at least ``least``."""
    k = np.full(shape.shape, least, np.int64)
    for _ in range(64):
        lp = gammaln(shape + k) - gammaln(shape) - k * np.log(rate)
        todo = lp > log_alpha
        if not todo.any():
            break
        k[todo] += 1
    return k


def _group_of(eps: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``g[eps]``, -1 past its end."""
    if g.size == 0:
        return np.full(eps.shape, -1, np.int64)
    return np.where(eps < g.size, g[np.minimum(eps, g.size - 1)], -1)


def _cross(src: np.ndarray, dst: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's two groups under grouping ``g`` where it crosses from one to another, else
    -1 (inside one group, or an end in none)."""
    ga, gb = _group_of(src, g), _group_of(dst, g)
    cross = (ga >= 0) & (gb >= 0) & (ga != gb)
    return np.where(cross, ga, -1), np.where(cross, gb, -1)


def _per_group(a: np.ndarray, b: np.ndarray, v: np.ndarray, m: int) -> np.ndarray:
    """Sum of ``v`` per group over both ends of each pair (a pair inside one group counts once)."""
    out = np.zeros(m)
    ok_a = a >= 0
    np.add.at(out, a[ok_a], v[ok_a])
    ok_b = (b >= 0) & (b != a)
    np.add.at(out, b[ok_b], v[ok_b])
    return out
