"""Versioned per-job ping lists, in the paper's phases.

* **Preload**: every endpoint of a job known to the controller (submitted or registered) is in the
  job's list of same-rail, different-host pairs (:func:`skh.model.same_rail_pairs`) from the start.
* **Incremental activation**: a destination is probe-able only once it registered *ready*. The
  controller announces a readiness change once on the job's topic; each agent applies it to its
  own copy of :class:`JobPingLists` — no per-agent push per change.
* **Skeleton**: :meth:`JobPingLists.apply_skeleton` replaces the pair set with the inferred
  skeleton in one versioned step. Agents add the new targets before removing the dropped ones, so
  a pair in both lists is never left unprobed. An endpoint the skeleton names in no pair (it
  joined later: an elastic job grew, a container came back under a new id) keeps its preload
  pairs, both ways, until a skeleton names it: the job is re-inferred without a gap.

The same class runs on both sides: the controller mutates it and publishes the returned bodies;
an agent builds it from a snapshot and :meth:`~JobPingLists.apply` s what it hears. Every published
change bumps ``version`` by one, so an agent that sees a gap asks for a fresh snapshot.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import numpy as np

from skh.errors import TopologyError
from skh.model import same_rail_pair_count, same_rail_pairs
from skh.orchestrator.jobcopy import EndpointInfo, JobCopy, merge_snapshot_pages, page_records
from skh.wire import (
    ENDPOINT_DTYPE,
    ENDPOINT_TEXT,
    PAGE_MAX,
    encode_records,
    pack_pairs,
    unpack_pairs,
)

__all__ = ["EndpointInfo", "JobPingLists", "merge_snapshot_pages", "page_records"]

_TEXT = tuple(ENDPOINT_TEXT)


class JobPingLists(JobCopy):
    """The endpoints of one job, their readiness, the optional skeleton and the list version: the
    controller's, and what reads a job as arrays (an agent's copy is the :class:`JobCopy`)."""

    def __init__(self, job: str, *, version: int = 0) -> None:
        super().__init__(job, version=version)
        self.skeleton: np.ndarray | None = None  # (n, 2) uint32 (src, dst)
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._order: list[int] = []  # endpoint ids sorted, for paging
        #: beside ``_order`` (row i is ``_order[i]``, capacity beyond): each record's fixed
        #: fields and its text fields as ids into ``_strings`` (one table per text field), what
        #: a snapshot page is cut from without touching the records one by one. Brought up to
        #: date when a page is asked for (an agent's copy never serves one): ``_stale`` names
        #: the endpoints changed since, ``_rebuild`` says every row is
        self._fixed = np.zeros(0, ENDPOINT_DTYPE)
        self._text = np.zeros((0, len(_TEXT)), np.uint32)
        self._strings: list[list[str]] = [[] for _ in _TEXT]
        self._intern: list[dict[str, int]] = [{} for _ in _TEXT]
        self._stale: list[int] = []
        self._rebuild = False
        #: encoded pages by first row (pages an agent walks start at multiples of their limit):
        #: (limit, records), dropped when a row in them changes
        self._pages: dict[int, tuple[int, dict[str, Any]]] = {}

    def store(self, info: EndpointInfo) -> None:
        """Put one endpoint record; every change goes through here, so the page holding it is
        encoded again when next asked for."""
        order = self._order
        if info.ep not in self.endpoints:
            if order and info.ep < order[-1]:
                order.insert(bisect.bisect_left(order, info.ep), info.ep)
                self._rebuild = True  # every later row moved
            else:  # ids are handed out in increasing order: appending is the rule
                order.append(info.ep)
        self.endpoints[info.ep] = info
        if not self._rebuild:
            self._stale.append(info.ep)
            self._rebuild = len(self._stale) > len(order)  # cheaper to redo them all
        self._arrays = None

    def _columns(self) -> None:
        """Bring the columns up to date with the records, dropping the pages that changed."""
        n = len(self._order)
        if self._rebuild:
            rows: Iterable[int] = range(n)
            self._pages.clear()
            self._fixed = np.zeros(0, ENDPOINT_DTYPE)
        elif self._stale:
            rows = sorted({bisect.bisect_left(self._order, ep) for ep in self._stale})
        else:
            return
        if n > self._fixed.size:
            cap = max(64, 2 * n)
            fixed, text = np.zeros(cap, ENDPOINT_DTYPE), np.zeros((cap, len(_TEXT)), np.uint32)
            k = min(self._fixed.size, n)
            fixed[:k], text[:k] = self._fixed[:k], self._text[:k]
            self._fixed, self._text = fixed, text
        for i in rows:
            info = self.endpoints[self._order[i]]
            self._fixed[i] = (info.ep, info.rail, info.port, info.qpn, info.ready)
            self._text[i] = [self._intern_text(k, getattr(info, f)) for k, f in enumerate(_TEXT)]
            for start, (limit, _rec) in list(self._pages.items()):
                if start <= i < start + limit:
                    del self._pages[start]
        self._stale, self._rebuild = [], False

    def _intern_text(self, k: int, value: str) -> int:
        ids = self._intern[k]
        got = ids.get(value)
        if got is None:
            if len(ids) > 2 * len(self._order) + 64:  # values no record holds any more
                self._reintern(k)
            got = ids[value] = len(self._strings[k])
            self._strings[k].append(value)
        return got

    def _reintern(self, k: int) -> None:
        """Rebuild text table ``k`` from the values the records hold now (a job whose agents
        re-register with new addresses would otherwise grow it without bound)."""
        n = len(self._order)
        live, inv = np.unique(self._text[:n, k], return_inverse=True)
        self._strings[k] = [self._strings[k][u] for u in live.tolist()]
        self._intern[k] = {v: j for j, v in enumerate(self._strings[k])}
        self._text[:n, k] = inv.reshape(-1)

    def _page(self, i: int, limit: int) -> dict[str, Any]:
        """Rows ``i`` to ``i + limit`` encoded as a page's records (:func:`encode_records`)."""
        self._columns()
        hit = self._pages.get(i)
        if hit is not None and hit[0] == limit:
            return hit[1]
        j = min(i + limit, len(self._order))
        text = {}
        for k, f in enumerate(_TEXT):
            uniq, inv = np.unique(self._text[i:j, k], return_inverse=True)
            table = self._strings[k]
            text[f] = ([table[u] for u in uniq.tolist()], inv.reshape(-1))
        rec = encode_records(self._fixed[i:j], text)
        if i % limit == 0:  # where an agent's walk starts its pages: one cached page per row
            self._pages[i] = (limit, rec)
        return rec

    # -- controller side: mutations ------------------------------------------------------------
    def upsert(self, info: EndpointInfo) -> dict[str, Any] | None:
        """Record a (re-)registration. Returns an ENDPOINTS_DOWN body to publish when a ready
        endpoint came back with a different address (its agent restarted): it is not probe-able
        again until it reports ready."""
        if info.job != self.job:
            raise TopologyError(f"endpoint {info.name} does not belong to job {self.job}")
        old = self.endpoints.get(info.ep)
        keep_ready = old is not None and old.ready and old.address() == info.address()
        self.store(info if info.ready == keep_ready else info.with_ready(keep_ready))
        self._arrays = None
        if old is not None and old.ready and not keep_ready:
            return self._bump_down([info.ep], "re-registered")
        return None

    def mark_ready(self, eps: Iterable[int]) -> list[int]:
        """Mark endpoints ready without announcing it (the controller coalesces the readiness
        changes of one tick into one announcement: :meth:`announce_ready`); returns those that
        changed."""
        changed = []
        for ep in eps:
            info = self.endpoints.get(ep)
            if info is None:
                raise TopologyError(f"endpoint {ep} is not registered in job {self.job}")
            if not info.ready:
                self.store(info.with_ready(True))
                changed.append(ep)
        return changed

    def announce_ready(self, eps: list[int]) -> dict[str, Any]:
        """The READY_ANNOUNCE body of endpoints marked ready since the last announcement (one
        version step)."""
        self.version += 1
        records = [self.endpoints[ep].to_wire() for ep in eps]
        return {"job": self.job, "version": self.version, "endpoints": records}

    def set_ready(self, eps: Iterable[int]) -> dict[str, Any] | None:
        """Mark endpoints ready and announce them at once; returns the READY_ANNOUNCE body (None
        if nothing changed)."""
        changed = self.mark_ready(eps)
        return self.announce_ready(changed) if changed else None

    def set_down(self, eps: Iterable[int], reason: str) -> dict[str, Any] | None:
        """Mark endpoints not ready (dead agent, container gone); returns ENDPOINTS_DOWN body."""
        changed = [ep for ep in eps if ep in self.endpoints and self.endpoints[ep].ready]
        for ep in changed:
            self.store(self.endpoints[ep].with_ready(False))
        if not changed:
            return None
        self._arrays = None
        return self._bump_down(changed, reason)

    def _bump_down(self, eps: list[int], reason: str) -> dict[str, Any]:
        self.version += 1
        return {"job": self.job, "version": self.version, "endpoints": eps, "reason": reason}

    def apply_skeleton(self, pairs: np.ndarray, skeleton_version: int) -> dict[str, Any]:
        """Replace the pair set by a skeleton; returns the SKELETON body. Only pairs between this
        job's endpoints are accepted; a skeleton version must grow; an endpoint it names in no
        pair keeps its preload pairs (:meth:`newcomer_pairs`). The old skeleton's probe plan
        goes with it (the controller plans the new one and adds it to the body)."""
        pairs = np.asarray(pairs, dtype=np.uint32).reshape(-1, 2)
        if skeleton_version <= self.skeleton_version:
            raise TopologyError(
                f"job {self.job}: skeleton version {skeleton_version} is not newer than "
                f"{self.skeleton_version}"
            )
        unknown = np.setdiff1d(
            pairs.ravel(), np.fromiter(self.endpoints, np.uint32, len(self.endpoints))
        )
        if unknown.size:
            raise TopologyError(
                f"job {self.job}: skeleton names unknown endpoints {unknown[:8].tolist()}"
            )
        self.skeleton = np.unique(pairs, axis=0) if pairs.size else pairs
        self.skeleton_version = skeleton_version
        self.plan = None
        self.version += 1
        body = {
            "job": self.job,
            "version": self.version,
            "skeleton_version": skeleton_version,
            "pairs": pack_pairs(self.skeleton),
        }
        return body | self._probing()

    def _probing(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.probing is not None:
            out["probing"] = self.probing
        if self.plan is not None:
            out["plan"] = self.plan
        return out

    def snapshot(self, after: int = -1, limit: int = PAGE_MAX) -> dict[str, Any]:
        """One page of the JOB_SNAPSHOT body: everything an agent needs to build its lists, the
        endpoints with ids above ``after`` (at most ``limit``); ``next`` is where the next page
        starts (None: this was the last)."""
        i = bisect.bisect_right(self._order, after)
        more = i + limit < len(self._order)
        return {
            "job": self.job,
            "version": self.version,
            "records": self._page(i, limit),
            "skeleton_version": self.skeleton_version,
            "skeleton": None if self.skeleton is None else pack_pairs(self.skeleton),
            "next": self._order[i + limit - 1] if more else None,
        } | self._probing()

    # -- agent side ----------------------------------------------------------------------------
    def _set_skeleton(self, raw: bytes | None) -> None:
        self.skeleton = None if raw is None else unpack_pairs(raw)
        self._arrays = None

    def destinations(self, src: int) -> list[int]:
        return self.ping_list(src).tolist()

    # -- queries -------------------------------------------------------------------------------
    def _cols(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            infos = sorted(self.endpoints.values(), key=lambda i: i.ep)
            hosts: dict[str, int] = {}
            self._arrays = (
                np.fromiter((i.ep for i in infos), np.uint32, len(infos)),
                np.fromiter((i.rail for i in infos), np.int32, len(infos)),
                np.fromiter(
                    (hosts.setdefault(i.host, len(hosts)) for i in infos), np.int32, len(infos)
                ),
                np.fromiter((i.ready for i in infos), bool, len(infos)),
            )
        return self._arrays

    def preload_pairs(self) -> np.ndarray:
        """Same-rail, different-host pairs among every known endpoint, ready or not."""
        ep, rail, host, _ = self._cols()
        return same_rail_pairs(ep, rail, host)

    def newcomer_pairs(self) -> np.ndarray:
        """The preload pairs, both ways, of the endpoints no skeleton pair names (they joined
        after it was inferred; :meth:`JobCopy.destinations`), ready or not; none without a
        skeleton (the preload list is every pair then)."""
        ep, rail, host, _ = self._cols()
        if self.skeleton is None:
            return np.zeros((0, 2), np.uint32)
        fresh = np.flatnonzero(~np.isin(ep, self.skeleton))
        out = []
        for i in fresh.tolist():  # a few at a time: a container's RNICs
            peer = ep[(rail == rail[i]) & (host != host[i])]
            out += [
                np.stack([np.full_like(peer, ep[i]), peer], 1),
                np.stack([peer, np.full_like(peer, ep[i])], 1),
            ]
        if not out:
            return np.zeros((0, 2), np.uint32)
        return np.unique(np.concatenate(out), axis=0)

    def listed_pairs(self) -> np.ndarray:
        """Every pair of the list, ready or not: the skeleton and its newcomers' pairs, or the
        preload list."""
        ep, rail, host, _ = self._cols()
        if self.skeleton is None:
            return same_rail_pairs(ep, rail, host)
        extra = self.newcomer_pairs()
        if extra.size == 0:
            return self.skeleton
        return np.unique(np.concatenate([self.skeleton.astype(np.uint32), extra]), axis=0)

    def active_pairs(self) -> np.ndarray:
        """The pairs probed now: the skeleton and its newcomers' pairs (or the preload list)
        restricted to ready destinations, sorted by (src, dst)."""
        ep, rail, host, ready = self._cols()
        pairs = self.listed_pairs()
        if pairs.size == 0:
            return np.zeros((0, 2), np.uint32)
        ready_ids = ep[ready]
        pairs = pairs[np.isin(pairs[:, 1], ready_ids)]
        return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]

    def ping_list(self, src: int, *, ready_only: bool = True) -> np.ndarray:
        """Destinations ``src`` probes now (sorted uint32); with ``ready_only`` False, every
        destination its list holds, ready or not."""
        ep, rail, host, ready = self._cols()
        if self.skeleton is not None:
            pairs = self.listed_pairs()
            dst = pairs[pairs[:, 0] == src, 1]
            return np.sort(dst[np.isin(dst, ep[ready])] if ready_only else dst)
        i = np.searchsorted(ep, src)
        if i >= ep.size or ep[i] != src:
            return np.zeros(0, np.uint32)
        return ep[(ready | (not ready_only)) & (rail == rail[i]) & (host != host[i])]

    def pair_counts(self) -> dict[str, int]:
        """The lists' sizes without listing them (a preload list grows with the square of the
        job): ``preload`` (every same-rail, different-host pair), ``pairs`` (the skeleton when
        one is applied, else the preload list), ``active`` (those with a ready destination)."""
        ep, rail, host, ready = self._cols()
        preload = same_rail_pair_count(rail, host)
        if self.skeleton is None:
            return {
                "preload": preload,
                "pairs": preload,
                "active": same_rail_pair_count(rail, host, ready),
            }
        pairs = self.listed_pairs()
        active = int(np.isin(pairs[:, 1], ep[ready]).sum())
        return {"preload": preload, "pairs": int(pairs.shape[0]), "active": active}

    def first_pairs(self, limit: int, *, ready_only: bool = True) -> np.ndarray:
        """The first ``limit`` pairs of the list (by source, then destination), listed one
        source at a time: what a reader of a big job's list is shown."""
        out: list[np.ndarray] = []
        n = 0
        for src in sorted(self.endpoints):
            if n >= limit:
                break
            dst = self.ping_list(src, ready_only=ready_only)[: limit - n]
            if dst.size:
                out.append(np.stack([np.full(dst.size, src, np.uint32), dst], axis=1))
                n += dst.size
        return np.concatenate(out) if out else np.zeros((0, 2), np.uint32)
