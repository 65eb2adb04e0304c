"""skh-analyzer: ingest result and counter batches, run the detection hook once per round, and
publish what it finds on the alert bus.

Sockets:

* PULL (``bind``): PROBE_BATCH and COUNTER_BATCH from every agent.
* PUB (``alerts_bind``): ALERT with sequence numbers (topic ``alert\\0``).
* REP (``replay_bind``): REPLAY since a sequence number from the durable log, and STATUS.

The hook is where detection plugs in: every ``round_s`` the analyzer hands it the round's probe
and counter records as two structured arrays (:data:`~skh.records.PROBE_DTYPE`,
:data:`~skh.records.COUNTER_DTYPE`) and publishes the alerts it returns. ``skh analyzer``
passes the full pipeline (:class:`skh.orchestrator.pipeline.PipelineHook`); without a hook and
unless ``detector = "none"`` the streaming detector of :mod:`skh.analysis.detect` is used
(:class:`DetectorHook`); ``spool_dir`` additionally archives each round's raw
records as ``.npy``.

Every pushed batch enters at :meth:`Analyzer._on_batch` and every REP request at
:meth:`Analyzer._answer`: the sender becomes a :class:`~skh.orchestrator.authz.Principal` (PULL and
REP carry no routing id: the connection's ZAP ``User-Id`` names it), the analyzer's
:class:`~skh.orchestrator.authz.Policy` authorizes the decoded message, then its type's handler
runs.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import zmq

from skh.errors import ProtocolError, Unauthorized
from skh.orchestrator.alerts import MAX_REPLAY, AlertLog, Retention
from skh.orchestrator.authz import AllowAll, Policy, Principal, transport_user_id
from skh.orchestrator.config import AnalyzerConfig
from skh.orchestrator.daemon import bind, make_socket
from skh.orchestrator.metrics import (
    SECONDS_BUCKETS,
    CallbackCollector,
    CollectorRegistry,
    Histograms,
)
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import SecurityConfig, ServerSecurity
from skh.records import empty_counters, empty_probes
from skh.wire import ALERTS_TOPIC, Codec, Envelope, MsgType, decode_counters, decode_probes

__all__ = ["Analyzer", "RoundHook", "DetectorHook", "load_detector_hook"]

log = logging.getLogger(__name__)

_DRAIN = 5000  # frames per poll wake-up before timers get a turn


class RoundHook(Protocol):
    """Called once per round with everything ingested in it; returns alerts (plain mappings with
    at least job, layer, component, failure type, evidence, severity — DESIGN §7).

    A hook may also define ``on_heartbeat(eps, t_ns)`` (every batch an agent ships, empty ones
    included, is the heartbeat of its endpoints), ``on_retire(eps)`` (endpoints of containers
    stopped on purpose, heard on the controller's topics), ``drain_round_s()`` (the durations of
    the rounds it ran elsewhere since the last call, for the round-time histogram) and
    ``virtual_time = True`` (its alerts' times are not wall-clock: no time-to-localize then)."""

    def on_round(
        self, probes: np.ndarray, counters: np.ndarray, now_ns: int
    ) -> Iterable[Mapping[str, Any]]: ...


_SEVERITY = {
    "unreachable": "critical",
    "loss": "major",
    "latency-short": "minor",
    "latency-long": "minor",
    "agent": "warning",
}


class DetectorHook:
    """:class:`skh.analysis.detect.Detector` as a round hook: ingest, tick, and each
    ``SuspectEvent`` turned into an alert record."""

    def __init__(self, detector: Any) -> None:
        self.detector = detector
        self.ep_job: dict[int, str] = {}  # learned from the controller's announcements

    def on_heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        self.detector.heartbeat(eps, t_ns)

    def on_retire(self, eps: list[int]) -> None:
        self.detector.retire(eps)

    def on_round(
        self, probes: np.ndarray, counters: np.ndarray, now_ns: int
    ) -> list[dict[str, Any]]:
        self.detector.ingest(probes)
        return [self._alert(ev) for ev in self.detector.tick(now_ns)]

    def _alert(self, ev: Any) -> dict[str, Any]:
        """A ``suspect`` alert (docs/alerts.md): detection alone, a one-off event."""
        eps = list(ev.endpoints) or [e for pair in ev.pairs for e in pair]
        jobs = sorted({self.ep_job[e] for e in eps if e in self.ep_job})
        agent = ev.kind == "agent"
        return {
            "kind": "suspect",
            "state": "event",
            "alert_id": f"suspect|{ev.kind}|{ev.first_seen_ns}",
            "job": ",".join(jobs),
            "pairs": [list(p) for p in ev.pairs],
            "layer": "endpoint" if agent else "network",
            # localization (traceroutes, dumps) names the component; detection alone cannot
            "component": ",".join(f"ep{e}" for e in ev.endpoints) if agent else "unlocalized",
            "failure_type": ev.kind,
            "evidence": {"scores": list(ev.scores), "explanation": ev.explanation},
            "first_seen_ns": ev.first_seen_ns,
            "detected_at_ns": ev.detected_ns,
            "severity": _SEVERITY.get(ev.kind, "minor"),
        }


def load_detector_hook() -> DetectorHook | None:
    """The streaming detector of :mod:`skh.analysis.detect`, if that module is installed."""
    try:
        mod = importlib.import_module("skh.analysis.detect")
    except ImportError:
        return None
    return DetectorHook(mod.Detector())


class Analyzer:
    def __init__(
        self,
        cfg: AnalyzerConfig,
        security: SecurityConfig,
        *,
        hook: RoundHook | None = None,
        ctx: zmq.Context | None = None,
        metrics: CollectorRegistry | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy: Policy = policy if policy is not None else AllowAll()
        self.codec = Codec(max_frame_bytes=cfg.max_frame_bytes)
        self.counters: Counter[str] = Counter()
        self.hook = hook if hook is not None or cfg.detector == "none" else load_detector_hook()
        self.alerts = AlertLog(
            cfg.alert_log,
            Retention(
                cfg.alert_log_segment_bytes,
                cfg.alert_log_retention_s,
                cfg.alert_log_retention_bytes,
            ),
        )
        self.latency = Histograms(
            {
                "skh_time_to_detect_seconds": (
                    "First failed probe to the localizing round, per opened fault",
                    ("layer",),
                    SECONDS_BUCKETS,
                ),
                "skh_time_to_localize_seconds": (
                    "Localizing round to the alert on the bus, per opened fault",
                    ("layer",),
                    SECONDS_BUCKETS,
                ),
                "skh_analyzer_round_seconds": (
                    "Time one analysis round took (the pipeline's own rounds when it runs apart)",
                    (),
                    SECONDS_BUCKETS,
                ),
            }
        )
        self._ctx = ctx or zmq.Context.instance()
        self._security = ServerSecurity(security, self._ctx)
        self.pull = make_socket(self._ctx, zmq.PULL, hwm=cfg.hwm)
        self.pub = make_socket(self._ctx, zmq.PUB, hwm=cfg.hwm)
        self.rep = make_socket(self._ctx, zmq.REP, hwm=cfg.hwm)
        for s in (self.pull, self.pub, self.rep):
            self._security.apply(s)
        self.ctl_sub: zmq.Socket | None = None
        if cfg.controller_pub:
            self.ctl_sub = make_socket(self._ctx, zmq.SUB, hwm=cfg.hwm)
            security.client(self.ctl_sub)
            self.ctl_sub.setsockopt(zmq.SUBSCRIBE, b"j:")  # every job's topic
            self.ctl_sub.connect(cfg.controller_pub)
        self._probes: list[np.ndarray] = []
        self._counter_batches: list[np.ndarray] = []
        self._next_round = time.monotonic() + cfg.round_s
        self._spool = Path(cfg.spool_dir) if cfg.spool_dir else None
        if self._spool is not None:
            self._spool.mkdir(parents=True, exist_ok=True)
        self.last_round_records = 0
        self.pairs_seen = 0
        self.notifier = Notifier()
        self.endpoint = self.alerts_endpoint = self.replay_endpoint = ""
        if metrics is not None:
            metrics.register(self._collector())
            metrics.register(self.latency)

    def bind(self) -> tuple[str, str, str]:
        self.endpoint = bind(self.pull, self.cfg.bind)
        self.alerts_endpoint = bind(self.pub, self.cfg.alerts_bind)
        self.replay_endpoint = bind(self.rep, self.cfg.replay_bind)
        log.info(
            "analyzer PULL %s PUB %s REP %s",
            self.endpoint,
            self.alerts_endpoint,
            self.replay_endpoint,
        )
        return self.endpoint, self.alerts_endpoint, self.replay_endpoint

    def run(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self.rep, zmq.POLLIN)
        if self.ctl_sub is not None:
            poller.register(self.ctl_sub, zmq.POLLIN)
        self.notifier.ready(f"alert log at seq {self.alerts.last_seq}")
        try:
            while not stop.is_set():
                events = dict(poller.poll(100))
                if self.pull in events:
                    self.ingest()
                if self.rep in events:
                    self.serve_rep()
                if self.ctl_sub is not None and self.ctl_sub in events:
                    self.follow_controller()
                if time.monotonic() >= self._next_round:
                    self.round()
                self.notifier.watchdog()
            self.round()
        finally:
            self.notifier.stopping()
            self.close()

    def close(self) -> None:
        for s in (self.pull, self.pub, self.rep, self.ctl_sub):
            if s is not None:
                s.close(0)
        self.alerts.close()
        self._security.close()
        self.notifier.close()

    # -- ingest --------------------------------------------------------------------------------
    def ingest(self) -> int:
        n = 0
        while n < _DRAIN:
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n += 1
            self._on_batch(frames)
        return n

    def _on_batch(self, frames: list[zmq.Frame]) -> None:
        """The one entry of every pushed frame: identify, decode, authorize, handle."""
        if len(frames) != 1:
            self.codec.rejected["malformed"] += 1
            return
        try:
            who = self.policy.identify(b"", transport_user_id(frames[0]))
            env = self.codec.decode(frames[0].buffer)
            handler = self._batch_handlers.get(env.type)
            if handler is None:
                self.codec.rejected["unexpected"] += 1
                return
            self.policy.authorize(who, env)
            handler(self, who, env)
            self.counters["batches"] += 1
        except Unauthorized as exc:
            self.counters["unauthorized"] += 1
            log.debug("refused batch: %s", exc)
        except ProtocolError as exc:
            self.counters["bad_batches"] += 1
            log.debug("rejected batch: %s", exc)

    def _on_probes(self, who: Principal, env: Envelope) -> None:
        recs = decode_probes(env.body)
        self._probes.append(recs)
        self.counters["probe_records"] += recs.size
        self._heartbeat(env.body.get("eps"))

    def _on_counters(self, who: Principal, env: Envelope) -> None:
        recs = decode_counters(env.body)
        self._counter_batches.append(recs)
        self.counters["counter_records"] += recs.size

    _batch_handlers = {MsgType.PROBE_BATCH: _on_probes, MsgType.COUNTER_BATCH: _on_counters}

    def _heartbeat(self, eps: Any) -> None:
        beat = getattr(self.hook, "on_heartbeat", None)
        if beat is None or not eps:
            return
        if not all(isinstance(e, int) and 0 <= e < 2**32 for e in eps):
            raise ProtocolError("batch: 'eps' must be endpoint ids")
        beat(np.asarray(eps, np.int64), time.time_ns())

    def follow_controller(self) -> None:
        """Announcements and stopped containers from the controller's job topics."""
        while True:
            try:
                frames = self.ctl_sub.recv_multipart(zmq.NOBLOCK)  # type: ignore[union-attr]
            except zmq.Again:
                return
            try:
                if len(frames) != 2:
                    raise ProtocolError("a topic message is two frames")
                env = self.codec.decode(frames[1])
                if env.type is MsgType.READY_ANNOUNCE and hasattr(self.hook, "ep_job"):
                    for d in env.body["endpoints"]:
                        self.hook.ep_job[int(d["ep"])] = str(env.body["job"])  # type: ignore[union-attr]
                elif env.type is MsgType.ENDPOINTS_DOWN and env.body["reason"] == "stopped":
                    retire = getattr(self.hook, "on_retire", None)
                    if retire is not None:
                        retire(
                            [
                                e
                                for e in env.body["endpoints"]
                                if isinstance(e, int) and 0 <= e < 2**32
                            ]
                        )
            except (ProtocolError, KeyError, TypeError, ValueError) as exc:
                self.counters["bad_controller_messages"] += 1
                log.debug("bad controller topic message: %r", exc)

    def round(self) -> list[dict[str, Any]]:
        """Close the current round: spool, run the hook, publish its alerts."""
        self._next_round = time.monotonic() + self.cfg.round_s
        probes = np.concatenate(self._probes) if self._probes else empty_probes()
        counters = (
            np.concatenate(self._counter_batches) if self._counter_batches else empty_counters()
        )
        self._probes, self._counter_batches = [], []
        now_ns = time.time_ns()
        self.counters["rounds"] += 1
        self.last_round_records = int(probes.size)
        if self._spool is not None and (probes.size or counters.size):
            self._write_spool(now_ns, probes, counters)
        published = []
        if self.hook is not None:
            t0 = time.monotonic()
            try:
                found = list(self.hook.on_round(probes, counters, now_ns))
            except Exception:  # a detector bug must not stop ingest; it is logged and counted
                self.counters["hook_errors"] += 1
                log.exception("detection hook failed")
                found = []
            drain = getattr(self.hook, "drain_round_s", None)
            took = drain() if drain is not None else [time.monotonic() - t0]
            self.latency.observe("skh_analyzer_round_seconds", (), np.asarray(took))
            for alert in found:
                try:
                    published.append(self.publish(alert))
                except ProtocolError as exc:  # an alert no record can hold: counted, not fatal
                    self.counters["alerts_refused"] += 1
                    log.error("alert not published: %s", exc)
        return published

    def _write_spool(self, now_ns: int, probes: np.ndarray, counters: np.ndarray) -> None:
        assert self._spool is not None
        for kind, arr in (("probes", probes), ("counters", counters)):
            if arr.size:
                final = self._spool / f"{kind}-{now_ns}.npy"
                tmp = final.with_suffix(".tmp")
                with open(tmp, "wb") as f:
                    np.save(f, arr)
                os.replace(tmp, final)

    def publish(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        rec = self.alerts.append(alert)
        self.pub.send_multipart(
            (ALERTS_TOPIC, self.codec.encode(MsgType.ALERT, "analyzer", rec["seq"], rec))
        )
        self.counters["alerts"] += 1
        self._observe_latency(rec)
        return rec

    def _observe_latency(self, rec: Mapping[str, Any]) -> None:
        """Time to detect and to localize of each fault as it opens, from the alert's own times:
        first failed probe -> localizing round -> logged on the bus."""
        a = rec["alert"]
        if a.get("kind") != "fault" or a.get("state") != "open":
            return
        try:
            layer = str(a["layer"])
            seen, found = int(a["first_seen_ns"]), int(a["detected_at_ns"])
        except (KeyError, TypeError, ValueError):
            return
        self.latency.observe("skh_time_to_detect_seconds", (layer,), (found - seen) / 1e9)
        if not getattr(self.hook, "virtual_time", False):
            self.latency.observe(
                "skh_time_to_localize_seconds", (layer,), (rec["ts_ns"] - found) / 1e9
            )

    # -- REP -----------------------------------------------------------------------------------
    def serve_rep(self) -> None:
        # REP is lock-step: every request gets exactly one answer, even garbage
        for _ in range(_DRAIN):
            try:
                frames = self.rep.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            mtype, body = self._answer(frames)
            self.rep.send(self.codec.encode(mtype, "analyzer", self.counters["replies"], body))
            self.counters["replies"] += 1

    def _answer(self, frames: list[zmq.Frame]) -> tuple[MsgType, dict[str, Any]]:
        """The one entry of every REP request: identify, decode, authorize, answer."""
        try:
            if len(frames) != 1:
                self.codec.rejected["malformed"] += 1
                raise ProtocolError(f"a request is one frame, got {len(frames)}")
            who = self.policy.identify(b"", transport_user_id(frames[0]))
            env = self.codec.decode(frames[0].buffer)
            handler = self._rep_handlers.get(env.type)
            if handler is None:
                self.codec.rejected["unexpected"] += 1
                return MsgType.ACK, {"ok": False, "error": f"unexpected {env.type.value}"}
            self.policy.authorize(who, env)
            return handler(self, who, env)
        except Unauthorized as exc:
            self.counters["unauthorized"] += 1
            return MsgType.ACK, {"ok": False, "error": str(exc)}
        except ProtocolError as exc:
            return MsgType.ACK, {"ok": False, "error": str(exc)}

    def _on_replay(self, who: Principal, env: Envelope) -> tuple[MsgType, dict[str, Any]]:
        return MsgType.REPLAY_REPLY, self.alerts.replay(
            int(env.body["since"]), int(env.body.get("limit", MAX_REPLAY))
        )

    def _on_status(self, who: Principal, env: Envelope) -> tuple[MsgType, dict[str, Any]]:
        return MsgType.ACK, {"ok": True, "data": self.status()}

    _rep_handlers = {MsgType.REPLAY: _on_replay, MsgType.STATUS: _on_status}

    def status(self) -> dict[str, Any]:
        return {
            "counters": dict(self.counters),
            "rejected": dict(self.codec.rejected),
            "last_seq": self.alerts.last_seq,
            "detector": type(self.hook).__name__ if self.hook is not None else None,
        }

    def _collector(self) -> CallbackCollector:
        return CallbackCollector(
            counters={
                "skh_analyzer_events": (
                    "Analyzer events by kind",
                    ("kind",),
                    lambda: {(k,): float(v) for k, v in self.counters.items()},
                ),
                "skh_analyzer_rejected_frames": (
                    "Frames rejected by reason",
                    ("reason",),
                    lambda: {(k,): float(v) for k, v in self.codec.rejected.items()},
                ),
            },
            gauges={
                "skh_analyzer_round_records": (
                    "Probe records in the last round",
                    (),
                    lambda: {(): float(self.last_round_records)},
                ),
                "skh_analyzer_queued_batches": (
                    "Batches waiting for the round",
                    (),
                    lambda: {(): float(len(self._probes) + len(self._counter_batches))},
                ),
                "skh_analyzer_alert_seq": (
                    "Last alert sequence number",
                    (),
                    lambda: {(): float(self.alerts.last_seq)},
                ),
            },
        )
