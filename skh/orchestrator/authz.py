"""Who may ask a daemon for what: the one gate every request passes before its handler runs.

Every request the controller (ROUTER) and the analyzer (PULL, REP) receive becomes a
:class:`Principal` — its sender as the transport proves it: the ROUTER routing id and the ZAP
``User-Id`` of the connection (under CURVE the Z85 text of the client's public key, which the
peer proved it holds) — and the daemon's :class:`Policy` authorizes the decoded request for that
principal before the request's handler is called. A refusal is :class:`~skh.errors.Unauthorized`:
the controller and the analyzer's REP answer it with a failed ACK, a pushed batch is dropped;
either way nothing the request asked for happens, and the refusal is counted (``unauthorized``).

:class:`AllowAll` keeps today's rules: any client the CURVE authenticator admitted (any client at
all with ``insecure = true``) may make any request, and the handlers' own checks still hold (an
agent registers under its routing id; readiness, heartbeats, deregistration and command replies
count only from the routing id that registered). Binding each key to one identity (agent name,
role, host, and for overlay agents container and job) and checking each request against it is a
:class:`Policy` of its own (issue 14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import zmq

from skh.errors import Unauthorized
from skh.wire import Envelope

__all__ = ["Principal", "Policy", "AllowAll", "Unauthorized", "transport_user_id"]


@dataclass(frozen=True, slots=True)
class Principal:
    """The sender of one request.

    ``routing_id``: the ROUTER routing id (empty on PULL and REP sockets, which carry none);
    ``user_id``: the ZAP ``User-Id`` of the connection (empty on an insecure link). The other
    fields are the identity a policy bound to that key; empty while it binds none.
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


class Policy(Protocol):
    """How a daemon turns a sender into a :class:`Principal` and decides its requests.

    What a policy needs beyond the request (key bindings, which agent owns which endpoint) it is
    given when it is built, so these two signatures stay as they are."""

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        """The principal behind a connection; called before the request is decoded, so a
        policy may refuse (raise :class:`Unauthorized`) an unknown key without decoding."""
        ...

    def authorize(self, who: Principal, env: Envelope) -> None:
        """Return if ``who`` may make request ``env`` (its type and body); raise
        :class:`Unauthorized` saying why not."""
        ...


class AllowAll:
    """Today's policy: every admitted client may make every request (see the module's doc)."""

    def identify(self, routing_id: bytes, user_id: str) -> Principal:
        return Principal(routing_id, user_id)

    def authorize(self, who: Principal, env: Envelope) -> None:
        return None


def transport_user_id(frame: zmq.Frame) -> str:
    """The ZAP ``User-Id`` of the connection ``frame`` (received with ``copy=False``) came on:
    the client's Z85 public key under CURVE, ``""`` when the link has none (insecure)."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:  # EINVAL: no such property (NULL mechanism, no ZAP handler)
        return ""
