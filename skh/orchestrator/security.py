"""CURVE authentication and encryption for every agent link.

The overlay agent runs inside a tenant's network namespace, so the controller and the analyzer
only accept agents holding a client key listed in ``authorized_keys_dir``, and agents only talk to
a server whose public key they were given. Keys are ZeroMQ certificate files (``NAME.key`` public,
``NAME.key_secret`` secret; ``skh config keygen`` writes them). Plain text happens only with the
explicit ``insecure = true`` / ``--insecure`` switch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from skh.errors import ConfigError

__all__ = ["SecurityConfig", "ServerSecurity", "generate_keypair"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    insecure: bool = False
    #: server side (controller, analyzer): its secret certificate
    server_secret_key: str = ""
    #: client side (agents, CLI): the server's public certificate and its own secret certificate
    server_public_key: str = ""
    client_secret_key: str = ""
    #: server side: directory of authorized client public certificates (empty: any client with
    #: CURVE keys is accepted — encryption without client authorization)
    authorized_keys_dir: str = ""

    def check(self, *, server: bool, client: bool) -> None:
        """Raise ConfigError unless the keys a role needs are configured and readable."""
        if self.insecure:
            return
        needed = []
        if server:
            needed.append(("server_secret_key", self.server_secret_key))
        if client:
            needed += [
                ("server_public_key", self.server_public_key),
                ("client_secret_key", self.client_secret_key),
            ]
        for name, path in needed:
            if not path:
                raise ConfigError(
                    f"security.{name} is not set: configure CURVE keys (skh config keygen) "
                    "or pass --insecure explicitly"
                )
            _load(path)
        if server and self.authorized_keys_dir and not Path(self.authorized_keys_dir).is_dir():
            raise ConfigError(
                f"security.authorized_keys_dir {self.authorized_keys_dir!r} is not a directory"
            )

    def client(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client (no-op when insecure)."""
        if self.insecure:
            return
        server_public, _ = _load(self.server_public_key)
        public, secret = _load(self.client_secret_key)
        if secret is None:
            raise ConfigError(f"{self.client_secret_key} holds no secret key")
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public


class ServerSecurity:
    """Server side: one ZAP authenticator per context, and CURVE on every bound socket."""

    def __init__(self, cfg: SecurityConfig, ctx: zmq.Context) -> None:
        self.cfg = cfg
        self._auth: ThreadAuthenticator | None = None
        if cfg.insecure:
            log.warning(
                "CURVE is off (--insecure): agent links are neither authenticated nor encrypted"
            )
            return
        self._public, secret = _load(cfg.server_secret_key)
        if secret is None:
            raise ConfigError(f"{cfg.server_secret_key} holds no secret key")
        self._secret = secret
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        if cfg.authorized_keys_dir:
            self._auth.configure_curve(domain="*", location=cfg.authorized_keys_dir)
        else:
            self._auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)

    def apply(self, sock: zmq.Socket) -> None:
        if self._auth is None:
            return
        sock.curve_server = True
        sock.curve_secretkey = self._secret
        sock.curve_publickey = self._public

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def _load(path: str) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CURVE certificate {path!r}: {exc}") from exc


def generate_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` into ``directory``; returns both paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(d), name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)
