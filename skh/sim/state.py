"""What agents answer when localization asks: flow-pinned traceroutes, a host's overlay and RNIC
state, and an RNIC's OVS vs offloaded flow tables — derived from the cluster model and the faults
active at the asked time, so every injected fault shows in these inputs as its model says.

Overlay naming (one VF per endpoint): ``<host>/vf<rail>-<ep>`` → ``<host>/rep<rail>-<ep>``
(representor) → OVS rule ``<host>/ovs<rail>#<rule id>`` → ``<host>/vtep<rail>`` → remote
``<dst host>/vtep<rail>`` → its decap rule → ``<dst host>/rep<rail>-<dst ep>`` →
``<dst host>/vf<rail>-<dst ep>``. OVS holds one encap rule per (local endpoint, peer) — the
peers are the endpoint's ping pairs — and one decap rule per local endpoint; the RNIC's offloaded
table is a copy of the offloadable rules unless a fault says otherwise.

Fault → state:
  links/switches down or flapping (2, 3, 4) and RNIC down (5, 7, 8, 10): the traceroute stops
  (``node=None`` from the broken hop on); CRC (1): later hops show ``loss``; CC (19): later hops
  slower. Container crash (17): its VF and representor are absent. Not using RDMA (14): its
  encap rules say ``encap_sw`` and are not offloaded. Vswitch loop (22): encap rules of that RNIC
  point back at the representor. Offloading failure (9): the offloaded table has none of the
  rules; repetitive offloading (15): rules missing while the flap window is on, and ``installs``
  counting each window that ended (evicted and re-installed; the offload counters keep the count
  while the rules are out, :meth:`AgentView.offload_reinstalls`); suboptimal offloading (16):
  offloaded rules out of priority order; firmware (6): offloaded rules ``stale``. GID change
  (11): the RNIC's ``gid`` differs from ``registered_gid``; host faults (12, 13, 18) show in
  the host's ``config``; RNIC faults in its ``rnics`` entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from skh.errors import TopologyError
from skh.failures import FailureType
from skh.model import Cluster
from skh.sim.faults import Fault, FaultEngine
from skh.sim.topology import EndpointTable, FabricIndex

__all__ = ["TraceHop", "FlowEntry", "OverlayWalk", "AgentView", "walk_overlay"]

_T = FailureType
#: entries of :class:`AgentView`'s per-time memos before they are cleared whole
_MEMO_MAX = 256


@dataclass(frozen=True, slots=True)
class TraceHop:
    """One traceroute hop: ``node`` None where nothing answered ('*')."""

    ttl: int
    node: str | None
    rtt_ns: int  # -1 when nothing answered
    loss: float  # share of this hop's probes lost (0..1)


@dataclass(frozen=True, slots=True)
class FlowEntry:
    rule_id: int
    table: Literal["ovs", "offloaded"]
    priority: int
    in_port: str
    match_dst: str  # overlay destination IP, or "*" for the default rule
    action: str  # encap | encap_sw | decap | upcall
    out: str  # next node
    tunnel_dst: str = ""  # remote VTEP for encap rules
    state: Literal["ok", "stale"] = "ok"
    installs: int = 1  # times the rule was (re)installed


@dataclass(frozen=True, slots=True)
class OverlayWalk:
    hops: tuple[str, ...]
    outcome: Literal["ok", "missing", "loop"]
    at: str | None  # the missing or revisited hop


def _vf(host: str, rail: int, ep: int) -> str:
    return f"{host}/vf{rail}-{ep}"


def _rep(host: str, rail: int, ep: int) -> str:
    return f"{host}/rep{rail}-{ep}"


def _vtep(host: str, rail: int) -> str:
    return f"{host}/vtep{rail}"


class AgentView:
    """Answers localization queries for one simulation (see module doc)."""

    def __init__(
        self,
        index: FabricIndex,
        cluster: Cluster,
        eps: EndpointTable,
        engine: FaultEngine,
        faults: Callable[[float], list[Fault]],
        peers: Callable[[int], np.ndarray],
        alive: Callable[[np.ndarray, float], np.ndarray],
    ) -> None:
        self.index, self.cluster, self.eps, self.engine = index, cluster, eps, engine
        self._faults = faults  # active faults at a time
        self._peers = peers  # ping peers (dst ep ids) of an endpoint
        self._alive = alive  # which endpoint ids have a live container at a time
        # per (time, faults active then): those in their on-window, and what they do to the
        # underlay. A localization round asks at one time thousands of times (traceroutes of
        # every suspect flow, and of the answers' legs); both are pure functions of the key
        self._on_memo: dict[tuple, tuple[list[Fault], list[Fault]]] = {}
        self._under_memo: dict[tuple, tuple] = {}

    def _active(self, t_s: float, types: Iterable[FailureType] | None = None) -> list[Fault]:
        fs = self._faults(t_s)
        # ``fs`` rides along in the value: the ids in the key stay those of live faults
        key = (t_s, tuple(map(id, fs)))
        got = self._on_memo.get(key)
        if got is None:
            if len(self._on_memo) >= _MEMO_MAX:
                self._on_memo.clear()
            tt = np.array([t_s])
            on = [f for f in fs if bool(self.engine.on_now(f, tt)[0])]
            got = self._on_memo[key] = (fs, on)
        fs = list(got[1])
        if types is not None:
            ts = set(types)
            fs = [f for f in fs if f.type in ts]
        return fs

    # -- underlay ----------------------------------------------------------------------------------
    def traceroute(self, src_ep: int, dst_ep: int, path_id: int, t_s: float) -> list[TraceHop]:
        """A flow-pinned traceroute from the source endpoint's RNIC towards the destination's,
        over the path ``path_id`` pins (as the probes of that path id take)."""
        self._check_ep(src_ep)
        self._check_ep(dst_ep)
        sr, dr = int(self.eps.rnic[src_ep]), int(self.eps.rnic[dst_ep])
        nodes = self.index.path_names(sr, dr, path_id)
        down_links, lossy, down_nodes, slow = self._underlay(t_s)
        hops: list[TraceHop] = []
        broken = nodes[0] in down_nodes
        loss = 0.0
        extra = 0.0
        for i in range(1, len(nodes)):
            a, b = nodes[i - 1], nodes[i]
            lo, hi = (a, b) if a <= b else (b, a)
            link = f"{lo}|{hi}"
            broken = broken or link in down_links or b in down_nodes
            loss = 1.0 - (1.0 - loss) * (1.0 - lossy.get(link, 0.0))
            extra += slow.get(b, 0.0)
            if broken:
                hops.append(TraceHop(i, None, -1, 1.0))
            else:
                hops.append(TraceHop(i, b, int(4_000 + 1_000 * i + extra), loss))
        return hops

    def _underlay(
        self, t_s: float
    ) -> tuple[set[str], dict[str, float], set[str], dict[str, float]]:
        """What the faults on at ``t_s`` do to traceroutes: links and nodes down, links' loss,
        switches' added latency (memoised per time and active faults: read-only to callers)."""
        fs = self._faults(t_s)
        key = (t_s, tuple(map(id, fs)))
        got = self._under_memo.get(key)
        if got is not None:
            return got[1]
        if len(self._under_memo) >= _MEMO_MAX:
            self._under_memo.clear()
        down_links: set[str] = set()
        lossy: dict[str, float] = {}
        down_nodes: set[str] = set()
        slow: dict[str, float] = {}
        for f in self._active(t_s):
            t = f.type
            if t in (_T.SWITCH_PORT_DOWN, _T.SWITCH_PORT_FLAPPING):
                down_links.add(f.component)
            elif t == _T.CRC_ERROR:
                lossy[f.component] = f.eff("loss_rate")
            elif t == _T.SWITCH_OFFLINE:
                down_nodes.add(f.component)
            elif t in (_T.RNIC_HW_FAILURE, _T.RNIC_PORT_DOWN, _T.RNIC_PORT_FLAPPING, _T.BOND_ERROR):
                down_nodes.add(f.component)
            elif t == _T.CC_ISSUE:
                slow[f.component] = f.eff("extra_ns") * float(
                    self.engine.scale(f, np.array([t_s]))[0]
                )
        out = (down_links, lossy, down_nodes, slow)
        self._under_memo[key] = (fs, out)
        return out

    # -- overlay -----------------------------------------------------------------------------------
    def _host_eps(self, host: str, t_s: float) -> np.ndarray:
        if host not in self.index.host_id:
            raise TopologyError(f"unknown host {host!r}")
        eps = np.flatnonzero(self.eps.host == self.index.host_id[host])
        return eps[self._alive(eps, t_s)]

    def _check_ep(self, ep: int) -> None:
        if not 0 <= ep < len(self.eps):
            raise TopologyError(f"unknown endpoint id {ep}")

    def flow_tables(
        self, host: str, rail: int, t_s: float
    ) -> tuple[list[FlowEntry], list[FlowEntry]]:
        """OVS's own rules and the RNIC's offloaded copy for one RNIC, in table order."""
        if not 0 <= rail < self.index.rails:
            raise TopologyError(f"host {host}: no RNIC on rail {rail}")
        eps = self._host_eps(host, t_s)
        eps = eps[self.eps.rail[eps] == rail]
        rkey = f"{host}:rnic{rail}"
        active = self._active(t_s)
        on_rnic = {f.type: f for f in active if f.component == rkey}
        sw_conts = {f.component for f in active if f.type == _T.NOT_USING_RDMA}
        vtep = _vtep(host, rail)
        ovs: list[FlowEntry] = []
        rid = 0
        for e in eps:
            e = int(e)
            ep = self.cluster.endpoints[e]
            rep = _rep(host, rail, e)
            sw = ep.container in sw_conts
            for p in self._peers(e):
                p = int(p)
                dst = self.cluster.endpoints[p]
                rid += 1
                out = rep if _T.OVERLAY_LOOP in on_rnic else vtep
                ovs.append(
                    FlowEntry(
                        rid,
                        "ovs",
                        100,
                        rep,
                        dst.ip,
                        "encap_sw" if sw else "encap",
                        out,
                        _vtep(dst.host, dst.rail),
                    )
                )
            rid += 1
            ovs.append(FlowEntry(rid, "ovs", 100, vtep, ep.ip, "decap", rep))
        ovs.append(FlowEntry(0, "ovs", 0, "*", "*", "upcall", "ovs-vswitchd"))
        off = [
            FlowEntry(
                f.rule_id,
                "offloaded",
                f.priority,
                f.in_port,
                f.match_dst,
                f.action,
                f.out,
                f.tunnel_dst,
            )
            for f in ovs
            if f.action != "encap_sw"
        ]
        if _T.OFFLOADING_FAILURE in on_rnic:
            off = [f for f in off if f.action == "upcall"]
        if _T.REPETITIVE_FLOW_OFFLOADING in on_rnic:  # invalidated right now
            off = [f for f in off if f.action == "upcall"]
        else:
            installs = 1 + self.offload_reinstalls(host, rail, t_s)
            off = [_with(f, installs=installs) if f.action != "upcall" else f for f in off]
        if _T.SUBOPTIMAL_FLOW_OFFLOADING in on_rnic and len(off) > 1:
            # the catch-all upcall rule first: every flow misses the fast path
            off = off[-1:] + off[:-1]
        fw = on_rnic.get(_T.RNIC_FIRMWARE_NOT_RESPONDING)
        if fw is not None:
            share = fw.eff("flow_share")
            off = [
                _with(f, state="stale") if (f.rule_id * 2654435761 % 2**32) / 2**32 < share else f
                for f in off
            ]
        return ovs, off

    def offload_reinstalls(self, host: str, rail: int, t_s: float) -> int:
        """How often a repetitive offloading fault on the RNIC, active at ``t_s``, had its
        flows evicted and re-installed so far: what the RNIC's offload counters show, whether or
        not its flows are evicted right now (counters only grow)."""
        rkey = f"{host}:rnic{rail}"
        return sum(
            self.engine.windows_ended(f, t_s)
            for f in self._faults(t_s)
            if f.component == rkey and f.type == _T.REPETITIVE_FLOW_OFFLOADING
        )

    def overlay_state(self, host: str, t_s: float) -> dict[str, Any]:
        """A host's overlay dump: VFs/representors of its live endpoints, VTEPs, OVS rules (all
        rails), RNIC state and host configuration — plain data."""
        eps = self._host_eps(host, t_s)
        active = self._active(t_s)
        crashed = {f.component for f in active if f.type == _T.CONTAINER_CRASH}
        vfs = []
        for e in eps:
            e = int(e)
            ep = self.cluster.endpoints[e]
            present = ep.container not in crashed
            vfs.append(
                {
                    "ep": e,
                    "container": ep.container,
                    "rail": ep.rail,
                    "ip": ep.ip,
                    "gid": ep.gid,
                    "vf": _vf(host, ep.rail, e),
                    "representor": _rep(host, ep.rail, e),
                    "vf_present": present,
                    "representor_present": present,
                }
            )
        rnics = {}
        rules = []
        for rail in range(self.index.rails):
            rkey = f"{host}:rnic{rail}"
            mine = {f.type for f in active if f.component == rkey}
            link_down = any(
                f.type in (_T.SWITCH_PORT_DOWN, _T.SWITCH_PORT_FLAPPING)
                and rkey in f.component.split("|")
                for f in active
            )
            gid = f"fe80::{self.index.host_id[host]:x}:{rail}"
            rnics[rail] = {
                "rnic": rkey,
                "vtep": _vtep(host, rail),
                "hw": "failed" if _T.RNIC_HW_FAILURE in mine else "ok",
                "port": "down"
                if (mine & {_T.RNIC_PORT_DOWN, _T.RNIC_PORT_FLAPPING} or link_down)
                else "up",
                # the NIC's physical port state: "polling" = no light from the switch (its
                # port is down)
                "phys_state": "disabled"
                if mine & {_T.RNIC_PORT_DOWN, _T.RNIC_PORT_FLAPPING}
                else ("polling" if link_down else "linkup"),
                "bond": "degraded" if _T.BOND_ERROR in mine else "ok",
                "firmware": "not_responding" if _T.RNIC_FIRMWARE_NOT_RESPONDING in mine else "ok",
                "registered_gid": gid,
                "gid": gid + ":new" if _T.RNIC_GID_CHANGE in mine else gid,
            }
            ovs, _ = self.flow_tables(host, rail, t_s)
            rules += [
                {
                    "rail": rail,
                    "rule": f.rule_id,
                    "priority": f.priority,
                    "in": f.in_port,
                    "match_dst": f.match_dst,
                    "action": f.action,
                    "next": f.out,
                    "tunnel_dst": f.tunnel_dst,
                }
                for f in ovs
            ]
        hmine = {f.type for f in active if f.component == host}
        config = {
            "hugepages": "mismatch" if _T.HUGEPAGE_MISCONFIG in hmine else "ok",
            "pcie": "error" if _T.PCIE_NIC_ERROR in hmine else "ok",
            "gpudirect": "error" if _T.GPUDIRECT_RDMA_ERROR in hmine else "ok",
        }
        return {
            "host": host,
            "t_s": t_s,
            "vfs": vfs,
            "rnics": rnics,
            "rules": rules,
            "config": config,
        }

    def overlay_chain(self, src_ep: int, dst_ep: int, t_s: float) -> OverlayWalk:
        """Walk the overlay chain from ``src_ep`` to ``dst_ep`` through both hosts' dumps."""
        self._check_ep(src_ep)
        self._check_ep(dst_ep)
        s, d = self.cluster.endpoints[src_ep], self.cluster.endpoints[dst_ep]
        dumps = {h: self.overlay_state(h, t_s) for h in {s.host, d.host}}
        return walk_overlay(dumps, src_ep, dst_ep)


def _with(f: FlowEntry, **kw: Any) -> FlowEntry:
    return replace(f, **kw)


def walk_overlay(dumps: Mapping[str, Mapping[str, Any]], src_ep: int, dst_ep: int) -> OverlayWalk:
    """Follow VF → representor → OVS rule → VTEP → remote VTEP → decap rule → representor → VF
    through overlay dumps (:meth:`AgentView.overlay_state`), as localization does: a node with no
    next hop ends the walk as ``missing``, a node seen twice as ``loop``."""
    vf_of: dict[int, tuple[str, Mapping[str, Any]]] = {}
    for h, dump in dumps.items():
        for v in dump["vfs"]:
            vf_of[int(v["ep"])] = (h, v)
    if src_ep not in vf_of:
        return OverlayWalk((), "missing", f"vf of endpoint {src_ep}")
    sh, sv = vf_of[src_ep]
    hops: list[str] = [sv["vf"]]
    if not sv["vf_present"]:
        return OverlayWalk(tuple(hops), "missing", sv["vf"])
    dst = vf_of.get(dst_ep)
    dst_ip = dst[1]["ip"] if dst else None
    node = sv["representor"]
    host = sh
    seen = set(hops)
    for _ in range(64):
        if node in seen:
            hops.append(node)
            return OverlayWalk(tuple(hops), "loop", node)
        seen.add(node)
        hops.append(node)
        if dst is not None and node == dst[1]["vf"]:
            return OverlayWalk(tuple(hops), "ok", None)
        if dst is not None and node == dst[1]["representor"]:
            if not dst[1]["representor_present"]:
                return OverlayWalk(tuple(hops), "missing", node)
            node = dst[1]["vf"]
            continue
        rule = next(
            (r for r in dumps[host]["rules"] if r["in"] == node and r["match_dst"] == dst_ip),
            None,
        )
        if rule is None:
            # a VTEP with no match is handed to the tunnel's far end by the encap rule we came from
            return OverlayWalk(tuple(hops), "missing", node)
        rname = f"{host}/ovs{rule['rail']}#{rule['rule']}"
        hops.append(rname)
        if rule["action"] in ("encap", "encap_sw"):
            local_vtep = rule["next"]
            if local_vtep != _vtep(host, rule["rail"]):
                node = local_vtep  # a misprogrammed next hop (the loop case goes back to the rep)
                continue
            hops.append(local_vtep)
            seen.add(local_vtep)
            remote = rule["tunnel_dst"]
            host = remote.split("/")[0]
            if host not in dumps:
                return OverlayWalk(tuple(hops), "missing", remote)
            node = remote
        else:
            node = rule["next"]
    return OverlayWalk(tuple(hops), "loop", node)
