"""skh-controller: the job/endpoint registry, ping-list versions and the command relay.

Sockets:

* ROUTER (``bind``): agents' DEALERs (register, ready, heartbeat, command replies) and admin
  requests (submit_job, apply_skeleton, status, command) from the CLI or the analyzer.
* PUB (``pub_bind``): one topic per job (``j:<job>\\0``) carrying readiness announcements,
  endpoints going down and skeletons, each once, with the job's ping-list version; ``agents\\0``
  carries agent liveness changes.

Every request enters at :meth:`Controller._dispatch`: its sender becomes a
:class:`~skh.orchestrator.authz.Principal`, the controller's :class:`~skh.orchestrator.authz.Policy`
authorizes it, and its handler returns a :class:`Reply` (the answer to the sender and frames for
other peers). What a request changes is written to the registry and its announcements are staged
beside those writes; the loop handles a batch of requests, commits the registry once, then
publishes and answers: nothing is acknowledged or announced before it is durable.
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

import zmq

from skh.errors import ProtocolError, TopologyError, Unauthorized
from skh.orchestrator.authz import AllowAll, Policy, Principal, transport_user_id
from skh.orchestrator.config import ControllerConfig
from skh.orchestrator.daemon import bind, make_socket
from skh.orchestrator.metrics import CallbackCollector, CollectorRegistry
from skh.orchestrator.pinglist import EndpointInfo, JobPingLists
from skh.orchestrator.registry import AgentRecord, Registry
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import SecurityConfig, ServerSecurity
from skh.wire import AGENTS_TOPIC, Codec, Envelope, MsgType, job_topic, unpack_pairs

__all__ = ["Controller", "Reply"]

log = logging.getLogger(__name__)

_BATCH = 2000  # requests handled per commit


@dataclass(slots=True)
class _Agent:
    name: str
    role: str
    host: str
    identity: bytes
    last_seen: float
    endpoints: list[int] = field(default_factory=list)
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler answers: ``mtype`` and ``body`` go back to the sender (nothing when
    ``mtype`` is None); ``forward`` holds encoded frames for other peers by routing id (a relayed
    command for its agent, an agent's command reply for the command's requester)."""

    mtype: MsgType | None = None
    body: dict[str, Any] = field(default_factory=dict)
    forward: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(slots=True)
class _Pending:
    requester: bytes
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
    ) -> None:
        self.cfg = cfg
        self.policy: Policy = policy if policy is not None else AllowAll()
        self.codec = Codec(max_frame_bytes=cfg.max_frame_bytes)
        self.registry = Registry(cfg.db)
        self.jobs, owner, records = self.registry.load()
        self._next_ep = self.registry.max_ep() + 1
        self._by_name = {i.name: i.ep for j in self.jobs.values() for i in j.endpoints.values()}
        self._ep_job = {i.ep: i.job for j in self.jobs.values() for i in j.endpoints.values()}
        now = time.monotonic()
        # agents known before a restart get one full heartbeat window to come back
        self.agents: dict[str, _Agent] = {
            r.agent: _Agent(r.agent, r.role, r.host, r.agent.encode(), now)
            for r in records.values()
        }
        for ep, agent in owner.items():
            if agent in self.agents:
                self.agents[agent].endpoints.append(ep)
        self.epoch = uuid.uuid4().hex[:12]
        self.counters: Counter[str] = Counter()
        self._pending: dict[str, _Pending] = {}
        #: announcements (topic, frame) of registry changes not yet committed
        self._staged: list[tuple[bytes, bytes]] = []
        self._seq = 0
        self._ctx = ctx or zmq.Context.instance()
        self._security = ServerSecurity(security, self._ctx)
        self.router = make_socket(self._ctx, zmq.ROUTER, hwm=cfg.hwm)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.pub = make_socket(self._ctx, zmq.PUB, hwm=cfg.hwm)
        for s in (self.router, self.pub):
            self._security.apply(s)
        self.endpoint = self.pub_endpoint = ""
        self._next_sweep = now + cfg.heartbeat_interval_s
        self.notifier = Notifier()
        if metrics is not None:
            metrics.register(self._collector())
        log.info(
            "controller epoch %s: %d jobs, %d endpoints, %d agents from %s",
            self.epoch,
            len(self.jobs),
            len(self._by_name),
            len(self.agents),
            cfg.db,
        )

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
        if self.router.poll(timeout_ms, zmq.POLLIN):
            while handled < _BATCH:
                try:
                    frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handled += 1
                replies += self._dispatch(frames)
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.cfg.heartbeat_interval_s
            self._sweep(now)
        replies += self._expire_commands(now)
        self._commit_and_publish()
        for identity, frame in replies:
            self._send(identity, frame)
        return handled

    def _commit_and_publish(self) -> None:
        self.registry.commit()
        staged, self._staged = self._staged, []
        for topic, frame in staged:
            self.pub.send_multipart((topic, frame))
            self.counters["published"] += 1

    def _send(self, identity: bytes, frame: bytes) -> None:
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

    def _dispatch(self, frames: list[zmq.Frame]) -> list[tuple[bytes, bytes]]:
        """The one entry of every request: identify its sender, decode it, authorize it, run its
        handler. Returns the frames to send (routing id, frame)."""
        if len(frames) != 2:
            self.codec.rejected["malformed"] += 1
            return []
        identity, raw = frames[0].bytes, frames[1]
        try:
            who = self.policy.identify(identity, transport_user_id(raw))
            env = self.codec.decode(raw.buffer)
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
        try:
            self.policy.authorize(who, env)
            reply = handler(self, who, env)
        except Unauthorized as exc:
            self.counters["unauthorized"] += 1
            log.info("refused %s from %r: %s", env.type.value, identity, exc)
            reply = Reply(MsgType.ACK, {"ok": False, "error": str(exc)})
        except (
            ValueError,
            KeyError,
            TypeError,
        ) as exc:  # ProtocolError/TopologyError and odd content
            self.counters["request_errors"] += 1
            log.debug("request %s from %r failed: %r", env.type.value, identity, exc)
            reply = Reply(MsgType.ACK, {"ok": False, "error": str(exc)})
        out = list(reply.forward)
        if reply.mtype is not None:
            if reply.mtype is MsgType.ACK:
                reply.body["re"] = env.seq  # lets the requester match the answer to its request
            out.append((identity, self._frame(reply.mtype, reply.body)))
        return out

    # -- handlers ------------------------------------------------------------------------------
    def _job(self, name: str, shape: dict[str, Any] | None = None) -> JobPingLists:
        job = self.jobs.get(name)
        if job is None:
            if not name or len(name) > 256:
                raise TopologyError(f"invalid job name {name!r}")
            job = self.jobs[name] = JobPingLists(name)
        elif not shape:
            return job
        self.registry.put_job(name, shape)
        return job

    def _upsert(self, d: dict[str, Any], host: str, agent: str) -> int:
        if not isinstance(d, dict):
            raise ProtocolError("endpoint record is not a map")
        job = self._job(str(d.get("job", "")))
        name = f"{job.job}/{d.get('container', '')}/{d.get('rail', '')}"
        ep = self._by_name.get(name)
        if ep is None:
            ep = self._next_ep
        info = EndpointInfo.from_wire({**d, "ep": ep, "host": d.get("host") or host})
        down = job.upsert(info)
        if ep == self._next_ep:
            self._next_ep += 1
            self._by_name[name] = ep
            self._ep_job[ep] = job.job
        self.registry.put_endpoint(job.endpoints[ep], agent)
        if down is not None:
            self.registry.put_ready(down["endpoints"], False)
            self.registry.put_version(job)
            self._announce(job_topic(job.job), MsgType.ENDPOINTS_DOWN, down)
        return ep

    def _on_register(self, who: Principal, env: Envelope) -> Reply:
        b = env.body
        agent = b["agent"]
        if not agent or len(agent) > 256 or who.routing_id != agent.encode():
            raise ProtocolError(f"agent name {agent!r} must equal the socket routing id")
        eps = [self._upsert(d, b["host"], agent) for d in b["endpoints"]]
        old = self.agents.get(agent)
        if old is not None:  # endpoints it no longer registers are gone with its old incarnation
            gone = [ep for ep in old.endpoints if ep not in eps]
            self._down(gone, "stopped")
        self.agents[agent] = _Agent(
            agent, b["role"], b["host"], who.routing_id, time.monotonic(), eps
        )
        self.registry.put_agent(AgentRecord(agent, b["role"], b["host"]))
        jobs = dict.fromkeys(self._ep_job[ep] for ep in eps)
        self.counters["registrations"] += 1
        return Reply(
            MsgType.REGISTER_ACK,
            {
                "epoch": self.epoch,
                "endpoints": eps,
                "snapshots": [self.jobs[j].snapshot() for j in jobs],
                "heartbeat_interval_s": self.cfg.heartbeat_interval_s,
                "resolved": self._resolve(b.get("watch", ())),
            },
        )

    def _resolve(self, names: Iterable[Any]) -> dict[str, int]:
        return {n: self._by_name[n] for n in names if isinstance(n, str) and n in self._by_name}

    def _on_ready(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        if agent is None or agent.identity != who.routing_id:
            return Reply(MsgType.ACK, {"ok": False, "error": "unknown agent: register first"})
        eps = [ep for ep in env.body["endpoints"] if isinstance(ep, int) and ep in agent.endpoints]
        if len(eps) != len(env.body["endpoints"]):
            return Reply(
                MsgType.ACK,
                {"ok": False, "error": "ready for endpoints this agent did not register"},
            )
        agent.last_seen = time.monotonic()
        by_job: dict[str, list[int]] = {}
        for ep in eps:
            by_job.setdefault(self._ep_job[ep], []).append(ep)
        for name, job_eps in by_job.items():
            job = self.jobs[name]
            body = job.set_ready(job_eps)
            if body is not None:
                self.registry.put_ready(job_eps, True)
                self.registry.put_version(job)
                self._announce(job_topic(name), MsgType.READY_ANNOUNCE, body)
                self.counters["ready_announcements"] += 1
        return Reply(MsgType.ACK, {"ok": True})

    def _on_deregister(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        if agent is None or agent.identity != who.routing_id:
            return Reply(MsgType.ACK, {"ok": False, "error": "unknown agent"})
        agent.alive = False  # gone on purpose: not "lost", and its endpoints are retired
        self._down(agent.endpoints, "stopped")
        self._announce(
            AGENTS_TOPIC,
            MsgType.AGENT_STATE,
            {"agent": agent.name, "state": "stopped", "endpoints": list(agent.endpoints)},
        )
        self.counters["deregistrations"] += 1
        log.info("agent %s stopped", agent.name)
        return Reply(MsgType.ACK, {"ok": True})

    def _on_heartbeat(self, who: Principal, env: Envelope) -> Reply:
        agent = self.agents.get(env.body["agent"])
        known = (
            agent is not None
            and agent.alive
            and agent.identity == who.routing_id
            and env.body["epoch"] == self.epoch
        )
        if known:
            agent.last_seen = time.monotonic()
        jobs = {}
        if agent is not None:
            jobs = {self._ep_job[ep]: self.jobs[self._ep_job[ep]].version for ep in agent.endpoints}
        return Reply(
            MsgType.HEARTBEAT_ACK,
            {
                "epoch": self.epoch,
                "known": known,
                "jobs": jobs,
                "resolved": self._resolve(env.body.get("unresolved", ())),
            },
        )

    def _on_sync(self, who: Principal, env: Envelope) -> Reply:
        job = self.jobs.get(env.body["job"])
        if job is None:
            return Reply(MsgType.ACK, {"ok": False, "error": f"unknown job {env.body['job']!r}"})
        return Reply(MsgType.JOB_SNAPSHOT, job.snapshot())

    def _on_submit(self, who: Principal, env: Envelope) -> Reply:
        b = env.body
        shape = b.get("shape") or {}
        self._job(b["job"], shape)
        eps: dict[str, int] = {}
        for c in b["containers"]:
            if not isinstance(c, dict) or not isinstance(c.get("rails"), list):
                raise ProtocolError("a container must be a map with name, host and rails")
            for rail in c["rails"]:
                d = {
                    "job": b["job"],
                    "container": c.get("name", ""),
                    "rail": rail,
                    "host": c.get("host", ""),
                }
                name = f"{b['job']}/{d['container']}/{rail}"
                eps[name] = (
                    self._by_name[name] if name in self._by_name else self._upsert(d, d["host"], "")
                )
        self.counters["jobs_submitted"] += 1
        return Reply(MsgType.ACK, {"ok": True, "data": {"endpoints": eps}})

    def _on_remove(self, who: Principal, env: Envelope) -> Reply:
        """Forget a job: its endpoints are announced down (agents drop them from their lists)
        and leave the registry. An agent still running a container of it re-creates the job
        when it registers again."""
        name = env.body["job"]
        job = self.jobs.get(name)
        if job is None:
            return Reply(MsgType.ACK, {"ok": False, "error": f"unknown job {name!r}"})
        eps = sorted(job.endpoints)
        self._down(eps, "job removed")
        gone = set(eps)
        for agent in self.agents.values():
            agent.endpoints = [ep for ep in agent.endpoints if ep not in gone]
        for ep in eps:
            del self._by_name[job.endpoints[ep].name], self._ep_job[ep]
        del self.jobs[name]
        self.registry.delete_job(name)
        self.counters["jobs_removed"] += 1
        log.info("job %s removed (%d endpoints)", name, len(eps))
        return Reply(MsgType.ACK, {"ok": True, "data": {"endpoints": eps}})

    def _on_skeleton(self, who: Principal, env: Envelope) -> Reply:
        job = self.jobs.get(env.body["job"])
        if job is None:
            return Reply(MsgType.ACK, {"ok": False, "error": f"unknown job {env.body['job']!r}"})
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
        j = self.jobs[job]
        body = j.apply_skeleton(pairs, version)
        self.registry.put_skeleton(j)
        self._announce(job_topic(job), MsgType.SKELETON, body)
        return j.version

    def _on_status(self, who: Principal, env: Envelope) -> Reply:
        return Reply(
            MsgType.ACK, {"ok": True, "data": self.status(detail=bool(env.body.get("detail")))}
        )

    def status(self, *, detail: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        jobs = {}
        for name, j in self.jobs.items():
            d: dict[str, Any] = {
                "version": j.version,
                "endpoints": len(j.endpoints),
                "ready": sum(i.ready for i in j.endpoints.values()),
                "skeleton_version": j.skeleton_version,
            }
            if detail:
                d["members"] = [i.to_wire() for i in j.endpoints.values()]
            jobs[name] = d
        agents = {
            a.name: {
                "role": a.role,
                "host": a.host,
                "alive": a.alive,
                "last_seen_s": round(now - a.last_seen, 3),
                "endpoints": list(a.endpoints),
            }
            for a in self.agents.values()
        }
        return {
            "epoch": self.epoch,
            "jobs": jobs,
            "agents": agents,
            "counters": dict(self.counters),
            "rejected": dict(self.codec.rejected),
        }

    # -- commands ------------------------------------------------------------------------------
    def _on_command(self, who: Principal, env: Envelope) -> Reply:
        b = env.body
        agent = self.agents.get(b["agent"])
        if agent is None or not agent.alive:
            return Reply(
                MsgType.COMMAND_REPLY,
                {"cmd_id": b["cmd_id"], "ok": False, "error": f"agent {b['agent']!r} is not alive"},
            )
        if b["cmd_id"] in self._pending:
            return Reply()  # a requester retry of a command still in flight
        timeout_s = float(b.get("timeout_s", self.cfg.command_timeout_s))
        retries = int(b.get("retries", self.cfg.command_retries))
        frame = self._frame(MsgType.COMMAND, dict(b))
        self._pending[b["cmd_id"]] = _Pending(
            who.routing_id,
            agent.name,
            frame,
            timeout_s,
            max(0, retries),
            time.monotonic() + timeout_s,
        )
        self.counters["commands"] += 1
        return Reply(forward=((agent.identity, frame),))

    def _on_command_reply(self, who: Principal, env: Envelope) -> Reply:
        p = self._pending.pop(env.body["cmd_id"], None)
        if p is None or p.agent.encode() != who.routing_id:
            self.counters["late_command_replies"] += 1
            return Reply()
        return Reply(forward=((p.requester, self._frame(MsgType.COMMAND_REPLY, dict(env.body))),))

    def _expire_commands(self, now: float) -> list[tuple[bytes, bytes]]:
        """Resend what is due again, answer a timeout for what is out of retries; returns the
        frames to send (routing id, frame)."""
        out: list[tuple[bytes, bytes]] = []
        for cmd_id, p in list(self._pending.items()):
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
            del self._pending[cmd_id]
            self.counters["command_timeouts"] += 1
            out.append(
                (
                    p.requester,
                    self._frame(
                        MsgType.COMMAND_REPLY,
                        {
                            "cmd_id": cmd_id,
                            "ok": False,
                            "error": f"timeout after {p.sent} attempt(s)",
                        },
                    ),
                )
            )
        return out

    # -- liveness ------------------------------------------------------------------------------
    def _down(self, eps: Iterable[int], reason: str) -> None:
        by_job: dict[str, list[int]] = {}
        for ep in eps:
            if ep in self._ep_job:
                by_job.setdefault(self._ep_job[ep], []).append(ep)
        for name, job_eps in by_job.items():
            job = self.jobs[name]
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
                self._down(agent.endpoints, "agent lost")
                self._announce(
                    AGENTS_TOPIC,
                    MsgType.AGENT_STATE,
                    {"agent": agent.name, "state": "lost", "endpoints": list(agent.endpoints)},
                )

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
        MsgType.COMMAND: _on_command,
        MsgType.COMMAND_REPLY: _on_command_reply,
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
