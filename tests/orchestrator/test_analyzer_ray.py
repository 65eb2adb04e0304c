"""``skh analyzer --ray local``: the daemon with its pipeline sharded over a local Ray cluster,
against a real controller. Batches pushed to an ingest front-end reach the shards; an agent
that goes quiet is found, localized on the localizer actor and published on the bus."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from skh.orchestrator.controller import Controller
from skh.records import ProbeStatus, empty_probes
from skh.wire import Codec, MsgType, probe_batch_body

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

FABRIC = """
[[switch]]
name = "tor0"
tier = "tor"
rail = 0
segment = 0

[[host]]
name = "h0"
segment = 0
rnics = [{rail = 0, tor = "tor0", netdev = "eth2", ip = "10.0.0.1"}]

[[host]]
name = "h1"
segment = 0
rnics = [{rail = 0, tor = "tor0", netdev = "eth2", ip = "10.0.0.2"}]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(src: int, dst: int, t_ns: int, seq: int) -> np.ndarray:
    r = empty_probes(1)
    r["src_ep"], r["dst_ep"], r["seq"], r["t_wall_ns"] = src, dst, seq, t_ns
    r["rtt_ns"], r["status"] = 14_000, ProbeStatus.OK
    return r


def test_skh_analyzer_on_ray_ingests_at_its_front_end_and_publishes(
    tmp_path, cfg, ctx, client, run_daemon, wait
):
    fabric = tmp_path / "fabric.toml"
    fabric.write_text(FABRIC)
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _pub = ctl.bind()
    ingest = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    with run_daemon(ctl):
        for i, host in enumerate(("h0", "h1")):
            c = client(router, f"a{i}")
            ep = {"job": "j", "container": f"c{i}", "rail": 0, "ip": f"10.0.0.{i + 1}"}
            c.request(
                MsgType.REGISTER,
                {"agent": f"a{i}", "role": "overlay", "host": host, "endpoints": [ep]},
                want={MsgType.REGISTER_ACK},
            )
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skh",
                "analyzer",
                "--insecure",
                "--bind",
                "tcp://127.0.0.1:0",
                "--alerts-bind",
                "tcp://127.0.0.1:0",
                "--replay-bind",
                "tcp://127.0.0.1:0",
                "--alert-log",
                str(tmp_path / "alerts.log"),
                "--print-endpoints",
                "--fabric",
                str(fabric),
                "--controller",
                router,
                "--ray",
                "local",
                "--ray-shards",
                "2",
                "--set",
                f"analyzer.ray_ingest={ingest}",
                "--set",
                "analyzer.round_s=0.5",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(ingest)
        codec = Codec()
        try:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            rep = client(json.loads(line)["replay"], "t", kind=zmq.REQ)

            def status():
                return rep.request(MsgType.STATUS, {}, timeout_s=10, want={MsgType.ACK}).body[
                    "data"
                ]

            assert status()["detector"] == "PipelineHook"
            seq = 0

            def send(eps, rows):
                nonlocal seq
                seq += 1
                body = probe_batch_body("agent", rows, eps)
                push.send(codec.encode(MsgType.PROBE_BATCH, "agent", seq, body))

            # both agents report until the shards have their records and heartbeats
            def both():
                t = time.time_ns()
                send([0], _rows(0, 1, t, seq))
                send([1], _rows(1, 0, t, seq))
                st = status()["pipeline"]
                done = sum(s.get("records_in", 0) for s in st.get("shard_stats", []))
                return st if done >= 10 else None

            st = wait(both, timeout_s=90, interval_s=0.2, what="records on the shards")
            assert st["shards"] == 2 and st["unplaced_records"] == 0
            assert list(st["ingest"]) == [ingest]

            # endpoint 0's agent goes quiet: an agent fault, localized and on the bus
            def found():
                send([1], _rows(1, 0, time.time_ns(), seq))
                got = rep.request(
                    MsgType.REPLAY, {"since": 0}, timeout_s=10, want={MsgType.REPLAY_REPLY}
                ).body["alerts"]
                faults = [r["alert"] for r in got if r["alert"]["kind"] == "fault"]
                return faults or None

            faults = wait(found, timeout_s=60, interval_s=0.3, what="the agent fault")
            assert faults[0]["state"] == "open"
            assert any(0 in pair for pair in map(tuple, faults[0]["pairs"])) or (
                "c0" in faults[0]["component"]
            )
        finally:
            push.close(0)
            p.terminate()
            rc = p.wait(60)
            err = p.stderr.read()
            assert rc == 0, err[-3000:]
