"""The simulator's answers to localization's commands: what :class:`skh.sim.scenario.Simulation`'s
agents answer (:mod:`skh.sim.state`), translated into the plain data
:class:`skh.analysis.localize.Localizer` takes — the same translation the real collectors of
:mod:`skh.collect` do for command output.

The simulator names overlay nodes ``<host>/vf<rail>-<ep>``, ``<host>/rep<rail>-<ep>``,
``<host>/ovs<rail>#<rule>`` and ``<host>/vtep<rail>``; :func:`sim_overlay_endpoint` and
:func:`sim_overlay_component` tell the localizer so (:func:`sim_localizer`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from skh.analysis.localize import (
    FlowRule,
    FlowTables,
    HostReport,
    Localizer,
    OverlayTables,
    Trace,
)
from skh.model import Endpoint

__all__ = [
    "SimSource",
    "sim_overlay_endpoint",
    "sim_overlay_component",
    "sim_flow_rule",
    "sim_localizer",
    "live_pairs",
]

_RNIC_STATE = {
    ("hw", "failed"): "hw_error",
    ("firmware", "not_responding"): "fw_unresponsive",
    ("port", "down"): "down",
}


def sim_overlay_endpoint(ep: Endpoint) -> tuple[str, str]:
    return f"{ep.host}/vf{ep.rail}-{ep.ep_id}", ep.ip


def sim_overlay_component(hop: str) -> str | None:
    """A vswitch hop of rail r (its representor, rule or VTEP) lives in RNIC r's eswitch."""
    host, _, local = hop.partition("/")
    for prefix in ("rep", "ovs", "vtep"):
        if local.startswith(prefix):
            rail = local[len(prefix) :].split("-", 1)[0].split("#", 1)[0]
            if rail.isdigit():
                return f"{host}:rnic{rail}"
    return None


def sim_flow_rule(f: Any) -> FlowRule:
    """One simulator ``FlowEntry`` as a :class:`FlowRule`."""
    match = () if f.in_port == "*" else (("in_port", f.in_port), ("nw_dst", f.match_dst))
    actions = (f"{f.action}:{f.out}",) + (("stale",) if f.state == "stale" else ())
    return FlowRule(match, actions, int(f.priority))


class SimSource:
    """Answers the localizer's questions from a simulation at virtual time ``t_s`` (default: the
    simulation's clock). Counts the questions asked in ``calls``."""

    def __init__(self, sim: Any, *, t_s: float | None = None) -> None:
        self.sim = sim
        self.t_s = sim.clock.now_s if t_s is None else float(t_s)
        self.calls: Counter[str] = Counter()
        self._dumps: dict[str, dict] = {}

    def _dump(self, host: str) -> dict:
        d = self._dumps.get(host)
        if d is None:
            d = self._dumps[host] = self.sim.overlay_state(host, self.t_s)
        return d

    def traceroute(self, pair: tuple[int, int], path_id: int) -> Trace | None:
        self.calls["traceroute"] += 1
        src, dst = pair
        ix, eps = self.sim.index, self.sim.eps
        hops = self.sim.traceroute(src, dst, path_id, self.t_s)
        nodes = [ix.rnic_key(int(eps.rnic[src])), *(h.node for h in hops)]
        loss = [0.0, *(float(h.loss) for h in hops)]
        rtt = [0, *(int(h.rtt_ns) for h in hops)]
        while len(nodes) > 1 and nodes[-1] is None:
            nodes.pop()
        n = len(nodes)
        return Trace(
            pair,
            tuple(nodes),
            nodes[-1] == ix.rnic_key(int(eps.rnic[dst])),
            tuple(loss[:n]),
            tuple(rtt[:n]),
        )

    def overlay_tables(self, host: str) -> OverlayTables | None:
        self.calls["overlay"] += 1
        d = self._dump(host)
        nh: dict[str, dict[str, str]] = {}
        down: set[str] = set()
        by_in: dict[str, dict[str, str]] = {}
        for r in d["rules"]:
            if r["in"] == "*":
                continue  # the catch-all upcall to ovs-vswitchd forwards nothing by itself
            rule = f"{host}/ovs{r['rail']}#{r['rule']}"
            by_in.setdefault(r["in"], {})[r["match_dst"]] = rule
            if r["action"] in ("encap", "encap_sw"):
                nxt = r["next"]
                nh[rule] = {"*": nxt}
                if nxt == f"{host}/vtep{r['rail']}":
                    nh.setdefault(nxt, {})[r["match_dst"]] = r["tunnel_dst"]
            else:
                nh[rule] = {"*": r["next"]}
        for node, entries in by_in.items():
            nh.setdefault(node, {}).update(entries)
        for v in d["vfs"]:
            vf, rep = v["vf"], v["representor"]
            if not v["vf_present"]:
                down.add(vf)
            if not v["representor_present"]:
                down.add(rep)
            nh.setdefault(vf, {})["*"] = rep
            nh.setdefault(rep, {})[v["ip"]] = vf
        return OverlayTables(host, nh, frozenset(down))

    def flow_tables(self, host: str, rail: int) -> FlowTables | None:
        self.calls["flow_tables"] += 1
        ovs, off = self.sim.flow_tables(host, rail, self.t_s)
        return FlowTables(
            tuple(sim_flow_rule(f) for f in ovs), tuple(sim_flow_rule(f) for f in off)
        )

    def host_report(self, host: str) -> HostReport | None:
        self.calls["host_report"] += 1
        d = self._dump(host)
        state: dict[int, str] = {}
        gid, bond, churn, peer = set(), set(), set(), set()
        for rail, r in d["rnics"].items():
            rail = int(rail)
            for (k, v), s in _RNIC_STATE.items():
                if r.get(k) == v and rail not in state:
                    state[rail] = s
            if r.get("port") == "down" and r.get("phys_state") == "polling":
                state.pop(rail, None)  # no light from the switch: its port is down, not ours
                peer.add(rail)
            if r.get("gid") != r.get("registered_gid"):
                gid.add(rail)
            if r.get("bond") == "degraded":
                bond.add(rail)
        for rail in {int(r) for r in d["rnics"]}:
            _, off = self.sim.flow_tables(host, rail, self.t_s)
            if any(f.installs > 1 for f in off):
                churn.add(rail)
        cfg = d["config"]
        containers = {v["representor"]: v["container"] for v in d["vfs"]}
        fallback = {
            containers[r["in"]]
            for r in d["rules"]
            if r["action"] == "encap_sw" and r["in"] in containers
        }
        return HostReport(
            host,
            rnic_state=state,
            gid_changed=frozenset(gid),
            bond_degraded=frozenset(bond),
            pcie_errors=frozenset(range(self.sim.index.rails))
            if cfg.get("pcie") == "error"
            else frozenset(),
            gpudirect_broken=frozenset(range(self.sim.index.rails))
            if cfg.get("gpudirect") == "error"
            else frozenset(),
            rdma_fallback=frozenset(fallback),
            hugepage_mismatch=cfg.get("hugepages") == "mismatch",
            offload_churn=frozenset(churn),
            peer_down=frozenset(peer),
        )


def live_pairs(sim: Any, pairs: Any, t_s: float) -> np.ndarray:
    """The pairs both of whose endpoints are ready and alive at ``t_s``: the pairs being probed."""
    p = np.asarray(pairs, np.int64).reshape(-1, 2)
    return p[sim.live_pairs(t_s, p)]


def sim_localizer(sim: Any, **kw: Any) -> Localizer:
    """A :class:`Localizer` that speaks the simulator's overlay names and traces every path id."""
    kw.setdefault("exoneration_path_ids", tuple(range(sim.n_path_ids)))
    return Localizer(
        sim.cluster,
        overlay_endpoint=sim_overlay_endpoint,
        overlay_component=sim_overlay_component,
        **kw,
    )
