"""The Ray actors of the sharded analyzer: detection shards and the localizer (the ingest
front-ends are in :mod:`.ingest`).

Every shard call carries the round it continues from, so a shard Ray restarted (its state
gone) says so instead of answering from an empty detector; the coordinator then restores it
(:meth:`ShardActor.restore`: the last checkpoint plus the rounds since, replayed).
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError

from skh.analysis.detect import SuspectEvent
from skh.analysis.localize import Suspect, Verdict
from skh.analysis.skeleton import Skeleton
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.rounds import Pipeline
from skh.records import empty_counters, empty_probes, pair_keys

__all__ = ["RoundInput", "ShardReply", "ShardActor", "LocalizerActor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundInput:
    """What one shard is given for one round; kept by the coordinator until a checkpoint covers
    it, so a restarted shard can be brought back by replaying it.

    ``probes``/``counters``: arrays, in arrival order; ``frontends``: refs of the
    ingest front-ends' flushes for this shard, each ``(probes, counters, heartbeats)``;
    ``heartbeats``: ``(endpoint ids, t_ns)`` heard between rounds; ``round_heartbeats``: the
    endpoints that reported in this round (the simulator's), stamped ``now_ns``. Endpoints are
    the controller's ids, as everything crossing the pipeline's edge (the shard's
    :class:`Pipeline` maps them onto its model, built from the same registry as the
    coordinator's and numbered as it (each row carries its ``model`` id), so the events it
    returns are in the coordinator's model ids, a restarted shard's included)."""

    round_no: int
    now_ns: int
    probes: tuple[np.ndarray, ...] = ()
    counters: tuple[np.ndarray, ...] = ()
    frontends: tuple[Any, ...] = ()
    heartbeats: tuple[tuple[np.ndarray, int], ...] = ()
    round_heartbeats: np.ndarray | None = None
    retire: tuple[int, ...] = ()
    #: endpoints announced ready (after ``retire``): a stopped one started again
    ready: tuple[int, ...] = ()
    #: the whole registry, with the coordinator's model ids (the shard keeps the skeleton state
    #: of ``jobs`` only), when it changed
    members: tuple[Mapping[str, Any], ...] | None = None
    jobs: frozenset[str] = frozenset()
    #: skeletons the coordinator installed: (job, digest, version)
    commits: tuple[tuple[str, str, int], ...] = ()
    #: the detector's endpoint groupings (model ids), sent with the registry
    groups: tuple[np.ndarray, ...] | None = None


@dataclass(frozen=True, slots=True)
class ShardReply:
    events: list[SuspectEvent]
    #: skeletons inferred this round that would replace the installed list: (job, skeleton, version)
    proposals: list[tuple[str, Skeleton, int]]
    incidents: tuple[set[tuple[int, int]], set[int]]
    stats: dict[str, int] = field(default_factory=dict)


def _flushes(refs: Sequence[Any]) -> list[tuple[np.ndarray, np.ndarray, list[Any]]]:
    """The ingest front-ends' parts of a round; a front-end that died before its flush gave
    nothing (the same again when the round is replayed)."""
    out = []
    for ref in refs:
        try:
            out.append(ray.get(ref))
        except RayError as exc:
            log.warning("an ingest front-end's batches of this round are lost: %s", exc)
    return out


def _no_source(_cluster: Any) -> Any:
    raise RuntimeError("a detection shard does not localize")


class _Shard:
    """One shard's detection half: a :class:`Pipeline` whose skeleton installs are deferred to
    the coordinator (it alone talks to the controller and publishes)."""

    def __init__(self, shard: int, cfg: PipelineConfig) -> None:
        self.shard = shard
        self.pipe = Pipeline(cfg, source_factory=_no_source, apply_skeleton=self._propose)
        self.jobs: frozenset[str] = frozenset()
        self.done = -1  # the last round applied
        self._proposals: list[tuple[str, Skeleton, int]] = []

    def _propose(self, job: str, sk: Skeleton, version: int) -> bool:
        self._proposals.append((job, sk, version))
        return False  # installed by the coordinator, committed with the next round

    def apply(self, inp: RoundInput) -> ShardReply:
        p = self.pipe
        fronts = _flushes(inp.frontends)  # before any state changes: this may wait
        if inp.members is not None:
            self.jobs = inp.jobs
            if p.set_endpoints(inp.members):
                p.localizer = None  # the coordinator localizes
            p.jobs = {j: st for j, st in p.jobs.items() if j in self.jobs}
        if inp.groups is not None:
            # the coordinator's, which placed this shard's cells: every group it pools is whole
            p.detector.set_endpoint_groups(*inp.groups)
        for job, digest, version in inp.commits:
            st = p.jobs.get(job)
            if st is not None:
                st.applied_digest, st.skeleton_version = digest, version
        for eps, t_ns in list(inp.heartbeats) + [hb for f in fronts for hb in f[2]]:
            p.heartbeat(eps, t_ns)
        if inp.retire:
            p.retire(inp.retire)
        if inp.ready:
            p.ready(inp.ready)
        probes = [*inp.probes, *(f[0] for f in fronts)]
        counters = [*inp.counters, *(f[1] for f in fronts)]
        self._proposals = []
        _alerts, events = p.observe(
            np.concatenate(probes) if probes else empty_probes(),
            np.concatenate(counters) if counters else empty_counters(),
            inp.now_ns,
            inp.round_heartbeats,
        )
        self.done = inp.round_no
        st = p.detector.stats
        return ShardReply(
            events,
            self._proposals,
            p.detector.open_incidents(inp.now_ns),
            {"records_in": st.records_in, "pairs_live": st.pairs_live},
        )

    def state(self) -> bytes:
        p = self.pipe
        hooks = p.source_factory, p.apply_skeleton
        p.source_factory = p.apply_skeleton = None  # type: ignore[assignment]
        try:
            return pickle.dumps((p, self.jobs, self.done), protocol=5)
        finally:
            p.source_factory, p.apply_skeleton = hooks

    def load(self, blob: bytes) -> None:
        self.pipe, self.jobs, self.done = pickle.loads(blob)
        self.pipe.source_factory, self.pipe.apply_skeleton = _no_source, self._propose


@ray.remote
class ShardActor:
    """A detection shard. Ray restarts it when its process dies; its state is then gone, and
    every call says so (None) until :meth:`restore` brings it back."""

    def __init__(self, shard: int, cfg: PipelineConfig) -> None:
        self._s = _Shard(shard, cfg)
        self._cfg = cfg
        self.born_ns = time.time_ns()

    def round(self, inp: RoundInput) -> ShardReply | None:
        if inp.round_no != self._s.done + 1:
            return None
        return self._s.apply(inp)

    def checkpoint(self, after: int) -> bytes | None:
        return self._s.state() if self._s.done == after else None

    def restore(self, blob: bytes | None, replay: Sequence[RoundInput], start: int = -1) -> int:
        """Back to the last round of ``replay``: the checkpoint, then each round since. Without
        a checkpoint, from nothing at round ``start`` (-1: the first round)."""
        if blob is None:
            self._s = _Shard(self._s.shard, self._cfg)
            self._s.done = start
        else:
            self._s.load(blob)
        for inp in replay:
            if inp.round_no == self._s.done + 1:
                self._s.apply(inp)
        return self._s.done

    def recent(self, after: int) -> np.ndarray | None:
        """The last 15 s of probes as localization reads them: every failed row, and the
        newest answered row per pair and path id (it only asks which pairs answered, whose
        probes came back lately, when pairs failed, and which path ids a slow pair was probed
        on: the flows it traces)."""
        if self._s.done != after:
            return None
        p = self._s.pipe.recent_probes()
        ok = p[p["status"] == 0]
        ok = ok[np.argsort(ok["t_wall_ns"], kind="stable")[::-1]]
        flows = np.stack([pair_keys(ok["src_ep"], ok["dst_ep"]), ok["path_id"].astype(np.int64)])
        _, newest = np.unique(flows, axis=1, return_index=True)
        return np.concatenate([p[p["status"] != 0], ok[newest]])

    def pid(self) -> int:
        return os.getpid()


@ray.remote
class LocalizerActor:
    """Localization off the coordinator: a :class:`Pipeline` holding the cluster model and the
    localizer (its RNIC-dump rate limit lasts between rounds). ``sources(cluster)`` builds the
    state source of a round here, unless the call brings its own factory."""

    def __init__(
        self,
        cfg: PipelineConfig,
        overlay_kw: Mapping[str, Any],
        sources: Callable[[Any], Any] | None = None,
    ) -> None:
        self.pipe = Pipeline(
            cfg, source_factory=sources or _no_source, apply_skeleton=None, **overlay_kw
        )  # type: ignore[arg-type]
        self.members_sig: int | None = None

    def set_members(self, members: Sequence[Mapping[str, Any]], sig: int) -> bool:
        self.members_sig = sig if self.pipe.set_endpoints(members) else None
        return self.members_sig is not None

    def locate(
        self,
        sig: int,
        suspects: list[Suspect],
        healthy: np.ndarray,
        now_ns: int,
        sources: Callable[[Any], Any] | None = None,
        *,
        known: Sequence[Verdict] = (),
        responsive: np.ndarray | None = None,
    ) -> tuple[list[Verdict], dict[str, int]] | None:
        if sig != self.members_sig:
            return None  # restarted (or behind): the coordinator sends the registry again
        if sources is not None:
            self.pipe.source_factory = sources
        return self.pipe.locate(suspects, healthy, now_ns, known=known, responsive=responsive)

    def pid(self) -> int:
        return os.getpid()
