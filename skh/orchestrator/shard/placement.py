"""Where each endpoint's records go: jobs (or, for big jobs, their rails) placed on shards.

A shard must see every probe of an endpoint it judges: the detector keeps per-endpoint state
next to the per-pair state (agent health from the prober's progress and the responder's
refusals, failures corroborated by other pairs of one endpoint), so splitting one endpoint's
pairs over two shards would change what it decides. The unit of placement is therefore a
*cell* whose endpoints only probe each other:

* a job, as long as it has at most ``max_cell_endpoints`` endpoints;
* else each of its rails: skeleton and same-rail pairs never leave a rail (collectives stay on
  their rail), so a rail of a job is closed under probing. A row that still crosses cells (a
  group-wide fallback list) goes with its prober and is counted.

The detector also pools loss evidence over *groups* of endpoints it is told of
(:meth:`Detector.set_endpoint_groups`, e.g. the ToR each RNIC hangs off): a group's test counts
the failures of all its pairs, and a pair is flagged on its group's word. Cells that share a
group are therefore joined into one *component*, and a component is placed whole, so every
scope the detector pools over (pair, endpoint, group) lives on one shard and each shard's
tests read what the single detector's read. (On a rail-optimized fabric a ToR serves one rail:
whole-job cells of jobs sharing ToRs join up, rail cells join per rail.) Joining stops at
``max_component_endpoints``: jobs spanning segments would otherwise chain a fleet's segments
into one component, one shard. A group left across shards that way — or one that grew across
cells already placed, which never move — is counted in ``split_groups``; each shard's detector
then pools over its part of the group (fewer pairs per test, the same test), and learns the
group's crossing history from its own pairs.

Byte counters go to the job's *home* shard (the shard of its first cell): skeleton inference
reads all of a job's endpoints at once. So does link state (:mod:`skh.analysis.linkstate`): a VF
reading down counts while another VF of its container reads up, and the container's VFs are on
its rails. A job placed whole has its pairs on its home shard too; a job split into rail cells
has its other rails' pairs elsewhere, and for those, under a dead agent, only the probes and
the agent's own alert speak (link state needs a container's VFs and its pairs on one shard).

Placement is sticky, a cell never moves once placed (moving it would drop its look-back), and a
new cell goes to the shard holding the fewest endpoints, so the order endpoints register in
decides it, not a hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skh.errors import ConfigError
from skh.records import COUNTER_DTYPE, PROBE_DTYPE

__all__ = ["Placement", "Routed"]

_NOWHERE = -1


@dataclass(frozen=True, slots=True)
class Routed:
    """One round's records split by shard, and what could not be placed."""

    probes: list[np.ndarray]
    counters: list[np.ndarray]
    heartbeats: list[np.ndarray]
    unplaced: int  # probe rows whose prober no shard holds (endpoint unknown yet)
    cross_cell: int  # probe rows whose two endpoints sit in different cells


class Placement:
    def __init__(
        self,
        shards: int,
        *,
        max_cell_endpoints: int = 8192,
        max_component_endpoints: int = 16384,
    ) -> None:
        if shards < 1:
            raise ConfigError(f"The number of shards must be >= 1. Got {shards!r} instead.")
        for name, v in (
            ("max_cell_endpoints", max_cell_endpoints),
            ("max_component_endpoints", max_component_endpoints),
        ):
            if v < 1:
                raise ConfigError(f"The '{name}' setting must be >= 1. Got {v!r} instead.")
        self.shards = int(shards)
        self.max_cell_endpoints = int(max_cell_endpoints)
        self.max_component_endpoints = int(max_component_endpoints)
        #: (job, rail) -> shard; rail -1: the whole job is one cell
        self.cell_shard: dict[tuple[str, int], int] = {}
        self.load = np.zeros(self.shards, np.int64)  # endpoints placed per shard
        self.ep_shard = np.full(0, _NOWHERE, np.int16)
        self.ep_home = np.full(0, _NOWHERE, np.int16)
        #: job -> its home shard (skeleton inference); in membership order
        self.home: dict[str, int] = {}
        #: groups (of the last update's groupings) whose endpoints sit on more than one shard
        self.split_groups = 0

    def update(
        self, members: Iterable[Mapping[str, Any]], groups: Sequence[np.ndarray] = ()
    ) -> None:
        """Place the endpoints of ``members`` (``ep``, ``job``, ``rail``); endpoints and cells
        already placed stay where they are. ``groups``: the detector's corroboration groupings,
        each an array endpoint id -> group id (-1: none); cells sharing a group go together."""
        rows = sorted(members, key=lambda m: int(m["ep"]))
        by_job: dict[str, list[tuple[int, int]]] = {}
        for m in rows:
            by_job.setdefault(str(m["job"]), []).append((int(m["ep"]), int(m["rail"])))
        n = (max(e for eps in by_job.values() for e, _r in eps) + 1) if by_job else 0
        if n > self.ep_shard.size:
            grow = np.full(n - self.ep_shard.size, _NOWHERE, np.int16)
            self.ep_shard = np.concatenate([self.ep_shard, grow])
            self.ep_home = np.concatenate([self.ep_home, grow])
        cell_of: dict[int, tuple[str, int]] = {}
        for job, eps in by_job.items():
            whole = (job, -1) in self.cell_shard or (
                not any(c[0] == job for c in self.cell_shard)
                and len(eps) <= self.max_cell_endpoints
            )
            for ep, rail in eps:
                cell_of[ep] = (job, -1 if whole else rail)
        eps_of: dict[tuple[str, int], list[int]] = {}
        for ep, cell in cell_of.items():
            eps_of.setdefault(cell, []).append(ep)
        for comp in _components(cell_of, groups, self.max_component_endpoints):
            placed = [self.cell_shard[c] for c in comp if c in self.cell_shard]
            shard = placed[0] if placed else int(np.argmin(self.load))
            for c in comp:
                s = self.cell_shard.setdefault(c, shard)
                for ep in eps_of[c]:
                    if self.ep_shard[ep] == _NOWHERE:
                        self.load[s] += 1
                    self.ep_shard[ep] = s
        for job, eps in by_job.items():
            home = self.home.setdefault(job, self.ep_shard[eps[0][0]].item())
            self.ep_home[[e for e, _r in eps]] = home
        self.home = {j: self.home[j] for j in by_job}  # jobs gone are no one's home
        self.split_groups = sum(self._split(g) for g in groups)

    def _split(self, group: np.ndarray) -> int:
        """How many groups of one grouping have endpoints on two shards or more."""
        g = np.asarray(group, np.int64)[: self.ep_shard.size]
        sh = self.ep_shard[: g.size].astype(np.int64)
        ok = (g >= 0) & (sh != _NOWHERE)
        if not ok.any():
            return 0
        pairs = np.unique(np.stack([g[ok], sh[ok]], axis=1), axis=0)
        _ids, per_group = np.unique(pairs[:, 0], return_counts=True)
        return int((per_group > 1).sum())

    def shard_of(self, eps: np.ndarray) -> np.ndarray:
        """The shard holding each endpoint (-1: none yet)."""
        return self.lookup(self.ep_shard, eps)

    def jobs_of(self, shard: int) -> set[str]:
        """The jobs whose skeleton ``shard`` infers."""
        return {j for j, s in self.home.items() if s == shard}

    @staticmethod
    def lookup(table: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """``table[eps]``, -1 where ``eps`` is past its end."""
        eps = np.asarray(eps, np.int64)
        out = np.full(eps.size, _NOWHERE, np.int16)
        ok = (eps >= 0) & (eps < table.size)
        out[ok] = table[eps[ok]]
        return out

    def route(
        self,
        probes: np.ndarray,
        counters: np.ndarray,
        heartbeats: np.ndarray | None = None,
    ) -> Routed:
        """Split one round's records by shard, keeping their order within each shard. Rows of an
        endpoint no cell holds yet are dropped (and counted): no shard has its job."""
        probes = np.asarray(probes, PROBE_DTYPE)
        counters = np.asarray(counters, COUNTER_DTYPE)
        ps = self.lookup(self.ep_shard, probes["src_ep"])
        pd = self.lookup(self.ep_shard, probes["dst_ep"])
        known = (ps != _NOWHERE) & (pd != _NOWHERE)
        cs = self.lookup(self.ep_home, counters["ep"])
        hb = np.zeros(0, np.int64) if heartbeats is None else np.asarray(heartbeats, np.int64)
        hs = self.lookup(self.ep_shard, hb)
        return Routed(
            [probes[known & (ps == s)] for s in range(self.shards)],
            [counters[cs == s] for s in range(self.shards)],
            [hb[hs == s] for s in range(self.shards)],
            int((~known).sum()),
            int((known & (ps != pd)).sum()),
        )


def _components(
    cell_of: Mapping[int, tuple[str, int]], groups: Sequence[np.ndarray], max_endpoints: int
) -> list[list[tuple[str, int]]]:
    """The cells of ``cell_of`` (endpoint -> cell) joined where a group of ``groups`` has
    endpoints in both, as long as the joined component holds at most ``max_endpoints``
    endpoints; each component's cells in endpoint order, components in the order of their
    first endpoint (so the order endpoints register in decides placement, as before)."""
    cells = list(dict.fromkeys(cell_of[e] for e in sorted(cell_of)))
    index = {c: i for i, c in enumerate(cells)}
    parent = list(range(len(cells)))
    size = [0] * len(cells)
    for cell in cell_of.values():
        size[index[cell]] += 1

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for g in groups:
        g = np.asarray(g, np.int64)
        first: dict[int, int] = {}
        for ep, cell in cell_of.items():
            gid = int(g[ep]) if ep < g.size else -1
            if gid < 0:
                continue
            a, b = root(first.setdefault(gid, index[cell])), root(index[cell])
            if a != b and size[a] + size[b] <= max_endpoints:
                lo, hi = min(a, b), max(a, b)
                parent[hi] = lo
                size[lo] += size[hi]
    out: dict[int, list[tuple[str, int]]] = {}
    for i, c in enumerate(cells):
        out.setdefault(root(i), []).append(c)
    return list(out.values())
