"""Versioned per-job ping lists, in the paper's phases.

* **Preload**: every endpoint of a job known to the controller (submitted or registered) is in the
  job's list of same-rail, different-host pairs (:func:`skh.model.same_rail_pairs`) from the start.
* **Incremental activation**: a destination is probe-able only once it registered *ready*. The
  controller announces a readiness change once on the job's topic; each agent applies it to its
  own copy of :class:`JobPingLists` — no per-agent push per change.
* **Skeleton**: :meth:`JobPingLists.apply_skeleton` replaces the pair set with the inferred
  skeleton in one versioned step. Agents add the new targets before removing the dropped ones, so
  a pair in both lists is never left unprobed.

The same class runs on both sides: the controller mutates it and publishes the returned bodies;
an agent builds it from a snapshot and :meth:`~JobPingLists.apply` s what it hears. Every published
change bumps ``version`` by one, so an agent that sees a gap asks for a fresh snapshot.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from skh.errors import ProtocolError, TopologyError
from skh.model import same_rail_pair_count, same_rail_pairs
from skh.wire import (
    ENDPOINT_DTYPE,
    ENDPOINT_TEXT,
    NAME_MAX,
    PAGE_MAX,
    MsgType,
    decode_records,
    encode_records,
    pack_pairs,
    unpack_pairs,
)

__all__ = ["EndpointInfo", "JobPingLists", "merge_snapshot_pages", "page_records"]

_TEXT = tuple(ENDPOINT_TEXT)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """What the controller knows of one endpoint (the wire form of :class:`skh.model.Endpoint`
    plus readiness)."""

    ep: int
    job: str
    container: str
    host: str
    rail: int
    ip: str = ""
    port: int = 0
    gid: str = ""
    qpn: int = 0
    netdev: str = ""
    ready: bool = False

    @property
    def name(self) -> str:
        return f"{self.job}/{self.container}/{self.rail}"

    def address(self) -> tuple[str, int, str, int]:
        return (self.ip, self.port, self.gid, self.qpn)

    def with_ready(self, ready: bool) -> EndpointInfo:
        # positional construction: dataclasses.replace introspects the fields on every call
        return EndpointInfo(
            self.ep,
            self.job,
            self.container,
            self.host,
            self.rail,
            self.ip,
            self.port,
            self.gid,
            self.qpn,
            self.netdev,
            ready,
        )

    def to_wire(self) -> dict[str, Any]:
        # by hand: dataclasses.asdict deep-copies and was the controller's hottest function
        return {
            "ep": self.ep,
            "job": self.job,
            "container": self.container,
            "host": self.host,
            "rail": self.rail,
            "ip": self.ip,
            "port": self.port,
            "gid": self.gid,
            "qpn": self.qpn,
            "netdev": self.netdev,
            "ready": self.ready,
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> EndpointInfo:
        """An endpoint record off the wire: every field of its type, names and addresses within
        their caps (an address or name of megabytes is refused, not stored)."""
        try:
            info = cls(
                ep=_int_field(d["ep"]),
                job=_str_field(d["job"], NAME_MAX),
                container=_str_field(d["container"], NAME_MAX),
                host=_str_field(d["host"], NAME_MAX),
                rail=_int_field(d["rail"]),
                ip=_str_field(d.get("ip", ""), 64),
                port=_int_field(d.get("port", 0)),
                gid=_str_field(d.get("gid", ""), 64),
                qpn=_int_field(d.get("qpn", 0)),
                netdev=_str_field(d.get("netdev", ""), 64),
                ready=bool(d.get("ready", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed endpoint record: {exc!r}"[:300]) from None
        if (
            not 0 <= info.ep < 2**32
            or not 0 <= info.port < 65536
            or not 0 <= info.rail < 256
            or not 0 <= info.qpn < 2**24
        ):
            raise ProtocolError(
                f"endpoint record out of range: ep={info.ep} rail={info.rail} port={info.port} "
                f"qpn={info.qpn}"
            )
        return info


def _int_field(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{type(v).__name__} is not an int")
    return v


def _str_field(v: Any, cap: int) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{type(v).__name__} is not a str")
    if len(v) > cap:
        raise ValueError(f"a field of {len(v)} characters (at most {cap})")
    return v


def page_records(records: Any) -> list[dict[str, Any]]:
    """A snapshot page's endpoint records (:func:`skh.wire.encode_records`) as wire maps, the
    form :meth:`EndpointInfo.from_wire` checks; the page's layout is checked first."""
    fixed, text = decode_records(records)
    ep, rail, port, qpn = (fixed[f].tolist() for f in ("ep", "rail", "port", "qpn"))
    ready = (fixed["ready"] != 0).tolist()
    return [
        {"ep": ep[k], "rail": rail[k], "port": port[k], "qpn": qpn[k], "ready": ready[k]}
        | {f: text[f][k] for f in _TEXT}
        for k in range(fixed.size)
    ]


def merge_snapshot_pages(pages: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One JOB_SNAPSHOT body from its pages, their records as wire maps under ``endpoints``
    (each page carries the job's version and skeleton; a change between pages means the copy
    is stale: ProtocolError, ask again)."""
    first = pages[0]
    for p in pages[1:]:
        if (p["job"], p["version"]) != (first["job"], first["version"]):
            raise ProtocolError(f"job {first['job']} changed while its snapshot was paged")
    head = {k: v for k, v in first.items() if k != "records"}
    return {
        **head,
        "endpoints": [e for p in pages for e in page_records(p["records"])],
        "next": None,
    }


class JobPingLists:
    """The endpoints of one job, their readiness, the optional skeleton and the list version."""

    def __init__(self, job: str, *, version: int = 0) -> None:
        self.job = job
        self.version = version
        self.endpoints: dict[int, EndpointInfo] = {}
        self.skeleton: np.ndarray | None = None  # (n, 2) uint32 (src, dst)
        self.skeleton_version = 0
        #: the controller's probe policy (:class:`skh.probeplan.ProbePolicy`, wire form) and the
        #: skeleton's probe plan (:meth:`skh.probeplan.ProbePlan.to_wire`, rows of ``skeleton``)
        self.probing: dict[str, Any] | None = None
        self.plan: dict[str, Any] | None = None
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
        job's endpoints are accepted; a skeleton version must grow. The old skeleton's probe plan
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
    @classmethod
    def from_snapshot(cls, body: Mapping[str, Any]) -> JobPingLists:
        """A copy built from a snapshot: one page's body, or pages merged
        (:func:`merge_snapshot_pages`)."""
        if "records" in body:
            body = merge_snapshot_pages([body])
        out = cls(str(body["job"]), version=int(body["version"]))
        for d in body["endpoints"]:
            if not isinstance(d, Mapping):
                raise ProtocolError("snapshot endpoint is not a map")
            info = EndpointInfo.from_wire(d)
            out.store(info)
        if body.get("skeleton") is not None:
            out.skeleton = unpack_pairs(body["skeleton"])
        out.skeleton_version = int(body.get("skeleton_version", 0))
        out.probing = body.get("probing")
        out.plan = body.get("plan")
        return out

    def apply(self, mtype: MsgType, body: Mapping[str, Any]) -> bool:
        """Apply a published change. Returns False when a version gap means this copy missed a
        message and needs a snapshot; stale (already applied) messages are ignored."""
        version = int(body["version"])
        if version <= self.version:
            return True
        if version != self.version + 1:
            return False
        if mtype is MsgType.READY_ANNOUNCE:
            for d in body["endpoints"]:
                if not isinstance(d, Mapping):
                    raise ProtocolError("announced endpoint is not a map")
                info = EndpointInfo.from_wire(d)
                self.store(info.with_ready(True))
        elif mtype is MsgType.ENDPOINTS_DOWN:
            for ep in body["endpoints"]:
                if isinstance(ep, int) and ep in self.endpoints:
                    self.store(self.endpoints[ep].with_ready(False))
        elif mtype is MsgType.SKELETON:
            self.skeleton = unpack_pairs(body["pairs"])
            self.skeleton_version = int(body["skeleton_version"])
            self.plan = body.get("plan")
            self.probing = body.get("probing", self.probing)
        else:
            raise ProtocolError(f"{mtype.value} does not change a ping list")
        self.version = version
        self._arrays = None
        return True

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

    def active_pairs(self) -> np.ndarray:
        """The pairs probed now: the skeleton (or the preload list) restricted to ready
        destinations, sorted by (src, dst)."""
        ep, rail, host, ready = self._cols()
        pairs = self.skeleton if self.skeleton is not None else same_rail_pairs(ep, rail, host)
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
            dst = self.skeleton[self.skeleton[:, 0] == src, 1]
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
        active = int(np.isin(self.skeleton[:, 1], ep[ready]).sum())
        return {"preload": preload, "pairs": int(self.skeleton.shape[0]), "active": active}

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
