""":class:`ShardedPipeline`: the analyzer's :class:`~skh.orchestrator.pipeline.Pipeline` with its
detection half spread over Ray actors.

The coordinator (this object, in the analyzer's process) keeps what must be one: the cluster
model, the alert tracker and its deduplication, skeleton installs on the controller and the
alerts' order; the analyzer daemon around it stays the one durable publisher (alert log, bus,
replay). Per round it routes the records by shard (:class:`~.placement.Placement`), has every
shard run :meth:`Pipeline.observe` on its part at the same ``now_ns``, merges their events
(:func:`~.merge.merge_events`) and goes on as the single process does: unexplained events,
localization (on a :class:`~.actors.LocalizerActor`), tracking.

Recovery: each shard's round inputs are kept (as object refs the coordinator owns) until a
checkpoint of that shard covers them; every ``checkpoint_rounds`` a shard's state is taken
(:meth:`ShardActor.checkpoint`, also owned here, so it outlives the shard). A shard that dies
is restarted by Ray (``max_restarts=-1``); its next call finds it behind, and it is restored
from the checkpoint and the rounds since, replayed through the same code. Detection is
deterministic in its inputs, so the restored shard is the shard that died: the round it died
in is answered once, no alert is lost or repeated.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from skh.analysis.detect import SuspectEvent
from skh.analysis.localize import Suspect, Verdict
from skh.analysis.skeleton import Skeleton
from skh.errors import ConfigError
from skh.model import Cluster
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.rounds import Pipeline
from skh.orchestrator.shard.actors import (
    LocalizerActor,
    RoundInput,
    ShardActor,
    ShardReply,
)
from skh.orchestrator.shard.ingest import IngestFrontEnd
from skh.orchestrator.shard.merge import merge_events, merge_incidents
from skh.orchestrator.shard.placement import Placement
from skh.records import empty_probes

__all__ = ["ShardOptions", "ShardedPipeline"]

log = logging.getLogger(__name__)

_MEMBER_KEYS = ("ep", "job", "container", "host", "rail", "ip", "netdev")


@dataclass(frozen=True, slots=True)
class ShardOptions:
    shards: int = 2
    #: a shard's state is checkpointed every this many rounds (its replay log is that long)
    checkpoint_rounds: int = 30
    #: a job with more endpoints is placed rail by rail (:mod:`.placement`)
    max_cell_endpoints: int = 8192
    #: cells sharing a detector group (a ToR) are placed together up to this many endpoints
    max_component_endpoints: int = 16384
    #: Ray CPUs each actor asks for (fractions let a small machine hold many shards)
    actor_cpus: float = 1.0
    #: PULL addresses of ingest front-ends, one actor each (agents may push to any of them)
    ingest_binds: tuple[str, ...] = ()
    #: how long a shard Ray is restarting may take to come back before the round fails
    restore_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.shards < 1 or self.checkpoint_rounds < 1 or not self.restore_timeout_s > 0:
            raise ConfigError(
                "ShardOptions needs shards and checkpoint_rounds >= 1 and restore_timeout_s > 0. "
                f"Got {self.shards!r}, {self.checkpoint_rounds!r}, {self.restore_timeout_s!r}."
            )
        if not self.actor_cpus >= 0:
            raise ConfigError(f"actor_cpus must be >= 0. Got {self.actor_cpus!r} instead.")


class _Detection:
    """What the rest of the pipeline asks of ``pipeline.detector``: the open incidents, the
    shards' of the last round, and the endpoint groups the shards' detectors pool loss evidence
    over, which also decide placement (heartbeats and retirements go through
    :meth:`ShardedPipeline.heartbeat` and :meth:`ShardedPipeline.retire`). Anything else a
    detector does is the shards': asked of this, it fails rather than act on one shard."""

    def __init__(self, owner: ShardedPipeline) -> None:
        self._owner = owner

    def open_incidents(self, now_ns: int | None = None) -> tuple[set[tuple[int, int]], set[int]]:
        return self._owner._incidents

    def set_endpoint_groups(self, *groups: np.ndarray) -> None:
        self._owner._set_groups(groups)

    def set_endpoint_links(self, links: np.ndarray) -> None:
        """Nothing to do: each shard's own :meth:`Pipeline.set_endpoints` tells its detector
        the access links, from the members it is sent."""

    def set_endpoint_pods(self, pods: np.ndarray) -> None:
        """Nothing to do: each shard's own :meth:`Pipeline.set_endpoints` tells its detector
        the pods, from the members it is sent."""

    def set_endpoint_containers(self, containers: np.ndarray) -> None:
        """Nothing to do: each shard's own :meth:`Pipeline.set_endpoints` tells its detector
        the containers (link state), from the members it is sent."""

    def retire(self, eps: Sequence[int]) -> None:
        """Nothing to do: endpoints that left the members are retired by each shard's own
        :meth:`Pipeline.set_endpoints` (and those stopped, by :meth:`ShardedPipeline.retire`)."""

    def reuse(self, eps: Sequence[int]) -> None:
        """Nothing to do: each shard's own :meth:`Pipeline.set_endpoints` has its detector
        forget a gone id given again (the member rows carry it)."""


class ShardedPipeline(Pipeline):
    """A :class:`Pipeline` whose detection runs on ``options.shards`` Ray actors (Ray must be
    initialised: :func:`skh.orchestrator.shard.connect`).

    ``sources``: a picklable ``cluster -> StateSource`` the localizer actor builds each round's
    source with (the daemon's: agents through the controller); without it the
    ``source_factory`` is shipped with each localization (the simulator's). ``security`` and
    ``ingest`` (keyword arguments of :class:`IngestFrontEnd`: the controller whose key bindings
    it mirrors, the per-round record caps) go to the ingest front-ends, which authorize as the
    analyzer does."""

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        source_factory: Callable[[Cluster], Any],
        apply_skeleton: Callable[[str, Skeleton, int], bool],
        overlay_endpoint: Callable[..., tuple[str, str]] | None = None,
        overlay_component: Callable[[str], str | None] | None = None,
        options: ShardOptions | None = None,
        sources: Callable[[Cluster], Any] | None = None,
        security: Any = None,
        ingest: Mapping[str, Any] | None = None,
        max_frame_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        super().__init__(
            cfg,
            source_factory=source_factory,
            apply_skeleton=apply_skeleton,
            overlay_endpoint=overlay_endpoint,
            overlay_component=overlay_component,
        )
        if not ray.is_initialized():
            raise ConfigError("the sharded analyzer needs Ray: connect to a cluster first")
        self.options = opt = options or ShardOptions()
        self.placement = Placement(
            opt.shards,
            max_cell_endpoints=opt.max_cell_endpoints,
            max_component_endpoints=opt.max_component_endpoints,
        )
        self.detector = _Detection(self)  # type: ignore[assignment]
        self._sources = sources
        actor = {"num_cpus": opt.actor_cpus, "max_restarts": -1, "max_task_retries": 0}
        self.shards = [ShardActor.options(**actor).remote(i, cfg) for i in range(opt.shards)]
        self._localizer = LocalizerActor.options(**actor).remote(cfg, self._overlay_kw, sources)
        self.frontends = [
            IngestFrontEnd.options(**actor).remote(
                b, security, opt.shards, max_frame_bytes, **(ingest or {})
            )
            for b in opt.ingest_binds
        ]
        self.ingest_addresses = ray.get([f.address.remote() for f in self.frontends])
        self._round = -1
        self._incidents: tuple[set[tuple[int, int]], set[int]] = (set(), set())
        self._members: tuple[Mapping[str, Any], ...] = ()
        self._members_version = 0
        #: the detector's corroboration groupings (model ids -> group id), as it was given them
        self._groups: tuple[np.ndarray, ...] = ()
        self._groups_due = False  # groupings not placed yet
        self._registering = False  # inside set_endpoints
        n = opt.shards
        self._heartbeats: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(n)]
        self._retire: list[list[int]] = [[] for _ in range(n)]
        self._ready: list[list[int]] = [[] for _ in range(n)]
        self._commits: list[list[tuple[str, str, int]]] = [[] for _ in range(n)]
        self._members_due = [False] * n
        #: per shard: inputs since its checkpoint, the checkpoint (ref, round), one in flight
        self._log: list[list[RoundInput]] = [[] for _ in range(n)]
        self._ckpt: list[tuple[Any, int]] = [(None, -1)] * n
        self._ckpt_pending: list[tuple[Any, int] | None] = [None] * n
        #: seconds each restore took (kill to answered round), for the operator and the bench
        self.recoveries: list[float] = []
        self.shard_stats: list[dict[str, int]] = [{} for _ in range(n)]
        self.ingest_stats: list[dict[str, int]] = [{} for _ in self.frontends]
        self.stats.update(
            {
                "restores": 0,
                "states_lost": 0,
                "unplaced_records": 0,
                "cross_cell_records": 0,
                "split_groups": 0,
            }
        )

    # -- the model ----------------------------------------------------------------------------
    def set_endpoints(
        self,
        members: Iterable[Mapping[str, Any]],
        skeleton_versions: Mapping[str, int] | None = None,
    ) -> bool:
        """As :meth:`Pipeline.set_endpoints`; the shards get the registry with their next round
        (the skeleton versions stay here: :meth:`_install` numbers what they propose)."""
        rows = tuple({k: m[k] for k in _MEMBER_KEYS if k in m} for m in members)
        before = self._members_sig
        self._registering = True  # groupings set on the way are placed with the new rows
        try:
            if not super().set_endpoints(rows, skeleton_versions):
                return False
        finally:
            self._registering = False
        if self._members_sig == before and self._members:
            if self._groups_due:
                self._place()
            return True
        # with their model ids: an actor that missed a change, or starts over, numbers as this
        # (the rows the model left out, too: see Pipeline._adoptable, are not sent)
        self._members = tuple(
            r | {"model": self._live[int(r["ep"])]} for r in rows if int(r["ep"]) in self._live
        )
        self._place()
        self._members_version += 1
        # not waited for: a localizer that missed it is sent it again when it is asked
        self._localizer.set_members.remote(self._members, self._members_version)
        return True

    def _set_groups(self, groups: Sequence[np.ndarray]) -> None:
        """The detector's endpoint groupings (model ids): the shards' detectors get them with
        the registry, and cells sharing a group are placed together (:mod:`.placement`)."""
        self._groups = tuple(np.asarray(g, np.int64).copy() for g in groups)
        self._groups_due = True
        if self._members and not self._registering:
            self._place()

    def _place(self) -> None:
        """(Re)place the registry's endpoints with the groupings in controller ids; every shard
        gets the registry and groupings with its next round."""
        self._groups_due = False
        ctl = self._to_ctl
        groups = []
        for g in self._groups:
            out = np.full(int(ctl.max(initial=-1)) + 1, -1, np.int64)
            k = min(g.size, ctl.size)
            known = ctl[:k] >= 0
            out[ctl[:k][known]] = g[:k][known]
            groups.append(out)
        self.placement.update(self._members, groups)
        if self.placement.split_groups != self.stats["split_groups"]:
            # said when it changes, not at every registration: past max_component_endpoints a
            # split is expected, and each shard pools over its part of the group
            log.warning(
                "%d corroboration group(s) (ToRs) span shards (cells too many to join, or placed "
                "before the group joined them): each shard pools over its part of them",
                self.placement.split_groups,
            )
        self.stats["split_groups"] = self.placement.split_groups
        self._members_due = [True] * self.options.shards
        for f in self.frontends:
            f.set_routes.remote(self.placement.ep_shard, self.placement.ep_home)

    # -- the edge: heartbeats and retirements (controller ids) to their shards ----------------
    def heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        eps = np.atleast_1d(np.asarray(eps, np.int64))
        sh = self.placement.shard_of(eps)
        for s in np.unique(sh[sh >= 0]).tolist():
            self._heartbeats[s].append((eps[sh == s], int(t_ns)))

    def retire(self, eps: Iterable[int]) -> None:
        a = np.fromiter(eps, np.int64)
        sh = self.placement.shard_of(a)
        for s in np.unique(sh[sh >= 0]).tolist():
            mine = a[sh == s].tolist()
            # a shard applies a round's retirements, then its readiness: a ready one stopped
            # later in the same round stays stopped
            stopped = set(mine)
            self._ready[s] = [e for e in self._ready[s] if e not in stopped]
            self._retire[s].extend(mine)

    def ready(self, eps: Iterable[int]) -> None:
        a = np.fromiter(eps, np.int64)
        sh = self.placement.shard_of(a)
        for s in np.unique(sh[sh >= 0]).tolist():
            self._ready[s].extend(a[sh == s].tolist())

    # -- detection, on the shards -------------------------------------------------------------
    def observe(
        self,
        probes: np.ndarray,
        counters: np.ndarray,
        now_ns: int,
        heartbeats: np.ndarray | None = None,
    ) -> tuple[list[dict[str, Any]], list[SuspectEvent]]:
        self._round += 1
        routed = self.placement.route(probes, counters, heartbeats)
        self.stats["unplaced_records"] += routed.unplaced
        self.stats["cross_cell_records"] += routed.cross_cell
        n = self.options.shards
        flushes = [f.flush.options(num_returns=n + 1).remote() for f in self.frontends]
        inputs = []
        for s in range(n):
            inputs.append(
                RoundInput(
                    self._round,
                    int(now_ns),
                    (routed.probes[s],) if routed.probes[s].size else (),
                    (routed.counters[s],) if routed.counters[s].size else (),
                    tuple(fl[s] for fl in flushes),
                    tuple(self._heartbeats[s]),
                    routed.heartbeats[s] if heartbeats is not None else None,
                    tuple(self._retire[s]),
                    tuple(self._ready[s]),
                    self._members if self._members_due[s] else None,
                    frozenset(self.placement.jobs_of(s)),
                    tuple(self._commits[s]),
                    self._groups if self._members_due[s] else None,
                )
            )
            self._heartbeats[s], self._retire[s], self._commits[s] = [], [], []
            self._ready[s] = []
            self._members_due[s] = False
        replies = self._run(inputs)
        for i, fl in enumerate(flushes):
            try:
                self.ingest_stats[i] = ray.get(fl[n])
            except (RayActorError, RayTaskError) as exc:  # its batches of this round are lost
                log.warning("ingest front-end %d: %s", i, exc)
        for s, rp in enumerate(replies):
            self.shard_stats[s] = rp.stats
        self._incidents = merge_incidents([rp.incidents for rp in replies])
        alerts = self._install([p for rp in replies for p in rp.proposals])
        self._checkpoints()
        return alerts, merge_events([rp.events for rp in replies])

    def _run(self, inputs: list[RoundInput]) -> list[ShardReply]:
        refs = []
        for s, inp in enumerate(inputs):
            self._log[s].append(inp)
            refs.append(self.shards[s].round.remote(inp))
        out = []
        for s, ref in enumerate(refs):
            try:
                reply = ray.get(ref)
            except RayActorError:
                reply = None
            out.append(reply if reply is not None else self._recover(s))
        return out

    def _recover(self, s: int) -> ShardReply:
        """Shard ``s`` lost its state (Ray restarted it): restore it and answer this round."""
        t0 = time.monotonic()
        blob, at = self._ckpt[s]
        replay = [i for i in self._log[s][:-1] if i.round_no > at]
        attempt = 0
        while time.monotonic() - t0 < self.options.restore_timeout_s:
            attempt += 1
            try:
                try:
                    done = ray.get(self.shards[s].restore.remote(blob, replay, at))
                except ObjectLostError:
                    blob, at, replay = self._lost(s)
                    continue
                if done != self._round - 1:
                    raise RuntimeError(f"shard {s} restored to round {done}, not {self._round - 1}")
                reply = ray.get(self.shards[s].round.remote(self._log[s][-1]))
            except RayActorError as exc:  # still restarting, or died again: Ray brings it back
                log.info("shard %d: restore attempt %d: %s", s, attempt, exc)
                time.sleep(min(0.05 * attempt, 1.0))
                continue
            if reply is not None:
                took = time.monotonic() - t0
                self.recoveries.append(took)
                self.stats["restores"] += 1
                log.warning(
                    "shard %d restored from round %d + %d replayed in %.1f s",
                    s,
                    at,
                    len(replay),
                    took,
                )
                return reply
        raise RuntimeError(f"shard {s} did not come back in {self.options.restore_timeout_s:g} s")

    def _install(self, proposals: list[tuple[str, Skeleton, int]]) -> list[dict[str, Any]]:
        """Install the shards' new skeletons (controller ids) in job order (the single
        pipeline's order), numbered after the version the job has here (which the controller's
        count moves on: :meth:`set_endpoints`)."""
        order = {j: i for i, j in enumerate(self.jobs)}
        out = []
        for job, sk, version in sorted(proposals, key=lambda p: order.get(p[0], len(order))):
            st = self.jobs.get(job)
            if st is not None:
                version = max(version, st.skeleton_version + 1)
            if not self.apply_skeleton(job, sk, version):
                continue
            if st is not None:
                st.applied_digest, st.skeleton_version = sk.digest, version
            self._commits[self.placement.home[job]].append((job, sk.digest, version))
            out.append(self._installed(job, sk, version))
        return out

    def _checkpoints(self) -> None:
        k = self.options.checkpoint_rounds
        for s, sh in enumerate(self.shards):
            pending = self._ckpt_pending[s]
            if pending is not None:
                ready, _ = ray.wait([pending[0]], timeout=0)
                if ready:
                    self._ckpt_pending[s] = None
                    try:
                        ok = ray.get(pending[0]) is not None
                    except RayActorError:
                        ok = False
                    if ok:
                        self._ckpt[s] = pending
                        self._log[s] = [i for i in self._log[s] if i.round_no > pending[1]]
            # shards take turns, so one round does not pay for all of them
            if self._ckpt_pending[s] is None and (self._round + s) % k == k - 1:
                self._ckpt_pending[s] = (sh.checkpoint.remote(self._round), self._round)

    # -- what the other half asks -------------------------------------------------------------
    def recent_probes(self) -> np.ndarray:
        parts = []
        for s, sh in enumerate(self.shards):
            got = ray.get(sh.recent.remote(self._round))
            if got is None:
                self._recover_idle(s)
                got = ray.get(sh.recent.remote(self._round))
            parts.append(got if got is not None else empty_probes())
        return np.concatenate(parts) if parts else empty_probes()

    def _recover_idle(self, s: int) -> None:
        """Shard ``s`` died after answering the last round: bring it back to that round."""
        blob, at = self._ckpt[s]
        replay = [i for i in self._log[s] if i.round_no > at]
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.options.restore_timeout_s:
            try:
                ray.get(self.shards[s].restore.remote(blob, replay, at))
                self.stats["restores"] += 1
                return
            except ObjectLostError:
                blob, at, replay = self._lost(s, self._round)
            except RayActorError:
                time.sleep(0.2)
        raise RuntimeError(f"shard {s} did not come back")

    def _lost(self, s: int, at: int | None = None) -> tuple[None, int, list[RoundInput]]:
        """The checkpoint of shard ``s`` went with its node (a checkpoint lives in the object
        store of the node that took it): the shard starts over from nothing after round ``at``
        (default: the round before this one). Its look-back is gone for a few minutes (the fast
        path and endpoint health work from its first round again); nothing published is
        repeated: alerts are the coordinator's."""
        at = self._round - 1 if at is None else at
        log.error("shard %d: its checkpoint is lost with its node; it starts over", s)
        self.stats["states_lost"] += 1
        self._ckpt[s] = (None, at)
        keep = [i for i in self._log[s] if i.round_no > at]
        if keep:  # the registry comes with the round it resumes at, or with the next one
            keep[0] = dataclasses.replace(keep[0], members=self._members, groups=self._groups)
        else:
            self._members_due[s] = True
        self._log[s] = keep
        return None, at, []

    def locate(
        self,
        suspects: list[Suspect],
        healthy: np.ndarray,
        now_ns: int,
        *,
        known: Sequence[Verdict] = (),
        responsive: np.ndarray | None = None,
    ) -> tuple[list[Verdict], dict[str, int]]:
        ship = None if self._sources is not None else self.source_factory
        for _ in range(2):
            try:
                got = ray.get(
                    self._localizer.locate.remote(
                        self._members_version,
                        suspects,
                        healthy,
                        now_ns,
                        ship,
                        known=list(known),
                        responsive=responsive,
                    )
                )
            except RayActorError:
                got = None
            if got is not None:
                return got
            # restarted: it needs the registry again
            ray.get(self._localizer.set_members.remote(self._members, self._members_version))
        raise RuntimeError("the localizer actor could not be brought back")

    def status(self) -> dict[str, Any]:
        return {
            **self.stats,
            "shards": self.options.shards,
            "shard_stats": list(self.shard_stats),
            "ingest": dict(zip(self.ingest_addresses, self.ingest_stats, strict=True)),
            "recoveries_s": [round(t, 3) for t in self.recoveries],
        }

    def shard_pids(self) -> list[int]:
        return ray.get([sh.pid.remote() for sh in self.shards])

    def localizer_pid(self) -> int:
        return ray.get(self._localizer.pid.remote())

    def close(self) -> None:
        for f in self.frontends:
            try:
                ray.get(f.close.remote(), timeout=5)
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError):
                pass
        for a in [*self.shards, self._localizer, *self.frontends]:
            ray.kill(a, no_restart=True)
