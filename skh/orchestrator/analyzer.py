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
:class:`~skh.orchestrator.authz.Policy` authorizes the decoded message (with CURVE on: results
and heartbeats only for the endpoints the sender's key owns, which a key mirror thread reads from
the controller), then its type's handler runs. Subscriptions to the alerts pass the policy too
(the operator and read-only subscribers).

Nothing a sender does grows the analyzer without bound: a round holds at most
``max_round_records`` records and each sender at most ``max_sender_records`` of them (the rest
are dropped and counted); replay answers are paged in bytes; an answer or an alert too large to
encode is answered or published cut, never raised; the spool keeps ``spool_max_bytes``. At
start the analyzer hands the hook the alerts still open in the durable log
(``restore(records)``), so a fault open before a restart resolves after it.
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

from skh.errors import ProtocolError, RequestRefused, RequestTimeout, Unauthorized
from skh.orchestrator.alerts import MAX_REPLAY, AlertLog, Retention
from skh.orchestrator.authz import (
    AllowAll,
    AnalyzerPolicy,
    KeyBook,
    Policy,
    Principal,
    guard_subscriptions,
    transport_user_id,
)
from skh.orchestrator.config import AnalyzerConfig
from skh.orchestrator.daemon import bind, make_socket
from skh.orchestrator.metrics import (
    SECONDS_BUCKETS,
    CallbackCollector,
    CollectorRegistry,
    Histograms,
)
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import Identity, SecurityConfig, ServerSecurity
from skh.records import empty_counters, empty_probes
from skh.wire import (
    ALERTS_TOPIC,
    Codec,
    Envelope,
    MsgType,
    decode_counters,
    decode_probes,
)

__all__ = [
    "Analyzer",
    "RoundHook",
    "DetectorHook",
    "KeyMirror",
    "RoundQuota",
    "load_detector_hook",
]

log = logging.getLogger(__name__)

_DRAIN = 5000  # frames per poll wake-up before timers get a turn
_EP_JOB_MAX = 4_000_000  # endpoint -> job names the detector hook keeps


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
        #: (host, rail) -> access link id, and each endpoint id's (-1: not announced): the
        #: detector keeps a loss history per link across the jobs on the RNIC
        self.links: dict[tuple[str, int], int] = {}
        self.ep_link = np.zeros(0, np.int64)

    def on_ready(self, endpoints: list[Any]) -> None:
        """Endpoints the controller announced ready (``ep``, ``host``, ``rail``): each one's
        access link, told to the detector. Ids past ``_EP_JOB_MAX`` are not linked (their
        tests keep their pairs' own history). One stopped before (retired) is watched afresh:
        its container started again under the same registration."""
        got = []
        eps = []
        for d in endpoints:
            ep, host, rail = d["ep"], d["host"], d["rail"]
            if not (
                isinstance(ep, int)
                and 0 <= ep < 2**32
                and isinstance(host, str)
                and host
                and isinstance(rail, int)
                and rail >= 0
            ):
                raise ProtocolError("ready_announce: an endpoint needs int ep, host and int rail")
            eps.append(ep)
            if ep < _EP_JOB_MAX:
                got.append((ep, self.links.setdefault((host, rail), len(self.links))))
        self.detector.ready(eps)
        if not got:
            return
        top = max(ep for ep, _ in got) + 1
        if top > self.ep_link.size:
            self.ep_link = np.r_[self.ep_link, np.full(top - self.ep_link.size, -1, np.int64)]
        for ep, link in got:
            self.ep_link[ep] = link
        self.detector.set_endpoint_links(self.ep_link)

    def on_heartbeat(self, eps: np.ndarray, t_ns: int) -> None:
        self.detector.heartbeat(eps, t_ns)

    def on_retire(self, eps: list[int]) -> None:
        self.detector.retire(eps)
        for e in eps:
            self.ep_job.pop(e, None)

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


def _cut(alert: Mapping[str, Any]) -> dict[str, Any]:
    """An alert too large for one frame as its scalar fields (ids, kind, state, job, layer,
    component, type, severity, times), marked ``truncated``."""
    out = {k: v for k, v in alert.items() if isinstance(v, (str, int, float, bool)) or v is None}
    out = {k: (v[:1024] if isinstance(v, str) else v) for k, v in out.items()}
    out["truncated"] = True
    return out


class KeyMirror:
    """The analyzer's copy of the controller's key bindings and what each key owns: polls
    KEYS every ``interval_s`` (an unchanged version costs one small answer), pages through a
    changed set, and installs it into the key book (who may connect) and the policy (what
    each key owns). A thread with a connection of its own under the analyzer's key."""

    def __init__(
        self,
        address: str,
        security: SecurityConfig,
        book: KeyBook,
        policy: AnalyzerPolicy,
        ctx: zmq.Context,
        *,
        interval_s: float = 0.5,
    ) -> None:
        self.address, self.security, self.book, self.policy = address, security, book, policy
        self.ctx, self.interval_s = ctx, interval_s
        self.version = -1
        self.fetches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skh-keys", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        from skh.orchestrator.admin import ControllerClient

        with ControllerClient(
            self.address, self.security, ctx=self.ctx, timeout_s=2.0, retries=0, name="analyzer"
        ) as client:
            while not self._stop.is_set():
                try:
                    self.fetch(client)
                except (ProtocolError, RequestRefused, RequestTimeout, KeyError, TypeError) as exc:
                    log.warning("key bindings not read from the controller: %s", exc)
                self._stop.wait(self.interval_s)

    def fetch(self, client: Any) -> bool:
        data = client.request(MsgType.KEYS, {"since": self.version})
        if data.get("same"):
            return False
        version, after, idents, revoked = data["version"], "", [], list(data["revoked"])
        while True:
            idents += data["identities"]
            if data["next"] is None:
                break
            after = data["next"]
            data = client.request(MsgType.KEYS, {"since": -1, "after": after})
            if data["version"] != version:  # changed while paging: start again next time
                return False
        owned = {i["key"]: i["eps"] for i in idents}
        job_eps: dict[str, list[int]] = {}
        dynamic = []
        for i in idents:
            if i["role"] == "overlay":
                job_eps.setdefault(i["job"], []).extend(i["eps"])
            if not self.book.is_static(i["key"]):
                dynamic.append(
                    Identity(i["key"], i["name"], i["role"], i["host"], i["container"], i["job"])
                )
        self.policy.update(owned, job_eps)
        self.book.set_dynamic(dynamic, revoked)
        self.version = version
        self.fetches += 1
        return True


class RoundQuota:
    """Room for records in one round: ``max_round`` in all, ``max_sender`` per sender (its key,
    or its agent name on an insecure link); what does not fit is refused and counted
    (``dropped``). The analyzer's ingest and the sharded analyzer's front-ends keep one each."""

    def __init__(self, max_round: int, max_sender: int) -> None:
        self.max_round, self.max_sender = max_round, max_sender
        self.dropped = 0
        self._round = 0
        self._senders: Counter[str] = Counter()

    def admit(self, who: Principal, n: int) -> bool:
        sender = who.user_id or who.name
        if self._round + n > self.max_round or self._senders[sender] + n > self.max_sender:
            self.dropped += n
            return False
        self._round += n
        self._senders[sender] += n
        return True

    def next_round(self) -> None:
        self._round = 0
        self._senders.clear()


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
        self.codec = Codec(max_frame_bytes=cfg.max_frame_bytes)
        self.counters: Counter[str] = Counter()
        self.keys: KeyBook | None = None
        self._mirror: KeyMirror | None = None
        if not security.insecure:
            # with its own key it reads what each key owns from the controller (a bus serving
            # alert subscribers alone needs none: without it every pushed batch is refused)
            security.check(server=True, client=bool(security.client_secret_key))
            self.keys = KeyBook(security.authorized_keys_dir)
        if policy is None:
            policy = AllowAll() if self.keys is None else AnalyzerPolicy(self.keys)
        self.policy: Policy = policy
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
        self._security = ServerSecurity(security, self._ctx, domain="analyzer", provider=self.keys)
        self.pull = make_socket(self._ctx, zmq.PULL, hwm=cfg.hwm, max_msg_bytes=cfg.max_frame_bytes)
        self.pub = make_socket(self._ctx, zmq.XPUB, hwm=cfg.hwm, max_msg_bytes=4096)
        self.pub.setsockopt(zmq.XPUB_MANUAL, 1)
        self.rep = make_socket(self._ctx, zmq.REP, hwm=cfg.hwm, max_msg_bytes=64 * 1024)
        for s in (self.pull, self.pub, self.rep):
            self._security.apply(s)
        if isinstance(self.policy, AnalyzerPolicy):
            if security.client_secret_key and cfg.controller:
                self._mirror = KeyMirror(
                    cfg.controller, security, self.keys, self.policy, self._ctx
                )
            else:
                log.warning(
                    "no client key or controller: the analyzer cannot learn which endpoints "
                    "each key owns, and refuses every result batch"
                )
        self.ctl_sub: zmq.Socket | None = None
        if cfg.controller_pub:
            self.ctl_sub = make_socket(
                self._ctx, zmq.SUB, hwm=cfg.hwm, max_msg_bytes=cfg.max_frame_bytes
            )
            security.client(self.ctl_sub)
            self.ctl_sub.setsockopt(zmq.SUBSCRIBE, b"j:")  # every job's topic
            self.ctl_sub.connect(cfg.controller_pub)
        self._probes: list[np.ndarray] = []
        self._counter_batches: list[np.ndarray] = []
        self._quota = RoundQuota(cfg.max_round_records, cfg.max_sender_records)
        self._next_round = time.monotonic() + cfg.round_s
        self._spool = Path(cfg.spool_dir) if cfg.spool_dir else None
        self._spooled: list[tuple[Path, int]] = []
        if self._spool is not None:
            self._spool.mkdir(parents=True, exist_ok=True)
            self._spooled = sorted(
                ((p, p.stat().st_size) for p in self._spool.glob("*.npy")),
                key=lambda x: x[0].name.split("-")[-1],
            )
        restore = getattr(self.hook, "restore", None)
        if restore is not None:
            opened = self.alerts.open_alerts()
            if opened:
                log.info("%d alert(s) open in the log: handed to the hook", len(opened))
            restore(opened)
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
        poller.register(self.pub, zmq.POLLIN)
        if self.ctl_sub is not None:
            poller.register(self.ctl_sub, zmq.POLLIN)
        if self._mirror is not None:
            self._mirror.start()
        self.notifier.ready(f"alert log at seq {self.alerts.last_seq}")
        try:
            while not stop.is_set():
                events = dict(poller.poll(100))
                if self.pub in events:
                    guard_subscriptions(self.pub, self.policy, self.counters)
                if self.pull in events:
                    self.ingest()
                if self.rep in events:
                    self.serve_rep()
                if self.keys is not None:
                    self.keys.refresh()
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
        if self._mirror is not None:
            self._mirror.stop()
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
            env = self.codec.decode(frames[0].buffer, max_elements=who.max_elements)
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

    def _admit(self, who: Principal, n: int) -> bool:
        """Room in this round for ``n`` more records of ``who``; counted when there is not."""
        if self._quota.admit(who, n):
            return True
        self.counters["records_dropped"] += n
        return False

    def _on_probes(self, who: Principal, env: Envelope) -> None:
        self._heartbeat(env.body.get("eps"))
        if not self._admit(who, int(env.body["n"])):
            return
        recs = decode_probes(env.body)
        self._probes.append(recs)
        self.counters["probe_records"] += recs.size

    def _on_counters(self, who: Principal, env: Envelope) -> None:
        if not self._admit(who, int(env.body["n"])):
            return
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
                if env.type is MsgType.READY_ANNOUNCE:
                    names = getattr(self.hook, "ep_job", None)
                    for d in env.body["endpoints"] if names is not None else ():
                        if len(names) < _EP_JOB_MAX or int(d["ep"]) in names:
                            names[int(d["ep"])] = str(env.body["job"])
                        else:
                            self.counters["ep_job_full"] += 1
                    ready = getattr(self.hook, "on_ready", None)
                    if ready is not None:  # after the names: a bad endpoint only costs links
                        ready(env.body["endpoints"])
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
        self._quota.next_round()
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
                self._spooled.append((final, final.stat().st_size))
        # retention: the oldest rounds go once the spool holds more than its share of disk
        total = sum(n for _p, n in self._spooled)
        while self._spooled and total > self.cfg.spool_max_bytes:
            p, n = self._spooled.pop(0)
            p.unlink(missing_ok=True)
            total -= n
            self.counters["spool_files_deleted"] += 1

    def publish(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        rec = self.alerts.append(alert)
        try:
            frame = self.codec.encode(MsgType.ALERT, "analyzer", rec["seq"], rec)
        except ProtocolError:
            # logged whole; announced cut (subscribers see the sequence number either way)
            self.counters["alerts_cut"] += 1
            frame = self.codec.encode(
                MsgType.ALERT, "analyzer", rec["seq"], {**rec, "alert": _cut(rec["alert"])}
            )
        self.pub.send_multipart((ALERTS_TOPIC, frame))
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
            seq = self.counters["replies"]
            try:
                frame = self.codec.encode(mtype, "analyzer", seq, body)
            except ProtocolError as exc:
                self.counters["encode_errors"] += 1
                frame = self.codec.encode(
                    MsgType.ACK, "analyzer", seq, {"ok": False, "error": f"answer: {exc}"[:4000]}
                )
            self.rep.send(frame)
            self.counters["replies"] += 1

    def _answer(self, frames: list[zmq.Frame]) -> tuple[MsgType, dict[str, Any]]:
        """The one entry of every REP request: identify, decode, authorize, answer."""
        try:
            if len(frames) != 1:
                self.codec.rejected["malformed"] += 1
                raise ProtocolError(f"a request is one frame, got {len(frames)}")
            who = self.policy.identify(b"", transport_user_id(frames[0]))
            env = self.codec.decode(frames[0].buffer, max_elements=4096)
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
        except (OSError, ValueError, KeyError, TypeError) as exc:  # e.g. an unreadable log line
            self.counters["request_errors"] += 1
            log.warning("request failed: %r", exc)
            return MsgType.ACK, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000]}

    def _on_replay(self, who: Principal, env: Envelope) -> tuple[MsgType, dict[str, Any]]:
        """One page of the log after ``since`` (bounded in records and bytes by the log)."""
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
            "pipeline": getattr(self.hook, "status", dict)(),
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
