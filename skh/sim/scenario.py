"""The simulation: a cluster with jobs, stepped through virtual time, producing what the agents
would ship (probe and counter batches, heartbeats) plus ground-truth fault events, and answering
localization queries as agents would.

Probing: every ping pair whose two endpoints are ready (and whose job is alive) probes at its
interval at a fixed per-pair phase; probe *k* of a pair has ``seq = k`` (less the probe number at
its prober's last restart) and ``path_id = k % paths``, so a pair's probes cycle over its ECMP
paths. Interval and ``paths`` are ``probe_interval_s`` and ``n_path_ids`` for every pair, or,
given a ``probe_policy``, the controller's per-job probe plan (what the real agents probe:
:class:`skh.sim.probes.ProbeSchedule`). The ping pairs are the jobs' ground-truth skeletons
(``ping="skeleton"``), the same-rail preload lists (``ping="same_rail"``), what a callable makes
of each job (e.g. the skeleton inferred from its traffic) or any ``(m, 2)`` array set with
:meth:`Simulation.set_ping_pairs`.

Benign noise comes from a named regime (``noise=``, :mod:`skh.sim.noise`; default ``lab``: none):
per-link loss, heavy-tailed jitter, CPU stalls, clock steps, congestion episodes and agent
restarts change the probes; :meth:`Simulation.noise_measured` says what they produced.

Virtual time ``t_s`` is seconds since the simulation epoch; ``t_wall_ns = t0_ns + t_s·1e9``.
Every draw is keyed by (seed, second), so a seed replays exactly, whatever the stepping.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from skh.errors import ConfigError
from skh.failures import FailureType
from skh.model import Cluster, Fabric
from skh.probeplan import ProbePolicy
from skh.records import ProbeStatus
from skh.sim.faults import (
    FAULT_SPECS,
    SIMULATED_TYPES,
    Fault,
    FaultEngine,
    FaultRecord,
    RowSet,
    link_component,
)
from skh.sim.jobs import HostPool, SimJob, generate_jobs
from skh.sim.noise import NoiseModel, NoiseRegime, regime
from skh.sim.probes import NO_STATUS, Effects, ProbeModel, ProbeSchedule
from skh.sim.state import AgentView, FlowEntry, OverlayWalk, TraceHop
from skh.sim.topology import EndpointTable, FabricIndex, rng_for
from skh.sim.traffic import TrafficModel, counter_batch

__all__ = ["VirtualClock", "Step", "FaultEvent", "Simulation", "FAULT_RATES_PER_SERVER_YEAR"]

log = logging.getLogger(__name__)

#: default arrival rates per server-year. NIC and link-down from InfiniteHBD (0.078 NIC faults —
#: split over RNIC hardware, port and GID — and 0.105 cable link-downs per server-year); the paper
#: gives no per-type counts, so the other types take 0.05 each. Raise them with ``rate_scale``.
FAULT_RATES_PER_SERVER_YEAR: dict[FailureType, float] = {
    t: 0.05 for t in SIMULATED_TYPES if t.in_paper
} | {
    FailureType.SWITCH_PORT_DOWN: 0.105,
    FailureType.RNIC_HW_FAILURE: 0.078 * 8 / 29,
    FailureType.RNIC_PORT_DOWN: 0.078 * 10 / 29,
    FailureType.RNIC_GID_CHANGE: 0.078 * 11 / 29,
}

_YEAR_S = 365.25 * 86400


class VirtualClock:
    """Seconds of virtual time since the epoch ``t0_ns`` (wall-clock ns)."""

    __slots__ = ("t0_ns", "now_s")

    def __init__(self, t0_ns: int = 1_700_000_000 * 10**9, now_s: float = 0.0) -> None:
        self.t0_ns = int(t0_ns)
        self.now_s = float(now_s)

    def wall_ns(self, t_s: float | np.ndarray) -> np.ndarray | int:
        if isinstance(t_s, np.ndarray):
            return self.t0_ns + np.round(t_s * 1e9).astype(np.int64)
        return self.t0_ns + int(round(t_s * 1e9))

    @property
    def now_ns(self) -> int:
        return int(self.wall_ns(self.now_s))

    def advance(self, dt_s: float) -> None:
        self.now_s += dt_s


@dataclass(frozen=True, slots=True)
class FaultEvent:
    kind: Literal["start", "end"]
    t_s: float
    record: FaultRecord


@dataclass(frozen=True, slots=True)
class Step:
    """What one step of virtual time produced."""

    t_s: float  # start of the step
    dt_s: float
    probes: np.ndarray  # PROBE_DTYPE, sorted by t_wall_ns
    counters: np.ndarray  # COUNTER_DTYPE, per live endpoint ``counter_hz`` rows a second
    heartbeats: np.ndarray  # uint32 endpoint ids whose agent reported in this step
    events: tuple[FaultEvent, ...]  # ground truth: faults that started or ended in this step


class Simulation:
    """A simulated cluster in virtual time. Build with :meth:`build` or from a cluster and jobs."""

    def __init__(
        self,
        cluster: Cluster,
        jobs: Sequence[SimJob],
        *,
        seed: int = 0,
        ping: Literal["skeleton", "same_rail"]
        | np.ndarray
        | Callable[[SimJob], np.ndarray] = "skeleton",
        probe_interval_s: float = 1.0,
        n_path_ids: int = 4,
        transport: Literal["verbs", "udp"] = "verbs",
        clock: VirtualClock | None = None,
        pool: HostPool | None = None,
        arrivals_per_min: float = 0.0,
        probe_kw: dict | None = None,
        traffic_kw: dict | None = None,
        noise: str | NoiseRegime | None = None,
        probe_policy: ProbePolicy | None = None,
        counter_hz: int = 1,
    ) -> None:
        if not (isinstance(counter_hz, int) and 1 <= counter_hz <= 100):
            raise ConfigError(
                "The 'counter_hz' parameter of Simulation must be an int in 1..100. "
                f"Got {counter_hz!r} instead."
            )
        if not probe_interval_s > 0:
            raise ConfigError(
                f"The 'probe_interval_s' parameter of Simulation must be > 0. "
                f"Got {probe_interval_s!r} instead."
            )
        if not isinstance(n_path_ids, int) or not 1 <= n_path_ids <= 65535:
            raise ConfigError(
                f"The 'n_path_ids' parameter of Simulation must be an int in 1..65535. "
                f"Got {n_path_ids!r} instead."
            )
        if transport not in ("verbs", "udp"):
            raise ConfigError(
                f"The 'transport' parameter of Simulation must be verbs or udp. Got {transport!r}."
            )
        if arrivals_per_min < 0:
            raise ConfigError(
                f"The 'arrivals_per_min' parameter of Simulation must be >= 0. "
                f"Got {arrivals_per_min!r} instead."
            )
        self.cluster = cluster
        self.seed = int(seed)
        self.clock = clock or VirtualClock()
        self.index = FabricIndex(cluster.fabric)
        self.eps = EndpointTable(self.index, cluster)
        self.pool = pool or HostPool(cluster)
        self.probe_interval_s = float(probe_interval_s)
        self.schedule = ProbeSchedule(
            cluster,
            self.index,
            self.eps,
            interval_s=probe_interval_s,
            n_path_ids=n_path_ids,
            policy=probe_policy,
        )
        #: path ids a pair can rotate over at most (rows of the per-(path id, pair) masks)
        self.n_path_ids = self.schedule.n_path_ids
        self.transport = transport
        self.arrivals_per_min = float(arrivals_per_min)
        #: counter samples per second in ``Step.counters`` (the underlay agent's ``counter_hz``;
        #: 1 by default: the field evaluation reads no counters, and 10 samples a second cost
        #: its traffic model ten times the bins)
        self.counter_hz = counter_hz
        if "sample_hz" in (traffic_kw or {}):
            raise ConfigError(
                "Simulation samples traffic at its 'counter_hz': leave 'sample_hz' out of "
                "'traffic_kw'."
            )
        self._traffic_kw = {"sample_hz": float(counter_hz)} | dict(traffic_kw or {})
        self.noise = regime(noise)
        self.noise_model = NoiseModel(self.noise, self.index, self.eps, self.seed)
        self.probe_model = ProbeModel(
            self.index,
            self.eps,
            seed=self.seed,
            **({"sigma": self.noise.rtt_sigma} | (probe_kw or {})),
        )
        self.engine = FaultEngine(self.index, self.eps)
        self.jobs: list[SimJob] = []
        self._traffic: list[TrafficModel] = []
        self._pairs_of: Callable[[SimJob], np.ndarray] | None = None
        if callable(ping):
            self._ping_mode, self._pairs_of = "per_job", ping
        else:
            self._ping_mode = ping if isinstance(ping, str) else "explicit"
        if self._ping_mode not in ("skeleton", "same_rail", "explicit", "per_job"):
            raise ConfigError(
                f"The 'ping' parameter of Simulation must be skeleton, same_rail or an array. "
                f"Got {ping!r} instead."
            )
        self.pairs = np.zeros((0, 2), np.uint32)
        self._pair_base = np.zeros(0)
        self._pair_off = np.zeros(0)
        #: per pair: probe interval (s) and path ids it rotates over
        self._pair_iv = np.zeros(0)
        self._pair_paths = np.zeros(0, np.int64)
        #: per pair: probe number its prober restarted numbering at (agent restarts)
        self._seq_base = np.zeros(0, np.int64)
        #: per flow (pair-major: pair * n_path_ids + path id): route switch ids and one-way
        #: benign loss, grown with the pairs (the noise model's inputs)
        self._flow_nodes = np.zeros((0, 5), np.int32)
        self._flow_loss = np.zeros(0)
        self._fmask: dict[int, np.ndarray] = {}
        self._fany: dict[int, bool] = {}
        self._cands: dict[tuple[str, bool], list[str]] = {}
        self._all_rows: RowSet | None = None
        self._off_order: np.ndarray | None = None
        self._ep_ready = np.zeros(0)
        self._ep_start = np.zeros(0)
        self._ep_end = np.zeros(0)
        self._tx = np.zeros(0)
        self._rx = np.zeros(0)
        self._peer_order: np.ndarray | None = None
        self.faults: list[Fault] = []
        self.ground_truth: list[FaultRecord] = []
        self._by_id: dict[int, FaultRecord] = {}
        self._arrivals = 0
        self.add_jobs(jobs)
        if self._ping_mode == "explicit":
            self.set_ping_pairs(ping)
        self.view = AgentView(
            self.index, cluster, self.eps, self.engine, self.active_faults, self._peers, self._alive
        )

    @classmethod
    def build(
        cls,
        fabric: Fabric,
        n_jobs: int,
        *,
        seed: int = 0,
        start_s: float | tuple[float, float] = (-1800.0, 0.0),
        job_kw: dict | None = None,
        **kw,
    ) -> Simulation:
        """A fresh cluster on ``fabric`` with ``n_jobs`` jobs from :func:`generate_jobs`
        (by default submitted over the 30 min before t = 0, so most are running at the start)."""
        cluster = Cluster(fabric)
        pool = HostPool(cluster)
        jobs = generate_jobs(
            cluster, n_jobs, seed=seed, pool=pool, start_s=start_s, **(job_kw or {})
        )
        return cls(cluster, jobs, seed=seed, pool=pool, **kw)

    # -- jobs and ping pairs -----------------------------------------------------------------------
    def add_jobs(self, jobs: Sequence[SimJob]) -> None:
        """Track more jobs (already registered in the cluster) from now on."""
        if not jobs:
            return
        self.eps.sync()
        n = len(self.eps)
        grow = n - self._ep_ready.size
        self._ep_ready = np.concatenate([self._ep_ready, np.full(grow, np.inf)])
        self._ep_start = np.concatenate([self._ep_start, np.full(grow, np.inf)])
        self._ep_end = np.concatenate([self._ep_end, np.full(grow, -np.inf)])
        self._tx = np.concatenate([self._tx, np.zeros(grow)])
        self._rx = np.concatenate([self._rx, np.zeros(grow)])
        for j in jobs:
            self._ep_ready[j.ep_ids] = j.ready_s
            self._ep_start[j.ep_ids] = j.start_s
            self._ep_end[j.ep_ids] = j.end_s
        self.jobs.extend(jobs)
        self._traffic.append(
            TrafficModel(jobs, seed=self.seed + len(self._traffic), **self._traffic_kw)
        )
        if self._ping_mode == "skeleton":
            self._append_pairs(np.concatenate([j.skeleton_pairs for j in jobs]))
        elif self._ping_mode == "same_rail":
            self._append_pairs(np.concatenate([_same_rail(j) for j in jobs]))
        elif self._ping_mode == "per_job":
            got = [np.asarray(self._pairs_of(j), np.uint32).reshape(-1, 2) for j in jobs]
            self._append_pairs(np.concatenate(got))

    def set_ping_pairs(self, pairs: np.ndarray) -> None:
        """Probe exactly these ordered (src, dst) endpoint pairs from now on (e.g. a controller's
        ping lists); readiness still gates each pair."""
        pairs = np.asarray(pairs)
        if (
            pairs.ndim != 2
            or pairs.shape[1] != 2
            or (pairs.size and (pairs.min() < 0 or pairs.max() >= len(self.eps)))
        ):
            raise ConfigError(
                "The 'pairs' parameter of set_ping_pairs must be an (m, 2) array of known "
                "endpoint ids."
            )
        self._ping_mode = "explicit"
        self.pairs = np.zeros((0, 2), np.uint32)
        self._pair_base = np.zeros(0)
        self._pair_off = np.zeros(0)
        self._pair_iv = np.zeros(0)
        self._pair_paths = np.zeros(0, np.int64)
        self._seq_base = np.zeros(0, np.int64)
        self._flow_nodes = np.zeros((0, 5), np.int32)
        self._flow_loss = np.zeros(0)
        self._append_pairs(pairs.astype(np.uint32))

    def _append_pairs(self, pairs: np.ndarray) -> None:
        if pairs.size == 0:
            return
        base = self.probe_model.base_rtt_ns(pairs[:, 0], pairs[:, 1])
        h = rng_for(self.seed, 0x0FF, self.pairs.shape[0])
        iv, n_paths = self.schedule.plan(pairs)
        self.pairs = np.concatenate([self.pairs, pairs.astype(np.uint32)])
        self._pair_base = np.concatenate([self._pair_base, base])
        self._pair_off = np.concatenate([self._pair_off, h.random(pairs.shape[0]) * iv])
        self._pair_iv = np.concatenate([self._pair_iv, iv])
        self._pair_paths = np.concatenate([self._pair_paths, n_paths])
        self._seq_base = np.concatenate([self._seq_base, np.zeros(pairs.shape[0], np.int64)])
        if not self.noise.quiet:
            n = self.n_path_ids
            sr = np.repeat(self.eps.rnic[pairs[:, 0]].astype(np.int64), n)
            dr = np.repeat(self.eps.rnic[pairs[:, 1]].astype(np.int64), n)
            nodes = self.index.route(sr, dr, np.tile(np.arange(n), pairs.shape[0])).nodes
            self._flow_nodes = np.concatenate([self._flow_nodes, nodes])
            self._flow_loss = np.concatenate(
                [self._flow_loss, self.noise_model.flow_loss(sr, dr, nodes)]
            )
            self.noise_model.forget_flows()
        self._peer_order = None
        self._fmask.clear()
        self._fany.clear()
        self._cands.clear()
        self._all_rows = None
        self._off_order = None

    @property
    def ep_ready_s(self) -> np.ndarray:
        """Per ep_id: when its container becomes ready (inf for untracked endpoints); read-only."""
        return self._ep_ready

    @property
    def ep_start_s(self) -> np.ndarray:
        """Per ep_id: when its container is created (its job submitted); read-only."""
        return self._ep_start

    @property
    def ep_end_s(self) -> np.ndarray:
        """Per ep_id: when its container is torn down; read-only."""
        return self._ep_end

    def live_pairs(self, t_s: float | None = None, pairs: np.ndarray | None = None) -> np.ndarray:
        """Mask over ``pairs`` (default: the ping pairs): both endpoints ready and alive at
        ``t_s`` (default now) — the pairs that probe then."""
        t = self.clock.now_s if t_s is None else float(t_s)
        p = self.pairs if pairs is None else pairs
        return (
            (self._ep_ready[p[:, 0]] <= t)
            & (self._ep_ready[p[:, 1]] <= t)
            & (self._ep_end[p[:, 0]] > t)
            & (self._ep_end[p[:, 1]] > t)
        )

    def _peers(self, ep: int) -> np.ndarray:
        if self._peer_order is None:
            self._peer_order = np.argsort(self.pairs[:, 0], kind="stable")
        src = self.pairs[self._peer_order, 0]
        lo, hi = np.searchsorted(src, ep, "left"), np.searchsorted(src, ep, "right")
        return self.pairs[self._peer_order[lo:hi], 1]

    def _alive(self, eps: np.ndarray, t_s: float) -> np.ndarray:
        return (self._ep_start[eps] <= t_s) & (self._ep_end[eps] > t_s)

    # -- faults ------------------------------------------------------------------------------------
    def active_faults(self, t_s: float) -> list[Fault]:
        # Fault.active() inlined: agents' answers ask this tens of thousands of times per run
        return [f for f in self.faults if f.start_s <= t_s < f.end_s]

    def inject(self, fault: Fault, *, group: int = -1) -> FaultRecord:
        """Add a fault; returns its ground-truth record (affected pairs: ping pairs it touches on
        any path id, ignoring flap windows, as of now)."""
        self.engine.check(fault)
        fault = fault.with_id(len(self.faults), group)
        self.faults.append(fault)
        mask = self._fault_mask(fault)
        aff = self.pairs[mask.reshape(self.n_path_ids, -1).any(axis=0)]
        jobs = tuple(sorted({self.cluster.endpoints[int(e)].job for e in np.unique(aff)}))
        rec = FaultRecord(
            fault_id=fault.fault_id,
            type=fault.type,
            name=fault.spec.name,
            layer=fault.spec.layer,
            target=fault.spec.target,
            component=fault.component,
            start_s=fault.start_s,
            end_s=fault.end_s,
            start_ns=int(self.clock.wall_ns(fault.start_s)),
            end_ns=int(self.clock.wall_ns(fault.end_s)) if math.isfinite(fault.end_s) else -1,
            affected_pairs=aff,
            jobs=jobs,
            group=fault.group,
            params={
                k: fault.eff(k)
                for k in ("loss_rate", "extra_ns", "flap_period_s", "flap_on_s", "flow_share")
            }
            | {"profile": fault.profile, "ramp_s": fault.ramp_s},
        )
        self.ground_truth.append(rec)
        self._by_id[rec.fault_id] = rec
        log.debug(
            "inject %s on %s at %.1f s: %d pairs",
            fault.type.name,
            fault.component,
            fault.start_s,
            len(aff),
        )
        return rec

    def _fault_mask(self, fault: Fault) -> np.ndarray:
        """Which (path id, pair) rows the fault touches, flat as ``path_id * n_pairs + pair``;
        cached until the ping pairs change."""
        m = self._fmask.get(fault.fault_id)
        if m is None:
            if self._all_rows is None:
                self._all_rows = self._all_paths_rows()
            m = self.engine.affected(fault, self._all_rows) & self.rows_in_use()
            self._fmask[fault.fault_id] = m
        return m

    def rows_in_use(self) -> np.ndarray:
        """Of the ``path_id * n_pairs + pair`` rows, those a pair probes (ids below its
        rotation length)."""
        return (np.arange(self.n_path_ids)[:, None] < self._pair_paths[None, :]).ravel()

    def _fault_any(self, fault: Fault) -> bool:
        a = self._fany.get(fault.fault_id)
        if a is None:
            a = self._fany[fault.fault_id] = bool(self._fault_mask(fault).any())
        return a

    def _all_paths_rows(self) -> RowSet:
        return RowSet.all_paths(self.index, self.eps, self.pairs, self.n_path_ids)

    def candidates(self, ftype: FailureType, *, used_only: bool = True) -> list[str]:
        """Components a fault of ``ftype`` could sit on; ``used_only`` keeps those on some ping
        pair's path (a fault nobody probes across is invisible by construction)."""
        t = FAULT_SPECS[ftype].target
        key = (t, used_only)
        if key not in self._cands:
            self._cands[key] = self._candidates(t, used_only)
        return self._cands[key]

    def _candidates(self, t: str, used_only: bool) -> list[str]:
        ix = self.index
        pairs = self.pairs
        if t == "container":
            eps = np.unique(pairs) if used_only else np.arange(len(self.eps))
            return sorted({self.eps.container_names[c] for c in np.unique(self.eps.container[eps])})
        if t == "host":
            eps = np.unique(pairs) if used_only else np.arange(len(self.eps))
            return [ix.host_names[h] for h in np.unique(self.eps.host[eps])]
        if t == "rnic":
            eps = np.unique(pairs) if used_only else np.arange(len(self.eps))
            return [ix.rnic_key(r) for r in np.unique(self.eps.rnic[eps])]
        if not used_only:
            if t == "switch":
                return list(ix.switch_names)
            return [link_component(a, b) for a, b in sorted(ix.fabric.links)]
        if self._all_rows is None:
            self._all_rows = self._all_paths_rows()
        nd = self._all_rows.route.nodes[self.rows_in_use()]
        if t == "switch":
            return [ix.switch_names[s] for s in np.unique(nd[nd >= 0])]
        links = set()
        n_sw = np.int64(len(ix.switch_names))
        for x, y in ((0, 1), (1, 2), (2, 3), (3, 4)):
            u, v = nd[:, x].astype(np.int64), nd[:, y].astype(np.int64)
            ok = (u >= 0) & (v >= 0) & (u != v)
            for k in np.unique(u[ok] * n_sw + v[ok]).tolist():
                links.add(link_component(ix.switch_names[k // n_sw], ix.switch_names[k % n_sw]))
        for r in np.unique(self.eps.rnic[np.unique(pairs)]):
            links.add(link_component(ix.rnic_key(r), ix.switch_names[ix.rnic_tor[r]]))
        return sorted(links)

    def inject_random(
        self,
        duration_s: float,
        *,
        rate_scale: float = 1.0,
        types: Sequence[FailureType] | None = None,
        rates: dict[FailureType, float] | None = None,
        median_length_s: float = 600.0,
        seed: int | None = None,
    ) -> list[FaultRecord]:
        """Draw faults arriving in ``[now, now + duration_s)`` as Poisson processes (per-server-year
        rates × hosts × ``rate_scale``), each on a random used component, log-normal lengths."""
        rng = rng_for(self.seed if seed is None else seed, 0xFA17, int(self.clock.now_s))
        rates = rates or FAULT_RATES_PER_SERVER_YEAR
        hosts = len(self.index.host_names)
        out = []
        for t in types or list(rates):
            lam = rates.get(t, 0.0) * hosts * rate_scale * duration_s / _YEAR_S
            k = int(rng.poisson(lam))
            if k == 0:
                continue
            cands = self.candidates(t)
            if not cands:
                continue
            for _ in range(k):
                start = self.clock.now_s + rng.uniform(0, duration_s)
                length = rng.lognormal(np.log(median_length_s), 0.8)
                out.append(
                    self.inject(
                        Fault(t, cands[int(rng.integers(len(cands)))], start, start + length)
                    )
                )
        return out

    def inject_both_layers(
        self,
        overlay: FailureType,
        underlay: FailureType,
        start_s: float,
        end_s: float = math.inf,
        *,
        seed: int = 0,
    ) -> tuple[FaultRecord, FaultRecord]:
        """Two faults at once, one in each layer, on components that share a job: the overlay one
        on an endpoint's container/RNIC/host, the underlay one on a link or switch of that job's
        probe paths. Both records share a ``group``."""
        rng = rng_for(seed, 0xB07)
        if self.pairs.size == 0:
            raise ConfigError("inject_both_layers: there are no ping pairs to fault")
        i = int(rng.integers(self.pairs.shape[0]))
        src, dst = int(self.pairs[i, 0]), int(self.pairs[i, 1])
        e = self.cluster.endpoints[src]
        t_over = FAULT_SPECS[overlay].target
        comp_o = {"container": e.container, "host": e.host, "rnic": f"{e.host}:rnic{e.rail}"}.get(
            t_over
        )
        if comp_o is None:
            raise ConfigError(f"inject_both_layers: {overlay.name} is not an endpoint-side fault")
        # the underlay fault sits on the far end's path: a link or switch of (src, dst) path 0
        path = self.index.path_names(int(self.eps.rnic[src]), int(self.eps.rnic[dst]), 0)
        if FAULT_SPECS[underlay].target == "switch":
            comp_u = path[len(path) // 2]
        elif FAULT_SPECS[underlay].target == "link":
            k = len(path) // 2
            comp_u = link_component(path[k], path[k + 1])
        else:
            raise ConfigError(f"inject_both_layers: {underlay.name} is not a link or switch fault")
        group = 1 + max((f.group for f in self.faults), default=0)
        a = self.inject(Fault(overlay, comp_o, start_s, end_s), group=group)
        b = self.inject(Fault(underlay, comp_u, start_s, end_s), group=group)
        return a, b

    # -- stepping ----------------------------------------------------------------------------------
    def _probe_rows(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(pair index, probe number k) of every probe sent in [t, t + 1)."""
        if self.pairs.shape[0] == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        active = self.live_pairs(t)
        if self._off_order is None:
            self._off_order = np.argsort(self._pair_off, kind="stable")
        idx = self._off_order[active[self._off_order]]
        iv = self._pair_iv[idx]
        off = self._pair_off[idx]
        k_lo = np.ceil((t - off) / iv - 1e-9).astype(np.int64)
        k_hi = np.ceil((t + 1.0 - off) / iv - 1e-9).astype(np.int64)
        cnt = k_hi - k_lo
        rows = np.repeat(idx, cnt)
        start = np.repeat(np.cumsum(cnt) - cnt, cnt)
        k = np.repeat(k_lo, cnt) + (np.arange(rows.size) - start)
        return rows, k

    def step(self, seconds: int = 1) -> Step:
        """Advance the clock by ``seconds`` whole seconds and return what they produced."""
        if not isinstance(seconds, int) or seconds < 1:
            raise ConfigError(
                f"The 'seconds' parameter of Simulation.step must be an int >= 1. Got {seconds!r}."
            )
        t_first = self.clock.now_s
        probes, counters, beats, events = [], [], [], []
        for _ in range(seconds):
            t = self.clock.now_s
            self._arrive(t)
            pr, ct, hb = self._one_second(t)
            probes.append(pr)
            counters.append(ct)
            beats.append(hb)
            for rec in self.ground_truth:
                if t <= rec.start_s < t + 1:
                    events.append(FaultEvent("start", rec.start_s, rec))
                if t <= rec.end_s < t + 1:
                    events.append(FaultEvent("end", rec.end_s, rec))
            self.clock.advance(1.0)
        return Step(
            t_first,
            float(seconds),
            np.concatenate(probes) if len(probes) > 1 else probes[0],
            np.concatenate(counters) if len(counters) > 1 else counters[0],
            np.concatenate(beats) if len(beats) > 1 else beats[0],
            tuple(events),
        )

    def run(self, duration_s: int, *, step_s: int = 1) -> Iterator[Step]:
        """Steps of ``step_s`` seconds until ``duration_s`` seconds have passed."""
        done = 0
        while done < duration_s:
            n = min(step_s, duration_s - done)
            yield self.step(n)
            done += n

    def _one_second(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = rng_for(self.seed, 0x5EC, int(round(t * 1000)))
        active = [f for f in self.faults if f.start_s < t + 1.0 and f.end_s > t]
        live = np.flatnonzero((self._ep_start <= t) & (self._ep_end > t))
        down_eps = self._down_endpoints(active, t)
        traffic = []
        hz = self.counter_hz
        for tm in self._traffic:
            tx, rx = tm.window(t, hz)  # this second's counter intervals
            if down_eps.size:
                off = np.isin(tm.ep_ids, down_eps)  # a VF whose link is down moves nothing
                tx[off] = rx[off] = 0.0
            traffic.append((tm, tx, rx))
        rows, k = self._probe_rows(t)
        t_row = self._pair_off[rows] + k * self._pair_iv[rows]
        if self.probe_interval_s != 1.0 or self.schedule.policy is not None:
            # rows come in phase order; with one probe per pair per second that is time order
            order = np.argsort(t_row, kind="stable")
            rows, k, t_row = rows[order], k[order], t_row[order]
        src, dst = self.pairs[rows, 0], self.pairs[rows, 1]
        path = (k % self._pair_paths[rows]).astype(np.uint16)
        eff = None
        if active:
            rs = RowSet(self.index, self.eps, src, dst, path, t_row)
            flat = path.astype(np.int64) * self.pairs.shape[0] + rows
            touching = [f for f in active if self._fault_any(f)]
            masks = [self._fault_mask(f)[flat] for f in touching]
            eff = self.engine.effects(touching, rs, rng, masks)
            if eff is not None and self.transport == "udp":
                # a dead agent's port answers ICMP port unreachable over UDP; verbs just time out
                for f in active:
                    if f.type == FailureType.AGENT_CRASH:
                        c = self.eps.container_id(f.component)
                        hit = (
                            (self.eps.container[dst] == c) & self.engine.on_now(f, t_row) & eff.emit
                        )
                        eff.status[hit] = ProbeStatus.REFUSED
        seq = k - self._seq_base[rows]
        wall = self.clock.wall_ns(t_row)
        quiet_beats = np.zeros(0, np.int64)
        if not self.noise.quiet:
            bursting = np.concatenate(
                [tm.ep_ids[tx.sum(axis=1) > 0.5 * tm.burst] for tm, tx, _ in traffic]
                or [np.zeros(0, np.uint32)]
            )
            eff, seq, wall, quiet_beats, faulted = self._noise(
                t, rows, seq, src, dst, path, t_row, eff, live, bursting
            )
        probes = self.probe_model.sample(
            src,
            dst,
            seq.astype(np.uint32),
            path,
            wall,
            rng,
            base_ns=self._pair_base[rows],
            effects=eff,
        )
        if not self.noise.quiet:
            self._ledger_probes(probes, faulted if eff is None else faulted[eff.emit], rows, eff)
        # counters: every endpoint of a live container, at the end of each counter interval
        up = np.ones(live.size, np.uint8)
        if down_eps.size:
            up[np.isin(live, down_eps)] = 0
        batches = []
        for i in range(hz):
            for tm, tx, rx in traffic:
                self._tx[tm.ep_ids] += tx[:, i]
                self._rx[tm.ep_ids] += rx[:, i]
            batches.append(
                counter_batch(
                    live.astype(np.uint32),
                    int(self.clock.wall_ns(t + (i + 1) / hz)),
                    self._tx[live].astype(np.uint64),
                    self._rx[live].astype(np.uint64),
                    oper_up=up,
                )
            )
        counters = batches[0] if hz == 1 else np.concatenate(batches)
        silent = self._silent_endpoints(active, t)
        if quiet_beats.size:
            silent = np.concatenate([silent, quiet_beats])
        beats = live[~np.isin(live, silent)].astype(np.uint32)
        return probes, counters, beats

    def _noise(
        self,
        t: float,
        rows: np.ndarray,
        seq: np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        path: np.ndarray,
        t_row: np.ndarray,
        eff: Effects | None,
        live: np.ndarray,
        bursting: np.ndarray,
    ) -> tuple[Effects, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The regime's benign noise on one second's probes (see :mod:`skh.sim.noise`): returns
        the effects, sequence numbers and send times to stamp, the endpoints whose heartbeat
        this second does not arrive, and which rows a fault touched (for the noise ledger)."""
        nz, nm = self.noise, self.noise_model
        g = rng_for(self.seed, 0x401E, int(round(t * 1000)))
        n = rows.size
        if eff is None:
            eff = Effects.none(n)
            faulted = np.zeros(n, bool)
        else:
            faulted = (
                (eff.status != NO_STATUS)
                | (eff.loss_p > 0)
                | (eff.req_loss_p > 0)
                | (eff.rep_loss_p > 0)
                | (eff.extra_ns != 0)
                | ~eff.emit
                | (eff.prober_extra_ns != 0)
                | (eff.responder_extra_ns != 0)
            )
        nm.advance(t, np.unique(self.eps.container[live]))
        flow = rows * self.n_path_ids + path
        p = self._flow_loss[flow]
        eff.req_loss_p = 1.0 - (1.0 - eff.req_loss_p) * (1.0 - p)
        eff.rep_loss_p = 1.0 - (1.0 - eff.rep_loss_p) * (1.0 - p)
        eff.extra_ns = eff.extra_ns + nm.tail_ns(n, g)
        # congestion episodes start on a switch a bursting job's probed flow crosses
        if bursting.size and nz.congestion_per_switch_h > 0:
            busy = np.flatnonzero(np.isin(self.pairs[:, 0], bursting))
            if busy.size:
                flows = busy * self.n_path_ids + g.integers(0, self.n_path_ids, busy.size)
                nm.start_congestion(t, flows, self._flow_nodes)
        for sw, s0, s1, x in nm.congestion:
            if s1 <= t or s0 >= t + 1.0:
                continue
            m = nm.switch_flows(sw, self._flow_nodes)[flow] & (t_row >= s0) & (t_row < s1)
            eff.extra_ns[m] += x
            nm.ledger.congestion_rows += int(m.sum())
        quiet: list[np.ndarray] = []
        restart_lost = np.zeros(n, bool)
        beat_t = t + 0.5  # an agent's heartbeat leaves mid-second
        if nm.stalls:
            hs, hd = self.eps.host[src], self.eps.host[dst]
            timeout_ns = nz.probe_timeout_s * 1e9
            for h, s0, s1 in nm.stalls:
                if s1 <= t or s0 >= t + 1.0 + nz.probe_timeout_s:
                    continue
                # a stalled prober sends nothing; its schedule moves on
                ms = (hs == h) & (t_row >= s0) & (t_row < s1) & eff.emit
                eff.emit[ms] = False
                nm.ledger.stall_skipped += int(ms.sum())
                if s1 - s0 > 0.1:  # the backlog overflows the send queue now and then
                    le = (hs == h) & (t_row >= s1) & (t_row < s1 + 0.05)
                    le &= (g.random(n) < nz.local_error_share) & (eff.status == NO_STATUS)
                    eff.status[le] = ProbeStatus.LOCAL_ERROR
                # a stalled responder answers when it wakes: late, or after the prober gave up
                md = (hd == h) & (t_row >= s0) & (t_row < s1)
                if md.any():
                    late = (s1 - t_row[md]) * 1e9
                    eff.responder_extra_ns[md] += late
                    idx = np.flatnonzero(md)
                    to = idx[late >= timeout_ns]
                    eff.status[to[eff.status[to] == NO_STATUS]] = ProbeStatus.REPLY_LOST
                    nm.ledger.stall_late_replies += int(md.sum())
                    nm.ledger.stall_timeouts += int(to.size)
                if s0 <= beat_t < s1 and s1 >= t + 1.0:
                    quiet.append(np.flatnonzero(self.eps.host == h))
        if nm.restarts:
            cs, cd = self.eps.container[src], self.eps.container[dst]
            for c, s0, s1 in nm.restarts:
                if s1 <= t or s0 >= t + 1.0:
                    continue
                ms = (cs == c) & (t_row >= s0) & (t_row < s1)
                eff.emit[ms] = False
                md = (cd == c) & (t_row >= s0) & (t_row < s1) & (eff.status == NO_STATUS)
                eff.status[md] = ProbeStatus.LOST  # nobody answers, nobody acknowledges
                restart_lost |= md
                if s0 <= beat_t < s1:
                    quiet.append(np.flatnonzero(self.eps.container == c))
                if s1 < t + 1.0:
                    # the restarted prober numbers its probes from 0 again
                    mine = np.flatnonzero(self.eps.container[self.pairs[:, 0]] == c)
                    if mine.size:
                        old = self._seq_base.copy()
                        kb = np.ceil((s1 - self._pair_off[mine]) / self._pair_iv[mine] - 1e-9)
                        self._seq_base[mine] = kb.astype(np.int64)
                        after = (cs == c) & (t_row >= s1)
                        r_a = rows[after]
                        seq = seq.copy()
                        seq[after] += old[r_a] - self._seq_base[r_a]
        nm.ledger.local_errors += int(((eff.status == ProbeStatus.LOCAL_ERROR) & eff.emit).sum())
        nm.ledger.restart_lost += int((restart_lost & eff.emit).sum())
        wall = self.clock.wall_ns(t_row + nm.clock_offset_s[self.eps.host[src]])
        q = np.concatenate(quiet) if quiet else np.zeros(0, np.int64)
        return eff, seq, wall, q, faulted

    def _ledger_probes(
        self, probes: np.ndarray, faulted: np.ndarray, rows: np.ndarray, eff: Effects | None
    ) -> None:
        """Count the benign noise in what was emitted (rows no fault touched)."""
        L = self.noise_model.ledger
        # columns, not records: copying the clean rows whole cost more than the rest of it
        clean = np.flatnonzero(~faulted)
        L.probes += int(clean.size)
        st = probes["status"][clean]
        L.req_lost += int((st == ProbeStatus.REQUEST_LOST).sum())
        L.rep_lost += int((st == ProbeStatus.REPLY_LOST).sum())
        ok = clean[np.flatnonzero((st == ProbeStatus.OK)[:64])]
        if ok.size:
            emitted_rows = rows if eff is None else rows[eff.emit]
            base = self._pair_base[emitted_rows[ok]]
            L.rtt_ratio.extend((probes["rtt_ns"][ok] / base).tolist())

    def noise_measured(self) -> dict:
        """The benign noise this simulation produced so far (:meth:`NoiseModel.measured`)."""
        return self.noise_model.measured()

    def _down_endpoints(self, active: list[Fault], t: float) -> np.ndarray:
        """Endpoints whose VF link is down now: their RNIC's port/hardware/bond is down, or their
        container is gone."""
        out = []
        tt = np.array([t])
        for f in active:
            if not self.engine.on_now(f, tt)[0]:
                continue
            ft = f.type
            if ft in (
                FailureType.RNIC_HW_FAILURE,
                FailureType.RNIC_PORT_DOWN,
                FailureType.RNIC_PORT_FLAPPING,
                FailureType.BOND_ERROR,
            ):
                r = self.engine._resolve(f)[1]
                out.append(np.flatnonzero(self.eps.rnic == r))
            elif ft in (FailureType.SWITCH_PORT_DOWN, FailureType.SWITCH_PORT_FLAPPING):
                kind, r, _ = self.engine._resolve(f)
                if kind == "access":
                    out.append(np.flatnonzero(self.eps.rnic == r))
            elif ft == FailureType.CONTAINER_CRASH:
                out.append(np.flatnonzero(self.eps.container == self.eps.container_id(f.component)))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _silent_endpoints(self, active: list[Fault], t: float) -> np.ndarray:
        """Endpoints whose agent sends no heartbeat in [t, t + 1): crashed agents and containers,
        and late agents outside every fifth second."""
        out = []
        for f in active:
            if f.type in (FailureType.AGENT_CRASH, FailureType.CONTAINER_CRASH) or (
                f.type == FailureType.LATE_AGENT and int(t) % 5
            ):
                out.append(np.flatnonzero(self.eps.container == self.eps.container_id(f.component)))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _arrive(self, t: float) -> None:
        """Job churn: release ended jobs' hosts, submit Poisson arrivals."""
        if self.arrivals_per_min <= 0:
            return
        for j in self.jobs:
            if t - 1.0 < j.end_s <= t:
                self.pool.release(j)
        rng = rng_for(self.seed, 0xA77, int(t))
        k = int(rng.poisson(self.arrivals_per_min / 60.0))
        if k == 0:
            return
        try:
            new = generate_jobs(
                self.cluster,
                k,
                seed=int(rng.integers(2**31)),
                pool=self.pool,
                start_s=t,
                name_prefix=f"a{self._arrivals:06d}-",
            )
        except Exception as exc:  # noqa: BLE001 - a full cluster just rejects the submission
            log.debug("arrivals at %.0f s rejected: %s", t, exc)
            return
        self._arrivals += 1
        self.add_jobs(new)

    # -- agents' answers ---------------------------------------------------------------------------
    def traceroute(
        self, src_ep: int, dst_ep: int, path_id: int, t_s: float | None = None
    ) -> list[TraceHop]:
        return self.view.traceroute(
            src_ep, dst_ep, path_id, self.clock.now_s if t_s is None else t_s
        )

    def overlay_state(self, host: str, t_s: float | None = None) -> dict:
        return self.view.overlay_state(host, self.clock.now_s if t_s is None else t_s)

    def overlay_chain(self, src_ep: int, dst_ep: int, t_s: float | None = None) -> OverlayWalk:
        return self.view.overlay_chain(src_ep, dst_ep, self.clock.now_s if t_s is None else t_s)

    def flow_tables(
        self, host: str, rail: int, t_s: float | None = None
    ) -> tuple[list[FlowEntry], list[FlowEntry]]:
        return self.view.flow_tables(host, rail, self.clock.now_s if t_s is None else t_s)

    def skeleton_pairs(self) -> np.ndarray:
        """Ground-truth skeleton of every tracked job, concatenated."""
        return (
            np.concatenate([j.skeleton_pairs for j in self.jobs])
            if self.jobs
            else np.zeros((0, 2), np.uint32)
        )


def _same_rail(job: SimJob) -> np.ndarray:
    a, b = np.meshgrid(np.arange(job.n_endpoints), np.arange(job.n_endpoints), indexing="ij")
    keep = (job.rail[a] == job.rail[b]) & (job.host[a] != job.host[b])
    return np.stack([job.ep_ids[a[keep]], job.ep_ids[b[keep]]], axis=1).astype(np.uint32)
