"""``skh analyzer`` runs the whole pipeline: its settings ([analyzer] controller, fabric file,
pipeline settings file), the daemon started through the CLI against a real controller (in one
process, and sharded over a local Ray cluster), and the underlay agent's sampling grid."""

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

from skh.errors import ConfigError
from skh.orchestrator.agent_underlay import next_sample_delay_s
from skh.orchestrator.config import AnalyzerConfig, load_config
from skh.orchestrator.controller import Controller
from skh.orchestrator.pipeline import PipelineConfig
from skh.records import ProbeStatus, empty_counters, empty_probes
from skh.wire import Codec, MsgType, probe_batch_body

ROOT = Path(__file__).resolve().parents[2]

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


@pytest.fixture
def fabric(tmp_path):
    f = tmp_path / "fabric.toml"
    f.write_text(FABRIC)
    return str(f)


def test_pipeline_settings_come_from_the_analyzer_table(tmp_path, fabric):
    settings = tmp_path / "pipeline.toml"
    settings.write_text(
        'addr_owner = {"10.0.9.1" = "tor0"}\n[detector]\nwindow_s = 4.0\nhop_s = 2.0\n'
        "latency_sample_s = 0.25\n"
    )
    a = AnalyzerConfig(controller="tcp://127.0.0.1:5550", fabric=fabric, pipeline=str(settings))
    cfg = PipelineConfig.from_analyzer(a)
    assert sorted(cfg.fabric["host"][i]["name"] for i in range(2)) == ["h0", "h1"]
    assert cfg.controller == a.controller and cfg.detector.window_s == 4.0
    assert cfg.addr_owner == {"10.0.9.1": "tor0"}
    # the fabric may sit in a JSON settings file instead (what a generated deployment writes)
    js = tmp_path / "pipeline.json"
    js.write_text(json.dumps({"fabric": cfg.fabric}))
    assert PipelineConfig.from_analyzer(AnalyzerConfig(pipeline=str(js))).fabric == cfg.fabric
    with pytest.raises(ConfigError, match="needs a fabric"):
        PipelineConfig.from_analyzer(AnalyzerConfig())
    with pytest.raises(ConfigError, match="given twice"):
        PipelineConfig.from_analyzer(AnalyzerConfig(fabric=fabric, pipeline=str(js)))
    js.write_text(json.dumps({"fabric": cfg.fabric, "controller": "tcp://x:1"}))
    with pytest.raises(ConfigError, match="analyzer.controller"):
        PipelineConfig.from_analyzer(AnalyzerConfig(pipeline=str(js)))
    with pytest.raises(ConfigError, match="'analyzer.detector'"):
        load_config(None, {"analyzer.detector": "auto"})


def _analyzer(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.Popen(
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
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_skh_analyzer_runs_the_pipeline_and_asks_the_controller(
    tmp_path, fabric, cfg, ctx, client, run_daemon, wait
):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _pub = ctl.bind()
    with run_daemon(ctl):
        p = _analyzer(tmp_path, "--fabric", fabric, "--controller", router)
        try:
            line = p.stdout.readline()
            assert line, p.stderr.read()
            rep = client(json.loads(line)["replay"], "t", kind=zmq.REQ)
            st = rep.request(MsgType.STATUS, {}, timeout_s=10, want={MsgType.ACK}).body["data"]
            assert st["detector"] == "PipelineHook"
            # its worker polls the controller's registry (endpoint names for localization)
            wait(
                lambda: ctl.counters[f"rx_{MsgType.STATUS.value}"] > 0,
                timeout_s=15,
                what="the pipeline asking the controller",
            )
        finally:
            p.terminate()
            assert p.wait(15) == 0


def test_skh_analyzer_without_a_fabric_says_what_is_missing(tmp_path):
    p = _analyzer(tmp_path, "--controller", "tcp://127.0.0.1:9")
    _out, err = p.communicate(timeout=30)
    assert p.returncode != 0 and "needs a fabric" in err
    p = _analyzer(tmp_path, "--detector", "detect")
    try:
        assert p.stdout.readline()  # detection alone needs neither
    finally:
        p.terminate()
        p.wait(15)


def _probe(src, dst, t_ns, seq):
    r = empty_probes(1)
    r["src_ep"], r["dst_ep"], r["seq"], r["t_wall_ns"] = src, dst, seq, t_ns
    r["rtt_ns"], r["status"] = 14_000, ProbeStatus.OK
    return r


def test_skh_analyzer_on_ray_ingests_at_its_front_end_and_publishes(
    tmp_path, fabric, cfg, ctx, client, run_daemon, wait
):
    # the same pipeline sharded over a local Ray cluster: batches pushed to an ingest front-end
    # reach the shards, and an agent that goes quiet is found, localized on the localizer actor
    # and published on the bus
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _pub = ctl.bind()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        ingest = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with run_daemon(ctl):
        for i, host in enumerate(("h0", "h1")):
            c = client(router, f"a{i}")
            ep = {"job": "j", "container": f"c{i}", "rail": 0, "ip": f"10.0.0.{i + 1}"}
            c.request(
                MsgType.REGISTER,
                {"agent": f"a{i}", "role": "overlay", "host": host, "endpoints": [ep]},
                want={MsgType.REGISTER_ACK},
            )
        p = _analyzer(
            tmp_path,
            "--fabric",
            fabric,
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
                send([0], _probe(0, 1, t, seq))
                send([1], _probe(1, 0, t, seq))
                st = status()["pipeline"]
                done = sum(s.get("records_in", 0) for s in st.get("shard_stats", []))
                return st if done >= 10 else None

            st = wait(both, timeout_s=90, interval_s=0.2, what="records on the shards")
            assert st["shards"] == 2 and st["unplaced_records"] == 0
            assert list(st["ingest"]) == [ingest]

            # endpoint 0's agent goes quiet: an agent fault, localized and on the bus
            def found():
                send([1], _probe(1, 0, time.time_ns(), seq))
                got = rep.request(
                    MsgType.REPLAY, {"since": 0}, timeout_s=10, want={MsgType.REPLAY_REPLY}
                ).body["alerts"]
                faults = [r["alert"] for r in got if r["alert"]["kind"] == "fault"]
                return faults or None

            faults = wait(found, timeout_s=60, interval_s=0.3, what="the agent fault")
            f = faults[0]
            assert (f["state"], f["layer"], f["component"]) == ("open", "agent", "j/c0")
            assert f["failure_type"] == "agent_crash"
            assert status()["pipeline"]["ingest"][ingest]["batches"] >= 20
        finally:
            push.close(0)
            p.terminate()
            assert p.wait(60) == 0, p.stderr.read()[-3000:]


def test_counter_samples_sit_on_the_wall_clock_grid():
    # on time at x.5: the next one at (x+1).5; late by 0.3 s: still (x+1).5
    assert next_sample_delay_s(100.5, 0.5, 1.0) == pytest.approx(1.0)
    assert next_sample_delay_s(100.8, 0.5, 1.0) == pytest.approx(0.7)
    # a hair early (monotonic and wall clocks disagree): not twice in a row
    assert next_sample_delay_s(100.4999, 0.5, 1.0) == pytest.approx(1.0001)
    assert next_sample_delay_s(100.5, 0.5, 3.0) == pytest.approx(3.0)
    assert next_sample_delay_s(100.0, 0.0, 1.0) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="sample_phase_s"):
        load_config(None, {"agent.sample_phase_s": 1.0})


def test_the_analyzer_says_when_its_latency_sampling_differs_from_the_agents(caplog):
    """Agents forward one OK per pair and the controller's ok_sample_s; a detector that samples
    on another period is told at the first status it reads."""
    import logging

    from skh.analysis.detect import DetectorConfig
    from skh.orchestrator.pipeline.hook import check_sampling
    from skh.probeplan import ProbePolicy

    cfg = PipelineConfig(fabric={}, detector=DetectorConfig(latency_sample_s=1.0))
    with caplog.at_level(logging.WARNING, "skh.orchestrator.pipeline.hook"):
        assert check_sampling(cfg, ProbePolicy(ok_sample_s=1.0).to_wire())
        assert not caplog.text
        assert not check_sampling(cfg, ProbePolicy(ok_sample_s=0.5).to_wire())
    assert "detector.latency_sample_s = 1 s" in caplog.text and "0.5 s" in caplog.text
    assert not check_sampling(cfg, None)  # an older controller hands no policy out


def test_ten_hz_counter_samples_keep_their_grid():
    # (k + 0.5) / 10 past each second: 100.55 is too near after a sample at 100.53 (under half
    # an interval), so the next is 100.65; the batch interval does not stretch a 10 Hz grid
    assert next_sample_delay_s(100.53, 0.5, 1.0, 10) == pytest.approx(0.12)
    assert next_sample_delay_s(100.45, 0.5, 1.0, 10) == pytest.approx(0.1)
    assert next_sample_delay_s(100.40, 0.5, 3.0, 10) == pytest.approx(0.05)
    assert next_sample_delay_s(100.4999, 0.5, 1.0, 1) == pytest.approx(1.0001)


def test_the_pipeline_worker_outlives_a_failing_update(fabric, cfg, ctx, client, run_daemon):
    # an exception on a heartbeat or on the controller's member list ended the worker thread:
    # the daemon went on ingesting and answering STATUS while nothing was detected any more
    from skh.orchestrator.pipeline import Pipeline, PipelineHook

    calls = {"set_endpoints": 0}

    class Brittle(Pipeline):
        def heartbeat(self, eps, t_ns):
            raise RuntimeError("a heartbeat bug")

        def set_endpoints(self, members, skeleton_versions=None):
            calls["set_endpoints"] += 1
            if calls["set_endpoints"] == 1:
                raise ValueError("a member-list bug")
            return super().set_endpoints(members, skeleton_versions)

    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _pub = ctl.bind()
    with run_daemon(ctl):
        client(router, "a0").request(
            MsgType.REGISTER,
            {
                "agent": "a0",
                "role": "overlay",
                "host": "h0",
                "endpoints": [{"job": "j", "container": "c0", "rail": 0, "ip": "10.0.0.1"}],
            },
            want={MsgType.REGISTER_ACK},
        )
        pcfg = PipelineConfig.from_analyzer(AnalyzerConfig(controller=router, fabric=fabric))
        hook = PipelineHook(pcfg, cfg.security, make_pipeline=Brittle)
        try:
            t = time.time_ns()
            for i in range(40):
                hook.on_heartbeat(np.array([0]), t)
                hook.on_round(empty_probes(0), empty_counters(0), t + i)
                if calls["set_endpoints"] >= 2 and hook.status().get("rounds", 0) >= 2:
                    break
                time.sleep(0.5)
            assert calls["set_endpoints"] >= 2, "the member list was not read again"
            assert hook.status()["rounds"] >= 2 and hook.status()["model_endpoints"] == 1
            assert hook._thread.is_alive()
        finally:
            hook.close()
