"""The authorization gate: every request the controller and the analyzer handle passes their
policy first, with its sender as the transport proves it (the ROUTER routing id, the CURVE key
from ZAP's ``User-Id``); a refused request changes nothing, is answered with a failed ACK (a
pushed batch is dropped) and is counted."""

import dataclasses

import pytest
import zmq
import zmq.auth

from skh.errors import Unauthorized
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.authz import AllowAll, Principal
from skh.orchestrator.controller import Controller
from skh.orchestrator.security import SecurityConfig, generate_keypair
from skh.records import empty_probes
from skh.wire import Codec, MsgType, probe_batch_body


class Recording(AllowAll):
    """Allows what AllowAll allows, except the refused message types; remembers every call."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.seen: list[tuple[Principal, MsgType]] = []

    def authorize(self, who, env):
        self.seen.append((who, env.type))
        if env.type in self.refuse:
            raise Unauthorized(f"{env.type.value} is not for {who.routing_id!r}")


@pytest.fixture
def curve(tmp_path):
    """Server keys, and one authorized client key (its Z85 public key alongside)."""
    generate_keypair(tmp_path, "server")
    generate_keypair(tmp_path / "clients", "tenant", metadata={"role": "admin"})
    sec = SecurityConfig(
        server_secret_key=str(tmp_path / "server.key_secret"),
        server_public_key=str(tmp_path / "server.key"),
        client_secret_key=str(tmp_path / "clients" / "tenant.key_secret"),
        authorized_keys_dir=str(tmp_path / "clients"),
    )
    public, _ = zmq.auth.load_certificate(sec.client_secret_key)
    return sec, public.decode()


def test_controller_requests_reach_the_policy_with_routing_id_and_curve_key(
    cfg, ctx, client, run_daemon, curve
):
    sec, public = curve
    policy = Recording()
    ctl = Controller(cfg.controller, sec, ctx=ctx, policy=policy)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        a = client(router, "agent-a", security=sec)
        env = a.request(
            MsgType.REGISTER,
            {"agent": "agent-a", "role": "overlay", "host": "h0", "endpoints": []},
            want={MsgType.REGISTER_ACK},
        )
        assert env.body["endpoints"] == []
        a.request(MsgType.STATUS, {}, want={MsgType.ACK})
    assert policy.seen == [
        (Principal(b"agent-a", public), MsgType.REGISTER),
        (Principal(b"agent-a", public), MsgType.STATUS),
    ]


def test_a_request_the_controller_policy_refuses_changes_nothing(cfg, ctx, client, run_daemon):
    policy = Recording(refuse={MsgType.SUBMIT_JOB})
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx, policy=policy)
    router, _ = ctl.bind()
    with run_daemon(ctl):
        c = client(router, "tenant")
        seq = c.send(
            MsgType.SUBMIT_JOB,
            {"job": "j", "containers": [{"name": "c0", "host": "h0", "rails": [0]}]},
        )
        env = c.recv(want={MsgType.ACK})
        assert env.body == {
            "ok": False,
            "error": "submit_job is not for b'tenant'",
            "re": seq,
        }
        env = c.request(MsgType.STATUS, {}, want={MsgType.ACK})
        assert env.body["ok"] and env.body["data"]["jobs"] == {}
    assert ctl.counters["unauthorized"] == 1
    assert "jobs_submitted" not in ctl.counters
    # an insecure link has no ZAP User-Id: the principal carries the routing id only
    assert [who for who, _ in policy.seen] == [Principal(b"tenant", "")] * 2


def test_analyzer_batches_and_requests_pass_its_policy(cfg, ctx, client, run_daemon, wait, curve):
    sec, public = curve
    policy = Recording(refuse={MsgType.PROBE_BATCH, MsgType.REPLAY})
    a = dataclasses.replace(cfg.analyzer, detector="none")
    an = Analyzer(a, sec, ctx=ctx, policy=policy)
    pull, _, rep = an.bind()
    codec = Codec()
    with run_daemon(an):
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        sec.client(push)
        push.connect(pull)
        push.send(codec.encode(MsgType.PROBE_BATCH, "x", 1, probe_batch_body("x", empty_probes(5))))
        wait(lambda: an.counters["unauthorized"] == 1, what="the refused batch")
        req = client(rep, kind=zmq.REQ, security=sec)
        env = req.request(MsgType.REPLAY, {"since": 0})
        assert env.type is MsgType.ACK and not env.body["ok"]
        assert env.body["error"] == "replay is not for b''"
        env = req.request(MsgType.STATUS, {})
        assert env.body["ok"]
        push.close(0)
    assert an.counters["probe_records"] == 0 and "batches" not in an.counters
    assert an.counters["unauthorized"] == 2
    # PULL and REP carry no routing id: the CURVE key is the sender
    assert policy.seen == [
        (Principal(b"", public), MsgType.PROBE_BATCH),
        (Principal(b"", public), MsgType.REPLAY),
        (Principal(b"", public), MsgType.STATUS),
    ]
