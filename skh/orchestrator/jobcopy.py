"""A job's ping lists as an overlay agent holds them: built from the controller's snapshot,
kept current from its topic, read without numpy (the agent must not load it: ~13 MB of each
sidecar's memory). :class:`skh.orchestrator.pinglist.JobPingLists`, the controller's side,
extends it with the columns and queries a controller needs.

An agent's copy keeps the skeleton as the wire's packed pairs, split into two compact uint32
arrays (sources sorted), so a job of 30,000 skeleton pairs costs it 240 KB, not a tuple per pair.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from skh.errors import ProtocolError
from skh.wire import ENDPOINT_TEXT, NAME_MAX, MsgType, decode_record_columns

__all__ = ["EndpointInfo", "JobCopy", "merge_snapshot_pages", "page_records"]

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
    fixed, text = decode_record_columns(records)
    ep, rail, port, qpn = (fixed[f] for f in ("ep", "rail", "port", "qpn"))
    ready = [r != 0 for r in fixed["ready"]]
    return [
        {"ep": ep[k], "rail": rail[k], "port": port[k], "qpn": qpn[k], "ready": ready[k]}
        | {f: text[f][k] for f in _TEXT}
        for k in range(len(ep))
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


class JobCopy:
    """The endpoints of one job, their readiness, the optional skeleton, the probe policy and
    plan handed out with them, and the list version: an agent's copy."""

    def __init__(self, job: str, *, version: int = 0) -> None:
        self.job = job
        self.version = version
        self.endpoints: dict[int, EndpointInfo] = {}
        self.skeleton_version = 0
        #: the controller's probe policy (:class:`skh.policy.ProbePolicy`, wire form) and the
        #: skeleton's probe plan (:meth:`skh.probeplan.ProbePlan.to_wire`, rows of the skeleton)
        self.probing: dict[str, Any] | None = None
        self.plan: dict[str, Any] | None = None
        #: the skeleton's pairs, sorted by source (None: no skeleton, the preload list)
        self.skeleton_pairs: tuple[array, array] | None = None
        #: the endpoints some skeleton pair names (see :meth:`destinations`)
        self._named: frozenset[int] = frozenset()

    def store(self, info: EndpointInfo) -> None:
        """Put one endpoint record."""
        self.endpoints[info.ep] = info

    def _set_skeleton(self, raw: bytes | None) -> None:
        """Take the skeleton's pairs as the wire packs them (:func:`skh.wire.pack_pairs`)."""
        if raw is None:
            self.skeleton_pairs, self._named = None, frozenset()
            return
        if len(raw) % 8:
            raise ProtocolError(f"pairs: {len(raw)} bytes is not a multiple of 8")
        flat = array("I")
        if flat.itemsize != 4:  # pragma: no cover - every Linux ABI skh runs on
            raise RuntimeError("array('I') is not 32 bits here")
        flat.frombytes(raw)
        if sys.byteorder == "big":  # pragma: no cover
            flat.byteswap()
        src, dst = flat[0::2], flat[1::2]
        if any(a > b for a, b in zip(src, src[1:], strict=False)):  # a controller sends them sorted
            pairs = sorted(zip(src, dst, strict=True))
            src, dst = array("I", (p[0] for p in pairs)), array("I", (p[1] for p in pairs))
        self.skeleton_pairs = (src, dst)
        self._named = frozenset(src) | frozenset(dst)

    @classmethod
    def from_snapshot(cls, body: Mapping[str, Any]) -> Any:
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
        out._set_skeleton(body.get("skeleton"))
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
            self._set_skeleton(body["pairs"])
            self.skeleton_version = int(body["skeleton_version"])
            self.plan = body.get("plan")
            self.probing = body.get("probing", self.probing)
        else:
            raise ProtocolError(f"{mtype.value} does not change a ping list")
        self.version = version
        return True

    def destinations(self, src: int) -> list[int]:
        """The ready destinations ``src`` probes now, sorted: its skeleton pairs', or without a
        skeleton every same-rail endpoint on another host (the preload list).

        An endpoint no skeleton pair names joined after the skeleton was inferred (an elastic
        job grew, a container came back under a new id): it keeps its preload pairs, both
        ways, until a skeleton names it — added first, dropped after, never unprobed while
        the job is re-inferred (:meth:`JobPingLists.newcomer_pairs` on the controller)."""
        eps = self.endpoints
        out: set[int] = set()
        candidates: Iterable[int] = eps
        if self.skeleton_pairs is not None:
            s, d = self.skeleton_pairs
            lo, hi = bisect_left(s, src), bisect_right(s, src)
            out = {x for x in d[lo:hi] if x in eps and eps[x].ready}
            fresh = eps.keys() - self._named
            candidates = eps if src in fresh else fresh
        me = eps.get(src)
        if me is not None:
            out.update(
                ep
                for ep in candidates
                if eps[ep].ready and eps[ep].rail == me.rail and eps[ep].host != me.host
            )
        return sorted(out)
