"""The localizer: one round turns suspects into verdicts, step by step (the package doc has the
steps); each step asks the :class:`~skh.analysis.localize.source.StateSource` only what it needs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from skh.analysis.localize.alerts import merge_verdicts
from skh.analysis.localize.classify import (
    classify_flow_diff,
    classify_host_report,
    classify_rnic_report,
    classify_underlay,
)
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
from skh.analysis.localize.overlay import host_of, walk_overlay
from skh.analysis.localize.source import StateSource
from skh.analysis.localize.suspects import DEAD_BITS, Suspect
from skh.analysis.localize.underlay import UnderlayCulprit, link_name, vote
from skh.errors import ConfigError
from skh.failures import FailureType
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
    verdicts: list[Verdict] = field(default_factory=list)
    failing: list[Trace] = field(default_factory=list)
    healthy: list[Trace] = field(default_factory=list)
    #: underlay culprits the vote could not single out; endpoints are checked before they are named
    deferred: list[tuple[UnderlayCulprit, list[Trace]]] = field(default_factory=list)


_RNIC_SIDE = {FailureType.BOND_ERROR, FailureType.RNIC_GID_CHANGE}
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


class Localizer:
    """Localizes suspects on one cluster. Keeps only the RNIC-dump rate limit between rounds.

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
    max_exoneration_traces:
        healthy pairs traced per round to clear links (nearest to the failing pairs first).
    exoneration_path_ids:
        the path ids each healthy pair is traced on.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        overlay_endpoint: Callable[[Endpoint], tuple[str, str]] = default_overlay_endpoint,
        overlay_component: Callable[[str], str | None] | None = None,
        rnic_dump_interval_s: float = 60.0,
        max_exoneration_traces: int = 256,
        exoneration_path_ids: Sequence[int] = (0,),
    ) -> None:
        if rnic_dump_interval_s < 0:
            raise ConfigError(
                "The 'rnic_dump_interval_s' parameter of Localizer must be >= 0. "
                f"Got {rnic_dump_interval_s!r} instead."
            )
        if max_exoneration_traces < 0:
            raise ConfigError(
                "The 'max_exoneration_traces' parameter of Localizer must be >= 0. "
                f"Got {max_exoneration_traces!r} instead."
            )
        if not exoneration_path_ids:
            raise ConfigError(
                "The 'exoneration_path_ids' parameter of Localizer must name at least one path id."
            )
        self.cluster = cluster
        self.overlay_endpoint = overlay_endpoint
        self.overlay_component = overlay_component
        self.rnic_dump_interval_s = float(rnic_dump_interval_s)
        self.max_exoneration_traces = int(max_exoneration_traces)
        self.exoneration_path_ids = tuple(int(p) for p in exoneration_path_ids)
        self._dumps: dict[tuple[str, int], tuple[float, FlowDiff]] = {}
        self._switch_paths: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        self._n_indexed = 0
        self._rnic_of: dict[tuple[str, int], tuple[int, int]] | None = None
        self._ep_rnic = np.zeros(0, np.int64)
        self._ep_tor = np.zeros(0, np.int64)
        self._vf_owner: dict[str, Endpoint] = {}
        self._index()

    # -- indexes ------------------------------------------------------------------------------
    def _index(self) -> None:
        """Dense RNIC and ToR ids per endpoint (for picking exoneration pairs with numpy) and the
        owner of every VF node; extended as endpoints register."""
        eps = self.cluster.endpoints
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
        new = eps[max(n0, 0) :]
        ids = [self._rnic_of[(e.host, e.rail)] for e in new]
        self._ep_rnic = np.concatenate(
            [self._ep_rnic, np.fromiter((i[0] for i in ids), np.int64, len(ids))]
        )
        self._ep_tor = np.concatenate(
            [self._ep_tor, np.fromiter((i[1] for i in ids), np.int64, len(ids))]
        )
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
    ) -> list[Verdict]:
        """Localize one round of suspects; returns one verdict per culprit (and one for what no
        culprit explains). ``healthy_pairs`` (n × 2 endpoint ids) are pairs probed without
        trouble right now; some are traced to clear the links they cross."""
        self._index()
        now_ns = time.time_ns() if now_ns is None else int(now_ns)
        now_s = now_ns / 1e9 if now_s is None else float(now_s)
        w = _Work(
            {},
            {},
            set(),
            set(),
            {},
            {},
            set(),
            min((s.first_seen_ns for s in suspects), default=now_ns),
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

        self._overlay_step(w, tables, report, now_ns)
        self._agent_step(w, tables, report, now_ns)
        self._underlay_step(w, source, report, healthy_pairs, now_ns, now_s)
        if w.left:
            self._endpoint_step(w, source, report, now_ns, now_s)
        for c, traces in w.deferred:
            self._emit_underlay(w, c, traces, source, report, now_ns, now_s)
        if w.left:
            self._residual_step(w, source, report, now_ns, now_s)
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
                res = back if back.status in ("loop", "down") else res
            if res.status != "ok":
                groups.setdefault((res.status, res.hop), []).append(res)
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
                comp = (self.overlay_component(hop) if self.overlay_component else None) or hop
                ckind = "vswitch" if comp != hop else kind
            self._add_verdict(w, pairs, "overlay", comp, ckind, ftype, now_ns, evidence=evidence)
            w.left -= set(pairs)

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
        # endpoints detection already found unhealthy (heartbeats, refused, delays)
        for e, bits in sorted(w.agents.items()):
            ep = self._ep(e)
            name = f"{ep.job}/{ep.container}"
            if name in crashed:
                continue
            node = self.overlay_endpoint(ep)[0]
            if bits & DEAD_BITS and self._container_gone(ep, node, tables, report):
                key = (ep.job, ep.container, FailureType.CONTAINER_CRASH)
            else:
                key = (
                    ep.job,
                    ep.container,
                    FailureType.AGENT_CRASH if bits & DEAD_BITS else FailureType.LATE_AGENT,
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
                symptom="unreachable" if ftype != FailureType.LATE_AGENT else "latency",
            )
            w.left -= set(pairs)

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
        # spread the budget over the failing RNICs so one busy endpoint does not take it all
        per_rnic: dict[int, int] = {}
        cap = max(4, self.max_exoneration_traces // max(1, 2 * rn_f.size))
        for i in np.flatnonzero(near_rnic).tolist():
            key = int(rs[i]) if in_s[i] else int(rd[i])
            if per_rnic.get(key, 0) >= cap:
                continue
            p = (int(hp[i, 0]), int(hp[i, 1]))
            if p in fset:
                continue
            per_rnic[key] = per_rnic.get(key, 0) + 1
            out.append(p)
        rest = np.flatnonzero(near_tor & ~near_rnic)
        budget = self.max_exoneration_traces - len(out)
        if budget > 0 and rest.size:
            # spread evenly over the candidates so every ToR and spine gets its share
            pick = rest[np.linspace(0, rest.size - 1, min(budget, rest.size)).astype(np.int64)]
            out.extend((int(hp[i, 0]), int(hp[i, 1])) for i in np.unique(pick).tolist())
        return out[: self.max_exoneration_traces]

    def _underlay_step(
        self, w: _Work, source, report, healthy_pairs, now_ns: int, now_s: float
    ) -> None:
        if not w.left:
            return
        failing = []
        for p in sorted(w.left):
            for pid in w.path_ids.get(p, (0,)):
                t = source.traceroute(p, pid)
                if t is not None:
                    failing.append(t)
        if not failing:
            return
        w.failing = failing
        for p in self._exoneration(sorted(w.left), healthy_pairs):
            for pid in self.exoneration_path_ids:
                t = source.traceroute(p, pid)
                if t is not None:
                    w.healthy.append(t)
        res = vote(failing, w.healthy, expected_paths=self._expected_paths)
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
        if rnic is not None and not c.ambiguous:
            host, rail = rnic
            found = self._check_endpoint(
                host, rail, pairs, source, report, now_s, any(p in w.flapping for p in pairs)
            )
            if found is not None:
                layer, comp, kind, ftype, extra = found
                evidence.update(extra)
                self._add_verdict(w, pairs, layer, comp, kind, ftype, now_ns, evidence=evidence)
                self._settle(w, pairs, ftype)
                return
            # the RNIC at the link is fine: before blaming the switch port, the other endpoints
            # of these pairs may explain them (an edge no healthy trace clears is ambiguous)
            self._endpoint_step(w, source, report, now_ns, now_s, pairs=set(pairs))
            pairs = [p for p in pairs if p in w.left]
            if not pairs:
                return
            if c.kind == "node":
                # an RNIC no healthy trace crosses, that reports nothing itself
                self._add_verdict(
                    w,
                    pairs,
                    "rnic",
                    c.component,
                    "rnic",
                    FailureType.RNIC_HW_FAILURE,
                    now_ns,
                    evidence=evidence,
                    candidates=c.candidates,
                )
                w.left -= set(pairs)
                return
        symptom = self._worst(w, pairs)
        flapping = any(p in w.flapping for p in pairs)
        ftype = classify_underlay(c.kind, symptom, flapping=flapping, partial=c.partial)
        ckind = "link" if c.kind == "link" else "switch"
        cands = c.candidates if (c.ambiguous or c.partial) else ()
        if rnic is not None and symptom == "latency" and not cands:
            # a cable does not add delay; a queue or the RNIC does. With the RNIC's report and
            # tables clean right now, it stays a candidate (an intermittent offload problem
            # shows only some of the time)
            cands = (f"{rnic[0]}:rnic{rnic[1]}",)
        self._add_verdict(
            w,
            pairs,
            "underlay",
            c.component,
            ckind,
            ftype,
            now_ns,
            evidence=evidence,
            candidates=cands,
        )
        self._settle(w, pairs, ftype)

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

    def _check_endpoint(
        self,
        host: str,
        rail: int,
        pairs: Iterable[Pair],
        source,
        report,
        now_s: float,
        flapping: bool = False,
    ):
        """What the endpoint side says, cheapest first: the host's report (containers' VF
        traffic, the RNIC's and the host's state), then the RNIC's flow tables (a costly,
        rate-limited dump). Returns (layer, component, kind, type, evidence) or None."""
        found = self._check_report(host, rail, pairs, report, flapping)
        if found is not None:
            return found
        rep = report(host)
        churn = rep is not None and rail in rep.offload_churn
        diff = self._rnic_diff(host, rail, source, now_s)
        if diff or churn:
            diff = diff or FlowDiff()
            rnic = f"{host}:rnic{rail}"
            return (
                "rnic",
                rnic,
                "rnic",
                classify_flow_diff(diff, churn=churn),
                {"diff": _diff_evidence(diff), "churn": churn},
            )
        return None

    def _check_report(self, host: str, rail: int, pairs: Iterable[Pair], report, flapping: bool):
        """What the host agent's report alone says about an RNIC (no dump)."""
        rep = report(host)
        if rep is None:
            return None
        rnic = f"{host}:rnic{rail}"
        if rep.rdma_fallback:
            for p in pairs:
                for e in p:
                    ep = self._ep(e)
                    if ep.host == host and ep.rail == rail and ep.container in rep.rdma_fallback:
                        return (
                            "overlay",
                            f"{ep.job}/{ep.container}",
                            "container",
                            FailureType.NOT_USING_RDMA,
                            {"host_report": "rdma_fallback"},
                        )
        if rail in rep.peer_down:
            tor = self.cluster.fabric.rnic(host, rail).tor
            ft = FailureType.SWITCH_PORT_FLAPPING if flapping else FailureType.SWITCH_PORT_DOWN
            return "underlay", link_name(rnic, tor), "link", ft, {"host_report": "peer_down"}
        ft = classify_rnic_report(rep, rail)
        if ft is not None:
            if ft == FailureType.RNIC_PORT_DOWN and flapping:
                # down now, up a moment ago: the loss comes and goes
                ft = FailureType.RNIC_PORT_FLAPPING
            return "rnic", rnic, "rnic", ft, {"host_report": rep.rnic_state.get(rail)}
        ft = classify_host_report(rep, rail)
        if ft is not None:
            if ft in _RNIC_SIDE:
                return "rnic", rnic, "rnic", ft, {"host_report": ft.name.lower()}
            # hugepages, PCIe and GPUDirect are the host board's: every RNIC of the host suffers
            return "host", host, "host", ft, {"host_report": ft.name.lower()}
        if rail in rep.offload_churn:
            return (
                "rnic",
                rnic,
                "rnic",
                FailureType.REPETITIVE_FLOW_OFFLOADING,
                {"host_report": "offload_churn"},
            )
        return None

    def _evidence_step(self, w: _Work, all_pairs: set[Pair], report, now_ns: int) -> None:
        """Faults hiding behind others: a culprit explains the pairs, yet an endpoint's own
        report says something else is broken too (two faults on the same pairs). Reports are
        cheap, so every RNIC of the failing pairs is read; no flow tables are dumped here."""
        named = {v.component for v in w.verdicts}
        switches = {v.component for v in w.verdicts if v.component_kind == "switch"}
        for (host, rail), mine in sorted(self._by_rnic(all_pairs).items()):
            found = self._check_report(host, rail, mine, report, any(p in w.flapping for p in mine))
            if found is None or found[1] in named:
                continue
            if found[2] == "link" and self.cluster.fabric.rnic(host, rail).tor in switches:
                continue  # the switch itself is down: every port of it looks dark
            layer, comp, kind, ftype, extra = found
            named.add(comp)
            evidence = {"step": "independent", **extra}
            self._add_verdict(w, mine, layer, comp, kind, ftype, now_ns, evidence=evidence)

    def _rnic_diff(self, host: str, rail: int, source, now_s: float) -> FlowDiff | None:
        last = self._dumps.get((host, rail))
        if last is not None and now_s - last[0] < self.rnic_dump_interval_s:
            return last[1]
        tables = source.flow_tables(host, rail)
        if tables is None:
            return None
        diff = tables.diff()
        self._dumps[(host, rail)] = (now_s, diff)
        return diff

    def _endpoint_step(
        self, w: _Work, source, report, now_ns: int, now_s: float, *, pairs: set[Pair] | None = None
    ) -> None:
        """Both layers clear: check the endpoints' RNICs and hosts, busiest first (of ``pairs``,
        default all pairs left)."""
        by_rnic = self._by_rnic(w.left if pairs is None else pairs & w.left)
        for (host, rail), mine in sorted(by_rnic.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            mine = mine & w.left
            if not mine:
                continue
            found = self._check_endpoint(
                host, rail, mine, source, report, now_s, any(p in w.flapping for p in mine)
            )
            if found is None:
                continue
            layer, comp, kind, ftype, extra = found
            evidence = {"step": "endpoint", **extra}
            self._add_verdict(w, mine, layer, comp, kind, ftype, now_ns, evidence=evidence)
            self._settle(w, mine, ftype)

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
