"""Probing cost of four ping-list strategies, and what a random sampler with the skeleton's budget
misses.

Strategies, for one job of N RNICs (the paper's TP8 × PP8 × DP{8,16,32} at 512/1,024/2,048):

- **full mesh**: every RNIC probes every other RNIC of the job (N − 1 each);
- **same rail** (the paper's *SkeletonHunter-Basic*, the preload list): N/8 − 1 each;
- **deTector-style greedy probe matrix**: probe *paths* (pair + flow label) over the job's
  same-rail pairs chosen greedily until every physical link they can reach is covered by at least
  ``beta`` probes (deTector's PMC, coverage part); how many links the matrix also tells apart
  (1-identifiability, not enforced by the greedy) is reported beside it;
- **skeleton**: the list :func:`skh.analysis.skeleton.infer_skeleton` infers from the job's
  simulated throughput.

Sweep time follows the model the paper's numbers fit (``shared/notes/paper.md`` §6): each RNIC
probes its list serially, one destination per second, so a sweep lasts the longest list.
``probes_per_sweep`` is the number of (pair, path) probes one sweep sends: every list summed.

The random sampler (Pingmesh-style): each endpoint probes as many destinations as its skeleton
list holds, drawn uniformly from its job's same-rail peers (a fixed pinglist, as Pingmesh's
controller hands out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from skh.analysis.skeleton import infer_skeleton, pairs_coverage
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs
from skh.sim import LINGJUN_TOPO
from skh.sim.jobs import make_job
from skh.sim.topology import FabricIndex, rng_for
from skh.sim.traffic import throughput

__all__ = [
    "PAPER_SWEEP_S",
    "PAPER_PROBES_2048",
    "path_links",
    "greedy_probe_matrix",
    "sweep_table",
    "random_sample_pairs",
]

#: the paper's sweep times (s) per RNIC count; no deTector column there
PAPER_SWEEP_S: dict[int, dict[str, float]] = {
    512: {"full_mesh": 560.25, "same_rail": 64.85, "skeleton": 8.23},
    1024: {"full_mesh": 1123.43, "same_rail": 122.54, "skeleton": 16.91},
    2048: {"full_mesh": 2034.12, "same_rail": 240.54, "skeleton": 25.09},
}
#: the paper's "probe count" at 2,048 RNICs (unit unstated; see docs/results.md)
PAPER_PROBES_2048: dict[str, float] = {"full_mesh": 60430.32, "skeleton": 2593.03}


def path_links(index: FabricIndex, src_rnic: np.ndarray, dst_rnic: np.ndarray, path_id: np.ndarray):
    """The physical links each flow-pinned path crosses, as ``(n, 6)`` node-pair keys (−1 where a
    path has fewer links). Nodes: switches by id, RNICs after them; a link's key is
    ``min(u, v) * n_nodes + max(u, v)`` (links are undirected: replies retrace requests)."""
    n_sw = len(index.switch_names)
    nodes = index.route(src_rnic, dst_rnic, path_id).nodes.astype(np.int64)
    src = np.asarray(src_rnic, np.int64)[:, None] + n_sw
    seq = np.concatenate([src, nodes, np.asarray(dst_rnic, np.int64)[:, None] + n_sw], axis=1)
    for k in range(1, seq.shape[1]):  # skip the tiers a path does not use
        seq[:, k] = np.where(seq[:, k] < 0, seq[:, k - 1], seq[:, k])
    u, v = seq[:, :-1], seq[:, 1:]
    n_nodes = np.int64(n_sw + index.n_rnics)
    key = np.minimum(u, v) * n_nodes + np.maximum(u, v)
    key[u == v] = -1
    # compact each row's links to the left (a row holds at most 6)
    order = np.argsort(key < 0, axis=1, kind="stable")
    return np.take_along_axis(key, order, axis=1)


def greedy_probe_matrix(links: np.ndarray, beta: int = 2) -> tuple[np.ndarray, dict[str, Any]]:
    """Greedy PMC: pick candidate paths (rows of ``links``) with the most links still covered
    fewer than ``beta`` times until no pick helps. Returns the chosen rows and coverage facts."""
    flat = links[links >= 0]
    uniq, inv = np.unique(flat, return_inverse=True)
    lid = np.full(links.shape, -1, np.int64)
    lid[links >= 0] = inv
    n_links, m = uniq.size, links.shape[0]
    cov = np.zeros(n_links, np.int64)
    gain = (lid >= 0).sum(axis=1)
    # candidates of each link, for decrementing gains when a link is done
    rows = np.repeat(np.arange(m), lid.shape[1])[lid.ravel() >= 0]
    lk = lid.ravel()[lid.ravel() >= 0]
    order = np.argsort(lk, kind="stable")
    cand_of, start = rows[order], np.searchsorted(lk[order], np.arange(n_links + 1))
    chosen: list[int] = []
    taken = np.zeros(m, bool)
    while True:
        g = np.where(taken, -1, gain)
        best = int(np.argmax(g))
        if g[best] <= 0:
            break
        chosen.append(best)
        taken[best] = True
        for ln in lid[best][lid[best] >= 0].tolist():
            cov[ln] += 1
            if cov[ln] == beta:
                gain[cand_of[start[ln] : start[ln + 1]]] -= 1
    sel = np.asarray(chosen, np.int64)
    # 1-identifiability: links whose set of covering probes is shared with no other link
    sig: dict[tuple[int, ...], int] = {}
    members: list[list[int]] = [[] for _ in range(n_links)]
    for r in sel.tolist():
        for ln in lid[r][lid[r] >= 0].tolist():
            members[ln].append(r)
    for mem in members:
        sig[tuple(mem)] = sig.get(tuple(mem), 0) + 1
    unique = sum(1 for mem in members if mem and sig[tuple(mem)] == 1)
    return sel, {
        "links": int(n_links),
        "links_covered_beta": int((cov >= beta).sum()),
        "links_identifiable": int(unique),
        "beta": beta,
    }


def _sweep_job(n_rnics: int, seed: int, duration_s: int, n_path_ids: int, beta: int) -> dict:
    hosts = n_rnics // 8
    cluster = Cluster(Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=hosts))
    job = make_job(cluster, "sweep", JobShape(8, 8, hosts // 8), iteration_s=15.0, seed=seed)
    ep_ids, x = throughput(job, duration_s, seed)
    sk = infer_skeleton(job.ep_ids, job.host, job.rail, x, container=job.container, job=job.name)
    base = int(job.ep_ids[0])
    sr = same_rail_pairs(job.ep_ids, job.rail, job.host)
    index = FabricIndex(cluster.fabric)
    rnic = (job.host.astype(np.int64) * index.rails + job.rail).astype(np.int64)
    # deTector candidates: every same-rail pair on every flow label, at most 32 peers per source
    rng = rng_for(seed, 0xDE7, n_rnics)
    src_l, dst_l = sr[:, 0].astype(np.int64) - base, sr[:, 1].astype(np.int64) - base
    keep = np.zeros(src_l.size, bool)
    for s in np.unique(src_l):
        idx = np.flatnonzero(src_l == s)
        keep[idx if idx.size <= 32 else rng.choice(idx, 32, replace=False)] = True
    cs, cd = np.repeat(src_l[keep], n_path_ids), np.repeat(dst_l[keep], n_path_ids)
    cp = np.tile(np.arange(n_path_ids), int(keep.sum()))
    links = path_links(index, rnic[cs], rnic[cd], cp)
    sel, facts = greedy_probe_matrix(links, beta)
    lists = {
        "full_mesh": np.full(n_rnics, n_rnics - 1),
        "same_rail": np.bincount(src_l, minlength=n_rnics),
        "detector": np.bincount(cs[sel], minlength=n_rnics),
        "skeleton": np.bincount(sk.pairs[:, 0].astype(np.int64) - base, minlength=n_rnics),
    }
    out: dict[str, Any] = {"rnics": n_rnics, "job": f"TP8 PP8 DP{hosts // 8}"}
    for k, v in lists.items():
        out[k] = {
            "sweep_s": float(v.max()),
            "probes_per_sweep": int(v.sum()),
            "mean_list": round(float(v.mean()), 2),
        }
    out["skeleton"] |= {
        "mode": sk.mode,
        "coverage": round(pairs_coverage(job.skeleton_pairs, sk.pairs), 6),
    }
    probed = np.unique(np.stack([cs[sel], cd[sel]], axis=1) + base, axis=0)
    # deTector probes links, not the job's pairs: how many used pairs its matrix still probes
    out["detector"] |= facts | {
        "overlay_pairs_covered": round(pairs_coverage(job.skeleton_pairs, probed), 4)
    }
    out["paper_sweep_s"] = PAPER_SWEEP_S.get(n_rnics)
    return out


def sweep_table(
    rnic_counts: tuple[int, ...],
    seed: int,
    *,
    duration_s: int = 240,
    n_path_ids: int = 4,
    beta: int = 2,
) -> dict[str, Any]:
    """The probing-cost table: per RNIC count, each strategy's sweep time and probes per sweep."""
    rows = {str(n): _sweep_job(n, seed, duration_s, n_path_ids, beta) for n in rnic_counts}
    out: dict[str, Any] = {"rows": rows, "paper_probes_2048": PAPER_PROBES_2048}
    if "2048" in rows:
        r = rows["2048"]
        out["full_mesh_over_skeleton_2048"] = round(
            r["full_mesh"]["probes_per_sweep"] / max(1, r["skeleton"]["probes_per_sweep"]), 2
        )
        out["paper_full_mesh_over_skeleton_2048"] = round(
            PAPER_PROBES_2048["full_mesh"] / PAPER_PROBES_2048["skeleton"], 2
        )
    return out


def random_sample_pairs(
    ep_ids: np.ndarray, rail: np.ndarray, host: np.ndarray, out_degree: np.ndarray, seed: int
) -> np.ndarray:
    """One job's Pingmesh-style pinglist: endpoint ``i`` probes ``out_degree[i]`` distinct
    same-rail peers on other hosts, drawn uniformly. ``(m, 2)`` uint32."""
    rng = rng_for(seed, 0x5A3, int(ep_ids[0]) if ep_ids.size else 0)
    out = []
    for r in np.unique(rail):
        idx = np.flatnonzero(rail == r)
        g = idx.size
        if g < 2:
            continue
        keys = rng.random((g, g))
        keys[host[idx][:, None] == host[idx][None, :]] = np.inf
        order = np.argsort(keys, axis=1)
        k = np.minimum(out_degree[idx], (np.isfinite(keys)).sum(axis=1))
        take = np.arange(g)[None, :] < k[:, None]
        src = np.broadcast_to(idx[:, None], (g, g))[take]
        dst = idx[order][take]
        out.append(np.stack([ep_ids[src], ep_ids[dst]], axis=1))
    return np.concatenate(out).astype(np.uint32) if out else np.zeros((0, 2), np.uint32)
