"""The pipeline behind the analyzer daemon: :class:`PipelineHook` runs :class:`Pipeline` on a
worker thread against the controller, so traceroutes that take seconds never stall ingest."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from skh.analysis.skeleton import Skeleton
from skh.errors import ConfigError, ProtocolError, RequestRefused, RequestTimeout
from skh.orchestrator.admin import ControllerClient
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.rounds import Pipeline
from skh.orchestrator.pipeline.state_source import AgentStateSource
from skh.probeplan import ProbePolicy

__all__ = ["PipelineHook", "check_sampling"]

log = logging.getLogger(__name__)


_MAX_QUEUED_ROUNDS = 30  # rounds waiting for a busy worker (each may hold millions of records)
_MAX_QUEUED = 200_000  # heartbeats, retirements and rounds waiting in all


class PipelineHook:
    """The analyzer daemon's round hook: rounds (and the heartbeats and retirements the daemon
    hears between them) are queued to a worker thread running the :class:`Pipeline` against the
    controller; the alerts it produced are returned by the next :meth:`on_round` (published by
    the daemon). What waits for a busy worker is bounded (``_MAX_QUEUED_ROUNDS`` rounds,
    ``_MAX_QUEUED`` items); beyond, items are dropped and counted (``dropped``).

    ``make_pipeline(cfg, source_factory=..., apply_skeleton=...)`` builds the pipeline on the
    worker (default :class:`Pipeline`; the sharded analyzer passes its
    :class:`~skh.orchestrator.shard.ShardedPipeline`)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        security: Any = None,
        *,
        make_pipeline: Callable[..., Pipeline] = Pipeline,
    ) -> None:
        if not cfg.controller:
            raise ConfigError("the pipeline hook needs the controller's address ('controller')")
        self.cfg = cfg
        self._security = security
        self._make_pipeline = make_pipeline
        self._status: dict[str, Any] = {}
        self._in: queue.Queue[tuple[str, Any, Any, int] | None] = queue.Queue(_MAX_QUEUED)
        self._out: queue.Queue[dict[str, Any]] = queue.Queue()
        self._rounds_queued = 0
        self._lock = threading.Lock()  # guards _rounds_queued (daemon thread and worker)
        self.dropped: dict[str, int] = {}
        self._round_s: queue.SimpleQueue[float] = queue.SimpleQueue()  # for the histogram
        self._thread = threading.Thread(target=self._work, name="skh-pipeline", daemon=True)
        self._thread.start()

    def _put(self, item: tuple[str, Any, Any, int]) -> bool:
        try:
            self._in.put_nowait(item)
            return True
        except queue.Full:
            self.dropped[item[0]] = self.dropped.get(item[0], 0) + 1
            return False

    def restore(self, records: list[dict[str, Any]]) -> None:
        """Alerts the durable log holds open: the pipeline tracks them again (and resolves
        those whose fault cleared while the analyzer was down)."""
        self._in.put(("restore", list(records), None, 0))

    def on_round(
        self, probes: np.ndarray, counters: np.ndarray, now_ns: int
    ) -> list[dict[str, Any]]:
        if self._rounds_queued >= _MAX_QUEUED_ROUNDS:
            self.dropped["round"] = self.dropped.get("round", 0) + 1
            log.warning("pipeline busy: a round of %d records dropped", probes.size)
        elif self._put(("round", probes, counters, now_ns)):
            with self._lock:
                self._rounds_queued += 1
        out = []
        while True:
            try:
                out.append(self._out.get_nowait())
            except queue.Empty:
                return out

    def on_heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        self._put(("heartbeat", np.asarray(eps), None, int(t_ns)))

    def drain_round_s(self) -> list[float]:
        """How long the worker's rounds took since the last call (the analyzer's histogram)."""
        out = []
        while not self._round_s.empty():
            out.append(self._round_s.get_nowait())
        return out

    def status(self) -> dict[str, Any]:
        """The pipeline's counters as of its last round (the analyzer's STATUS shows them)."""
        return dict(self._status)

    def on_retire(self, eps: list[int]) -> None:
        self._put(("retire", list(eps), None, 0))

    def on_ready(self, endpoints: list[Any]) -> None:
        """A READY_ANNOUNCE's endpoints: queued in order with retirements (a container stopped
        and started again is watched afresh)."""
        eps = [d.get("ep") if isinstance(d, dict) else None for d in endpoints]
        if not all(isinstance(e, int) and 0 <= e < 2**32 for e in eps):
            raise ProtocolError("ready_announce: an endpoint needs an int ep")
        self._put(("ready", eps, None, 0))

    def close(self) -> None:
        self._in.put(None)
        self._thread.join(timeout=self.cfg.command_timeout_s + 5)

    def _work(self) -> None:
        client = ControllerClient(self.cfg.controller, self._security, retries=0, name="analyzer")
        cfg = self.cfg

        def apply(job: str, sk: Skeleton, version: int) -> bool:
            try:
                client.apply_skeleton(job, sk.pairs, version)
                return True
            except (ProtocolError, RequestRefused, RequestTimeout) as exc:
                log.warning("skeleton of %s not applied: %s", job, exc)
                return False

        pipe = self._make_pipeline(
            cfg, source_factory=lambda cl: AgentStateSource(client, cl, cfg), apply_skeleton=apply
        )
        next_status = 0.0
        checked = False  # the controller's probe policy against this detector, once
        members: list[dict[str, Any]] = []
        members_version = -1
        try:
            while True:
                # catch up: what queued while the last round localized is merged into one round
                items = [self._in.get()]
                while True:
                    try:
                        items.append(self._in.get_nowait())
                    except queue.Empty:
                        break
                rounds = []
                for item in items:
                    if item is None:
                        return
                    kind, a, b, t_ns = item
                    if kind == "round":
                        with self._lock:
                            self._rounds_queued -= 1
                        rounds.append((a, b, t_ns))
                        continue
                    try:
                        if kind == "heartbeat":
                            pipe.heartbeat(a, t_ns)
                        elif kind == "retire":
                            pipe.retire(a)
                        elif kind == "ready":
                            pipe.ready(a)
                        else:
                            pipe.restore(a)
                    except Exception:  # a bug on one item must not stop the worker: it ends
                        # the thread, and the daemon goes on ingesting with no one detecting
                        log.exception("pipeline: %s failed, skipped", kind)
                if not rounds:
                    continue
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + 5.0
                    try:
                        # the members are read (page by page) only when they changed
                        st = client.status()
                        if not checked:
                            checked = True
                            check_sampling(cfg, st.get("probing"))
                        versions = {j: int(d["skeleton_version"]) for j, d in st["jobs"].items()}
                        if st["members_version"] != members_version:
                            members, members_version = client.members()
                    except (
                        ProtocolError,
                        RequestRefused,
                        RequestTimeout,
                        KeyError,
                        TypeError,
                    ) as exc:
                        log.warning("controller status: %s", exc)
                    else:
                        try:
                            pipe.set_endpoints(members, versions)
                        except Exception:  # as above: logged, the rows read again next time
                            log.exception("pipeline: the controller's member list not adopted")
                            members_version = -1
                t0 = time.monotonic()
                try:
                    alerts = pipe.process(
                        np.concatenate([r[0] for r in rounds]),
                        np.concatenate([r[1] for r in rounds]),
                        rounds[-1][2],
                    )
                except Exception:  # a pipeline bug must not kill the worker: logged, round dropped
                    log.exception("pipeline round failed")
                    continue
                self._round_s.put(time.monotonic() - t0)
                self._status = getattr(pipe, "status", lambda: dict(pipe.stats))()
                for alert in alerts:
                    self._out.put(alert)
        finally:
            close = getattr(pipe, "close", None)
            if close is not None:
                close()
            client.close()


def check_sampling(cfg: PipelineConfig, probing: Any) -> bool:
    """Whether the detector samples latency as the agents thin their results: the controller's
    probe policy (``ok_sample_s``, handed out with every ping list) against
    ``detector.latency_sample_s``. A disagreement is logged, not fixed: the detector's windows
    are sized from its own setting."""
    try:
        policy = ProbePolicy.from_wire(probing)
    except ProtocolError as exc:
        log.warning("the controller's probe policy is not usable here: %s", exc)
        return False
    mine = cfg.detector.latency_sample_s
    if policy.ok_sample_s and not math.isclose(policy.ok_sample_s, mine, rel_tol=1e-9):
        log.warning(
            "detector.latency_sample_s = %g s, but the controller has agents forward one OK per "
            "pair and %g s (controller.ok_sample_s): set both alike",
            mine,
            policy.ok_sample_s,
        )
        return False
    return True
