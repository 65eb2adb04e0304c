"""The analyzer's brain: what runs once per analyzer round.

``counters → skeleton inference per job → apply_skeleton on the controller`` and
``probe batches → Detector → each SuspectEvent → localization → verdict → alert``.

* **Skeleton.** Per endpoint, the 1 Hz byte counters (tx + rx of its VF's host-side device) are
  kept for ``history_s``; every ``skeleton_every_s`` each job whose endpoints all have
  ``skeleton.min_duration_s`` of samples is inferred (:func:`skh.analysis.skeleton.infer_skeleton`)
  and, when the list changed (:meth:`Skeleton.replaces`), submitted to the controller with the next
  skeleton version; the controller replaces the preload list and agents add before they drop, so
  no pair kept across the change is left unprobed.
* **Detection** is the streaming :class:`~skh.analysis.detect.Detector`.
* **Localization** asks the controller to relay commands to the host (underlay) agents: a
  flow-pinned traceroute between the two RNICs of a pair, the host's overlay forwarding state,
  a host report (RNIC link states) and, last and rate-limited, the RNIC flow tables.
* **Alerts** are deduplicated by (layer, component, failure type) while the fault lasts (an open
  alert is re-confirmed every round while detection still holds one of its pairs or endpoints
  active; an event whose pairs an open alert already holds confirms it instead of being localized
  again), and resolved ``resolve_after_s`` after the last confirmation. Every alert on the bus
  carries ``kind`` (``fault`` or ``skeleton``) and, for faults, ``state`` (``open``/``resolved``).

:class:`Pipeline` is synchronous (the simulator drives it in virtual time); :class:`PipelineHook`
runs it on a worker thread behind the analyzer daemon's round hook, so traceroutes that take
seconds never stall ingest. ``skh analyzer`` runs the daemon with this hook (its default
``detector = "pipeline"``; see :meth:`PipelineConfig.from_analyzer` for its settings).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import tomllib
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from skh.analysis.detect import Detector, DetectorConfig, SuspectEvent
from skh.analysis.fastpath import FastPathConfig
from skh.analysis.health import HealthConfig
from skh.analysis.localize import (
    AlertTracker,
    FlowRule,
    FlowTables,
    HostReport,
    Localizer,
    OverlayTables,
    StateSource,
    Suspect,
    Trace,
    Verdict,
)
from skh.analysis.longterm import LongTermConfig
from skh.analysis.skeleton import Skeleton, SkeletonParams, infer_skeleton, traffic_changed
from skh.errors import ConfigError, ProtocolError, RequestRefused, RequestTimeout
from skh.model import Cluster, Fabric
from skh.orchestrator.admin import ControllerClient
from skh.orchestrator.config import AnalyzerConfig
from skh.records import COUNTER_DTYPE, PROBE_DTYPE, pair_keys, split_pair_keys
from skh.wire import unpack_pairs

__all__ = [
    "PipelineConfig",
    "AgentStateSource",
    "CounterHistory",
    "Pipeline",
    "PipelineHook",
    "verdict_alert",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# configuration


def _sub(cls: type, where: str, data: Any) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"The '{where}' setting of the pipeline must be a table. Got {data!r} instead."
        )
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown setting(s) in pipeline '{where}': {', '.join(unknown)}")
    return cls(**data)


def detector_config(data: Mapping[str, Any] | None) -> DetectorConfig:
    """A :class:`DetectorConfig` from a plain mapping (nested ``fast``/``longterm``/``health``)."""
    data = dict(data or {})
    nested = {
        "fast": _sub(FastPathConfig, "detector.fast", data.pop("fast", None)),
        "longterm": _sub(LongTermConfig, "detector.longterm", data.pop("longterm", None)),
        "health": _sub(HealthConfig, "detector.health", data.pop("health", None)),
    }
    return (
        _sub(DetectorConfig, "detector", {**data, **nested}) if data or nested else DetectorConfig()
    )


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the pipeline knows of the cluster beyond what the controller tells it.

    ``fabric`` is the :meth:`Fabric.to_mapping` form; ``addr_owner`` maps underlay addresses
    (what a traceroute hop answers from) to fabric node names; ``host_agents`` names each host's
    underlay agent (the one that runs traceroutes and dumps there; default ``underlay-<host>``,
    the agent's default name); ``vf_devices`` maps an endpoint name (``job/container/rail``) to
    the host-side device of its VF (representor).

    ``skh analyzer`` builds it with :meth:`from_analyzer` from its ``[analyzer]`` settings.
    """

    fabric: Mapping[str, Any]
    addr_owner: Mapping[str, str] = field(default_factory=dict)
    host_agents: Mapping[str, str] = field(default_factory=dict)
    vf_devices: Mapping[str, str] = field(default_factory=dict)
    controller: str = ""
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    skeleton: SkeletonParams = field(default_factory=SkeletonParams)
    skeleton_every_s: float = 10.0
    #: how long a job's traffic must stop fitting its skeleton before it is inferred again
    skeleton_change_s: float = 120.0
    history_s: float = 300.0
    resolve_after_s: float = 30.0
    command_timeout_s: float = 10.0
    trace_max_ttl: int = 6
    trace_base_port: int = 33434
    rnic_dump_interval_s: float = 60.0
    max_exoneration_traces: int = 16

    def __post_init__(self) -> None:
        for name in (
            "skeleton_every_s",
            "skeleton_change_s",
            "history_s",
            "resolve_after_s",
            "command_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"The '{name}' setting of the pipeline must be > 0."
                    f" Got {getattr(self, name)!r} instead."
                )
        if not 1 <= self.trace_max_ttl <= 64:
            raise ConfigError(
                "The 'trace_max_ttl' setting of the pipeline must be in [1, 64]."
                f" Got {self.trace_max_ttl!r} instead."
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PipelineConfig:
        data = dict(data)
        if "fabric" not in data:
            raise ConfigError("the pipeline configuration needs 'fabric' (Fabric.to_mapping())")
        det = detector_config(data.pop("detector", None))
        skel = _sub(SkeletonParams, "skeleton", data.pop("skeleton", None))
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown pipeline setting(s): {', '.join(unknown)}")
        return cls(detector=det, skeleton=skel, **data)

    @classmethod
    def from_analyzer(cls, a: AnalyzerConfig) -> PipelineConfig:
        """The pipeline ``skh analyzer`` runs: the settings file ``a.pipeline`` (JSON or TOML; it
        may hold the fabric as a ``fabric`` table instead of ``a.fabric``), the fabric file
        ``a.fabric`` and the controller ``a.controller``."""
        data = _read_settings(a.pipeline) if a.pipeline else {}
        if "controller" in data:
            raise ConfigError(
                f"the pipeline settings file {a.pipeline} sets 'controller':"
                " set analyzer.controller instead"
            )
        if a.fabric:
            if "fabric" in data:
                raise ConfigError(f"the fabric is given twice: analyzer.fabric and in {a.pipeline}")
            data["fabric"] = Fabric.from_toml(a.fabric).to_mapping()
        if "fabric" not in data:
            raise ConfigError(
                "the analyzer's pipeline needs a fabric: set analyzer.fabric (--fabric FILE), "
                "or run detection only (analyzer.detector = 'detect')"
            )
        if not a.controller:
            raise ConfigError(
                "the analyzer's pipeline needs the controller's address (analyzer.controller)"
            )
        return cls.from_mapping({**data, "controller": a.controller})


def _read_settings(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
        data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"cannot read the pipeline settings {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"the pipeline settings {path} must be a table. Got {type(data).__name__} instead."
        )
    return data


# ---------------------------------------------------------------------------------------------
# evidence from agents


def _rule(d: Mapping[str, Any]) -> FlowRule:
    match = tuple((str(k), str(v)) for k, v in dict(d.get("match", {})).items())
    return FlowRule(match, tuple(str(a) for a in d.get("actions", ())), int(d.get("priority", 0)))


def _linux_state(result: Any) -> Any:
    """The ``overlay_state`` answer as a :class:`skh.collect.linux.LinuxState`: either the plain
    form of one (``routes``/``neighs``/``fdb`` as lists of maps) or raw ``-j`` command output."""
    from skh.collect.linux import (
        FdbEntry,
        LinuxState,
        Neigh,
        Route,
        parse_bridge_fdb,
        parse_ip_neigh,
        parse_ip_route,
    )

    if not isinstance(result, Mapping):
        return None
    if isinstance(result.get("routes"), list):
        return LinuxState(
            tuple(Route(**r) for r in result["routes"]),
            tuple(Neigh(**n) for n in result.get("neighs", ())),
            tuple(FdbEntry(**e) for e in result.get("fdb", ())),
            dict(result.get("links", {})),
            frozenset(result.get("down", ())),
        )
    fdb = tuple(parse_bridge_fdb(str(result.get("fdb", ""))))
    # without link kinds: a device holding remote FDB entries is a VXLAN device
    links = {e.dev: "vxlan" for e in fdb if e.dst}
    return LinuxState(
        tuple(parse_ip_route(str(result.get("routes", "")))),
        tuple(parse_ip_neigh(str(result.get("neigh", "")))),
        fdb,
        links,
        frozenset(),
    )


class AgentStateSource:
    """The localizer's questions answered by host agents through the controller's relay.

    Traces are taken between the two RNICs of a pair (the VXLAN underlay path) with a source port
    fixed per (pair's RNICs, path id), so all container pairs over the same RNIC pair share one
    trace. :meth:`prefetch` asks many questions at once; the localizer's later calls hit the cache.
    """

    def __init__(self, client: ControllerClient, cluster: Cluster, cfg: PipelineConfig) -> None:
        self.client = client
        self.cluster = cluster
        self.cfg = cfg
        self.calls: dict[str, int] = {}
        self._traces: dict[tuple[str, int, str, int, int], Trace | None] = {}
        self._tables: dict[str, OverlayTables | None] = {}
        self._reports: dict[str, HostReport | None] = {}
        self._flows: dict[tuple[str, int], FlowTables | None] = {}
        fab = cluster.fabric
        self._vtep_hosts = {r.ip: h.name for h in fab.hosts.values() for r in h.rnics if r.ip}

    def _agent(self, host: str) -> str | None:
        if host in self.cfg.host_agents:
            return self.cfg.host_agents[host]
        # an underlay agent's default name (AgentConfig.agent_name)
        return f"underlay-{host}" if host in self.cluster.fabric.hosts else None

    def _run(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
        for _agent, name, _args in calls:
            self.calls[name] = self.calls.get(name, 0) + 1
        return self.client.commands(calls, timeout_s=self.cfg.command_timeout_s)

    # -- traceroute ---------------------------------------------------------------------------
    def _trace_key(self, pair: tuple[int, int], path_id: int) -> tuple[str, int, str, int, int]:
        a, b = self.cluster.endpoints[pair[0]], self.cluster.endpoints[pair[1]]
        return (a.host, a.rail, b.host, b.rail, int(path_id))

    def _trace_call(
        self, key: tuple[str, int, str, int, int]
    ) -> tuple[str, str, dict[str, Any]] | None:
        sh, sr, dh, dr, path_id = key
        agent = self._agent(sh)
        fab = self.cluster.fabric
        src, dst = fab.rnic(sh, sr), fab.rnic(dh, dr)
        if agent is None or not src.ip or not dst.ip:
            return None
        # fixed per RNIC pair and path id (not per run: crc32, not the salted hash())
        sport = 40000 + (zlib.crc32(f"{sh}:{sr}>{dh}:{dr}".encode()) % 1000) * 16 + path_id % 16
        return (
            agent,
            "traceroute",
            {
                "dst": dst.ip,
                "src": src.ip,
                "sport": sport,
                "dport": self.cfg.trace_base_port,
                "max_ttl": self.cfg.trace_max_ttl,
            },
        )

    def _trace_from(self, pair: tuple[int, int], key: tuple, reply: dict[str, Any]) -> Trace | None:
        from skh.collect.traceroute import TraceHop, TraceResult, parse_paris_json, trace_nodes

        if not reply.get("ok"):
            log.debug("traceroute %s failed: %s", key, reply.get("error"))
            return None
        res = reply.get("result") or {}
        if "trace" in res:
            t = res["trace"]
            hops = tuple(
                TraceHop(
                    int(h["ttl"]),
                    h.get("addr"),
                    tuple(h.get("rtt_ms", ())),
                    str(h.get("icmp", "")),
                    int(h.get("code", -1)),
                )
                for h in t.get("hops", ())
            )
            result = TraceResult(str(t.get("dst", "")), hops, bool(t.get("reached", False)))
        else:
            result = parse_paris_json(str(res.get("raw", "")))
        src_node = self.cluster.fabric.rnic(key[0], key[1]).key
        nodes = trace_nodes(result, self.cfg.addr_owner, src_node=src_node)
        # no per-hop round trips: a hop's answer is an ICMP error its control plane builds (here
        # timed in userspace, one probe per hop), so a step between two hops is mostly that
        # noise, not forwarding delay, and the source's own "0" is no measurement at all. Given
        # to the vote, every trace showed a delay onset at its first hop: failing traces blamed
        # the first ToR and healthy ones cleared nothing past their source.
        return Trace(pair, nodes, result.reached)

    def traceroute(self, pair: tuple[int, int], path_id: int) -> Trace | None:
        key = self._trace_key(pair, path_id)
        if key not in self._traces:
            self.prefetch_traces([(pair, path_id)])
        t = self._traces.get(key)
        return None if t is None else Trace(pair, t.nodes, t.reached, t.hop_loss, t.hop_rtt_ns)

    def prefetch_traces(self, wanted: Iterable[tuple[tuple[int, int], int]]) -> None:
        todo: dict[tuple, tuple[tuple[int, int], tuple[str, str, dict[str, Any]]]] = {}
        for pair, pid in wanted:
            key = self._trace_key(pair, pid)
            if key in self._traces or key in todo:
                continue
            call = self._trace_call(key)
            if call is None:
                self._traces[key] = None
                continue
            todo[key] = (pair, call)
        if not todo:
            return
        replies = self._run([c for _p, c in todo.values()])
        for (key, (pair, _c)), reply in zip(todo.items(), replies, strict=True):
            self._traces[key] = self._trace_from(pair, key, reply)

    # -- host state ---------------------------------------------------------------------------
    def prefetch_hosts(self, hosts: Iterable[str]) -> None:
        hosts = [h for h in dict.fromkeys(hosts) if h not in self._tables and self._agent(h)]
        fab = self.cluster.fabric
        calls = []
        for h in hosts:
            rnics = {str(r.rail): r.netdev for r in fab.hosts[h].rnics if r.netdev}
            calls += [
                (self._agent(h), "overlay_state", {}),
                (self._agent(h), "host_report", {"rnics": rnics}),
            ]
        replies = self._run(calls) if calls else []
        for i, h in enumerate(hosts):
            self._tables[h] = self._tables_from(h, replies[2 * i])
            self._reports[h] = self._report_from(h, replies[2 * i + 1])

    def _tables_from(self, host: str, reply: dict[str, Any]) -> OverlayTables | None:
        from skh.collect.linux import LocalEndpoint, linux_overlay_tables

        if not reply.get("ok"):
            return None
        state = _linux_state(reply.get("result"))
        if state is None:
            return None
        local = [
            LocalEndpoint(f"{e.host}/vf:{e.container}.{e.rail}", e.ip, self.cfg.vf_devices[e.name])
            for e in self.cluster.endpoints
            if e.host == host and e.name in self.cfg.vf_devices and e.ip
        ]
        dests = [e.ip for e in self.cluster.endpoints if e.ip]
        return linux_overlay_tables(host, state, local, dests, self._vtep_hosts)

    @staticmethod
    def _report_from(host: str, reply: dict[str, Any]) -> HostReport | None:
        if not reply.get("ok") or not isinstance(reply.get("result"), Mapping):
            return None
        r = reply["result"]
        return HostReport(
            host,
            rnic_state={int(k): str(v) for k, v in dict(r.get("rnic_state", {})).items()},
            peer_down=frozenset(int(x) for x in r.get("peer_down", ())),
            agents_dead=frozenset(str(x) for x in r.get("agents_dead", ())),
            containers_dead=frozenset(str(x) for x in r.get("containers_dead", ())),
        )

    def overlay_tables(self, host: str) -> OverlayTables | None:
        if host not in self._tables:
            self.prefetch_hosts([host])
        return self._tables.get(host)

    def host_report(self, host: str) -> HostReport | None:
        if host not in self._reports:
            self.prefetch_hosts([host])
        return self._reports.get(host)

    def flow_tables(self, host: str, rail: int) -> FlowTables | None:
        key = (host, int(rail))
        if key not in self._flows:
            agent = self._agent(host)
            if agent is None:
                return None
            (reply,) = self._run([(agent, "rnic_flows", {"rail": int(rail)})])
            r = reply.get("result") if reply.get("ok") else None
            self._flows[key] = (
                None
                if not isinstance(r, Mapping)
                else FlowTables(
                    tuple(_rule(d) for d in r.get("expected", ())),
                    tuple(_rule(d) for d in r.get("offloaded", ())),
                    bool(r.get("megaflow", False)),
                )
            )
        return self._flows[key]


# ---------------------------------------------------------------------------------------------
# counters


class CounterHistory:
    """Per-endpoint cumulative byte counts over the last ``history_s``, binned into whole
    seconds for skeleton inference.

    Each sampling interval's bytes go to the second its closing sample falls in. Host agents
    sample at 1 Hz with their own phase; a burst that starts on a whole second lands in the same
    bin on every host whatever that phase (interpolating the cumulative count instead would
    smear it over two bins by a host-dependent share and blur the stage shifts inference reads).
    """

    def __init__(self, history_s: float) -> None:
        self.history_ns = int(history_s * 1e9)
        self._parts: list[np.ndarray] = []
        self._t = np.zeros(0, np.int64)
        self._ep = np.zeros(0, np.uint32)
        self._bytes = np.zeros(0, np.float64)

    def add(self, rows: np.ndarray) -> None:
        if rows.size:
            self._parts.append(np.asarray(rows, COUNTER_DTYPE))

    def _fold(self) -> None:
        if not self._parts:
            return
        rows = np.concatenate(self._parts)
        self._parts = []
        self._t = np.concatenate([self._t, rows["t_ns"]])
        self._ep = np.concatenate([self._ep, rows["ep"]])
        self._bytes = np.concatenate(
            [self._bytes, rows["tx_bytes"].astype(np.float64) + rows["rx_bytes"]]
        )
        keep = self._t >= self._t.max() - self.history_ns
        order = np.lexsort((self._t[keep], self._ep[keep]))
        self._t, self._ep, self._bytes = (
            self._t[keep][order],
            self._ep[keep][order],
            self._bytes[keep][order],
        )

    def _bins(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        m = self._ep == e
        t, b = self._t[m], self._bytes[m]
        return t[1:] // 1_000_000_000, np.maximum(np.diff(b), 0.0)

    def _range(self, eps: np.ndarray) -> tuple[int, int]:
        """The whole seconds every one of ``eps`` covers: [lo, hi)."""
        lo, hi = None, None
        for e in np.asarray(eps).tolist():
            sec, _ = self._bins(e)
            if sec.size == 0:
                return 0, 0
            lo = int(sec[0]) if lo is None else max(lo, int(sec[0]))
            hi = int(sec[-1]) + 1 if hi is None else min(hi, int(sec[-1]) + 1)
        return (lo, hi) if lo is not None and hi is not None and hi > lo else (0, 0)

    def span_s(self, eps: np.ndarray) -> float:
        """Whole seconds covered by every one of ``eps``."""
        self._fold()
        lo, hi = self._range(eps)
        return float(hi - lo)

    def rates(self, eps: np.ndarray) -> np.ndarray:
        """``(n, T)`` bytes per second of ``eps`` on the whole seconds all of them cover."""
        self._fold()
        lo, hi = self._range(eps)
        out = np.zeros((len(eps), hi - lo))
        for i, e in enumerate(np.asarray(eps).tolist()):
            sec, d = self._bins(e)
            sel = (sec >= lo) & (sec < hi)
            np.add.at(out[i], sec[sel] - lo, d[sel])
        return out


# ---------------------------------------------------------------------------------------------
# alerts


def verdict_alert(
    v: Verdict, state: str, event: SuspectEvent | None = None, *, max_pairs: int = 32
) -> dict[str, Any]:
    """The alert body of a verdict (JSON-friendly)."""
    out: dict[str, Any] = {
        "kind": "fault",
        "state": state,
        "alert_id": f"{v.layer}|{v.component}|{int(v.failure_type)}",
        "job": v.job,
        "layer": v.layer,
        "component": v.component,
        "component_kind": v.component_kind,
        "failure_type": v.failure_type.name.lower(),
        "failure_type_id": int(v.failure_type),
        "symptom": v.symptom,
        "severity": v.severity.name.lower() if state == "open" else "info",
        "pairs": [list(p) for p in v.pairs[:max_pairs]],
        "n_pairs": len(v.pairs),
        "first_seen_ns": int(v.first_seen_ns),
        "detected_at_ns": int(v.detected_at_ns),
        "evidence": dict(v.evidence),
        "candidates": list(v.candidates),
    }
    if event is not None:
        out["detection"] = {"kind": event.kind, "explanation": event.explanation}
    return out


# ---------------------------------------------------------------------------------------------
# the pipeline


@dataclass(slots=True)
class _JobState:
    ep_id: np.ndarray  # sorted
    host: np.ndarray
    rail: np.ndarray
    rank: np.ndarray
    applied_digest: str | None = None
    skeleton_version: int = 0
    skeleton: Skeleton | None = None
    changed_since_ns: int = 0


class Pipeline:
    """Synchronous: :meth:`process` one round of records; returns the alerts to publish.

    ``source_factory(cluster)`` gives the localizer's :class:`StateSource` for one round;
    ``apply_skeleton(job, skeleton, version)`` installs a skeleton (the controller, or the
    simulator's ping list) and returns whether it was accepted.
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        source_factory: Callable[[Cluster], StateSource],
        apply_skeleton: Callable[[str, Skeleton, int], bool],
        overlay_endpoint: Callable[..., tuple[str, str]] | None = None,
        overlay_component: Callable[[str], str | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.fabric = Fabric.from_mapping(cfg.fabric)
        self.detector = Detector(cfg.detector)
        self.counters = CounterHistory(cfg.history_s)
        self.tracker = AlertTracker(resolve_after_s=cfg.resolve_after_s)
        self.source_factory = source_factory
        self.apply_skeleton = apply_skeleton
        self._overlay_kw: dict[str, Any] = {}
        if overlay_endpoint is not None:
            self._overlay_kw["overlay_endpoint"] = overlay_endpoint
        if overlay_component is not None:
            self._overlay_kw["overlay_component"] = overlay_component
        self.cluster: Cluster | None = None
        self.localizer: Localizer | None = None
        self.jobs: dict[str, _JobState] = {}
        self._members_sig: tuple = ()
        self._recent: list[tuple[int, np.ndarray]] = []
        self._next_skeleton_ns = 0
        #: alert id -> (pairs, endpoints) detection must still hold for the alert to stay open
        self._watch: dict[tuple[str, str, int], tuple[set[tuple[int, int]], set[int]]] = {}
        self._events: dict[tuple[str, str, int], SuspectEvent] = {}
        self.stats: dict[str, int] = {
            "rounds": 0,
            "events": 0,
            "events_explained": 0,
            "verdicts": 0,
            "skeletons": 0,
        }

    # -- the model ----------------------------------------------------------------------------
    def set_endpoints(self, members: Iterable[Mapping[str, Any]]) -> bool:
        """Adopt the endpoints the controller knows (``ep, job, container, host, rail, ip``).
        Endpoint ids must be dense from 0 (the localizer's model indexes by id)."""
        rows = sorted(members, key=lambda m: int(m["ep"]))
        if not rows or [int(m["ep"]) for m in rows] != list(range(len(rows))):
            log.warning(
                "endpoint ids are not dense from 0: localization waits for a complete registry"
            )
            return False
        sig = tuple(
            (int(m["ep"]), str(m["host"]), int(m["rail"]), str(m.get("ip", ""))) for m in rows
        )
        if sig == self._members_sig:
            return True
        self._members_sig = sig
        cluster = Cluster(self.fabric)
        for m in rows:
            cluster.add_endpoint(
                job=str(m["job"]),
                container=str(m["container"]),
                host=str(m["host"]),
                rail=int(m["rail"]),
                ip=str(m.get("ip", "")),
                netdev=str(m.get("netdev", "")),
            )
        self.cluster = cluster
        self.localizer = Localizer(
            cluster,
            rnic_dump_interval_s=self.cfg.rnic_dump_interval_s,
            max_exoneration_traces=self.cfg.max_exoneration_traces,
            **self._overlay_kw,
        )
        hosts = {h: i for i, h in enumerate(self.fabric.hosts)}
        by_job: dict[str, list[Any]] = {}
        for e in cluster.endpoints:
            by_job.setdefault(e.job, []).append(e)
        for job, eps in by_job.items():
            first: dict[str, int] = {}
            for e in eps:
                first.setdefault(e.container, e.ep_id)
            rank_of = {c: i for i, c in enumerate(sorted(first, key=first.__getitem__))}
            old = self.jobs.get(job)
            self.jobs[job] = _JobState(
                np.array([e.ep_id for e in eps], np.uint32),
                np.array([hosts[e.host] for e in eps], np.int64),
                np.array([e.rail for e in eps], np.int64),
                np.array([rank_of[e.container] for e in eps], np.int64),
                old.applied_digest if old else None,
                old.skeleton_version if old else 0,
                old.skeleton if old else None,
            )
        return True

    # -- one round ----------------------------------------------------------------------------
    def process(
        self,
        probes: np.ndarray,
        counters: np.ndarray,
        now_ns: int,
        heartbeats: np.ndarray | None = None,
    ) -> list[dict[str, Any]]:
        """One round. ``heartbeats``: endpoint ids whose agents reported in this round (the
        simulator's; the daemon's hook passes the analyzer's through
        :meth:`PipelineHook.on_heartbeat`)."""
        self.stats["rounds"] += 1
        alerts: list[dict[str, Any]] = []
        self.counters.add(counters)
        if heartbeats is not None and heartbeats.size:
            self.detector.heartbeat(heartbeats, now_ns)
        if probes.size:
            probes = np.asarray(probes, PROBE_DTYPE)
            if self.cluster is not None:
                n = len(self.cluster.endpoints)
                probes = probes[(probes["src_ep"] < n) & (probes["dst_ep"] < n)]
            self.detector.ingest(probes)
            self._recent.append((now_ns, probes))
        self._recent = [(t, p) for t, p in self._recent if t >= now_ns - 15_000_000_000]
        if now_ns >= self._next_skeleton_ns:
            self._next_skeleton_ns = now_ns + int(self.cfg.skeleton_every_s * 1e9)
            alerts += self._skeletons(now_ns)
        events = self._unexplained(self.detector.tick(now_ns))
        verdicts: list[tuple[Verdict, SuspectEvent | None]] = []
        if events and self.localizer is not None:
            verdicts = self._localize(events, now_ns)
        alerts += self._track(verdicts, now_ns)
        return alerts

    def _skeletons(self, now_ns: int) -> list[dict[str, Any]]:
        out = []
        for job, st in self.jobs.items():
            if self.counters.span_s(st.ep_id) < self.cfg.skeleton.min_duration_s + 2:
                continue
            x = self.counters.rates(st.ep_id)
            if st.skeleton is not None and st.skeleton.confident:
                changed, why = traffic_changed(st.skeleton, st.ep_id, x, params=self.cfg.skeleton)
                if not changed:
                    st.changed_since_ns = 0
                    continue
                # a fault that silences part of a job for a while is not a new traffic pattern:
                # only a change that lasts is worth a new list
                st.changed_since_ns = st.changed_since_ns or now_ns
                if now_ns - st.changed_since_ns < self.cfg.skeleton_change_s * 1e9:
                    continue
                log.info("job %s: re-inferring its skeleton: %s", job, why)
                st.changed_since_ns = 0
            sk = infer_skeleton(
                st.ep_id, st.host, st.rail, x, container=st.rank, job=job, params=self.cfg.skeleton
            )
            st.skeleton = sk
            log.info(
                "job %s: inferred %s over %d s (confidence %.2f): %s",
                job,
                sk.mode,
                x.shape[1],
                sk.confidence,
                sk.reason,
            )
            if not sk.replaces(st.applied_digest):
                continue
            version = st.skeleton_version + 1
            if not self.apply_skeleton(job, sk, version):
                continue
            st.applied_digest, st.skeleton_version = sk.digest, version
            self.stats["skeletons"] += 1
            log.info(
                "job %s: skeleton v%d (%s, %d pairs, confidence %.2f)",
                job,
                version,
                sk.mode,
                len(sk.pairs),
                sk.confidence,
            )
            out.append(
                {
                    "kind": "skeleton",
                    "state": "event",
                    "alert_id": f"skeleton|{job}|{version}",
                    "severity": "info",
                    "job": job,
                    "layer": "skeleton",
                    "component": job,
                    "mode": sk.mode,
                    "confidence": round(float(sk.confidence), 3),
                    "reason": sk.reason,
                    "version": version,
                    "n_pairs": int(len(sk.pairs)),
                    "period_s": round(float(sk.period_s), 3),
                    "pairs": sk.pairs.tolist(),
                    "ep_id": sk.ep_id.tolist(),
                    "group": sk.group.tolist(),
                    "stage": sk.stage.tolist(),
                }
            )
        return out

    def _unexplained(self, events: list[SuspectEvent]) -> list[SuspectEvent]:
        """The events no open alert explains yet. One fault, one alert: loss seen around an
        outage's start and end, or a dead agent's pairs turning late, concern pairs (endpoints)
        an open alert already holds; they confirm it rather than open another. (A second fault
        on exactly those pairs surfaces once the first alert resolves.)"""
        self.stats["events"] += len(events)
        held_pairs: set[tuple[int, int]] = set()
        held_eps: set[int] = set()
        for pairs, eps in self._watch.values():
            held_pairs |= pairs
            held_eps |= eps
        # a probe and its reply cross both directions: a pair and its reverse fail together
        held_pairs |= {(b, a) for a, b in held_pairs}
        out = []
        for ev in events:
            pairs, eps = set(ev.pairs), set(ev.endpoints)
            if (pairs or eps) and pairs <= held_pairs and eps <= held_eps:
                self.stats["events_explained"] += 1
                continue
            out.append(ev)
        return out

    def _healthy_pairs(self, failing: set[tuple[int, int]]) -> np.ndarray:
        """Pairs answered in the last seconds with no failed probe and no open suspicion: the
        localizer traces some of them to clear the links they cross."""
        if not self._recent:
            return np.zeros((0, 2), np.int64)
        p = np.concatenate([r for _t, r in self._recent])
        key = pair_keys(p["src_ep"], p["dst_ep"])
        bad = np.unique(key[p["status"] != 0])
        if failing:
            f = np.array(sorted(failing), np.int64)
            bad = np.union1d(bad, pair_keys(f[:, 0], f[:, 1]))
        good = np.setdiff1d(np.unique(key[p["status"] == 0]), bad)
        return split_pair_keys(good).astype(np.int64)

    def _localize(
        self, events: list[SuspectEvent], now_ns: int
    ) -> list[tuple[Verdict, SuspectEvent | None]]:
        assert self.localizer is not None and self.cluster is not None
        suspects = []
        for ev in events:
            try:
                suspects.append((Suspect.from_event(ev), ev))
            except ConfigError as exc:
                log.warning("cannot localize %s: %s", ev.kind, exc)
        if not suspects:
            return []
        t0 = time.monotonic()
        source = self.source_factory(self.cluster)
        failing = {p for s, _ev in suspects for p in s.pairs}
        eps = {e for p in failing for e in p} | {e for s, _ev in suspects for e in s.agents}
        prefetch_hosts = getattr(source, "prefetch_hosts", None)
        if prefetch_hosts is not None:
            prefetch_hosts(sorted({self.cluster.endpoints[e].host for e in eps}))
        prefetch_traces = getattr(source, "prefetch_traces", None)
        if prefetch_traces is not None:
            prefetch_traces([(p, 0) for p in sorted(failing)])
        verdicts = self.localizer.localize(
            [s for s, _ev in suspects],
            source,
            healthy_pairs=self._healthy_pairs(failing),
            now_ns=now_ns,
        )
        log.info(
            "localized %d event(s) into %d verdict(s) in %.1f s (%s)",
            len(events),
            len(verdicts),
            time.monotonic() - t0,
            getattr(source, "calls", {}),
        )
        self.stats["verdicts"] += len(verdicts)
        out = []
        for v in verdicts:
            ev = next((e for s, e in suspects if set(v.pairs) & set(s.pairs)), suspects[0][1])
            out.append((v, ev))
        return out

    def _track(
        self, verdicts: list[tuple[Verdict, SuspectEvent | None]], now_ns: int
    ) -> list[dict[str, Any]]:
        # alerts stay open while detection holds one of their pairs, or finds one of their
        # endpoints still sick (late results included: a dead agent dropped from its peers'
        # lists is no longer refused, but it stays late until it is back)
        pairs, eps = self.detector.open_incidents(now_ns)
        confirm = [v for v, _e in verdicts]
        fresh = {v.key for v in confirm}
        for v in self.tracker.open:
            if v.key in fresh:
                continue
            want_pairs, want_eps = self._watch.get(v.key, (set(), set()))
            if want_pairs & pairs or want_eps & eps:
                confirm.append(v)
        upd = self.tracker.update(confirm, now_ns)
        out = []
        by_key = {v.key: e for v, e in verdicts}
        for v in upd.new:
            ev = by_key.get(v.key)
            self._events[v.key] = ev
            self._watch[v.key] = (set(v.pairs), set(ev.endpoints) if ev is not None else set())
            out.append(verdict_alert(v, "open", ev))
        for v in upd.ongoing:
            if v.key in fresh:
                old_p, old_e = self._watch.get(v.key, (set(), set()))
                ev = by_key.get(v.key)
                self._watch[v.key] = (
                    old_p | set(v.pairs),
                    old_e | (set(ev.endpoints) if ev else set()),
                )
        for v in upd.resolved:
            self._watch.pop(v.key, None)
            out.append(
                verdict_alert(_resolved(v, now_ns), "resolved", self._events.pop(v.key, None))
            )
        return out


def _resolved(v: Verdict, now_ns: int) -> Verdict:
    """The verdict as resolved: ``detected_at_ns`` kept, the resolution time in its evidence."""
    from dataclasses import replace

    return replace(v, evidence={**dict(v.evidence), "resolved_at_ns": int(now_ns)})


# ---------------------------------------------------------------------------------------------
# the analyzer hook


class PipelineHook:
    """The analyzer daemon's round hook: rounds (and the heartbeats and retirements the daemon
    hears between them) are queued to a worker thread running the :class:`Pipeline` against the
    controller; the alerts it produced are returned by the next :meth:`on_round` (published by
    the daemon)."""

    def __init__(self, cfg: PipelineConfig, security: Any = None) -> None:
        if not cfg.controller:
            raise ConfigError("the pipeline hook needs the controller's address ('controller')")
        self.cfg = cfg
        self._security = security
        self._in: queue.Queue[tuple[str, Any, Any, int] | None] = queue.Queue()
        self._out: queue.Queue[dict[str, Any]] = queue.Queue()
        self._round_s: queue.SimpleQueue[float] = queue.SimpleQueue()  # for the histogram
        self._thread = threading.Thread(target=self._work, name="skh-pipeline", daemon=True)
        self._thread.start()

    def on_round(
        self, probes: np.ndarray, counters: np.ndarray, now_ns: int
    ) -> list[dict[str, Any]]:
        self._in.put(("round", probes, counters, now_ns))
        out = []
        while True:
            try:
                out.append(self._out.get_nowait())
            except queue.Empty:
                return out

    def on_heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        self._in.put(("heartbeat", np.asarray(eps), None, int(t_ns)))

    def drain_round_s(self) -> list[float]:
        """How long the worker's rounds took since the last call (the analyzer's histogram)."""
        out = []
        while not self._round_s.empty():
            out.append(self._round_s.get_nowait())
        return out

    def on_retire(self, eps: list[int]) -> None:
        self._in.put(("retire", list(eps), None, 0))

    def close(self) -> None:
        self._in.put(None)
        self._thread.join(timeout=self.cfg.command_timeout_s + 5)

    def _work(self) -> None:
        client = ControllerClient(self.cfg.controller, self._security, retries=0, name="analyzer")
        cfg = self.cfg

        def apply(job: str, sk: Skeleton, version: int) -> bool:
            try:
                client.apply_skeleton(job, sk.pairs, version)
                return True
            except (ProtocolError, RequestRefused, RequestTimeout) as exc:
                log.warning("skeleton of %s not applied: %s", job, exc)
                return False

        pipe = Pipeline(
            cfg, source_factory=lambda cl: AgentStateSource(client, cl, cfg), apply_skeleton=apply
        )
        next_status = 0.0
        try:
            while True:
                # catch up: what queued while the last round localized is merged into one round
                items = [self._in.get()]
                while True:
                    try:
                        items.append(self._in.get_nowait())
                    except queue.Empty:
                        break
                rounds = []
                for item in items:
                    if item is None:
                        return
                    kind, a, b, t_ns = item
                    if kind == "heartbeat":
                        pipe.detector.heartbeat(a, t_ns)
                    elif kind == "retire":
                        pipe.detector.retire(a)
                    else:
                        rounds.append((a, b, t_ns))
                if not rounds:
                    continue
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + 5.0
                    try:
                        st = client.status(detail=True)
                        pipe.set_endpoints(
                            m for j in st["jobs"].values() for m in j.get("members", ())
                        )
                    except (
                        ProtocolError,
                        RequestRefused,
                        RequestTimeout,
                        KeyError,
                        TypeError,
                    ) as exc:
                        log.warning("controller status: %s", exc)
                t0 = time.monotonic()
                try:
                    alerts = pipe.process(
                        np.concatenate([r[0] for r in rounds]),
                        np.concatenate([r[1] for r in rounds]),
                        rounds[-1][2],
                    )
                except Exception:  # a pipeline bug must not kill the worker: logged, round dropped
                    log.exception("pipeline round failed")
                    continue
                self._round_s.put(time.monotonic() - t0)
                for alert in alerts:
                    self._out.put(alert)
        finally:
            client.close()


def unpack_skeleton(body: Mapping[str, Any]) -> np.ndarray | None:
    """The skeleton pairs of a JOB_SNAPSHOT body (None while the job runs on its preload list)."""
    raw = body.get("skeleton")
    return None if raw is None else unpack_pairs(raw)
