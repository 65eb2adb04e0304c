"""The controller's admin client: the operator's CLI (``skh job``, ``skh status``, ``skh relay``)
and the analyzer's pipeline speak to the controller through it.

One DEALER (CURVE like the agents' links) carries requests; each answer is matched to its request
by the ``re`` field of the controller's ACK (a JOB_SNAPSHOT by its job, a COMMAND_REPLY by its
command id). A request unanswered within ``timeout_s`` is sent again ``retries`` times, then
:class:`~skh.errors.RequestTimeout` says that no controller answered; a refusal (an unknown job, a
stale skeleton) is :class:`~skh.errors.RequestRefused`. Only idempotent requests are resent
(status, snapshots, a job submission: submitting again maps its endpoints to the ids they already
have); a relayed command is resent to its agent by the controller under one command id, which the
agent answers once::

    with ControllerClient("tcp://ctl:5550", security) as ctl:
        ctl.submit_job(load_job_file("train-7.toml"))
        lists = ctl.ping_lists("train-7")
        print(ctl.relay("host3-underlay", "overlay_state", {"netns": "c7"}))
"""

from __future__ import annotations

import itertools
import logging
import re
import time
import tomllib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from skh.errors import ConfigError, ProtocolError, RequestRefused, RequestTimeout, TopologyError
from skh.model import Container, Job, JobShape
from skh.orchestrator.daemon import make_socket
from skh.orchestrator.pinglist import JobPingLists, merge_snapshot_pages
from skh.orchestrator.security import SecurityConfig
from skh.wire import Codec, Envelope, MsgType, pack_pairs, unpack_pairs

__all__ = [
    "ControllerClient",
    "CommandReply",
    "load_job_file",
    "job_from_mapping",
    "parse_container",
    "ping_list_summary",
    "status_view",
    "unpack_skeleton",
]

log = logging.getLogger(__name__)

_HWM = 1000
#: how long a relayed command may take beyond the controller's own delivery timeouts
_RELAY_MARGIN_S = 1.0


@dataclass(frozen=True, slots=True)
class CommandReply:
    """An agent's answer to a relayed command (or the controller's, when it could not deliver)."""

    agent: str
    name: str
    ok: bool
    result: Any = None
    error: str = ""


class ControllerClient:
    """Admin requests to the controller and commands it relays to agents. Not thread-safe: one
    owner thread (ZeroMQ sockets are not shareable)."""

    def __init__(
        self,
        address: str,
        security: SecurityConfig | None = None,
        *,
        ctx: zmq.Context | None = None,
        timeout_s: float = 5.0,
        retries: int = 1,
        name: str = "admin",
    ) -> None:
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(
                "The 'timeout_s' parameter of ControllerClient must be > 0. "
                f"Got {timeout_s!r} instead."
            )
        if not isinstance(retries, int) or retries < 0:
            raise ConfigError(
                "The 'retries' parameter of ControllerClient must be an int >= 0. "
                f"Got {retries!r} instead."
            )
        self.address = address
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.name = name
        self.codec = Codec()
        self._seq = itertools.count(1)
        self._ctx = ctx or zmq.Context.instance()
        # the controller's ROUTER picks the routing id; the CURVE key says who this client is
        self.sock = make_socket(self._ctx, zmq.DEALER, hwm=_HWM, max_msg_bytes=-1)
        try:
            if security is not None:
                security.client(self.sock)
            self.sock.connect(address)
        except ConfigError:
            self.sock.close(0)
            raise
        except zmq.ZMQError as exc:
            self.sock.close(0)
            raise ConfigError(f"cannot connect to the controller at {address!r}: {exc}") from None

    def close(self) -> None:
        self.sock.close(0)

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, mtype: MsgType, body: Mapping[str, Any]) -> int:
        seq = next(self._seq)
        self.sock.send(self.codec.encode(mtype, self.name, seq, body))
        return seq

    def _recv_until(self, done: Callable[[Envelope], bool], deadline: float) -> None:
        """Read answers until ``done`` says enough or the deadline passes. Late answers to earlier
        requests are skipped by the caller's ``done``."""
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self.sock.poll(left_ms):
                return
            try:
                env = self.codec.decode(self.sock.recv())
            except ProtocolError as exc:
                log.debug("bad frame from the controller: %s", exc)
                continue
            if done(env):
                return

    def _timeout(self, what: str, timeout_s: float, attempts: int) -> RequestTimeout:
        return RequestTimeout(
            f"no answer from the controller at {self.address} to {what} within {timeout_s:g} s "
            f"({attempts} attempt(s)): is skh-controller running there, and does it accept "
            "this client's CURVE key?"
        )

    def request(
        self,
        mtype: MsgType,
        body: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Any:
        """One admin request; returns the ACK's ``data`` (the snapshot body for SYNC).

        Raises RequestTimeout when no answer came after ``retries`` resends, RequestRefused when
        the controller refused."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        retries = self.retries if retries is None else retries
        sent: set[int] = set()
        got: list[Envelope] = []

        def done(env: Envelope) -> bool:
            if env.type is MsgType.ACK and env.body.get("re") in sent:
                got.append(env)
            elif (
                mtype is MsgType.SYNC
                and env.type is MsgType.JOB_SNAPSHOT
                and env.body.get("job") == body.get("job")
            ):
                got.append(env)
            return bool(got)

        for attempt in range(retries + 1):
            if attempt:
                log.info("no answer to %s yet: sending it again (%d)", mtype.value, attempt)
            sent.add(self._send(mtype, body))
            self._recv_until(done, time.monotonic() + timeout_s)
            if got:
                break
        else:
            raise self._timeout(mtype.value, timeout_s, retries + 1)
        env = got[0]
        if env.type is MsgType.JOB_SNAPSHOT:
            return env.body
        if not env.body.get("ok"):
            reason = env.body.get("error") or "no reason given"
            raise RequestRefused(f"the controller refused {mtype.value}: {reason}")
        return env.body.get("data")

    # -- admin requests ------------------------------------------------------------------------
    def status(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """The controller's view: ``{epoch, jobs, agents, members_version, keys_version,
        counters, rejected}``; endpoint records come page by page (:meth:`members`)."""
        return self.request(MsgType.STATUS, {}, timeout_s=timeout_s)

    def snapshot(self, job: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """A job's JOB_SNAPSHOT body (endpoints with readiness, skeleton, version), its pages
        joined (asked again when the job changed between pages)."""
        for _ in range(5):
            pages = [self.request(MsgType.SYNC, {"job": job}, timeout_s=timeout_s)]
            while pages[-1].get("next") is not None:
                pages.append(
                    self.request(
                        MsgType.SYNC, {"job": job, "after": pages[-1]["next"]}, timeout_s=timeout_s
                    )
                )
            try:
                return merge_snapshot_pages(pages)
            except ProtocolError:
                continue
        raise RequestRefused(f"job {job} kept changing while its snapshot was read")

    def members(
        self, *, job: str | None = None, timeout_s: float | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Every endpoint record (with its agent), read page by page; and the members version
        the controller had at the last page."""
        out: list[dict[str, Any]] = []
        after, version = -1, 0
        while True:
            body: dict[str, Any] = {"after": after}
            if job is not None:
                body["job"] = job
            data = self.request(MsgType.MEMBERS, body, timeout_s=timeout_s)
            out += data["members"]
            version = int(data["version"])
            if data["next"] is None:
                return out, version
            after = int(data["next"])

    def keys(self, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """The current key bindings with the endpoints each owns (operator, analyzer)."""
        out: list[dict[str, Any]] = []
        body: dict[str, Any] = {"since": -1}
        while True:
            data = self.request(MsgType.KEYS, body, timeout_s=timeout_s)
            out += data["identities"]
            if data["next"] is None:
                return out
            body = {"since": -1, "after": data["next"]}

    def revoke(self, *, key: str = "", name: str = "", timeout_s: float | None = None) -> Any:
        """Revoke a key, by key or by agent name (operator)."""
        body = {k: v for k, v in (("key", key), ("name", name)) if v}
        return self.request(MsgType.REVOKE, body, timeout_s=timeout_s, retries=0)

    def ping_lists(self, job: str, *, timeout_s: float | None = None) -> JobPingLists:
        """A job's ping lists as the agents hold them (built from a fresh snapshot)."""
        return JobPingLists.from_snapshot(self.snapshot(job, timeout_s=timeout_s))

    def submit_job(
        self,
        job: Job | str,
        containers: Iterable[Mapping[str, Any]] | None = None,
        shape: Mapping[str, int] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, int]:
        """Submit (or extend) a job: its endpoints enter the preload list before any agent
        registers. Pass a :class:`~skh.model.Job`, or a name with wire-form containers
        (``{name, host, rails}``) and shape. Returns endpoint name -> endpoint id."""
        if isinstance(job, Job):
            if containers is not None or shape is not None:
                raise ConfigError(
                    "submit_job takes a Job, or a job name with containers and shape: not both"
                )
            name, containers, shape = job.name, _wire_containers(job), _wire_shape(job.shape)
        else:
            name = job
        data = self.request(
            MsgType.SUBMIT_JOB,
            {
                "job": name,
                "shape": dict(shape or {}),
                "containers": [dict(c) for c in containers or ()],
            },
            timeout_s=timeout_s,
        )
        return {str(k): int(v) for k, v in data["endpoints"].items()}

    def remove_job(self, job: str, *, timeout_s: float | None = None) -> list[int]:
        """Forget a job: its endpoints leave every ping list (announced as down) and the registry.
        Returns the endpoint ids removed. Not resent: a second removal would be refused."""
        data = self.request(MsgType.REMOVE_JOB, {"job": job}, timeout_s=timeout_s, retries=0)
        return [int(ep) for ep in data["endpoints"]]

    def apply_skeleton(
        self, job: str, pairs: np.ndarray, version: int, *, timeout_s: float | None = None
    ) -> int:
        """Replace a job's pair set by a skeleton; returns the job's new ping-list version. Not
        resent: the same skeleton version twice is refused as stale."""
        data = self.request(
            MsgType.APPLY_SKELETON,
            {"job": job, "skeleton_version": int(version), "pairs": pack_pairs(pairs)},
            timeout_s=timeout_s,
            retries=0,
        )
        return int(data["version"])

    # -- relayed commands ----------------------------------------------------------------------
    def _relay(
        self, calls: list[tuple[str, str, Mapping[str, Any]]], timeout_s: float, retries: int
    ) -> dict[str, dict[str, Any]]:
        """Send each command once; the controller resends to the agent and always answers (with
        a timeout error at worst), so only a dead controller leaves an id without reply."""
        ids = [uuid.uuid4().hex for _ in calls]
        for cmd_id, (agent, name, args) in zip(ids, calls, strict=True):
            self._send(
                MsgType.COMMAND,
                {
                    "cmd_id": cmd_id,
                    "agent": agent,
                    "name": name,
                    "args": dict(args),
                    "timeout_s": timeout_s,
                    "retries": retries,
                },
            )
        want = set(ids)
        replies: dict[str, dict[str, Any]] = {}

        def done(env: Envelope) -> bool:
            if env.type is MsgType.COMMAND_REPLY and env.body.get("cmd_id") in want:
                replies[env.body["cmd_id"]] = dict(env.body)
            return len(replies) == len(ids)

        if ids:
            deadline = time.monotonic() + timeout_s * (retries + 1) + _RELAY_MARGIN_S
            self._recv_until(done, deadline)
        return {i: replies.get(i, {}) for i in ids}

    def commands(
        self,
        calls: Iterable[tuple[str, str, Mapping[str, Any]]],
        *,
        timeout_s: float,
        retries: int = 0,
    ) -> list[dict[str, Any]]:
        """Relay several commands ``(agent, name, args)`` at once; returns their COMMAND_REPLY
        bodies in order (``{"ok": False, "error": ...}`` for a refused, failed or unanswered
        one)."""
        calls = list(calls)
        replies = self._relay(calls, timeout_s, retries)
        return [r or {"ok": False, "error": "no reply"} for r in replies.values()]

    def relay(
        self,
        agent: str,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> CommandReply:
        """Have the controller relay one command (``traceroute``, ``dump_flows``,
        ``overlay_state``, ``stats``, ...) to an agent and return its answer. A failed command
        is a reply with ``ok=False``; no answer at all (the controller is down) raises
        RequestTimeout."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        retries = self.retries if retries is None else retries
        (body,) = self._relay([(agent, name, args or {})], timeout_s, retries).values()
        if not body:
            raise self._timeout(f"command {name!r} for agent {agent!r}", timeout_s, retries + 1)
        return CommandReply(
            agent, name, bool(body.get("ok")), body.get("result"), str(body.get("error", ""))
        )


# ---------------------------------------------------------------------------------------------
# jobs: the TOML job file and the wire form


def _wire_containers(job: Job) -> list[dict[str, Any]]:
    return [{"name": c.name, "host": c.host, "rails": list(c.rails)} for c in job.containers]


def _wire_shape(shape: JobShape) -> dict[str, int]:
    return {"tp": shape.tp, "pp": shape.pp, "dp": shape.dp, "ep": shape.ep}


def _container(d: Any, job: str, where: str) -> Container:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: a container must be a table, got {type(d).__name__}")
    unknown = set(d) - {"name", "host", "rails"}
    if unknown:
        raise ConfigError(f"{where}: unknown container key(s) {sorted(unknown)}")
    name, host, rails = d.get("name"), d.get("host"), d.get("rails")
    for key, value in (("name", name), ("host", host)):
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"{where}: '{key}' must be a non-empty string. Got {value!r} instead."
            )
    if (
        not isinstance(rails, list)
        or not rails
        or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 256 for r in rails)
        or len(set(rails)) != len(rails)
    ):
        raise ConfigError(
            f"{where}: 'rails' must be a non-empty list of distinct ints in [0, 255]. "
            f"Got {rails!r} instead."
        )
    return Container(name=name, job=job, host=host, rails=tuple(rails))


def job_from_mapping(data: Mapping[str, Any], where: str = "job") -> Job:
    """A :class:`~skh.model.Job` from ``{name, shape: {tp, pp, dp, ep}, containers: [{name,
    host, rails}]}``, every field checked with a message naming it."""
    unknown = set(data) - {"name", "shape", "containers"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    name = data.get("name")
    if not isinstance(name, str) or not name or len(name) > 256:
        raise ConfigError(f"{where}: 'name' must be a string of 1..256 characters. Got {name!r}.")
    shape_d = data.get("shape", {})
    if not isinstance(shape_d, Mapping) or set(shape_d) - {"tp", "pp", "dp", "ep"}:
        raise ConfigError(
            f"{where}: 'shape' must be a table of tp, pp, dp, ep. Got {shape_d!r} instead."
        )
    try:
        shape = JobShape(**shape_d)
    except TopologyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    containers = data.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ConfigError(f"{where}: 'containers' must be a non-empty list of tables")
    out = tuple(_container(c, name, f"{where}: containers[{i}]") for i, c in enumerate(containers))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"{where}: container names must be unique; repeated: {dup}")
    return Job(name=name, shape=shape, containers=out)


def load_job_file(path: str | Path) -> Job:
    """Read a TOML job file::

    name = "train-7"
    shape = {tp = 8, pp = 2, dp = 2}
    [[containers]]
    name = "w0"
    host = "host0"
    rails = [0, 1, 2, 3]
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read job file {str(path)!r}: {exc}") from None
    return job_from_mapping(data, f"job file {str(path)!r}")


_CONTAINER_SPEC = re.compile(r"^([^:\s]+):([^:\s]+):([0-9,\-]+)$")


def _rails(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(part)
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_container(spec: str, job: str) -> Container:
    """``NAME:HOST:RAILS`` (rails as ``0-3`` or ``0,2``) as a container of ``job``."""
    m = _CONTAINER_SPEC.match(spec)
    try:
        rails = _rails(m.group(3)) if m else None
    except ValueError:
        rails = None
    if m is None or rails is None:
        raise ConfigError(
            f"a container must be NAME:HOST:RAILS, e.g. w0:host0:0-3 or w0:host0:0,2. "
            f"Got {spec!r} instead."
        )
    return _container({"name": m.group(1), "host": m.group(2), "rails": rails}, job, spec)


# ---------------------------------------------------------------------------------------------
# views for the operator


def unpack_skeleton(body: Mapping[str, Any]) -> np.ndarray | None:
    """The skeleton pairs of a JOB_SNAPSHOT body (None while the job runs on its preload list)."""
    raw = body.get("skeleton")
    return None if raw is None else unpack_pairs(raw)


def ping_list_summary(lists: JobPingLists) -> dict[str, Any]:
    """Sizes and mode of one job's ping lists: ``preload`` (every same-rail, different-host
    pair), ``pairs`` (the skeleton, when one is applied, else the preload list) and ``active``
    (those with a ready destination: what agents probe now)."""
    counts = lists.pair_counts()  # counted, never listed: 32 M pairs for a 2,000-host job
    return {
        "version": lists.version,
        "mode": "preload" if lists.skeleton is None else "skeleton",
        "skeleton_version": lists.skeleton_version,
        "endpoints": len(lists.endpoints),
        "ready": sum(i.ready for i in lists.endpoints.values()),
        "preload_pairs": counts["preload"],
        "pairs": counts["pairs"],
        "active_pairs": counts["active"],
    }


def status_view(client: ControllerClient) -> dict[str, Any]:
    """The controller's view for an operator: agents, and per job its ping-list summary and
    endpoints, each with its readiness and its agent's heartbeat state."""
    st = client.status()
    owner = {ep: name for name, a in st["agents"].items() for ep in a["endpoints"]}
    jobs: dict[str, Any] = {}
    for job in st["jobs"]:
        try:
            lists = client.ping_lists(job)
        except RequestRefused:  # removed between the two requests
            continue
        eps = []
        for info in sorted(lists.endpoints.values(), key=lambda i: i.ep):
            agent = owner.get(info.ep)
            a = st["agents"].get(agent) if agent else None
            eps.append(
                {
                    "ep": info.ep,
                    "name": info.name,
                    "host": info.host,
                    "rail": info.rail,
                    "ready": info.ready,
                    "agent": agent or "",
                    "agent_alive": bool(a and a["alive"]),
                    "last_heartbeat_s": a["last_seen_s"] if a else None,
                }
            )
        jobs[job] = {**ping_list_summary(lists), "members": eps}
    return {"epoch": st["epoch"], "jobs": jobs, "agents": st["agents"], "counters": st["counters"]}
