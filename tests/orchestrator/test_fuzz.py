"""100,000+ malformed frames at every socket a daemon reads — the controller's ROUTER, the
analyzer's PULL and REP, an overlay agent's DEALER and SUB — and each daemon keeps running,
counts what it refused and still serves a valid request afterwards.

Frames are drawn from a pool built once: random bytes, truncations and byte flips of valid frames
of every type, valid envelopes with unknown versions/types or mistyped fields, wrong frame counts
and oversized frames. Sending cycles through the pool in bulk to stay fast."""

import time

import msgpack
import numpy as np
import pytest
import zmq

from skh.orchestrator.agent_overlay import OverlayAgent
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.config import EndpointSpec
from skh.orchestrator.controller import Controller
from skh.records import empty_counters, empty_probes
from skh.wire import (
    ENDPOINT_DTYPE,
    ENDPOINT_TEXT,
    Codec,
    MsgType,
    counter_batch_body,
    encode_records,
    job_topic,
    probe_batch_body,
)

N_FRAMES = 100_000
pytestmark = pytest.mark.timeout(240)


def _one_record(ep):
    """``ep`` (a wire map) as a snapshot page's records."""
    fixed = np.array([tuple(ep.get(f, 0) for f in ENDPOINT_DTYPE.names)], ENDPOINT_DTYPE)
    text = {f: ([ep.get(f, "")], np.zeros(1, np.int64)) for f in ENDPOINT_TEXT}
    return encode_records(fixed, text)


def _valid_frames():
    c = Codec()
    ep = {
        "ep": 1,
        "job": "j",
        "container": "c",
        "host": "h",
        "rail": 0,
        "ip": "127.0.0.1",
        "port": 9,
        "ready": True,
    }
    bodies = {
        MsgType.REGISTER: {"agent": "x", "role": "overlay", "host": "h", "endpoints": [dict(ep)]},
        MsgType.REGISTER_ACK: {
            "epoch": "e",
            "endpoints": [1],
            "heartbeat_interval_s": 1.0,
            "snapshots": [
                {
                    "job": "j",
                    "version": 1,
                    "endpoints": [ep],
                    "skeleton_version": 0,
                    "skeleton": None,
                }
            ],
        },
        MsgType.READY: {"agent": "x", "endpoints": [1]},
        MsgType.HEARTBEAT: {"agent": "x", "epoch": "e", "jobs": {"j": 1}},
        MsgType.HEARTBEAT_ACK: {"epoch": "e", "known": True, "jobs": {"j": 3}},
        MsgType.SYNC: {"job": "j"},
        MsgType.ACK: {"ok": True, "re": 1},
        MsgType.COMMAND: {"cmd_id": "c", "agent": "x", "name": "stats", "args": {}},
        MsgType.COMMAND_REPLY: {"cmd_id": "c", "ok": True},
        MsgType.SUBMIT_JOB: {"job": "j", "containers": [{"name": "c", "host": "h", "rails": [0]}]},
        MsgType.APPLY_SKELETON: {"job": "j", "skeleton_version": 1, "pairs": b"\1\0\0\0\2\0\0\0"},
        MsgType.STATUS: {},
        MsgType.REMOVE_JOB: {"job": "j"},
        MsgType.JOB_SNAPSHOT: {
            "job": "j",
            "version": 1,
            "records": _one_record(ep),
            "skeleton_version": 0,
            "skeleton": None,
        },
        MsgType.READY_ANNOUNCE: {"job": "j", "version": 2, "endpoints": [ep]},
        MsgType.ENDPOINTS_DOWN: {"job": "j", "version": 2, "endpoints": [1], "reason": "x"},
        MsgType.SKELETON: {
            "job": "j",
            "version": 2,
            "skeleton_version": 1,
            "pairs": b"\1\0\0\0\2\0\0\0",
        },
        MsgType.AGENT_STATE: {"agent": "x", "state": "lost", "endpoints": [1]},
        MsgType.PROBE_BATCH: probe_batch_body("x", empty_probes(3)),
        MsgType.COUNTER_BATCH: counter_batch_body("x", empty_counters(3)),
        MsgType.ALERT: {"seq": 1, "alert": {"job": "j"}},
        MsgType.REPLAY: {"since": 0},
        MsgType.REPLAY_REPLY: {"alerts": [], "last_seq": 0},
    }
    return [c.encode(t, "fuzz", 1, b) for t, b in bodies.items()]


def _pool(seed=0, size=4000):
    rng = np.random.default_rng(seed)
    valid = _valid_frames()
    pool = []
    for i in range(size):
        kind = i % 8
        base = valid[int(rng.integers(len(valid)))]
        if kind == 0:
            pool.append(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes())
        elif kind == 1:
            pool.append(base[: int(rng.integers(0, len(base)))])
        elif kind in (2, 3):
            b = bytearray(base)
            for _ in range(int(rng.integers(1, 6))):
                b[int(rng.integers(len(b)))] = int(rng.integers(256))
            pool.append(bytes(b))
        elif kind == 4:
            env = msgpack.unpackb(base)
            key = ["v", "type", "seq", "sender", "body"][int(rng.integers(5))]
            env[key] = [None, -1, "zz", 7, [1], {"a": 1}, 2**64 - 1][int(rng.integers(7))]
            pool.append(msgpack.packb(env))
        elif kind == 5:
            env = msgpack.unpackb(base)
            body = env["body"]
            if body:
                key = list(body)[int(rng.integers(len(body)))]
                body[key] = [None, -5, "s", b"b", [None, {"x": []}], {"k": 1.5}, True, 1e300][
                    int(rng.integers(8))
                ]
            pool.append(msgpack.packb(env))
        elif kind == 6 and i % 64 == 6:  # deep nesting costs msgpack ~1 ms: keep them rarer
            pool.append(
                msgpack.packb([[[[[[[[[[[[[[]]]]]]]]]]]]]] * 3) if i % 2 else b"\x91" * 5000
            )
        elif kind == 6:
            pool.append(b"\xdd\x7f\xff\xff\xff" + base)  # an array claiming 2 G elements
        else:
            pool.append(b"\xdf\xff\xff\xff\xff" + base)  # a map claiming 4 G entries
    return pool


def _oversized(ctx, kind, addr, prefix=()):
    """A frame over the daemon's 1 MiB limit: the transport (ZMQ_MAXMSGSIZE) drops the
    connection when the frame's header announces it, before anything is read or allocated."""
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    s.send_multipart([*prefix, b"\x00" * (2 * 1024 * 1024)])
    time.sleep(0.3)
    s.close(0)


POOL = _pool()


def _blast(sock, prefix=(), n=N_FRAMES, drain=None, chunk=2000):
    sent = 0
    while sent < n:
        for j in range(min(chunk, n - sent)):
            frame = POOL[(sent + j) % len(POOL)]
            if (sent + j) % 997 == 0:  # now and then a wrong frame count
                sock.send_multipart([*prefix, frame, b"extra"])
            else:
                sock.send_multipart([*prefix, frame])
        sent += min(chunk, n - sent)
        if drain is not None:
            drain()
    return sent


def test_controller_router_survives(cfg, ctx, client, run_daemon, wait):
    import dataclasses

    c = dataclasses.replace(cfg.controller, max_frame_bytes=1024 * 1024)
    ctl = Controller(c, cfg.security, ctx=ctx)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.ROUTING_ID, b"fuzzer")
        s.connect(router)

        def drain():
            while s.poll(0):
                s.recv()

        assert _blast(s, drain=drain) >= N_FRAMES
        _oversized(ctx, zmq.DEALER, router)
        admin = client(router, "admin")
        # (the fuzzer's socket stays open until then: closing it with linger 0 would drop its queue)
        wait(
            lambda: (
                drain()
                or sum(ctl.codec.rejected.values())
                + sum(v for k, v in ctl.counters.items() if k.startswith("rx_"))
                >= N_FRAMES
            ),
            timeout_s=120,
            what="every frame handled",
        )
        s.close(0)
        st = admin.request(MsgType.STATUS, {}, timeout_s=10, want={MsgType.ACK})
        assert st.body["ok"]
    assert sum(ctl.codec.rejected.values()) > N_FRAMES // 2


def test_analyzer_pull_and_rep_survive(cfg, ctx, client, run_daemon, wait):
    import dataclasses

    a = dataclasses.replace(cfg.analyzer, max_frame_bytes=1024 * 1024)
    an = Analyzer(a, cfg.security, ctx=ctx)
    pull, _, rep = an.bind()
    with run_daemon(an):
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(pull)
        _blast(push, n=N_FRAMES // 2)
        _oversized(ctx, zmq.PUSH, pull)
        good = Codec().encode(MsgType.PROBE_BATCH, "ok", 1, probe_batch_body("ok", empty_probes(7)))
        push.send(good)
        # garbage that stays valid adds batches of 3 records: only the good one makes it 3k + 7
        wait(
            lambda: an.counters["probe_records"] >= 7 and an.counters["probe_records"] % 3 == 1,
            timeout_s=120,
            what="the valid batch after the garbage",
        )
        push.close(0)

        d = ctx.socket(zmq.DEALER)  # a DEALER can pipeline requests into a REP socket
        d.setsockopt(zmq.LINGER, 0)
        d.connect(rep)
        answers = [0]

        def drain():
            while d.poll(0):
                d.recv_multipart()
                answers[0] += 1

        _blast(d, prefix=(b"",), n=N_FRAMES // 2, drain=drain, chunk=500)
        _oversized(ctx, zmq.DEALER, rep, prefix=(b"",))
        wait(
            lambda: drain() or answers[0] >= N_FRAMES // 2 * 0.99, timeout_s=120, what="REP answers"
        )
        d.close(0)
        req = client(rep, kind=zmq.REQ)
        env = req.request(MsgType.REPLAY, {"since": 0}, timeout_s=10)
        assert env.type is MsgType.REPLAY_REPLY
    assert an.counters["bad_batches"] + sum(an.codec.rejected.values()) > N_FRAMES // 2


class _IdleEngine:
    def __init__(self, *_a, **_k):
        self.targets = {}

    def local_address(self):
        return {"ip": "127.0.0.1", "port": 9}

    def add_target(self, dst, host, port, **kw):
        self.targets[dst] = (host, port)

    def remove_target(self, dst):
        del self.targets[dst]

    def start(self):
        pass

    def close(self):
        pass

    def drain_packed(self, max_records=None):
        return bytearray()

    def stats(self):
        return {}


def test_overlay_agent_dealer_and_sub_survive(cfg, ctx, run_daemon, wait):
    """A fake controller (ROUTER + PUB) throws garbage at a running agent. The engines are idle
    stand-ins: this test is about the agent's sockets, not probing."""
    import dataclasses

    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.SNDHWM, 0)
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 0)
    router.bind("tcp://127.0.0.1:*")
    pub.bind("tcp://127.0.0.1:*")
    acfg = dataclasses.replace(
        cfg.agent,
        name="fz",
        host="h",
        job="j",
        container="c",
        endpoints=(EndpointSpec(rail=0, ip="127.0.0.1"),),
        controller=router.getsockopt_string(zmq.LAST_ENDPOINT),
        controller_pub=pub.getsockopt_string(zmq.LAST_ENDPOINT),
        analyzer="tcp://127.0.0.1:9",
        request_timeout_s=0.2,
        hwm=N_FRAMES,
    )
    agent = OverlayAgent(acfg, cfg.security, ctx=ctx, engine_factory=lambda s, c: _IdleEngine())
    codec = Codec()
    try:
        with run_daemon(agent):
            assert router.poll(10_000)
            ident, _ = router.recv_multipart()
            _blast(router, prefix=(ident,), n=N_FRAMES // 2)
            _blast(pub, prefix=(job_topic("j"),), n=N_FRAMES // 2)

            def refused():
                return (
                    agent.counters["bad_controller_messages"]
                    + agent.counters["bad_topic_messages"]
                    + sum(agent.codec.rejected.values())
                )

            # wait until every frame is consumed (a valid-looking one may legitimately change state)
            def settled():
                before = refused()
                time.sleep(0.5)
                return refused() == before

            wait(settled, timeout_s=120, what="garbage consumed")
            # still alive: it registers when a valid answer finally comes
            snap = {
                "job": "j",
                "version": 1,
                "skeleton_version": 0,
                "skeleton": None,
                "endpoints": [
                    {"ep": 5, "job": "j", "container": "c", "host": "h", "rail": 0},
                    {
                        "ep": 6,
                        "job": "j",
                        "container": "d",
                        "host": "g",
                        "rail": 0,
                        "ip": "127.0.0.1",
                        "port": 10,
                        "ready": True,
                    },
                ],
            }
            ack = codec.encode(
                MsgType.REGISTER_ACK,
                "controller",
                1,
                {"epoch": "E", "endpoints": [5], "heartbeat_interval_s": 0.2, "snapshots": [snap]},
            )

            def registered():
                router.send_multipart([ident, ack])
                time.sleep(0.1)
                return agent.epoch == "E"

            wait(registered, timeout_s=120, what="agent registered after the garbage")
            assert agent.ping_lists()["lists"] == {"5": [6]}
    finally:
        router.close(0)
        pub.close(0)
    assert (
        agent.counters["bad_controller_messages"]
        + agent.counters["bad_topic_messages"]
        + sum(agent.codec.rejected.values())
        > N_FRAMES // 2
    )
