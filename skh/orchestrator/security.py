"""CURVE keys and the identities bound to them (docs/trust.md).

Every daemon, agent and operator tool holds its own key pair; no secret is shared. Keys are
ZeroMQ certificate files (``NAME.key`` public, ``NAME.key_secret`` secret). A public certificate
the operator trusts carries the identity in its ``metadata`` section::

    metadata
        role = "underlay"
        host = "gpu-017"
    curve
        public-key = "..."

(``role`` is one of :data:`ROLES`; ``underlay`` needs ``host``; ``overlay`` needs ``host``,
``job`` and ``container``; ``name`` defaults to the file's stem). The controller and the analyzer
read such certificates from ``authorized_keys_dir``; sidecars that generate their key at start
are bound by enrolment instead (:mod:`skh.orchestrator.enrol`).

Key files are written ``0600`` from creation (never created wider, then narrowed) and never
overwritten unless asked. Paths in ``[security]`` may name environment variables
(``${CREDENTIALS_DIRECTORY}/skh.key_secret``: systemd's ``LoadCredential=``). Plain text happens
only with the explicit ``insecure = true`` / ``--insecure`` switch.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.auth

from skh.errors import ConfigError

__all__ = [
    "underlay_identity",
    "ROLES",
    "Identity",
    "SecurityConfig",
    "ServerSecurity",
    "generate_keypair",
    "ensure_keypair",
    "read_certificate",
    "load_trusted",
    "public_key_of",
]

log = logging.getLogger(__name__)

#: who a key may be: the operator's tools, the analyzer (a client of the controller), read-only
#: alert subscribers, host agents and tenant sidecars
ROLES = ("admin", "analyzer", "subscriber", "underlay", "overlay")
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_META_LINE = re.compile(r'^\s+([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"\s*$')
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,255}$")


def underlay_identity(host: str) -> str:
    """The name a host's underlay agent speaks as: its identity's name (docs/trust.md), its
    default agent name, and what the analyzer's pipeline commands by default."""
    return f"ul-{host}"


def _path(p: str) -> str:
    return os.path.expandvars(os.path.expanduser(p))


@dataclass(frozen=True, slots=True)
class Identity:
    """What one public key is: the agent (or tool) name it speaks as, its role, and where it
    may act (``host``; a sidecar's ``job`` and ``container``)."""

    key: str  # Z85 public key
    name: str
    role: str
    host: str = ""
    container: str = ""
    job: str = ""

    def check(self) -> Identity:
        if not _Z85_KEY.match(self.key):
            raise ConfigError(f"identity {self.name!r}: {self.key!r} is not a Z85 CURVE key")
        if not _NAME.match(self.name):
            raise ConfigError(f"identity name {self.name!r} is not a valid agent name")
        if self.role not in ROLES:
            raise ConfigError(
                f"identity {self.name!r}: role must be one of {', '.join(ROLES)}. "
                f"Got {self.role!r} instead."
            )
        need = {"underlay": ("host",), "overlay": ("host", "job", "container")}.get(self.role, ())
        for f in need:
            if not getattr(self, f):
                raise ConfigError(f"identity {self.name!r} ({self.role}) needs '{f}'")
        return self


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    insecure: bool = False
    #: server side (controller, analyzer): its secret certificate
    server_secret_key: str = ""
    #: client side: the controller's public certificate and this client's own secret certificate
    server_public_key: str = ""
    client_secret_key: str = ""
    #: agents: the analyzer's public certificate ("" = the controller's, one shared server key)
    analyzer_public_key: str = ""
    #: server side: directory of trusted public certificates, each naming its identity
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
        if server:
            if not self.authorized_keys_dir:
                raise ConfigError(
                    "security.authorized_keys_dir is not set: a server needs the trusted "
                    "identities' public certificates (docs/trust.md)"
                )
            if not Path(_path(self.authorized_keys_dir)).is_dir():
                raise ConfigError(
                    f"security.authorized_keys_dir {self.authorized_keys_dir!r} is not a directory"
                )

    def client(self, sock: zmq.Socket, *, analyzer: bool = False) -> None:
        """Make ``sock`` a CURVE client of the controller (of the analyzer with ``analyzer``);
        no-op when insecure."""
        if self.insecure:
            return
        server = self.analyzer_public_key if analyzer and self.analyzer_public_key else None
        server_public, _ = _load(server or self.server_public_key)
        public, secret = _load(self.client_secret_key)
        if secret is None:
            raise ConfigError(f"{self.client_secret_key} holds no secret key")
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public


class KeyProvider(Protocol):
    """Decides the ZAP handshake: is this Z85 public key a current identity?"""

    def callback(self, domain: str, key: bytes) -> bool: ...


class _SharedAuth:
    """One ZAP handler per context (libzmq binds it at one inproc address); each server socket
    names its domain and each domain its own key provider."""

    def __init__(self, ctx: zmq.Context) -> None:
        # only servers authenticate: a client (an agent) does not load it and the asyncio it
        # pulls in (~6 MB of the agent's resident memory)
        from zmq.auth.thread import ThreadAuthenticator

        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.users = 0


_AUTHS: weakref.WeakKeyDictionary[zmq.Context, _SharedAuth] = weakref.WeakKeyDictionary()
_AUTHS_LOCK = threading.Lock()


class ServerSecurity:
    """Server side: CURVE on every bound socket, each handshake decided by ``provider`` (which
    keys are current identities) under this daemon's ZAP ``domain``."""

    def __init__(
        self,
        cfg: SecurityConfig,
        ctx: zmq.Context,
        *,
        domain: str = "skh",
        provider: KeyProvider | None = None,
    ) -> None:
        self.cfg = cfg
        self.domain = domain
        self._ctx = ctx
        self._shared: _SharedAuth | None = None
        if cfg.insecure:
            log.warning(
                "CURVE is off (--insecure): agent links are neither authenticated nor encrypted"
            )
            return
        self._public, secret = _load(cfg.server_secret_key)
        if secret is None:
            raise ConfigError(f"{cfg.server_secret_key} holds no secret key")
        self._secret = secret
        if provider is None:
            raise ConfigError("a CURVE server needs a key provider (the trusted identities)")
        with _AUTHS_LOCK:
            shared = _AUTHS.get(ctx)
            if shared is None:
                shared = _AUTHS[ctx] = _SharedAuth(ctx)
            shared.users += 1
            shared.auth.configure_curve_callback(domain=domain, credentials_provider=provider)
        self._shared = shared

    def apply(self, sock: zmq.Socket) -> None:
        if self._shared is None:
            return
        sock.zap_domain = self.domain.encode()
        sock.curve_server = True
        sock.curve_secretkey = self._secret
        sock.curve_publickey = self._public

    @property
    def public_key(self) -> str:
        return "" if self._shared is None else self._public.decode()

    def close(self) -> None:
        if self._shared is None:
            return
        with _AUTHS_LOCK:
            self._shared.users -= 1
            if self._shared.users == 0:
                self._shared.auth.stop()
                _AUTHS.pop(self._ctx, None)
        self._shared = None


def _load(path: str) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(_path(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CURVE certificate {path!r}: {exc}") from exc


def public_key_of(path: str) -> str:
    """The Z85 public key of a certificate file (public or secret)."""
    return _load(path)[0].decode()


def read_certificate(path: str | Path) -> tuple[str, dict[str, str]]:
    """A certificate's Z85 public key and its metadata."""
    public, _secret = _load(str(path))
    meta: dict[str, str] = {}
    section = ""
    try:
        lines = Path(_path(str(path))).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read CURVE certificate {path!r}: {exc}") from exc
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            section = line.strip()
            continue
        m = _META_LINE.match(line)
        if section == "metadata" and m:
            meta[m.group(1)] = m.group(2)
    return public.decode(), meta


def load_trusted(directory: str | Path) -> dict[str, Identity]:
    """Every ``*.key`` certificate of ``directory`` as an identity, by public key. A certificate
    without a valid identity is skipped with a warning (it admits nobody)."""
    out: dict[str, Identity] = {}
    d = Path(_path(str(directory)))
    if not d.is_dir():
        raise ConfigError(f"trusted key directory {str(directory)!r} is not a directory")
    for p in sorted(d.glob("*.key")):
        try:
            key, meta = read_certificate(p)
            ident = Identity(
                key=key,
                name=meta.get("name", p.stem),
                role=meta.get("role", ""),
                host=meta.get("host", ""),
                container=meta.get("container", ""),
                job=meta.get("job", ""),
            ).check()
        except ConfigError as exc:
            log.warning("trusted key %s skipped: %s", p, exc)
            continue
        if key in out:
            log.warning("trusted key %s skipped: its key is already %s", p, out[key].name)
            continue
        out[key] = ident
    return out


def _cert_text(kind: str, public: bytes, secret: bytes | None, meta: Mapping[str, Any]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    lines = [
        f"#   ****  Generated on {now} by skh  ****",
        f"#   ZeroMQ CURVE {kind} Certificate",
    ]
    if secret is not None:
        lines.append("#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.")
    lines += ["", "metadata"]
    for k, v in meta.items():
        if not re.match(r"^[A-Za-z0-9_-]+$", str(k)) or '"' in str(v) or "\n" in str(v):
            raise ConfigError(f"certificate metadata {k!r} = {v!r} cannot be written")
        lines.append(f'    {k} = "{v}"')
    lines += ["curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int, overwrite: bool, durable: bool = True) -> None:
    """Write ``path`` with ``mode`` from its creation: a temporary file opened with that mode,
    renamed into place (never world-readable, not even for an instant); synced to disk first
    when ``durable``."""
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists: refusing to overwrite a key (pass --force)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        os.write(fd, text.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if someone created it meanwhile: still no overwrite
    except FileExistsError:
        raise ConfigError(f"{path} exists: refusing to overwrite a key") from None
    finally:
        os.unlink(tmp)


def generate_keypair(
    directory: str | Path,
    name: str,
    *,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    durable: bool = True,
) -> tuple[Path, Path]:
    """Write ``NAME.key`` (0644) and ``NAME.key_secret`` (0600 from creation) into
    ``directory`` (made 0700 if absent), ``metadata`` in both; returns both paths. Refuses to
    replace existing files unless ``overwrite``. ``durable=False`` skips the fsync (keys that
    live and die with a temporary directory: tests, benches)."""
    if not _NAME.match(name) or "/" in name:
        raise ConfigError(f"key name {name!r} must be a plain file name")
    d = Path(_path(str(directory)))
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    meta = dict(metadata or {})
    pub_path, sec_path = d / f"{name}.key", d / f"{name}.key_secret"
    for p in (pub_path, sec_path):
        if p.exists() and not overwrite:
            raise ConfigError(f"{p} exists: refusing to overwrite a key (pass --force)")
    _write_new(sec_path, _cert_text("**Secret**", public, secret, meta), 0o600, overwrite, durable)
    _write_new(pub_path, _cert_text("Public", public, None, meta), 0o644, overwrite, durable)
    return pub_path, sec_path


def ensure_keypair(secret_path: str | Path) -> str:
    """A sidecar's own key: the secret certificate at ``secret_path`` (generated there, 0600,
    when absent, its public half beside it). Returns the Z85 public key."""
    p = Path(_path(str(secret_path)))
    if not p.exists():
        if not p.name.endswith(".key_secret"):
            raise ConfigError(f"{secret_path}: a secret certificate's name ends in .key_secret")
        generate_keypair(p.parent, p.name[: -len(".key_secret")])
        log.info("generated this agent's key pair at %s", p)
    return public_key_of(str(p))
