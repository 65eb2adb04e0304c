"""The overlay agent: results wait in a bounded buffer while the analyzer is unreachable (oldest
dropped and counted), and a skeleton swap adds new targets before it removes old ones."""

import dataclasses
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from skh.orchestrator.agent_overlay import OverlayAgent, ResultBuffer
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.config import AgentConfig, EndpointSpec
from skh.orchestrator.controller import Controller
from skh.records import PROBE_DTYPE, empty_probes
from skh.wire import Envelope, MsgType


def test_buffer_drops_the_oldest_records_and_counts_them():
    buf = ResultBuffer(max_records=10)
    for start in range(0, 16, 4):
        b = empty_probes(4)
        b["seq"] = np.arange(start, start + 4)
        buf.push(b.tobytes())
    assert buf.records == 10 and buf.dropped == 6
    kept = []
    while (head := buf.peek()) is not None:
        kept += np.frombuffer(head, PROBE_DTYPE)["seq"].tolist()
        buf.pop()
    assert kept == list(range(6, 16))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_results_wait_for_an_unreachable_analyzer(cfg, ctx, run_daemon, wait, tmp_path):
    """Two agents with real engines probe each other while no analyzer listens; once one starts,
    it receives the records kept meanwhile."""
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    analyzer_addr = f"tcp://127.0.0.1:{_free_port()}"
    agents = [
        OverlayAgent(
            dataclasses.replace(
                cfg.agent,
                name=f"a{i}",
                host=f"h{i}",
                job="j",
                container=f"c{i}",
                controller=router,
                controller_pub=pub,
                analyzer=analyzer_addr,
                probe_interval_s=0.05,
                batch_interval_s=0.2,
                endpoints=(EndpointSpec(rail=0, ip="127.0.0.1"),),
            ),
            cfg.security,
            ctx=ctx,
        )
        for i in range(2)
    ]
    with run_daemon(ctl), run_daemon(agents[0]), run_daemon(agents[1]):
        wait(
            lambda: all(a.buffer.records >= 20 for a in agents),
            timeout_s=30,
            what="buffered results",
        )
        assert all(a.counters["batches_sent"] == 0 for a in agents)
        started_ns = time.time_ns()
        an = Analyzer(
            dataclasses.replace(
                cfg.analyzer, bind=analyzer_addr, spool_dir=str(tmp_path / "spool")
            ),
            cfg.security,
            ctx=ctx,
        )
        an.bind()
        with run_daemon(an):
            wait(
                lambda: all(
                    a.buffer.records == 0 and a.counters["batches_sent"] > 0 for a in agents
                ),
                timeout_s=30,
                what="buffer shipped",
            )
            wait(lambda: an.counters["probe_records"] >= 40, timeout_s=30, what="records ingested")
    recs = np.concatenate([np.load(f) for f in (tmp_path / "spool").glob("probes-*.npy")])
    assert (recs["t_wall_ns"] < started_ns).sum() >= 40  # kept while nobody listened
    assert set(recs["src_ep"].tolist()) == {0, 1} and set(recs["dst_ep"].tolist()) == {0, 1}
    assert all(a.buffer.dropped == 0 for a in agents)


class _RecordingEngine:
    def __init__(self, calls):
        self.calls = calls

    def local_address(self):
        return {"ip": "127.0.0.1", "port": 9}

    def add_target(self, dst, host, port, **kw):
        self.calls.append(("add", dst))

    def remove_target(self, dst):
        self.calls.append(("remove", dst))

    def start(self):
        pass

    def close(self):
        pass

    def drain_packed(self, max_records=None):
        return bytearray()

    def stats(self):
        return {}


def _one_endpoint_agent(cfg, ctx, engine, **agent_kw):
    """An overlay agent a/h0 of j/c0 with one endpoint on rail 0, probing through ``engine``."""
    return OverlayAgent(
        dataclasses.replace(
            cfg.agent,
            name="a",
            host="h0",
            job="j",
            container="c0",
            endpoints=(EndpointSpec(rail=0),),
            **agent_kw,
        ),
        cfg.security,
        ctx=ctx,
        engine_factory=lambda s, c: engine,
    )


def test_skeleton_swap_never_unprobes_a_kept_pair(cfg, ctx):
    calls = []
    agent = _one_endpoint_agent(cfg, ctx, _RecordingEngine(calls))
    eps = [
        {
            "ep": i,
            "job": "j",
            "container": f"c{i}",
            "host": f"h{i}",
            "rail": 0,
            "ip": "127.0.0.1",
            "port": 1000 + i,
            "ready": True,
        }
        for i in range(4)
    ]
    snap = {"job": "j", "version": 1, "endpoints": eps, "skeleton_version": 0, "skeleton": None}
    agent.on_registered(
        Envelope(
            1,
            MsgType.REGISTER_ACK,
            "c",
            1,
            {"epoch": "e", "endpoints": [0], "snapshots": [snap], "heartbeat_interval_s": 1.0},
        )
    )
    assert agent.ping_lists()["lists"] == {"0": [1, 2, 3]}
    calls.clear()
    body = {
        "job": "j",
        "version": 2,
        "skeleton_version": 1,
        # every endpoint named (one no pair names would keep its preload pairs)
        "pairs": np.array([[0, 2], [1, 0], [3, 1]], dtype="<u4").tobytes(),
    }
    assert agent.job.apply(MsgType.SKELETON, body)
    agent._apply_targets()
    assert agent.ping_lists()["lists"] == {"0": [2]}
    assert ("remove", 2) not in calls and sorted(calls) == [("remove", 1), ("remove", 3)]
    calls.clear()
    body = {
        "job": "j",
        "version": 3,
        "skeleton_version": 2,
        "pairs": np.array([[0, 2], [0, 3], [1, 0]], dtype="<u4").tobytes(),
    }
    agent.job.apply(MsgType.SKELETON, body)
    agent._apply_targets()
    assert calls == [("add", 3)]
    calls.clear()
    body = {
        "job": "j",
        "version": 4,
        "skeleton_version": 3,
        "pairs": np.array([[0, 1], [2, 3]], dtype="<u4").tobytes(),
    }
    agent.job.apply(MsgType.SKELETON, body)
    agent._apply_targets()
    assert calls == [("add", 1), ("remove", 2), ("remove", 3)]  # the new target first
    agent.close()


def test_a_retried_command_runs_once_and_is_answered_each_time(cfg, ctx, run_daemon, wait):
    """The controller retries a command whose answer it did not see; the agent runs it once and
    answers the retry from its cache."""
    import zmq

    from skh.wire import Codec

    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    acfg = dataclasses.replace(
        cfg.agent,
        name="a",
        host="h0",
        job="j",
        container="c0",
        endpoints=(EndpointSpec(rail=0),),
        controller=f"tcp://127.0.0.1:{port}",
        controller_pub="tcp://127.0.0.1:9",
        analyzer="tcp://127.0.0.1:9",
    )
    agent = OverlayAgent(
        acfg, cfg.security, ctx=ctx, engine_factory=lambda s, c: _RecordingEngine([])
    )
    runs = []
    agent.handlers["pinglist"] = lambda args: runs.append(args) or len(runs)
    codec = Codec()
    try:
        with run_daemon(agent):
            assert router.poll(10_000)
            ident, _ = router.recv_multipart()
            cmd = codec.encode(
                MsgType.COMMAND,
                "controller",
                1,
                {"cmd_id": "c1", "agent": "a", "name": "pinglist", "args": {}},
            )
            replies = []
            for _ in range(2):
                router.send_multipart([ident, cmd])
                while True:
                    assert router.poll(10_000)
                    env = codec.decode(router.recv_multipart()[1])
                    if env.type is MsgType.COMMAND_REPLY:
                        replies.append(env.body)
                        break
    finally:
        router.close(0)
    assert runs == [{}]
    assert replies == [{"cmd_id": "c1", "ok": True, "result": 1}] * 2


class _PlanEngine(_RecordingEngine):
    def add_target(self, dst, host, port, **kw):
        self.calls.append(("add", dst, kw["interval_s"], kw["paths"]))


def test_the_agent_probes_as_the_controller_plans_and_says_where_it_disagrees(cfg, ctx, caplog):
    """The preload list is planned here from the handed-out policy (the budget shared among the
    ready destinations); a skeleton is probed as its plan says; the policy's OK sampling wins
    over the agent's own, which the agent reports once."""
    import logging

    from skh.probeplan import ProbePolicy, plan_probes

    calls = []
    agent = _one_endpoint_agent(cfg, ctx, _PlanEngine(calls), ok_sample_s=0.25)
    policy = ProbePolicy(budget_per_s=20.0, ok_sample_s=1.0)
    eps = [
        {"ep": i, "job": "j", "container": f"c{i}", "host": f"h{i}", "rail": 0, "ip": "127.0.0.1"}
        | {"port": 1000 + i, "ready": True}
        for i in range(5)
    ]
    snap = {
        "job": "j",
        "version": 1,
        "endpoints": eps,
        "skeleton_version": 0,
        "skeleton": None,
        "probing": policy.to_wire(),
    }
    with caplog.at_level(logging.WARNING, "skh.orchestrator.agent_overlay"):
        agent.on_registered(
            Envelope(
                1,
                MsgType.REGISTER_ACK,
                "c",
                1,
                {"epoch": "e", "endpoints": [0], "snapshots": [snap], "heartbeat_interval_s": 1.0},
            )
        )
    assert "ok_sample_s: 0.25 here, 1 from the controller" in caplog.text
    assert agent.counters["policy_disagreements"] == 1
    assert agent.thinner is not None and agent.thinner.period_ns == 10**9
    # preload: 4 ready peers share 20 probes/s, each rotating over 19 path ids (no fabric: 4
    # ECMP paths assumed)
    assert sorted(calls) == [("add", d, 0.2, 19) for d in (1, 2, 3, 4)]
    calls.clear()
    skeleton = np.array([[0, 1], [0, 3], [1, 0], [2, 3], [4, 3]], np.uint32)  # names all
    plan = plan_probes(skeleton, ProbePolicy(budget_per_s=20.0, default_ecmp_paths=2))
    body = {
        "job": "j",
        "version": 2,
        "skeleton_version": 1,
        "pairs": skeleton.astype("<u4").tobytes(),
        "probing": policy.to_wire(),
        "plan": plan.to_wire(),
    }
    assert agent.job.apply(MsgType.SKELETON, body)
    agent._apply_targets()
    # kept pairs are re-added with their new plan (same stream), dropped ones removed after
    assert calls == [("add", 1, 0.1, 8), ("add", 3, 0.1, 8), ("remove", 2), ("remove", 4)]
    assert agent.ping_lists()["plan"] == {"0": {"1": [0.1, 8], "3": [0.1, 8]}}
    assert agent.counters["policy_disagreements"] == 1  # said once
    agent.close()


def _python(code: str, *args: str) -> str:
    """What a fresh interpreter running ``code`` prints: a new process's imports."""
    run = [sys.executable, "-c", code, *args]
    return subprocess.run(run, capture_output=True, text=True, check=True, timeout=60).stdout


def test_an_agent_without_a_metrics_endpoint_never_loads_prometheus_client():
    # ~9 MB of the sidecar's memory (prometheus_client and the http.server under it): loaded
    # for a registry or a scrape only (bench/agent_process.py measures the agent process)
    code = (
        "import sys, skh.cli.agent\n"
        "from skh.orchestrator import agent_overlay, agent_underlay, metrics\n"
        "agent_overlay.OverlayAgent; metrics.Histograms({})\n"
        "print(sorted(m for m in ('prometheus_client', 'http.server') if m in sys.modules))\n"
        "metrics.CollectorRegistry\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    out = _python(code).split("\n")
    assert out[:2] == ["[]", "True"], out


def test_skh_agent_loads_no_other_subcommand():
    # `skh agent` builds only its own parser: the testbed, the demo's rich tables and the other
    # subcommands' modules stayed resident in every sidecar (~3.5 MB of its VmRSS); `skh --help`
    # still lists every subcommand
    from skh.cli import SUBCOMMANDS

    code = (
        "import sys\n"
        "from skh.cli import build_parser, _command_word\n"
        "build_parser(_command_word(sys.argv[1:]))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('skh.cli.', 'skh.testbed', 'rich'))"
        " and not m.startswith('skh.cli._')))\n"
    )
    out = _python(code, "-v", "agent", "--role", "overlay")
    assert out.strip() == "['skh.cli.agent']", out
    out = _python(code, "--help", "agent")
    assert all(f"skh.cli.{name}" in out for name in SUBCOMMANDS), out


def test_the_overlay_agents_import_graph_stays_lean():
    # every module the sidecar imports stays resident in every training container: numpy alone
    # is ~13 MB of its VmRSS, scipy and scikit-learn (the analyzer's) tens more, the simulator,
    # the evaluation, the testbed and the analyzer's detectors and localizer have no place
    # there either (bench/agent_process.py reports what each import layer costs)
    code = (
        "import sys, skh.cli.agent\n"
        "from skh.orchestrator import agent_overlay, config, daemon, metrics\n"
        "import skh.probe\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    mods = _python(code).split()
    assert "skh.orchestrator.agent_overlay" in mods and "skh.probe" in mods
    heavy = ("numpy", "scipy", "sklearn", "pandas", "prometheus_client", "rich", "pyroute2")
    assert not [m for m in mods if m.split(".")[0] in heavy]
    skh_heavy = ("skh.sim", "skh.eval", "skh.testbed", "skh.demo", "skh.collect")
    assert not [m for m in mods if m.startswith(skh_heavy)]
    # of the analysis layer, only the OK sampling the agent applies before shipping
    assert [m for m in mods if m.startswith("skh.analysis.")] == ["skh.analysis.rowthin"]


def test_an_engines_in_flight_table_covers_its_share_for_a_whole_timeout():
    # an unanswered probe holds its slot for the timeout: an endpoint probing its share of the
    # agent's top rate into an outage needs share x timeout slots, or its probes wait
    from skh.orchestrator.agent_overlay import in_flight_slots
    from skh.probe import _fastprobe

    for rate, n_eps, timeout_s in ((1000.0, 8, 1.0), (640.0, 8, 1.0), (5000.0, 2, 2.0)):
        eps = tuple(EndpointSpec(rail=r, ip="127.0.0.1") for r in range(n_eps))
        cfg = AgentConfig(max_probe_rate=rate, endpoints=eps, probe_timeout_s=timeout_s)
        slots = in_flight_slots(cfg)
        assert slots >= 2 * rate / n_eps * timeout_s
        assert slots <= _fastprobe.MAX_IN_FLIGHT
    # a default sidecar of 8 endpoints (1,000 probes/s in all): a quarter of the engine's default
    eps = tuple(EndpointSpec(rail=r, ip="127.0.0.1") for r in range(8))
    assert in_flight_slots(AgentConfig(endpoints=eps)) <= _fastprobe.DEFAULT_IN_FLIGHT // 4


def test_the_running_overlay_agent_never_loads_numpy():
    """Imports are not all: an agent that took a snapshot (its preload list, planned here from
    the policy), then a skeleton with its plan, probed, thinned, counted RTTs and shipped
    batches has still not loaded numpy (~13 MB of every sidecar's memory)."""
    code = r"""
import struct, sys
from skh.layout import PROBE_STRUCT
from skh.orchestrator.agent_overlay import OverlayAgent
from skh.orchestrator.config import AgentConfig, EndpointSpec
from skh.orchestrator.security import SecurityConfig
from skh.wire import Envelope, MsgType

class Fake:
    def __init__(self):
        self.targets = {}
    def local_address(self):
        return {"ip": "127.0.0.1", "port": 9}
    def add_target(self, dst, host, port, **kw):
        self.targets[dst] = (kw["interval_s"], kw["paths"])
    def remove_target(self, dst):
        del self.targets[dst]
    def start(self):
        pass
    def close(self):
        pass
    def stats(self):
        return {}
    def drain_packed(self, max_records=None):
        t0 = 1_700_000_000 * 10**9
        return bytearray(b"".join(
            PROBE_STRUCT.pack(0, dst, k, k % 4, int(k % 7 == 3), 2, t0 + k * 10**8,
                              -1 if k % 7 == 3 else 20_000, 1, 1)
            for dst in self.targets for k in range(30)))

cfg = AgentConfig(job="j", container="c0", host="h0", name="a",
                  controller="tcp://127.0.0.1:9", controller_pub="tcp://127.0.0.1:9",
                  analyzer="tcp://127.0.0.1:9", endpoints=(EndpointSpec(rail=0),))
agent = OverlayAgent(cfg, SecurityConfig(insecure=True), engine_factory=lambda s, c: Fake())
eng = agent.engines[0][1]
eps = [{"ep": e, "job": "j", "container": f"c{e}", "host": f"h{e}", "rail": 0,
        "ip": "127.0.0.1", "port": 7000 + e, "ready": True} for e in range(4)]
snap = {"job": "j", "version": 3, "skeleton_version": 0, "endpoints": eps, "skeleton": None,
        "probing": {"interval_s": 0.1, "budget_per_s": 20.0, "ok_sample_s": 1.0}}
agent.on_registered(Envelope(1, MsgType.REGISTER_ACK, "ctl", 1, {
    "epoch": "e", "endpoints": [0], "snapshots": [snap], "heartbeat_interval_s": 1.0}))
print(sorted(eng.targets.items()))
agent.flush()
assert agent.job.apply(MsgType.SKELETON, {"job": "j", "version": 4, "skeleton_version": 1,
                       "pairs": struct.pack("<6I", 0, 1, 0, 3, 2, 0),
                       "plan": {"interval_ms": struct.pack("<3H", 50, 200, 100),
                                "paths": struct.pack("<3H", 4, 19, 4)}})
agent._apply_targets()
print(sorted(eng.targets.items()))
agent.flush()
agent.close()
print(agent.counters["records"], agent.counters["records_thinned"], agent.counters["bad_plans"])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "scipy", "sklearn")))
"""
    preload, skeleton, counts, heavy = _python(code).splitlines()
    assert heavy == "[]"
    # three peers share 20 probes/s (planned here: skh.policy.source_plan), then the plan's
    assert preload == "[(1, (0.15, 19)), (2, (0.15, 19)), (3, (0.15, 19))]"
    assert skeleton == "[(1, (0.05, 4)), (3, (0.2, 19))]"
    records, thinned, bad_plans = map(int, counts.split())
    assert records == 150 and 0 < thinned < records and bad_plans == 0


def test_the_loop_sleeps_until_its_next_timer(cfg, ctx):
    """The overlay agent's poll waits for its next timer (results, session, ready file, a
    command's answer), never longer than MAX_WAIT_S, instead of waking ten times a second."""
    import concurrent.futures

    from skh.orchestrator.agent_base import COMMAND_POLL_S
    from skh.orchestrator.agent_overlay import MAX_WAIT_S, READY_POLL_S

    agent = _one_endpoint_agent(cfg, ctx, _RecordingEngine([]))
    try:
        now = 1000.0
        assert agent.wait_s(now) == 0.0  # not registered: register now
        agent.epoch, agent.ready_reported = "e1", True
        agent._next_heartbeat, agent._next_flush = now + 2.0, now + 0.7
        assert agent.wait_s(now) == pytest.approx(0.7)
        agent._next_flush = now + 30.0
        assert agent.wait_s(now) == MAX_WAIT_S
        agent.ready_reported, agent._next_ready = False, now - 1.0  # waiting for the ready file
        assert agent.wait_s(now) == pytest.approx(READY_POLL_S)
        agent.ready_reported = True
        agent._running["c1"] = concurrent.futures.Future()
        assert agent.wait_s(now) == pytest.approx(COMMAND_POLL_S)
    finally:
        agent._running.clear()
        agent.close()


def test_an_idle_agent_wakes_about_once_a_second(cfg, ctx, run_daemon):
    """Counted on the running loop: its turns over 3 s (the 10 Hz poll it replaced took 30)."""
    agent = _one_endpoint_agent(cfg, ctx, _RecordingEngine([]))
    turns = []
    tick = agent.tick
    agent.tick = lambda events, now: turns.append(now) or tick(events, now)
    agent.epoch, agent.ready_reported = "e1", True  # registered: heartbeats every 2 s
    agent._next_heartbeat = float("inf")  # the controller port is closed: nothing would ack
    with run_daemon(agent):
        time.sleep(3.0)
    assert 2 <= len(turns) <= 8, turns


def test_an_agent_whose_timer_is_under_a_millisecond_away_sleeps_rather_than_spins(
    cfg, ctx, run_daemon
):
    """A wait under a millisecond (the rest after a poll that ended just before its timer) is
    still slept, not polled with timeout 0 until the timer is due (the idle agent above once
    took a dozen turns in 0.15 ms that way, on a loaded CI machine). Here every wait is 0.4 ms."""
    agent = _one_endpoint_agent(cfg, ctx, _RecordingEngine([]))
    turns = []
    tick = agent.tick
    agent.tick = lambda events, now: turns.append(now) or tick(events, now)
    agent.wait_s = lambda now: 0.0004
    with run_daemon(agent):
        time.sleep(0.5)
    # a 1 ms poll per turn at most; a zero-timeout poll turns every ~10 us (tens of thousands)
    assert len(turns) <= 550, len(turns)


def test_the_engines_ask_for_rtts_on_the_pairs_latency_samples_only(cfg, ctx):
    """Each pair's engine target samples on the periods the agent's thinner and the analyzer
    use (the policy's ok_sample_s, the pair key's phase); every probe asks for an RTT when OKs
    are not thinned or the setting is off."""
    from skh.analysis.rowthin import sample_phase_ns

    agent = _one_endpoint_agent(cfg, ctx, _RecordingEngine([]))
    try:
        period = agent.policy.ok_sample_s
        assert period > 0
        assert agent._sampling(3, 9) == {
            "sample_period_s": period,
            "sample_phase_ns": sample_phase_ns(3 << 32 | 9, int(period * 1e9)),
        }
        agent.thinner = None  # every OK forwarded
        assert agent._sampling(3, 9) == {}
    finally:
        agent.close()
    off = _one_endpoint_agent(cfg, ctx, _RecordingEngine([]), engine_rtt_samples_only=False)
    try:
        assert off._sampling(3, 9) == {}
    finally:
        off.close()
