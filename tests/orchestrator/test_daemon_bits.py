"""sd_notify, configuration (TOML + overrides + `skh config check`) and CURVE security."""

import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from skh.errors import ConfigError
from skh.orchestrator.config import load_config, parse_override
from skh.orchestrator.controller import Controller
from skh.orchestrator.daemon import poll_ms
from skh.orchestrator.sdnotify import Notifier
from skh.orchestrator.security import SecurityConfig, generate_keypair
from skh.wire import MsgType

ROOT = Path(__file__).resolve().parents[2]


def test_sdnotify_speaks_the_protocol(tmp_path):
    path = str(tmp_path / "notify")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(2)
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.enabled and n.watchdog_interval_s == 1.0
    assert n.ready("up")
    assert srv.recv(100) == b"READY=1\nSTATUS=up"
    assert n.watchdog(now=10.0) and srv.recv(100) == b"WATCHDOG=1"
    assert not n.watchdog(now=10.5)  # paced at half the period
    assert n.watchdog(now=11.0)
    n.stopping()
    assert srv.recv(100) == b"WATCHDOG=1" and srv.recv(100) == b"STOPPING=1"
    n.close()
    srv.close()
    quiet = Notifier({})
    assert not quiet.enabled and not quiet.ready() and not quiet.watchdog()
    assert (
        Notifier(
            {"NOTIFY_SOCKET": "@abstract", "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1"}
        ).watchdog_interval_s
        == 0
    )


def test_poll_timeouts_round_up_so_a_loop_sleeps_until_its_timer():
    assert poll_ms(0.0004) == 1  # rounded down, the poll would not sleep at all
    assert poll_ms(0.0015) == 2
    assert poll_ms(1.0) == 1000
    assert poll_ms(0.0) == 0  # due now
    assert poll_ms(-0.25) == 0  # overdue


def test_config_file_overrides_and_errors(tmp_path):
    f = tmp_path / "skh.toml"
    f.write_text(
        "[controller]\nheartbeat_interval_s = 1\n"
        '[agent]\njob = "t"\nendpoints = [{rail = 0, ip = "10.0.0.1"}, {rail = 1}]\n'
        'sources = [{endpoint = "t/c/0", kind = "rdma", device = "mlx5_0"}]\n'
    )
    cfg = load_config(
        f, dict([parse_override("agent.probe_interval_s=0.5"), parse_override("agent.name=x y")])
    )
    assert cfg.controller.heartbeat_interval_s == 1.0 and cfg.agent.probe_interval_s == 0.5
    assert cfg.agent.name == "x y" and [e.rail for e in cfg.agent.endpoints] == [0, 1]
    assert cfg.agent.sources[0].device == "mlx5_0"
    for bad, match in [
        ({"agent.probe_interval_s": 0}, "must be > 0"),
        ({"agent.role": "middle"}, "overlay"),
        ({"controller.nope": 1}, "unknown setting"),
        ({"nope.x": 1}, "unknown override"),
        ({"agent.endpoints": [{"rail": 0}, {"rail": 0}]}, "two endpoints on one rail"),
        ({"controller.hwm": "many"}, "must be an int"),
    ]:
        with pytest.raises(ConfigError, match=match):
            load_config(None, bad)
    (tmp_path / "bad.toml").write_text("[oops]\n")
    with pytest.raises(ConfigError, match="unknown config section"):
        load_config(tmp_path / "bad.toml")


def test_underlay_agent_speaks_as_its_identity_by_default(tmp_path):
    """The agent's default name, its key's name and the name the analyzer commands agree: an
    analyzer with no host_agents setting reaches the deployed ul-HOST agents."""
    from skh.model import Cluster, Fabric
    from skh.orchestrator.keyring import make_keyring
    from skh.orchestrator.pipeline import PipelineConfig
    from skh.orchestrator.pipeline.state_source import AgentStateSource

    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    host = sorted(fabric.hosts)[0]
    cfg = load_config(None, {"agent.role": "underlay", "agent.host": host})
    ring = make_keyring(tmp_path / "keys", hosts=[host])
    source = AgentStateSource(None, Cluster(fabric), PipelineConfig(fabric=fabric.to_mapping()))
    assert cfg.agent.agent_name == f"ul-{host}" == source._agent(host)
    assert Path(ring.underlay(host).client_secret_key).name == f"ul-{host}.key_secret"
    assert source._agent("not-a-host") is None


def test_config_check_cli(tmp_path):
    f = tmp_path / "skh.toml"
    f.write_text("[analyzer]\nround_s = 2\n")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "skh", "config", "check", str(f), "--set", "agent.job=x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["analyzer"]["round_s"] == 2.0 and data["agent"]["job"] == "x"
    bad = subprocess.run(
        [sys.executable, "-m", "skh", "config", "check", str(f), "--role", "agent"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--insecure" in bad.stderr  # no keys and no explicit opt-out


def test_curve_admits_authorized_agents_only(tmp_path, ctx, client, run_daemon):
    keys = tmp_path / "keys"
    generate_keypair(keys, "server")
    generate_keypair(keys / "authorized", "agent", metadata={"role": "admin"})
    generate_keypair(keys / "other", "intruder")
    server = SecurityConfig(
        server_secret_key=str(keys / "server.key_secret"),
        authorized_keys_dir=str(keys / "authorized"),
    )
    server.check(server=True, client=False)
    cfg = load_config(
        None,
        {
            "controller.bind": "tcp://127.0.0.1:0",
            "controller.pub_bind": "tcp://127.0.0.1:0",
            "controller.db": str(tmp_path / "r.db"),
        },
    )
    ctl = Controller(cfg.controller, server, ctx=ctx)
    router, _ = ctl.bind()

    def dealer(sec):
        c = client(router, "a")
        c.sock.close(0)
        c.sock = ctx.socket(zmq.DEALER)
        c.sock.setsockopt(zmq.LINGER, 0)
        if sec is not None:
            sec.client(c.sock)
        c.sock.connect(router)
        return c

    with run_daemon(ctl):
        good = SecurityConfig(
            server_public_key=str(keys / "server.key"),
            client_secret_key=str(keys / "authorized" / "agent.key_secret"),
        )
        good.check(server=False, client=True)
        env = dealer(good).request(MsgType.STATUS, {}, timeout_s=10, want={MsgType.ACK})
        assert env.body["ok"]
        intruder = SecurityConfig(
            server_public_key=str(keys / "server.key"),
            client_secret_key=str(keys / "other" / "intruder.key_secret"),
        )
        for sec in (intruder, None):  # an unknown key, and plain text
            with pytest.raises(TimeoutError):
                dealer(sec).request(MsgType.STATUS, {}, timeout_s=1.5)
    with pytest.raises(ConfigError, match="insecure"):
        SecurityConfig().check(server=True, client=False)
    with pytest.raises(ConfigError, match="cannot read"):
        SecurityConfig(server_secret_key=str(tmp_path / "missing")).check(server=True, client=False)


def test_daemon_notifies_systemd_and_stops_cleanly_on_sigterm(tmp_path):
    """`skh controller` as systemd runs it: READY=1 once bound, watchdog pings, STOPPING=1 and
    exit status 0 on SIGTERM."""
    import signal

    path = str(tmp_path / "notify")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(20)
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "NOTIFY_SOCKET": path,
        "WATCHDOG_USEC": "400000",
    }
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skh",
            "--log-json",
            "-v",
            "controller",
            "--insecure",
            "--db",
            str(tmp_path / "r.db"),
            "--bind",
            "tcp://127.0.0.1:0",
            "--pub-bind",
            "tcp://127.0.0.1:0",
        ],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.recv(200).startswith(b"READY=1")
        assert srv.recv(200) == b"WATCHDOG=1"
        p.send_signal(signal.SIGTERM)
        msgs = []
        while b"STOPPING=1" not in msgs:
            msgs.append(srv.recv(200))
        assert p.wait(15) == 0
        logs = [json.loads(line) for line in p.stderr.read().splitlines() if line.startswith("{")]
        assert any("SIGTERM" in rec["msg"] for rec in logs)  # JSON lines on stderr
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        srv.close()


def test_unit_files_are_notify_services_with_a_watchdog():
    units = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
    assert len(units) == 4
    for unit in units:
        text = unit.read_text()
        assert "Type=notify" in text and "WatchdogSec=" in text, unit.name
    for agent in ("skh-agent-underlay.service", "skh-agent-overlay@.service"):
        text = (ROOT / "deploy" / "systemd" / agent).read_text()
        assert "LimitMEMLOCK=infinity" in text and "CapabilityBoundingSet=CAP_" in text
        assert "NoNewPrivileges=yes" in text


def test_metrics_endpoint_exports_bounded_series(cfg, ctx, client, run_daemon):
    import urllib.request

    from skh.orchestrator.metrics import CollectorRegistry, serve, stop_servers

    registry = CollectorRegistry()
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx, metrics=registry)
    router, _ = ctl.bind()
    port = serve(registry, "127.0.0.1:0")
    with run_daemon(ctl):
        c = client(router, "a")
        c.request(
            MsgType.REGISTER,
            {
                "agent": "a",
                "role": "overlay",
                "host": "h",
                "endpoints": [
                    {"job": "j", "container": "c", "rail": 0, "ip": "127.0.0.1", "port": 9}
                ],
            },
            want={MsgType.REGISTER_ACK},
        )
        c.sock.send(b"garbage")
        c.request(MsgType.STATUS, {}, want={MsgType.ACK})
        try:
            text = (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
                .read()
                .decode()
            )
        finally:
            stop_servers()
    assert 'skh_controller_agents{role="overlay",state="alive"} 1.0' in text
    assert 'skh_controller_registry{kind="endpoints"} 1.0' in text
    assert 'skh_controller_rejected_frames_total{reason="malformed"} 1.0' in text
    assert 'skh_controller_events_total{kind="registrations"} 1.0' in text


@pytest.mark.parametrize("retry", [False, True])
def test_a_client_refused_before_the_server_knew_its_key_gets_through_once_it_does(retry):
    # issue 18: a sidecar enrols, then connects to the analyzer before the analyzer's key mirror
    # has its key; libzmq never reconnects after a ZAP refusal, so without RetryRefused the
    # sidecar's results had nowhere to go for the rest of its life
    import time

    from zmq.auth.thread import ThreadAuthenticator

    from skh.orchestrator.daemon import RetryRefused

    ctx = zmq.Context()
    server_pub, server_sec = zmq.curve_keypair()
    client_pub, client_sec = zmq.curve_keypair()
    known: set[bytes] = set()

    class Mirror:
        def callback(self, _domain: str, key: bytes) -> bool:
            return key in known

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=Mirror())
    pull = ctx.socket(zmq.PULL)
    pull.curve_server, pull.curve_secretkey, pull.curve_publickey = True, server_sec, server_pub
    address = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
    push = ctx.socket(zmq.PUSH)
    push.curve_serverkey, push.curve_publickey, push.curve_secretkey = (
        server_pub,
        client_pub,
        client_sec,
    )
    push.setsockopt(zmq.IMMEDIATE, 1)
    watch = RetryRefused(push, address, retry_s=0.2) if retry else None
    push.connect(address)
    got = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not (watch and watch.refusals):
            if watch:
                watch.tick(time.monotonic())
            time.sleep(0.02)
        time.sleep(0.3)  # refused (a ZAP answer takes milliseconds)
        known.add(client_pub)  # the mirror caught up
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not got:
            if watch:
                watch.tick(time.monotonic())
            with contextlib.suppress(zmq.Again):
                push.send(b"result", zmq.NOBLOCK)
            if pull.poll(50):
                got += len(pull.recv())
    finally:
        if watch:
            watch.close()
        for s in (push, pull):
            s.close(0)
        auth.stop()
        ctx.term()
    if retry:
        assert watch is not None and watch.refusals == 1
        assert got
    else:
        assert not got  # libzmq alone never tries again: the reason RetryRefused exists
