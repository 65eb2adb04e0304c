"""The typed cluster model: fabric (hosts, RNICs, rails, ToRs, spines, cores) and jobs
(containers, VFs, endpoints).

One model serves the simulator, the namespace testbed and a real deployment: each of them
produces a :class:`Fabric` (from parameters, from a TOML fabric file, or from a real topology)
and a :class:`Cluster` filled with what agents register. Algorithms take these objects, or the
integer endpoint ids and numpy arrays derived from them, and never care where they came from.

Identities: an endpoint is one (container, VF) pair, named ``job/container/rail`` and numbered
with a dense ``ep_id`` (``uint32``) so bulk data can be columnar.
"""

from __future__ import annotations

import csv
import itertools
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from skh.errors import TopologyError

__all__ = [
    "Rnic",
    "Host",
    "Switch",
    "Fabric",
    "JobShape",
    "Container",
    "Endpoint",
    "Job",
    "Cluster",
    "same_rail_pairs",
    "same_rail_pair_count",
]

Tier = Literal["tor", "spine", "core"]


@dataclass(frozen=True, slots=True)
class Rnic:
    """A physical RDMA NIC; RNIC *i* of every host is on rail *i*."""

    host: str
    rail: int
    tor: str
    name: str = ""  # verbs device name, e.g. mlx5_3
    netdev: str = ""  # PF netdev
    ip: str = ""  # underlay address

    @property
    def key(self) -> str:
        return f"{self.host}:rnic{self.rail}"


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    segment: int
    rnics: tuple[Rnic, ...]

    def rnic(self, rail: int) -> Rnic:
        for r in self.rnics:
            if r.rail == rail:
                return r
        raise TopologyError(f"host {self.name} has no RNIC on rail {rail}")


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    tier: Tier
    uplinks: tuple[str, ...] = ()
    rail: int = -1  # ToRs only
    segment: int = -1  # ToRs only


def _link(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass(slots=True)
class Fabric:
    """A rail-optimized Clos: hosts' RNICs → rail ToRs → spines → cores.

    ``links`` holds every physical link as a sorted name pair. An RNIC's access link is
    ``(rnic.key, rnic.tor)``.
    """

    hosts: dict[str, Host]
    switches: dict[str, Switch]
    links: set[tuple[str, str]] = field(default_factory=set)
    _down: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.validate()
        down: dict[str, list[str]] = {}
        for sw in self.switches.values():
            for up in sw.uplinks:
                self.links.add(_link(sw.name, up))
                down.setdefault(up, []).append(sw.name)
        for host in self.hosts.values():
            for r in host.rnics:
                self.links.add(_link(r.key, r.tor))
        self._down = {k: tuple(v) for k, v in down.items()}

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_params(
        cls,
        *,
        hosts: int,
        rnics_per_host: int = 8,
        hosts_per_segment: int = 16,
        spines: int = 4,
        cores: int = 1,
    ) -> Fabric:
        """Build a rail-optimized Clos: one ToR per (segment, rail), every ToR up to every spine,
        every spine up to every core."""
        for name, v, lo in (
            ("hosts", hosts, 1),
            ("rnics_per_host", rnics_per_host, 1),
            ("hosts_per_segment", hosts_per_segment, 1),
            ("spines", spines, 1),
            ("cores", cores, 0),
        ):
            if not isinstance(v, int) or v < lo:
                raise TopologyError(
                    f"The '{name}' parameter of Fabric must be an int >= {lo}. Got {v!r}."
                )
        core_names = tuple(f"core{c}" for c in range(cores))
        switches: dict[str, Switch] = {c: Switch(c, "core") for c in core_names}
        for s in range(spines):
            switches[f"spine{s}"] = Switch(f"spine{s}", "spine", core_names)
        spine_names = tuple(f"spine{s}" for s in range(spines))
        host_map: dict[str, Host] = {}
        for h in range(hosts):
            seg = h // hosts_per_segment
            rnics = []
            for r in range(rnics_per_host):
                tor = f"tor{seg}r{r}"
                if tor not in switches:
                    switches[tor] = Switch(tor, "tor", spine_names, rail=r, segment=seg)
                rnics.append(Rnic(f"host{h}", r, tor, name=f"mlx5_{r}", netdev=f"eth{r}"))
            host_map[f"host{h}"] = Host(f"host{h}", seg, tuple(rnics))
        return cls(host_map, switches)

    @classmethod
    def from_lingjun(
        cls,
        csv_path: str | Path,
        *,
        scale_to_hosts: int | None = None,
        rnics_per_host: int = 8,
    ) -> Fabric:
        """Build the fabric of the Alibaba Lingjun 2023 topology (``topo.csv``: ``ip,DSW,PSW,ASW``).

        Each ASW is read as one host *segment* (a ToR group): the host's RNIC *r* is cabled to
        rail ToR ``<ASW>r<r>`` of its segment. Every rail ToR of a segment goes up to each PSW
        (spine tier) that the segment's rows name, and every PSW up to the DSW (core tier). So
        the real file gives 847 hosts, 48 segments (× ``rnics_per_host`` rail ToRs), 3 spines and
        1 core.

        ``scale_to_hosts`` replicates the whole pod (ToRs and PSWs, renamed ``p<k>-...``) under the
        one shared DSW until there are that many hosts, then keeps exactly that many; copy 0
        keeps the file's names. Host names are ``p<k>-<first 12 hex of the hashed ip>``.
        """
        if not isinstance(rnics_per_host, int) or rnics_per_host < 1:
            raise TopologyError(
                "The 'rnics_per_host' parameter of Fabric.from_lingjun must be an int >= 1."
                f" Got {rnics_per_host!r}."
            )
        if scale_to_hosts is not None and (
            not isinstance(scale_to_hosts, int) or scale_to_hosts < 1
        ):
            raise TopologyError(
                "The 'scale_to_hosts' parameter of Fabric.from_lingjun must be None or an int >= 1."
                f" Got {scale_to_hosts!r}."
            )
        try:
            with open(csv_path, newline="") as fh:
                rows = [(r["ip"], r["DSW"], r["PSW"], r["ASW"]) for r in csv.DictReader(fh)]
        except (OSError, KeyError, csv.Error) as exc:
            raise TopologyError(f"cannot read Lingjun topology {csv_path}: {exc!r}") from exc
        if not rows:
            raise TopologyError(f"Lingjun topology {csv_path} has no hosts")
        asws = sorted({r[3] for r in rows}, key=lambda a: (len(a), a))
        seg_of = {a: i for i, a in enumerate(asws)}
        psws_of: dict[str, set[str]] = {}
        dsws_of: dict[str, set[str]] = {}
        for _, dsw, psw, asw in rows:
            psws_of.setdefault(asw, set()).add(psw)
            dsws_of.setdefault(psw, set()).add(dsw)
        target = len(rows) if scale_to_hosts is None else scale_to_hosts
        copies = -(-target // len(rows))
        switches: dict[str, Switch] = {d: Switch(d, "core") for ds in dsws_of.values() for d in ds}
        host_map: dict[str, Host] = {}
        for k in range(copies):
            pre = "" if k == 0 else f"p{k}-"
            for psw, dsws in dsws_of.items():
                switches[pre + psw] = Switch(pre + psw, "spine", tuple(sorted(dsws)))
            for ip, _, _, asw in rows:
                if len(host_map) == target:
                    break
                seg = k * len(asws) + seg_of[asw]
                ups = tuple(pre + p for p in sorted(psws_of[asw]))
                name = f"p{k}-{ip[:12]}"
                if name in host_map:
                    raise TopologyError(
                        f"Lingjun topology {csv_path}: duplicate host ip prefix {ip[:12]!r}"
                    )
                rnics = []
                for r in range(rnics_per_host):
                    tor = f"{pre}{asw}r{r}"
                    if tor not in switches:
                        switches[tor] = Switch(tor, "tor", ups, rail=r, segment=seg)
                    rnics.append(Rnic(name, r, tor, name=f"mlx5_{r}", netdev=f"eth{r}"))
                host_map[name] = Host(name, seg, tuple(rnics))
        return cls(host_map, switches)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Fabric:
        """Build from the TOML fabric-file structure (see :meth:`from_toml`)."""
        try:
            switches = {
                s["name"]: Switch(
                    s["name"],
                    s["tier"],
                    tuple(s.get("uplinks", ())),
                    int(s.get("rail", -1)),
                    int(s.get("segment", -1)),
                )
                for s in data.get("switch", ())
            }
            hosts = {}
            for h in data.get("host", ()):
                rnics = tuple(
                    Rnic(
                        h["name"],
                        int(r["rail"]),
                        r["tor"],
                        r.get("name", ""),
                        r.get("netdev", ""),
                        r.get("ip", ""),
                    )
                    for r in h.get("rnics", ())
                )
                hosts[h["name"]] = Host(h["name"], int(h.get("segment", 0)), rnics)
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyError(f"malformed fabric description: {exc!r}") from exc
        return cls(hosts, switches)

    @classmethod
    def from_toml(cls, path: str | Path) -> Fabric:
        """Load a fabric file::

        [[switch]]
        name = "spine0"
        tier = "spine"            # tor | spine | core
        uplinks = ["core0"]

        [[switch]]
        name = "tor0r0"
        tier = "tor"
        rail = 0
        segment = 0
        uplinks = ["spine0", "spine1"]

        [[host]]
        name = "gpu-001"
        segment = 0
        rnics = [{rail = 0, tor = "tor0r0", name = "mlx5_0", netdev = "eth2", ip = "10.0.0.1"}]
        """
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TopologyError(f"cannot read fabric file {path}: {exc}") from exc
        return cls.from_mapping(data)

    def to_mapping(self) -> dict[str, Any]:
        """The inverse of :meth:`from_mapping`."""
        return {
            "switch": [
                {
                    "name": s.name,
                    "tier": s.tier,
                    "uplinks": list(s.uplinks),
                    "rail": s.rail,
                    "segment": s.segment,
                }
                for s in self.switches.values()
            ],
            "host": [
                {
                    "name": h.name,
                    "segment": h.segment,
                    "rnics": [
                        {
                            "rail": r.rail,
                            "tor": r.tor,
                            "name": r.name,
                            "netdev": r.netdev,
                            "ip": r.ip,
                        }
                        for r in h.rnics
                    ],
                }
                for h in self.hosts.values()
            ],
        }

    def validate(self) -> None:
        for sw in self.switches.values():
            if sw.tier not in ("tor", "spine", "core"):
                raise TopologyError(f"switch {sw.name}: unknown tier {sw.tier!r}")
            for up in sw.uplinks:
                if up not in self.switches:
                    raise TopologyError(f"switch {sw.name}: uplink {up!r} is not a switch")
        for host in self.hosts.values():
            rails = [r.rail for r in host.rnics]
            if len(set(rails)) != len(rails):
                raise TopologyError(f"host {host.name}: two RNICs on one rail")
            for r in host.rnics:
                tor = self.switches.get(r.tor)
                if tor is None or tor.tier != "tor":
                    raise TopologyError(f"host {host.name} rail {r.rail}: {r.tor!r} is not a ToR")

    # -- paths --------------------------------------------------------------------------------
    def _ancestors(self, name: str) -> dict[str, tuple[str, ...]]:
        """Every switch reachable upward from ``name``, with one upward path to it per branch."""
        out: dict[str, list[tuple[str, ...]]] = {name: [(name,)]}
        frontier = [name]
        while frontier:
            nxt = []
            for node in frontier:
                for up in self.switches[node].uplinks:
                    for p in out[node]:
                        out.setdefault(up, []).append(p + (up,))
                    nxt.append(up)
            frontier = list(dict.fromkeys(nxt))
        return out  # type: ignore[return-value]

    def switch_paths(self, src_tor: str, dst_tor: str) -> list[tuple[str, ...]]:
        """All shortest up-down (valley-free) switch paths from one ToR to another: the ECMP set."""
        if src_tor == dst_tor:
            return [(src_tor,)]
        up_a, up_b = self._ancestors(src_tor), self._ancestors(dst_tor)
        common = set(up_a) & set(up_b)
        if not common:
            raise TopologyError(f"no path between {src_tor} and {dst_tor}")
        best = min(len(up_a[c][0]) + len(up_b[c][0]) for c in common)
        paths = []
        for c in sorted(common):
            for pa in up_a[c]:
                for pb in up_b[c]:
                    if len(pa) + len(pb) == best:
                        paths.append(pa + tuple(reversed(pb[:-1])))
        return paths

    def ecmp_paths(self, src: Rnic, dst: Rnic) -> list[tuple[str, ...]]:
        """Node sequences RNIC → switches → RNIC for every equal-cost path."""
        return [(src.key, *p, dst.key) for p in self.switch_paths(src.tor, dst.tor)]

    def tor_pods(self) -> dict[str, int]:
        """Each ToR's pod: ToRs joined through a shared spine, numbered in ToR name order. Pairs
        within a pod cross a spine, pairs between pods a core too: two links more each way."""
        pod = {t: t for t in sorted(n for n, sw in self.switches.items() if sw.tier == "tor")}

        def root(t: str) -> str:
            while pod[t] != t:
                pod[t] = pod[pod[t]]
                t = pod[t]
            return t

        for name, sw in self.switches.items():
            if sw.tier != "spine":
                continue
            tors = [t for t in self._down.get(name, ()) if t in pod]
            for t in tors[1:]:
                a, b = root(tors[0]), root(t)
                if a != b:
                    pod[max(a, b)] = min(a, b)
        ids: dict[str, int] = {}
        return {t: ids.setdefault(root(t), len(ids)) for t in pod}

    @staticmethod
    def path_links(path: Iterable[str]) -> list[tuple[str, str]]:
        nodes = list(path)
        return [_link(a, b) for a, b in itertools.pairwise(nodes)]

    def rnic(self, host: str, rail: int) -> Rnic:
        try:
            return self.hosts[host].rnic(rail)
        except KeyError as exc:
            raise TopologyError(f"unknown host {host!r}") from exc

    @property
    def rails(self) -> int:
        return 1 + max((r.rail for h in self.hosts.values() for r in h.rnics), default=-1)


# ---------------------------------------------------------------------------------------------
# Jobs, containers, endpoints


@dataclass(frozen=True, slots=True)
class JobShape:
    """Parallelism degrees. TP stays inside a host (NVLink); EP > 1 means all-to-all traffic."""

    tp: int = 8
    pp: int = 1
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for n in ("tp", "pp", "dp", "ep"):
            v = getattr(self, n)
            if not isinstance(v, int) or v < 1:
                raise TopologyError(
                    f"The '{n}' parameter of JobShape must be an int >= 1. Got {v!r}."
                )

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    job: str
    host: str
    rails: tuple[int, ...]  # the rails whose VF this container binds


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One (container, VF) pair: the unit that probes and is probed."""

    ep_id: int
    job: str
    container: str
    host: str
    rail: int
    ip: str = ""
    gid: str = ""
    qpn: int = 0
    port: int = 0
    netdev: str = ""

    @property
    def name(self) -> str:
        return f"{self.job}/{self.container}/{self.rail}"


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    shape: JobShape
    containers: tuple[Container, ...]


class Cluster:
    """A fabric plus the jobs and endpoints living on it. An endpoint's id is its index in
    :attr:`endpoints`, kept while it lives: one that leaves is released (:meth:`release`: marked
    gone, its name free for a new registration), and its id names no other endpoint unless the
    owner gives it again explicitly (:meth:`add_endpoint`), once no state it keeps names it."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.jobs: dict[str, Job] = {}
        self.endpoints: list[Endpoint] = []
        #: ids of endpoints that left (and of ids skipped: see :meth:`add_endpoint`)
        self.gone: set[int] = set()
        #: moves on whenever an id leaves or is given again (indexes over ids rebuild then)
        self.generation = 0
        self._by_name: dict[str, int] = {}

    def add_job(self, job: Job) -> list[Endpoint]:
        if job.name in self.jobs:
            raise TopologyError(f"job {job.name!r} already exists")
        for c in job.containers:
            if c.host not in self.fabric.hosts:
                raise TopologyError(f"container {c.name}: unknown host {c.host!r}")
        self.jobs[job.name] = job
        added = []
        for c in job.containers:
            for rail in c.rails:
                added.append(
                    self.add_endpoint(job=job.name, container=c.name, host=c.host, rail=rail)
                )
        return added

    def add_endpoint(self, *, ep_id: int | None = None, **fields: Any) -> Endpoint:
        """Register an endpoint under the next id, or under ``ep_id``: a gone id given again
        (the caller knows nothing it keeps names it any more), or one past the end (another
        model's numbering, which this one follows: the ids skipped are gone)."""
        n = len(self.endpoints)
        ep_id = n if ep_id is None else int(ep_id)
        if ep_id < n and ep_id not in self.gone:
            raise TopologyError(f"endpoint id {ep_id} is taken by {self.endpoints[ep_id].name}")
        ep = Endpoint(ep_id=ep_id, **fields)
        if ep.name in self._by_name:
            raise TopologyError(f"endpoint {ep.name} already registered")
        if ep_id < n:
            self.endpoints[ep_id] = ep
            self.gone.discard(ep_id)
            self.generation += 1
        else:
            for skipped in range(n, ep_id):
                self.endpoints.append(Endpoint(skipped, job="", container="", host="", rail=-1))
                self.gone.add(skipped)
            self.endpoints.append(ep)
        self._by_name[ep.name] = ep.ep_id
        return ep

    def release(self, ep_id: int) -> None:
        """Endpoint ``ep_id`` left: it is gone, its name free for a new registration."""
        ep = self.endpoints[ep_id]
        if self._by_name.get(ep.name) == ep_id:
            del self._by_name[ep.name]
        self.gone.add(ep_id)
        self.generation += 1

    @property
    def live_endpoints(self) -> list[Endpoint]:
        """The endpoints that have not left, by id."""
        if not self.gone:
            return self.endpoints
        return [e for e in self.endpoints if e.ep_id not in self.gone]

    def endpoint(self, name: str) -> Endpoint:
        return self.endpoints[self._by_name[name]]

    def job_endpoints(self, job: str) -> list[Endpoint]:
        return [e for e in self.live_endpoints if e.job == job]

    def endpoint_arrays(self, eps: Iterable[Endpoint] | None = None) -> dict[str, np.ndarray]:
        """Columnar view: ep_id, rail, host index (dense), for vectorised algorithms (default:
        the live endpoints)."""
        eps = list(self.live_endpoints if eps is None else eps)
        hosts = {h: i for i, h in enumerate(self.fabric.hosts)}
        return {
            "ep_id": np.fromiter((e.ep_id for e in eps), np.uint32, len(eps)),
            "rail": np.fromiter((e.rail for e in eps), np.int32, len(eps)),
            "host": np.fromiter((hosts[e.host] for e in eps), np.int32, len(eps)),
        }


def same_rail_pairs(ep_id: np.ndarray, rail: np.ndarray, host: np.ndarray) -> np.ndarray:
    """All ordered (src, dst) endpoint pairs on the same rail and different hosts.

    The paper's preload list. Returns an ``(n, 2)`` uint32 array sorted by (src, dst).
    Same-host pairs are never listed: their traffic stays on NVLink/PCIe.
    """
    ep_id = np.asarray(ep_id, np.uint32)
    rail = np.asarray(rail)
    host = np.asarray(host)
    out = []
    for r in np.unique(rail):
        idx = np.flatnonzero(rail == r)
        if idx.size < 2:
            continue
        a, b = np.meshgrid(idx, idx, indexing="ij")
        keep = host[a] != host[b]
        out.append(np.stack([ep_id[a[keep]], ep_id[b[keep]]], axis=1))
    if not out:
        return np.zeros((0, 2), np.uint32)
    pairs = np.concatenate(out)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def same_rail_pair_count(
    rail: np.ndarray, host: np.ndarray, dst_ok: np.ndarray | None = None
) -> int:
    """How many pairs :func:`same_rail_pairs` lists, without listing them: per rail, every
    source times every destination less those on the source's own host. ``dst_ok`` (a mask
    over the endpoints) counts only pairs whose destination it holds (ready ones, say).

    O(n log n) in the endpoints; the list itself is O(n²/rails) (32 M pairs, 1.2 GB, for a job
    of 2,000 hosts x 8 RNICs)."""
    rail = np.asarray(rail, np.int64)
    host = np.asarray(host, np.int64)
    ok = np.ones(rail.size, bool) if dst_ok is None else np.asarray(dst_ok, bool)
    if rail.shape != host.shape or ok.shape != rail.shape:
        raise TopologyError(
            "same_rail_pair_count needs rail, host and dst_ok of one length. Got "
            f"{rail.shape}, {host.shape} and {ok.shape} instead."
        )
    if rail.size == 0:
        return 0
    _, r = np.unique(rail, return_inverse=True)
    _, h = np.unique(host, return_inverse=True)
    _, rh = np.unique(r.ravel() * (int(h.max()) + 1) + h.ravel(), return_inverse=True)
    r, rh = r.ravel(), rh.ravel()
    src = np.bincount(r)
    dst = np.bincount(r, weights=ok)
    src_h = np.bincount(rh)
    dst_h = np.bincount(rh, weights=ok)
    return int(round(float(src @ dst - src_h @ dst_h)))
