"""The example subscribers, written from docs/alerts.md alone (no skh import), against a running
analyzer: the Python one (pyzmq + msgpack) and the C one (libzmq + msgpack-c). Both receive the
same alerts as the log holds, in order, over CURVE; killed with SIGKILL mid-scenario and started
again they resume from their state file and lose nothing; a sequence gap on the PUB socket (a
dropped message) is filled by a replay."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from skh.orchestrator.analyzer import Analyzer

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PY_SUB = ROOT / "examples" / "subscriber.py"
FIELDS = ("kind", "state", "alert_id", "severity", "component")


def _py(args, state):
    return [sys.executable, str(PY_SUB), *args, "--state", str(state)]


def _parse(kind: str, line: str) -> tuple:
    """(seq, kind, state, alert_id, severity, component) of one output line."""
    if kind == "py":
        rec = json.loads(line)
        return (rec["seq"], *(rec["alert"].get(k, "") for k in FIELDS))
    seq, *rest = line.rstrip("\n").split("\t")
    return (int(seq), *rest)


def _read_lines(proc: subprocess.Popen, n: int, timeout_s: float) -> list[str]:
    out: list[str] = []
    end = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
    return out


def _start(cmd, cwd):
    return subprocess.Popen(
        cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_both_subscribers_get_every_alert_in_order_and_resume_after_a_kill(
    bus, c_subscriber, tmp_path
):
    cmds = {
        "py": lambda idle: _py([*bus.client_args(), "--idle-exit", idle], tmp_path / "py.seq"),
        "c": lambda idle: [
            str(c_subscriber),
            *bus.client_args(),
            "--state",
            str(tmp_path / "c.seq"),
            "--idle-exit",
            idle,
        ],
    }
    # both start while the scenario plays, and are killed after three alerts
    first = {k: _start(cmd("60"), tmp_path) for k, cmd in cmds.items()}
    got: dict[str, list[tuple]] = {}
    try:
        for k, proc in first.items():
            lines = _read_lines(proc, 3, 60)
            assert len(lines) == 3, (k, lines, proc.stderr.read() if proc.poll() else "")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            got[k] = [_parse(k, line) for line in lines + proc.stdout.readlines()]
    finally:
        for proc in first.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    killed_at = {k: bus.last_seq for k in got}  # 0 unless the scenario was already over
    log = bus.records()
    want = [(r["seq"], *(r["alert"].get(k, "") for k in FIELDS)) for r in log]
    assert [r["seq"] for r in log] == list(range(1, len(log) + 1))
    kinds = {r["alert"]["kind"] for r in log}
    assert kinds == {"skeleton", "fault"}, kinds
    for k, cmd in cmds.items():
        state = int((tmp_path / f"{k}.seq").read_text())
        again = subprocess.run(
            cmd("2"), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0, again.stderr[-2000:]
        second = [_parse(k, line) for line in again.stdout.splitlines()]
        # the restart resumes right after the last alert it acknowledged
        assert [s[0] for s in second] == list(range(state + 1, len(log) + 1)), (k, state)
        first_seqs = [s[0] for s in got[k]]
        assert first_seqs == list(range(1, len(first_seqs) + 1))
        # at-least-once: what was printed but not yet acknowledged comes again, nothing else
        assert state >= len(first_seqs) - 1, (k, state, first_seqs)
        merged = {s[0]: s for s in got[k] + second}
        assert [merged[s] for s in sorted(merged)] == want, k
        assert killed_at[k] == 0 or killed_at[k] >= state
    # the Python subscriber prints whole records: exactly the log's
    py_recs = [
        json.loads(line)
        for line in subprocess.run(
            _py([*bus.client_args(), "--idle-exit", "1"], tmp_path / "fresh.seq"),
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.splitlines()
    ]
    assert py_recs == log


class _GapHook:
    """Publishes one alert, then — on cue — logs one without publishing (as if the PUB message
    were dropped) and publishes the next."""

    def __init__(self):
        self.an: Analyzer | None = None
        self.cue = threading.Event()
        self.step = 0

    def on_round(self, probes, counters, now_ns):
        a = {"kind": "fault", "state": "open", "component": "x", "severity": "major"}
        if self.step == 0:
            self.step = 1
            return [{**a, "alert_id": "underlay|a|2"}]
        if self.step == 1 and self.cue.is_set():
            self.step = 2
            self.an.alerts.append({**a, "alert_id": "underlay|b|2"})  # never on the PUB socket
            return [{**a, "alert_id": "underlay|c|2"}]
        return []


@pytest.mark.parametrize("which", ["py", "c"])
def test_a_gap_on_the_pub_socket_is_filled_by_a_replay(which, request, local_config, tmp_path):
    cfg = local_config(analyzer__round_s=0.1)
    hook = _GapHook()
    ctx = zmq.Context()
    an = Analyzer(cfg.analyzer, cfg.security, hook=hook, ctx=ctx)
    hook.an = an
    _pull, pub, rep = an.bind()
    args = ["--alerts", pub, "--replay", rep]
    if which == "py":
        cmd = _py([*args, "--idle-exit", "5"], tmp_path / "s.seq")
    else:
        exe: Path = request.getfixturevalue("c_subscriber")
        cmd = [str(exe), *args, "--state", str(tmp_path / "s.seq"), "--idle-exit", "5"]
    stop = threading.Event()
    daemon = threading.Thread(target=an.run, args=(stop,), daemon=True)
    daemon.start()
    sub = _start(cmd, tmp_path)
    try:
        first = _read_lines(sub, 1, 30)
        assert [_parse(which, x)[3] for x in first] == ["underlay|a|2"], sub.stderr.read()
        hook.cue.set()
        rest = _read_lines(sub, 2, 30)
    finally:
        sub.kill()
        sub.wait()
        stop.set()
        daemon.join(10)
        ctx.destroy(linger=0)
    assert [_parse(which, x)[:4:3] for x in first + rest] == [
        (1, "underlay|a|2"),
        (2, "underlay|b|2"),
        (3, "underlay|c|2"),
    ]
