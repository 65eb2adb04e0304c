"""Shared fixtures: a private ZeroMQ context, configs on ephemeral loopback ports, daemons run on
threads that always stop, and a small DEALER client speaking the wire protocol."""

import contextlib
import threading
import time

import pytest
import zmq

from skh.orchestrator.config import load_config
from skh.wire import Codec


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def cfg(tmp_path):
    return load_config(
        None,
        {
            "security.insecure": True,
            "controller.bind": "tcp://127.0.0.1:0",
            "controller.pub_bind": "tcp://127.0.0.1:0",
            "controller.db": str(tmp_path / "registry.db"),
            "controller.heartbeat_interval_s": 0.2,
            "controller.command_timeout_s": 0.3,
            "analyzer.bind": "tcp://127.0.0.1:0",
            "analyzer.alerts_bind": "tcp://127.0.0.1:0",
            "analyzer.replay_bind": "tcp://127.0.0.1:0",
            "analyzer.alert_log": str(tmp_path / "alerts.log"),
            "analyzer.round_s": 0.2,
            "analyzer.detector": "none",
            # agents connect nowhere unless a test says where (never to someone's real daemon)
            "agent.controller": "tcp://127.0.0.1:9",
            "agent.controller_pub": "tcp://127.0.0.1:9",
            "agent.analyzer": "tcp://127.0.0.1:9",
        },
    )


@contextlib.contextmanager
def running(daemon):
    """Run ``daemon.run(stop)`` on a thread; stop and join it whatever happens."""
    stop = threading.Event()
    t = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    t.start()
    try:
        yield daemon
    finally:
        stop.set()
        t.join(10)
        assert not t.is_alive(), "daemon did not stop"


@pytest.fixture
def run_daemon():
    return running


class Client:
    """A DEALER (or REQ) speaking the wire protocol, for requests and for playing an agent."""

    def __init__(self, ctx, addr, name="client", kind=zmq.DEALER, security=None):
        self.sock = ctx.socket(kind)
        self.sock.setsockopt(zmq.LINGER, 0)
        if kind == zmq.DEALER:
            self.sock.setsockopt(zmq.ROUTING_ID, name.encode())
        if security is not None:
            security.client(self.sock)
        self.sock.connect(addr)
        self.codec = Codec()
        self.name = name
        self.seq = 0

    def send(self, mtype, body):
        self.seq += 1
        self.sock.send(self.codec.encode(mtype, self.name, self.seq, body))
        return self.seq

    def recv(self, timeout_s=5.0, want=None):
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            env = self.codec.decode(self.sock.recv())
            if want is None or env.type in want:
                return env
        raise TimeoutError(f"{self.name}: no {want or 'message'} within {timeout_s}s")

    def request(self, mtype, body, timeout_s=5.0, want=None):
        self.send(mtype, body)
        return self.recv(timeout_s, want)


@pytest.fixture
def client(ctx):
    made = []

    def make(addr, name="client", kind=zmq.DEALER, security=None):
        c = Client(ctx, addr, name, kind, security)
        made.append(c)
        return c

    yield make
    for c in made:
        c.sock.close(0)


def wait_for(pred, timeout_s=10.0, interval_s=0.05, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v is not None and v is not False:
            return v
        time.sleep(interval_s)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture
def wait():
    return wait_for


#: the identities of a small two-host, two-tenant cluster: operator, analyzer, alert subscriber,
#: one underlay agent per host and one statically provisioned sidecar per tenant
IDENTITIES = {
    "admin": {"role": "admin"},
    "analyzer": {"role": "analyzer"},
    "alerts-bridge": {"role": "subscriber"},
    "ul-h0": {"role": "underlay", "host": "h0"},
    "ul-h1": {"role": "underlay", "host": "h1"},
    "tenant-a": {"role": "overlay", "host": "h0", "job": "ja", "container": "ca"},
    "tenant-b": {"role": "overlay", "host": "h1", "job": "jb", "container": "cb"},
}


@pytest.fixture
def keyring(tmp_path):
    """CURVE keys for :data:`IDENTITIES`: ``server`` is the daemons' SecurityConfig (the trusted
    public certificates, with each identity in their metadata, in ``trusted/``), and one client
    SecurityConfig per identity."""
    from skh.orchestrator.security import SecurityConfig, generate_keypair

    root = tmp_path / "keys"
    trusted, secret = root / "trusted", root / "secret"
    trusted.mkdir(parents=True)
    generate_keypair(root, "server")
    for name, meta in IDENTITIES.items():
        pub, _sec = generate_keypair(secret, name, metadata=meta)
        (trusted / f"{name}.key").write_bytes(pub.read_bytes())
    server = SecurityConfig(
        server_secret_key=str(root / "server.key_secret"),
        authorized_keys_dir=str(trusted),
    )
    clients = {
        name: SecurityConfig(
            server_public_key=str(root / "server.key"),
            client_secret_key=str(secret / f"{name}.key_secret"),
        )
        for name in IDENTITIES
    }
    return server, clients
