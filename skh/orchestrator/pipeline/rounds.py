"""One analyzer round, synchronously: :class:`Pipeline` infers skeletons from counters, runs
detection on probe records, localizes what detection suspects and tracks the alerts' life cycle.

The controller numbers endpoints for good (a removed job leaves a gap); the localizer's model
numbers them as they join it (an endpoint keeps its model id while it lives, so state kept
under model ids across rounds goes on naming it; one that leaves is released, and its id given
again only once nothing names it). :meth:`Pipeline.set_endpoints` maps one onto the other, and
everything crossing the pipeline's edge is translated: records, heartbeats and retirements in,
skeletons and alerts out (controller ids outside, model ids inside). What survives an analyzer
restart comes back from outside: skeleton versions from the controller
(:meth:`Pipeline.set_endpoints`), open alerts from the durable log (:meth:`Pipeline.restore`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
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
    failing_path_ids,
    probe_view,
)
from skh.analysis.skeleton import Skeleton, infer_skeleton, traffic_changed
from skh.errors import ConfigError
from skh.model import Cluster, Endpoint, Fabric
from skh.orchestrator.pipeline.alert_body import resolved_verdict, skeleton_alert, verdict_alert
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.history import CounterHistory
from skh.records import LOSS_STATUSES, PROBE_DTYPE, ProbeStatus, empty_probes, pair_keys

__all__ = ["Pipeline", "REUSE_AFTER_S"]

log = logging.getLogger(__name__)

_Key = tuple[str, str, int]
#: statuses of a probe that failed on the network (its request or its reply)
_FAILED = np.array([*LOSS_STATUSES, ProbeStatus.UNREACHABLE], np.uint8)
#: a gone model id is given to a new endpoint after this long at the earliest: past everything
#: kept by time under it (the detector's idle pairs, recent probes, counters), though each is
#: also told when its endpoint leaves (see Pipeline.set_endpoints)
REUSE_AFTER_S = 600.0
#: a pair's reverse failing this long before the pair's own first failure is the same fault (the
#: two probers ship their results at different moments)
_REVERSE_SLACK_NS = 2_000_000_000


@dataclass(slots=True)
class _JobState:
    ep_id: np.ndarray  # in controller id order
    host: np.ndarray
    rail: np.ndarray
    rank: np.ndarray
    applied_digest: str | None = None
    skeleton_version: int = 0
    skeleton: Skeleton | None = None
    changed_since_ns: int = 0


def _registration(m: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a controller's member row registers: its id, then the endpoint's fields."""
    return (
        int(m["ep"]),
        str(m["job"]),
        str(m["container"]),
        str(m["host"]),
        int(m["rail"]),
        str(m.get("ip", "")),
        str(m.get("netdev", "")),
    )


def _name(m: Mapping[str, Any]) -> str:
    """A member row's endpoint name, as :attr:`Endpoint.name` spells it."""
    return f"{m['job']}/{m['container']}/{m['rail']}"


def _same(e: Endpoint, m: Mapping[str, Any]) -> bool:
    """Whether member row ``m`` registers endpoint ``e`` as it is."""
    return (e.job, e.container, e.host, e.rail, e.ip, e.netdev) == _registration(m)[1:]


def _held_eps(ev: SuspectEvent | None) -> set[int]:
    """The endpoints an alert opened on ``ev`` stays open for while detection finds them sick:
    an agent event's. A link-state event's endpoints are sick for their agents' sake; its alert
    lasts while its pairs' incident does (the link down)."""
    return set(ev.endpoints) if ev is not None and ev.kind == "agent" else set()


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
        #: (host, rail) -> the ToR it hangs off, for every RNIC of the fabric
        self._tor_of = {
            (h.name, r.rail): r.tor for h in self.fabric.hosts.values() for r in h.rnics
        }
        #: each ToR's pod: with the ToRs, a pair's path length (young pairs' latency reference)
        self._pod_of_tor = self.fabric.tor_pods()
        self._left_out: frozenset[str] = frozenset()  # the last rows left out, said once
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
        self._watch: dict[_Key, tuple[set[tuple[int, int]], set[int]]] = {}
        self._events: dict[_Key, SuspectEvent | None] = {}
        #: what the last localization read and how long it took (told with its new alerts)
        self._localization: dict[str, Any] = {}
        #: what the last localization could not explain and is not published yet: (verdict, its
        #: event, when it was first found unexplained)
        self._pending: tuple[Verdict, SuspectEvent | None, int] | None = None
        #: controller id -> model id of the endpoints alive, and the two directions as arrays:
        #: controller id -> model id (-1: not alive), model id -> controller id (gone ones too)
        self._live: dict[int, int] = {}
        self._to_model = np.zeros(0, np.int64)
        self._to_ctl = np.zeros(0, np.int64)
        #: model id -> when it left (the pipeline's clock: the last round's ``now_ns``)
        self._gone_at: dict[int, int] = {}
        self._now_ns = 0
        self._restored: list[Mapping[str, Any]] = []  # open alerts waiting for the model
        self._versions: dict[str, int] = {}  # skeleton version per job at the controller
        #: (host, rail) -> access link id: the detector keeps each link's loss history under
        #: it, across the jobs (and model ids) that come and go on the RNIC
        self._links: dict[tuple[str, int], int] = {}
        #: ToR name -> group id, for the detector's pooling over ToRs (ids stable across calls:
        #: its crossing history lives under them)
        self._tors: dict[str, int] = {}
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
        analyzer goes on from it).

        An endpoint keeps its model id while it lives. One that left (or registered again
        elsewhere under its controller id: left, then new) is retired and released from the
        model. A new one gets an id gone for :data:`REUSE_AFTER_S` that no open alert or
        pending verdict names (the detector forgets what is left of it), else the next id: the
        model holds at most the endpoints alive, those gone in the last
        :data:`REUSE_AFTER_S` and those open alerts name (an entry each: the endpoint, its
        RNIC and ToR, its health, ~300 bytes). A row's ``model`` key, when there, is the id it
        must have (the sharded analyzer's actors follow the coordinator's numbering, whatever
        they missed)."""
        rows = self._adoptable(members)
        for job, v in (skeleton_versions or {}).items():
            st = self.jobs.get(job)
            if st is not None and int(v) > st.skeleton_version:
                st.skeleton_version = int(v)
        self._versions.update(skeleton_versions or {})
        if not rows:
            return False
        sig = tuple((*_registration(m), int(m.get("model", -1))) for m in rows)
        if sig == self._members_sig:
            return True
        if self.cluster is None:
            self.cluster = Cluster(self.fabric)
        cluster = self.cluster
        live = dict(self._live)
        departed = []
        new = []
        for m in rows:
            c, want = int(m["ep"]), int(m.get("model", -1))
            had = live.pop(c, -1)
            if had >= 0 and (want in (-1, had)) and _same(cluster.endpoints[had], m):
                continue
            if had >= 0:
                departed.append(had)
            new.append(m)
        departed += live.values()  # left the controller's list
        if departed:
            self._depart(departed)
        free = self._free_ids() if any(int(m.get("model", -1)) < 0 for m in new) else []
        for m in new:
            want = int(m.get("model", -1))
            if want < 0 and free:
                want = free.pop(0)
            if want in cluster.gone:
                self.detector.reuse([want])
                self._gone_at.pop(want, None)
                self.stats["ids_reused"] = self.stats.get("ids_reused", 0) + 1
            e = cluster.add_endpoint(
                ep_id=None if want < 0 else want,
                job=str(m["job"]),
                container=str(m["container"]),
                host=str(m["host"]),
                rail=int(m["rail"]),
                ip=str(m.get("ip", "")),
                netdev=str(m.get("netdev", "")),
            )
            self._live[int(m["ep"])] = e.ep_id
        # a gone id keeps naming its controller id: an open alert may still name it
        to_ctl = np.full(len(cluster.endpoints), -1, np.int64)
        to_ctl[: self._to_ctl.size] = self._to_ctl
        to_ctl[list(self._live.values())] = list(self._live)
        self._to_ctl = to_ctl
        self._to_model = np.full(max(self._live, default=-1) + 1, -1, np.int64)
        self._to_model[list(self._live)] = list(self._live.values())
        self.detector.set_endpoint_links(
            np.array(
                [
                    -1
                    if e.ep_id in cluster.gone
                    else self._links.setdefault((e.host, e.rail), len(self._links))
                    for e in cluster.endpoints
                ],
                np.int64,
            )
        )
        self.detector.set_endpoint_pods(
            np.array(
                [
                    -1
                    if e.ep_id in cluster.gone
                    else self._pod_of_tor[self._tor_of[(e.host, e.rail)]]
                    for e in cluster.endpoints
                ],
                np.int64,
            )
        )
        # a VF reading down is a link down while another VF of its container reads up
        containers: dict[tuple[str, str], int] = {}
        self.detector.set_endpoint_containers(
            np.array(
                [
                    -1
                    if e.ep_id in cluster.gone
                    else containers.setdefault((e.job, e.container), len(containers))
                    for e in cluster.endpoints
                ],
                np.int64,
            )
        )
        if self.cfg.pool_over_tors:
            self.detector.set_endpoint_groups(
                np.array([self._tor_group(e, cluster) for e in cluster.endpoints], np.int64)
            )
        if self.localizer is None:
            self.localizer = Localizer(
                cluster,
                rnic_dump_interval_s=self.cfg.rnic_dump_interval_s,
                max_exoneration_traces=self.cfg.max_exoneration_traces,
                **self._overlay_kw,
            )
        self._set_jobs(cluster)
        self.stats["model_endpoints"] = len(cluster.endpoints)
        self.stats["model_gone"] = len(cluster.gone)
        self._members_sig = sig  # adopted: the same rows again change nothing
        return True

    def _adoptable(self, members: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The controller's rows the model can hold, in id order. Left out, and named once: an
        endpoint on a host or rail the fabric lacks (a fabric file older than the cluster:
        nothing can place its pairs' links; its records are dropped as a stranger's), and all
        but the newest id of one registration (job, container, rail) listed twice. Either one
        left in made the model's update fail half-way."""
        rows = sorted(members, key=lambda m: int(m["ep"]))
        newest = {_name(m): int(m["ep"]) for m in rows}
        keep = [m for m in rows if (str(m["host"]), int(m["rail"])) in self._tor_of]
        keep = [m for m in keep if newest[_name(m)] == int(m["ep"])]
        kept = {int(m["ep"]) for m in keep}
        left = frozenset(
            f"{_name(m)}@{m['host']} (id {m['ep']})" for m in rows if int(m["ep"]) not in kept
        )
        self.stats["endpoints_not_adopted"] = len(left)
        if left and left != self._left_out:
            log.error(
                "%d endpoint(s) not watched: on a host or rail the fabric does not have (is the "
                "analyzer's fabric file older than the cluster?), or registered twice: %s",
                len(left),
                ", ".join(sorted(left)[:8]) + (" ..." if len(left) > 8 else ""),
            )
        self._left_out = left
        return keep

    def _tor_group(self, e: Endpoint, cluster: Cluster) -> int:
        """The group id of the ToR endpoint ``e`` hangs off (-1: gone)."""
        if e.ep_id in cluster.gone:
            return -1
        return self._tors.setdefault(self._tor_of[(e.host, e.rail)], len(self._tors))

    def _depart(self, eps: list[int]) -> None:
        """Model ids ``eps`` left: retired (a stopped job's already are), released from the
        model, and out of what localization reads next (recent probes, a pending verdict's
        pairs). Open alerts naming them stay as they are: their ids still name them, and
        detection no longer holds them, so they resolve."""
        assert self.cluster is not None
        self.detector.retire(eps)
        for e in eps:
            self.cluster.release(e)
            self._gone_at[e] = self._now_ns
        gone = np.array(eps, np.int64)
        left = set(eps)
        self.counters.forget(gone)
        self._recent = [
            (t, p[~(np.isin(p["src_ep"], gone) | np.isin(p["dst_ep"], gone))])
            for t, p in self._recent
        ]
        if self._pending is not None:
            v, ev, since = self._pending
            pairs = tuple(p for p in v.pairs if not set(p) & left)
            self._pending = (replace(v, pairs=pairs), ev, since) if pairs else None
        self._live = {c: m for c, m in self._live.items() if m not in left}

    def _free_ids(self) -> list[int]:
        """Gone ids that may be given again, lowest first: gone for :data:`REUSE_AFTER_S` and
        named by no open alert nor the pending verdict (an alert goes on naming its endpoints
        until it resolves)."""
        due = self._now_ns - int(REUSE_AFTER_S * 1e9)
        free = {e for e, t in self._gone_at.items() if t <= due}
        if not free:
            return []
        named: set[int] = set()
        for v in self.tracker.open:
            named |= {e for p in v.pairs for e in p}
        for pairs, eps in self._watch.values():
            named |= {e for p in pairs for e in p} | eps
        if self._pending is not None:
            named |= {e for p in self._pending[0].pairs for e in p}
        return sorted(free - named)

    def _set_jobs(self, cluster: Cluster) -> None:
        """The per-job state of the jobs with live endpoints (a job none is left of goes; its
        skeleton version stays known, for a job of that name again)."""
        hosts = {h: i for i, h in enumerate(self.fabric.hosts)}
        by_job: dict[str, list[Any]] = {}
        # in the controller's order (its ids grow as endpoints register; a given-again model
        # id does not): containers are ranked by it
        for e in sorted(cluster.live_endpoints, key=lambda e: int(self._to_ctl[e.ep_id])):
            by_job.setdefault(e.job, []).append(e)
        for job, st in self.jobs.items():
            self._versions[job] = max(int(self._versions.get(job, 0)), st.skeleton_version)
        jobs = {}
        for job in [*(j for j in self.jobs if j in by_job), *by_job]:
            if job in jobs:
                continue
            eps = by_job[job]
            first: dict[str, int] = {}
            for e in eps:
                first.setdefault(e.container, e.ep_id)
            rank_of = {c: i for i, c in enumerate(sorted(first, key=first.__getitem__))}
            old = self.jobs.get(job)
            jobs[job] = _JobState(
                np.array([e.ep_id for e in eps], np.uint32),
                np.array([hosts[e.host] for e in eps], np.int64),
                np.array([e.rail for e in eps], np.int64),
                np.array([rank_of[e.container] for e in eps], np.int64),
                old.applied_digest if old else None,
                max(old.skeleton_version if old else 0, int(self._versions.get(job, 0))),
                old.skeleton if old else None,
            )
        self.jobs = jobs

    def set_cluster(self, cluster: Cluster) -> bool:
        """Adopt a model's endpoints, as :meth:`set_endpoints` takes them from the controller
        (the simulator and tests know the cluster without one)."""
        return self.set_endpoints(
            {
                "ep": e.ep_id,
                "job": e.job,
                "container": e.container,
                "host": e.host,
                "rail": e.rail,
                "ip": e.ip,
            }
            for e in cluster.live_endpoints
        )

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

    def ready(self, eps: Iterable[int]) -> None:
        """Endpoints (controller ids) announced ready: one stopped before is watched afresh
        (its container started again under the same registration, so it kept its model id)."""
        a = np.fromiter(eps, np.int64)
        m = self._model(a) if self.cluster is not None else a
        self.detector.ready(m[m >= 0].tolist())

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
        self._now_ns = max(self._now_ns, int(now_ns))
        if self._restored:  # the tracker's side: a shard's observe never has any
            self._reopen(now_ns)
        alerts, events = self.observe(probes, counters, now_ns, heartbeats)
        events = self._unexplained(events)
        verdicts: list[tuple[Verdict, SuspectEvent | None]] = []
        due = self._pending is not None and now_ns - self._pending[2] >= self._grace_ns
        if (events or due) and self.localizer is not None:
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
        counters = self._records_in(counters, ("ep",))
        self.counters.add(counters)
        self.detector.link_state(counters)
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

    @property
    def _grace_ns(self) -> int:
        return int(self.cfg.unexplained_after_s * 1e9)

    def _skeletons(self, now_ns: int) -> list[dict[str, Any]]:
        out = []
        for job, st in self.jobs.items():
            if self.counters.span_s(st.ep_id) < self.cfg.skeleton.min_duration_s + 2:
                continue
            # TX apart from RX at the agents' rate (10 Hz by default): partners' sends line up
            x, tx, hz = self.counters.series(st.ep_id)
            if st.skeleton is not None and st.skeleton.confident:
                changed, why = traffic_changed(
                    st.skeleton, st.ep_id, x, sample_hz=hz, params=self.cfg.skeleton
                )
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
            # no prior: each inference reads the whole history, whose windows overlap (evidence
            # carried over would count the same seconds twice)
            sk = infer_skeleton(
                st.ep_id,
                st.host,
                st.rail,
                x,
                tx_bytes=tx,
                sample_hz=hz,
                container=st.rank,
                job=job,
                params=self.cfg.skeleton,
            )
            st.skeleton = sk
            log.info(
                "job %s: inferred %s over %.0f s at %d Hz (confidence %.2f): %s",
                job,
                sk.mode,
                x.shape[1] / hz,
                hz,
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
        on exactly those pairs surfaces once the first alert resolves.) An "unexplained" alert
        explains nothing: what detection finds on its pairs is new evidence, localized again."""
        self.stats["events"] += len(events)
        held_pairs: set[tuple[int, int]] = set()
        held_eps: set[int] = set()
        net_pairs: set[tuple[int, int]] = set()
        for key, (pairs, eps) in self._watch.items():
            if key[0] == "unexplained":
                continue
            held_pairs |= pairs
            held_eps |= eps
            if key[0] != "agent":
                net_pairs |= pairs
        # a probe and its reply cross both directions: a pair and its reverse fail together
        held_pairs |= {(b, a) for a, b in held_pairs}
        net_pairs |= {(b, a) for a, b in net_pairs}
        out = []
        for ev in events:
            pairs, eps = set(ev.pairs), set(ev.endpoints)
            if getattr(ev, "flapping", False):
                out.append(ev)  # an outage that came back: it refines the open alert's type
                continue
            if eps and ev.kind != "agent":
                # a link down under a dead agent: the agent's alert holds these pairs but does
                # not explain them; only a network alert on them does
                if pairs <= net_pairs:
                    self.stats["events_explained"] += 1
                else:
                    out.append(ev)
                continue
            if (pairs or eps) and pairs <= held_pairs and eps <= held_eps:
                self.stats["events_explained"] += 1
                continue
            out.append(ev)
        return out

    def _probe_view(
        self, p: np.ndarray, failing: set[tuple[int, int]], now_ns: int, since_ns: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Healthy pairs (answered in the last seconds with no failed probe and no open
        suspicion, and answered since ``since_ns``, when the failures began: a pair last heard
        before then says nothing about the fault, neither that the links it crosses are clear
        nor that its source still sends, which is what tells a changed GID from a blackhole
        whose other side has not reported yet; the localizer traces some to clear the links
        they cross) and responsive endpoints (their own probes came back, sent both since the
        failures began and within the heartbeat timeout: their agents are alive). Only that
        recent: the probes a crashed agent sent before it died, still in the look-back, must
        not make it look late rather than dead, whether the crash was seen by its missing
        heartbeats or within a second by refused probes. ``p``: :meth:`recent_probes`."""
        if not p.size:
            return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
        healthy, _ = probe_view(p)
        heard, _ = probe_view(p[p["t_wall_ns"] >= since_ns])
        healthy = healthy[
            np.isin(pair_keys(healthy[:, 0], healthy[:, 1]), pair_keys(heard[:, 0], heard[:, 1]))
        ]
        alive_ns = now_ns - int(self.cfg.detector.health.heartbeat_timeout_s * 1e9)
        alive_ns = max(alive_ns, since_ns)
        _, responsive = probe_view(p[p["t_wall_ns"] >= alive_ns])
        if failing and healthy.size:
            f = np.array(sorted(failing), np.int64)
            healthy = healthy[
                ~np.isin(pair_keys(healthy[:, 0], healthy[:, 1]), pair_keys(f[:, 0], f[:, 1]))
            ]
        return healthy, responsive

    def _failing_reverses(self, s: Suspect, p: np.ndarray) -> tuple[tuple[int, int], ...]:
        """The reverses of ``s``'s pairs that failed a probe (of ``p``, :meth:`recent_probes`)
        since ``s`` began. A probe and its
        reply cross both directions, so one fault fails a pair and its reverse; each prober
        reports its own side, and the side detection saw first may be the one whose forward
        path is intact (a missing FDB entry at the responder's host breaks only replies)."""
        if s.symptom == "latency":
            return ()
        p = p[
            np.isin(p["status"], _FAILED) & (p["t_wall_ns"] >= s.first_seen_ns - _REVERSE_SLACK_NS)
        ]
        if not p.size:
            return ()
        mine = set(s.pairs)
        rev = np.array(sorted({(b, a) for a, b in s.pairs} - mine), np.int64).reshape(-1, 2)
        hit = np.isin(pair_keys(rev[:, 0], rev[:, 1]), pair_keys(p["src_ep"], p["dst_ep"]))
        return tuple((int(a), int(b)) for a, b in rev[hit].tolist())

    def _unexplained_again(
        self, events: bool, now_ns: int
    ) -> list[tuple[Suspect, SuspectEvent | None]]:
        """What nothing explained so far and detection still holds: the pending verdict, and
        with new events the open "unexplained" alerts. Localized again with the new evidence."""
        open_pairs, _eps = self.detector.open_incidents(now_ns)
        out = []
        if self._pending is not None:
            v, ev, _since = self._pending
            pairs = tuple(p for p in v.pairs if p in open_pairs)
            if pairs:
                out.append((Suspect(pairs, v.symptom, v.first_seen_ns), ev))
        if events:
            for v in self.tracker.open:
                watched = self._watch.get(v.key)
                if v.layer != "unexplained" or watched is None:
                    continue
                pairs = tuple(sorted(watched[0] & open_pairs))
                if pairs:
                    out.append(
                        (Suspect(pairs, v.symptom, v.first_seen_ns), self._events.get(v.key))
                    )
        return out

    def _localize(
        self, events: list[SuspectEvent], now_ns: int
    ) -> list[tuple[Verdict, SuspectEvent | None]]:
        assert self.localizer is not None and self.cluster is not None
        suspects: list[tuple[Suspect, SuspectEvent | None]] = []
        for ev in events:
            try:
                suspects.append((Suspect.from_event(ev), ev))
            except ConfigError as exc:
                log.warning("cannot localize %s: %s", ev.kind, exc)
        suspects += self._unexplained_again(bool(suspects), now_ns)
        pending, self._pending = self._pending, None
        if not suspects:
            return []
        t0 = time.monotonic()
        recent = self.recent_probes()
        suspects = [
            (dataclasses.replace(s, pairs=s.pairs + extra), ev) if extra else (s, ev)
            for s, ev in suspects
            for extra in (self._failing_reverses(s, recent),)
        ]
        # the flows to trace: the path ids each pair's probes failed on (without them the
        # localizer traces path id 0, a flow that may well be healthy: under ECMP a pair fails
        # on some of its paths only)
        suspects = [
            (s, ev) if s.path_ids else (replace(s, path_ids=failing_path_ids(recent, s.pairs)), ev)
            for s, ev in suspects
        ]
        failing = {p for s, _ev in suspects for p in s.pairs}
        since_ns = min(s.first_seen_ns for s, _ev in suspects)
        healthy, responsive = self._probe_view(recent, failing, now_ns, since_ns)
        verdicts, reads = self.locate(
            [s for s, _ev in suspects],
            healthy,
            now_ns,
            known=self.tracker.open,
            responsive=responsive,
        )
        took_s = time.monotonic() - t0
        self._localization = {"took_s": round(took_s, 3), "reads": reads}
        log.info(
            "localized %d event(s) into %d verdict(s) in %.1f s (%s)",
            len(events),
            len(verdicts),
            took_s,
            reads,
        )
        out = []
        for v in verdicts:
            ev = next((e for s, e in suspects if set(v.pairs) & set(s.pairs)), suspects[0][1])
            if v.layer == "unexplained":
                # the first round often holds part of a fault: keep looking a moment before
                # telling anyone nothing explains it
                since = now_ns
                if pending is not None and set(pending[0].pairs) & set(v.pairs):
                    since = pending[2]
                if now_ns - since < self._grace_ns:
                    self._pending = (v, ev, since)
                    continue
            out.append((v, ev))
        self.stats["verdicts"] += len(out)
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
        # cheap, decisive reads first (every host's overlay state and report, in one go); the
        # localizer plans the traces its underlay vote wants (plan_traces) and they are all
        # fetched at once when it asks for its first
        prefetch_hosts = getattr(source, "prefetch_hosts", None)
        if prefetch_hosts is not None:
            prefetch_hosts(sorted({self.cluster.endpoints[e].host for e in eps}))
        # the flows that lost probes (the localizer traces path id 0 of a pair without
        # records): a source that traces both legs of a round trip does so for these only. A
        # slow flow lost nothing: its answers came back, its slowness is on the way its probes'
        # trace follows, and tracing every slow flow's way back doubled a latency round's traces
        failed_flows = getattr(source, "failed_flows", None)
        if failed_flows is not None:
            failed_flows(
                (p, pid)
                for s in suspects
                if s.symptom != "latency"
                for p in s.pairs
                for pid in s.path_ids.get(p) or (0,)
            )
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
        # an "unexplained" alert whose pairs a fresh verdict explains is no longer confirmed by
        # them (it resolves like any alert no round confirms)
        covered = {p for v in confirm if v.layer != "unexplained" for p in v.pairs}
        covered |= {(b, a) for a, b in covered}
        for v in self.tracker.open:
            watched = self._watch.get(v.key)
            if v.layer == "unexplained" and watched is not None and covered & watched[0]:
                self._watch[v.key] = (watched[0] - covered, watched[1])
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
            self._watch[v.key] = (set(v.pairs), _held_eps(ev))
            out.append(
                verdict_alert(self._alert_out(v), "open", ev, localization=self._localization)
            )
        for v in upd.ongoing:
            if v.key in fresh:
                old_p, old_e = self._watch.get(v.key, (set(), set()))
                ev = by_key.get(v.key)
                self._watch[v.key] = (
                    old_p | set(v.pairs),
                    old_e | _held_eps(ev),
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
