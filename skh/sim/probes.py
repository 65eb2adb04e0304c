"""Simulated probe results, as ``PROBE_DTYPE`` batches like the agents ship them.

A healthy probe's network RTT is log-normal around a per-pair base: a fixed part (NIC, overlay
encap/decap offloaded in the RNIC) plus a per-link share, so it grows with the hop count of the
path (2 links under one ToR, 4 via a spine, 6 via a core), plus a fixed per-pair offset (cables,
queues) drawn from a hash of the pair. The defaults give 12–16 µs with nearly all samples under
20 µs, the paper's anchor. Healthy loss is zero unless ``loss_rate`` says otherwise. Responder
and prober delays are a few µs plus up to the agents' engine tick (``tick_ns``, the agent's
default :data:`skh.policy.ENGINE_TICK_S`): the engines answer and read what arrived within a tick
together, which moves the delays but not the wire-stamped RTTs.

How often and over which path ids each pair probes is a :class:`ProbeSchedule`: flat (every pair
every ``interval_s`` over the same path ids), or as deployed — the controller's probe plan
(:func:`skh.probeplan.plan_probes`, one plan per job, link by link on the cluster's fabric), the
per-pair interval and rotation length the real agents apply.

Faults and benign noise (:mod:`skh.sim.faults`, :mod:`skh.sim.noise`) change rows through an
:class:`Effects`: added latency, loss probability (direction unknown, or of the request or the
reply alone), a forced status, rows a dead or stalled prober never sends, and slower agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError
from skh.model import Cluster
from skh.policy import ENGINE_TICK_S
from skh.probeplan import FabricLinks, ProbePolicy, paths_needed, plan_probes
from skh.records import ProbeStatus, TsSource, empty_probes
from skh.sim.topology import EndpointTable, FabricIndex, mix_hash

__all__ = ["Effects", "ProbeModel", "ProbeSchedule", "NO_STATUS"]

#: ``Effects.status`` value meaning "not forced"
NO_STATUS = 255


@dataclass(slots=True)
class Effects:
    """Per-row changes that active faults make to a probe batch (arrays of its length)."""

    extra_ns: np.ndarray  # float64, added to the network RTT
    loss_p: np.ndarray  # float64, probability the probe is lost (direction unknown: LOST)
    status: np.ndarray  # uint8, forced ProbeStatus or NO_STATUS
    emit: np.ndarray  # bool, False where the prober is dead (no record at all)
    prober_extra_ns: np.ndarray  # float64, added prober delay (a slow agent)
    responder_extra_ns: np.ndarray  # float64, added responder delay
    req_loss_p: np.ndarray  # float64, probability the request is lost (REQUEST_LOST)
    rep_loss_p: np.ndarray  # float64, probability the reply is lost (REPLY_LOST)

    @classmethod
    def none(cls, n: int) -> Effects:
        return cls(
            np.zeros(n),
            np.zeros(n),
            np.full(n, NO_STATUS, np.uint8),
            np.ones(n, bool),
            np.zeros(n),
            np.zeros(n),
            np.zeros(n),
            np.zeros(n),
        )


class ProbeModel:
    """RTT and loss of probes between endpoints of one cluster."""

    def __init__(
        self,
        index: FabricIndex,
        endpoints: EndpointTable,
        *,
        seed: int = 0,
        fixed_ns: float = 11_000.0,
        per_link_ns: float = 500.0,
        pair_spread_ns: float = 1_000.0,
        sigma: float = 0.05,
        loss_rate: float = 0.0,
        responder_delay_ns: float = 2_000.0,
        prober_delay_ns: float = 4_000.0,
        tick_ns: float = ENGINE_TICK_S * 1e9,
        ts_source: TsSource = TsSource.HW,
    ) -> None:
        if not fixed_ns > 0 or per_link_ns < 0 or pair_spread_ns < 0 or not 0 <= sigma < 1:
            raise ConfigError(
                "ProbeModel: fixed_ns must be > 0, per_link_ns and pair_spread_ns >= 0, "
                "sigma in [0, 1)."
            )
        if not tick_ns >= 0:
            raise ConfigError(
                f"The 'tick_ns' parameter of ProbeModel must be >= 0. Got {tick_ns!r} instead."
            )
        if not 0.0 <= loss_rate <= 1.0:
            raise ConfigError(
                f"The 'loss_rate' parameter of ProbeModel must be in [0, 1]. "
                f"Got {loss_rate!r} instead."
            )
        self.index = index
        self.endpoints = endpoints
        self.seed = int(seed)
        self.fixed_ns = float(fixed_ns)
        self.per_link_ns = float(per_link_ns)
        self.pair_spread_ns = float(pair_spread_ns)
        self.sigma = float(sigma)
        self.loss_rate = float(loss_rate)
        self.responder_delay_ns = float(responder_delay_ns)
        self.prober_delay_ns = float(prober_delay_ns)
        #: the agents' engine tick: a probe read on the responder's next tick is answered up to a
        #: tick late, and its answer read up to a tick late on the prober's (RTTs, stamped on the
        #: wire, do not move)
        self.tick_ns = float(tick_ns)
        self.ts_source = TsSource(ts_source)

    def base_rtt_ns(self, src_ep: np.ndarray, dst_ep: np.ndarray) -> np.ndarray:
        """The median healthy RTT of each pair (float64 ns); the same both ways."""
        src_ep = np.asarray(src_ep, np.int64)
        dst_ep = np.asarray(dst_ep, np.int64)
        sr, dr = self.endpoints.rnic[src_ep], self.endpoints.rnic[dst_ep]
        # hop count does not depend on the ECMP choice in a Clos: route path id 0
        hops = self.index.route(sr, dr, np.zeros(sr.size, np.int64)).hops
        lo, hi = np.minimum(sr, dr), np.maximum(sr, dr)
        u = mix_hash(lo, hi, np.uint64(self.seed)).astype(np.float64) / 2**64
        return self.fixed_ns + self.per_link_ns * 2 * hops + (u - 0.5) * self.pair_spread_ns

    def sample(
        self,
        src_ep: np.ndarray,
        dst_ep: np.ndarray,
        seq: np.ndarray,
        path_id: np.ndarray,
        t_wall_ns: np.ndarray,
        rng: np.random.Generator,
        *,
        base_ns: np.ndarray | None = None,
        effects: Effects | None = None,
    ) -> np.ndarray:
        """One ``PROBE_DTYPE`` row per probe (minus rows a dead prober never sends).

        ``base_ns`` (from :meth:`base_rtt_ns`) may be passed when the caller caches it per pair.
        """
        n = len(src_ep)
        if base_ns is None:
            base_ns = self.base_rtt_ns(src_ep, dst_ep)
        z = rng.standard_normal(n, dtype=np.float32)
        rtt = base_ns * np.exp(self.sigma * z)
        resp = self.responder_delay_ns * (1.0 + 0.25 * rng.random(n, dtype=np.float32))
        prob = self.prober_delay_ns * (1.0 + 0.25 * rng.random(n, dtype=np.float32))
        if self.tick_ns:
            # where in each side's tick the datagram fell: hashed from the probe, so the draws of
            # everything else are those of a model without a tick
            h = mix_hash(src_ep, seq, t_wall_ns, np.uint64(self.seed))
            lo = (h & np.uint64(0xFFFFFFFF)).astype(np.float32) / np.float32(2**32)
            hi = (h >> np.uint64(32)).astype(np.float32) / np.float32(2**32)
            resp = resp + self.tick_ns * lo
            prob = prob + self.tick_ns * hi
        status = np.zeros(n, np.uint8)
        if self.loss_rate > 0:
            status[rng.random(n, dtype=np.float32) < self.loss_rate] = ProbeStatus.LOST
        if effects is not None:
            rtt = rtt + effects.extra_ns
            resp = resp + effects.responder_extra_ns
            prob = prob + effects.prober_extra_ns
            for p, code in (
                (effects.req_loss_p, ProbeStatus.REQUEST_LOST),
                (effects.rep_loss_p, ProbeStatus.REPLY_LOST),
                (effects.loss_p, ProbeStatus.LOST),
            ):
                lossy = np.flatnonzero(p > 0)
                if lossy.size:
                    lost = lossy[rng.random(lossy.size, dtype=np.float32) < p[lossy]]
                    status[lost[status[lost] == ProbeStatus.OK]] = code
            forced = effects.status != NO_STATUS
            status[forced] = effects.status[forced]
        out = empty_probes(n)
        out["src_ep"] = src_ep
        out["dst_ep"] = dst_ep
        out["seq"] = seq
        out["path_id"] = path_id
        out["status"] = status
        out["ts_source"] = self.ts_source
        out["t_wall_ns"] = t_wall_ns
        ok = status == ProbeStatus.OK
        out["rtt_ns"] = np.where(ok, rtt, -1).astype(np.int64)
        out["responder_delay_ns"] = np.where(ok, resp, -1).astype(np.int64)
        out["prober_delay_ns"] = np.where(ok, prob, -1).astype(np.int64)
        if effects is not None and not effects.emit.all():
            # np.compress, not a mask: numpy masks structured records one field at a time
            out = np.compress(effects.emit, out)
        return out


class ProbeSchedule:
    """Per ping pair: its probe interval and how many path ids its probes rotate over (probe *k*
    on path id ``k % paths``, as :meth:`skh.probe.Engine.add_target` rotates them).

    Without a ``policy``, every pair probes every ``interval_s`` over ``n_path_ids`` ids. With
    one, pairs are planned as the controller plans them: one plan per job (its pairs grouped by
    the prober's job) on the cluster's fabric; ``n_path_ids`` is then the most any pair of the
    fabric can get (its widest ECMP set under the policy's coverage)."""

    def __init__(
        self,
        cluster: Cluster,
        index: FabricIndex,
        endpoints: EndpointTable,
        *,
        interval_s: float,
        n_path_ids: int,
        policy: ProbePolicy | None = None,
    ) -> None:
        self.cluster, self.index, self.endpoints = cluster, index, endpoints
        self.interval_s = float(interval_s)
        self.policy = policy
        self.n_path_ids = int(n_path_ids)
        self._links: FabricLinks | None = None
        if policy is not None:
            fab = cluster.fabric
            tors = sorted({r.tor for h in fab.hosts.values() for r in h.rnics})
            # a Clos is symmetric: the first ToR sees every distance there is
            widest = max((len(fab.switch_paths(tors[0], t)) for t in tors), default=1)
            self.n_path_ids = int(paths_needed(widest, policy.path_coverage, policy.max_paths))
            self._links = FabricLinks(fab)

    def plan(self, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(interval_s, paths)`` of each row of ``pairs`` (an ``(m, 2)`` array of endpoint
        ids, in the caller's order)."""
        m = pairs.shape[0]
        if self.policy is None or m == 0:
            return np.full(m, self.interval_s), np.full(m, self.n_path_ids, np.int64)
        iv, n = np.zeros(m), np.zeros(m, np.int64)
        eps = self.cluster.endpoints
        job = np.array([eps[int(e)].job for e in pairs[:, 0].tolist()])
        for name in np.unique(job).tolist():
            rows = np.flatnonzero(job == name)
            sub = np.unique(pairs[rows].astype(np.uint32), axis=0)
            key = [self.index.rnic_key(int(r)) for r in self.endpoints.rnic[sub.ravel()]]
            assert self._links is not None
            inc = self._links.incidence(key[0::2], key[1::2])
            plan = plan_probes(sub, self.policy, links=inc)
            # the plan's rows are the sorted unique pairs: find each of ours among them
            code = plan.pairs[:, 0].astype(np.uint64) << np.uint64(32) | plan.pairs[:, 1]
            mine = pairs[rows].astype(np.uint64)
            at = np.searchsorted(code, mine[:, 0] << np.uint64(32) | mine[:, 1])
            iv[rows] = plan.interval_s[at]
            n[rows] = plan.paths[at]
        return iv, n
