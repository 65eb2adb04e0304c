"""Who may ask a daemon for what: the one gate every request passes before its handler runs.

Every request the controller (ROUTER) and the analyzer (PULL, REP) receive becomes a
:class:`Principal` — its sender as the transport proves it: the ROUTER routing id and the ZAP
``User-Id`` of the connection (under CURVE the Z85 text of the client's public key, which the
peer proved it holds) — and the daemon's :class:`Policy` authorizes the decoded request for that
principal before the request's handler is called. A refusal is :class:`~skh.errors.Unauthorized`:
the controller and the analyzer's REP answer it with a failed ACK, a pushed batch is dropped;
either way nothing the request asked for happens, and the refusal is counted (``unauthorized``).
Subscriptions to a daemon's PUB topics pass the same policy (:meth:`Policy.subscribe`).

With CURVE on, a key is an :class:`~skh.orchestrator.security.Identity` (:class:`KeyBook`), and
:class:`ControllerPolicy` / :class:`AnalyzerPolicy` apply the rules of docs/trust.md:

* an overlay sidecar speaks only as its own agent name, registers, heartbeats and reports only
  its own container's endpoints, and hears only its own job's topic;
* an underlay agent speaks only as itself, for its own host: counters of endpoints on that host,
  enrolment of containers on that host;
* the operator (``admin``) and the analyzer alone submit and remove jobs, apply skeletons, read
  the registry and relay commands; the operator alone revokes keys;
* alert subscribers (``subscriber``) only replay and follow alerts.

:class:`AllowAll` is the ``insecure = true`` policy: no keys, so no identities; every request is
allowed and the handlers' own checks hold (an agent's later requests must come from the routing
id that registered it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import zmq

from skh.errors import ConfigError, Unauthorized
from skh.orchestrator.security import Identity, load_trusted
from skh.wire import ALERTS_TOPIC, Envelope, MsgType, job_topic

__all__ = [
    "Principal",
    "Policy",
    "AllowAll",
    "KeyBook",
    "ControllerPolicy",
    "AnalyzerPolicy",
    "Unauthorized",
    "transport_user_id",
    "guard_subscriptions",
    "ROLE_ELEMENTS",
]

log = logging.getLogger(__name__)

#: decode budget (list items and map entries per frame) by role: agents never need more than a
#: register of their endpoints or a watch list; the operator's and the analyzer's requests
#: (job submissions) may be large
ROLE_ELEMENTS = {
    "overlay": 65_536,
    "underlay": 200_000,
    "subscriber": 4_096,
}


@dataclass(frozen=True, slots=True)
class Principal:
    """The sender of one request.

    ``routing_id``: the ROUTER routing id (empty on PULL and REP sockets, which carry none);
    ``user_id``: the ZAP ``User-Id`` of the connection (empty on an insecure link). The other
    fields are the identity bound to that key; empty on an insecure link.
    """

    routing_id: bytes = b""
    user_id: str = ""
    #: the agent (or operator, analyzer, subscriber) name the key is bound to
    name: str = ""
    #: ``overlay``, ``underlay``, ``admin``, ``analyzer`` or ``subscriber``
    role: str = ""
    host: str = ""
    container: str = ""
    job: str = ""

    @property
    def bound(self) -> bool:
        """Whether this sender is a key-bound identity (CURVE on)."""
        return bool(self.role)

    @property
    def max_elements(self) -> int | None:
        return ROLE_ELEMENTS.get(self.role)


class Policy(Protocol):
    """How a daemon turns a sender into a :class:`Principal` and decides its requests."""

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        """The principal behind a connection; called before the request is decoded, so a
        policy may refuse (raise :class:`Unauthorized`) an unknown key without decoding."""
        ...

    def authorize(self, who: Principal, env: Envelope) -> None:
        """Return if ``who`` may make request ``env`` (its type and body); raise
        :class:`Unauthorized` saying why not."""
        ...

    def subscribe(self, who: Principal, topic: bytes) -> bool:
        """Whether ``who`` may hear ``topic`` on the daemon's PUB socket."""
        ...


class AllowAll:
    """The insecure policy: every client may make every request (see the module's doc)."""

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        return Principal(routing_id, user_id)

    def authorize(self, who: Principal, env: Envelope) -> None:
        return None

    def subscribe(self, who: Principal, topic: bytes) -> bool:
        return True


def transport_user_id(frame: zmq.Frame) -> str:
    """The ZAP ``User-Id`` of the connection ``frame`` (received with ``copy=False``) came on:
    the client's Z85 public key under CURVE, ``""`` when the link has none (insecure)."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:  # EINVAL: no such property (NULL mechanism, no ZAP handler)
        return ""


# ---------------------------------------------------------------------------------------------
# the key book


class KeyBook:
    """The current identities by public key: the trusted directory's certificates (re-read when
    the directory changes) and the bindings made at run time (enrolled sidecars), less the
    revoked keys. Readers never lock: the view is one dict, replaced whole on every change, so
    the ZAP thread and the daemon's loop may read it at any time. ``version`` grows with every
    change."""

    def __init__(
        self, trusted_dir: str = "", *, reload_s: float = 2.0, full_scan_s: float = 30.0
    ) -> None:
        self.trusted_dir = trusted_dir
        self.reload_s = reload_s
        #: every file of the directory is looked at this often, or when the directory changed
        self.full_scan_s = full_scan_s
        self._dir_stamp: tuple | None = None
        self._next_full = 0.0
        self._lock = threading.Lock()
        self._static: dict[str, Identity] = {}
        self._dynamic: dict[str, Identity] = {}
        self._revoked: frozenset[str] = frozenset()
        self._view: dict[str, Identity] = {}
        self._by_name: dict[str, Identity] = {}
        self._dir_sig: tuple = ()
        self._next_check = 0.0
        self.version = 0
        #: ZAP handshakes refused since start (unknown or revoked keys)
        self.refused = 0
        if trusted_dir:
            self.refresh(force=True)

    # -- reads (any thread) --------------------------------------------------------------------
    def lookup(self, key: str) -> Identity | None:
        return self._view.get(key)

    def by_name(self, name: str) -> Identity | None:
        return self._by_name.get(name)

    def identities(self) -> list[Identity]:
        return sorted(self._view.values(), key=lambda i: i.key)

    @property
    def revoked(self) -> frozenset[str]:
        return self._revoked

    def is_static(self, key: str) -> bool:
        return key in self._static

    def callback(self, domain: str, key: bytes) -> bool:
        """The ZAP decision: the key is a current identity."""
        ok = key.decode("ascii", "replace") in self._view
        if not ok:
            self.refused += 1
        return ok

    # -- writes (the owning daemon's thread) ---------------------------------------------------
    def _rebuild(self) -> None:
        view = {k: i for k, i in self._static.items() if k not in self._revoked}
        for k, i in self._dynamic.items():
            if k not in self._revoked and k not in view:
                view[k] = i
        by_name: dict[str, Identity] = {}
        for i in sorted(view.values(), key=lambda i: (i.key not in self._static, i.key)):
            by_name.setdefault(i.name, i)  # a static identity keeps its name
        self._view, self._by_name = view, by_name
        self.version += 1

    def refresh(self, *, force: bool = False, now: float | None = None) -> bool:
        """Re-read the trusted directory if it changed (checked every ``reload_s``); returns
        whether the view changed. Removing a certificate file revokes its key.

        A certificate added, removed or renamed moves the directory's own stamp, seen within
        ``reload_s``; only then is every file looked at (and every ``full_scan_s``, for one
        rewritten in place): stat-ing 10,240 certificates every 2 s took 45 % of a loaded
        controller's CPU (``bench/controller_load.py``)."""
        if not self.trusted_dir:
            return False
        now = time.monotonic() if now is None else now
        if not force and now < self._next_check:
            return False
        self._next_check = now + self.reload_s
        stamp = _dir_stamp(self.trusted_dir)
        if not force and stamp is not None and stamp == self._dir_stamp and now < self._next_full:
            return False
        self._dir_stamp, self._next_full = stamp, now + self.full_scan_s
        sig = _dir_signature(self.trusted_dir)
        if not force and sig == self._dir_sig:
            return False
        try:
            static = load_trusted(self.trusted_dir)
        except ConfigError as exc:
            if force:
                raise
            log.warning("trusted keys not reloaded: %s", exc)
            return False
        with self._lock:
            self._dir_sig = sig
            if static == self._static:
                return False
            self._static = static
            self._rebuild()
        log.info("trusted keys: %d identities from %s", len(static), self.trusted_dir)
        return True

    def bind(self, ident: Identity) -> None:
        with self._lock:
            self._dynamic[ident.key] = ident
            self._rebuild()

    def unbind(self, key: str) -> Identity | None:
        with self._lock:
            gone = self._dynamic.pop(key, None)
            if gone is not None:
                self._rebuild()
            return gone

    def set_dynamic(self, idents: Iterable[Identity], revoked: Iterable[str] = ()) -> None:
        with self._lock:
            self._dynamic = {i.key: i for i in idents}
            self._revoked = frozenset(revoked)
            self._rebuild()

    def revoke(self, key: str) -> None:
        with self._lock:
            self._dynamic.pop(key, None)
            self._revoked = self._revoked | {key}
            self._rebuild()

    def dynamic(self) -> list[Identity]:
        return list(self._dynamic.values())


def _dir_stamp(d: str) -> tuple | None:
    """The directory's own identity and change times; None while they are too fresh to tell
    (a filesystem's clock ticks coarsely: a second change in the tick of the first, after this
    look, would leave the stamp as it is)."""
    try:
        st = os.stat(os.path.expandvars(d))
    except OSError:
        return None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < 2_000_000_000:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _dir_signature(d: str) -> tuple:
    try:
        entries = sorted(os.scandir(os.path.expandvars(d)), key=lambda e: e.name)
        return tuple(
            (e.name, e.stat().st_mtime_ns, e.stat().st_size)
            for e in entries
            if e.name.endswith(".key")
        )
    except OSError:
        return ()


def _identify(book: KeyBook, routing_id: bytes, user_id: str) -> Principal:
    ident = book.lookup(user_id) if user_id else None
    if ident is None:
        # the handshake admitted it, so the key was revoked since (or the link is not CURVE)
        raise Unauthorized("this key is not (or no longer) bound to an identity")
    return Principal(
        routing_id, user_id, ident.name, ident.role, ident.host, ident.container, ident.job
    )


def _need(who: Principal, roles: tuple[str, ...], what: str) -> None:
    if who.role not in roles:
        raise Unauthorized(f"{what} is not for a {who.role or 'unbound'} identity ({who.name})")


_OPERATORS = ("admin", "analyzer")
_AGENT_TYPES = {
    MsgType.REGISTER,
    MsgType.READY,
    MsgType.DEREGISTER,
    MsgType.HEARTBEAT,
    MsgType.COMMAND_REPLY,
    MsgType.ENROL,
}
_CONTROLLER_ROLES: dict[MsgType, tuple[str, ...]] = {
    MsgType.REGISTER: ("overlay", "underlay"),
    MsgType.READY: ("overlay", "underlay"),
    MsgType.DEREGISTER: ("overlay", "underlay"),
    MsgType.HEARTBEAT: ("overlay", "underlay"),
    MsgType.COMMAND_REPLY: ("overlay", "underlay"),
    MsgType.SYNC: ("overlay", *_OPERATORS),
    MsgType.SUBMIT_JOB: _OPERATORS,
    MsgType.REMOVE_JOB: _OPERATORS,
    MsgType.APPLY_SKELETON: _OPERATORS,
    MsgType.STATUS: _OPERATORS,
    MsgType.MEMBERS: _OPERATORS,
    MsgType.COMMAND: _OPERATORS,
    MsgType.KEYS: _OPERATORS,
    MsgType.ENROL: ("underlay",),
    MsgType.REVOKE: ("admin",),
}


class ControllerPolicy:
    """The controller's rules (module doc) over the identities of ``book``."""

    def __init__(self, book: KeyBook) -> None:
        self.book = book

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        return _identify(self.book, routing_id, user_id)

    def authorize(self, who: Principal, env: Envelope) -> None:
        t, b = env.type, env.body
        _need(who, _CONTROLLER_ROLES.get(t, ()), t.value)
        if t in _AGENT_TYPES and t is not MsgType.COMMAND_REPLY and b.get("agent") != who.name:
            raise Unauthorized(f"{who.name} may not speak as agent {b.get('agent')!r}")
        if t is MsgType.REGISTER:
            if b["role"] != who.role or b["host"] != who.host:
                raise Unauthorized(
                    f"{who.name} is a {who.role} agent on {who.host!r}, "
                    f"not {b['role']} on {b['host']!r}"
                )
            for d in b["endpoints"]:
                if who.role != "overlay":
                    raise Unauthorized("only a sidecar registers endpoints")
                if not isinstance(d, Mapping) or (d.get("job"), d.get("container")) != (
                    who.job,
                    who.container,
                ):
                    raise Unauthorized(
                        f"{who.name} may register only endpoints of {who.job}/{who.container}"
                    )
                if d.get("host", who.host) != who.host:
                    raise Unauthorized(f"{who.name} may register endpoints only on {who.host}")
        elif t is MsgType.SYNC and who.role == "overlay" and b["job"] != who.job:
            raise Unauthorized(f"{who.name} may read only job {who.job}")

    def subscribe(self, who: Principal, topic: bytes) -> bool:
        if who.role in _OPERATORS:
            return True
        if who.role == "overlay":
            return topic == job_topic(who.job)
        return False


class AnalyzerPolicy:
    """The analyzer's rules: results and heartbeats only for endpoints the sender owns (a
    sidecar: its container's; an underlay agent: those on its host), destinations only in the
    sender's job; replay and alerts for the operator and subscribers.

    What each key owns comes from the controller (:meth:`update`, fed by the analyzer's key
    mirror); until it came, a sender owns nothing and its batches are refused."""

    def __init__(self, book: KeyBook) -> None:
        self.book = book
        self._owned: dict[str, np.ndarray] = {}  # key -> sorted endpoint ids
        self._job_eps: dict[str, np.ndarray] = {}  # job -> sorted endpoint ids

    def update(self, owned: Mapping[str, Iterable[int]], job_eps: Mapping[str, Iterable[int]]):
        self._owned = {k: np.unique(np.fromiter(v, np.int64)) for k, v in owned.items()}
        self._job_eps = {j: np.unique(np.fromiter(v, np.int64)) for j, v in job_eps.items()}

    def owned(self, key: str) -> np.ndarray:
        return self._owned.get(key, np.zeros(0, np.int64))

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        return _identify(self.book, routing_id, user_id)

    def _column(self, env: Envelope, name: str) -> np.ndarray:
        col = env.body["cols"].get(name)
        n = env.body["n"]
        if not isinstance(col, bytes) or n < 0 or len(col) != 4 * n:
            raise Unauthorized(f"batch column {name!r} unreadable: nothing to authorize")
        return np.frombuffer(col, "<u4")

    def authorize(self, who: Principal, env: Envelope) -> None:
        t, b = env.type, env.body
        if t in (MsgType.REPLAY, MsgType.STATUS):
            _need(who, ("admin", "analyzer", "subscriber"), t.value)
            return
        if t is MsgType.PROBE_BATCH:
            _need(who, ("overlay",), t.value)
            own = self.owned(who.user_id)
            src = self._column(env, "src_ep")
            eps = b.get("eps", ())
            if not np.isin(src, own).all() or not all(
                isinstance(e, int) and not isinstance(e, bool) and e in own for e in eps
            ):
                raise Unauthorized(f"{who.name} reported for endpoints it does not own")
            job = self._job_eps.get(who.job, np.zeros(0, np.int64))
            if not np.isin(self._column(env, "dst_ep"), job).all():
                raise Unauthorized(f"{who.name} reported probes outside job {who.job}")
        elif t is MsgType.COUNTER_BATCH:
            _need(who, ("underlay",), t.value)
            if not np.isin(self._column(env, "ep"), self.owned(who.user_id)).all():
                raise Unauthorized(f"{who.name} sampled endpoints not on {who.host}")
        else:
            raise Unauthorized(f"{t.value} is not an analyzer request")
        if b.get("agent") != who.name:
            raise Unauthorized(f"{who.name} may not speak as agent {b.get('agent')!r}")

    def subscribe(self, who: Principal, topic: bytes) -> bool:
        return topic.startswith(ALERTS_TOPIC) and who.role in ("admin", "subscriber")


def guard_subscriptions(sock: zmq.Socket, policy: Policy, counters: Any) -> None:
    """Serve an XPUB socket in manual mode: apply each subscription the policy allows, refuse
    (and count) the rest. Unsubscriptions are always applied."""
    while True:
        try:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        msg = frame.bytes
        if not msg or msg[0] not in (0, 1):
            continue
        topic = msg[1:]
        if msg[0] == 0:
            sock.setsockopt(zmq.UNSUBSCRIBE, topic)
            continue
        try:
            who = policy.identify(b"", transport_user_id(frame))
            ok = policy.subscribe(who, topic)
        except Unauthorized:
            ok = False
        if ok:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
        else:
            counters["refused_subscriptions"] += 1
            log.info("refused a subscription to %r", topic[:64])
