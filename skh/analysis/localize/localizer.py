"""The localizer: one round turns suspects into verdicts, step by step (the package doc has the
steps); each step asks the :class:`~skh.analysis.localize.source.StateSource` only what it needs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from skh.analysis.localize.alerts import merge_verdicts
from skh.analysis.localize.classify import classify_underlay
from skh.analysis.localize.data import (
    SEVERITY_OF,
    SYMPTOM_RANK,
    FlowDiff,
    FlowRule,
    HostReport,
    Layer,
    OverlayTables,
    OverlayWalk,
    Pair,
    Symptom,
    Trace,
    Verdict,
)
from skh.analysis.localize.endpoint import (
    Finding,
    dead_edge_finding,
    flow_finding,
    host_board_finding,
    host_board_state,
    one_way_in,
    persisting,
    relevant_diff,
    report_finding,
)
from skh.analysis.localize.overlay import host_of, walk_overlay
from skh.analysis.localize.source import StateSource
from skh.analysis.localize.suspects import DEAD_BITS, Suspect
from skh.analysis.localize.underlay import (
    UnderlayCulprit,
    fill_silent,
    known_elements,
    last_answer_lost,
    link_name,
    silent_switches,
    vote,
)
from skh.errors import ConfigError
from skh.failures import BECOMES, FailureType
from skh.model import Cluster, Endpoint

__all__ = ["Localizer", "default_overlay_endpoint"]

log = logging.getLogger(__name__)


def default_overlay_endpoint(ep: Endpoint) -> tuple[str, str]:
    """An endpoint's overlay node (its VF) and the key forwarding tables know it by."""
    return f"{ep.host}/vf:{ep.container}.{ep.rail}", ep.ip or ep.name


@dataclass(slots=True)
class _Work:
    """The pairs of one round and what each step found about them."""

    symptom: dict[Pair, Symptom]
    first_seen: dict[Pair, int]
    flapping: set[Pair]
    refused: set[Pair]
    path_ids: dict[Pair, tuple[int, ...]]
    agents: dict[int, int]
    left: set[Pair]
    first_seen_any: int
    now_s: float = 0.0
    #: sources of the pairs probed without trouble right now (sorted endpoint ids)
    healthy_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: culprits already open (alerts): tried first
    known: tuple[Verdict, ...] = ()
    #: endpoints whose own probes came back lately: their agents are alive
    responsive: frozenset[int] = frozenset()
    #: destinations of the pairs probed without trouble right now (sorted endpoint ids)
    healthy_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: the round's overlay tables, by host (cached answers)
    tables: Callable[[str], OverlayTables | None] | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    failing: list[Trace] = field(default_factory=list)
    healthy: list[Trace] = field(default_factory=list)
    #: underlay culprits the vote could not single out; endpoints are checked before they are named
    deferred: list[tuple[UnderlayCulprit, list[Trace]]] = field(default_factory=list)
    #: hosts whose endpoint check reached the host board this round (a tie between two hosts
    #: is called only once both were checked)
    board_checked: set[str] = field(default_factory=set)


#: types whose only symptom is delay (Table 1's "high latency" rows)
_LATENCY_ONLY = {
    FailureType.RNIC_FIRMWARE_NOT_RESPONDING,
    FailureType.OFFLOADING_FAILURE,
    FailureType.PCIE_NIC_ERROR,
    FailureType.GPUDIRECT_RDMA_ERROR,
    FailureType.NOT_USING_RDMA,
    FailureType.REPETITIVE_FLOW_OFFLOADING,
    FailureType.SUBOPTIMAL_FLOW_OFFLOADING,
    FailureType.HUGEPAGE_MISCONFIG,
    FailureType.CC_ISSUE,
}


#: outages that stop forwarding at their element: the traces of the pairs they fail stop there,
#: so traces that cross the element again say the outage is not there now (a GID change or a
#: broken bond fails probes whose traces get through)
_FORWARDING_OUTAGES = frozenset(
    {
        FailureType.SWITCH_PORT_DOWN,
        FailureType.SWITCH_PORT_FLAPPING,
        FailureType.SWITCH_OFFLINE,
        FailureType.RNIC_HW_FAILURE,
        FailureType.RNIC_PORT_DOWN,
        FailureType.RNIC_PORT_FLAPPING,
    }
)

#: flow labels beyond the probed ones a failing pair is traced on, to clear the ECMP paths beside
#: a broken one
_EXTRA_LABELS = 4

#: a host-report reading taken this long before a pair's first failed probe still counts for
#: it: the fault began before the probe that first saw it (up to a probe interval)
_READING_GRACE_S = 2.0

#: RX error counts (:attr:`HostReport.rx_errors`) of two readings at least this far apart tell
#: whether an RNIC takes corrupted frames; it does when its count grew by at least
#: ``_RX_ERRORS_GROWN`` (a CRC fault's 0.05-2 % of frames is tens to thousands a second), and it
#: does not when by at most ``_RX_ERRORS_FLAT`` (a healthy port's count ticks a few times a
#: day: a stray error between two readings must not clear the tie's other end wrongly)
_RX_ERRORS_SPAN_S = 5.0
_RX_ERRORS_GROWN = 10
_RX_ERRORS_FLAT = 2


class Localizer:
    """Localizes suspects on one cluster. Keeps between rounds only the RNIC dumps (rate limit)
    and the counter readings it compares over time.

    Parameters
    ----------
    cluster:
        the model: endpoints (ids of the pairs), hosts, RNICs and the fabric (ECMP paths).
    overlay_endpoint:
        an endpoint's overlay node and forwarding key, as the state source names them.
    overlay_component:
        maps an overlay hop to the component that holds it (e.g. the RNIC whose eswitch holds an
        offloaded vswitch rule); None keeps the hop's own name.
    rnic_dump_interval_s:
        at most one RNIC flow-table dump per RNIC in this many seconds; a dump refused by the
        limit reuses the last diff.
    clean_dump_interval_s:
        an RNIC whose last dump was clean is dumped again after this long when it is the edge of
        a latency culprit again (an intermittent offload fault evicts its flows only some of the
        time); at most one dump per RNIC in this many seconds (two when it finds something).
    max_exoneration_traces:
        healthy pairs traced per round to clear links (nearest to the failing pairs first).
    exoneration_path_ids:
        the path ids each healthy pair is traced on.
    flap_window_s:
        a port whose carrier-down count grows within this long of a reading taken during the
        failure is flapping.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        overlay_endpoint: Callable[[Endpoint], tuple[str, str]] = default_overlay_endpoint,
        overlay_component: Callable[[str], str | None] | None = None,
        rnic_dump_interval_s: float = 60.0,
        clean_dump_interval_s: float = 10.0,
        max_exoneration_traces: int = 256,
        exoneration_path_ids: Sequence[int] = (0,),
        flap_window_s: float = 120.0,
    ) -> None:
        if rnic_dump_interval_s < 0:
            raise ConfigError(
                "The 'rnic_dump_interval_s' parameter of Localizer must be >= 0. "
                f"Got {rnic_dump_interval_s!r} instead."
            )
        if clean_dump_interval_s < 0:
            raise ConfigError(
                "The 'clean_dump_interval_s' parameter of Localizer must be >= 0. "
                f"Got {clean_dump_interval_s!r} instead."
            )
        if max_exoneration_traces < 0:
            raise ConfigError(
                "The 'max_exoneration_traces' parameter of Localizer must be >= 0. "
                f"Got {max_exoneration_traces!r} instead."
            )
        if flap_window_s <= 0:
            raise ConfigError(
                f"The 'flap_window_s' parameter of Localizer must be > 0. Got {flap_window_s!r}."
            )
        if not exoneration_path_ids:
            raise ConfigError(
                "The 'exoneration_path_ids' parameter of Localizer must name at least one path id."
            )
        self.cluster = cluster
        self.overlay_endpoint = overlay_endpoint
        self.overlay_component = overlay_component
        self.rnic_dump_interval_s = float(rnic_dump_interval_s)
        self.clean_dump_interval_s = float(clean_dump_interval_s)
        self.max_exoneration_traces = int(max_exoneration_traces)
        self.exoneration_path_ids = tuple(int(p) for p in exoneration_path_ids)
        self.flap_window_s = float(flap_window_s)
        self._dumps: dict[tuple[str, int], tuple[float, FlowDiff | None, FlowDiff | None]] = {}
        #: (host, rail) -> carrier-down counts seen, (time, count), oldest first
        self._port_counts: dict[tuple[str, int], list[tuple[float, int]]] = {}
        #: (host, rail) -> which end read its port down ("rnic": the RNIC's own port; "peer":
        #: no light from the switch), (time, which), oldest first
        self._port_downs: dict[tuple[str, int], list[tuple[float, str]]] = {}
        #: (host, rail) -> RX error counts seen, (time, count), oldest first
        self._rx_counts: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self._switch_paths: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        self._n_indexed = 0
        self._rnic_of: dict[tuple[str, int], tuple[int, int]] | None = None
        self._ep_rnic = np.zeros(0, np.int64)
        self._ep_tor = np.zeros(0, np.int64)
        self._vf_owner: dict[str, Endpoint] = {}
        self._generation = cluster.generation
        self._index()

    # -- indexes ------------------------------------------------------------------------------
    def _index(self) -> None:
        """Dense RNIC and ToR ids per endpoint (for picking exoneration pairs with numpy) and the
        owner of every VF node; extended as endpoints register, rebuilt when ids leave or are
        given again (a VF of an endpoint gone has no owner, unless a live one took it over)."""
        eps = self.cluster.endpoints
        if self._generation != self.cluster.generation:
            self._generation = self.cluster.generation
            self._n_indexed = 0
            self._ep_rnic = self._ep_tor = np.zeros(0, np.int64)
            self._vf_owner = {}
        n0 = self._n_indexed
        if len(eps) == n0:
            return
        if self._rnic_of is None:
            self._rnic_of = {}
            tors: dict[str, int] = {}
            for h in self.cluster.fabric.hosts.values():
                for r in h.rnics:
                    self._rnic_of[(h.name, r.rail)] = (
                        len(self._rnic_of),
                        tors.setdefault(r.tor, len(tors)),
                    )
        gone = self.cluster.gone
        new = [e for e in eps[n0:] if e.ep_id not in gone]
        # a gone id has no RNIC (-1): the pipeline never hands one over
        rnic = np.full(len(eps) - n0, -1, np.int64)
        tor = rnic.copy()
        if new:
            at = np.array([e.ep_id for e in new], np.int64) - n0
            ids = np.array([self._rnic_of[(e.host, e.rail)] for e in new], np.int64)
            rnic[at], tor[at] = ids[:, 0], ids[:, 1]
        self._ep_rnic = np.concatenate([self._ep_rnic, rnic])
        self._ep_tor = np.concatenate([self._ep_tor, tor])
        self._vf_owner.update((self.overlay_endpoint(e)[0], e) for e in new)
        self._n_indexed = len(eps)

    def _ep(self, ep_id: int) -> Endpoint:
        return self.cluster.endpoints[ep_id]

    def _expected_paths(self, tr: Trace) -> list[tuple[str, ...]]:
        fab = self.cluster.fabric
        a, b = self._ep(tr.pair[0]), self._ep(tr.pair[1])
        ra, rb = fab.rnic(a.host, a.rail), fab.rnic(b.host, b.rail)
        k = (ra.tor, rb.tor)
        sw = self._switch_paths.get(k)
        if sw is None:
            sw = self._switch_paths[k] = fab.switch_paths(ra.tor, rb.tor)
        return [(ra.key, *p, rb.key) for p in sw]

    # -- the round ----------------------------------------------------------------------------
    def localize(
        self,
        suspects: Sequence[Suspect],
        source: StateSource,
        *,
        healthy_pairs: np.ndarray | None = None,
        now_ns: int | None = None,
        now_s: float | None = None,
        known: Sequence[Verdict] = (),
        responsive: Iterable[int] | None = None,
    ) -> list[Verdict]:
        """Localize one round of suspects; returns one verdict per culprit (and one for what no
        culprit explains). ``healthy_pairs`` (n × 2 endpoint ids) are pairs probed without
        trouble right now; some are traced to clear the links they cross. ``known`` are the
        culprits already open (the alerts): they are tried first, so a round with several
        faults explains away what each known one explains before it looks for new ones.
        ``responsive`` are endpoints whose own probes came back lately (an agent detection found
        missing heartbeats from is late, not crashed, while its probes still come back)."""
        self._index()
        now_ns = time.time_ns() if now_ns is None else int(now_ns)
        now_s = now_ns / 1e9 if now_s is None else float(now_s)
        healthy = np.asarray(
            np.zeros((0, 2), np.int64) if healthy_pairs is None else healthy_pairs, np.int64
        ).reshape(-1, 2)
        w = _Work(
            {},
            {},
            set(),
            set(),
            {},
            {},
            set(),
            min((s.first_seen_ns for s in suspects), default=now_ns),
            now_s,
            np.unique(healthy[:, 0]),
            tuple(known),
            frozenset(int(e) for e in (responsive if responsive is not None else ())),
            healthy_dst=np.unique(healthy[:, 1]),
        )
        n_ep = len(self.cluster.endpoints)
        for s in suspects:
            for p in s.pairs:
                if not (0 <= p[0] < n_ep and 0 <= p[1] < n_ep):
                    raise ConfigError(f"Localizer.localize: pair {p!r} names an unknown endpoint.")
                if SYMPTOM_RANK[s.symptom] >= SYMPTOM_RANK.get(w.symptom.get(p, "latency"), 0):
                    w.symptom[p] = s.symptom
                w.first_seen[p] = min(w.first_seen.get(p, s.first_seen_ns), s.first_seen_ns)
                if s.flapping:
                    w.flapping.add(p)
                pids = s.path_ids.get(p)
                if pids:
                    w.path_ids[p] = tuple(sorted(set(w.path_ids.get(p, ())) | set(pids)))
            for e, bits in s.agents.items():
                if not 0 <= e < n_ep:
                    raise ConfigError(f"Localizer.localize: agent endpoint {e!r} is unknown.")
                w.agents[e] = w.agents.get(e, 0) | int(bits)
            w.refused |= set(s.refused)
        w.left = set(w.symptom)
        if not w.left and not w.agents:
            return []
        reports: dict[str, HostReport | None] = {}

        def report(host: str) -> HostReport | None:
            if host not in reports:
                reports[host] = source.host_report(host)
            return reports[host]

        overlay_cache: dict[str, OverlayTables | None] = {}

        def tables(host: str) -> OverlayTables | None:
            if host not in overlay_cache:
                overlay_cache[host] = source.overlay_tables(host)
            return overlay_cache[host]

        w.tables = tables
        self._overlay_step(w, tables, report, now_ns)
        self._agent_step(w, tables, report, now_ns)
        self._underlay_step(w, source, report, healthy_pairs, now_ns, now_s)
        if w.left:
            self._endpoint_step(w, source, report, now_ns, now_s)
        for c, traces in w.deferred:
            self._emit_underlay(w, c, traces, source, report, now_ns, now_s)
        if w.left:
            self._residual_step(w, source, report, now_ns, now_s)
        if w.left and w.known:
            self._known_step(w, now_ns)
        self._evidence_step(w, set(w.symptom), report, now_ns)
        if w.left:
            pairs = sorted(w.left)
            self._add_verdict(
                w,
                pairs,
                "unexplained",
                "",
                "",
                FailureType.UNKNOWN,
                now_ns,
                evidence={
                    "reason": "overlay chains intact, no uncleared underlay element, "
                    "endpoints report nothing"
                },
            )
        out = merge_verdicts(w.verdicts)
        log.debug(
            "localized %d pairs, %d agents: %s",
            len(w.symptom),
            len(w.agents),
            ", ".join(f"{v.layer}:{v.component}:{v.failure_type.name}" for v in out),
        )
        return out

    # -- steps --------------------------------------------------------------------------------
    def _overlay_step(self, w: _Work, tables, report, now_ns: int) -> None:
        groups: dict[tuple[str, str], list[OverlayWalk]] = {}
        back_breaks: list[OverlayWalk] = []
        for p in sorted(w.left):
            src, dst = self._ep(p[0]), self._ep(p[1])
            s_node, _ = self.overlay_endpoint(src)
            d_node, d_key = self.overlay_endpoint(dst)
            if tables(host_of(s_node)) is None:
                continue  # no overlay state from the source host: nothing to walk
            res = walk_overlay(p, s_node, d_key, d_node, tables)
            if res.status == "ok" and tables(host_of(d_node)) is not None:
                # a probe needs its reply too: walk the way back. Only a loop or a down node
                # counts there: a host programs rules only for the peers it sends to, so a
                # missing way back may just be a peer that never sends
                _, s_key = self.overlay_endpoint(src)
                back = walk_overlay(p, d_node, s_key, s_node, tables)
                if back.status == "break":
                    back_breaks.append(back)
                res = back if back.status in ("loop", "down") else res
            if res.status != "ok":
                groups.setdefault((res.status, res.hop), []).append(res)
        # ... but a way back that breaks where a black hole is already named (an open alert, or
        # this round's own walks) is that black hole's reply side, whatever round it comes in
        named = {hop for status, hop in groups if status == "break"}
        known = {
            v.component
            for v in w.known
            if v.layer == "overlay" and v.failure_type == FailureType.OVERLAY_BLACKHOLE
        }
        for back in back_breaks:
            if back.hop in named or self._overlay_comp(back.hop) in known:
                groups.setdefault(("break", back.hop), []).append(back)
        walked = {x.pair for walks in groups.values() for x in walks}
        for (status, hop), walks in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            pairs = [x.pair for x in walks]
            # a probe and its reply cross both directions: the reverse of a broken pair fails
            # for the same reason, whatever its own (optimistic) back walk said
            pairs += sorted({(b, a) for a, b in pairs} & w.left - walked)
            owner = self._owner(hop, tables)
            local = hop.split("/", 1)[1] if "/" in hop else hop
            kind = local.split(":", 1)[0] if ":" in local else local.rstrip("0123456789-#")
            evidence = {"walk": status, "hop": hop, "chain": list(walks[0].chain)}
            if (
                owner is not None
                and status in ("down", "break")
                and self._container_gone(owner, hop, tables, report)
            ):
                comp, ckind, ftype = (
                    f"{owner.job}/{owner.container}",
                    "container",
                    FailureType.CONTAINER_CRASH,
                )
            else:
                ftype = (
                    FailureType.OVERLAY_LOOP if status == "loop" else FailureType.OVERLAY_BLACKHOLE
                )
                comp = self._overlay_comp(hop)
                ckind = "vswitch" if comp != hop else kind
            self._add_verdict(w, pairs, "overlay", comp, ckind, ftype, now_ns, evidence=evidence)
            w.left -= set(pairs)

    def _overlay_comp(self, hop: str) -> str:
        """The component an overlay verdict at ``hop`` names."""
        return (self.overlay_component(hop) if self.overlay_component else None) or hop

    def _owner(self, node: str, tables) -> Endpoint | None:
        """The endpoint whose VF ``node`` is, or whose VF it delivers to (its representor)."""
        ep = self._vf_owner.get(node)
        if ep is not None:
            return ep
        t = tables(host_of(node))
        if t is None:
            return None
        owners = {
            self._vf_owner[n] for n in t.next_hop.get(node, {}).values() if n in self._vf_owner
        }
        return owners.pop() if len(owners) == 1 else None

    def _container_gone(self, ep: Endpoint, hop: str, tables, report) -> bool:
        rep = report(ep.host)
        if rep is not None and ep.container in rep.containers_dead:
            return True
        t = tables(ep.host)
        if t is None:
            return False
        vf = self.overlay_endpoint(ep)[0]
        # its VF (or the representor in front of it) is down, or the VF is gone from the state
        return hop in t.down or vf in t.down or vf not in t.next_hop

    def _agent_step(self, w: _Work, tables, report, now_ns: int) -> None:
        crashed = {v.component for v in w.verdicts if v.failure_type == FailureType.CONTAINER_CRASH}
        blamed: dict[tuple[str, str, FailureType], list[Pair]] = {}
        endpoints: dict[tuple[str, str, FailureType], set[int]] = {}
        # late agents that answer nothing: silent like a crashed one, but their process lives
        hung: set[tuple[str, str, FailureType]] = set()
        # endpoints detection already found unhealthy (heartbeats, refused, delays)
        for e, bits in sorted(w.agents.items()):
            ep = self._ep(e)
            name = f"{ep.job}/{ep.container}"
            if name in crashed:
                continue
            node = self.overlay_endpoint(ep)[0]
            # an agent whose own probes still come back is alive, however many heartbeats it
            # missed: late, not crashed
            dead = bool(bits & DEAD_BITS) and e not in w.responsive
            if dead and self._agent_alive(ep, report):
                # its host sees the process alive but stopped or stuck (SIGSTOP, a D state)
                dead = False
                hung.add((ep.job, ep.container, FailureType.LATE_AGENT))
            if dead and self._container_gone(ep, node, tables, report):
                key = (ep.job, ep.container, FailureType.CONTAINER_CRASH)
            else:
                key = (
                    ep.job,
                    ep.container,
                    FailureType.AGENT_CRASH if dead else FailureType.LATE_AGENT,
                )
            endpoints.setdefault(key, set()).add(e)
            blamed.setdefault(key, [])
        by_ep = {e: k for k, es in endpoints.items() for e in es}
        for p in sorted(w.left):
            src, dst = self._ep(p[0]), self._ep(p[1])
            hit = by_ep.get(p[1]) or by_ep.get(p[0])
            if hit is None and p in w.refused:
                hit = (dst.job, dst.container, FailureType.AGENT_CRASH)
            if hit is None:
                for ep in (dst, src):
                    rep = report(ep.host)
                    if rep is None:
                        continue
                    if ep.container in rep.agents_dead:
                        hit = (ep.job, ep.container, FailureType.AGENT_CRASH)
                    elif ep.container in rep.agents_late:
                        hit = (ep.job, ep.container, FailureType.LATE_AGENT)
                    if hit:
                        break
            if hit:
                blamed.setdefault(hit, []).append(p)
        for (job, container, ftype), pairs in blamed.items():
            eps = sorted(endpoints.get((job, container, ftype), ()))
            layer: Layer = "overlay" if ftype == FailureType.CONTAINER_CRASH else "agent"
            kind = "container" if ftype == FailureType.CONTAINER_CRASH else "agent"
            for p in pairs:
                w.symptom.setdefault(p, "unreachable")
            self._add_verdict(
                w,
                pairs,
                layer,
                f"{job}/{container}",
                kind,
                ftype,
                now_ns,
                evidence={
                    "refused": sum(p in w.refused for p in pairs),
                    "endpoints": eps,
                    "health_bits": {e: w.agents[e] for e in eps},
                },
                symptom=(
                    "latency"
                    if ftype == FailureType.LATE_AGENT and (job, container, ftype) not in hung
                    else "unreachable"
                ),
            )
            w.left -= set(pairs)

    @staticmethod
    def _agent_alive(ep: Endpoint, report) -> bool:
        """Whether the host report of ``ep``'s host lists its agent as late and not dead."""
        rep = report(ep.host)
        return (
            rep is not None
            and ep.container in rep.agents_late
            and ep.container not in rep.agents_dead
        )

    def _exoneration(self, failing: Sequence[Pair], healthy_pairs: np.ndarray | None) -> list[Pair]:
        if healthy_pairs is None or self.max_exoneration_traces == 0:
            return []
        hp = np.asarray(healthy_pairs, np.int64).reshape(-1, 2)
        if hp.size == 0:
            return []
        fp = np.asarray(failing, np.int64).reshape(-1, 2)
        fset = {tuple(x) for x in fp.tolist()}
        rn_f = np.unique(self._ep_rnic[fp.ravel()])
        tor_f = np.unique(self._ep_tor[fp.ravel()])
        rs, rd = self._ep_rnic[hp[:, 0]], self._ep_rnic[hp[:, 1]]
        ts, td = self._ep_tor[hp[:, 0]], self._ep_tor[hp[:, 1]]
        # nearest first: pairs sharing an RNIC with a failing pair clear its access link; pairs
        # sharing a ToR clear that ToR's uplinks and the spines behind them
        in_s, in_d = np.isin(rs, rn_f), np.isin(rd, rn_f)
        near_rnic = in_s | in_d
        near_tor = np.isin(ts, tor_f) | np.isin(td, tor_f)
        out: list[Pair] = []

        def take(p: Pair) -> bool:
            if p in fset:
                return False
            out.append(p)
            return True

        # spread the budget over the failing RNICs so one busy endpoint does not take it all
        per_rnic: dict[int, int] = {}
        cap = max(4, self.max_exoneration_traces // max(1, 2 * rn_f.size))
        for i in np.flatnonzero(near_rnic).tolist():
            key = int(rs[i]) if in_s[i] else int(rd[i])
            if per_rnic.get(key, 0) >= cap:
                continue
            if take((int(hp[i, 0]), int(hp[i, 1]))):
                per_rnic[key] = per_rnic.get(key, 0) + 1
        rest = np.flatnonzero(near_tor & ~near_rnic)
        budget = self.max_exoneration_traces - len(out)
        if budget > 0 and rest.size:
            # spread evenly over the candidates so every ToR and spine gets its share
            pick = rest[np.linspace(0, rest.size - 1, min(budget, rest.size)).astype(np.int64)]
            for i in np.unique(pick).tolist():
                take((int(hp[i, 0]), int(hp[i, 1])))
        return out[: self.max_exoneration_traces]

    def _underlay_step(
        self, w: _Work, source, report, healthy_pairs, now_ns: int, now_s: float
    ) -> None:
        if not w.left:
            return
        wanted = [(p, pid) for p in sorted(w.left) for pid in w.path_ids.get(p, (0,))]
        clear = [
            (p, pid)
            for p in self._exoneration(sorted(w.left), healthy_pairs)
            for pid in self.exoneration_path_ids
        ]
        # a pair that fails on some flows only (an unreachable ECMP path) carries others: a
        # trace of another flow label that reaches its destination clears the path it took. One
        # pair per pair of ToRs, on the probed labels it did not fail on and a few more (a
        # trace may use any flow label), so the paths beside a broken one are cleared
        seen: set[tuple[int, int]] = set()
        top = max(self.exoneration_path_ids) + 1
        extra = tuple(range(top, top + _EXTRA_LABELS))
        beside = []
        for p in sorted(w.left):
            if w.symptom.get(p) != "unreachable" or p in w.refused:
                continue
            tors = (int(self._ep_tor[p[0]]), int(self._ep_tor[p[1]]))
            if tors[0] == tors[1] or tors in seen:
                continue
            seen.add(tors)
            bad = w.path_ids.get(p, (0,))
            beside += [(p, pid) for pid in (*self.exoneration_path_ids, *extra) if pid not in bad]
        # a source that can take many traces at once (agents run them side by side) is told
        # all of them before the first is asked for; a trace that does not reach its
        # destination waits out its hops, so one at a time they would add up
        plan = getattr(source, "plan_traces", None)
        if plan is not None:
            plan([*wanted, *clear, *beside])
        failing = [t for p, pid in wanted if (t := source.traceroute(p, pid)) is not None]
        if not failing:
            return
        w.failing = failing
        for p, pid in clear:
            t = source.traceroute(p, pid)
            if t is not None:
                w.healthy.append(t)
        for p, pid in beside:
            t = source.traceroute(p, pid)
            if t is not None and t.reached:
                w.healthy.append(t)
        soft = [i for i, t in enumerate(failing) if w.symptom.get(t.pair) != "unreachable"]
        res = vote(failing, w.healthy, expected_paths=self._expected_paths, soft=soft)
        for c in res.culprits:
            traces = [failing[i] for i in sorted(c.explains)]
            if c.ambiguous:
                w.deferred.append((c, traces))
            else:
                self._emit_underlay(w, c, traces, source, report, now_ns, now_s)

    def _residual_step(self, w: _Work, source, report, now_ns: int, now_s: float) -> None:
        failing = [t for t in w.failing if t.pair in w.left]
        if not failing:
            return
        # what earlier culprits could not explain (partial faults, or pairs a delay-only culprit
        # left behind) is voted on again, on its own
        res = vote(failing, w.healthy, expected_paths=self._expected_paths)
        for c in res.culprits:
            self._emit_underlay(
                w, c, [failing[i] for i in sorted(c.explains)], source, report, now_ns, now_s
            )

    def _emit_underlay(self, w, c: UnderlayCulprit, traces, source, report, now_ns, now_s) -> None:
        pairs = sorted({t.pair for t in traces if t.pair in w.left})
        if not pairs:
            return
        evidence: dict[str, object] = {
            "votes": c.votes,
            "cleared_by": c.cleared_by,
            "partial": c.partial,
            "path": list(traces[0].nodes),
        }
        rnic = self._edge_rnic(c)
        symptom = self._worst(w, pairs)
        if rnic is not None:
            flapping = self._flaps(w, *rnic, pairs)
        else:
            flapping = any(p in w.flapping for p in pairs)
        if symptom == "unreachable" and all(t.reached for t in traces):
            # the pairs' outage is not there now: their traces cross the culprit again. An
            # outage that comes and goes is a flapping port; one named already is that one,
            # also when the traces cross it beside this culprit (a partial one the vote found
            # on the way while the known port, up now and crossed by healthy traces, is cleared)
            named = set(c.component.split("|")) | {c.component} | self._crossed(traces)
            again = self._known_outage(w, named, pairs)
            if again is not None:
                self._came_back(w, again, pairs, evidence, now_ns)
                return
            flapping = True
        if rnic is not None and not c.ambiguous:
            host, rail = rnic
            found = self._check_endpoint(w, host, rail, pairs, source, report, flapping)
            if found is not None:
                self._add_finding(w, pairs, found, now_ns, evidence)
                return
            # the RNIC at the link is fine: before blaming the switch port, the other endpoints
            # of these pairs may explain them (an edge no healthy trace clears is ambiguous)
            self._endpoint_step(w, source, report, now_ns, now_s, pairs=set(pairs))
            pairs = [p for p in pairs if p in w.left]
            if not pairs:
                return
            symptom = self._worst(w, pairs)
            if symptom == "unreachable":
                # nothing crosses the RNIC or its access link any more, and its report names
                # nothing: what its clear flags rule out decides (switch port, RNIC port, an
                # RNIC dead with its port up), the rest stays open
                flapping = flapping or self._flapped(
                    host, rail, report(host), now_s, since_s=now_s - self._failure_age_s(w, pairs)
                )
                found = dead_edge_finding(
                    report(host),
                    host,
                    rail,
                    tor=self.cluster.fabric.rnic(host, rail).tor,
                    flapping=flapping,
                    max_age_s=self._failure_age_s(w, pairs),
                    downs=self._downs_seen(host, rail, now_s - self._failure_age_s(w, pairs)),
                )
                self._add_finding(w, pairs, found, now_ns, evidence)
                return
        kind, comp = c.kind, c.component
        rx_end = (
            self._rx_errors_end(w, c, pairs, report, evidence)
            if c.ambiguous and symptom == "loss" and not flapping
            else None
        )
        if rx_end is not None:
            # the RNIC that takes the corrupted frames names the link they come in on
            c = replace(c, ambiguous=False, candidates=())
            kind = "link"
            comp = link_name(f"{rx_end[0]}:rnic{rx_end[1]}", self.cluster.fabric.rnic(*rx_end).tor)
        if rnic is not None and kind == "node":
            # an RNIC that loses or delays some probes: what its cable and port do (a dead RNIC
            # is unreachable), so the access link is named
            kind, comp = "link", link_name(c.component, self.cluster.fabric.rnic(*rnic).tor)
        ftype = classify_underlay(kind, symptom, flapping=flapping, partial=c.partial)
        ckind = "link" if kind == "link" else "switch"
        cands = c.candidates if (c.ambiguous or c.partial) else ()
        if rnic is not None and c.partial and not c.ambiguous and symptom == "loss":
            # a link that loses some probes ties with its own RNIC by construction (every trace
            # over the one crosses the other; noisy traces rarely show where loss sets in). The
            # RNIC's report, probe pattern and tables said nothing above; when its port reads
            # up right now and did not flap, what loses is the cable or the switch port: the
            # link, as for a culprit no healthy flow crossed
            rep = report(rnic[0])
            age = self._failure_age_s(w, pairs) + _READING_GRACE_S
            if (
                not flapping
                and rep is not None
                and rep.known("rnic_state", max_age_s=age)
                and rep.rnic_state.get(rnic[1], "up") == "up"
            ):
                cands = tuple(x for x in cands if x != f"{rnic[0]}:rnic{rnic[1]}")
        if rnic is not None and symptom == "latency" and not cands:
            # a cable does not add delay; a queue or the RNIC does. With the RNIC's report and
            # tables clean right now, it stays a candidate (an intermittent offload problem
            # shows only some of the time)
            cands = (f"{rnic[0]}:rnic{rnic[1]}",)
        self._add_verdict(
            w,
            pairs,
            "underlay",
            comp,
            ckind,
            ftype,
            now_ns,
            evidence=evidence,
            candidates=tuple(x for x in cands if x != comp),
        )
        self._settle(w, pairs, ftype)

    def _rx_errors_end(
        self, w: _Work, c: UnderlayCulprit, pairs: Sequence[Pair], report, evidence: dict
    ) -> tuple[str, int] | None:
        """A lossy culprit the vote could not single out, tied with RNICs or their access links
        (one failing pair between two RNICs that nothing else crosses: every element of its
        path explains it): a link that corrupts frames makes the RNIC *receiving* them count
        RX errors, and the switch drops what it receives corrupted, so the one tied RNIC whose
        count grew during the failure while every other tied RNIC's stayed flat takes the
        corrupted frames: the link into it. Any tied RNIC whose counts are unknown (a flag
        missing, one reading only) leaves the tie as it is."""
        ends = {
            (host, int(rail))
            for el in (c.component, *c.candidates)
            for part in el.split("|")
            for host, _, rail in [part.rpartition(":rnic")]
            if host and rail.isdigit()
        }
        if len(ends) < 2:
            return None
        since_s = w.now_s - self._failure_age_s(w, pairs) - _READING_GRACE_S
        # every end's reading is kept, also when another end's leaves this round undecided
        grown = {(h, r): self._rx_growth(h, r, report(h), w.now_s, since_s) for h, r in ends}
        if any(g is None for g in grown.values()):
            return None
        hot = [k for k, g in grown.items() if g >= _RX_ERRORS_GROWN]
        if len(hot) != 1 or any(g > _RX_ERRORS_FLAT for k, g in grown.items() if k != hot[0]):
            return None
        evidence["rx_errors_grew"] = {f"{h}:rnic{r}": g for (h, r), g in sorted(grown.items())}
        return hot[0]

    def _rx_growth(
        self, host: str, rail: int, rep: HostReport | None, now_s: float, since_s: float
    ) -> int | None:
        """How much the RNIC's RX error count grew between the first and the last reading taken
        since ``since_s`` (readings are remembered across rounds); None without two readings
        at least :data:`_RX_ERRORS_SPAN_S` apart, or when the count went back (a driver
        reload resets it)."""
        seen = self._rx_counts.setdefault((host, rail), [])
        if rep is not None and rep.known("rx_errors") and rail in rep.rx_errors:
            got = (now_s - float(rep.age_s.get("rx_errors", 0.0)), int(rep.rx_errors[rail]))
            if got not in seen:
                seen.append(got)
                seen.sort()
        seen[:] = [x for x in seen if x[0] >= now_s - self.flap_window_s]
        during = [x for x in seen if since_s - 1e-6 <= x[0] <= now_s + 1e-6]
        if len(during) < 2 or during[-1][0] - during[0][0] < _RX_ERRORS_SPAN_S:
            return None
        g = during[-1][1] - during[0][1]
        return g if g >= 0 else None

    def _known_outage(self, w: _Work, elements: set[str], pairs: Sequence[Pair]) -> Verdict | None:
        """An open alert of an outage that stops forwarding at one of ``elements`` (a culprit,
        or the RNIC of its access link) on some of these pairs: pairs it held, or pairs with an
        end on its RNIC (every path of such a pair crosses it, so a port that flaps fails them
        all, whichever pairs the alert was opened on)."""
        ends = {f"{h}:rnic{r}" for p in pairs for h, r in self._rnics_of(p)}
        for v in w.known:
            if (
                v.symptom == "unreachable"
                and v.failure_type in _FORWARDING_OUTAGES
                and v.component in elements
                and (set(v.pairs) & set(pairs) or v.component.partition("|")[0] in ends)
            ):
                return v
        return None

    def _came_back(
        self, w: _Work, again: Verdict, pairs: Sequence[Pair], evidence: Mapping, now_ns: int
    ) -> None:
        """``pairs`` failed through the open outage ``again`` and cross it again: a port that
        came back is flapping (the alert is refined); any other dead element that forwards
        again is over (its alert resolves when no round confirms it), nothing new to name."""
        if again.failure_type in {*BECOMES, *BECOMES.values()}:
            self._add_verdict(
                w,
                pairs,
                again.layer,
                again.component,
                again.component_kind,
                BECOMES.get(again.failure_type, again.failure_type),
                now_ns,
                evidence={**evidence, "came_back": True},
            )
        w.left -= set(pairs)

    def _known_step(self, w: _Work, now_ns: int) -> None:
        """Outage pairs no culprit explained whose every trace now reaches its destination
        across an open outage on those pairs: that outage came back. The vote cannot name it
        then (healthy traces cross the element while it is up, so it is cleared), and the
        pairs would open an unexplained alert beside the known one. Pairs whose traces stop
        somewhere, or miss the known element, stay unexplained (they may be a second fault).
        A trace one hop short of a destination that answers others lost its last answer: no
        evidence either way, as in the vote."""
        answering = frozenset(
            n for t in (*w.failing, *w.healthy) for n in t.nodes[1:] if n is not None
        )
        silent = silent_switches((*w.failing, *w.healthy), self._expected_paths)
        traces: dict[Pair, list[Trace]] = {}
        for t in w.failing:
            if t.pair not in w.left or w.symptom.get(t.pair) != "unreachable":
                continue
            if not t.reached and last_answer_lost(t, answering, self._expected_paths, silent):
                continue
            traces.setdefault(t.pair, []).append(t)

        # for pairs whose traces all got through: the nodes every trace crossed, and the links
        # any trace crossed. A port fails only the flows hashed onto it, and a pair's failed
        # flows may include one off it (benign loss on another path): a spine port that came
        # back, crossed by one of the traces, was dropped by the others' intersection (field
        # seed 920230969, SWITCH_PORT_FLAPPING on P8|S23r4)
        sets = {
            p: [self._elements(t) for t in ts]
            for p, ts in traces.items()
            if all(t.reached for t in ts)
        }
        every = {p: set.intersection(*ss) for p, ss in sets.items()}
        some = {p: set.union(*ss) for p, ss in sets.items()}
        for v in w.known:
            crossed = some if v.component_kind == "link" else every
            pairs = sorted(p for p, el in crossed.items() if p in w.left and v.component in el)
            if pairs and self._known_outage(w, {v.component}, pairs) is v:
                evidence = {"path": list(traces[pairs[0]][0].nodes)}
                self._came_back(w, v, pairs, evidence, now_ns)

    def _elements(self, trace: Trace) -> set[str]:
        """The links and nodes ``trace`` crossed (a silent hop is named where the fabric allows
        one node only, a ToR behind its RNIC)."""
        links, nodes = known_elements(fill_silent(trace, self._expected_paths(trace)))
        return {*links, *nodes}

    def _crossed(self, traces: Sequence[Trace]) -> set[str]:
        """The links and nodes every one of ``traces`` crossed."""
        return set.intersection(*map(self._elements, traces)) if traces else set()

    def _add_finding(
        self,
        w: _Work,
        pairs: Iterable[Pair],
        found: Finding,
        now_ns: int,
        evidence: Mapping[str, object] | None = None,
    ) -> None:
        pairs = list(pairs)
        self._add_verdict(
            w,
            pairs,
            found.layer,
            found.component,
            found.kind,
            found.type,
            now_ns,
            evidence={**(evidence or {}), **found.evidence},
            candidates=found.candidates,
            types=found.types,
        )
        self._settle(w, pairs, found.type)

    @staticmethod
    def _settle(w: _Work, pairs: Iterable[Pair], ftype: FailureType) -> None:
        """Mark the pairs a culprit explains as done. A fault that only delays cannot explain
        a pair that loses probes: such pairs stay for the next culprit (two faults at once)."""
        if ftype in _LATENCY_ONLY:
            w.left -= {p for p in pairs if w.symptom.get(p) == "latency"}
        else:
            w.left -= set(pairs)

    def _edge_rnic(self, c: UnderlayCulprit) -> tuple[str, int] | None:
        """The RNIC at the culprit when it is an RNIC or an RNIC's access link."""
        for part in c.component.split("|"):
            if ":rnic" in part:
                host, _, rail = part.rpartition(":rnic")
                if rail.isdigit():
                    return host, int(rail)
        return None

    def _failure_age_s(self, w: _Work, pairs: Iterable[Pair]) -> float:
        """How long the pairs have been failing: a clear flag read longer ago says nothing."""
        first = min((w.first_seen[p] for p in pairs if p in w.first_seen), default=None)
        first = w.first_seen_any if first is None else first
        return max(0.0, w.now_s - first / 1e9)

    def _flapped(
        self, host: str, rail: int, rep: HostReport | None, now_s: float, *, since_s: float
    ) -> bool:
        """The port's carrier-down count grew within ``flap_window_s`` since a reading taken
        while the failure was on (at or after ``since_s``, when the pairs first failed): it went
        down, came back and went down again. Once down, a port that stays down counts nothing
        more; a reading from before the failure began shows the count before its first down,
        so growth from it is that one down, not a flap. Readings are remembered across
        rounds."""
        if rep is None or not rep.known("port_down_count") or rail not in rep.port_down_count:
            return False
        seen = self._port_counts.setdefault((host, rail), [])
        t = now_s - float(rep.age_s.get("port_down_count", 0.0))
        n = int(rep.port_down_count[rail])
        if not seen or seen[-1] != (t, n):
            seen.append((t, n))
        while seen and seen[0][0] < now_s - self.flap_window_s:
            seen.pop(0)
        during = [c for ts, c in seen if ts >= since_s - 1e-6]
        return bool(during) and n - min(during) >= 1

    def _remember_downs(self, host: str, rail: int, rep: HostReport | None, now_s: float) -> None:
        """Keep which end a reading saw the port down from: a flapping port read while it is up
        reads clear, and the readings taken while it was down say whose port it is."""
        if rep is None:
            return
        seen = self._port_downs.setdefault((host, rail), [])
        for flag, which, down in (
            ("rnic_state", "rnic", rep.rnic_state.get(rail) == "down"),
            ("peer_down", "peer", rail in rep.peer_down),
        ):
            if down and rep.known(flag):
                got = (now_s - float(rep.age_s.get(flag, 0.0)), which)
                if got not in seen:
                    seen.append(got)
        while seen and seen[0][0] < now_s - self.flap_window_s:
            seen.pop(0)

    def _downs_seen(self, host: str, rail: int, since_s: float) -> frozenset[str]:
        """Which ends read the port down at or after ``since_s`` (see :meth:`_remember_downs`)."""
        return frozenset(
            w for t, w in self._port_downs.get((host, rail), ()) if t >= since_s - 1e-6
        )

    def _check_endpoint(
        self,
        w: _Work,
        host: str,
        rail: int,
        pairs: Iterable[Pair],
        source,
        report,
        flapping: bool = False,
    ) -> Finding | None:
        """What the endpoint side says, cheapest first: the host's report (containers' VF
        traffic, the RNIC's and the host's state), the probes' pattern (delay on several RNICs
        of the host, failure only towards the RNIC), then the RNIC's flow tables (a costly,
        rate-limited dump)."""
        pairs = list(pairs)
        rep = report(host)
        self._remember_downs(host, rail, rep, w.now_s)
        flapping = flapping or self._flapped(
            host, rail, rep, w.now_s, since_s=w.now_s - self._failure_age_s(w, pairs)
        )
        mine = self._rnic_eps(host, rail, pairs)
        containers = {
            self._ep(e).container: f"{self._ep(e).job}/{self._ep(e).container}" for e in mine
        }
        age = self._failure_age_s(w, pairs)
        found = report_finding(
            rep,
            host,
            rail,
            tor=self.cluster.fabric.rnic(host, rail).tor,
            containers=containers,
            flapping=flapping,
            max_age_s=age + _READING_GRACE_S,
        )
        if found is not None:
            return found
        symptom = self._worst(w, pairs)
        arr = np.fromiter(mine, np.int64, len(mine))
        sends = bool(np.isin(arr, w.healthy_src).any())
        receives = bool(np.isin(arr, w.healthy_dst).any())
        if symptom == "unreachable" and one_way_in(mine, w.symptom, sends, receives):
            if rep is None or not rep.known("gid_changed", max_age_s=age):
                return Finding(
                    "rnic",
                    f"{host}:rnic{rail}",
                    "rnic",
                    FailureType.RNIC_GID_CHANGE,
                    {"pattern": "fails only as a destination"},
                )
        keys = {self.overlay_endpoint(self._ep(e))[1] for p in pairs for e in p}
        diff = self._rnic_diff(host, rail, source, w.now_s, keys, latency=symptom == "latency")
        churn = (
            rail in rep.offload_churn
            if rep is not None and rep.known("offload_churn", max_age_s=age)
            else None
        )
        if diff is not None:
            software = {
                rep_node: containers[self._ep(e).container]
                for e in mine
                for rep_node in self._representors(w, e)
            }
            found = flow_finding(diff, host, rail, churn=churn, software=software)
            if found is not None:
                return replace(found, evidence={**found.evidence, "diff": _diff_evidence(diff)})
        if symptom == "latency":
            return self._host_board(w, host, report, age)
        return None

    def _flaps(self, w: _Work, host: str, rail: int, pairs: Iterable[Pair]) -> bool:
        """The probes say the RNIC's own port comes and goes: one of ``pairs`` it is on flaps,
        and not because of its peer there. A pair crosses both its RNICs, so a flapping port
        makes the pairs it shares with a failing peer flap too: such a pair is the peer's when
        the peer flaps on pairs without this RNIC, or when this RNIC fails steadily (without
        flapping) on pairs without that peer — its own port stays down."""
        me = (host, rail)
        for p in pairs:
            if p not in w.flapping or me not in self._rnics_of(p):
                continue
            peer = next((r for r in self._rnics_of(p) if r != me), None)
            if peer is None:
                return True  # both ends on this RNIC: nothing else to blame
            without_me = [q for q in w.symptom if peer in self._rnics_of(q)]
            if any(q in w.flapping and me not in self._rnics_of(q) for q in without_me):
                continue
            own = [
                q
                for q in w.symptom
                if me in self._rnics_of(q)
                and peer not in self._rnics_of(q)
                and w.symptom[q] == "unreachable"
            ]
            if own and not any(q in w.flapping for q in own):
                continue
            return True
        return False

    def _rnics_of(self, p: Pair) -> tuple[tuple[str, int], tuple[str, int]]:
        a, b = self._ep(p[0]), self._ep(p[1])
        return (a.host, a.rail), (b.host, b.rail)

    def _rnic_eps(self, host: str, rail: int, pairs: Iterable[Pair]) -> set[int]:
        return {
            e for p in pairs for e in p if self._ep(e).host == host and self._ep(e).rail == rail
        }

    def _slow_with(self, w: _Work, host: str) -> tuple[set[int], set[str]]:
        """The rails of ``host`` on which pairs of this round only slowed, and the other hosts
        those pairs reach."""
        rails: set[int] = set()
        peers: set[str] = set()
        for p, s in w.symptom.items():
            if s != "latency":
                continue
            a, b = self._ep(p[0]), self._ep(p[1])
            for me, other in ((a, b), (b, a)):
                if me.host == host and other.host != host:
                    rails.add(me.rail)
                    peers.add(other.host)
        return rails, peers

    def _host_board(self, w: _Work, host: str, report, age: float) -> Finding | None:
        """Delay on two or more rails of ``host`` (RNICs under different ToRs: no one link or
        switch explains it) whose tables are clean: the host board slows every RNIC of its
        host. With pairs to two or more other hosts, ``host`` is what they share. With one
        peer host that slowed only with ``host`` (a two-host job: they probe only each other),
        either board explains the pairs: the host whose report names its board, else the one
        whose board flags, read during the failure, do not rule it out; when both or neither
        do, ``host`` with the peer as candidate. Either host is called only once the other's
        own check (report, tables) came to the board too: a container of the other host whose
        traffic left RDMA slows its every rail just as well."""
        rails, peers = self._slow_with(w, host)
        if len(rails) < 2 or not peers:
            return None
        w.board_checked.add(host)
        if len(peers) >= 2:
            return host_board_finding(report(host), host, max_age_s=age)
        (peer,) = peers
        peer_rails, peer_peers = self._slow_with(w, peer)
        if len(peer_rails) < 2 or peer_peers != {host}:
            return None
        if peer not in w.board_checked:
            return None  # the peer's own check first: its report or tables may explain the pairs
        state = {h: host_board_state(report(h), max_age_s=age) for h in (host, peer)}
        for ruled_in in ("set", "open"):
            named = [h for h in (host, peer) if state[h] == ruled_in]
            if len(named) == 1:
                return host_board_finding(report(named[0]), named[0], max_age_s=age)
            if named:
                break
        found = host_board_finding(report(host), host, max_age_s=age)
        return replace(found, candidates=(peer,), evidence={**found.evidence, "tie": peer})

    def _representors(self, w: _Work, ep_id: int) -> list[str]:
        """The overlay nodes that deliver to the endpoint's VF (its representor), as the host's
        overlay tables name them."""
        vf = self.overlay_endpoint(self._ep(ep_id))[0]
        t = w.tables(host_of(vf)) if w.tables is not None else None
        if t is None:
            return []
        return [n for n, nh in t.next_hop.items() if n != vf and vf in nh.values()]

    def _evidence_step(self, w: _Work, all_pairs: set[Pair], report, now_ns: int) -> None:
        """Faults hiding behind others: a culprit explains the pairs, yet an endpoint's own
        report says something else is broken too (two faults on the same pairs). Reports are
        cheap, so every RNIC of the failing pairs is read; no flow tables are dumped here."""
        named = {v.component for v in w.verdicts}
        switches = {v.component for v in w.verdicts if v.component_kind == "switch"}
        for (host, rail), mine in sorted(self._by_rnic(all_pairs).items()):
            eps = self._rnic_eps(host, rail, mine)
            found = report_finding(
                report(host),
                host,
                rail,
                tor=self.cluster.fabric.rnic(host, rail).tor,
                containers={
                    self._ep(e).container: f"{self._ep(e).job}/{self._ep(e).container}" for e in eps
                },
                flapping=self._flaps(w, host, rail, mine),
                max_age_s=self._failure_age_s(w, mine) + _READING_GRACE_S,
            )
            if found is None or found.component in named:
                continue
            if found.kind == "link" and self.cluster.fabric.rnic(host, rail).tor in switches:
                continue  # the switch itself is down: every port of it looks dark
            named.add(found.component)
            self._add_verdict(
                w,
                mine,
                found.layer,
                found.component,
                found.kind,
                found.type,
                now_ns,
                evidence={"step": "independent", **found.evidence},
            )

    def _rnic_diff(
        self, host: str, rail: int, source, now_s: float, keys: set[str], *, latency: bool = False
    ) -> FlowDiff | None:
        """The RNIC's diff as it bears on the failing pairs (their destinations ``keys``): the
        rules that carry their traffic, as two dumps agree on them (one dump can race with the
        revalidator). Dumps are rate-limited per RNIC; a refused one reuses the last. For a
        ``latency`` culprit a clean last dump is taken again after ``clean_dump_interval_s``: a
        repetitive offload evicts its flows only some of the time, so one dump in an
        off-window says nothing about the next, and a churn collector that polls on its own
        period may not have read the RNIC while the fault was on."""
        last = self._dumps.get((host, rail))
        interval = self.rnic_dump_interval_s
        if (
            latency
            and last is not None
            and not (last[1] is not None and relevant_diff(last[1], keys))
        ):
            interval = min(interval, self.clean_dump_interval_s)
        if last is None or now_s - last[0] >= interval - 1e-6:
            tables = source.flow_tables(host, rail)
            first = tables.diff() if tables is not None else None
            second = None
            if first is not None and relevant_diff(first, keys):
                again = source.flow_tables(host, rail)
                second = again.diff() if again is not None else None
            last = self._dumps[(host, rail)] = (now_s, first, second)
        _t, first, second = last
        if first is None:
            return None
        diff = relevant_diff(first, keys)
        if not diff:
            return diff
        return persisting(diff, relevant_diff(second, keys) if second is not None else None)

    def _endpoint_step(
        self, w: _Work, source, report, now_ns: int, now_s: float, *, pairs: set[Pair] | None = None
    ) -> None:
        """Both layers clear: check the endpoints' RNICs and hosts, busiest first (of ``pairs``,
        default all pairs left); RNICs and hosts already named by an open alert come first."""
        by_rnic = self._by_rnic(w.left if pairs is None else pairs & w.left)
        named = {v.component for v in w.known}

        def order(kv):
            (host, rail), mine = kv
            return (f"{host}:rnic{rail}" not in named and host not in named, -len(mine), kv[0])

        for (host, rail), mine in sorted(by_rnic.items(), key=order):
            mine = mine & w.left
            if not mine:
                continue
            found = self._check_endpoint(
                w, host, rail, mine, source, report, self._flaps(w, host, rail, mine)
            )
            if found is None:
                continue
            self._add_finding(w, mine, found, now_ns, {"step": "endpoint"})

    def _by_rnic(self, pairs: Iterable[Pair]) -> dict[tuple[str, int], set[Pair]]:
        """``pairs`` grouped by the (host, rail) RNIC of each of their two endpoints."""
        out: dict[tuple[str, int], set[Pair]] = {}
        for p in pairs:
            for ep_id in p:
                ep = self._ep(ep_id)
                out.setdefault((ep.host, ep.rail), set()).add(p)
        return out

    # -- verdicts -----------------------------------------------------------------------------
    @staticmethod
    def _worst(w: _Work, pairs: Iterable[Pair]) -> Symptom:
        return max(
            (w.symptom.get(p, "latency") for p in pairs),
            key=SYMPTOM_RANK.__getitem__,
            default="latency",
        )

    def _add_verdict(
        self,
        w: _Work,
        pairs: Iterable[Pair],
        layer: Layer,
        component: str,
        kind: str,
        ftype: FailureType,
        now_ns: int,
        *,
        evidence: Mapping[str, object],
        candidates: Sequence[str] = (),
        symptom: Symptom | None = None,
        types: Sequence[tuple[FailureType, float]] = (),
    ) -> None:
        """Add a verdict on ``pairs`` to the round's findings."""
        pairs = tuple(sorted(pairs))
        symptom = symptom or self._worst(w, pairs)
        eps = {e for p in pairs for e in p} or set(evidence.get("endpoints", ()))  # type: ignore[arg-type]
        jobs = sorted({self._ep(e).job for e in eps})
        v = Verdict(
            job=",".join(jobs),
            pairs=pairs,
            layer=layer,
            component=component,
            component_kind=kind,
            failure_type=ftype,
            symptom=symptom,
            severity=SEVERITY_OF[symptom],
            first_seen_ns=min(
                (w.first_seen[p] for p in pairs if p in w.first_seen), default=w.first_seen_any
            ),
            detected_at_ns=now_ns,
            evidence=dict(evidence),
            candidates=tuple(candidates),
            type_candidates=tuple(types),
        )
        w.verdicts.append(v)


def _diff_evidence(diff: FlowDiff) -> dict[str, object]:
    def show(r: FlowRule) -> str:
        m = ",".join(f"{k}={v}" for k, v in r.match)
        return f"priority={r.priority},{m} actions={','.join(r.actions)}"

    return {
        **diff.summary(),
        "examples": [
            show(r) for r in (*diff.missing, *diff.stale, *diff.duplicated, *diff.not_in_hw)[:4]
        ]
        + [f"{show(a)} < {show(b)}" for a, b in diff.misordered[:2]],
    }
