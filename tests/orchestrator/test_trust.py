"""Identities (docs/trust.md): keys written 0600 from creation and never overwritten silently;
a sidecar's key made at start and bound to its container through its host's underlay agent, which
the kernel tells who is asking (uid, network namespace); revocation; requests that are all or
nothing; read-only alert subscribers."""

import ctypes
import dataclasses
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import zmq

from skh.errors import ConfigError
from skh.orchestrator.agent_underlay import UnderlayAgent
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.config import ContainerSpec
from skh.orchestrator.controller import Controller
from skh.orchestrator.enrol import enrol
from skh.orchestrator.keyring import make_keyring
from skh.orchestrator.security import (
    SecurityConfig,
    ensure_keypair,
    generate_keypair,
    load_trusted,
    read_certificate,
)
from skh.wire import ALERTS_TOPIC, MsgType, job_topic

ROOT = Path(__file__).resolve().parents[2]
ROOTED = os.geteuid() == 0


def test_keys_are_private_from_creation_and_never_overwritten_silently(tmp_path):
    old = os.umask(0)  # whatever the umask, the secret is 0600
    try:
        pub, sec = generate_keypair(
            tmp_path / "k", "ul-h0", metadata={"role": "underlay", "host": "h0"}
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pub).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o700
    key, meta = read_certificate(pub)
    assert meta == {"role": "underlay", "host": "h0"} and read_certificate(sec)[0] == key
    before = sec.read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keypair(tmp_path / "k", "ul-h0")
    assert sec.read_bytes() == before
    generate_keypair(tmp_path / "k", "ul-h0", overwrite=True)
    assert sec.read_bytes() != before and stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    # the CLI: the identity goes into the files; a wrong identity is refused before writing
    run = [sys.executable, "-m", "skh", "config", "keygen", str(tmp_path / "c")]
    out = subprocess.run(
        [*run, "side", "--role", "overlay", "--host", "h0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "needs 'job'" in out.stderr
    out = subprocess.run(
        [*run, "ul-h1", "--role", "underlay", "--host", "h1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["identity"] == {"role": "underlay", "host": "h1"}
    again = subprocess.run(
        [*run, "ul-h1", "--role", "underlay", "--host", "h1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr
    (ident,) = load_trusted(tmp_path / "c").values()
    assert (ident.name, ident.role, ident.host) == ("ul-h1", "underlay", "h1")
    # a sidecar's own key: made where configured when absent, kept when present
    side = tmp_path / "run" / "sidecar.key_secret"
    k1 = ensure_keypair(side)
    assert ensure_keypair(side) == k1 and stat.S_IMODE(os.stat(side).st_mode) == 0o600


@pytest.fixture
def ring(tmp_path):
    return make_keyring(
        tmp_path / "keys", hosts=["h0", "h1"], sidecars=[("tenant-a", "ja", "ca", "h0")]
    )


@pytest.fixture
def open_dir():
    """A directory other uids can reach (pytest's tmp_path is root's alone): where a host
    puts its enrolment socket (/run/skh in a deployment)."""
    d = Path(tempfile.mkdtemp(prefix="skh-enrol-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def trusted_cluster(cfg, ctx, client, run_daemon, ring):
    """A controller with job ja (container ca on h0) and both hosts' underlay agents keys."""
    ccfg = dataclasses.replace(cfg.controller, heartbeat_interval_s=60)
    ctl = Controller(ccfg, ring.controller(), ctx=ctx)
    router, pub = ctl.bind()
    n = itertools.count()

    def connect(sec):
        return client(router, f"c{next(n)}", security=sec)

    with run_daemon(ctl):
        admin = connect(ring.admin())
        env = admin.request(
            MsgType.SUBMIT_JOB,
            {"job": "ja", "containers": [{"name": "ca", "host": "h0", "rails": [0, 1]}]},
            want={MsgType.ACK},
        )
        assert env.body["ok"]
        yield ctl, connect, admin


def _in_child(fn):
    """Run ``fn()`` in a forked child (no threads, no zmq there); its JSON result back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"ok": False, "error": f"child: {type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _as_uid(uid, fn):
    def child():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        return fn()

    return _in_child(child)


def _in_netns(name, fn):
    def child():
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
        return fn()

    return _in_child(child)


def _underlay(cfg, ctx, ring, ctl, host, sock, containers):
    acfg = dataclasses.replace(
        cfg.agent,
        role="underlay",
        name=f"ul-{host}",
        host=host,
        controller=ctl.endpoint,
        enrol_socket=str(sock),
        containers=tuple(containers),
    )
    return UnderlayAgent(acfg, ring.underlay(host), ctx=ctx)


@pytest.mark.skipif(not ROOTED, reason="attestation by uid needs root to play the container")
def test_a_sidecar_enrols_through_its_hosts_agent_and_only_as_its_own_container(
    cfg, ctx, run_daemon, ring, trusted_cluster, tmp_path, open_dir
):
    ctl, connect, admin = trusted_cluster
    sock = open_dir / "enrol.sock"
    ul = _underlay(
        cfg,
        ctx,
        ring,
        ctl,
        "h0",
        sock,
        [ContainerSpec("ja", "ca", uid=4242), ContainerSpec("ja", "cz", uid=4243)],
    )
    key_path = tmp_path / "sidecar" / "ca.key_secret"
    key = ensure_keypair(key_path)
    ask = dict(job="ja", container="ca", name="overlay-h0-ca", key=key)
    with run_daemon(ul):
        # another container of this host (uid 4243) cannot claim ca; nor can an unknown uid
        assert not _as_uid(4243, lambda: enrol(str(sock), **ask))["ok"]
        assert not _as_uid(5000, lambda: enrol(str(sock), **ask))["ok"]
        assert ctl.keys.lookup(key) is None
        got = _as_uid(4242, lambda: enrol(str(sock), **ask))
        assert got == {"ok": True, "name": "overlay-h0-ca"}, got
    ident = ctl.keys.lookup(key)
    assert (ident.role, ident.host, ident.job, ident.container) == ("overlay", "h0", "ja", "ca")
    # the bound key registers its container's endpoints, and nothing else
    side = connect(dataclasses.replace(ring.sidecar("ja", "ca"), client_secret_key=str(key_path)))
    ack = side.request(
        MsgType.REGISTER,
        {
            "agent": "overlay-h0-ca",
            "role": "overlay",
            "host": "h0",
            "endpoints": [{"job": "ja", "container": "ca", "rail": 0, "ip": "10.0.0.9"}],
        },
        want={MsgType.REGISTER_ACK},
    )
    assert ack.body["endpoints"] == [0]
    # the other host's agent cannot vouch for a container placed on h0
    ul1 = connect(ring.underlay("h1"))
    other = ensure_keypair(tmp_path / "x" / "x.key_secret")
    env = ul1.request(
        MsgType.ENROL,
        {"agent": "ul-h1", "job": "ja", "container": "ca", "name": "evil", "key": other},
        want={MsgType.ACK},
    )
    assert not env.body["ok"] and "runs on ['h0']" in env.body["error"]
    # nor does a sidecar's key vouch for anything
    env = side.request(
        MsgType.ENROL,
        {"agent": "overlay-h0-ca", "job": "ja", "container": "cb", "name": "e", "key": other},
        want={MsgType.ACK},
    )
    assert not env.body["ok"] and ctl.keys.lookup(other) is None


NETNS = f"{os.environ.get('SKH_TESTBED_PREFIX', 'skh')}-enrol"


@pytest.mark.skipif(not ROOTED or not shutil.which("ip"), reason="needs root and iproute2")
def test_netns_attestation_knows_the_container_by_its_network_namespace(
    cfg, ctx, run_daemon, ring, trusted_cluster, tmp_path
):
    ctl, _connect, _admin = trusted_cluster
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        sock = tmp_path / "enrol.sock"
        ul = _underlay(cfg, ctx, ring, ctl, "h0", sock, [ContainerSpec("ja", "ca", netns=NETNS)])
        key = ensure_keypair(tmp_path / "s" / "ca.key_secret")
        ask = dict(job="ja", container="ca", name="overlay-h0-ca", key=key)
        with run_daemon(ul):
            # from the host's namespace: not the container
            assert not enrol(str(sock), **ask)["ok"]
            assert _in_netns(NETNS, lambda: enrol(str(sock), **ask))["ok"]
        assert ctl.keys.lookup(key).container == "ca"
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=False)


def _bind_sidecar(ctl, connect, ring, tmp_path, name="overlay-h0-ca"):
    """Bind a fresh sidecar key for ja/ca as ul-h0 vouches for it; returns its config."""
    key_path = tmp_path / "side" / f"{name}.key_secret"
    key = ensure_keypair(key_path)
    env = connect(ring.underlay("h0")).request(
        MsgType.ENROL,
        {"agent": "ul-h0", "job": "ja", "container": "ca", "name": name, "key": key},
        want={MsgType.ACK},
    )
    assert env.body["ok"], env.body
    return dataclasses.replace(ring.sidecar("ja", "ca"), client_secret_key=str(key_path)), key


def test_a_revoked_key_is_refused_at_once_and_loses_its_subscriptions(
    trusted_cluster, ring, ctx, tmp_path, wait
):
    ctl, connect, admin = trusted_cluster
    sec, key = _bind_sidecar(ctl, connect, ring, tmp_path)
    side = connect(sec)
    ack = side.request(
        MsgType.REGISTER,
        {
            "agent": "overlay-h0-ca",
            "role": "overlay",
            "host": "h0",
            "endpoints": [{"job": "ja", "container": "ca", "rail": 0, "ip": "10.0.0.9"}],
        },
        want={MsgType.REGISTER_ACK},
    )
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sec.client(sub)
    sub.setsockopt(zmq.SUBSCRIBE, job_topic("ja"))
    sub.connect(ctl.pub_endpoint)
    time.sleep(0.5)
    side.request(
        MsgType.READY,
        {"agent": "overlay-h0-ca", "endpoints": ack.body["endpoints"]},
        want={MsgType.ACK},
    )
    assert sub.poll(3000)  # it hears its own job
    while sub.poll(200):
        sub.recv_multipart()
    env = admin.request(MsgType.REVOKE, {"name": "overlay-h0-ca"}, want={MsgType.ACK})
    assert env.body["ok"]
    assert ctl.keys.lookup(key) is None and not ctl.agents["overlay-h0-ca"].alive
    # its live connection is refused request by request (no answer at all)
    with pytest.raises(TimeoutError):
        side.request(
            MsgType.HEARTBEAT,
            {"agent": "overlay-h0-ca", "epoch": ctl.epoch, "jobs": {}},
            timeout_s=1.0,
        )
    assert ctl.counters["unauthorized"] >= 1
    # and its subscription ends with the PUB socket bound afresh: it hears nothing more
    wait(lambda: ctl.counters["pub_rebinds"] >= 1, what="the PUB socket bound afresh")
    time.sleep(0.5)
    admin.request(
        MsgType.APPLY_SKELETON,
        {"job": "ja", "skeleton_version": 1, "pairs": b""},
        want={MsgType.ACK},
    )
    assert not sub.poll(1500)
    sub.close(0)
    # a revoked static key, too, survives no restart of the controller
    env = admin.request(MsgType.REVOKE, {"name": "ul-h1"}, want={MsgType.ACK})
    assert env.body["ok"]


def test_removing_a_trusted_certificate_revokes_its_key(trusted_cluster, ring, wait):
    ctl, connect, _admin = trusted_cluster
    ul1 = connect(ring.underlay("h1"))
    hb = {"agent": "ul-h1", "role": "underlay", "host": "h1", "endpoints": []}
    assert ul1.request(MsgType.REGISTER, hb, want={MsgType.REGISTER_ACK})
    (ring.trusted / "ul-h1.key").unlink()
    wait(lambda: ctl.keys.by_name("ul-h1") is None, timeout_s=10, what="the reload")
    with pytest.raises(TimeoutError):
        ul1.request(MsgType.REGISTER, hb, timeout_s=1.0)


def test_a_sidecars_binding_ends_with_its_container_or_its_job(trusted_cluster, ring, tmp_path):
    ctl, connect, admin = trusted_cluster
    sec, key = _bind_sidecar(ctl, connect, ring, tmp_path)
    side = connect(sec)
    side.request(
        MsgType.REGISTER,
        {"agent": "overlay-h0-ca", "role": "overlay", "host": "h0", "endpoints": []},
        want={MsgType.REGISTER_ACK},
    )
    assert side.request(MsgType.DEREGISTER, {"agent": "overlay-h0-ca"}, want={MsgType.ACK}).body[
        "ok"
    ]
    assert ctl.keys.lookup(key) is None
    _sec, key2 = _bind_sidecar(ctl, connect, ring, tmp_path, name="overlay-h0-ca2")
    assert admin.request(MsgType.REMOVE_JOB, {"job": "ja"}, want={MsgType.ACK}).body["ok"]
    assert ctl.keys.lookup(key2) is None


def test_a_request_that_fails_half_way_changes_nothing(cfg, ctx, client, run_daemon, monkeypatch):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        a = client(router, "a")
        a.request(
            MsgType.REGISTER,
            {
                "agent": "a",
                "role": "overlay",
                "host": "h0",
                "endpoints": [{"job": "j", "container": "c", "rail": 0, "ip": "10.0.0.1"}],
            },
            want={MsgType.REGISTER_ACK},
        )
        before = (ctl.registry.counts(), {j: dict(v.endpoints) for j, v in ctl.jobs.items()})

        def broken(_rec):  # the last write of a registration fails
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(ctl.registry, "put_agent", broken)
        env = a.request(
            MsgType.REGISTER,
            {
                "agent": "a",
                "role": "overlay",
                "host": "h0",
                "endpoints": [
                    {"job": "j", "container": "c", "rail": 0, "ip": "10.0.0.7"},
                    {"job": "j2", "container": "c", "rail": 0, "ip": "10.0.0.8"},
                ],
            },
            want={MsgType.ACK},
        )
        assert not env.body["ok"] and "disk on fire" in env.body["error"]
        monkeypatch.undo()
        after = (ctl.registry.counts(), {j: dict(v.endpoints) for j, v in ctl.jobs.items()})
        assert after == before and ctl.counters["rollbacks"] == 1
        # and the daemon goes on
        assert a.request(MsgType.STATUS, {}, want={MsgType.ACK}).body["ok"]


def test_alert_subscribers_are_read_only_and_tenants_hear_no_alerts(
    cfg, ctx, client, run_daemon, ring, trusted_cluster, tmp_path
):
    ctl, connect, _admin = trusted_cluster
    # a subscriber's key asks the controller for anything: refused
    for mtype, body in (
        (MsgType.STATUS, {}),
        (MsgType.SUBMIT_JOB, {"job": "x", "containers": []}),
        (MsgType.COMMAND, {"cmd_id": "1", "agent": "ul-h0", "name": "stats", "args": {}}),
    ):
        sub_ctl = connect(
            dataclasses.replace(
                ring.subscriber(), server_public_key=str(ring.root / "controller.key")
            )
        )
        env = sub_ctl.request(mtype, body, timeout_s=3)
        assert not env.body["ok"], env.body
    an = Analyzer(
        dataclasses.replace(cfg.analyzer, controller=ctl.endpoint), ring.analyzer(), ctx=ctx
    )
    _pull, alerts, _rep = an.bind()
    socks = {}
    tenant = dataclasses.replace(
        ring.client("tenant-a"), server_public_key=str(ring.root / "analyzer.key")
    )
    for who, sec in (("bridge", ring.subscriber()), ("tenant", tenant)):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        sec.client(s)
        s.setsockopt(zmq.SUBSCRIBE, ALERTS_TOPIC)
        s.connect(alerts)
        socks[who] = s
    with run_daemon(an):
        time.sleep(1.0)
        an.publish({"kind": "fault", "state": "open", "alert_id": "x", "job": "jb"})
        assert socks["bridge"].poll(3000)
        assert not socks["tenant"].poll(1000)
    assert an.counters["refused_subscriptions"] >= 1
    for s in socks.values():
        s.close(0)


def test_security_paths_name_credentials_directories(tmp_path, monkeypatch):
    """systemd's LoadCredential= puts a unit's keys under $CREDENTIALS_DIRECTORY."""
    generate_keypair(tmp_path, "controller")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    sec = SecurityConfig(
        server_public_key="${CREDENTIALS_DIRECTORY}/controller.key",
        client_secret_key="${CREDENTIALS_DIRECTORY}/controller.key_secret",
    )
    sec.check(server=False, client=True)
    s = zmq.Context.instance().socket(zmq.DEALER)
    sec.client(s)
    s.close(0)


def test_keyring_writes_a_deployments_keys_and_the_daemons_settings(tmp_path):
    run = [sys.executable, "-m", "skh", "config", "keyring", str(tmp_path / "k")]
    out = subprocess.run(
        [*run, "--host", "h0", "--sidecar", "side=j/c@h0"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert set(cfg) == {"controller", "analyzer", "admin", "subscriber", "ul-h0", "side"}
    trusted = {i.name: i for i in load_trusted(tmp_path / "k" / "trusted").values()}
    assert {n: i.role for n, i in trusted.items()} == {
        "admin": "admin",
        "alerts": "subscriber",
        "analyzer": "analyzer",
        "side": "overlay",
        "ul-h0": "underlay",
    }
    for sec in cfg.values():
        SecurityConfig(**sec).check(
            server="server_secret_key" in sec, client="client_secret_key" in sec
        )
    # again over the same directory: nothing overwritten
    before = (tmp_path / "k" / "controller.key_secret").read_bytes()
    assert subprocess.run([*run, "--host", "h0"], capture_output=True, cwd=ROOT).returncode == 0
    assert (tmp_path / "k" / "controller.key_secret").read_bytes() == before
