"""skh-agent --role overlay: the sidecar in a training container's network namespace.

One probing engine per endpoint (VF) answers probes from the start and probes the endpoint's ping
list. The agent registers its endpoints, reports ready (at once, or once ``ready_file`` exists),
follows its job's topic to keep the ping lists current — applying readiness, endpoints going down
and skeletons itself — and ships result batches every ``batch_interval_s`` to the analyzer:
every failure and one OK per pair and second (:class:`skh.analysis.sampling.ResultThinner`;
``ok_sample_s``).

The agent never loads numpy (~13 MB of the sidecar's ~44 MB resident, docs/probing.md;
tests/orchestrator/test_agent.py): its engines hand their records over packed
(:meth:`skh.probe.Engine.drain_packed`), it thins them record by record
(:class:`skh.analysis.rowthin.RowThinner`, the numpy thinner's rule) and ships them in the wire's
columns (:func:`skh.wire.probe_batch_body_packed`); the analyzer reads them as before.

How each pair is probed (interval, and the ECMP path ids its probes rotate over) is the
controller's: the skeleton comes with its probe plan, and the preload list is planned here from
the probe policy the controller hands out with the ping list (:mod:`skh.policy`,
docs/probing.md). The policy wins over this agent's own ``probe_interval_s`` and
``ok_sample_s``; where they differ, the agent says so when it first hears the policy.

Its identity (docs/trust.md): with ``agent.enrol_socket`` set, :func:`enrol_sidecar` makes the
sidecar's key pair at ``security.client_secret_key`` when there is none and has the host's
underlay agent vouch for it before the agent starts; otherwise the key is provisioned.

While the analyzer is unreachable the batches wait in a bounded buffer of
``buffer_s x max_probe_rate`` records (5 min by default); beyond it the oldest records are dropped
and counted. The PUSH socket uses ``ZMQ_IMMEDIATE`` and a small high-water mark so that records
stay in this accountable buffer instead of an invisible ZeroMQ queue.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from skh.analysis.rowthin import RowThinner, sample_phase_ns
from skh.errors import ConfigError, ProtocolError
from skh.layout import PROBE_STRUCT, ProbeStatus
from skh.orchestrator.agent_base import AgentBase
from skh.orchestrator.config import AgentConfig, EndpointSpec
from skh.orchestrator.daemon import RetryRefused, make_socket, poll_ms
from skh.orchestrator.jobcopy import EndpointInfo, JobCopy, merge_snapshot_pages
from skh.orchestrator.metrics import RTT_BUCKETS, CallbackCollector, Histograms
from skh.orchestrator.security import SecurityConfig, ensure_keypair
from skh.policy import ProbePolicy, plan_rows, source_plan
from skh.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    Envelope,
    MsgType,
    job_topic,
    probe_batch_body_packed,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from skh.probe import EngineThread

__all__ = ["OverlayAgent", "EngineLike", "ResultBuffer", "enrol_sidecar"]

log = logging.getLogger(__name__)

_MAX_BATCH_RECORDS = 65536  # one frame stays ~3.5 MiB, well under the codec limit
_DEFAULT_POLICY = ProbePolicy()
_RECORD = PROBE_STRUCT.size
#: the loop's longest sleep: a stop request waits at most this long
MAX_WAIT_S = 1.0
#: how often the loop looks for the ready file while the agent has not reported ready
READY_POLL_S = 0.1


class EngineLike(Protocol):
    """The part of :class:`skh.probe.Engine` the agent uses."""

    def local_address(self) -> dict[str, Any]: ...
    def add_target(
        self,
        dst_ep: int,
        host: str,
        port: int,
        *,
        interval_s: float,
        path_id: int = 0,
        paths: int = 1,
        qpn: int = 0,
        gid: str = "",
    ) -> None: ...
    def remove_target(self, dst_ep: int) -> None: ...
    def start(self) -> None: ...
    def close(self) -> None: ...
    def drain_packed(self, max_records: int | None = None) -> bytearray: ...
    def stats(self) -> Any: ...


EngineFactory = Callable[[EndpointSpec, AgentConfig], EngineLike]


def ring_records(cfg: AgentConfig) -> int:
    """Result-ring capacity of one endpoint's engine. The agent drains every batch interval, so
    a ring holds a few intervals of this endpoint's share of the agent's top rate — not the
    engine's default 65,536 records (3 MiB each, all resident once the ring has wrapped: +24 MB
    for 8 endpoints after ~14 min at 80 probes/s each), nor the whole agent's rate in each of
    its engines (8 x 192 KiB resident after the first minute). An endpoint probing beyond its
    share for seconds on end overflows its ring, which its ``ring_overflow`` counter says."""
    share = cfg.max_probe_rate / max(1, len(cfg.endpoints))
    return max(256, int(max(4.0, 4 * cfg.batch_interval_s) * share))


def in_flight_slots(cfg: AgentConfig) -> int:
    """In-flight table size of one endpoint's engine: an unanswered probe holds its slot for
    ``probe_timeout_s``, so the endpoint's share of the agent's top rate needs share x timeout
    slots; four times that, not the engine's default 2,048 (120 B each, all resident once the
    wire sequence has wrapped: 8 x 240 KiB for 8 endpoints after ~25 s at 80 probes/s each).
    Beyond it due probes wait, which the engine's ``inflight_full`` counter says."""
    from skh._fastprobe import MAX_IN_FLIGHT  # the C engine: loaded only where engines are made

    share = cfg.max_probe_rate / max(1, len(cfg.endpoints))
    return max(256, min(MAX_IN_FLIGHT, math.ceil(4 * share * cfg.probe_timeout_s)))


def answer_slots(cfg: AgentConfig) -> int:
    """Answered probes of one endpoint's engine waiting for their first reply's send stamp (each
    for at most 10 ms): its share of the agent's top rate, a second of it, in case its peers'
    probes come in bursts; not the engine's most, 1,024 (~200 B each, all resident once the ring
    has wrapped: 8 x 210 KB for 8 endpoints). Beyond it the oldest waiter's second reply leaves
    without that stamp."""
    from skh._fastprobe import MAX_ANSWER_SLOTS

    share = cfg.max_probe_rate / max(1, len(cfg.endpoints))
    return max(64, min(MAX_ANSWER_SLOTS, math.ceil(share)))


def default_engine_factory(
    spec: EndpointSpec, cfg: AgentConfig, thread: EngineThread | None = None
) -> EngineLike:
    """The C engine of one endpoint, run on ``thread`` (None: a thread of its own)."""
    from skh.probe import Engine  # the C engine; imported here so the controller never loads it

    return Engine(
        bind=spec.ip,
        port=spec.port,
        transport=cfg.transport,
        ring_records=ring_records(cfg),
        max_in_flight=in_flight_slots(cfg),
        answer_slots=answer_slots(cfg),
        timeout_s=cfg.probe_timeout_s,
        device=spec.device or None,
        gid_index=None if spec.gid_index < 0 else spec.gid_index,
        traffic_class=cfg.traffic_class,
        priority=cfg.priority,
        tick_s=cfg.engine_tick_s,
        wall_grid=cfg.engine_wall_grid,
        thread=thread,
    )


def shared_engine_factory(cfg: AgentConfig) -> EngineFactory:
    """The default factory of an agent's engines: all on one thread with
    ``agent.engine_shared_thread``, else each on its own."""
    from skh.probe import EngineThread

    if not cfg.engine_shared_thread:
        return default_engine_factory
    return functools.partial(default_engine_factory, thread=EngineThread())


class ResultBuffer:
    """FIFO of probe batches, records packed as :data:`skh.layout.PROBE_STRUCT` (48 bytes each,
    as the engine writes them), bounded by a record count; overflow drops the oldest records."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._q: deque[bytes] = deque()
        self.records = 0
        self.dropped = 0

    def push(self, batch: bytes) -> None:
        n = len(batch) // _RECORD
        if n == 0:
            return
        for i in range(0, n, _MAX_BATCH_RECORDS):
            part = batch[i * _RECORD : (i + _MAX_BATCH_RECORDS) * _RECORD]
            self._q.append(part)
            self.records += len(part) // _RECORD
        while self.records > self.max_records:
            excess = self.records - self.max_records
            head = len(self._q[0]) // _RECORD
            if head <= excess:
                self._q.popleft()
                self.records -= head
                self.dropped += head
            else:
                self._q[0] = self._q[0][excess * _RECORD :]
                self.records -= excess
                self.dropped += excess

    def push_heartbeat(self) -> None:
        self._q.append(b"")

    def peek(self) -> bytes | None:
        return self._q[0] if self._q else None

    def pop(self) -> None:
        self.records -= len(self._q.popleft()) // _RECORD


class OverlayAgent(AgentBase):
    role = "overlay"

    def __init__(
        self,
        cfg: AgentConfig,
        security: SecurityConfig,
        *,
        engine_factory: EngineFactory | None = None,
        ctx: zmq.Context | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        if not cfg.job or not cfg.container or not cfg.endpoints:
            raise ConfigError(
                "an overlay agent needs agent.job, agent.container and agent.endpoints"
            )
        super().__init__(cfg, security, ctx=ctx)
        self.sub = make_socket(
            self._ctx, zmq.SUB, hwm=cfg.hwm, max_msg_bytes=DEFAULT_MAX_FRAME_BYTES
        )
        security.client(self.sub)
        self.sub.setsockopt(zmq.SUBSCRIBE, job_topic(cfg.job))
        self.sub.connect(cfg.controller_pub)
        self.push = make_socket(self._ctx, zmq.PUSH, hwm=4)
        self.push.setsockopt(zmq.IMMEDIATE, 1)
        security.client(self.push, analyzer=True)
        self.push.connect(cfg.analyzer)
        self.push_retry = RetryRefused(self.push, cfg.analyzer)
        self.engines: list[tuple[EndpointSpec, EngineLike]] = []
        if engine_factory is None:
            engine_factory = shared_engine_factory(cfg)
        for spec in cfg.endpoints:
            eng = engine_factory(spec, cfg)
            eng.start()  # the responder answers from now on, before anyone may probe us
            self.engines.append((spec, eng))
        self.ep_ids: list[int] = []  # controller ids, parallel to self.engines
        self.job: JobCopy | None = None
        self._pages: list[dict[str, Any]] = []  # a paged snapshot being received
        #: per engine: dst -> (address, interval_s, paths) it probes now
        self.targets: list[dict[int, tuple[tuple[str, int, str, int], float, int]]] = [
            {} for _ in self.engines
        ]
        # until the controller hands its policy out: this agent's own settings
        self.policy = ProbePolicy(
            interval_s=cfg.probe_interval_s,
            min_interval_s=min(cfg.probe_interval_s, _DEFAULT_POLICY.min_interval_s),
            ok_sample_s=cfg.ok_sample_s,
        )
        self._heard_policy: dict[str, Any] | None = None
        #: the skeleton's plan as last read (its wire dict) and each endpoint's rows of it
        #: (None: the plan does not fit the skeleton)
        self._plan: tuple[Any, dict[int, dict[int, tuple[float, int]]] | None] | None = None
        self.ready_reported = False
        self._ready_seq = -1
        self._next_ready = 0.0
        self.buffer = ResultBuffer(int(cfg.buffer_s * cfg.max_probe_rate))
        self.thinner = RowThinner(cfg.ok_sample_s) if cfg.ok_sample_s > 0 else None
        self._next_flush = time.monotonic() + cfg.batch_interval_s
        self.handlers["pinglist"] = lambda _args: self.ping_lists()
        self.latency = Histograms(
            {
                "skh_agent_probe_rtt_seconds": (
                    "Network RTT of the successful probes that carried one (with "
                    "agent.engine_rtt_samples_only, each pair's latency samples)",
                    ("transport",),
                    RTT_BUCKETS,
                )
            }
        )
        if metrics is not None:
            metrics.register(self._collector())
            metrics.register(self.latency)

    # -- session -------------------------------------------------------------------------------
    def register_body(self) -> dict[str, Any]:
        eps = []
        for spec, eng in self.engines:
            addr = eng.local_address()
            eps.append(
                {
                    "job": self.cfg.job,
                    "container": self.cfg.container,
                    "rail": spec.rail,
                    "ip": str(addr.get("ip", spec.ip)),
                    "port": int(addr.get("port", 0)),
                    "gid": str(addr.get("gid", "")),
                    "qpn": int(addr.get("qpn", 0)),
                    "netdev": spec.netdev,
                }
            )
        return {"agent": self.name, "role": self.role, "host": self.cfg.host, "endpoints": eps}

    def on_registered(self, env: Envelope) -> None:
        eps = env.body["endpoints"]
        if len(eps) != len(self.engines) or not all(
            isinstance(e, int) and 0 <= e < 2**32 for e in eps
        ):
            raise ProtocolError(
                f"register_ack names {len(eps)} endpoint ids for {len(self.engines)} endpoints"
            )
        snaps = [
            JobCopy.from_snapshot(s)
            for s in env.body["snapshots"]
            if isinstance(s, dict) and s.get("job") == self.cfg.job
        ]
        self.ep_ids = list(eps)
        for job in snaps:
            self._install(job)
        if not snaps:  # the snapshot comes in pages (a controller before issue 19 sent small ones)
            self._sync("registered", resync=False)
        self.ready_reported = False
        self._next_ready = 0.0

    def heartbeat_body(self) -> dict[str, Any]:
        return {
            "agent": self.name,
            "epoch": self.epoch,
            "jobs": {self.cfg.job: self.job.version if self.job else -1},
        }

    def on_heartbeat_ack(self, env: Envelope) -> None:
        # the controller's version is ahead: we missed the last announcement (PUB drops silently)
        if self.job is not None and int(env.body["jobs"].get(self.cfg.job, -1)) > self.job.version:
            self._sync("behind the controller")

    def on_message(self, env: Envelope) -> None:
        if env.type is MsgType.ACK:
            if env.body.get("re") == self._ready_seq:
                if env.body["ok"]:
                    self.ready_reported = True
                    log.info("%s: ready acknowledged", self.name)
                else:
                    self.reregister(f"ready refused: {env.body.get('error', '')}")
        elif env.type is MsgType.JOB_SNAPSHOT and env.body["job"] == self.cfg.job:
            self._pages.append(env.body)
            if env.body.get("next") is not None:  # more pages: ask for the next one
                self.send(MsgType.SYNC, {"job": self.cfg.job, "after": int(env.body["next"])})
                return
            pages, self._pages = self._pages, []
            try:
                body = merge_snapshot_pages(pages)
            except ProtocolError as exc:  # the job changed between pages: ask again
                self._sync(str(exc))
                return
            # a SYNC answer may trail announcements already applied from the topic
            if self.job is None or body["version"] >= self.job.version:
                self._install(JobCopy.from_snapshot(body))

    def _sync(self, why: str, *, resync: bool = True) -> None:
        """Ask for the job's snapshot; ``resync``: this copy fell behind (counted)."""
        self.counters["resyncs"] += resync
        log.info("%s: asking for a snapshot of %s (%s)", self.name, self.cfg.job, why)
        self._pages = []
        self.send(MsgType.SYNC, {"job": self.cfg.job})

    def _ready_gate(self) -> bool:
        return not self.cfg.ready_file or Path(self.cfg.ready_file).exists()

    def _ready_tick(self, now: float) -> None:
        if (
            self.epoch
            and not self.ready_reported
            and now >= self._next_ready
            and self._ready_gate()
        ):
            self._next_ready = now + self.cfg.request_timeout_s
            self._ready_seq = self.send(
                MsgType.READY, {"agent": self.name, "endpoints": self.ep_ids}
            )

    # -- ping lists ----------------------------------------------------------------------------
    def handle_sub(self) -> None:
        while True:
            try:
                _topic, raw = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:  # not two frames
                self.codec.rejected["malformed"] += 1
                continue
            try:
                env = self.codec.decode(raw)
                if (
                    self.job is None
                    or env.type
                    not in (MsgType.READY_ANNOUNCE, MsgType.ENDPOINTS_DOWN, MsgType.SKELETON)
                    or env.body.get("job") != self.cfg.job
                ):
                    continue
                if self.job.apply(env.type, env.body):
                    self._apply_targets()
                else:
                    self._sync(f"version gap at {env.body['version']}")
            except (ProtocolError, KeyError, TypeError, ValueError, AttributeError) as exc:
                self.counters["bad_topic_messages"] += 1
                log.debug("%s: bad topic message: %r", self.name, exc)

    def _install(self, job: JobCopy) -> None:
        self.job = job
        self._apply_targets()

    def _adopt_policy(self) -> None:
        """Take the probe policy the controller handed out with the ping list (once per change),
        saying where this agent's own settings differ from it."""
        heard = self.job.probing if self.job is not None else None
        if heard is None or heard == self._heard_policy:
            return
        self._heard_policy = heard
        try:
            policy = ProbePolicy.from_wire(heard)
        except ProtocolError as exc:
            self.counters["bad_policies"] += 1
            log.warning("%s: ignoring the controller's probe policy: %s", self.name, exc)
            return
        differ = policy.differences(
            interval_s=self.cfg.probe_interval_s, ok_sample_s=self.cfg.ok_sample_s
        )
        if differ:
            self.counters["policy_disagreements"] += 1
            log.warning(
                "%s: agent settings differ from the controller's probe policy (%s); probing "
                "as the controller says",
                self.name,
                "; ".join(differ),
            )
        if policy.ok_sample_s != self.policy.ok_sample_s:
            self.thinner = RowThinner(policy.ok_sample_s) if policy.ok_sample_s > 0 else None
        self.policy = policy

    def _pair_plan(self, ep: int, dsts: list[int]) -> dict[int, tuple[float, int]]:
        """``dst -> (interval_s, paths)`` for ``ep``'s current destinations: the skeleton's plan
        from the controller, else (preload list, or no plan handed out) planned here from the
        policy, which for one source is the budget shared among its destinations."""
        assert self.job is not None
        got: dict[int, tuple[float, int]] = {}
        wire = self.job.plan
        pairs = self.job.skeleton_pairs
        if wire is not None and pairs is not None:
            if self._plan is None or self._plan[0] is not wire:
                self._plan = (wire, {})
            rows = self._plan[1]
            if rows is not None and ep not in rows:
                try:
                    rows[ep] = plan_rows(wire, *pairs, ep)
                except ProtocolError as exc:
                    self.counters["bad_plans"] += 1
                    log.warning("%s: ignoring the skeleton's probe plan: %s", self.name, exc)
                    self._plan = (wire, rows := None)
            if rows is not None:
                got = dict(rows[ep])
        missing = [d for d in dsts if d not in got]
        if missing:
            planned = source_plan(len(missing), self.policy)
            got |= dict.fromkeys(missing, planned)
        return got

    def _sampling(self, ep: int, dst: int) -> dict[str, Any]:
        """How the engine samples the pair's RTTs: only the probes that may be its latency
        sample ask for one, on the periods the thinner and the analyzer use (the pair key's
        phase); none when every OK is forwarded or the setting is off."""
        period_s = self.policy.ok_sample_s if self.thinner is not None else 0.0
        if period_s <= 0 or not self.cfg.engine_rtt_samples_only:
            return {}
        period_ns = int(period_s * 1e9)  # as RowThinner's
        return {
            "sample_period_s": period_ns / 1e9,
            "sample_phase_ns": sample_phase_ns(ep << 32 | dst, period_ns),
        }

    def _apply_targets(self) -> None:
        """Bring every engine's targets to the job's current ping list and plan: additions and
        changes first, then removals, so a pair kept across a skeleton change is never
        unprobed."""
        if self.job is None or len(self.ep_ids) != len(self.engines):
            return
        self._adopt_policy()
        for i, ((_spec, eng), ep) in enumerate(zip(self.engines, self.ep_ids, strict=True)):
            dsts = self.job.destinations(ep)
            plan = self._pair_plan(ep, dsts)
            want = {}
            for dst in dsts:
                info: EndpointInfo = self.job.endpoints[dst]
                want[dst] = (info.address(), *plan[dst])
            have = self.targets[i]
            applied = {}
            for dst, target in want.items():
                if have.get(dst) == target:
                    applied[dst] = target
                    continue
                (ip, port, gid, qpn), interval_s, paths = target
                if dst in have and have[dst][0] != target[0]:
                    eng.remove_target(dst)  # a new address: a new probe sequence
                try:
                    eng.add_target(
                        dst,
                        ip,
                        port,
                        interval_s=interval_s,
                        paths=paths,
                        qpn=qpn,
                        gid=gid,
                        **self._sampling(ep, dst),
                    )
                except (ValueError, OSError) as exc:  # an address the engine cannot probe
                    self.counters["bad_targets"] += 1
                    log.warning(
                        "%s: cannot probe endpoint %d at %s:%d: %s", self.name, dst, ip, port, exc
                    )
                    if dst in have and have[dst][0] == target[0]:
                        applied[dst] = have[dst]  # still probed as before
                    continue
                applied[dst] = target
            for dst in [d for d in have if d not in want]:
                eng.remove_target(dst)
            self.targets[i] = applied
        self.counters["pinglist_updates"] += 1

    def ping_lists(self) -> dict[str, Any]:
        """What each endpoint probes now (the ``pinglist`` command), and how: each destination's
        interval and the number of path ids its probes rotate over; ``port``: each endpoint's
        bound port (path id 0's source port; the other path ids take ports of their own)."""
        pairs = list(zip(self.ep_ids, self.targets, strict=False))
        ports = [int(eng.local_address().get("port", 0)) for _spec, eng in self.engines]
        return {
            "version": self.job.version if self.job else -1,
            "port": {str(ep): port for ep, port in zip(self.ep_ids, ports, strict=False)},
            "lists": {str(ep): sorted(t) for ep, t in pairs},
            "plan": {str(ep): {str(d): [iv, n] for d, (_a, iv, n) in t.items()} for ep, t in pairs},
        }

    # -- results -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Drain the engines into the buffer, then ship what the analyzer will take."""
        rows: list[tuple] = []
        for (_spec, eng), ep in zip(
            self.engines, self.ep_ids or [None] * len(self.engines), strict=True
        ):
            raw = eng.drain_packed()
            if raw and ep is not None:  # the engine's records name the controller's ids
                rows += [(ep, *r[1:]) for r in PROBE_STRUCT.iter_unpack(raw)]
        if rows:
            self.counters["records"] += len(rows)
            ok = ProbeStatus.OK
            rtt_s = [r[7] / 1e9 for r in rows if r[4] == ok and r[7] >= 0]
            self.latency.observe("skh_agent_probe_rtt_seconds", (self.cfg.transport,), rtt_s)
            if self.thinner is not None:
                kept = self.thinner.thin(rows)
                self.counters["records_thinned"] += len(rows) - len(kept)
                rows = kept
            self.buffer.push(b"".join(PROBE_STRUCT.pack(*r) for r in rows))
        if self.buffer.peek() is None and self.ep_ids:
            self.buffer.push_heartbeat()  # nothing to ship: an empty batch still says "alive"
        while (head := self.buffer.peek()) is not None:
            self._seq += 1
            frame = self.codec.encode(
                MsgType.PROBE_BATCH,
                self.name,
                self._seq,
                probe_batch_body_packed(self.name, head, self.ep_ids),
            )
            try:
                self.push.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                self.counters["analyzer_unreachable_flushes"] += 1
                break
            self.buffer.pop()
            self.counters["batches_sent"] += 1
            self.counters["records_sent"] += len(head) // _RECORD

    # -- loop ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.sub, zmq.POLLIN)
        poller.register(self.push_retry.monitor, zmq.POLLIN)
        self.notifier.ready(f"{len(self.engines)} endpoints")
        try:
            while not stop.is_set():
                wait_ms = poll_ms(self.wait_s(time.monotonic()))
                self.tick(dict(poller.poll(wait_ms)), time.monotonic())
                self.notifier.watchdog()
            self.flush()  # the last second of results
            if self.epoch:  # stopping on purpose: the controller retires our endpoints now
                self.send(MsgType.DEREGISTER, {"agent": self.name})
        finally:
            self.notifier.stopping()
            self.close()

    def wait_s(self, now: float) -> float:
        """How long the loop may sleep in its poll: until the next timer (the results' flush,
        the session's, a reconnect, the watchdog), at most :data:`MAX_WAIT_S`. The controller's
        and the analyzer's messages wake it sooner. Polling at a fixed 10 Hz instead cost the
        busiest container ~0.2 % of a core in libzmq's poll calls alone (session 33)."""
        due = min(
            self._next_flush,
            self.session_due(now),
            self.push_retry.due(),
            self.notifier.watchdog_due(),
        )
        if self.epoch and not self.ready_reported:
            # the ready file appears when it appears: look for it as often as before
            due = min(due, max(self._next_ready, now + READY_POLL_S))
        return min(max(due - now, 0.0), MAX_WAIT_S)

    def tick(self, events: dict[Any, int], now: float) -> None:
        """One turn of the loop: what arrived (``events`` of a poll over the DEALER and SUB
        sockets), the session's timers, and the results when due. ``run`` calls it; a process
        hosting many agents may poll all their sockets at once and tick each."""
        if self.dealer in events:
            self.handle_dealer()
        if self.sub in events:
            self.handle_sub()
        self.session_tick(now)
        self._ready_tick(now)
        self.push_retry.tick(now)
        if now >= self._next_flush:
            self._next_flush = now + self.cfg.batch_interval_s
            self.flush()

    def close(self) -> None:
        for _spec, eng in self.engines:
            eng.close()
        self.sub.close(0)
        self.push_retry.close()
        self.push.close(linger=500)  # the last second of results, if the analyzer takes it
        self.close_base()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["buffered_records"] = self.buffer.records
        out["dropped_records"] = self.buffer.dropped
        out["engines"] = [_as_dict(eng.stats()) for _spec, eng in self.engines]
        return out

    def _collector(self) -> CallbackCollector:
        def engine_totals() -> dict[tuple[str, ...], float]:
            tot: dict[tuple[str, ...], float] = {}
            for _spec, eng in self.engines:
                for k, v in _as_dict(eng.stats()).items():
                    if isinstance(v, (int, float)):
                        tot[(k,)] = tot.get((k,), 0.0) + float(v)
            return tot

        return CallbackCollector(
            counters={
                "skh_agent_events": (
                    "Agent events by kind",
                    ("kind",),
                    lambda: {(k,): float(v) for k, v in self.counters.items()},
                ),
                "skh_agent_engine": (
                    "Probing engine counters summed over endpoints",
                    ("counter",),
                    engine_totals,
                ),
                "skh_agent_dropped_records": (
                    "Results dropped from the full buffer",
                    (),
                    lambda: {(): float(self.buffer.dropped)},
                ),
            },
            gauges={
                "skh_agent_buffered_records": (
                    "Results waiting for the analyzer",
                    (),
                    lambda: {(): float(self.buffer.records)},
                ),
                "skh_agent_pinglist_size": (
                    "Targets probed, summed over endpoints",
                    (),
                    lambda: {(): float(sum(len(t) for t in self.targets))},
                ),
            },
        )


def enrol_sidecar(
    cfg: AgentConfig,
    security: SecurityConfig,
    *,
    stop: threading.Event | None = None,
    retry_s: float = 1.0,
    attempts: int = 0,
) -> str:
    """Make this sidecar's key (``security.client_secret_key``, when absent) and have the
    host's underlay agent vouch for it at ``agent.enrol_socket``; retry every ``retry_s``
    (``attempts`` = 0: until ``stop``) while the agent or the controller is not there yet.
    Returns the agent name the key is bound to. Raises ConfigError when the controller
    refuses (wrong host, name taken) or the attempts run out."""
    from skh.orchestrator.enrol import enrol

    if not cfg.enrol_socket or security.insecure:
        raise ConfigError("enrolment needs agent.enrol_socket and CURVE keys")
    key = ensure_keypair(security.client_secret_key)
    n = 0
    while True:
        n += 1
        try:
            answer = enrol(
                cfg.enrol_socket,
                job=cfg.job,
                container=cfg.container,
                name=cfg.agent_name,
                key=key,
            )
        except (OSError, ProtocolError) as exc:
            answer = {"ok": False, "error": f"{exc}", "retry": True}
        if answer.get("ok"):
            log.info("%s: key enrolled through %s", cfg.agent_name, cfg.enrol_socket)
            return str(answer.get("name", cfg.agent_name))
        if not answer.get("retry"):
            raise ConfigError(f"enrolment refused: {answer.get('error', 'no reason')}")
        if (attempts and n >= attempts) or (stop is not None and stop.wait(retry_s)):
            raise ConfigError(f"enrolment did not succeed: {answer.get('error', '')}")
        if stop is None:
            time.sleep(retry_s)


def _as_dict(stats: Any) -> dict[str, Any]:
    if hasattr(stats, "as_dict"):
        return dict(stats.as_dict())
    return dict(stats) if isinstance(stats, dict) else {}
