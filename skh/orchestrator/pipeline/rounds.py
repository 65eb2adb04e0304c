"""One analyzer round, synchronously: :class:`Pipeline` infers skeletons from counters, runs
detection on probe records, localizes what detection suspects and tracks the alerts' life cycle.

The controller numbers endpoints for good (a removed job leaves a gap); the localizer's model
numbers them densely. :meth:`Pipeline.set_endpoints` maps one onto the other, and everything
crossing the pipeline's edge is translated: records, heartbeats and retirements in, skeletons and
alerts out (controller ids outside, model ids inside). What survives an analyzer restart comes
back from outside: skeleton versions from the controller (:meth:`Pipeline.set_endpoints`), open
alerts from the durable log (:meth:`Pipeline.restore`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skh.analysis.detect import Detector, SuspectEvent
from skh.analysis.localize import (
    AlertTracker,
    FailureType,
    Localizer,
    Severity,
    StateSource,
    Suspect,
    Verdict,
    probe_view,
)
from skh.analysis.skeleton import Skeleton, infer_skeleton, traffic_changed
from skh.errors import ConfigError
from skh.model import Cluster, Fabric
from skh.orchestrator.pipeline.alert_body import resolved_verdict, skeleton_alert, verdict_alert
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.history import CounterHistory
from skh.records import PROBE_DTYPE, empty_probes, pair_keys

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)


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
        self._events: dict[tuple[str, str, int], SuspectEvent | None] = {}
        # controller id <-> model id (the model's are dense, the controller's need not be)
        self._to_model = np.zeros(0, np.int64)
        self._to_ctl = np.zeros(0, np.int64)
        self._restored: list[Mapping[str, Any]] = []  # open alerts waiting for the model
        self._versions: dict[str, int] = {}  # skeleton version per job at the controller
        self.stats: dict[str, int] = {
            "rounds": 0,
            "events": 0,
            "events_explained": 0,
            "verdicts": 0,
            "skeletons": 0,
        }

    # -- the model ----------------------------------------------------------------------------
    def set_endpoints(
        self,
        members: Iterable[Mapping[str, Any]],
        skeleton_versions: Mapping[str, int] | None = None,
    ) -> bool:
        """Adopt the endpoints the controller knows (``ep, job, container, host, rail, ip``),
        whatever gaps their ids have, and the skeleton version each job has there (a restarted
        analyzer goes on from it)."""
        rows = sorted(members, key=lambda m: int(m["ep"]))
        for job, v in (skeleton_versions or {}).items():
            st = self.jobs.get(job)
            if st is not None and int(v) > st.skeleton_version:
                st.skeleton_version = int(v)
        self._versions.update(skeleton_versions or {})
        if not rows:
            return False
        sig = tuple(
            (int(m["ep"]), str(m["host"]), int(m["rail"]), str(m.get("ip", ""))) for m in rows
        )
        if sig == self._members_sig:
            return True
        self._members_sig = sig
        ctl = np.array([int(m["ep"]) for m in rows], np.int64)
        to_model = np.full(int(ctl.max()) + 1, -1, np.int64)
        to_model[ctl] = np.arange(ctl.size)
        self._to_model, self._to_ctl = to_model, ctl
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
                max(old.skeleton_version if old else 0, int(self._versions.get(job, 0))),
                old.skeleton if old else None,
            )
        return True

    # -- the edge: controller ids <-> model ids -----------------------------------------------
    def _model(self, ids: np.ndarray) -> np.ndarray:
        """Model ids of controller ids (-1: not in the model)."""
        ids = np.asarray(ids, np.int64)
        out = np.full(ids.shape, -1, np.int64)
        ok = (ids >= 0) & (ids < self._to_model.size)
        out[ok] = self._to_model[ids[ok]]
        return out

    def _ctl(self, ids: Any) -> np.ndarray:
        return self._to_ctl[np.asarray(ids, np.int64)]

    def _records_in(self, recs: np.ndarray, fields: tuple[str, ...]) -> np.ndarray:
        """Records with their endpoint fields in model ids; those of unknown endpoints go."""
        if self.cluster is None or not recs.size:
            return recs
        keep = np.ones(recs.size, bool)
        mapped = {f: self._model(recs[f]) for f in fields}
        for m in mapped.values():
            keep &= m >= 0
        out = recs[keep].copy()
        for f, m in mapped.items():
            out[f] = m[keep]
        return out

    def heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        """Endpoints (controller ids) whose agents reported in."""
        m = self._model(eps) if self.cluster is not None else np.asarray(eps, np.int64)
        self.detector.heartbeat(m[m >= 0], t_ns)

    def retire(self, eps: Iterable[int]) -> None:
        """Endpoints (controller ids) stopped on purpose."""
        a = np.fromiter(eps, np.int64)
        m = self._model(a) if self.cluster is not None else a
        self.detector.retire(m[m >= 0].tolist())

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Alerts the log holds open (records ``{seq, ts_ns, alert}``): tracked again from the
        next round, so each resolves once detection no longer holds it."""
        self._restored += [
            r["alert"]
            for r in records
            if isinstance(r.get("alert"), Mapping) and r["alert"].get("kind") == "fault"
        ]

    def _reopen(self, now_ns: int) -> None:
        for a in self._restored:
            try:
                pairs = np.asarray(a.get("pairs") or np.zeros((0, 2)), np.int64).reshape(-1, 2)
                if self.cluster is not None and pairs.size:
                    pairs = self._model(pairs)
                    pairs = pairs[(pairs >= 0).all(axis=1)]
                v = Verdict(
                    job=str(a.get("job", "")),
                    pairs=tuple((int(x), int(y)) for x, y in pairs),
                    layer=a["layer"],
                    component=str(a["component"]),
                    component_kind=str(a.get("component_kind", "")),
                    failure_type=FailureType(int(a["failure_type_id"])),
                    symptom=a.get("symptom", "loss"),
                    severity=Severity[str(a.get("severity", "major")).upper()],
                    first_seen_ns=int(a["first_seen_ns"]),
                    detected_at_ns=int(a["detected_at_ns"]),
                    evidence=dict(a.get("evidence") or {}),
                    candidates=tuple(str(c) for c in a.get("candidates", ())),
                    type_candidates=tuple(
                        (FailureType[str(t).upper()], float(p))
                        for t, p in a.get("type_candidates", ())
                    ),
                    # the id's class: an alert a round refined into another class keeps the id
                    # it opened with, and so must its resolution
                    alert_class=int(str(a["alert_id"]).rsplit("|", 1)[1]),
                )
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                log.warning("open alert %s not restored: %r", a.get("alert_id"), exc)
                continue
            self.tracker.update([v], now_ns)  # open again, not announced again
            self._events[v.key] = None
            agent = v.layer == "agent"  # a dead agent's alert is held by its endpoints
            self._watch[v.key] = (set(v.pairs), {e for p in v.pairs for e in p} if agent else set())
            self.stats["restored"] = self.stats.get("restored", 0) + 1
        self._restored = []

    def _alert_out(self, v: Verdict) -> Verdict:
        """A verdict with its pairs in controller ids."""
        if self.cluster is None or not v.pairs:
            return v
        ctl = self._ctl(np.asarray(v.pairs, np.int64))
        return dataclasses.replace(v, pairs=tuple((int(a), int(b)) for a, b in ctl))

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
        if self._restored:  # the tracker's side: a shard's observe never has any
            self._reopen(now_ns)
        alerts, events = self.observe(probes, counters, now_ns, heartbeats)
        events = self._unexplained(events)
        verdicts: list[tuple[Verdict, SuspectEvent | None]] = []
        if events and self.localizer is not None:
            verdicts = self._localize(events, now_ns)
        alerts += self._track(verdicts, now_ns)
        return alerts

    def observe(
        self,
        probes: np.ndarray,
        counters: np.ndarray,
        now_ns: int,
        heartbeats: np.ndarray | None = None,
    ) -> tuple[list[dict[str, Any]], list[SuspectEvent]]:
        """The detection half of a round: counters into the history (and skeletons when due),
        probes into the detector, then its tick. Returns the skeleton alerts and the detector's
        new events. Everything the other half asks of it goes through :attr:`detector`'s
        ``open_incidents`` and :meth:`recent_probes` (the sharded analyzer,
        :mod:`skh.orchestrator.shard`, runs this half on each shard)."""
        alerts: list[dict[str, Any]] = []
        self.counters.add(self._records_in(counters, ("ep",)))
        if heartbeats is not None and heartbeats.size:
            self.heartbeat(heartbeats, now_ns)
        if probes.size:
            probes = self._records_in(np.asarray(probes, PROBE_DTYPE), ("src_ep", "dst_ep"))
            self.detector.ingest(probes)
            self._recent.append((now_ns, probes))
        self._recent = [(t, p) for t, p in self._recent if t >= now_ns - 15_000_000_000]
        if now_ns >= self._next_skeleton_ns:
            self._next_skeleton_ns = now_ns + int(self.cfg.skeleton_every_s * 1e9)
            alerts += self._skeletons(now_ns)
        return alerts, self.detector.tick(now_ns)

    def recent_probes(self) -> np.ndarray:
        """The probe records of the last 15 s (what localization reads of recent traffic)."""
        return np.concatenate([r for _t, r in self._recent]) if self._recent else empty_probes()

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
            out_sk = sk
            if self.cluster is not None:  # the controller's ids
                out_sk = dataclasses.replace(
                    sk,
                    pairs=self._ctl(sk.pairs).astype(np.uint32).reshape(-1, 2),
                    ep_id=self._ctl(sk.ep_id).astype(np.uint32),
                )
            if not self.apply_skeleton(job, out_sk, version):
                continue
            st.applied_digest, st.skeleton_version = sk.digest, version
            out.append(self._installed(job, out_sk, version))
        return out

    def _installed(self, job: str, sk: Skeleton, version: int) -> dict[str, Any]:
        """Skeleton ``version`` of ``job`` (``sk`` in controller ids) is in place: counted,
        logged, and its alert."""
        self.stats["skeletons"] += 1
        log.info(
            "job %s: skeleton v%d (%s, %d pairs, confidence %.2f)",
            job,
            version,
            sk.mode,
            len(sk.pairs),
            sk.confidence,
        )
        return skeleton_alert(job, sk, version)

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
            if getattr(ev, "flapping", False):
                out.append(ev)  # an outage that came back: it refines the open alert's type
                continue
            if (pairs or eps) and pairs <= held_pairs and eps <= held_eps:
                self.stats["events_explained"] += 1
                continue
            out.append(ev)
        return out

    def _probe_view(
        self, failing: set[tuple[int, int]], now_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Healthy pairs (answered in the last seconds with no failed probe and no open
        suspicion: the localizer traces some to clear the links they cross) and responsive
        endpoints (their own probes sent since the heartbeat timeout came back: their agents
        are alive). Only that recent: an agent is declared dead once its heartbeats are
        missing for the timeout, and the probes it sent before it died, still in the look-back,
        must not make it look alive."""
        p = self.recent_probes()
        if not p.size:
            return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
        healthy, _ = probe_view(p)
        since_ns = now_ns - int(self.cfg.detector.health.heartbeat_timeout_s * 1e9)
        _, responsive = probe_view(p[p["t_wall_ns"] >= since_ns])
        if failing and healthy.size:
            f = np.array(sorted(failing), np.int64)
            healthy = healthy[
                ~np.isin(pair_keys(healthy[:, 0], healthy[:, 1]), pair_keys(f[:, 0], f[:, 1]))
            ]
        return healthy, responsive

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
        failing = {p for s, _ev in suspects for p in s.pairs}
        healthy, responsive = self._probe_view(failing, now_ns)
        verdicts, reads = self.locate(
            [s for s, _ev in suspects],
            healthy,
            now_ns,
            known=self.tracker.open,
            responsive=responsive,
        )
        log.info(
            "localized %d event(s) into %d verdict(s) in %.1f s (%s)",
            len(events),
            len(verdicts),
            time.monotonic() - t0,
            reads,
        )
        self.stats["verdicts"] += len(verdicts)
        out = []
        for v in verdicts:
            ev = next((e for s, e in suspects if set(v.pairs) & set(s.pairs)), suspects[0][1])
            out.append((v, ev))
        return out

    def locate(
        self,
        suspects: list[Suspect],
        healthy: np.ndarray,
        now_ns: int,
        *,
        known: Sequence[Verdict] = (),
        responsive: np.ndarray | None = None,
    ) -> tuple[list[Verdict], dict[str, int]]:
        """Localization proper: a state source for this round, its prefetches, the localizer's
        verdicts (``known``: the alerts still open; ``responsive``: endpoints whose own probes
        came back), and the questions it asked (the sharded analyzer runs this on a Ray
        actor)."""
        assert self.localizer is not None and self.cluster is not None
        source = self.source_factory(self.cluster)
        failing = {p for s in suspects for p in s.pairs}
        eps = {e for p in failing for e in p} | {e for s in suspects for e in s.agents}
        prefetch_hosts = getattr(source, "prefetch_hosts", None)
        if prefetch_hosts is not None:
            prefetch_hosts(sorted({self.cluster.endpoints[e].host for e in eps}))
        prefetch_traces = getattr(source, "prefetch_traces", None)
        if prefetch_traces is not None:
            prefetch_traces([(p, 0) for p in sorted(failing)])
        verdicts = self.localizer.localize(
            suspects,
            source,
            healthy_pairs=healthy,
            now_ns=now_ns,
            known=known,
            responsive=responsive,
        )
        return verdicts, dict(getattr(source, "calls", {}))

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
            out.append(verdict_alert(self._alert_out(v), "open", ev))
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
                verdict_alert(
                    resolved_verdict(self._alert_out(v), now_ns),
                    "resolved",
                    self._events.pop(v.key, None),
                )
            )
        return out
