"""The attacks of issue 14, each tried against running daemons as a tenant would (its sidecar's
key in hand), and judged by state: what the attack asked for must not have happened.

Two tenants: ``tenant-a`` (job ``ja``, container ``ca`` on host ``h0``) and ``tenant-b`` (job
``jb``, container ``cb`` on ``h1``); one underlay agent per host; an operator (``admin``).
"""

import dataclasses
import itertools
import json
import math
import time
import tracemalloc

import numpy as np
import pytest
import zmq
import zmq.auth

from skh.errors import ProtocolError
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.controller import Controller
from skh.records import empty_probes
from skh.wire import Codec, MsgType, job_topic, pack_pairs, probe_batch_body


def _ep(job, container, rail, ip="10.0.0.1", port=7000):
    return {"job": job, "container": container, "rail": rail, "ip": ip, "port": port}


@pytest.fixture
def cluster(cfg, ctx, client, run_daemon, keyring, wait):
    """A running controller with both tenants' jobs submitted, both underlay agents and
    tenant-b's sidecar registered and ready. Yields (controller, connect(name) -> Client)."""
    server, keys = keyring
    # the test's agents do not heartbeat: they stay alive for the test's length
    ctl = Controller(dataclasses.replace(cfg.controller, heartbeat_interval_s=60), server, ctx=ctx)
    router, pub = ctl.bind()

    made = itertools.count()

    def connect(name, routing_id=None):
        # routing ids are the ROUTER's business: a client that picks one picks a unique one
        return client(router, routing_id or f"{name}.{next(made)}", security=keys[name])

    with run_daemon(ctl):
        admin = connect("admin")
        for job, c, host in (("ja", "ca", "h0"), ("jb", "cb", "h1")):
            env = admin.request(
                MsgType.SUBMIT_JOB,
                {"job": job, "containers": [{"name": c, "host": host, "rails": [0, 1]}]},
                want={MsgType.ACK},
            )
            assert env.body["ok"], env.body
        agents = {}
        for host in ("h0", "h1"):
            ul = connect(f"ul-{host}")
            env = ul.request(
                MsgType.REGISTER,
                {"agent": f"ul-{host}", "role": "underlay", "host": host, "endpoints": []},
                want={MsgType.REGISTER_ACK},
            )
            agents[f"ul-{host}"] = ul
        b = connect("tenant-b")
        ack = b.request(
            MsgType.REGISTER,
            {
                "agent": "tenant-b",
                "role": "overlay",
                "host": "h1",
                "endpoints": [_ep("jb", "cb", 0, "10.0.1.2"), _ep("jb", "cb", 1, "10.0.1.3")],
            },
            want={MsgType.REGISTER_ACK},
        ).body
        assert b.request(
            MsgType.READY, {"agent": "tenant-b", "endpoints": ack["endpoints"]}, want={MsgType.ACK}
        ).body["ok"]
        agents["tenant-b"] = b
        yield ctl, connect, agents, pub


def _members(ctl, job):
    return {(i.container, i.rail): i for i in ctl.jobs[job].endpoints.values()}


def test_a_tenant_cannot_have_commands_relayed_to_another_hosts_agent(cluster):
    ctl, connect, agents, _ = cluster
    a = connect("tenant-a")
    a.send(
        MsgType.COMMAND,
        {"cmd_id": "c1", "agent": "ul-h1", "name": "overlay_state", "args": {}},
    )
    with pytest.raises(TimeoutError):
        agents["ul-h1"].recv(timeout_s=1.0, want={MsgType.COMMAND})


def test_a_tenant_cannot_register_endpoints_into_another_job_or_host(cluster):
    ctl, connect, _agents, _ = cluster
    before = {j: dict(_members(ctl, j)) for j in ("ja", "jb")}
    a = connect("tenant-a")
    for eps, host in (
        ([_ep("jb", "cb", 0, "6.6.6.6"), _ep("jb", "cx", 0, "6.6.6.6")], "h0"),  # other job
        ([_ep("ja", "ca", 0, "6.6.6.6")], "h1"),  # its own container, claimed on another host
        ([_ep("ja", "other", 0, "6.6.6.6")], "h0"),  # another container of its job
    ):
        a.request(
            MsgType.REGISTER,
            {"agent": "tenant-a", "role": "overlay", "host": host, "endpoints": eps},
            timeout_s=2,
        )
    after = {j: dict(_members(ctl, j)) for j in ("ja", "jb")}
    assert after["jb"] == before["jb"]
    assert set(after["ja"]) == set(before["ja"])
    assert all(i.host == "h0" for i in after["ja"].values())


def test_a_tenant_cannot_skeleton_remove_or_read_another_job(cluster):
    ctl, connect, _agents, _ = cluster
    a = connect("tenant-a")
    a.request(
        MsgType.APPLY_SKELETON,
        {"job": "jb", "skeleton_version": 7, "pairs": pack_pairs(np.zeros((0, 2), np.uint32))},
        timeout_s=2,
    )
    a.request(
        MsgType.APPLY_SKELETON,
        {"job": "ja", "skeleton_version": 7, "pairs": pack_pairs(np.zeros((0, 2), np.uint32))},
        timeout_s=2,
    )
    assert ctl.jobs["jb"].skeleton_version == 0 and ctl.jobs["ja"].skeleton_version == 0
    a.request(MsgType.REMOVE_JOB, {"job": "jb"}, timeout_s=2)
    assert "jb" in ctl.jobs
    st = a.request(MsgType.STATUS, {"detail": True}, timeout_s=2)
    assert "10.0.1.2" not in repr(st.body)
    snap = a.request(MsgType.SYNC, {"job": "jb"}, timeout_s=2)
    assert snap.type is not MsgType.JOB_SNAPSHOT and "10.0.1.2" not in repr(snap.body)
    hb = a.request(MsgType.HEARTBEAT, {"agent": "tenant-b", "epoch": ctl.epoch, "jobs": {}})
    assert hb.body.get("jobs", {}) == {} and not hb.body.get("known")


def test_a_tenant_cannot_take_over_another_agents_routing_id(cluster, wait):
    ctl, connect, agents, _ = cluster
    # tenant-a connects under ul-h1's and tenant-b's routing ids and registers as them
    for victim, host, eps in (
        ("ul-h1", "h1", []),
        ("tenant-b", "h1", [_ep("jb", "cb", 0, "6.6.6.6"), _ep("jb", "cb", 1, "6.6.6.6")]),
    ):
        thief = connect("tenant-a", routing_id=victim)
        thief.send(
            MsgType.REGISTER,
            {"agent": victim, "role": "overlay", "host": host, "endpoints": eps},
        )
        time.sleep(0.3)
    assert {i.ip for i in _members(ctl, "jb").values()} == {"10.0.1.2", "10.0.1.3"}
    assert ctl.agents["ul-h1"].role == "underlay"
    # a command the operator has relayed to ul-h1 still reaches ul-h1, not the thief
    admin = connect("admin")
    admin.send(MsgType.COMMAND, {"cmd_id": "s1", "agent": "ul-h1", "name": "stats", "args": {}})
    got = agents["ul-h1"].recv(timeout_s=3, want={MsgType.COMMAND})
    assert got.body["cmd_id"].endswith("s1")


def test_a_tenant_cannot_hear_another_jobs_topic(cluster, ctx, keyring):
    ctl, connect, agents, pub = cluster
    _server, keys = keyring
    spy = ctx.socket(zmq.SUB)
    spy.setsockopt(zmq.LINGER, 0)
    keys["tenant-a"].client(spy)
    spy.setsockopt(zmq.SUBSCRIBE, job_topic("jb"))
    spy.setsockopt(zmq.SUBSCRIBE, b"")
    spy.connect(pub)
    time.sleep(0.5)
    b = agents["tenant-b"]
    b.request(MsgType.DEREGISTER, {"agent": "tenant-b"}, want={MsgType.ACK})
    heard = []
    while spy.poll(1000):
        heard.append(spy.recv_multipart())
    spy.close(0)
    assert not [f for f in heard if f[0] == job_topic("jb")]


class _Recorder:
    def __init__(self):
        self.probes = []
        self.beats = []

    def on_round(self, probes, counters, now_ns):
        if probes.size:
            self.probes.append(probes)
        return []

    def on_heartbeat(self, eps, t_ns):
        self.beats.append(np.asarray(eps))


def test_the_analyzer_takes_results_and_heartbeats_only_for_the_senders_endpoints(
    cluster, cfg, ctx, keyring, run_daemon, wait
):
    ctl, connect, _agents, _ = cluster
    server, keys = keyring
    a = connect("tenant-a")
    ack = a.request(
        MsgType.REGISTER,
        {
            "agent": "tenant-a",
            "role": "overlay",
            "host": "h0",
            "endpoints": [_ep("ja", "ca", 0, "10.0.0.2"), _ep("ja", "ca", 1, "10.0.0.3")],
        },
        want={MsgType.REGISTER_ACK},
    ).body
    mine = ack["endpoints"]
    theirs = sorted(i.ep for i in ctl.jobs["jb"].endpoints.values())
    an_sec = _analyzer_security(keyring)
    acfg = dataclasses.replace(cfg.analyzer, controller=ctl.endpoint)
    rec = _Recorder()
    an = Analyzer(acfg, an_sec, ctx=ctx, hook=rec)
    pull, _alerts, _rep = an.bind()
    with run_daemon(an):
        tenant_key = zmq.auth.load_certificate(keys["tenant-a"].client_secret_key)[0].decode()
        wait(lambda: an.policy.owned(tenant_key).size == 2, what="the key mirror")
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        keys["tenant-a"].client(push)
        push.connect(pull)
        codec = Codec()

        def batch(src, dst, eps, n=1000):
            r = empty_probes(n)
            r["src_ep"], r["dst_ep"], r["status"] = src, dst, 2
            return codec.encode(
                MsgType.PROBE_BATCH, "tenant-a", 1, probe_batch_body("tenant-a", r, eps)
            )

        # forged: another tenant's endpoints as sources, and heartbeats for a thousand endpoints
        push.send(batch(theirs[0], theirs[1], list(range(1000))))
        push.send(batch(mine[0], theirs[0], theirs))
        # the sender's own results (the marker the wait looks for)
        push.send(batch(mine[0], mine[1], mine, n=7))
        wait(lambda: any(p.size == 7 for p in rec.probes), timeout_s=15, what="own results")
        push.close(0)
    got = np.concatenate(rec.probes)
    assert set(got["src_ep"].tolist()) <= set(mine)
    assert set(got["dst_ep"].tolist()) <= set(mine)
    beats = set(np.concatenate(rec.beats).tolist()) if rec.beats else set()
    assert beats <= set(mine)


def test_huge_fields_neither_crash_the_controller_nor_get_stored(cluster):
    ctl, connect, _agents, _ = cluster
    a = connect("tenant-a")
    gid = "f" * (9 * 1024 * 1024)
    for _ in range(2):
        a.send(
            MsgType.REGISTER,
            {
                "agent": "tenant-a",
                "role": "overlay",
                "host": "h0",
                "endpoints": [{**_ep("ja", "ca", 0), "gid": gid}],
            },
        )
    admin = connect("admin")
    st = admin.request(MsgType.STATUS, {"detail": True}, timeout_s=5, want={MsgType.ACK})
    assert st.body["ok"]
    assert all(len(i.gid) < 1024 for i in ctl.jobs["ja"].endpoints.values())


def test_a_register_with_one_bad_endpoint_stores_none_of_them(cluster):
    ctl, connect, _agents, _ = cluster
    a = connect("tenant-a")
    before = {(i.container, i.rail, i.ip) for i in ctl.jobs["ja"].endpoints.values()}
    env = a.request(
        MsgType.REGISTER,
        {
            "agent": "tenant-a",
            "role": "overlay",
            "host": "h0",
            "endpoints": [_ep("ja", "ca", 0, "10.9.9.9"), {**_ep("ja", "ca", 1), "rail": 999}],
        },
        timeout_s=2,
    )
    assert env.type is MsgType.ACK and not env.body["ok"]
    after = {(i.container, i.rail, i.ip) for i in ctl.jobs["ja"].endpoints.values()}
    assert after == before


def _realistic_member(i):
    return {
        "job": f"big{i // 20000}",
        "container": f"pod-{i // 8:05d}",
        "rail": i % 8,
        "ip": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
        "port": 4791,
        "gid": f"0000:0000:0000:0000:0000:ffff:0a{i >> 16 & 255:02x}:{i & 0xFFFF:04x}",
        "qpn": 100_000 + i,
        "netdev": f"eth{i % 8}",
    }


def test_a_detailed_status_of_80k_endpoints_is_paged_not_fatal(cfg, ctx, client, run_daemon):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    for i in range(80_000):
        ctl._upsert(_realistic_member(i), f"host{i // 8}", f"agent-{i // 8}")
    ctl.registry.commit()
    router, _ = ctl.bind()
    with run_daemon(ctl):
        admin = client(router, "admin")
        st = admin.request(MsgType.STATUS, {"detail": True}, timeout_s=20, want={MsgType.ACK})
        assert st.body["ok"]
        seen, after = 0, -1
        while True:
            page = admin.request(
                MsgType.MEMBERS, {"after": after}, timeout_s=20, want={MsgType.ACK}
            ).body["data"]
            seen += len(page["members"])
            if page["next"] is None:
                break
            after = page["next"]
        assert seen == 80_000


def test_a_replay_of_ten_thousand_large_alerts_is_paged_not_fatal(cfg, ctx, client, run_daemon):
    # the log as ten thousand appends would have left it (without 10,000 fsyncs in a test)
    with open(cfg.analyzer.alert_log, "w") as f:
        for i in range(10_000):
            alert = {"kind": "fault", "state": "event", "alert_id": f"a{i}", "pad": "x" * 2000}
            f.write(json.dumps({"seq": i + 1, "ts_ns": i, "alert": alert}) + "\n")
    an = Analyzer(cfg.analyzer, cfg.security, ctx=ctx)
    _pull, _alerts, rep = an.bind()
    with run_daemon(an):
        req = client(rep, kind=zmq.REQ)
        last, got = 0, 0
        while last < 10_000:
            env = req.request(MsgType.REPLAY, {"since": last}, timeout_s=10)
            assert env.type is MsgType.REPLAY_REPLY
            recs = env.body["alerts"]
            assert recs and recs[0]["seq"] == last + 1
            got += len(recs)
            last = recs[-1]["seq"]
        assert got == 10_000


def _bomb_empty_maps(size):
    n = size - 5
    return b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n


def _bomb_nested_lengths(levels, n, size):
    # every level announces n elements that never follow (one padding blob, then the frame
    # ends): a decoder that allocates what a header announces allocates levels x n slots
    head = (b"\xdd" + n.to_bytes(4, "big")) * levels
    pad = size - len(head) - 5
    return head + b"\xc6" + pad.to_bytes(4, "big") + b"\0" * pad


@pytest.mark.parametrize(
    "frame",
    [
        _bomb_empty_maps(16 * 1024 * 1024 - 64),
        _bomb_nested_lengths(16, 2_000_000, 15 * 1024 * 1024),
    ],
    ids=["empty-maps", "nested-lengths"],
)
def test_a_blow_up_frame_is_refused_within_bounded_time_and_memory(frame):
    codec = Codec()
    t0 = time.monotonic()
    with pytest.raises(ProtocolError):
        codec.decode(frame)
    took = time.monotonic() - t0
    tracemalloc.start()
    with pytest.raises(ProtocolError):
        codec.decode(frame)
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 100 * 1024 * 1024, peak
    assert took < 2.0
    # a sender a daemon gives a small budget costs it far less
    t0 = time.monotonic()
    with pytest.raises(ProtocolError):
        codec.decode(frame, max_elements=65_536)
    assert time.monotonic() - t0 < 0.5


def test_daemon_sockets_refuse_oversized_frames_before_reading_them(cfg, ctx, run_daemon):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    an = Analyzer(cfg.analyzer, cfg.security, ctx=ctx)
    try:
        for s in (ctl.router, an.pull, an.rep):
            assert 0 < s.getsockopt(zmq.MAXMSGSIZE) <= cfg.controller.max_frame_bytes
    finally:
        ctl.close()
        an.close()


def test_command_timeouts_retries_and_arguments_are_checked_and_pending_work_bounded(cluster, wait):
    ctl, connect, agents, _ = cluster
    admin = connect("admin")
    ul = agents["ul-h0"]
    bad = [
        {"timeout_s": 0},
        {"timeout_s": -1.0},
        {"timeout_s": math.nan},
        {"timeout_s": math.inf},
        {"timeout_s": 1e9},
        {"retries": 10**6},
        {"retries": -3},
    ]
    for i, extra in enumerate(bad):
        admin.send(
            MsgType.COMMAND,
            {"cmd_id": f"b{i}", "agent": "ul-h0", "name": "stats", "args": {}, **extra},
        )
    for i, args in enumerate(
        [
            {"dst": "10.0.0.2", "netns": "../../proc/1/ns/net"},
            {"dst": "10.0.0.2", "netns": "/var/run/netns/other"},
            {"dst": "-f/etc/passwd"},
        ]
    ):
        admin.send(
            MsgType.COMMAND,
            {"cmd_id": f"t{i}", "agent": "ul-h0", "name": "traceroute", "args": args},
        )
    admin.send(
        MsgType.COMMAND,
        {"cmd_id": "d0", "agent": "ul-h0", "name": "dump_flows", "args": {"bridge": "--help"}},
    )
    with pytest.raises(TimeoutError):
        ul.recv(timeout_s=1.5, want={MsgType.COMMAND})
    # a flood of valid commands to an agent that never answers: the table stays bounded
    for i in range(20_000):
        admin.send(
            MsgType.COMMAND,
            {"cmd_id": f"f{i}", "agent": "ul-h0", "name": "stats", "args": {}, "timeout_s": 30},
        )
    wait(
        lambda: ctl.counters["commands"] + ctl.counters["commands_dropped"] >= 20_000,
        timeout_s=60,
        what="every command handled",
    )
    assert len(ctl._pending) <= 4096
    assert ctl.counters["commands_dropped"] > 0


def test_a_command_id_reused_by_another_requester_is_not_lost(cluster):
    ctl, connect, agents, _ = cluster
    ul = agents["ul-h0"]
    first, second = connect("admin"), connect("admin")
    for who in (first, second):
        who.send(
            MsgType.COMMAND,
            {"cmd_id": "same", "agent": "ul-h0", "name": "stats", "args": {}, "timeout_s": 5},
        )
    cmds = [ul.recv(timeout_s=3, want={MsgType.COMMAND}) for _ in range(2)]
    for c in cmds:
        ul.send(MsgType.COMMAND_REPLY, {"cmd_id": c.body["cmd_id"], "ok": True, "result": 1})
    for who in (first, second):
        rep = who.recv(timeout_s=3, want={MsgType.COMMAND_REPLY})
        assert rep.body["cmd_id"] == "same" and rep.body["ok"]


def _analyzer_security(keyring):
    server, keys = keyring
    return dataclasses.replace(
        server,
        client_secret_key=keys["analyzer"].client_secret_key,
        server_public_key=keys["analyzer"].server_public_key,
    )


def test_the_analyzer_refuses_replay_to_tenants(cluster, cfg, ctx, keyring, client, run_daemon):
    _server, keys = keyring
    ctl = cluster[0]
    acfg = dataclasses.replace(cfg.analyzer, controller=ctl.endpoint)
    an = Analyzer(acfg, _analyzer_security(keyring), ctx=ctx)
    an.publish({"kind": "fault", "state": "open", "alert_id": "x", "job": "jb"})
    _pull, _alerts, rep = an.bind()
    with run_daemon(an):
        tenant = client(rep, kind=zmq.REQ, security=keys["tenant-a"])
        env = tenant.request(MsgType.REPLAY, {"since": 0}, timeout_s=5)
        assert env.type is MsgType.ACK and not env.body["ok"]
        bridge = client(rep, kind=zmq.REQ, security=keys["alerts-bridge"])
        env = bridge.request(MsgType.REPLAY, {"since": 0}, timeout_s=5)
        assert env.type is MsgType.REPLAY_REPLY and len(env.body["alerts"]) == 1
