"""``skh alerts forward`` against a running analyzer: a real Prometheus Alertmanager (Debian's,
started on loopback) sees the scenario's faults open with their labels and resolve; a webhook
receiver that fails, and a bridge killed between a delivery and its acknowledgement, lose no
alert, and the one repeated carries the same idempotency key."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUS_SPEED = 1000.0  # these need the finished log, not a live one
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.system


def _forward(bus, *args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "skh", "alerts", "forward", *bus.client_args(), *args],
        cwd=bus.dir,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _active(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/api/v2/alerts?active=true", timeout=5) as r:
        return json.load(r)


def test_faults_open_and_resolve_in_alertmanager_with_their_labels(bus, alertmanager, tmp_path):
    log = bus.records()
    faults = [r for r in log if r["alert"]["kind"] == "fault"]
    opens = [r for r in faults if r["alert"]["state"] == "open"]
    assert len(opens) == 3 and len(faults) == 6
    upto = opens[1]["seq"]  # stop after the second fault opened
    state = tmp_path / "am.state"
    out = _forward(bus, "--alertmanager", alertmanager, "--state", str(state), "--count", str(upto))
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout)
    assert stats["last_seq"] == upto and stats["delivered"] == 2 and stats["skipped"] == upto - 2
    active = {a["labels"]["component"]: a for a in _active(alertmanager)}
    assert set(active) == {r["alert"]["component"] for r in opens[:2]}
    for r in opens[:2]:
        a = r["alert"]
        am = active[a["component"]]
        assert am["labels"] == {
            "alertname": "SkhFault",
            "layer": a["layer"],
            "component": a["component"],
            "failure_type": a["failure_type"],
            "job": a["job"],
            "severity": a["severity"],
        }
        assert am["annotations"]["idempotency_key"] == f"{a['alert_id']}|open|{r['seq']}"
        assert am["status"]["state"] == "active"
    # restarted, the bridge resumes after the last acknowledged alert and forwards the rest:
    # every resolve matches its open alert's labels, so nothing stays active
    out = _forward(bus, "--alertmanager", alertmanager, "--state", str(state), "--idle-exit", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    stats = json.loads(out.stdout)
    assert stats["last_seq"] == len(log) and stats["delivered"] == 4, stats
    deadline = time.monotonic() + 10
    while _active(alertmanager) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _active(alertmanager) == []


class _Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.calls += 1
            fail = srv.calls <= srv.fail_first
            if not fail:
                srv.got.append((self.headers["Idempotency-Key"], body))
            hold = not fail and len(srv.got) == srv.hold_at
        if hold:  # taken, but the bridge dies before it hears so
            srv.holding.set()
            srv.release.wait(30)
            return
        self.send_response(503 if fail else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.calls, srv.got, srv.fail_first, srv.hold_at = 0, [], 2, 3
    srv.holding, srv.release = threading.Event(), threading.Event()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def test_webhook_bridge_retries_survives_a_kill_and_loses_nothing(bus, receiver, tmp_path):
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    state = tmp_path / "hook.state"
    cmd = [sys.executable, "-m", "skh", "alerts", "forward", *bus.client_args()]
    cmd += ["--webhook", url, "--state", str(state)]
    bridge = subprocess.Popen(
        [*cmd, "--idle-exit", "30"],
        cwd=bus.dir,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.holding.wait(60), bridge.stderr.read() if bridge.poll() else ""
        bridge.send_signal(signal.SIGKILL)
        bridge.wait(10)
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait()
    assert "retrying" in bridge.stderr.read()  # the two 503s
    acked = json.loads(state.read_text())["last_seq"]
    assert acked == 2  # the third delivery was taken but never acknowledged
    log = bus.records()
    out = subprocess.run(
        [*cmd, "--idle-exit", "2"], cwd=bus.dir, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["last_seq"] == len(log)
    seqs = [body["seq"] for _key, body in receiver.got]
    # at-least-once: every record, in order; only the unacknowledged one twice
    assert seqs == [1, 2, 3, *range(3, len(log) + 1)]
    for key, body in receiver.got:
        a = body["alert"]
        assert key == body["idempotency_key"] == f"{a['alert_id']}|{a['state']}|{body['seq']}"
        assert {k: body[k] for k in ("seq", "ts_ns", "schema", "alert")} == log[body["seq"] - 1]
    keys = [key for key, _body in receiver.got]
    assert len(set(keys)) == len(log)  # the duplicate is recognisable by its key


def test_a_bridge_stops_promptly_on_sigterm_with_its_position_saved(bus, receiver, tmp_path):
    receiver.fail_first, receiver.hold_at = 0, -1
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    state = tmp_path / "term.state"
    cmd = [sys.executable, "-m", "skh", "alerts", "forward", *bus.client_args()]
    bridge = subprocess.Popen(
        [*cmd, "--webhook", url, "--state", str(state)],
        cwd=bus.dir,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        last = len(bus.records())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if state.exists() and json.loads(state.read_text())["last_seq"] == last:
                break
            time.sleep(0.1)
        t = time.monotonic()
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(10) == 0, bridge.stderr.read()[-2000:]
        assert time.monotonic() - t < 3  # not a whole resend period
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait()
    assert json.loads(bridge.stdout.read())["last_seq"] == last
