"""The field scenario of the evaluation: faults as they arrive in production, on a cluster with
benign noise, probed along the skeleton the pipeline infers.

- **Fault arrivals** are a Poisson process at ``profile.faults_per_h`` (raised far above the real
  rate so that an hour holds enough faults to score; precision at the real rates is *projected*
  from the measured false-positive rate, :func:`projection`), so faults overlap now and then —
  two to five at once — and land at any time; types uniform over the profile's; lengths
  log-normal around ``profile.fault_s``; flapping ones flap aperiodically; a share
  (``profile.new_job_share``) sits on jobs whose containers became ready within the last minute,
  whose pairs have no history yet.
- **Gray faults** (``profile.gray_per_h``): a 0.05-0.5 % loss on a link or a +2-8 µs shift on a
  switch, on every flow or on one flow label of four. Scored apart, as a detection rate per
  magnitude; their events are neither true nor false positives of the gate.
- **Ramps** (:func:`ramp_scenario`): slow latency drifts long enough for the long-term test, on
  a small cluster of their own.

The noise regime and the seeds are the caller's; every draw is keyed by the seed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from skh.analysis.detect import Detector
from skh.analysis.localize import probe_view
from skh.analysis.sampling import ResultThinner
from skh.analysis.skeleton import Skeleton, infer_skeleton
from skh.eval.localization import E2E_WINDOW_S, tick_suspects
from skh.failures import FailureType
from skh.model import Fabric
from skh.orchestrator.config import DEFAULT_COUNTER_HZ
from skh.sim.faults import FAULT_SPECS, SIMULATED_TYPES, Fault, RowSet, link_component
from skh.sim.jobs import SimJob
from skh.sim.scenario import Simulation
from skh.sim.topology import rng_for
from skh.sim.traffic import counter_series

__all__ = [
    "COUNTER_HZ",
    "GRAY_LOSS",
    "GRAY_LATENCY_NS",
    "PAPER_FAILURES_PER_HOST_H",
    "TRACE_FAILURES_PER_HOST_H",
    "Planned",
    "draw_plan",
    "infer_job",
    "inferred_pairs",
    "place",
    "field_run",
    "ramp_scenario",
    "projection",
]

#: the underlay agents' counter rate, which skeleton inference reads TX and RX at
COUNTER_HZ = float(DEFAULT_COUNTER_HZ)

#: gray magnitudes: loss per probe on a link, added latency on a switch
GRAY_LOSS: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.005)
GRAY_LATENCY_NS: tuple[float, ...] = (2_000.0, 4_000.0, 6_000.0, 8_000.0)
#: production failure rates per host-hour: the paper's 4,816 network failures in six months on
#: 4,096+ hosts, and InfiniteHBD's trace (400 servers, 348.98 days): 30 NIC + 40 cable link-down
#: faults, the classes our detector sees (``shared/data/infinitehbd/fault_statistics.json``)
PAPER_FAILURES_PER_HOST_H = 4816 / (4096 * 182.5 * 24)
TRACE_FAILURES_PER_HOST_H = (30 + 40) / (400 * 348.98 * 24)
#: faults whose type the field plan draws: the paper's 19 and the simulator's extras
_FLAPPING = {t for t in SIMULATED_TYPES if FAULT_SPECS[t].flap_period_s > 0}


@dataclass(frozen=True, slots=True)
class Planned:
    start_s: float
    length_s: float
    type: FailureType
    new_job: bool = False
    #: gray faults: ("loss" | "latency", magnitude, paths or None)
    gray: tuple[str, float, tuple[int, ...] | None] | None = None


def draw_plan(profile: Any, seed: int, t0_s: float, t1_s: float) -> list[Planned]:
    """Fault arrivals in ``[t0_s, t1_s)`` (see the module doc), sorted by start."""
    rng = rng_for(seed, 0xF1E1D)
    span = t1_s - t0_s
    types = list(profile.types or SIMULATED_TYPES)
    out: list[Planned] = []
    n = int(rng.poisson(profile.faults_per_h * span / 3600.0))
    for _ in range(n):
        start = t0_s + rng.uniform(0, span)
        length = float(
            np.clip(rng.lognormal(math.log(profile.fault_s), 0.4), 30.0, 4 * profile.fault_s)
        )
        ft = types[int(rng.integers(len(types)))]
        out.append(Planned(start, length, ft, bool(rng.random() < profile.new_job_share)))
    g = int(rng.poisson(profile.gray_per_h * span / 3600.0))
    for _ in range(g):
        start = t0_s + rng.uniform(0, span)
        kind = "loss" if rng.random() < 0.5 else "latency"
        mag = (GRAY_LOSS if kind == "loss" else GRAY_LATENCY_NS)[int(rng.integers(4))]
        paths = (int(rng.integers(4)),) if rng.random() < 0.5 else None
        out.append(
            Planned(
                start,
                float(profile.fault_s * 2),
                FailureType.CRC_ERROR if kind == "loss" else FailureType.CC_ISSUE,
                gray=(kind, float(mag), paths),
            )
        )
    return sorted(out, key=lambda p: p.start_s)


def infer_job(job: SimJob, seed: int, skeleton_s: int) -> Skeleton:
    """A job's skeleton as the pipeline infers it: from what the underlay agents ship, TX and
    RX apart at ``COUNTER_HZ``, over the first ``skeleton_s`` seconds of its training."""
    tx, rx = counter_series(job, skeleton_s, seed, sample_hz=COUNTER_HZ)
    return infer_skeleton(
        job.ep_ids,
        job.host,
        job.rail,
        tx + rx,
        tx_bytes=tx,
        sample_hz=COUNTER_HZ,
        container=job.container,
        job=job.name,
    )


def inferred_pairs(seed: int, skeleton_s: int):
    """The ping pairs of a job as the pipeline probes them (:func:`infer_job`)."""

    def pairs_of(job: SimJob) -> np.ndarray:
        return infer_job(job, seed, skeleton_s).pairs

    return pairs_of


def place(
    sim: Simulation,
    ft: FailureType,
    start: float,
    length: float,
    rng: np.random.Generator,
    *,
    new_job: bool = False,
    paths: tuple[int, ...] | None = None,
) -> str | None:
    """A component for ``ft`` that touches a pair a job really uses (its true skeleton) while
    the job lives past the fault: of a job up for two minutes, or (``new_job``) of one whose
    containers became ready within the last minute. None when no job fits."""
    live = [
        j
        for j in sim.jobs
        if j.end_s > start + length + 60
        and j.skeleton_pairs.size
        and (
            start - 60 <= float(np.max(j.ready_s)) < start
            if new_job
            else float(np.max(j.ready_s)) < start - 120
        )
    ]
    if not live:
        return None
    target = FAULT_SPECS[ft].target
    for _attempt in range(30):
        j = live[int(rng.integers(len(live)))]
        s_ep, d_ep = (int(v) for v in j.skeleton_pairs[int(rng.integers(len(j.skeleton_pairs)))])
        e = sim.cluster.endpoints[s_ep]
        if target == "container":
            comp = e.container
        elif target == "host":
            comp = e.host
        elif target == "rnic":
            comp = f"{e.host}:rnic{e.rail}"
        else:
            pid = paths[0] if paths else int(rng.integers(sim.n_path_ids))
            path = sim.index.path_names(int(sim.eps.rnic[s_ep]), int(sim.eps.rnic[d_ep]), pid)
            if target == "switch":
                comp = path[1 + int(rng.integers(len(path) - 2))]
            else:
                k = int(rng.integers(len(path) - 1))
                comp = link_component(path[k], path[k + 1])
        rows = RowSet.all_paths(sim.index, sim.eps, j.skeleton_pairs, sim.n_path_ids)
        if sim.engine.affected(Fault(ft, comp, start, start + length, paths=paths), rows).any():
            return comp
    return None


def field_run(sim: Simulation, profile: Any, seed: int) -> dict[str, Any]:
    """Run the detector through the field plan on ``sim`` (already built with its regime and
    ping pairs); returns the fault records (with which are gray or on new jobs), the events,
    the suspects of every tick that raised any and what the recent probe records said
    (``views``: healthy pairs, live agents) around them, for end-to-end localization, and the
    detector's stats."""

    det = Detector()
    thinner = ResultThinner()
    rng = rng_for(seed, 0xE7A1)
    duration = int(profile.duration_s)
    plan = draw_plan(profile, seed, profile.warmup_s, duration - profile.fault_s)
    records: list = []
    gray: dict[int, tuple[str, float, tuple[int, ...] | None]] = {}
    new_job: set[int] = set()
    skipped: list[str] = []
    events: list = []
    ticks: list[tuple[float, list]] = []
    views: list[tuple[float, tuple[np.ndarray, np.ndarray]]] = []
    # what the agents shipped in the last 10 s (the pipeline keeps 15 s of it)
    recent: deque[np.ndarray] = deque(maxlen=10)
    view_until = last_view = -math.inf
    ends: list[tuple[float, int]] = []
    n_seen = n_eps = 0
    nxt = 0
    for step in sim.run(duration):
        t = step.t_s
        while nxt < len(plan) and plan[nxt].start_s < t + 2:
            pl = plan[nxt]
            nxt += 1
            paths = pl.gray[2] if pl.gray else None
            comp = place(
                sim, pl.type, pl.start_s, pl.length_s, rng, new_job=pl.new_job, paths=paths
            )
            if comp is None:
                skipped.append(pl.type.name + (" (new job)" if pl.new_job else ""))
                continue
            kw: dict[str, Any] = {}
            if pl.gray:
                kw = {"loss_rate": pl.gray[1]} if pl.gray[0] == "loss" else {"extra_ns": pl.gray[1]}
                kw["paths"] = paths
            elif pl.type in _FLAPPING:
                kw["aperiodic"] = True
            rec = sim.inject(Fault(pl.type, comp, pl.start_s, pl.start_s + pl.length_s, **kw))
            records.append(rec)
            if pl.gray:
                gray[rec.fault_id] = pl.gray
            if pl.new_job:
                new_job.add(rec.fault_id)
        if len(sim.eps) != n_eps:
            n_eps = len(sim.eps)
            # the ToR each endpoint hangs off: pairs through it share its uplinks
            det.set_endpoint_groups(sim.index.rnic_tor[sim.eps.rnic].astype(np.int64))
            # ... and its pod: with the ToR, how many hops its pairs run
            det.set_endpoint_pods(sim.index.tor_pod[sim.index.rnic_tor[sim.eps.rnic]])
            # ... and its RNIC: the access link, whose loss history outlives the jobs
            det.set_endpoint_links(sim.eps.rnic.astype(np.int64))
            # ... and its container: a VF down beside one up is a link down (link state)
            det.set_endpoint_containers(sim.eps.container.astype(np.int64))
        for j in sim.jobs[n_seen:]:
            heapq.heappush(ends, (j.end_s, n_seen))
            n_seen += 1
        while ends and ends[0][0] <= t + 1:
            det.retire(sim.jobs[heapq.heappop(ends)[1]].ep_ids)
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(t)))
        det.link_state(step.counters)
        shipped = thinner.thin(step.probes)  # what the agents ship
        det.ingest(shipped)
        recent.append(shipped)
        now = t + step.dt_s
        evs = det.tick(int(sim.clock.wall_ns(now)))
        if evs:
            events.extend(evs)
            ticks.append((now, tick_suspects(evs, np.concatenate(list(recent)))))
            # localization rounds read the view over the window after a detection
            view_until = now + E2E_WINDOW_S + 5.0
        # the view as the pipeline's rounds take it, at each detection and every 5 s after
        if now <= view_until and (evs or now - last_view >= 5.0):
            views.append((now, probe_view(np.concatenate(list(recent)))))
            last_view = now
    return {
        "records": records,
        "gray": gray,
        "new_job": new_job,
        "events": events,
        "ticks": ticks,
        "views": views,
        "virtual_s": duration,
        "skipped": skipped,
        "planned": len(plan),
        "detector_stats": det.stats,
    }


def ramp_scenario(profile: Any, seed: int, noise: Any) -> dict[str, Any]:
    """Slow latency drifts on a small cluster of their own, long enough for the long-term test:
    ``profile.ramps`` faults ramping over ``ramp_s`` to their full magnitude, starting after a
    clean block. Returns which were caught, by which kind and when, and the false events."""
    from skh.eval.scoring import match_events
    from skh.sim import LINGJUN_TOPO

    block_s = 1800.0
    fabric = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=profile.ramp_hosts)
    sim = Simulation.build(
        fabric,
        max(4, profile.ramp_hosts // 8),
        seed=seed,
        start_s=(-1800.0, -1200.0),
        probe_interval_s=1.0,
        noise=noise,
        job_kw={"lifetime_median_s": 20 * 3600.0, "lifetime_sigma": 0.1},
    )
    rng = rng_for(seed, 0x8A3B)
    types = [
        FailureType.PCIE_NIC_ERROR,
        FailureType.CC_ISSUE,
        FailureType.RNIC_FIRMWARE_NOT_RESPONDING,
    ]
    duration = int(block_s * profile.ramp_blocks)
    records = []
    for i in range(profile.ramps):
        ft = types[i % len(types)]
        start = block_s + rng.uniform(0, block_s / 2)
        comp = place(sim, ft, start, duration - start, rng)
        if comp is None:
            continue
        records.append(
            sim.inject(
                Fault(
                    ft,
                    comp,
                    start,
                    float(duration),
                    profile="ramp",
                    ramp_s=profile.ramp_s,
                    extra_ns=profile.ramp_extra_ns,
                )
            )
        )
    det = Detector()
    if len(sim.eps):
        det.set_endpoint_groups(sim.index.rnic_tor[sim.eps.rnic].astype(np.int64))
        det.set_endpoint_pods(sim.index.tor_pod[sim.index.rnic_tor[sim.eps.rnic]])
        det.set_endpoint_links(sim.eps.rnic.astype(np.int64))
    events = []
    # a block is tested once the watermark (now - allowed lateness) passes its end: run on
    # past the last one's end so that it is
    tail_s = int(np.ceil(det.config.allowed_lateness_s + det.config.hop_s))
    for step in sim.run(duration + tail_s):
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(step.t_s)))
        det.ingest(step.probes)
        events += det.tick(int(sim.clock.wall_ns(step.t_s + step.dt_s)))
    matched, detected = match_events(records, events, int(30e9), {})
    caught = []
    for r in records:
        evs = detected[r.fault_id]
        caught.append(
            {
                "type": r.type.name,
                "component": r.component,
                "start_s": round(r.start_s, 1),
                "caught": bool(evs),
                "kind": evs[0].kind if evs else None,
                "after_s": round((evs[0].detected_ns - r.start_ns) / 1e9, 1) if evs else None,
                "extra_us_then": round(
                    profile.ramp_extra_ns
                    / 1e3
                    * min(1.0, (evs[0].detected_ns - r.start_ns) / 1e9 / profile.ramp_s),
                    2,
                )
                if evs
                else None,
            }
        )
    false = [ev for m, ev in zip(matched, events, strict=True) if m is None]
    return {
        "hosts": len(fabric.hosts),
        "pairs": int(sim.pairs.shape[0]),
        "virtual_h": round(duration / 3600, 2),
        "ramp_s": profile.ramp_s,
        "ramp_extra_us": profile.ramp_extra_ns / 1e3,
        "ramps": len(records),
        "caught": sum(c["caught"] for c in caught),
        "caught_by_long_term": sum(c["kind"] == "latency-long" for c in caught),
        "per_ramp": caught,
        "false_events": len(false),
        "host_hours": round(len(fabric.hosts) * duration / 3600, 1),
        "noise": sim.noise_measured(),
    }


def projection(fp: int, healthy_host_h: float, recall: float | None) -> dict[str, Any]:
    """Precision at production failure rates, from the false-positive rate measured here (and
    its 95 % upper bound: a Poisson count's upper limit; 3 / host-hours when none was seen)."""
    from scipy.stats import chi2

    rate = fp / healthy_host_h if healthy_host_h > 0 else float("nan")
    upper = chi2.ppf(0.975, 2 * (fp + 1)) / 2 / healthy_host_h if healthy_host_h > 0 else math.nan
    r = recall if recall is not None else 0.0
    out = {"fp_per_host_h": rate, "fp_per_host_h_upper95": upper}
    for name, lam in (
        ("paper", PAPER_FAILURES_PER_HOST_H),
        ("infinitehbd_trace", TRACE_FAILURES_PER_HOST_H),
    ):
        tp = r * lam
        out[name] = {
            "failures_per_host_h": lam,
            "precision": round(tp / (tp + rate), 4) if tp + rate > 0 else None,
            "precision_low95": round(tp / (tp + upper), 4) if tp + upper > 0 else None,
        }
    return out
