"""skh-controller: the job/endpoint registry, ping-list versions, key bindings and the command
relay.

Sockets:

* ROUTER (``bind``): agents' DEALERs (register, ready, heartbeat, command replies, enrolment)
  and admin requests (submit_job, apply_skeleton, status, members, keys, command) from the CLI
  or the analyzer. Routing ids are the ROUTER's own (no client picks one, and none is handed
  over): an agent is whoever holds its key, reached at the routing id of its latest request.
* XPUB (``pub_bind``): one topic per job (``j:<job>\\0``) carrying readiness announcements
  (the readiness changes of one tick coalesced into one), endpoints going down and skeletons,
  each once, with the job's ping-list version; ``agents\\0`` carries agent liveness changes.
  Each subscription passes the policy (a sidecar hears only its own job).

Every request enters at :meth:`Controller._dispatch`: its sender becomes a
:class:`~skh.orchestrator.authz.Principal`, the controller's :class:`~skh.orchestrator.authz.Policy`
authorizes it (docs/trust.md), and its handler returns a :class:`Reply` (the answer to the sender
and frames for other peers). A request is all or nothing: its registry writes sit in a savepoint,
its announcements and its reply are encoded before the savepoint is released, and any failure
rolls the registry back and reloads the in-memory state from it. The loop handles a batch of
requests, commits the registry once, then publishes and answers: nothing is acknowledged or
announced before it is durable. Large answers are paged (snapshots, members, key bindings).

A registration costs the same in a job of ten endpoints or of ten thousand: its answer carries
no snapshot (the agent reads the pages with SYNC), and a snapshot page is cut from the job's
record columns (:func:`skh.wire.encode_records`, 20-40 bytes a record) and kept until one of
its records changes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from skh.errors import ConfigError, ProtocolError, TopologyError, Unauthorized
from skh.model import Fabric
from skh.orchestrator.authz import (
    AllowAll,
    ControllerPolicy,
    KeyBook,
    Policy,
    Principal,
    guard_subscriptions,
    transport_user_id,
)
from skh.orchestrator.commands import check_command, check_delivery
from skh.orchestrator.config import ControllerConfig
from skh.orchestrator.daemon import bind, make_socket
from skh.orchestrator.metrics import CallbackCollector, CollectorRegistry
from skh.orchestrator.pinglist import EndpointInfo, JobPingLists
from skh.orchestrator.registry import AgentRecord, Registry
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import Identity, SecurityConfig, ServerSecurity
from skh.probeplan import FabricLinks, ProbePolicy, plan_probes
from skh.wire import (
    AGENTS_TOPIC,
    NAME_MAX,
    PAGE_MAX,
    Codec,
    Envelope,
    MsgType,
    job_topic,
    unpack_pairs,
)

__all__ = ["Controller", "Reply"]

log = logging.getLogger(__name__)

_BATCH = 2000  # requests handled per commit
#: key bindings per KEYS page (each with the endpoints it owns)
_KEYS_PAGE = 1024
#: a revocation ends subscriptions by binding the PUB socket afresh, at most this often
_REBIND_S = 2.0
#: the types whose handlers change state (a failure in them reloads the state)
_MUTATING = {
    MsgType.REGISTER,
    MsgType.READY,
    MsgType.DEREGISTER,
    MsgType.SUBMIT_JOB,
    MsgType.REMOVE_JOB,
    MsgType.APPLY_SKELETON,
    MsgType.ENROL,
    MsgType.REVOKE,
}


@dataclass(slots=True)
class _Agent:
    name: str
    role: str
    host: str
    identity: bytes  # the routing id of its latest request (b"" until it sends one)
    last_seen: float
    endpoints: list[int] = field(default_factory=list)
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler answers: ``mtype`` and ``body`` go back to the sender (nothing when
    ``mtype`` is None); ``forward`` holds frames for other peers by routing id (a relayed
    command for its agent, an agent's command reply for the command's requester)."""

    mtype: MsgType | None = None
    body: dict[str, Any] = field(default_factory=dict)
    forward: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(slots=True)
class _Pending:
    requester: bytes
    cmd_id: str  # the requester's id (the agent sees the controller's own)
    agent: str
    frame: bytes
    timeout_s: float
    retries_left: int
    deadline: float
    sent: int = 1


class Controller:
    """The controller daemon. ``bind()``, then ``run(stop)`` (or ``step()`` in tests)."""

    def __init__(
        self,
        cfg: ControllerConfig,
        security: SecurityConfig,
        *,
        ctx: zmq.Context | None = None,
        metrics: CollectorRegistry | None = None,
        policy: Policy | None = None,
        fabric: Fabric | None = None,
    ) -> None:
        self.cfg = cfg
        self.codec = Codec(max_frame_bytes=cfg.max_frame_bytes)
        # the probe policy handed out with every ping list, and the model that plans skeletons
        # link by link (``controller.fabric``, or ``fabric`` given in-process)
        self.probe_policy = ProbePolicy.from_config(cfg)
        if fabric is None and cfg.fabric:
            fabric = Fabric.from_toml(cfg.fabric)
        self._links = FabricLinks(fabric) if fabric is not None else None
        self.registry = Registry(cfg.db)
        self.keys: KeyBook | None = None
        if not security.insecure:
            if not security.authorized_keys_dir:
                raise ConfigError("security.authorized_keys_dir is not set (docs/trust.md)")
            self.keys = KeyBook(security.authorized_keys_dir)
            bound, revoked = self.registry.load_keys()
            self.keys.set_dynamic(bound, revoked)
        if policy is None:
            policy = AllowAll() if self.keys is None else ControllerPolicy(self.keys)
        self.policy: Policy = policy
        self._load_state(keep_agents=False)
        self.epoch = uuid.uuid4().hex[:12]
        self.counters: Counter[str] = Counter()
        self._pending: dict[str, _Pending] = {}  # by the id the agent sees
        self._relayed: dict[tuple[bytes, str], str] = {}  # (requester, its id) -> that id
        self._cmd_seq = 0
        #: announcements (topic, frame) of registry changes not yet committed
        self._staged: list[tuple[bytes, bytes]] = []
        #: per job, endpoints marked ready and not yet announced: one READY_ANNOUNCE per job and
        #: tick (:meth:`_flush_ready`), so an agent applies one change per tick, not one per
        #: container of a starting job
        self._unannounced: dict[str, list[int]] = {}
        #: the lengths of those lists when the current request began, and what the request
        #: announced of them (its undo restores both)
        self._unannounced_mark: dict[str, int] = {}
        self._flushed_in_request: list[tuple[str, list[int]]] = []
        self._mutated = False
        self._seq = 0
        self._keys_version = 1
        self._rebind_due = False
        self._rebind_at = 0.0
        self._book_version = self.keys.version if self.keys else 0
        self.members_version = 1
        self._ctx = ctx or zmq.Context.instance()
        self._security = ServerSecurity(
            security, self._ctx, domain="controller", provider=self.keys
        )
        self.router = make_socket(
            self._ctx, zmq.ROUTER, hwm=cfg.hwm, max_msg_bytes=cfg.max_frame_bytes
        )
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.pub = self._make_pub()
        self._security.apply(self.router)
        self.endpoint = self.pub_endpoint = ""
        now = time.monotonic()
        self._next_sweep = now + cfg.heartbeat_interval_s
        self.notifier = Notifier()
        if metrics is not None:
            metrics.register(self._collector())
        log.info(
            "controller epoch %s: %d jobs, %d endpoints, %d agents, %d keys from %s",
            self.epoch,
            len(self.jobs),
            len(self._by_name),
            len(self.agents),
            len(self.keys.identities()) if self.keys else 0,
            cfg.db,
        )

    def _make_pub(self) -> zmq.Socket:
        pub = make_socket(self._ctx, zmq.XPUB, hwm=self.cfg.hwm, max_msg_bytes=4096)
        pub.setsockopt(zmq.XPUB_MANUAL, 1)
        self._security.apply(pub)
        return pub

    def _load_state(self, *, keep_agents: bool) -> None:
        """The in-memory state from the registry (at start, and after a failed request was
        rolled back); agents keep their liveness and routing ids when ``keep_agents``."""
        self.jobs, owner, records = self.registry.load()
        self._next_ep = max(self.registry.max_ep() + 1, getattr(self, "_next_ep", 0))
        self._by_name = {i.name: i.ep for j in self.jobs.values() for i in j.endpoints.values()}
        self._ep_job = {i.ep: i.job for j in self.jobs.values() for i in j.endpoints.values()}
        self._by_container: dict[tuple[str, str], set[int]] = {}
        self._by_host: dict[str, set[int]] = {}
        for j in self.jobs.values():
            for i in j.endpoints.values():
                self._index(i)
        now = time.monotonic()
        old = self.agents if keep_agents else {}
        self.agents: dict[str, _Agent] = {}
        for r in records.values():
            prev = old.get(r.agent)
            # agents known before a restart get one full heartbeat window to come back
            self.agents[r.agent] = (
                _Agent(r.agent, r.role, r.host, prev.identity, prev.last_seen, [], prev.alive)
                if prev is not None
                else _Agent(r.agent, r.role, r.host, b"", now)
            )
        for ep, agent in owner.items():
            if agent in self.agents:
                self.agents[agent].endpoints.append(ep)
        plans = getattr(self, "_plans", {})
        self._plans: dict[str, tuple[int, dict[str, Any] | None]] = {}
        for j in self.jobs.values():
            j.probing = self.probe_policy.to_wire()
            # a rollback reloads every job: plans of unchanged skeletons are kept
            kept = plans.get(j.job)
            j.plan = kept[1] if kept and kept[0] == j.skeleton_version else self._plan(j)
            self._plans[j.job] = (j.skeleton_version, j.plan)

    def _plan(self, job: JobPingLists) -> dict[str, Any] | None:
        """The probe plan of ``job``'s skeleton (docs/probing.md), or None without one. Link by
        link where the fabric knows every host of the job; else by the budget alone."""
        if job.skeleton is None or job.skeleton.size == 0:
            return None
        pairs = job.skeleton
        links = None
        if self._links is not None:
            key = {ep: f"{i.host}:rnic{i.rail}" for ep, i in job.endpoints.items()}
            try:
                links = self._links.incidence(
                    [key[e] for e in pairs[:, 0].tolist()], [key[e] for e in pairs[:, 1].tolist()]
                )
            except (KeyError, TopologyError) as exc:
                log.warning("job %s planned without the fabric: %s", job.job, exc)
        plan = plan_probes(pairs, self.probe_policy, links=links)
        if not np.array_equal(plan.pairs, pairs):  # the skeleton is kept sorted and unique
            raise TopologyError(f"job {job.job}: the plan's rows are not the skeleton's")
        log.info("job %s probe plan: %s", job.job, plan.summary())
        return plan.to_wire()

    def _index(self, info: EndpointInfo) -> None:
        self._by_container.setdefault((info.job, info.container), set()).add(info.ep)
        self._by_host.setdefault(info.host, set()).add(info.ep)

    # -- lifecycle -----------------------------------------------------------------------------
    def bind(self) -> tuple[str, str]:
        self.endpoint = bind(self.router, self.cfg.bind)
        self.pub_endpoint = bind(self.pub, self.cfg.pub_bind)
        log.info("controller ROUTER %s PUB %s", self.endpoint, self.pub_endpoint)
        return self.endpoint, self.pub_endpoint

    def run(self, stop: threading.Event) -> None:
        self.notifier.ready(f"epoch {self.epoch}, {len(self._by_name)} endpoints")
        try:
            while not stop.is_set():
                self.step(200)
                self.notifier.watchdog()
        finally:
            self.notifier.stopping()
            self.close()

    def close(self) -> None:
        self.registry.close()
        self.router.close(0)
        self.pub.close(0)
        self._security.close()
        self.notifier.close()

    # -- the loop ------------------------------------------------------------------------------
    def step(self, timeout_ms: int = 200) -> int:
        """Handle what arrives within ``timeout_ms`` (one batch), then timers. Returns the number
        of requests handled."""
        handled = 0
        replies: list[tuple[bytes, bytes]] = []
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pub, zmq.POLLIN)
        events = dict(poller.poll(timeout_ms))
        if self.pub in events:
            guard_subscriptions(self.pub, self.policy, self.counters)
        if self.router in events:
            while handled < _BATCH:
                try:
                    frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handled += 1
                replies += self._dispatch(frames)
        now = time.monotonic()
        if self.keys is not None and self.keys.refresh(now=now):
            self._keys_changed(revoked=True)
        self._rebind_pub(now)
        # while requests are still queued (a batch full), their heartbeats are not read yet:
        # the sweep waits for them, so a controller behind on its own queue loses no agent
        if now >= self._next_sweep and handled < _BATCH:
            self._next_sweep = now + self.cfg.heartbeat_interval_s
            self._sweep(now)
        replies += self._expire_commands(now)
        self._commit_and_publish()
        for identity, frame in replies:
            self._send(identity, frame)
        return handled

    def _commit_and_publish(self) -> None:
        for name in list(self._unannounced):
            self._flush_ready(name)
        self.registry.commit()
        staged, self._staged = self._staged, []
        for topic, frame in staged:
            self.pub.send_multipart((topic, frame))
            self.counters["published"] += 1

    def _send(self, identity: bytes, frame: bytes) -> None:
        if not identity:
            self.counters["dropped_replies"] += 1
            return
        try:
            self.router.send_multipart((identity, frame), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # EHOSTUNREACH (peer gone) or EAGAIN (its queue is full)
            self.counters["dropped_replies"] += 1
            log.debug("reply to %r dropped: %s", identity, exc)

    def _frame(self, mtype: MsgType, body: dict[str, Any]) -> bytes:
        self._seq += 1
        return self.codec.encode(mtype, "controller", self._seq, body)

    def _announce(self, topic: bytes, mtype: MsgType, body: dict[str, Any]) -> None:
        """Stage a publication: it goes out after the commit that makes its change durable."""
        self._staged.append((topic, self._frame(mtype, body)))

    def _flush_ready(self, name: str) -> None:
        """Announce the endpoints of job ``name`` marked ready since its last announcement (a
        page at most per version step). Runs at the end of every tick, and before anything else
        changes the job's version, so announcements keep the order of the changes."""
        eps = self._unannounced.pop(name, None)
        if not eps:
            return
        self._flushed_in_request.append((name, eps))
        job = self.jobs[name]
        for i in range(0, len(eps), PAGE_MAX):
            self._announce(
                job_topic(name), MsgType.READY_ANNOUNCE, job.announce_ready(eps[i : i + PAGE_MAX])
            )
            self.counters["ready_announcements"] += 1
        self.registry.put_version(job)

    def _keys_changed(self, *, revoked: bool = False) -> None:
        """A binding or what a key owns changed: the analyzer's mirror refetches. A revoked
        key's subscriptions end with the PUB socket: it is bound afresh (at most every
        ``_REBIND_S``), and every subscriber reconnects through the handshake (the version gap
        makes agents resync)."""
        self._keys_version += 1
        if revoked:
            self._rebind_due = True

    def _rebind_pub(self, now: float) -> None:
        if not self._rebind_due or now < self._rebind_at or not self.pub_endpoint:
            return
        self._rebind_due = False
        self._rebind_at = now + _REBIND_S
        self.pub.close(0)
        self.pub = self._make_pub()
        for attempt in range(50):  # the old listener closes on the I/O thread
            try:
                self.pub.bind(self.pub_endpoint)
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or attempt == 49:
                    raise
                time.sleep(0.02)
        self.counters["pub_rebinds"] += 1

    def _dispatch(self, frames: list[zmq.Frame]) -> list[tuple[bytes, bytes]]:
        """The one entry of every request: identify its sender, decode it, authorize it, run its
        handler, encode the answer; all or nothing. Returns the frames to send."""
        if len(frames) != 2:
            self.codec.rejected["malformed"] += 1
            return []
        identity, raw = frames[0].bytes, frames[1]
        try:
            who = self.policy.identify(identity, transport_user_id(raw))
            env = self.codec.decode(raw.buffer, max_elements=who.max_elements)
        except Unauthorized as exc:
            self.counters["unauthorized"] += 1
            log.debug("refused a connection from %r: %s", identity, exc)
            return []
        except ProtocolError as exc:
            log.debug("rejected frame from %r: %s", identity, exc)
            return []
        self.counters[f"rx_{env.type.value}"] += 1
        handler = self._handlers.get(env.type)
        if handler is None:
            self.codec.rejected["unexpected"] += 1
            return []
        mark = len(self._staged)
        self._mutated = False
        self._unannounced_mark = {j: len(eps) for j, eps in self._unannounced.items()}
        self._flushed_in_request = []
        atomic = env.type in _MUTATING  # reads need no savepoint
        if atomic:
            self.registry.savepoint()
        try:
            self.policy.authorize(who, env)
            reply = handler(self, who, env)
            out = list(reply.forward)
            if reply.mtype is not None:
                if reply.mtype is MsgType.ACK:
                    reply.body["re"] = env.seq  # lets the requester match the answer
                out.append((identity, self._frame(reply.mtype, reply.body)))
        except Exception as exc:
            self._undo(mark, env, exc, atomic)
            if isinstance(exc, Unauthorized):
                self.counters["unauthorized"] += 1
                log.info("refused %s from %r: %s", env.type.value, identity, exc)
            elif isinstance(exc, (ValueError, KeyError, TypeError)):
                # ProtocolError/TopologyError and odd content
                self.counters["request_errors"] += 1
                log.debug("request %s from %r failed: %r", env.type.value, identity, exc)
            else:  # a bug: the request is undone, the daemon goes on
                self.counters["handler_errors"] += 1
                log.exception("request %s from %r failed", env.type.value, identity)
            return [(identity, self._error_frame(env, exc))]
        if atomic:
            self.registry.release()
        return out

    def _error_frame(self, env: Envelope, exc: Exception) -> bytes:
        text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, Unauthorized) else str(exc)
        body: dict[str, Any] = {"ok": False, "error": text[:4000], "re": env.seq}
        if env.type is MsgType.COMMAND and isinstance(env.body.get("cmd_id"), str):
            return self._frame(
                MsgType.COMMAND_REPLY,
                {"cmd_id": env.body["cmd_id"], "ok": False, "error": body["error"]},
            )
        return self._frame(MsgType.ACK, body)

    def _undo(self, mark: int, env: Envelope, exc: Exception, atomic: bool) -> None:
        if atomic:
            self.registry.rollback_request()
        del self._staged[mark:]
        # readiness this request announced goes back to waiting; what it marked is dropped
        for name, eps in reversed(self._flushed_in_request):
            self._unannounced[name] = eps + self._unannounced.get(name, [])
        for name in list(self._unannounced):
            keep = self._unannounced_mark.get(name, 0)
            if keep:
                del self._unannounced[name][keep:]
            else:
                del self._unannounced[name]
        if self._mutated:
            # memory may hold half of the request: rebuild it from the rolled-back registry
            self.counters["rollbacks"] += 1
            log.warning("%s rolled back (%r): reloading state", env.type.value, exc)
            self._load_state(keep_agents=True)
            if self.keys is not None:
                self.keys.set_dynamic(*self.registry.load_keys())
            self._keys_changed()
            self.members_version += 1

    # -- handlers ------------------------------------------------------------------------------
    def _job(self, name: str, shape: dict[str, Any] | None = None) -> JobPingLists:
        job = self.jobs.get(name)
        if job is None:
            if not name or len(name) > NAME_MAX:
                raise TopologyError(f"invalid job name {name[:80]!r}")
            self._mutated = True
            job = self.jobs[name] = JobPingLists(name)
            job.probing = self.probe_policy.to_wire()
        elif not shape:
            return job
        self._mutated = True
        self.registry.put_job(name, shape)
        return job

    def _record(self, d: Any, host: str) -> EndpointInfo:
        """An endpoint record checked (host and id filled in) before anything is written."""
        if not isinstance(d, dict):
            raise ProtocolError("endpoint record is not a map")
        job, container = d.get("job", ""), d.get("container", "")
        if not isinstance(job, str) or not job or len(job) > NAME_MAX:
            raise TopologyError(f"invalid job name {str(job)[:80]!r}")
        name = f"{job}/{container}/{d.get('rail', '')}"
        ep = self._by_name.get(name, 0)
        return EndpointInfo.from_wire({**d, "ep": ep, "host": host})

    def _upsert(self, d: dict[str, Any], host: str, agent: str) -> int:
        info = self._record(d, host)
        return self._store(info, agent)

    def _store(self, info: EndpointInfo, agent: str) -> int:
        self._mutated = True
        job = self._job(info.job)
        ep = self._by_name.get(info.name)
        new = ep is None
        if new:
            ep = self._next_ep
        old = job.endpoints.get(ep)
        if old is not None and old.ready:
            self._flush_ready(job.job)  # a re-registration may announce it down
        info = EndpointInfo(
            ep,
            info.job,
            info.container,
            info.host,
            info.rail,
            info.ip,
            info.port,
            info.gid,
            info.qpn,
            info.netdev,
            info.ready,
        )
        down = job.upsert(info)
        if new:
            self._next_ep += 1
            self._by_name[info.name] = ep
            self._ep_job[ep] = job.job
        if new or old is None or old.host != info.host:
            if old is not None:
                self._by_host.get(old.host, set()).discard(ep)
            self._index(info)
            self._keys_version += 1
        if new or old is None or old.address() != info.address() or old.host != info.host:
            self.members_version += 1
        self.registry.put_endpoint(job.endpoints[ep], agent)
        if down is not None:
            self.registry.put_ready(down["endpoints"], False)
            self.registry.put_version(job)
            self._announce(job_topic(job.job), MsgType.ENDPOINTS_DOWN, down)
        return ep

    def _is(self, who: Principal, agent: _Agent | None) -> bool:
        """Whether ``who`` is ``agent``: its key (CURVE), else the routing id it registered
        from (insecure)."""
        if agent is None:
            return False
        return who.name == agent.name if who.bound else who.routing_id == agent.identity

    def _on_register(self, who: Principal, env: Envelope) -> Reply:
        b = env.body
        agent = b["agent"]
        if not agent or len(agent) > NAME_MAX:
            raise ProtocolError(f"invalid agent name {agent[:80]!r}")
        host = who.host if who.bound else b["host"]
        # every record is checked before any is stored: a bad one fails the whole request
        infos = [self._record(d, host) for d in b["endpoints"]]
        if len({i.name for i in infos}) != len(infos):
            raise ProtocolError("an endpoint is registered twice in one request")
        eps = [self._store(i, agent) for i in infos]
        old = self.agents.get(agent)
        if old is not None:  # endpoints it no longer registers are gone with its old incarnation
            gone = [ep for ep in old.endpoints if ep not in eps]
            self._down(gone, "stopped")
        self._mutated = True
        self.agents[agent] = _Agent(agent, b["role"], host, who.routing_id, time.monotonic(), eps)
        self.registry.put_agent(AgentRecord(agent, b["role"], host))
        self.counters["registrations"] += 1
        return Reply(
            MsgType.REGISTER_ACK,
            {
                "epoch": self.epoch,
                "endpoints": eps,
                # the job's snapshot is paged, its pages shared: the agent asks with SYNC, so a
                # registration costs the same in a job of 10 or of 10,000 endpoints
                "snapshots": [],
                "heartbeat_interval_s": self.cfg.heartbeat_interval_s,
                "resolved": self._resolve(b.get("watch", ()), who),
            },
        )

    def _resolve(self, names: Iterable[Any], who: Principal) -> dict[str, int]:
        """Endpoint ids of the names an underlay agent samples: those on its own host."""
        out = {}
        for n in names:
            ep = self._by_name.get(n) if isinstance(n, str) else None
            if ep is None:
                continue
            if who.bound and ep not in self._by_host.get(who.host, ()):
                continue
            out[n] = ep
        return out

    def _on_ready(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        if not self._is(who, agent):
            return Reply(MsgType.ACK, {"ok": False, "error": "unknown agent: register first"})
        assert agent is not None
        eps = [ep for ep in env.body["endpoints"] if isinstance(ep, int) and ep in agent.endpoints]
        if len(eps) != len(env.body["endpoints"]):
            return Reply(
                MsgType.ACK,
                {"ok": False, "error": "ready for endpoints this agent did not register"},
            )
        agent.last_seen = time.monotonic()
        agent.identity = who.routing_id
        by_job: dict[str, list[int]] = {}
        for ep in eps:
            by_job.setdefault(self._ep_job[ep], []).append(ep)
        for name, job_eps in by_job.items():
            self._mutated = True
            changed = self.jobs[name].mark_ready(job_eps)
            if changed:
                self.registry.put_ready(changed, True)
                self._unannounced.setdefault(name, []).extend(changed)
        return Reply(MsgType.ACK, {"ok": True})

    def _on_deregister(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        if not self._is(who, agent):
            return Reply(MsgType.ACK, {"ok": False, "error": "unknown agent"})
        assert agent is not None
        self._mutated = True
        agent.alive = False  # gone on purpose: not "lost", and its endpoints are retired
        self._down(agent.endpoints, "stopped")
        self._announce(
            AGENTS_TOPIC,
            MsgType.AGENT_STATE,
            {"agent": agent.name, "state": "stopped", "endpoints": list(agent.endpoints)},
        )
        if who.bound and who.role == "overlay" and self.keys is not None:
            # the container stopped: its key goes with it (a new one enrols on restart)
            self._unbind(who.user_id)
        self.counters["deregistrations"] += 1
        log.info("agent %s stopped", agent.name)
        return Reply(MsgType.ACK, {"ok": True})

    def _on_heartbeat(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        known = False
        jobs = {}
        if agent is not None and self._is(who, agent):
            known = agent.alive and env.body["epoch"] == self.epoch
        if known:
            assert agent is not None
            agent.last_seen = time.monotonic()
            agent.identity = who.routing_id
            jobs = {self._ep_job[ep]: self.jobs[self._ep_job[ep]].version for ep in agent.endpoints}
        return Reply(
            MsgType.HEARTBEAT_ACK,
            {
                "epoch": self.epoch,
                "known": known,
                "jobs": jobs,
                "resolved": self._resolve(env.body.get("unresolved", ()), who),
            },
        )

    def _on_sync(self, who: Principal, env: Envelope) -> Reply:
        job = self.jobs.get(env.body["job"])
        if job is None:
            return Reply(
                MsgType.ACK, {"ok": False, "error": f"unknown job {env.body['job'][:80]!r}"}
            )
        return Reply(MsgType.JOB_SNAPSHOT, job.snapshot(after=int(env.body.get("after", -1))))

    def _on_submit(self, who: Principal, env: Envelope) -> Reply:
        b = env.body
        shape = b.get("shape") or {}
        records: list[EndpointInfo] = []
        for c in b["containers"]:
            if not isinstance(c, dict) or not isinstance(c.get("rails"), list):
                raise ProtocolError("a container must be a map with name, host and rails")
            host = c.get("host", "")
            for rail in c["rails"]:
                d = {"job": b["job"], "container": c.get("name", ""), "rail": rail}
                records.append(self._record(d, host))
        self._job(b["job"], shape)
        owner = {ep: a.name for a in self.agents.values() for ep in a.endpoints}
        eps: dict[str, int] = {}
        for i in records:
            ep = self._by_name.get(i.name)
            if ep is not None and self.jobs[i.job].endpoints[ep].host == i.host:
                eps[i.name] = ep
                continue
            # new, or moved by the operator (whose placement enrolment is checked against)
            old = self.jobs[i.job].endpoints.get(ep) if ep is not None else None
            if old is not None:
                i = EndpointInfo(
                    ep,
                    i.job,
                    i.container,
                    i.host,
                    i.rail,
                    *old.address()[:2],
                    old.gid,
                    old.qpn,
                    old.netdev,
                )
            eps[i.name] = self._store(i, owner.get(ep, "") if ep is not None else "")
        self.counters["jobs_submitted"] += 1
        return Reply(MsgType.ACK, {"ok": True, "data": {"endpoints": eps}})

    def _on_remove(self, who: Principal, env: Envelope) -> Reply:
        """Forget a job: its endpoints are announced down (agents drop them from their lists)
        and leave the registry; its sidecars' keys are revoked. An agent still running a
        container of it re-creates the job when it registers again."""
        name = env.body["job"]
        job = self.jobs.get(name)
        if job is None:
            return Reply(MsgType.ACK, {"ok": False, "error": f"unknown job {name[:80]!r}"})
        self._mutated = True
        eps = sorted(job.endpoints)
        self._down(eps, "job removed")
        gone = set(eps)
        for agent in self.agents.values():
            agent.endpoints = [ep for ep in agent.endpoints if ep not in gone]
        for ep in eps:
            info = job.endpoints[ep]
            del self._by_name[info.name], self._ep_job[ep]
            self._by_container.pop((name, info.container), None)
            self._by_host.get(info.host, set()).discard(ep)
        del self.jobs[name]
        self._plans.pop(name, None)
        self.registry.delete_job(name)
        if self.keys is not None:
            for ident in self.keys.dynamic():
                if ident.job == name:
                    self._unbind(ident.key, cut=True)
        self._keys_version += 1
        self.members_version += 1
        self.counters["jobs_removed"] += 1
        log.info("job %s removed (%d endpoints)", name, len(eps))
        return Reply(MsgType.ACK, {"ok": True, "data": {"endpoints": eps}})

    def _on_skeleton(self, who: Principal, env: Envelope) -> Reply:
        job = self.jobs.get(env.body["job"])
        if job is None:
            return Reply(
                MsgType.ACK, {"ok": False, "error": f"unknown job {env.body['job'][:80]!r}"}
            )
        self._apply_skeleton(job.job, unpack_pairs(env.body["pairs"]), env.body["skeleton_version"])
        return Reply(MsgType.ACK, {"ok": True, "data": {"version": job.version}})

    def apply_skeleton(self, job: str, pairs: Any, version: int) -> int:
        """Replace ``job``'s pair set by a skeleton (published once on the job topic; agents add
        new targets before dropping old ones, so no pair in both lists stops being probed).
        Returns the job's new ping-list version."""
        version = self._apply_skeleton(job, pairs, version)
        self._commit_and_publish()
        return version

    def _apply_skeleton(self, job: str, pairs: Any, version: int) -> int:
        self._flush_ready(job)
        j = self.jobs[job]
        self._mutated = True
        body = j.apply_skeleton(pairs, version)
        j.plan = self._plan(j)
        self._plans[job] = (j.skeleton_version, j.plan)
        if j.plan is not None:
            body["plan"] = j.plan
        self.registry.put_skeleton(j)
        self._announce(job_topic(job), MsgType.SKELETON, body)
        return j.version

    def _on_status(self, who: Principal, env: Envelope) -> Reply:
        return Reply(MsgType.ACK, {"ok": True, "data": self.status()})

    def status(self, *, detail: bool = False) -> dict[str, Any]:
        """Counts per job and the agents; endpoint records are read page by page (MEMBERS).
        ``detail`` (the old in-band member list) is accepted and ignored."""
        now = time.monotonic()
        jobs = {
            name: {
                "version": j.version,
                "endpoints": len(j.endpoints),
                "ready": sum(i.ready for i in j.endpoints.values()),
                "skeleton_version": j.skeleton_version,
            }
            for name, j in self.jobs.items()
        }
        agents = {
            a.name: {
                "role": a.role,
                "host": a.host,
                "alive": a.alive,
                # spoken since the controller started (else: known from the registry only)
                "connected": bool(a.identity),
                "last_seen_s": round(now - a.last_seen, 3),
                "endpoints": list(a.endpoints),
            }
            for a in self.agents.values()
        }
        return {
            "epoch": self.epoch,
            "jobs": jobs,
            "agents": agents,
            "members_version": self.members_version,
            "keys_version": self._keys_version,
            "probing": self.probe_policy.to_wire(),
            "counters": dict(self.counters),
            "rejected": dict(self.codec.rejected),
        }

    def _on_members(self, who: Principal, env: Envelope) -> Reply:
        """One page of endpoint records (with the agent of each), by endpoint id."""
        b = env.body
        after, limit = int(b.get("after", -1)), max(1, min(int(b.get("limit", PAGE_MAX)), PAGE_MAX))
        job = b.get("job")
        ids = sorted(
            ep for ep, j in self._ep_job.items() if ep > after and (job is None or j == job)
        )
        page = ids[:limit]
        owner = {ep: a.name for a in self.agents.values() for ep in a.endpoints}
        members = []
        for ep in page:
            m = self.jobs[self._ep_job[ep]].endpoints[ep].to_wire()
            m["agent"] = owner.get(ep, "")
            members.append(m)
        return Reply(
            MsgType.ACK,
            {
                "ok": True,
                "data": {
                    "members": members,
                    "next": page[-1] if len(ids) > limit else None,
                    "version": self.members_version,
                },
            },
        )

    # -- identities ----------------------------------------------------------------------------
    def _bound(self) -> KeyBook:
        if self.keys is None:
            raise ProtocolError("this controller runs without keys (insecure): nothing to bind")
        return self.keys

    def _on_enrol(self, who: Principal, env: Envelope) -> Reply:
        """An underlay agent vouches for the key a sidecar of a container on its host made: the
        key is bound to that container (docs/trust.md). A new key for the same container
        replaces the old one (the container restarted)."""
        book = self._bound()
        b = env.body
        ident = Identity(b["key"], b["name"], "overlay", who.host, b["container"], b["job"])
        try:
            ident.check()
        except ConfigError as exc:
            raise ProtocolError(str(exc)) from None
        where = {
            self.jobs[ident.job].endpoints[ep].host
            for ep in self._by_container.get((ident.job, ident.container), ())
        }
        if where - {who.host}:
            raise Unauthorized(
                f"{ident.job}/{ident.container} runs on {sorted(where)}, not on {who.host}"
            )
        holder = book.lookup(ident.key)
        if holder is not None and holder != ident:
            raise Unauthorized(f"this key is already bound to {holder.name}")
        named = book.by_name(ident.name)
        if named is not None and (
            book.is_static(named.key)
            or named.job != ident.job
            or named.container != ident.container
        ):
            raise Unauthorized(f"agent name {ident.name!r} belongs to another identity")
        if holder == ident:
            return Reply(MsgType.ACK, {"ok": True, "data": {"name": ident.name}})
        self._mutated = True
        for old in book.dynamic():
            if (old.job, old.container) == (ident.job, ident.container) or old.name == ident.name:
                self._unbind(old.key)
        book.bind(ident)
        self.registry.put_key(ident)
        self._keys_changed()
        self.counters["enrolled"] += 1
        log.info(
            "bound a key to %s (%s/%s on %s)", ident.name, ident.job, ident.container, ident.host
        )
        return Reply(MsgType.ACK, {"ok": True, "data": {"name": ident.name}})

    def _unbind(self, key: str, *, cut: bool = False) -> None:
        """Drop a sidecar's binding; ``cut`` also ends its subscriptions (it may still run)."""
        book = self._bound()
        if book.unbind(key) is not None:
            self.registry.delete_key(key)
            self._keys_changed(revoked=cut)

    def _on_revoke(self, who: Principal, env: Envelope) -> Reply:
        """Revoke a key (by key or by agent name): it is refused from now on, its agent is
        marked stopped and its subscriptions end."""
        book = self._bound()
        key = env.body.get("key") or ""
        if not key and env.body.get("name"):
            named = book.by_name(env.body["name"])
            key = named.key if named is not None else ""
        ident = book.lookup(key) if key else None
        if ident is None:
            return Reply(MsgType.ACK, {"ok": False, "error": "no such key or agent"})
        self._mutated = True
        book.revoke(key)
        self.registry.delete_key(key)
        self.registry.put_revoked(key)
        agent = self.agents.get(ident.name)
        if agent is not None and agent.alive:
            agent.alive = False
            self._down(agent.endpoints, "revoked")
        self._keys_changed(revoked=True)
        self.counters["revoked"] += 1
        log.warning("key of %s (%s) revoked", ident.name, ident.role)
        return Reply(MsgType.ACK, {"ok": True, "data": {"name": ident.name, "role": ident.role}})

    def _on_keys(self, who: Principal, env: Envelope) -> Reply:
        """One page of the current bindings, each with the endpoints its key owns (a sidecar:
        its container's; an underlay agent: those on its host), and the revoked keys."""
        book = self._bound()
        version = self._keys_version
        if env.body.get("since") == version:
            return Reply(MsgType.ACK, {"ok": True, "data": {"version": version, "same": True}})
        after = env.body.get("after", "")
        idents = [i for i in book.identities() if i.key > after]
        page = idents[:_KEYS_PAGE]
        out = []
        for i in page:
            if i.role == "overlay":
                eps = self._by_container.get((i.job, i.container), set())
            elif i.role == "underlay":
                eps = self._by_host.get(i.host, set())
            else:
                eps = set()
            out.append(
                {
                    "key": i.key,
                    "name": i.name,
                    "role": i.role,
                    "host": i.host,
                    "container": i.container,
                    "job": i.job,
                    "eps": sorted(eps),
                }
            )
        return Reply(
            MsgType.ACK,
            {
                "ok": True,
                "data": {
                    "version": version,
                    "identities": out,
                    "revoked": sorted(book.revoked) if not after else [],
                    "next": page[-1].key if len(idents) > _KEYS_PAGE else None,
                },
            },
        )

    # -- commands ------------------------------------------------------------------------------
    def _on_command(self, who: Principal, env: Envelope) -> Reply:
        b = env.body

        def refuse(error: str) -> Reply:
            self.counters["commands_refused"] += 1
            return Reply(
                MsgType.COMMAND_REPLY, {"cmd_id": b["cmd_id"], "ok": False, "error": error}
            )

        agent = self.agents.get(b["agent"])
        if agent is None or not agent.alive:
            return refuse(f"agent {b['agent'][:80]!r} is not alive")
        if not agent.identity:
            return refuse(f"agent {b['agent'][:80]!r} has not reconnected since the restart")
        try:
            args = check_command(b["name"], b["args"], agent.role)
            timeout_s, retries = check_delivery(
                b.get("timeout_s", self.cfg.command_timeout_s),
                b.get("retries", self.cfg.command_retries),
            )
        except ProtocolError as exc:
            return refuse(str(exc))
        if (who.routing_id, b["cmd_id"]) in self._relayed:
            return Reply()  # a requester retry of a command still in flight
        if len(self._pending) >= self.cfg.max_pending_commands:
            self.counters["commands_dropped"] += 1
            return Reply(
                MsgType.COMMAND_REPLY,
                {"cmd_id": b["cmd_id"], "ok": False, "error": "controller busy: too many commands"},
            )
        self._cmd_seq += 1
        relay_id = f"{self._cmd_seq:x}.{b['cmd_id']}"
        frame = self._frame(
            MsgType.COMMAND,
            {**b, "cmd_id": relay_id, "args": args, "timeout_s": timeout_s, "retries": retries},
        )
        self._relayed[(who.routing_id, b["cmd_id"])] = relay_id
        self._pending[relay_id] = _Pending(
            who.routing_id,
            b["cmd_id"],
            agent.name,
            frame,
            timeout_s,
            retries,
            time.monotonic() + timeout_s,
        )
        self.counters["commands"] += 1
        return Reply(forward=((agent.identity, frame),))

    def _on_command_reply(self, who: Principal, env: Envelope) -> Reply:
        p = self._pending.get(env.body["cmd_id"])
        if p is None or not self._is(who, self.agents.get(p.agent)):
            self.counters["late_command_replies"] += 1
            return Reply()
        self._done(env.body["cmd_id"])
        body = {**env.body, "cmd_id": p.cmd_id}
        return Reply(forward=((p.requester, self._frame(MsgType.COMMAND_REPLY, body)),))

    def _done(self, relay_id: str) -> None:
        p = self._pending.pop(relay_id)
        self._relayed.pop((p.requester, p.cmd_id), None)

    def _expire_commands(self, now: float) -> list[tuple[bytes, bytes]]:
        """Resend what is due again, answer a timeout for what is out of retries; returns the
        frames to send (routing id, frame)."""
        out: list[tuple[bytes, bytes]] = []
        for relay_id, p in list(self._pending.items()):
            if now < p.deadline:
                continue
            agent = self.agents.get(p.agent)
            if p.retries_left > 0 and agent is not None and agent.alive:
                p.retries_left -= 1
                p.sent += 1
                p.deadline = now + p.timeout_s
                out.append((agent.identity, p.frame))
                self.counters["command_retries"] += 1
                continue
            self._done(relay_id)
            self.counters["command_timeouts"] += 1
            try:
                frame = self._frame(
                    MsgType.COMMAND_REPLY,
                    {
                        "cmd_id": p.cmd_id,
                        "ok": False,
                        "error": f"timeout after {p.sent} attempt(s)",
                    },
                )
            except ProtocolError:  # a requester's id the codec took once cannot fail here
                self.counters["encode_errors"] += 1
                continue
            out.append((p.requester, frame))
        return out

    # -- liveness ------------------------------------------------------------------------------
    def _down(self, eps: Iterable[int], reason: str) -> None:
        by_job: dict[str, list[int]] = {}
        for ep in eps:
            if ep in self._ep_job:
                by_job.setdefault(self._ep_job[ep], []).append(ep)
        for name, job_eps in by_job.items():
            self._flush_ready(name)
            job = self.jobs[name]
            self._mutated = True
            body = job.set_down(job_eps, reason)
            if body is not None:
                self.registry.put_ready(job_eps, False)
                self.registry.put_version(job)
                self._announce(job_topic(name), MsgType.ENDPOINTS_DOWN, body)

    def _sweep(self, now: float) -> None:
        limit = self.cfg.heartbeat_interval_s * self.cfg.heartbeat_misses
        for agent in self.agents.values():
            if agent.alive and now - agent.last_seen > limit:
                agent.alive = False
                self.counters["agents_lost"] += 1
                log.warning(
                    "agent %s missed %d heartbeats: marking its endpoints down",
                    agent.name,
                    self.cfg.heartbeat_misses,
                )
                try:
                    self._down(agent.endpoints, "agent lost")
                    self._announce(
                        AGENTS_TOPIC,
                        MsgType.AGENT_STATE,
                        {"agent": agent.name, "state": "lost", "endpoints": list(agent.endpoints)},
                    )
                except ProtocolError as exc:  # an announcement too large to send
                    self.counters["encode_errors"] += 1
                    log.error("agent %s lost, not announced: %s", agent.name, exc)

    _handlers = {
        MsgType.REGISTER: _on_register,
        MsgType.READY: _on_ready,
        MsgType.DEREGISTER: _on_deregister,
        MsgType.HEARTBEAT: _on_heartbeat,
        MsgType.SYNC: _on_sync,
        MsgType.SUBMIT_JOB: _on_submit,
        MsgType.REMOVE_JOB: _on_remove,
        MsgType.APPLY_SKELETON: _on_skeleton,
        MsgType.STATUS: _on_status,
        MsgType.MEMBERS: _on_members,
        MsgType.COMMAND: _on_command,
        MsgType.COMMAND_REPLY: _on_command_reply,
        MsgType.ENROL: _on_enrol,
        MsgType.REVOKE: _on_revoke,
        MsgType.KEYS: _on_keys,
    }

    # -- metrics -------------------------------------------------------------------------------
    def _collector(self) -> CallbackCollector:
        def agents() -> dict[tuple[str, ...], float]:
            c = Counter((a.role, "alive" if a.alive else "lost") for a in self.agents.values())
            return {k: float(v) for k, v in c.items()}

        def pinglists() -> dict[tuple[str, ...], float]:
            return {
                ("endpoints",): float(len(self._by_name)),
                ("ready",): float(
                    sum(i.ready for j in self.jobs.values() for i in j.endpoints.values())
                ),
                ("jobs",): float(len(self.jobs)),
                ("keys",): float(len(self.keys.identities()) if self.keys else 0),
            }

        return CallbackCollector(
            counters={
                "skh_controller_events": (
                    "Controller events by kind",
                    ("kind",),
                    lambda: {(k,): float(v) for k, v in self.counters.items()},
                ),
                "skh_controller_rejected_frames": (
                    "Frames rejected by reason",
                    ("reason",),
                    lambda: {(k,): float(v) for k, v in self.codec.rejected.items()},
                ),
            },
            gauges={
                "skh_controller_agents": ("Agents by role and state", ("role", "state"), agents),
                "skh_controller_registry": ("Registry sizes", ("kind",), pinglists),
                "skh_controller_pending_commands": (
                    "Commands awaiting a reply",
                    (),
                    lambda: {(): float(len(self._pending))},
                ),
            },
        )
