"""``skh probe`` and ``skh respond`` as separate processes."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys

import pytest

from skh.cli.probe import parse_target
from skh.errors import ConfigError

PY = [sys.executable, "-m", "skh"]


@pytest.fixture
def responder():
    proc = subprocess.Popen(
        [*PY, "respond", "--bind", "127.0.0.1", "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        m = re.search(r"answering on 127\.0\.0\.1:(\d+) \(udp, kernel stamps", line)
        assert m, line
        yield proc, int(m.group(1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        proc.stdout.close(), proc.stderr.close()


def test_probe_prints_ping_lines_and_summary(responder):
    proc, port = responder
    out = subprocess.run(
        [*PY, "probe", f"127.0.0.1:{port}", "-c", "5", "-i", "0.02"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    seq_lines = [
        ln
        for ln in lines
        if re.match(rf"127\.0\.0\.1:{port}: seq=\d+ rtt=[\d.]+ µs .* clock=kernel$", ln)
    ]
    assert len(seq_lines) == 5, out.stdout
    assert "5 probes, 5 answered, 0 lost (0.0% loss: 0 requests, 0 replies, 0 either)" in out.stdout
    assert re.search(
        r"network rtt min/p50/p99/max = [\d.]+/[\d.]+/[\d.]+/[\d.]+ µs \(clock kernel\)", out.stdout
    )
    proc.send_signal(signal.SIGTERM)
    stats = json.loads(proc.communicate(timeout=10)[0])
    assert stats["probes_received"] == 5 and stats["replies_sent"] == 10 and stats["drops"] == 0


def test_probe_json_and_exit_status_when_nobody_answers(responder):
    _, port = responder
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    out = subprocess.run(
        [
            *PY,
            "probe",
            f"127.0.0.1:{port}",
            f"127.0.0.1:{dead_port}",
            "-c",
            "3",
            "-i",
            "0.02",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    live, dead_t = doc["targets"]
    assert live["ok"] == 3 and live["rtt_us"]["p50"] > 0 and live["clock"] == "kernel"
    assert dead_t["refused"] == 3 and "rtt_us" not in dead_t
    out = subprocess.run(
        [*PY, "probe", f"127.0.0.1:{dead_port}", "-c", "2", "-i", "0.02", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "2 refused" in out.stdout


def test_probe_in_a_traffic_class(responder):
    _, port = responder
    out = subprocess.run(
        [*PY, "probe", f"127.0.0.1:{port}", "-c", "3", "-i", "0.02", "--dscp", "26"]
        + ["--priority", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["targets"][0]["ok"] == 3
    out = subprocess.run(
        [*PY, "probe", f"127.0.0.1:{port}", "--dscp", "26", "--traffic-class", "104"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0 and "--traffic-class or --dscp, not both" in out.stderr


@pytest.mark.parametrize(
    ("spec", "host", "port"),
    [
        ("10.0.0.1", "10.0.0.1", 7471),
        ("10.0.0.1:99", "10.0.0.1", 99),
        ("[::1]:5", "::1", 5),
        ("::1", "::1", 7471),
        ("h.example", "h.example", 7471),
    ],
)
def test_target_syntax(spec, host, port):
    t = parse_target(spec, "udp")
    assert (t.host, t.port) == (host, port)


@pytest.mark.parametrize("spec", ["10.0.0.1:x", "10.0.0.1:0", "[::1]x", ":5"])
def test_bad_target_syntax(spec):
    with pytest.raises(ConfigError):
        parse_target(spec, "udp")
