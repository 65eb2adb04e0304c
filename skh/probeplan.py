"""How the probers of a job probe: per-pair intervals and ECMP path rotation within a per-endpoint
budget, so that every link of the job's skeleton is probed at the rate detection needs.

One function, :func:`plan_probes`, decides it for the controller (which hands the plan out with the
job's ping list), for the agents (which plan their own preload lists from the policy the controller
hands out) and for the simulator (which probes as the agents do). Its inputs:

* the ordered (src, dst) endpoint pairs to probe;
* a :class:`ProbePolicy`: the settings every prober and the analyzer must share;
* optionally, what the cluster model says about each pair's paths (:class:`FabricLinks`): how
  many equal-cost paths join its two RNICs, and which links they cross.

The plan (docs/probing.md has the reasoning and its effect on time to detect):

1. **Rotation.** A pair's probes rotate over ``n`` path ids (UDP source ports, RoCE flow labels;
   :meth:`skh.probe.Engine.add_target` ``paths``). Switches hash each id onto one of the pair's
   ``m`` ECMP paths, which no prober can choose or know, so ``n`` is the coupon-collector size at
   which a given path is missed with probability at most ``1 - path_coverage``:
   ``n = ceil(ln(1 - path_coverage) / ln(1 - 1/m))``, capped at ``max_paths``.
2. **Budget.** An endpoint (one VF and its engine) sends at most ``budget_per_s`` probes a
   second and is asked to answer at most ``answer_budget_per_s``; a source with ``k`` peers
   probes each every ``max(interval_s, k / budget_per_s)``, slower where the destination has
   more askers than its answer budget pays for.
3. **Floors**, within the budget: a pair is probed faster (down to ``min_interval_s``) when
   one of its links sees fewer than ``link_min_per_s`` probes a second from the whole plan (a link
   few pairs cross), or when its ``n`` path ids would not all be probed within ``coverage_s``.
   A source over its budget pays its pairs' floors first — each path id within ``coverage_s``,
   and every pair at least once per ``ok_sample_s`` (the detector's latency windows take one RTT
   per pair and period) — and shares the rest in proportion to what each pair wants beyond its
   floor. Where the budget cannot pay for a floor,
   the budget wins; :meth:`ProbePlan.summary` says how many links and pairs fall short.

A link is counted undirected (a probe crosses its path's links both ways, request and reply); a
pair's expected load on a link is its rate times the share of its ECMP paths through the link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skh.errors import ConfigError, ProtocolError, TopologyError
from skh.model import Fabric
from skh.policy import MS_MAX as _MS_MAX
from skh.policy import ProbePolicy

__all__ = [
    "ProbePolicy",
    "ProbePlan",
    "FabricLinks",
    "LinkIncidence",
    "paths_needed",
    "plan_probes",
]


def paths_needed(ecmp_paths: np.ndarray | int, coverage: float, max_paths: int) -> np.ndarray:
    """Path ids a pair rotates over so that a given one of its ``ecmp_paths`` equal-cost paths is
    hashed onto by at least one of them with probability ``coverage`` (one path: one id)."""
    m = np.maximum(np.asarray(ecmp_paths, np.float64), 1.0)
    with np.errstate(divide="ignore"):
        n = np.where(m > 1, np.ceil(np.log1p(-coverage) / np.log1p(-1.0 / m) - 1e-9), 1.0)
    return np.clip(n, 1, max_paths).astype(np.uint16)


@dataclass(frozen=True, slots=True)
class LinkIncidence:
    """Which links each pair's paths cross, and with what share of its paths: COO triples
    (``pair``, ``link``, ``share``); ``names`` names the links, ``access`` says which of them are
    access links (an RNIC's to its ToR); ``ecmp_paths`` per pair."""

    pair: np.ndarray  # int64 row of the pair
    link: np.ndarray  # int64 link id
    share: np.ndarray  # float64 share of the pair's paths that cross the link
    names: tuple[tuple[str, str], ...]
    ecmp_paths: np.ndarray  # int64 per pair
    access: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per link id


class FabricLinks:
    """The cluster model's paths between RNICs, for planning: which links a pair of RNICs' ECMP
    paths cross and how many paths there are. Paths are worked out once per pair of ToRs and
    kept, so one object serves many plans."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self._tor = {r.key: r.tor for h in fabric.hosts.values() for r in h.rnics}
        self._ids: dict[tuple[str, str], int] = {}
        self._names: list[tuple[str, str]] = []
        self._access: set[int] = set()
        self._tor_pairs: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, int]] = {}

    def _link(self, a: str, b: str) -> int:
        key = (a, b) if a <= b else (b, a)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self._names)
            self._names.append(key)
        return i

    def _between(self, tor_a: str, tor_b: str) -> tuple[np.ndarray, np.ndarray, int]:
        got = self._tor_pairs.get((tor_a, tor_b))
        if got is None:
            paths = self.fabric.switch_paths(tor_a, tor_b)
            count: dict[int, int] = {}
            for p in paths:
                for a, b in zip(p, p[1:], strict=False):
                    i = self._link(a, b)
                    count[i] = count.get(i, 0) + 1
            got = (
                np.fromiter(count, np.int64, len(count)),
                np.fromiter(count.values(), np.float64, len(count)) / len(paths),
                len(paths),
            )
            self._tor_pairs[(tor_a, tor_b)] = got
        return got

    def tor(self, rnic_key: str) -> str:
        try:
            return self._tor[rnic_key]
        except KeyError:
            raise TopologyError(f"the fabric has no RNIC {rnic_key!r}") from None

    def incidence(self, src_rnic: Sequence[str], dst_rnic: Sequence[str]) -> LinkIncidence:
        """The links of each (``src_rnic[i]``, ``dst_rnic[i]``) pair of RNIC keys
        (``host:rnicN``): both access links in full, the switch links by their share of the
        pair's ECMP paths."""
        n = len(src_rnic)
        if len(dst_rnic) != n:
            raise ConfigError("FabricLinks.incidence: src_rnic and dst_rnic differ in length")
        if n == 0:
            empty = np.zeros(0, np.int64)
            return LinkIncidence(
                empty, empty, np.zeros(0), tuple(self._names), empty, self._access_mask()
            )
        rows, links, shares = [], [], []
        ecmp = np.ones(n, np.int64)
        idx = np.arange(n, dtype=np.int64)
        keys, inv = np.unique(np.asarray(list(src_rnic) + list(dst_rnic)), return_inverse=True)
        key_tor = [self.tor(str(k)) for k in keys]
        access = np.array([self._link(str(k), t) for k, t in zip(keys, key_tor, strict=True)])
        self._access.update(access.tolist())
        src_k, dst_k = inv[:n], inv[n:]
        for side in (src_k, dst_k):
            rows.append(idx)
            links.append(access[side])
            shares.append(np.ones(n))
        tor_names = sorted(set(key_tor))
        tor_id = {t: i for i, t in enumerate(tor_names)}
        kt = np.array([tor_id[t] for t in key_tor], np.int64)
        code = kt[src_k] * len(tor_names) + kt[dst_k]
        order = np.argsort(code, kind="stable")
        uniq, start = np.unique(code[order], return_index=True)
        ends = np.r_[start[1:], n]
        for c, s, e in zip(uniq.tolist(), start.tolist(), ends.tolist(), strict=True):
            a, b = tor_names[c // len(tor_names)], tor_names[c % len(tor_names)]
            if a == b:
                continue
            lk, sh, m = self._between(a, b)
            members = order[s:e]
            ecmp[members] = m
            rows.append(np.repeat(members, lk.size))
            links.append(np.tile(lk, members.size))
            shares.append(np.tile(sh, members.size))
        return LinkIncidence(
            np.concatenate(rows),
            np.concatenate(links),
            np.concatenate(shares),
            tuple(self._names),
            ecmp,
            self._access_mask(),
        )

    def _access_mask(self) -> np.ndarray:
        mask = np.zeros(len(self._names), bool)
        mask[list(self._access)] = True
        return mask


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Per pair (rows of ``pairs``, sorted by (src, dst)): the interval in whole milliseconds and
    the number of path ids its probes rotate over (ids ``0 .. paths - 1``)."""

    pairs: np.ndarray  # (m, 2) uint32
    interval_ms: np.ndarray  # (m,) uint16
    paths: np.ndarray  # (m,) uint16
    policy: ProbePolicy
    #: planned probes/s per link (ids of the incidence; empty without one)
    link_rate: np.ndarray
    link_names: tuple[tuple[str, str], ...] = ()
    #: probes/s each of those links should see (its policy floor)
    link_floor: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def interval_s(self) -> np.ndarray:
        return self.interval_ms / 1000.0

    @property
    def rate_per_s(self) -> np.ndarray:
        return 1000.0 / self.interval_ms

    def endpoint_rates(self, *, answered: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(source endpoint ids, the probes/s each sends); ``answered``: (destination endpoint
        ids, the probes/s each is asked to answer)."""
        ep, inv = np.unique(self.pairs[:, 1 if answered else 0], return_inverse=True)
        return ep, np.bincount(inv, weights=self.rate_per_s, minlength=ep.size)

    def lookup(self, src: int) -> dict[int, tuple[float, int]]:
        """``dst -> (interval_s, paths)`` of one source's pairs."""
        lo, hi = np.searchsorted(self.pairs[:, 0], [src, src + 1])
        return {
            int(d): (int(iv) / 1000.0, int(n))
            for d, iv, n in zip(
                self.pairs[lo:hi, 1].tolist(),
                self.interval_ms[lo:hi].tolist(),
                self.paths[lo:hi].tolist(),
                strict=True,
            )
        }

    def summary(self) -> dict[str, Any]:
        """The plan's figures: probes/s per endpoint (max, median), path ids per pair, how long a
        pair takes to probe all its path ids (max), links and their load, what falls short."""
        p = self.policy
        _, ep_rate = self.endpoint_rates()
        _, ep_ans = self.endpoint_rates(answered=True)
        cycle = self.paths * self.interval_s
        out: dict[str, Any] = {
            "pairs": int(self.pairs.shape[0]),
            "endpoint_rate_max": round(float(ep_rate.max()), 3) if ep_rate.size else 0.0,
            "endpoint_rate_p50": round(float(np.median(ep_rate)), 3) if ep_rate.size else 0.0,
            "endpoint_answers_max": round(float(ep_ans.max()), 3) if ep_ans.size else 0.0,
            "interval_s_max": float(self.interval_s.max()) if self.pairs.size else 0.0,
            "interval_s_p99": float(np.percentile(self.interval_s, 99)) if self.pairs.size else 0.0,
            "pairs_slower_than_interval": int((self.interval_s > p.interval_s + 1e-9).sum()),
            "paths_max": int(self.paths.max()) if self.pairs.size else 0,
            "path_cycle_s_max": round(float(cycle.max()), 3) if self.pairs.size else 0.0,
            "pairs_slower_than_coverage": int((cycle > p.coverage_s + 1e-9).sum()),
        }
        if self.link_rate.size:
            floor = self.link_floor if self.link_floor.size else p.link_min_per_s
            short = self.link_rate < floor - 1e-9
            out |= {
                "links": int(self.link_rate.size),
                "link_rate_min": round(float(self.link_rate.min()), 3),
                "links_below_floor": int(short.sum()),
            }
        return out

    # -- wire ----------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """The per-pair columns, aligned with the (sorted, unique) skeleton pairs they plan."""
        return {
            "interval_ms": np.ascontiguousarray(self.interval_ms, "<u2").tobytes(),
            "paths": np.ascontiguousarray(self.paths, "<u2").tobytes(),
        }

    @classmethod
    def from_wire(cls, d: Any, pairs: np.ndarray, policy: ProbePolicy) -> ProbePlan:
        """A plan handed out for ``pairs``; ProtocolError when its columns do not fit them."""
        if not isinstance(d, Mapping):
            raise ProtocolError("a probe plan is a map")
        try:
            iv = np.frombuffer(d["interval_ms"], "<u2").astype(np.uint16)
            n = np.frombuffer(d["paths"], "<u2").astype(np.uint16)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad probe plan: {exc!r}"[:300]) from None
        if iv.size != pairs.shape[0] or n.size != pairs.shape[0]:
            raise ProtocolError(
                f"a probe plan of {iv.size}/{n.size} rows for {pairs.shape[0]} pairs"
            )
        if iv.size and (iv.min() == 0 or n.min() == 0 or n.max() > 64):
            raise ProtocolError("a probe plan with a zero interval or path count out of 1..64")
        return cls(pairs, iv, n, policy, np.zeros(0))


def _fit_budget(
    want: np.ndarray, floor: np.ndarray, src: np.ndarray, n_src: int, budget: float
) -> np.ndarray:
    """Rates within each source's budget: a source under it gets what its pairs want; one over it
    pays its pairs' floors first (shrunk alike if they alone exceed it) and shares what is left in
    proportion to what each pair wants beyond its floor. (``src`` may as well be the pairs'
    destinations, for the answer budget.)"""

    def per_src(x: np.ndarray) -> np.ndarray:
        return np.bincount(src, weights=x, minlength=n_src)

    over = per_src(want) > budget
    if not over.any():
        return want
    floor = floor * np.minimum(1.0, budget / np.maximum(per_src(floor), 1e-12))[src]
    extra = want - floor
    left = np.maximum(budget - per_src(floor), 0.0)
    extra_total = per_src(extra)
    share = np.minimum(1.0, left / np.maximum(extra_total, 1e-12))
    return np.where(over[src], floor + extra * share[src], want)


def _link_floors(links: LinkIncidence | None, p: ProbePolicy) -> np.ndarray:
    """Probes/s each link of ``links`` should see: ``access_link_min_per_s`` on access links,
    ``link_min_per_s`` on the others."""
    if links is None:
        return np.zeros(0)
    access = np.zeros(len(links.names), bool)
    access[: links.access.size] = links.access[: len(links.names)]
    return np.where(access, max(p.access_link_min_per_s, p.link_min_per_s), p.link_min_per_s)


def plan_probes(
    pairs: np.ndarray,
    policy: ProbePolicy,
    *,
    links: LinkIncidence | None = None,
    rounds: int = 4,
) -> ProbePlan:
    """The probe plan of ``pairs`` (an ``(m, 2)`` array of (src, dst) endpoint ids; duplicates are
    merged and the plan's rows sorted) under ``policy``; ``links`` (from
    :meth:`FabricLinks.incidence`, rows aligned with the sorted unique pairs) gives each pair's
    ECMP path count and lets the plan hold every link to ``link_min_per_s``. Without it, every
    pair is taken to have ``default_ecmp_paths`` paths and only the budget and the path-coverage
    floor apply."""
    pairs = np.asarray(pairs)
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ConfigError(f"plan_probes: pairs must be an (m, 2) array, got shape {pairs.shape}")
    pairs = pairs.astype(np.uint32)
    if pairs.size:
        pairs = np.unique(pairs, axis=0)  # sorted by (src, dst)
    m = pairs.shape[0]
    if links is not None and links.ecmp_paths.size != m:
        raise ConfigError(
            f"plan_probes: the link incidence has {links.ecmp_paths.size} pairs, not {m}"
        )
    p = policy
    ecmp = links.ecmp_paths if links is not None else np.full(m, p.default_ecmp_paths)
    paths = paths_needed(ecmp, p.path_coverage, p.max_paths)
    if m == 0:
        return ProbePlan(pairs, np.zeros(0, np.uint16), paths, p, np.zeros(0))
    src_ids, src = np.unique(pairs[:, 0], return_inverse=True)
    dst_ids, dst = np.unique(pairs[:, 1], return_inverse=True)
    k = np.bincount(src, minlength=src_ids.size)
    k_in = np.bincount(dst, minlength=dst_ids.size)
    max_rate = 1.0 / p.min_interval_s
    base = np.minimum(
        1.0 / p.interval_s,
        np.minimum(p.budget_per_s / k[src], p.answer_budget_per_s / k_in[dst]),
    )
    # every pair at least once per latency sample period (the detector's latency windows need one
    # RTT per pair and period), and each of its path ids within coverage_s
    sample_s = p.ok_sample_s if p.ok_sample_s > 0 else p.interval_s
    floor = np.minimum(
        np.maximum(paths / p.coverage_s, 1.0 / max(sample_s, p.interval_s)), max_rate
    )
    want = np.maximum(base, floor)
    rate = base
    n_links = len(links.names) if links is not None else 0
    link_min = _link_floors(links, p)
    for _ in range(max(1, rounds)):
        if links is not None and links.pair.size:
            load = np.bincount(
                links.link, weights=rate[links.pair] * links.share, minlength=n_links
            )
            short = np.where(load < link_min, link_min / np.maximum(load, 1e-9), 1.0)
            factor = np.ones(m)
            np.maximum.at(factor, links.pair, short[links.link])
            want = np.maximum(want, rate * factor)
        want = np.minimum(want, max_rate)
        rate = _fit_budget(want, floor, src, src_ids.size, p.budget_per_s)
        # then each destination's answers: a pair slowed for its destination leaves its
        # source budget that the next round shares among the source's other pairs
        # (a floor the senders' fit could not pay stays unpaid: this fit only slows pairs)
        rate = _fit_budget(rate, np.minimum(floor, rate), dst, dst_ids.size, p.answer_budget_per_s)
    # whole milliseconds: rounded down (a floor stays met) unless that puts the source over its
    # budget or the destination over its answer budget, then up (a plan never goes past either)
    lo = max(1, math.ceil(p.min_interval_s * 1000 - 1e-9))
    iv = np.clip(np.floor(1000.0 / rate + 1e-9), lo, _MS_MAX)
    sent = np.bincount(src, weights=1000.0 / iv, minlength=src_ids.size)
    answered = np.bincount(dst, weights=1000.0 / iv, minlength=dst_ids.size)
    up = (sent > p.budget_per_s + 1e-9)[src] | (answered > p.answer_budget_per_s + 1e-9)[dst]
    iv[up] = np.clip(np.ceil(1000.0 / rate[up] - 1e-9), lo, _MS_MAX)
    if links is None:
        return ProbePlan(pairs, iv.astype(np.uint16), paths, p, np.zeros(0))
    link_rate = np.bincount(
        links.link, weights=(1000.0 / iv)[links.pair] * links.share, minlength=n_links
    )
    used = np.zeros(n_links, bool)
    used[links.link] = True
    names = tuple(n for n, u in zip(links.names, used.tolist(), strict=True) if u)
    return ProbePlan(pairs, iv.astype(np.uint16), paths, p, link_rate[used], names, link_min[used])
