"""The simulator as a localization state source: what :class:`skh.sim.scenario.Simulation`'s agents
answer, translated into the plain data :class:`skh.analysis.localize.Localizer` takes — the same
translation the real collectors of this package do for command output.

The simulator names overlay nodes ``<host>/vf<rail>-<ep>``, ``<host>/rep<rail>-<ep>``,
``<host>/ovs<rail>#<rule>`` and ``<host>/vtep<rail>``; :func:`sim_overlay_endpoint` and
:func:`sim_overlay_component` tell the localizer so.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from skh.analysis.localize import FlowRule, FlowTables, HostReport, OverlayTables, Trace
from skh.model import Endpoint

__all__ = [
    "SimSource",
    "sim_overlay_endpoint",
    "sim_overlay_component",
    "sim_flow_rule",
    "suspect_from_record",
    "live_pairs",
    "sim_localizer",
    "score",
    "localization_suite",
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


def suspect_from_record(sim: Any, rec: Any, t_s: float):
    """The suspect detection raises for a simulated fault at ``t_s``, from its ground truth: the
    affected pairs whose probes fail right now, on which path ids, with the fault's symptom;
    crashed or slow agents (and crashed containers, which miss heartbeats too) as endpoint
    health bits. For evaluating localization apart from detection."""
    import numpy as np

    from skh.analysis.localize import Suspect
    from skh.sim.faults import FAULT_SPECS, RowSet

    fault = sim.faults[rec.fault_id]
    spec = FAULT_SPECS[rec.type]
    pairs = live_pairs(sim, rec.affected_pairs, t_s)
    path_ids: dict[tuple[int, int], tuple[int, ...]] = {}
    if pairs.size:
        n = sim.n_path_ids
        src, dst = np.tile(pairs[:, 0], n), np.tile(pairs[:, 1], n)
        pid = np.repeat(np.arange(n), pairs.shape[0])
        rows = RowSet(sim.index, sim.eps, src, dst, pid, np.full(src.size, t_s))
        hit = (sim.engine.affected(fault, rows) & sim.engine.on_now(fault, rows.t_s)).reshape(n, -1)
        for j in np.flatnonzero(hit.any(axis=0)):
            path_ids[(int(pairs[j, 0]), int(pairs[j, 1]))] = tuple(
                int(k) for k in np.flatnonzero(hit[:, j])
            )
    agents: dict[int, int] = {}
    if spec.target == "container" and spec.symptom in ("agent_down", "agent_slow", "unreachable"):
        bits = 8 if spec.symptom == "agent_slow" else 1
        c = sim.eps.container_id(rec.component)
        mine = np.flatnonzero(sim.eps.container == c)
        alive = (sim.ep_ready_s[mine] <= t_s) & (sim.ep_end_s[mine] > t_s)
        agents = {int(e): bits for e in mine[alive]}
    symptom = {
        "unreachable": "unreachable",
        "flapping": "unreachable",
        "loss": "loss",
        "latency": "latency",
        "agent_down": "unreachable",
        "agent_slow": "latency",
    }[spec.symptom]
    if spec.symptom in ("agent_down", "agent_slow"):
        path_ids = {}  # the monitor's endpoint failed: detection withholds the pair verdicts
    return Suspect(
        tuple(sorted(path_ids)),
        symptom,
        int(rec.start_ns),
        flapping=spec.symptom == "flapping",
        path_ids=path_ids,
        agents=agents,
    )


def live_pairs(sim: Any, pairs: Any, t_s: float):
    """The pairs both of whose endpoints are ready and alive at ``t_s``: the pairs being probed."""
    import numpy as np

    p = np.asarray(pairs, np.int64).reshape(-1, 2)
    return p[sim.live_pairs(t_s, p)]


# ---------------------------------------------------------------------------------------------
# The localization suite: inject faults one (or one pair) at a time, localize, score


def sim_localizer(sim: Any, **kw: Any):
    """A :class:`Localizer` that speaks the simulator's overlay names and traces every path id."""
    from skh.analysis.localize import Localizer

    kw.setdefault("exoneration_path_ids", tuple(range(sim.n_path_ids)))
    return Localizer(
        sim.cluster,
        overlay_endpoint=sim_overlay_endpoint,
        overlay_component=sim_overlay_component,
        **kw,
    )


def _same(component: str, truth: str) -> bool:
    # verdicts name a container job/container; the simulator names it by its (unique) name
    return component == truth or component.endswith("/" + truth)


def score(verdicts: Any, truths: Any) -> bool:
    """Right when the verdicts name exactly the true components, each with certainty."""
    if not verdicts or any(not v.certain for v in verdicts):
        return False
    got = [v.component for v in verdicts]
    return all(any(_same(g, t) for t in truths) for g in got) and all(
        any(_same(g, t) for g in got) for t in truths
    )


class _Timed:
    """A state source that keeps the time spent answering apart (the real commands' share)."""

    def __init__(self, inner: SimSource) -> None:
        import time

        self._inner, self._clock, self.spent_s = inner, time.perf_counter, 0.0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)

        def timed(*a: Any) -> Any:
            t0 = self._clock()
            try:
                return fn(*a)
            finally:
                self.spent_s += self._clock() - t0

        return timed


def localization_suite(
    sim: Any,
    *,
    trials: int = 5,
    types: Any = None,
    both_layers: bool = True,
    seed: int = 0,
    t0_s: float = 10.0,
) -> list[dict]:
    """Run every fault type ``trials`` times (and, with ``both_layers``, every pair of an
    endpoint-side and a fabric fault once) through the localizer. Each fault is active for 3 s
    and localized 1 s after its onset with the suspect detection would raise
    (:func:`suspect_from_record`). Faults that touch no probed pair are redrawn (they are not
    detectable); a fault whose pairs all fail harder because of the other fault of its pair is
    marked ``masked`` (no detector can see it). One result dict per fault (group)."""
    import time

    import numpy as np

    from skh.sim.faults import FAULT_SPECS, SIMULATED_TYPES, Fault

    rng = np.random.default_rng(seed)
    loc = sim_localizer(sim, rnic_dump_interval_s=0.0)
    n_ep = max(1, len(sim.cluster.endpoints))
    rank = {"latency": 0, "loss": 1, "unreachable": 2}
    out: list[dict] = []
    t = float(t0_s)

    def run(records: list, ts: float, label: str) -> None:
        sus = [suspect_from_record(sim, r, ts) for r in records]
        aff: set = set()
        for s in sus:
            aff |= set(s.pairs)
        lp = live_pairs(sim, sim.pairs, ts)
        codes = lp[:, 0] * n_ep + lp[:, 1]
        bad = np.array([a * n_ep + b for a, b in aff], np.int64)
        healthy = lp[~np.isin(codes, bad)]
        masked = False
        if len(sus) == 2:
            for a, b in ((0, 1), (1, 0)):
                sa, sb = sus[a], sus[b]
                if (
                    sa.pairs
                    and set(sa.pairs) <= set(sb.pairs)
                    and rank[sb.symptom] >= rank[sa.symptom]
                    and not sa.agents
                ):
                    masked = True
        src = _Timed(SimSource(sim, t_s=ts))
        t1 = time.perf_counter()
        verdicts = loc.localize(sus, src, healthy_pairs=healthy, now_ns=sim.clock.wall_ns(ts))
        total = time.perf_counter() - t1
        out.append(
            {
                "label": label,
                "truth": [r.component for r in records],
                "ok": score(verdicts, [r.component for r in records]),
                "masked": masked,
                "pairs": len(aff),
                "localize_ms": (total - src.spent_s) * 1e3,
                "with_source_ms": total * 1e3,
                "verdicts": [
                    (v.layer, v.component, v.failure_type.name, len(v.pairs), v.certain)
                    for v in verdicts
                ],
            }
        )

    for ft in types or list(SIMULATED_TYPES):
        cands = sim.candidates(ft)
        if not cands:
            continue
        for _ in range(trials):
            for _attempt in range(30):
                comp = cands[int(rng.integers(len(cands)))]
                rec = sim.inject(Fault(ft, comp, t, t + 3.0))
                ts, t = t + 1.0, t + 4.0
                s = suspect_from_record(sim, rec, ts)
                if s.pairs or s.agents:
                    run([rec], ts, ft.name)
                    break
    if both_layers:
        over = [
            f
            for f in SIMULATED_TYPES
            if FAULT_SPECS[f].target in ("container", "host", "rnic")
            and FAULT_SPECS[f].symptom not in ("agent_down", "agent_slow")
        ]
        under = [f for f in SIMULATED_TYPES if FAULT_SPECS[f].target in ("link", "switch")]
        k = 0
        for o in over:
            for u in under:
                for _attempt in range(10):
                    k += 1
                    a, b = sim.inject_both_layers(o, u, t, t + 3.0, seed=seed * 1000 + k)
                    ts, t = t + 1.0, t + 4.0
                    sa, sb = suspect_from_record(sim, a, ts), suspect_from_record(sim, b, ts)
                    if (sa.pairs or sa.agents) and (sb.pairs or sb.agents):
                        run([a, b], ts, f"{o.name}+{u.name}")
                        break
    return out


def end_to_end_suite(
    sim: Any,
    *,
    types: Any = None,
    trials: int = 1,
    warmup_s: int = 150,
    active_s: int = 30,
    gap_s: int = 45,
    seed: int = 0,
) -> list[dict]:
    """Faults one after another on one running simulation, detected by the real
    :class:`skh.analysis.detect.Detector` and localized from its suspect events (with the failing
    path ids read from the recent probe records). One result dict per injected fault:
    ``detected`` (an event touched the fault's pairs or endpoints while it was on), ``ttd_s``
    (seconds to the first such event), ``ok`` and ``ttl_s`` (seconds to the certain verdict)."""
    import numpy as np

    from skh.analysis.detect import Detector
    from skh.analysis.localize import Suspect, failing_path_ids
    from skh.sim.faults import SIMULATED_TYPES, Fault

    rng = np.random.default_rng(seed)
    det = Detector()
    loc = sim_localizer(sim)
    recent: list[np.ndarray] = []

    def step() -> list:
        nonlocal recent
        s = sim.step(1)
        det.ingest(s.probes)
        det.heartbeat(s.heartbeats, sim.clock.now_ns)
        recent = [*recent[-4:], s.probes]
        return det.tick(sim.clock.now_ns)

    for _ in range(warmup_s):
        step()
    out: list[dict] = []
    for ft in types or list(SIMULATED_TYPES):
        cands = sim.candidates(ft)
        for _ in range(trials):
            t = sim.clock.now_s
            rec = None
            for _attempt in range(30):
                comp = cands[int(rng.integers(len(cands)))]
                probe = suspect_from_record(
                    sim, sim.inject(Fault(ft, comp, t + 1.0, t + 1.0 + active_s)), t + 2.0
                )
                rec = sim.ground_truth[-1]
                if probe.pairs or probe.agents:
                    break
                # nothing to see: retire it
                sim.faults[-1] = Fault(ft, comp, t + 1.0, t + 1.0 + 1e-3)
                rec = None
            if rec is None:
                continue
            mine_pairs = {tuple(p) for p in np.asarray(rec.affected_pairs).tolist()}
            mine_eps = (
                set(np.flatnonzero(sim.eps.container == sim.eps.container_id(comp)).tolist())
                if (sim.faults[-1].spec.target == "container")
                else set()
            )
            result = {
                "label": ft.name,
                "truth": [comp],
                "detected": False,
                "ok": False,
                "verdicts": [],
                "ttd_s": None,
                "ttl_s": None,
                "rounds": 0,
            }
            held: list = []
            for _s in range(active_s):
                events = step()
                hit = [
                    e
                    for e in events
                    if set(map(tuple, e.pairs)) & mine_pairs or set(e.endpoints) & mine_eps
                ]
                if not hit and not held:
                    continue
                # as the pipeline does: each round localizes what detection raised so far, until
                # a round names culprits with certainty (a first round may lack evidence a later
                # event or a later look brings, e.g. an agent's missed heartbeats)
                held += hit
                probes = np.concatenate(recent)
                sus = [
                    Suspect.from_event(e, path_ids=failing_path_ids(probes, e.pairs)) for e in held
                ]
                now = sim.clock.now_s
                lp = live_pairs(sim, sim.pairs, now)
                bad = {p for s in sus for p in s.pairs}
                healthy = np.array(
                    [p for p in map(tuple, lp.tolist()) if p not in bad], np.int64
                ).reshape(-1, 2)
                verdicts = loc.localize(
                    sus, SimSource(sim, t_s=now), healthy_pairs=healthy, now_ns=sim.clock.now_ns
                )
                if not result["detected"]:
                    result.update(detected=True, ttd_s=round(now - (t + 1.0), 1))
                result.update(
                    ok=score(verdicts, [comp]),
                    rounds=result.get("rounds", 0) + 1,
                    ttl_s=round(now - (t + 1.0), 1),
                    verdicts=[
                        (v.layer, v.component, v.failure_type.name, len(v.pairs), v.certain)
                        for v in verdicts
                    ],
                )
                if all(v.certain for v in verdicts):
                    break
            out.append(result)
            # let the fault end and the detector's incidents clear before the next one
            while sim.clock.now_s < t + 1.0 + active_s + gap_s:
                step()
    return out
