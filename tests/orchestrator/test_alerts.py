"""The alert bus: a durable, append-only log that survives a torn write; the analyzer publishes
what its round hook returns with sequence numbers; ``skh alerts tail`` replays since N and then
follows live alerts, each once and in order."""

import json
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import zmq

from skh.orchestrator.alerts import AlertLog, alert_schema
from skh.orchestrator.analyzer import Analyzer
from skh.records import empty_probes
from skh.wire import Codec, MsgType, probe_batch_body

ROOT = Path(__file__).resolve().parents[2]


def test_log_appends_replays_and_cuts_a_torn_record(tmp_path):
    path = tmp_path / "a.log"
    log = AlertLog(path)
    for i in range(5):
        log.append({"job": "j", "i": i, "x": np.int64(i)})  # numpy values become plain
    assert [r["seq"] for r in log.since(2)] == [3, 4, 5]
    assert [r["alert"]["i"] for r in log.since(0, limit=2)] == [0, 1]
    assert log.since(5) == [] and log.since(99) == []
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"seq": 6, "ts_ns": 1, "al')  # a crash in the middle of a write
    log = AlertLog(path)
    assert log.last_seq == 5
    assert log.append({"job": "k"})["seq"] == 6
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    log.close()


class _Hook:
    """Raises one alert per round that saw probes from a new source endpoint."""

    def __init__(self):
        self.seen = set()

    def on_round(self, probes, counters, now_ns):
        for src in sorted(set(np.unique(probes["src_ep"]).tolist()) - self.seen):
            self.seen.add(src)
            yield {
                "job": "j",
                "layer": "test",
                "component": f"ep{src}",
                "failure_type": "none",
                "severity": "info",
                "evidence": {"records": int((probes["src_ep"] == src).sum())},
            }


def test_hook_alerts_reach_alerts_tail(cfg, ctx, run_daemon, wait, tmp_path):
    an = Analyzer(cfg.analyzer, cfg.security, hook=_Hook(), ctx=ctx)
    pull, pub, rep = an.bind()
    for i in range(3):  # three alerts in the log before anyone subscribes
        an.publish({"job": "j", "component": f"old{i}", "severity": "warning"})
    with run_daemon(an):
        tail = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skh",
                "alerts",
                "tail",
                "--insecure",
                "--since",
                "1",
                "--json",
                "--replay",
                rep,
                "--alerts",
                pub,
                "--idle-exit",
                "4",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        try:
            first = [json.loads(tail.stdout.readline()) for _ in range(2)]
            assert [r["seq"] for r in first] == [2, 3]  # replayed since 1
            push = ctx.socket(zmq.PUSH)
            push.connect(pull)
            codec = Codec()
            for src in (7, 8):
                batch = empty_probes(4)
                batch["src_ep"] = src
                push.send(codec.encode(MsgType.PROBE_BATCH, "t", src, probe_batch_body("t", batch)))
            live = [json.loads(tail.stdout.readline()) for _ in range(2)]
            assert [r["seq"] for r in live] == [4, 5]
            assert {r["alert"]["component"] for r in live} == {"ep7", "ep8"}
            assert tail.wait(30) == 0, tail.stderr.read()
            push.close(0)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait()
    assert AlertLog(tmp_path / "alerts.log").last_seq == 5


def test_detector_hook_turns_suspect_events_into_alerts(tmp_path):
    """The real streaming detector behind the analyzer's hook: a pair whose probes all fail is
    reported unreachable, with the job learned from the controller's announcements."""
    from skh.orchestrator.analyzer import DetectorHook, load_detector_hook
    from skh.records import ProbeStatus

    hook = load_detector_hook()
    assert isinstance(hook, DetectorHook)
    hook.ep_job.update({0: "train", 1: "train"})
    t0 = time.time_ns()
    alerts = []
    for r in range(10):
        now = t0 + r * 1_000_000_000
        b = empty_probes(20)
        b["src_ep"], b["dst_ep"] = np.repeat([0, 1], 10), np.repeat([1, 0], 10)
        b["seq"] = np.arange(20) + r * 20
        b["t_wall_ns"] = now - 500_000_000 + np.arange(20) * 10_000_000
        b["status"] = ProbeStatus.LOST
        hook.on_heartbeat(np.array([0, 1]), now)
        alerts += hook.on_round(b, None, now + 100_000_000)
    # a pair waits for its responder's own agent to report past its first failure (a silent
    # responder may be a stalled or restarting agent): here 0's rows all precede 1 -> 0's, so
    # that pair may come one round later, as a second alert
    assert 1 <= len(alerts) <= 2
    assert {x["failure_type"] for x in alerts} == {"unreachable"}
    a = alerts[0]
    assert a["job"] == "train" and a["severity"] == "critical" and a["layer"] == "network"
    assert sorted({tuple(p) for x in alerts for p in x["pairs"]}) == [(0, 1), (1, 0)]
    assert a["first_seen_ns"] <= a["detected_at_ns"]
    assert a["kind"] == "suspect" and a["state"] == "event"
    # the bus contract: docs/alerts.md, skh/orchestrator/alert.schema.json
    jsonschema.validate(AlertLog(tmp_path / "a.log").append(a), alert_schema())


def test_detector_hook_tells_the_detector_each_announced_endpoints_rnic():
    """The controller's announcements carry each endpoint's host and rail: the hook maps them to
    one access link id per RNIC, the same for a later job's endpoint on it, and refuses an
    endpoint without them."""
    from skh.errors import ProtocolError
    from skh.orchestrator.analyzer import load_detector_hook

    hook = load_detector_hook()
    hook.on_ready([{"ep": 0, "host": "h0", "rail": 0}, {"ep": 3, "host": "h1", "rail": 2}])
    hook.on_ready([{"ep": 5, "host": "h0", "rail": 0}])
    assert hook.ep_link.tolist() == [0, -1, -1, 1, -1, 0]
    assert hook.detector.fast._links_of(np.arange(7)).tolist() == [0, -1, -1, 1, -1, 0, -1]
    with pytest.raises(ProtocolError):
        hook.on_ready([{"ep": 6, "host": "h2", "rail": "0"}])


def test_detector_hook_watches_a_stopped_endpoint_again_once_it_is_announced_ready():
    """A container stopped on purpose (ENDPOINTS_DOWN "stopped": retired) and started again
    under its registration keeps its endpoint id: announced ready, it is watched afresh (it
    stayed retired, its records dropped, before). One never stopped keeps its history."""
    from skh.orchestrator.analyzer import load_detector_hook

    hook = load_detector_hook()
    hook.on_ready([{"ep": 0, "host": "h0", "rail": 0}, {"ep": 1, "host": "h1", "rail": 0}])
    hook.on_retire([1])
    retired = hook.detector.health.is_retired
    assert retired(np.array([0, 1])).tolist() == [False, True]
    hook.on_ready([{"ep": 0, "host": "h0", "rail": 0}, {"ep": 1, "host": "h1", "rail": 0}])
    assert retired(np.array([0, 1])).tolist() == [False, False]
