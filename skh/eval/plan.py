"""Probing as deployed: the probe plan (:mod:`skh.probeplan`) the controller would hand out for
the evaluated cluster's ping pairs, beside the flat policy the simulator probes with (every pair
at ``probe_interval_s`` on one path id, no budget).

Plans are made per job, as the controller makes them (a job's link floors count its own probes).

Figures (deterministic for a seed):

- probes/s per container under each, sent and answered (the busiest container, the one with the
  most of both, is where the agent's CPU goes);
- skeleton links below the plan's ``link_min_per_s`` under each;
- ``ecmp_paths_covered_share``: the share of (ping pair, ECMP path) probed at least once in
  every ``window_s`` (10 s) window: one of the pair's path ids must hash onto it, and the pair
  must reach such an id within any ``window_s`` of its rotation. Switches hash
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
    """One draw of the switches' hash: (share of (pair, ECMP path) that *every* ``window_s``
    window of the plan probes, share that one path id per pair probes at all).

    A pair sends ``w = floor(window_s / interval)`` consecutive path ids (cyclically) in any
    window, so a path is probed in every window iff the ids hashed onto it leave no cyclic gap
    longer than ``w`` (with ``w >= n``, iff any id lands on it)."""
    m = np.asarray(ecmp_paths, np.int64)
    n = plan.paths.astype(np.int64)
    w = np.floor(window_s / plan.interval_s + 1e-9).astype(np.int64)
    pair = np.repeat(np.arange(m.size), n)
    pid = np.arange(pair.size) - np.repeat(np.cumsum(n) - n, n)
    path = rng.integers(0, np.repeat(m, n))
    order = np.lexsort((pid, path, pair))
    pair, pid, path = pair[order], pid[order], path[order]
    new = np.r_[True, (pair[1:] != pair[:-1]) | (path[1:] != path[:-1])]
    group = np.cumsum(new) - 1
    first = pid[new][group]
    last = np.r_[new[1:], True]
    gap = np.where(last, first + n[pair] - pid, np.r_[pid[1:], 0] - pid)
    worst = np.zeros(int(group[-1]) + 1 if group.size else 0, np.int64)
    np.maximum.at(worst, group, gap)
    covered = int((worst <= w[pair[new]]).sum())
    one = np.zeros(int(m.sum()), bool)
    one[np.r_[0, np.cumsum(m)[:-1]] + rng.integers(0, m)] = True
    return covered / float(m.sum()), float(one.mean())


def _container_rates(sim: Simulation, plan: ProbePlan) -> tuple[np.ndarray, np.ndarray]:
    """Per container: the probes/s its endpoints send, and those they answer."""
    n = int(sim.eps.container.max()) + 1 if len(sim.eps) else 0

    def per_container(answered: bool) -> np.ndarray:
        ep, rate = plan.endpoint_rates(answered=answered)
        return np.bincount(sim.eps.container[ep.astype(np.int64)], weights=rate, minlength=n)

    return per_container(False), per_container(True)


def planned_probing(
    sim: Simulation,
    fabric: Fabric,
    *,
    policy: ProbePolicy | None = None,
    seed: int = 1,
    hash_seeds: int = 20,
    window_s: float = 10.0,
) -> dict[str, Any]:
    """The plans for ``sim``'s ping pairs (all it has had so far) on ``fabric``, one per job as
    the controller makes them (link floors count the job's own probes), against the flat
    policy; see the module doc. ``busiest_paths`` is the most path ids a pair rotates over."""
    policy = policy or ProbePolicy(interval_s=sim.probe_interval_s)
    pairs = np.unique(sim.pairs.astype(np.uint32), axis=0)
    key = [sim.index.rnic_key(int(r)) for r in sim.eps.rnic]
    job_names = [sim.cluster.endpoints[e].job for e in range(len(sim.eps))]
    _, job_of = np.unique(np.asarray(job_names or [""]), return_inverse=True)
    pair_job = job_of[pairs[:, 0].astype(np.int64)]
    order = np.argsort(pair_job, kind="stable")
    cuts = np.flatnonzero(np.diff(pair_job[order])) + 1
    fl = FabricLinks(fabric)
    parts: list[tuple[ProbePlan, LinkIncidence]] = []
    below_plan = below_flat = n_links = 0
    for rows in np.split(order, cuts) if pairs.size else []:
        sub = pairs[rows]
        inc = fl.incidence(
            [key[e] for e in sub[:, 0].tolist()], [key[e] for e in sub[:, 1].tolist()]
        )
        plan_j = plan_probes(sub, policy, links=inc)
        parts.append((plan_j, inc))
        used = np.unique(inc.link)
        flat_load = np.bincount(
            inc.link, weights=inc.share / sim.probe_interval_s, minlength=len(inc.names)
        )[used]
        n_links += used.size
        below_plan += int(plan_j.summary()["links_below_floor"])
        below_flat += int((flat_load < policy.link_min_per_s - 1e-9).sum())
    m = pairs.shape[0]
    if parts:
        cat = [
            np.concatenate(c)
            for c in zip(
                *((pl.pairs, pl.interval_ms, pl.paths, i.ecmp_paths) for pl, i in parts),
                strict=True,
            )
        ]
        srt = np.lexsort((cat[0][:, 1], cat[0][:, 0]))
        pairs, iv, n_paths, ecmp = (c[srt] for c in cat)
    else:
        iv, n_paths, ecmp = np.zeros(0, np.uint16), np.zeros(0, np.uint16), np.zeros(0, np.int64)
    plan = ProbePlan(pairs, iv, n_paths, policy, np.zeros(0))
    flat = ProbePlan(
        pairs,
        np.full(m, round(sim.probe_interval_s * 1000), np.uint16),
        np.ones(m, np.uint16),
        policy,
        np.zeros(0),
    )
    (c_plan, a_plan), (c_flat, a_flat) = _container_rates(sim, plan), _container_rates(sim, flat)
    peers = np.bincount(sim.eps.container[pairs[:, 0].astype(np.int64)], minlength=c_plan.size)
    # the busiest container does the most datagram work: answering a probe costs its agent
    # what sending one does (bench/agent_process.py), and hot destinations answer more than any
    # container sends
    bp, bf = int(np.argmax(c_plan + a_plan)), int(np.argmax(c_flat + a_flat))
    rng = rng_for(seed, 0xC0E)
    draws = np.array(
        [path_coverage(plan, ecmp, rng, window_s) for _ in range(hash_seeds)] if m else [(1.0, 1.0)]
    )
    s = plan.summary()
    return {
        "policy": policy.to_wire(),
        "pairs": m,
        "ecmp_paths_per_pair": {
            str(k): int(v) for k, v in zip(*np.unique(ecmp, return_counts=True), strict=True)
        },
        "plan": s,
        "busiest_container": {
            "planned_probes_per_s": round(float(c_plan[bp]), 1),
            "planned_answers_per_s": round(float(a_plan[bp]), 1),
            "planned_peers": int(peers[bp]),
            "flat_probes_per_s": round(float(c_flat[bf]), 1),
            "flat_answers_per_s": round(float(a_flat[bf]), 1),
            "flat_peers": int(peers[bf]),
        },
        "busiest_paths": int(plan.paths.max()) if m else 1,
        "container_probes_per_s_p50": {
            "planned": round(float(np.median(c_plan[c_plan > 0])), 1) if m else 0.0,
            "flat": round(float(np.median(c_flat[c_flat > 0])), 1) if m else 0.0,
        },
        "jobs": len(parts),
        "links": n_links,  # (job, link): each job's plan holds its own links to the floor
        "links_below_floor": {"planned": below_plan, "flat": below_flat},
        "ecmp_paths_covered_share": {
            "planned_mean": round(float(draws[:, 0].mean()), 5),
            "planned_min": round(float(draws[:, 0].min()), 5),
            "one_path_id_mean": round(float(draws[:, 1].mean()), 5),
            "hash_seeds": hash_seeds,
            "window_s": window_s,
        },
    }
