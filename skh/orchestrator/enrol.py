"""How a sidecar gets its identity without a shared secret (docs/trust.md).

The sidecar generates its own key pair at start (the secret never leaves its container), then
asks its host's underlay agent, over a Unix socket the host mounts into the container
(``agent.enrol_socket``), to vouch for the public key: ``{job, container, name, key}``. The
underlay agent does not take the claim on trust: the kernel tells it who connected
(``SO_PEERCRED``), and it accepts the claim only if that process is in the claimed container —
its network namespace is the container's (``netns``), or it runs as the container's host uid
(``uid``, user-namespaced containers) — as the agent's ``[[agent.containers]]`` list says. It
then sends ENROL to the controller with its own key; the controller checks that the container is
placed on that agent's host and binds the sidecar's key to that container (job, container, host,
agent name). Every later request of the sidecar is authorized by that binding; a new key for the
same container replaces the old one; DEREGISTER, job removal and ``skh keys revoke`` end it.

The exchange is one JSON line each way, at most :data:`MAX_LINE` bytes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from skh.errors import ConfigError, ProtocolError, Unauthorized
from skh.orchestrator.config import ContainerSpec

__all__ = ["ContainerSpec", "EnrolServer", "attest", "enrol", "MAX_LINE"]

log = logging.getLogger(__name__)

MAX_LINE = 4096
_FIELDS = ("job", "container", "name", "key")


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _netns_id(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _ns_path(netns: str) -> str:
    return netns if netns.startswith("/") else f"/run/netns/{netns}"


def attest(conn: socket.socket, containers: Iterable[ContainerSpec]) -> list[ContainerSpec]:
    """The containers the peer of ``conn`` is in, as the kernel says (SO_PEERCRED)."""
    pid, uid, _gid = _peer(conn)
    try:
        peer_ns = _netns_id(f"/proc/{pid}/ns/net")
    except OSError:
        peer_ns = None
    out = []
    for c in containers:
        if c.uid >= 0 and uid == c.uid:
            out.append(c)
        elif c.netns and peer_ns is not None:
            try:
                if _netns_id(_ns_path(c.netns)) == peer_ns:
                    out.append(c)
            except OSError:
                continue
    return out


def _read_line(conn: socket.socket, deadline: float) -> dict[str, Any]:
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("enrolment request timed out")
        conn.settimeout(left)
        chunk = conn.recv(MAX_LINE)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ProtocolError("enrolment request too long")
    try:
        req = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        raise ProtocolError("enrolment request is not JSON") from None
    if not isinstance(req, dict) or not all(isinstance(req.get(k), str) for k in _FIELDS):
        raise ProtocolError(f"enrolment request needs string fields {', '.join(_FIELDS)}")
    return {k: req[k] for k in _FIELDS}


class EnrolServer:
    """The underlay agent's side: accept, attest, then ``vouch(request)`` (which asks the
    controller and returns its answer ``{ok, name | error}``). One thread; one request at a
    time, each bounded by ``timeout_s``."""

    def __init__(
        self,
        path: str,
        containers: Iterable[ContainerSpec],
        vouch: Callable[[dict[str, str]], dict[str, Any]],
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self.path = path
        self.containers = tuple(containers)
        self.vouch = vouch
        self.timeout_s = timeout_s
        self.counters = {"enrol_requests": 0, "enrol_refused": 0, "enrol_vouched": 0}
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            if not stat.S_ISSOCK(p.stat().st_mode):
                raise ConfigError(f"agent.enrol_socket {path} exists and is not a socket")
            p.unlink()  # a socket left by a previous run
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        # anyone who can reach the path may ask: the kernel's word on the caller decides
        os.chmod(path, 0o666)
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="skh-enrol", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        self.counters["enrol_requests"] += 1
        try:
            req = _read_line(conn, time.monotonic() + self.timeout_s)
            places = attest(conn, self.containers)
            if not any((c.job, c.container) == (req["job"], req["container"]) for c in places):
                pid, uid, _ = _peer(conn)
                raise Unauthorized(
                    f"pid {pid} (uid {uid}) is not in container {req['job']}/{req['container']}"
                )
            answer = self.vouch(req)
            if answer.get("ok"):
                self.counters["enrol_vouched"] += 1
        except (ProtocolError, Unauthorized, OSError) as exc:
            self.counters["enrol_refused"] += 1
            log.warning("enrolment refused: %s", exc)
            answer = {"ok": False, "error": str(exc)[:500]}
        try:
            conn.sendall(json.dumps(answer).encode()[:MAX_LINE] + b"\n")
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def enrol(
    path: str, *, job: str, container: str, name: str, key: str, timeout_s: float = 10.0
) -> dict[str, Any]:
    """The sidecar's side: one enrolment request; returns the answer ``{ok, name | error}``.
    Raises OSError when the socket is not there (yet)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        s.sendall(
            json.dumps({"job": job, "container": container, "name": name, "key": key}).encode()
            + b"\n"
        )
        buf = b""
        while b"\n" not in buf and len(buf) <= MAX_LINE:
            chunk = s.recv(MAX_LINE)
            if not chunk:
                break
            buf += chunk
    try:
        answer = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        raise ProtocolError("enrolment answer is not JSON") from None
    if not isinstance(answer, dict):
        raise ProtocolError("enrolment answer is not a map")
    return answer
