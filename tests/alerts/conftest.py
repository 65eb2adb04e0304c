"""A running analyzer for the bus's clients: ``skh demo --sim --serve`` as its own process, with
CURVE on (a server key, one client key pair in ``authorized_keys_dir``), playing the simulated
scenario (two skeletons, three faults that open and resolve) fast."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skh.orchestrator.config import load_config
from skh.orchestrator.security import generate_keypair

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def need(what: str, ok: bool) -> None:
    """Skip without a tool outside CI; in CI (tools/setup-debian.sh installs it) fail."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing: tools/setup-debian.sh installs it")
    pytest.skip(f"{what} is missing (tools/setup-debian.sh installs it)")


@dataclass
class Bus:
    proc: subprocess.Popen
    dir: Path
    alerts: str
    replay: str
    metrics_port: int
    server_key: Path  # the analyzer's public certificate
    client_key: Path  # the subscriber's secret certificate (its key pair)
    done: threading.Event = field(default_factory=threading.Event)
    last_seq: int = 0
    stderr: list[str] = field(default_factory=list)

    def wait_done(self, timeout_s: float = 120.0) -> int:
        assert self.done.wait(timeout_s), "the scenario did not finish:\n" + "".join(
            self.stderr[-30:]
        )
        return self.last_seq

    def records(self) -> list[dict]:
        """Every record of the alert log, read from its file (no rotation at this size)."""
        self.wait_done()
        lines = (self.dir / "alerts.log").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def client_args(self) -> list[str]:
        return [
            "--alerts",
            self.alerts,
            "--replay",
            self.replay,
            "--server-key",
            str(self.server_key),
            "--client-key",
            str(self.client_key),
        ]


def start_bus(d: Path, *, speed: float = 40.0) -> Bus:
    keys = d / "keys"
    _server_pub, server_secret = generate_keypair(keys, "analyzer")
    generate_keypair(keys / "clients", "subscriber", metadata={"role": "subscriber"})
    cfg = d / "skh.toml"
    cfg.write_text(
        f"""
[analyzer]
bind = "tcp://127.0.0.1:0"
alerts_bind = "tcp://127.0.0.1:0"
replay_bind = "tcp://127.0.0.1:0"
alert_log = "{d / "alerts.log"}"
metrics = "127.0.0.1:0"

[security]
server_secret_key = "{server_secret}"
authorized_keys_dir = "{keys / "clients"}"
"""
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skh",
            "demo",
            "--sim",
            "--serve",
            "--speed",
            str(speed),
            "-c",
            str(cfg),
        ],
        cwd=d,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    if not first:
        proc.wait(10)
        raise AssertionError(f"the bus did not start: {proc.stderr.read()[-3000:]}")
    addr = json.loads(first)
    bus = Bus(
        proc,
        d,
        addr["alerts"],
        addr["replay"],
        addr["metrics_port"],
        keys / "analyzer.key",
        keys / "clients" / "subscriber.key_secret",
    )

    def watch_stdout() -> None:
        for line in proc.stdout:
            msg = json.loads(line)
            if msg.get("done"):
                bus.last_seq = msg["last_seq"]
                bus.done.set()

    def watch_stderr() -> None:
        for line in proc.stderr:
            bus.stderr.append(line)

    threading.Thread(target=watch_stdout, daemon=True).start()
    threading.Thread(target=watch_stderr, daemon=True).start()
    return bus


def stop_bus(bus: Bus) -> None:
    bus.proc.terminate()
    try:
        assert bus.proc.wait(20) == 0, "".join(bus.stderr[-30:])
    finally:
        if bus.proc.poll() is None:
            bus.proc.kill()
            bus.proc.wait()


@pytest.fixture(scope="module")
def bus(request, tmp_path_factory):
    """A fresh bus per test module: its clients start while the scenario plays, at the module's
    ``BUS_SPEED`` (virtual seconds per second; modules that only need the finished log play it
    as fast as the simulator runs)."""
    b = start_bus(tmp_path_factory.mktemp("bus"), speed=getattr(request.module, "BUS_SPEED", 40.0))
    try:
        yield b
    finally:
        stop_bus(b)


@pytest.fixture(scope="session")
def c_subscriber(tmp_path_factory):
    """examples/subscriber.c built against Debian's libzmq and msgpack-c."""
    need("a C compiler", shutil.which("cc") is not None)
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "libzmq", "msgpack"], capture_output=True, text=True
    )
    need("libzmq3-dev and libmsgpack-dev", flags.returncode == 0)
    exe = tmp_path_factory.mktemp("c") / "subscriber"
    subprocess.run(
        ["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe)]
        + [str(ROOT / "examples" / "subscriber.c")]
        + flags.stdout.split(),
        check=True,
    )
    return exe


@pytest.fixture
def need_tool():
    return need


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path):
    """Debian's prometheus-alertmanager on a loopback port; yields its base URL."""
    exe = shutil.which("prometheus-alertmanager")
    need("prometheus-alertmanager", exe is not None)
    (tmp_path / "am.yml").write_text("route:\n  receiver: default\nreceivers:\n  - name: default\n")
    port = _free_port()
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.1)
        else:
            raise AssertionError("alertmanager did not become ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def local_config(tmp_path):
    """``local_config(**overrides)``: an insecure config whose daemons bind ephemeral loopback
    ports, log alerts under ``tmp_path`` and connect nowhere else."""

    def make(**overrides):
        base = {
            "security.insecure": True,
            "controller.bind": "tcp://127.0.0.1:0",
            "controller.pub_bind": "tcp://127.0.0.1:0",
            "controller.db": str(tmp_path / "registry.db"),
            "analyzer.bind": "tcp://127.0.0.1:0",
            "analyzer.alerts_bind": "tcp://127.0.0.1:0",
            "analyzer.replay_bind": "tcp://127.0.0.1:0",
            "analyzer.alert_log": str(tmp_path / "alerts.log"),
            "analyzer.detector": "none",
            "agent.controller": "tcp://127.0.0.1:9",
            "agent.controller_pub": "tcp://127.0.0.1:9",
            "agent.analyzer": "tcp://127.0.0.1:9",
        }
        return load_config(
            None, {**base, **{k.replace("__", "."): v for k, v in overrides.items()}}
        )

    return make
