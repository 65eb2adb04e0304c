"""Evidence for localization from host agents: :class:`AgentStateSource` asks the underlay
agents (through the controller's command relay) for traceroutes, overlay forwarding state, host
reports and RNIC flow tables, and turns their answers into the localizer's types."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from skh.analysis.localize import FlowRule, FlowTables, HostReport, OverlayTables, Trace
from skh.analysis.localize.data import REPORT_FLAGS
from skh.model import Cluster
from skh.orchestrator.admin import ControllerClient
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.security import underlay_identity

__all__ = ["AgentStateSource"]

log = logging.getLogger(__name__)


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


_BAD_ANSWER = (KeyError, TypeError, ValueError, AttributeError)


def _parsed(what: str, parse: Any, *args: Any) -> Any:
    """An agent's answer parsed, or None (logged) when it does not parse: one bad answer costs
    its own evidence, never the round."""
    try:
        return parse(*args)
    except _BAD_ANSWER as exc:
        log.warning("unusable %s answer: %r", what, exc)
        return None


#: (source host, rail, destination host, rail, path id, the endpoints' overlay addresses)
_TraceKey = tuple[str, int, str, int, int, str, str]


class AgentStateSource:
    """The localizer's questions answered by host agents through the controller's relay.

    Traces are taken between the two RNICs of a pair (the VXLAN underlay path), pinned to the
    outer 5-tuple the pair's probes on that path id leave with (the host agent learns it by
    watching them: :mod:`skh.collect.vxlan`), else from a source port fixed per (pair's RNICs,
    path id). Cheap, decisive reads come first and traces only when the localizer needs one:
    :meth:`prefetch_hosts` asks every host's overlay state and report at once, :meth:`plan_traces`
    names the traces the round will likely want, and the first trace the localizer asks for
    fetches all of them at once (the agents run them side by side); later calls hit the cache.
    """

    def __init__(self, client: ControllerClient, cluster: Cluster, cfg: PipelineConfig) -> None:
        self.client = client
        self.cluster = cluster
        self.cfg = cfg
        self.calls: dict[str, int] = {}
        self._traces: dict[_TraceKey, Trace | None] = {}
        self._tables: dict[str, OverlayTables | None] = {}
        self._reports: dict[str, HostReport | None] = {}
        self._flows: dict[tuple[str, int], FlowTables | None] = {}
        self._planned: list[tuple[tuple[int, int], int]] = []
        self._failed: set[tuple[tuple[int, int], int]] | None = None
        fab = cluster.fabric
        self._vtep_hosts = {r.ip: h.name for h in fab.hosts.values() for r in h.rnics if r.ip}
        self._tor_of = {r.key: r.tor for h in fab.hosts.values() for r in h.rnics}

    def _agent(self, host: str) -> str | None:
        if host in self.cfg.host_agents:
            return self.cfg.host_agents[host]
        return underlay_identity(host) if host in self.cluster.fabric.hosts else None

    def _run(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
        for _agent, name, _args in calls:
            self.calls[name] = self.calls.get(name, 0) + 1
        return self.client.commands(calls, timeout_s=self.cfg.command_timeout_s)

    # -- traceroute ---------------------------------------------------------------------------
    def _trace_key(self, pair: tuple[int, int], path_id: int) -> _TraceKey:
        a, b = self.cluster.endpoints[pair[0]], self.cluster.endpoints[pair[1]]
        return (a.host, a.rail, b.host, b.rail, int(path_id), a.ip, b.ip)

    def _trace_call(
        self, key: _TraceKey, *, reply: bool = False
    ) -> tuple[str, str, dict[str, Any]] | None:
        """The agent command tracing ``key``'s flow from its source; ``reply``: ``key`` is the
        flow's answers' leg (source = the probed endpoint)."""
        sh, sr, dh, dr, path_id, inner_src, inner_dst = key
        agent = self._agent(sh)
        fab = self.cluster.fabric
        src, dst = fab.rnic(sh, sr), fab.rnic(dh, dr)
        if agent is None or not src.ip or not dst.ip:
            return None
        # the port of a trace the agent cannot pin to the flow: fixed per RNIC pair and path id
        # (not per run: crc32, not the salted hash())
        sport = 40000 + (zlib.crc32(f"{sh}:{sr}>{dh}:{dr}".encode()) % 1000) * 16 + path_id % 16
        args: dict[str, Any] = {
            "dst": dst.ip,
            "src": src.ip,
            "sport": sport,
            "dport": self.cfg.trace_base_port,
            "max_ttl": self.cfg.trace_max_ttl,
        }
        if inner_src and inner_dst and self.cfg.trace_learn_s > 0:
            # the probe flow itself: the agent traces the VXLAN outer 5-tuple its frames take
            args |= {
                "inner_src": inner_src,
                "inner_dst": inner_dst,
                "path_id": path_id,
                "learn_ms": int(self.cfg.trace_learn_s * 1000),
            }
            if reply:
                args["reply"] = True
        return (agent, "traceroute", args)

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
        nodes = self._bridged(trace_nodes(result, self.cfg.addr_owner, src_node=src_node))
        # no per-hop round trips: a hop's answer is an ICMP error its control plane builds (here
        # timed in userspace, one probe per hop), so a step between two hops is mostly that
        # noise, not forwarding delay, and the source's own "0" is no measurement at all. Given
        # to the vote, every trace showed a delay onset at its first hop: failing traces blamed
        # the first ToR and healthy ones cleared nothing past their source.
        return Trace(pair, nodes, result.reached)

    def _bridged(self, nodes: tuple[str | None, ...]) -> tuple[str | None, ...]:
        """Put back the ToR between two RNICs of its segment: a ToR that bridges them (an L2
        segment, as on the namespace testbed) forwards without a TTL of its own, so no hop
        answers for it, yet the frames crossed it and its ports."""
        out: list[str | None] = []
        for node in nodes:
            prev = out[-1] if out else None
            tor = self._tor_of.get(prev) if prev else None
            if tor is not None and node is not None and self._tor_of.get(node) == tor:
                out.append(tor)
            out.append(node)
        return tuple(out)

    def failed_flows(self, flows: Iterable[tuple[tuple[int, int], int]]) -> None:
        """The (pair, path id) flows whose probes failed: only their answers' legs are traced
        (a healthy flow's trace clears its probes' leg; once told, others are not doubled)."""
        self._failed = {(tuple(p), int(pid)) for p, pid in flows}  # type: ignore[misc]

    def plan_traces(self, wanted: Iterable[tuple[tuple[int, int], int]]) -> None:
        """Traces the round will likely ask for: fetched together with the first one it does."""
        self._planned += list(wanted)

    def traceroute(self, pair: tuple[int, int], path_id: int) -> Trace | None:
        key = self._trace_key(pair, path_id)
        if key not in self._traces:
            planned, self._planned = self._planned, []
            self._fetch_traces([(pair, path_id), *planned])
        t = self._traces.get(key)
        if t is None:
            return None
        # the answers' leg (see _fetch_traces) keeps its own direction
        p = t.pair if t.pair == (pair[1], pair[0]) else pair
        return Trace(p, t.nodes, t.reached, t.hop_loss, t.hop_rtt_ns)

    def _fetch_traces(self, wanted: Iterable[tuple[tuple[int, int], int]]) -> None:
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
        pinned = stopped = 0
        for (key, (pair, _c)), reply in zip(todo.items(), replies, strict=True):
            self._traces[key] = _parsed("traceroute", self._trace_from, pair, key, reply)
            res = reply.get("result") or {}
            pinned += bool(res.get("pinned"))
            if "pinned" in res and not res["pinned"]:
                log.debug("flow %s traced unpinned: %s", key, res.get("why", ""))
        # A probe is lost when either leg of its round trip breaks. Where the probes' leg goes
        # through, the answers' leg (the target's ACKs, from its own host, on the path their
        # outer header hashes to) may be the broken one: traced too, and when it stops, that
        # trace (of the reversed pair) is the answer
        back: dict[tuple, tuple[tuple[int, int], tuple, tuple[str, str, dict[str, Any]]]] = {}
        for key, (pair, _c) in todo.items():
            t = self._traces[key]
            sh, sr, dh, dr, pid, a_ip, b_ip = key
            rkey = (dh, dr, sh, sr, pid, b_ip, a_ip)
            # an answers' leg counts only pinned (below): not traced where nothing is pinned
            if t is None or not t.reached or not (a_ip and b_ip) or self.cfg.trace_learn_s <= 0:
                continue
            if self._failed is not None and (pair, pid) not in self._failed:
                continue
            call = self._trace_call(rkey, reply=True)
            if call is not None:
                back[key] = ((pair[1], pair[0]), rkey, call)
        replies = self._run([c for _p, _k, c in back.values()]) if back else []
        for (key, (rpair, rkey, _c)), reply in zip(back.items(), replies, strict=True):
            if not (reply.get("result") or {}).get("pinned"):
                continue  # a trace of some other flow says nothing about this one's way back
            t = _parsed("traceroute", self._trace_from, rpair, rkey, reply)
            if t is not None and not t.reached:
                log.debug("flow %s: its answers' leg stops: %s", key, t.nodes)
                self._traces[key] = t
                stopped += 1
        log.info(
            "traced %d flows (%d pinned to their VXLAN 5-tuple), %d answers' legs (%d stopped)",
            len(todo),
            pinned,
            len(back),
            stopped,
        )

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
            self._tables[h] = _parsed("overlay_state", self._tables_from, h, replies[2 * i])
            self._reports[h] = _parsed("host_report", self._report_from, h, replies[2 * i + 1])

    def _tables_from(self, host: str, reply: dict[str, Any]) -> OverlayTables | None:
        from skh.collect.linux import LocalEndpoint, linux_overlay_tables

        if not reply.get("ok"):
            return None
        state = _linux_state(reply.get("result"))
        if state is None:
            return None
        # the endpoints alive: a gone one's VF is no longer there to forward to
        live = self.cluster.live_endpoints
        local = [
            LocalEndpoint(f"{e.host}/vf:{e.container}.{e.rail}", e.ip, self.cfg.vf_devices[e.name])
            for e in live
            if e.host == host and e.name in self.cfg.vf_devices and e.ip
        ]
        dests = [e.ip for e in live if e.ip]
        return linux_overlay_tables(host, state, local, dests, self._vtep_hosts)

    @staticmethod
    def _report_from(host: str, reply: dict[str, Any]) -> HostReport | None:
        """The agent's answer as a :class:`HostReport`. Only the flags in the answer are read
        (``read`` when the agent says, else the keys it sent): a real host agent reads port
        state, light from the switch, the carrier-down count and the RX error counters; every
        flag only the simulator models (RNIC hardware/firmware state, GID, bond, PCIe,
        GPUDirect, hugepages, RDMA fallback, offload churn) stays unknown, so the localizer never
        reads it as healthy."""
        if not reply.get("ok") or not isinstance(reply.get("result"), Mapping):
            return None
        r = reply["result"]
        sent = {
            "rnic_state",
            "peer_down",
            "port_down_count",
            "rx_errors",
            "agents_dead",
            "containers_dead",
        } & set(r)
        read = frozenset(str(f) for f in r.get("read", sent)) & frozenset(REPORT_FLAGS)
        return HostReport(
            host,
            rnic_state={int(k): str(v) for k, v in dict(r.get("rnic_state", {})).items()},
            peer_down=frozenset(int(x) for x in r.get("peer_down", ())),
            port_down_count={int(k): int(v) for k, v in dict(r.get("port_down_count", {})).items()},
            rx_errors={int(k): int(v) for k, v in dict(r.get("rx_errors", {})).items()},
            agents_dead=frozenset(str(x) for x in r.get("agents_dead", ())),
            agents_late=frozenset(str(x) for x in r.get("agents_late", ())),
            containers_dead=frozenset(str(x) for x in r.get("containers_dead", ())),
            read=read | (sent & {"agents_dead", "containers_dead"}),
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
                else _parsed(
                    "rnic_flows",
                    lambda: FlowTables(
                        tuple(_rule(d) for d in r.get("expected", ())),
                        tuple(_rule(d) for d in r.get("offloaded", ())),
                        bool(r.get("megaflow", False)),
                    ),
                )
            )
        return self._flows[key]
