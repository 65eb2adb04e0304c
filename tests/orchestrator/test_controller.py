"""The controller in-process: registration and readiness announced once on the job topic,
preload at job submission, skeletons, commands relayed with replies, retries and timeouts, agents
lost by missed heartbeats, and a registry that survives a restart."""

import time

import numpy as np
import zmq

from skh.orchestrator.controller import Controller
from skh.orchestrator.pinglist import page_records
from skh.wire import MsgType, job_topic, pack_pairs


def _ep(job, container, rail, port):
    return {"job": job, "container": container, "rail": rail, "ip": "127.0.0.1", "port": port}


def _register(c, name, host, eps, role="overlay"):
    env = c.request(
        MsgType.REGISTER,
        {"agent": name, "role": role, "host": host, "endpoints": eps},
        want={MsgType.REGISTER_ACK},
    )
    return env.body


def _sub(ctx, addr, job):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, job_topic(job))
    s.connect(addr)
    return s


def test_register_ready_announce_once_and_snapshot(cfg, ctx, client, run_daemon, wait):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    with run_daemon(ctl):
        sub = _sub(ctx, pub, "j")
        other = _sub(ctx, pub, "j2")  # a job whose name extends "j" hears nothing of "j"
        a = client(router, "a")
        ack = _register(a, "a", "h0", [_ep("j", "c0", 0, 1000), _ep("j", "c0", 1, 1001)])
        # the job's snapshot is not in the answer (its cost would grow with the job): SYNC
        assert ack["endpoints"] == [0, 1] and ack["snapshots"] == []
        time.sleep(0.3)  # let the subscriptions reach the PUB socket (ZeroMQ's slow joiner)
        a.send(MsgType.READY, {"agent": "a", "endpoints": [0, 1]})
        assert sub.poll(5000)
        topic, raw = sub.recv_multipart()
        env = a.codec.decode(raw)
        assert topic == job_topic("j") and env.type is MsgType.READY_ANNOUNCE
        assert sorted(e["ep"] for e in env.body["endpoints"]) == [0, 1]
        assert not other.poll(200)
        # a second agent registering reads a snapshot with the first one's readiness
        b = client(router, "b")
        assert _register(b, "b", "h1", [_ep("j", "c1", 0, 2000)])["snapshots"] == []
        snap = b.request(MsgType.SYNC, {"job": "j"}, want={MsgType.JOB_SNAPSHOT}).body
        assert snap["version"] == 1 and snap["next"] is None
        got = page_records(snap["records"])
        assert {e["ep"]: e["ready"] for e in got} == {0: True, 1: True, 2: False}
        # ready of someone else's endpoint is refused
        env = b.request(MsgType.READY, {"agent": "b", "endpoints": [0]}, want={MsgType.ACK})
        assert not env.body["ok"]
        sub.close(0)
        other.close(0)


def test_submit_job_preloads_and_skeleton_is_published(cfg, ctx, client, run_daemon):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    with run_daemon(ctl):
        admin = client(router, "admin")
        env = admin.request(
            MsgType.SUBMIT_JOB,
            {
                "job": "j",
                "shape": {"tp": 8, "dp": 2},
                "containers": [
                    {"name": "c0", "host": "h0", "rails": [0, 1]},
                    {"name": "c1", "host": "h1", "rails": [0, 1]},
                ],
            },
            want={MsgType.ACK},
        )
        assert env.body["ok"] and env.body["data"]["endpoints"] == {
            "j/c0/0": 0,
            "j/c0/1": 1,
            "j/c1/0": 2,
            "j/c1/1": 3,
        }
        # the agent registering later keeps the preloaded ids
        assert _register(client(router, "a"), "a", "h0", [_ep("j", "c0", 1, 5)])["endpoints"] == [1]
        sub = _sub(ctx, pub, "j")
        for attempt in range(20):
            env = admin.request(
                MsgType.APPLY_SKELETON,
                {
                    "job": "j",
                    "skeleton_version": attempt + 1,
                    "pairs": pack_pairs(np.array([[0, 2], [2, 0]])),
                },
                want={MsgType.ACK},
            )
            assert env.body["ok"], env.body
            if sub.poll(200):
                break
        env = admin.codec.decode(sub.recv_multipart()[1])
        assert env.type is MsgType.SKELETON and env.body["skeleton_version"] >= 1
        bad = admin.request(
            MsgType.APPLY_SKELETON,
            {"job": "j", "skeleton_version": 1000, "pairs": pack_pairs(np.array([[0, 77]]))},
            want={MsgType.ACK},
        )
        assert not bad.body["ok"] and "unknown" in bad.body["error"]
        sub.close(0)


def test_commands_are_relayed_retried_and_time_out(cfg, ctx, client, run_daemon):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        agent = client(router, "agent")
        _register(agent, "agent", "h0", [], role="underlay")
        admin = client(router, "admin")
        admin.send(
            MsgType.COMMAND,
            {
                "cmd_id": "x1",
                "agent": "agent",
                "name": "dump_flows",
                "args": {"bridge": "br0"},
                "timeout_s": 0.3,
                "retries": 1,
            },
        )
        cmd = agent.recv(want={MsgType.COMMAND})
        assert cmd.body["name"] == "dump_flows" and cmd.body["args"] == {"bridge": "br0"}
        # the agent sees the controller's own id for the command (requesters may pick the same)
        assert cmd.body["cmd_id"].endswith(".x1")
        agent.send(
            MsgType.COMMAND_REPLY,
            {"cmd_id": cmd.body["cmd_id"], "ok": True, "result": {"flows": 3}},
        )
        rep = admin.recv(want={MsgType.COMMAND_REPLY})
        assert rep.body == {"cmd_id": "x1", "ok": True, "result": {"flows": 3}}
        # a silent agent: one retry, then a timeout answer
        admin.send(
            MsgType.COMMAND,
            {
                "cmd_id": "x2",
                "agent": "agent",
                "name": "traceroute",
                "args": {"dst": "10.0.0.2"},
                "timeout_s": 0.3,
                "retries": 1,
            },
        )
        first = agent.recv(want={MsgType.COMMAND})
        again = agent.recv(want={MsgType.COMMAND})
        assert first.body["cmd_id"] == again.body["cmd_id"] and first.body["cmd_id"].endswith(".x2")
        rep = admin.recv(want={MsgType.COMMAND_REPLY})
        assert not rep.body["ok"] and "timeout after 2" in rep.body["error"]
        rep = admin.request(
            MsgType.COMMAND,
            {"cmd_id": "x3", "agent": "ghost", "name": "stats", "args": {}},
            want={MsgType.COMMAND_REPLY},
        )
        assert not rep.body["ok"]


def test_missed_heartbeats_mark_an_agent_lost_and_restart_keeps_the_registry(
    cfg, ctx, client, run_daemon, wait
):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        a = client(router, "a")
        ack = _register(a, "a", "h0", [_ep("j", "c0", 0, 1000)])
        a.request(MsgType.READY, {"agent": "a", "endpoints": ack["endpoints"]}, want={MsgType.ACK})
        # the daemon thread marks the agent lost, then its endpoints down: wait for both
        wait(
            lambda: not ctl.agents["a"].alive and ctl.jobs["j"].endpoints[0].ready is False,
            timeout_s=5,
            what="agent lost and its endpoints down",
        )
        hb = a.request(
            MsgType.HEARTBEAT,
            {"agent": "a", "epoch": ack["epoch"], "jobs": {}},
            want={MsgType.HEARTBEAT_ACK},
        )
        assert hb.body["known"] is False  # so the agent re-registers
    epoch = ctl.epoch
    ctl2 = Controller(cfg.controller, cfg.security, ctx=ctx)
    assert ctl2.epoch != epoch
    assert ctl2.jobs["j"].endpoints[0].port == 1000 and "a" in ctl2.agents
    ctl2.close()


def test_a_stopping_agent_deregisters_and_its_endpoints_go_down(cfg, ctx, client, run_daemon):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    with run_daemon(ctl):
        sub = _sub(ctx, pub, "j")
        a = client(router, "a")
        ack = _register(a, "a", "h0", [_ep("j", "c0", 0, 1000)])
        time.sleep(0.3)
        a.request(MsgType.READY, {"agent": "a", "endpoints": ack["endpoints"]}, want={MsgType.ACK})
        assert a.request(MsgType.DEREGISTER, {"agent": "a"}, want={MsgType.ACK}).body["ok"]
        kinds = []
        while sub.poll(2000):
            env = a.codec.decode(sub.recv_multipart()[1])
            kinds.append((env.type, env.body.get("reason")))
            if env.type is MsgType.ENDPOINTS_DOWN:
                break
        assert kinds == [(MsgType.READY_ANNOUNCE, None), (MsgType.ENDPOINTS_DOWN, "stopped")]
        assert not ctl.agents["a"].alive and ctl.counters["agents_lost"] == 0
        sub.close(0)


def test_a_job_larger_than_a_page_is_read_in_pages(cfg, ctx, client, run_daemon):
    """A snapshot of 9,000 endpoints comes in pages (SYNC ``after``); a registering agent of
    such a job gets no snapshot in its REGISTER_ACK and asks for the pages."""
    from skh.orchestrator.admin import ControllerClient
    from skh.wire import PAGE_MAX

    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    for i in range(9000):
        ctl._upsert(_ep("big", f"c{i // 8}", i % 8, 7000 + i % 1000), f"h{i // 64}", "")
    ctl.registry.commit()
    router, _ = ctl.bind()
    with run_daemon(ctl):
        first = client(router, "x").request(
            MsgType.SYNC, {"job": "big"}, want={MsgType.JOB_SNAPSHOT}
        )
        assert first.body["records"]["n"] == PAGE_MAX and first.body["next"] is not None
        # columnar: ~20 bytes a record (a map per record took ~100)
        assert len(first.body["records"]["cols"]["ep"]) == 4 * PAGE_MAX
        with ControllerClient(router, cfg.security, ctx=ctx) as admin:
            snap = admin.snapshot("big")
            assert sorted(e["ep"] for e in snap["endpoints"]) == list(range(9000))
            members, _version = admin.members(job="big")
            assert len(members) == 9000
        a = client(router, "a")
        ack = _register(a, "a", "h0", [_ep("big", "c0", 0, 7000)])
        assert ack["endpoints"] == [0] and ack["snapshots"] == []


def test_skeletons_come_with_their_probe_plan_and_the_policy(cfg, ctx, client, run_daemon):
    """The controller plans every skeleton (link by link with its fabric) and hands the plan
    out with the ping list, in the published SKELETON and in snapshots, with the probe policy;
    a restarted controller plans the stored skeleton again."""
    import dataclasses

    from skh.model import Fabric
    from skh.probeplan import ProbePlan, ProbePolicy

    fabric = Fabric.from_params(hosts=4, rnics_per_host=1, hosts_per_segment=2, spines=2)
    # (no access-link floor: the spine links' floor is what this plan shows)
    ccfg = dataclasses.replace(
        cfg.controller, probe_budget_per_s=60.0, probe_access_link_min_per_s=0.0
    )
    ctl = Controller(ccfg, cfg.security, ctx=ctx, fabric=fabric)
    router, pub = ctl.bind()
    containers = [{"name": f"c{h}", "host": f"host{h}", "rails": [0]} for h in (0, 1, 2)]
    # 0 and 1 share a ToR; 2 is behind the spines (2 ECMP paths), and only 0 probes it
    skeleton = np.array([[0, 1], [1, 0], [0, 2]])
    with run_daemon(ctl):
        admin = client(router, "admin")
        assert admin.request(
            MsgType.SUBMIT_JOB, {"job": "j", "containers": containers}, want={MsgType.ACK}
        ).body["ok"]
        sub = _sub(ctx, pub, "j")
        time.sleep(0.3)
        env = admin.request(
            MsgType.APPLY_SKELETON,
            {"job": "j", "skeleton_version": 1, "pairs": pack_pairs(skeleton)},
            want={MsgType.ACK},
        )
        assert env.body["ok"], env.body
        assert sub.poll(5000)
        body = admin.codec.decode(sub.recv_multipart()[1]).body
        sub.close(0)
        policy = ProbePolicy.from_wire(body["probing"])
        assert (policy.budget_per_s, policy.access_link_min_per_s) == (60.0, 0.0)
        plan = ProbePlan.from_wire(body["plan"], np.unique(skeleton, axis=0), policy)
        # the pair across the spines runs at 20/s, so each spine link sees its 10/s
        assert plan.lookup(0) == {1: (0.1, 1), 2: (0.05, 8)}
        snap = admin.request(MsgType.SYNC, {"job": "j"}, want={MsgType.JOB_SNAPSHOT}).body
        assert snap["plan"] == body["plan"] and snap["probing"] == body["probing"]
        st = admin.request(MsgType.STATUS, {}, want={MsgType.ACK}).body["data"]
        assert st["probing"] == body["probing"]
    ctl.close()
    again = Controller(ccfg, cfg.security, ctx=ctx, fabric=fabric)
    assert again.jobs["j"].plan == body["plan"]
    again.close()


def _step_until(ctl, n, timeout_s=5.0):
    """Run the controller's loop until ``n`` requests were handled in one step."""
    deadline = time.monotonic() + timeout_s
    time.sleep(0.3)  # every request is queued at the ROUTER: one step takes them all
    while time.monotonic() < deadline:
        handled = ctl.step(100)
        if handled:
            assert handled == n, f"{handled} requests in one step, not {n}"
            return
    raise AssertionError("no request arrived")


def test_readiness_of_one_tick_is_one_announcement(cfg, ctx, client):
    """Three containers ready in one tick: one READY_ANNOUNCE naming all of them, one version
    step; an agent's copy built from the snapshot and that announcement matches."""
    from skh.orchestrator.pinglist import JobPingLists

    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    try:
        sub = _sub(ctx, pub, "j")
        agents = [client(router, f"a{i}") for i in range(3)]
        for i, a in enumerate(agents):
            a.send(
                MsgType.REGISTER,
                {
                    "agent": f"a{i}",
                    "role": "overlay",
                    "host": f"h{i}",
                    "endpoints": [_ep("j", f"c{i}", 0, 1000 + i), _ep("j", f"c{i}", 1, 1100 + i)],
                },
            )
        _step_until(ctl, 3)
        eps = {
            i: a.recv(want={MsgType.REGISTER_ACK}).body["endpoints"] for i, a in enumerate(agents)
        }
        agents[0].send(MsgType.SYNC, {"job": "j"})
        _step_until(ctl, 1)
        snap = agents[0].recv(want={MsgType.JOB_SNAPSHOT}).body
        assert snap["version"] == 0 and not any(e["ready"] for e in page_records(snap["records"]))
        copy = JobPingLists.from_snapshot(snap)
        time.sleep(0.2)  # the subscription reaches the PUB socket
        ctl.step(10)
        for i, a in enumerate(agents):
            a.send(MsgType.READY, {"agent": f"a{i}", "endpoints": eps[i]})
        _step_until(ctl, 3)
        assert all(a.recv(want={MsgType.ACK}).body["ok"] for a in agents)
        assert sub.poll(2000)
        _topic, raw = sub.recv_multipart()
        env = agents[0].codec.decode(raw)
        assert env.type is MsgType.READY_ANNOUNCE and env.body["version"] == 1
        assert sorted(e["ep"] for e in env.body["endpoints"]) == sorted(
            ep for v in eps.values() for ep in v
        )
        assert not sub.poll(300)  # nothing else: one announcement for the tick
        assert ctl.jobs["j"].version == 1 and ctl.registry.load()[0]["j"].version == 1
        assert copy.apply(env.type, env.body)
        for ep in ctl.jobs["j"].endpoints:
            assert copy.ping_list(ep).tolist() == ctl.jobs["j"].ping_list(ep).tolist()
        sub.close(0)
    finally:
        ctl.close()


def test_a_failed_request_keeps_the_ticks_readiness_for_its_announcement(cfg, ctx, client):
    """A request that announces the waiting readiness of its job (a skeleton) and then fails is
    undone: the readiness is announced at the end of the tick all the same, once."""
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    try:
        sub = _sub(ctx, pub, "j")
        a, admin = client(router, "a"), client(router, "admin")
        a.send(
            MsgType.REGISTER,
            {
                "agent": "a",
                "role": "overlay",
                "host": "h0",
                "endpoints": [_ep("j", "c0", 0, 1000), _ep("j", "c0", 1, 1001)],
            },
        )
        _step_until(ctl, 1)
        eps = a.recv(want={MsgType.REGISTER_ACK}).body["endpoints"]
        time.sleep(0.2)
        ctl.step(10)
        a.send(MsgType.READY, {"agent": "a", "endpoints": eps})
        # a skeleton naming an unknown endpoint: refused after the readiness was flushed
        admin.send(
            MsgType.APPLY_SKELETON,
            {"job": "j", "skeleton_version": 1, "pairs": pack_pairs(np.array([[0, 99]]))},
        )
        _step_until(ctl, 2)
        assert a.recv(want={MsgType.ACK}).body["ok"]
        assert not admin.recv(want={MsgType.ACK}).body["ok"]
        assert sub.poll(2000)
        env = a.codec.decode(sub.recv_multipart()[1])
        assert env.type is MsgType.READY_ANNOUNCE and env.body["version"] == 1
        assert sorted(e["ep"] for e in env.body["endpoints"]) == sorted(eps)
        assert not sub.poll(300)
        assert ctl.jobs["j"].version == 1 and ctl.jobs["j"].skeleton is None
        assert all(i.ready for i in ctl.jobs["j"].endpoints.values())
        sub.close(0)
    finally:
        ctl.close()
