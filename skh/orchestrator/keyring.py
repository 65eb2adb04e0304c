"""A directory of keys for a whole deployment or test bed, in the layout of docs/trust.md, and the
``[security]`` settings each daemon reads from it.

::

    ROOT/controller.key{,_secret}   the controller's key pair (it serves with it)
    ROOT/analyzer.key{,_secret}     the analyzer's: it serves with it and is identity "analyzer"
    ROOT/trusted/NAME.key           public certificates with their identity (the trust root the
                                    controller and the analyzer read)
    ROOT/clients/NAME.key_secret    each client's own secret (admin, ul-HOST, subscribers,
                                    provisioned sidecars; on its own machine in a deployment)
    ROOT/sidecars/JOB/CONTAINER.key_secret
                                    where an enrolling sidecar makes its key at start

``make_keyring`` refuses to overwrite keys: making it again over the same root adds what is
missing and keeps every key there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from skh.orchestrator.security import SecurityConfig, generate_keypair, underlay_identity

__all__ = ["Keyring", "make_keyring", "security_args"]


@dataclass(frozen=True, slots=True)
class Keyring:
    root: Path

    @property
    def trusted(self) -> Path:
        return self.root / "trusted"

    def _client(self, secret: Path, server: str = "controller.key") -> SecurityConfig:
        return SecurityConfig(
            server_public_key=str(self.root / server),
            analyzer_public_key=str(self.root / "analyzer.key"),
            client_secret_key=str(secret),
        )

    def controller(self) -> SecurityConfig:
        return SecurityConfig(
            server_secret_key=str(self.root / "controller.key_secret"),
            authorized_keys_dir=str(self.trusted),
        )

    def analyzer(self) -> SecurityConfig:
        return SecurityConfig(
            server_secret_key=str(self.root / "analyzer.key_secret"),
            server_public_key=str(self.root / "controller.key"),
            client_secret_key=str(self.root / "analyzer.key_secret"),
            authorized_keys_dir=str(self.trusted),
        )

    def client(self, name: str) -> SecurityConfig:
        """An operator tool, an underlay agent (``ul-HOST``) or a provisioned sidecar."""
        return self._client(self.root / "clients" / f"{name}.key_secret")

    def underlay(self, host: str) -> SecurityConfig:
        return self.client(underlay_identity(host))

    def admin(self, name: str = "admin") -> SecurityConfig:
        return self.client(name)

    def subscriber(self, name: str = "alerts") -> SecurityConfig:
        """An alert subscriber talks to the analyzer alone."""
        return self._client(self.root / "clients" / f"{name}.key_secret", "analyzer.key")

    def sidecar(self, job: str, container: str) -> SecurityConfig:
        """An enrolling sidecar: its key is made at this path when it starts."""
        return self._client(self.root / "sidecars" / job / f"{container}.key_secret")


def _ensure(directory: Path, name: str, meta: Mapping[str, Any], trusted: Path | None) -> None:
    if not (directory / f"{name}.key_secret").exists():
        generate_keypair(directory, name, metadata=meta)
    if trusted is not None and not (trusted / f"{name}.key").exists():
        (trusted / f"{name}.key").write_bytes((directory / f"{name}.key").read_bytes())


def make_keyring(
    root: str | Path,
    *,
    hosts: Iterable[str] = (),
    sidecars: Iterable[tuple[str, str, str, str]] = (),
    admins: Iterable[str] = ("admin",),
    subscribers: Iterable[str] = ("alerts",),
) -> Keyring:
    """Keys for a controller, an analyzer, one underlay agent per host, the operator and alert
    subscribers; ``sidecars`` (agent name, job, container, host) are provisioned statically
    (the others enrol)."""
    ring = Keyring(Path(root))
    ring.trusted.mkdir(parents=True, exist_ok=True)
    clients = ring.root / "clients"
    _ensure(ring.root, "controller", {}, None)
    _ensure(ring.root, "analyzer", {"role": "analyzer"}, ring.trusted)
    for name in admins:
        _ensure(clients, name, {"role": "admin"}, ring.trusted)
    for name in subscribers:
        _ensure(clients, name, {"role": "subscriber"}, ring.trusted)
    for host in hosts:
        _ensure(clients, underlay_identity(host), {"role": "underlay", "host": host}, ring.trusted)
    for name, job, container, host in sidecars:
        meta = {"role": "overlay", "host": host, "job": job, "container": container}
        _ensure(clients, name, meta, ring.trusted)
    (ring.root / "sidecars").mkdir(mode=0o700, exist_ok=True)
    return ring


def security_args(sec: SecurityConfig) -> list[str]:
    """``--set security.KEY=VALUE`` arguments for a daemon's command line."""
    out = []
    for f in fields(sec):
        v = getattr(sec, f.name)
        if v not in ("", False):
            out += ["--set", f"security.{f.name}={'true' if v is True else v}"]
    return out
