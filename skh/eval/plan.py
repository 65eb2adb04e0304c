"""Probing as deployed: the probe plan (:mod:`skh.probeplan`) the controller would hand out for
the evaluated cluster's ping pairs, beside the flat policy the simulator probes with (every pair
at ``probe_interval_s`` on one path id, no budget).

Figures (deterministic for a seed):

- probes/s per container under each (the busiest container is where the agent's CPU goes);
- skeleton links below the plan's ``link_min_per_s`` under each;
- ``ecmp_paths_covered_share``: the share of (ping pair, ECMP path) that at least one of the
  pair's path ids hashes onto *and* that the pair probes within ``window_s`` (10 s). Switches hash
  a flow onto one of its ECMP paths by a function the prober neither chooses nor knows, so each
  path id is hashed uniformly at random (``hash_seeds`` independent draws: mean and min); the
  agent before the plan (path id 0 only) beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from skh.model import Fabric
from skh.probeplan import FabricLinks, LinkIncidence, ProbePlan, ProbePolicy, plan_probes
from skh.sim.scenario import Simulation
from skh.sim.topology import rng_for

__all__ = ["planned_probing", "path_coverage"]


def path_coverage(
    plan: ProbePlan, ecmp_paths: np.ndarray, rng: np.random.Generator, window_s: float = 10.0
) -> tuple[float, float]:
    """One draw of the switches' hash: (share of (pair, ECMP path) the plan covers within
    ``window_s``, share one path id per pair covers)."""
    m = np.asarray(ecmp_paths, np.int64)
    n = plan.paths.astype(np.int64)
    in_time = plan.paths * plan.interval_s <= window_s + 1e-9
    offs = np.r_[0, np.cumsum(m)[:-1]]
    hit = np.zeros(int(m.sum()), bool)
    hit[np.repeat(offs, n) + rng.integers(0, np.repeat(m, n))] = True
    hit &= np.repeat(in_time, m)
    one = np.zeros(int(m.sum()), bool)
    one[offs + rng.integers(0, m)] = True
    return float(hit.mean()), float(one.mean())


def _container_rates(sim: Simulation, plan: ProbePlan) -> np.ndarray:
    src, rate = plan.endpoint_rates()
    return np.bincount(sim.eps.container[src.astype(np.int64)], weights=rate)


def planned_probing(
    sim: Simulation,
    fabric: Fabric,
    *,
    policy: ProbePolicy | None = None,
    seed: int = 1,
    hash_seeds: int = 20,
    window_s: float = 10.0,
) -> dict[str, Any]:
    """The plan for ``sim``'s ping pairs (all it has had so far) on ``fabric``, against the flat
    policy; see the module doc. ``busiest_paths`` is the most path ids a pair rotates over."""
    policy = policy or ProbePolicy(interval_s=sim.probe_interval_s)
    pairs = np.unique(sim.pairs.astype(np.uint32), axis=0)
    key = [sim.index.rnic_key(int(r)) for r in sim.eps.rnic]
    links: LinkIncidence = FabricLinks(fabric).incidence(
        [key[e] for e in pairs[:, 0].tolist()], [key[e] for e in pairs[:, 1].tolist()]
    )
    plan = plan_probes(pairs, policy, links=links)
    m = pairs.shape[0]
    flat = ProbePlan(
        plan.pairs,
        np.full(m, round(sim.probe_interval_s * 1000), np.uint16),
        np.ones(m, np.uint16),
        policy,
        np.zeros(0),
    )
    used = np.unique(links.link)
    flat_link = np.bincount(
        links.link, weights=links.share / sim.probe_interval_s, minlength=len(links.names)
    )[used]
    c_plan, c_flat = _container_rates(sim, plan), _container_rates(sim, flat)
    peers = np.bincount(sim.eps.container[pairs[:, 0].astype(np.int64)], minlength=c_plan.size)
    bp, bf = int(np.argmax(c_plan)), int(np.argmax(c_flat))
    rng = rng_for(seed, 0xC0E)
    draws = np.array(
        [path_coverage(plan, links.ecmp_paths, rng, window_s) for _ in range(hash_seeds)]
        if m
        else [(1.0, 1.0)]
    )
    s = plan.summary()
    return {
        "policy": policy.to_wire(),
        "pairs": m,
        "ecmp_paths_per_pair": {
            str(k): int(v)
            for k, v in zip(*np.unique(links.ecmp_paths, return_counts=True), strict=True)
        },
        "plan": s,
        "busiest_container": {
            "planned_probes_per_s": round(float(c_plan[bp]), 1),
            "planned_peers": int(peers[bp]),
            "flat_probes_per_s": round(float(c_flat[bf]), 1),
            "flat_peers": int(peers[bf]),
        },
        "busiest_paths": int(plan.paths.max()) if m else 1,
        "container_probes_per_s_p50": {
            "planned": round(float(np.median(c_plan[c_plan > 0])), 1) if m else 0.0,
            "flat": round(float(np.median(c_flat[c_flat > 0])), 1) if m else 0.0,
        },
        "links": int(used.size),
        "links_below_floor": {
            "planned": int(s.get("links_below_floor", 0)),
            "flat": int((flat_link < policy.link_min_per_s - 1e-9).sum()),
        },
        "ecmp_paths_covered_share": {
            "planned_mean": round(float(draws[:, 0].mean()), 5),
            "planned_min": round(float(draws[:, 0].min()), 5),
            "one_path_id_mean": round(float(draws[:, 1].mean()), 5),
            "hash_seeds": hash_seeds,
            "window_s": window_s,
        },
    }
