"""The underlay agent: counter sources (netdev stats in a real namespace, RDMA sysfs counters from
a given root, IFLA_VF_STATS parsing), and the agent end to end: it resolves endpoint names through
the controller, ships 1 Hz counter batches to the analyzer and answers commands relayed by the
controller."""

import dataclasses
import os
import subprocess
import time

import pytest

from skh.orchestrator.agent_underlay import UnderlayAgent
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.config import SourceSpec
from skh.orchestrator.controller import Controller
from skh.orchestrator.counters import CounterSampler, NetdevSource, RdmaSysfsSource, parse_vf_stats
from skh.wire import MsgType

NS = f"skhorch-{os.getpid()}"


@pytest.fixture
def netns():
    """Namespace NS with veth ``va`` (10.77.0.1) whose peer ``vb`` (10.77.0.2) lives in a second
    namespace, so pings from NS really cross ``va``."""

    def ip(*a):
        subprocess.run(["ip", *a], check=True, capture_output=True)

    peer = NS + "b"
    try:
        for ns in (NS, peer):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", NS, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", peer)
        for ns, dev, addr in ((NS, "va", "10.77.0.1/30"), (peer, "vb", "10.77.0.2/30")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        yield NS
    finally:
        for ns in (NS, peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _ping(ns, n=3):
    done = subprocess.run(
        ["ip", "netns", "exec", ns, "ping", "-c", str(n), "-i", "0.2", "-W", "2", "10.77.0.2"],
        capture_output=True,
        timeout=20,
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.root
def test_netdev_source_reads_a_namespace(netns):
    sampler = CounterSampler(
        [NetdevSource("j/c/0", "va", netns), NetdevSource("j/c/1", "nope", netns)]
    )
    try:
        before = sampler.sample({"j/c/0": 3, "j/c/1": 4})
        _ping(netns)
        after = sampler.sample({"j/c/0": 3, "j/c/1": 4})
    finally:
        sampler.close()
    assert before["ep"].tolist() == after["ep"].tolist() == [3]  # a missing netdev is skipped
    assert sampler.failures == 2
    assert after["oper_up"][0] == 1
    assert after["tx_bytes"][0] - before["tx_bytes"][0] >= 3 * 98  # three echo requests (frames)
    assert after["rx_bytes"][0] - before["rx_bytes"][0] >= 3 * 98  # and their replies
    assert after["t_ns"][0] > before["t_ns"][0]


def test_rdma_sysfs_source_from_a_root(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (port / "state").write_text("4: ACTIVE\n")
    for name, v in (("port_xmit_data", 100), ("port_rcv_data", 50), ("port_xmit_discards", 2)):
        (port / "counters" / name).write_text(f"{v}\n")
    (port / "hw_counters" / "out_of_buffer").write_text("7\n")
    src = RdmaSysfsSource("j/c/1", "mlx5_0", 1, str(tmp_path))
    s = src.sample(None)
    assert (s.oper_up, s.tx_bytes, s.rx_bytes, s.tx_dropped, s.rx_dropped) == (True, 400, 200, 2, 7)
    (port / "state").write_text("1: DOWN\n")
    assert src.sample(None).oper_up is False
    assert RdmaSysfsSource("j/c/1", "mlx5_9", 1, str(tmp_path)).sample(None) is None


class _Nla:
    def __init__(self, attrs=None, fields=None):
        self.attrs = attrs or {}
        self.fields = fields or {}

    def get_attr(self, name):
        v = self.attrs.get(name)
        return v[0] if isinstance(v, list) else v

    def get_attrs(self, name):
        return self.attrs.get(name, [])

    def __getitem__(self, k):
        return self.fields[k]


def test_vf_stats_parsing():
    def vf(i, tx, state=0):
        return _Nla(
            {
                "IFLA_VF_MAC": _Nla(fields={"vf": i}),
                "IFLA_VF_LINK_STATE": _Nla(fields={"link_state": state}),
                "IFLA_VF_STATS": _Nla(
                    {
                        "IFLA_VF_STATS_TX_BYTES": tx,
                        "IFLA_VF_STATS_RX_BYTES": 5,
                        "IFLA_VF_STATS_TX_DROPPED": 1,
                        "IFLA_VF_STATS_RX_DROPPED": 2,
                    }
                ),
            }
        )

    msg = _Nla({"IFLA_VFINFO_LIST": _Nla({"IFLA_VF_INFO": [vf(0, 10), vf(1, 20, state=2)]})})
    assert parse_vf_stats(msg, 0).tx_bytes == 10
    s = parse_vf_stats(msg, 1)
    assert (s.oper_up, s.tx_bytes, s.rx_bytes, s.tx_dropped, s.rx_dropped) == (False, 20, 5, 1, 2)
    assert parse_vf_stats(msg, 2) is None and parse_vf_stats(_Nla(), 0) is None


@pytest.mark.root
def test_underlay_agent_end_to_end(netns, cfg, ctx, client, run_daemon, wait):
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    an = Analyzer(cfg.analyzer, cfg.security, ctx=ctx)
    pull, _, _ = an.bind()
    seen = []
    an.hook = type("H", (), {"on_round": lambda self, p, c, t: seen.append(c.copy()) or ()})()
    ucfg = dataclasses.replace(
        cfg.agent,
        role="underlay",
        name="under-h0",
        host="h0",
        controller=router,
        controller_pub=pub,
        analyzer=pull,
        sources=(SourceSpec(endpoint="j/c0/0", kind="netdev", netdev="va", netns=netns),),
    )
    agent = UnderlayAgent(ucfg, cfg.security, ctx=ctx)
    with run_daemon(ctl), run_daemon(an), run_daemon(agent):
        wait(lambda: agent.epoch, timeout_s=10, what="underlay registered")
        assert agent.ep_ids == {}  # nobody registered j/c0/0 yet: nothing is shipped
        overlay = client(router, "ov")
        ack = overlay.request(
            MsgType.REGISTER,
            {
                "agent": "ov",
                "role": "overlay",
                "host": "h0",
                "endpoints": [
                    {"job": "j", "container": "c0", "rail": 0, "ip": "127.0.0.1", "port": 5}
                ],
            },
            want={MsgType.REGISTER_ACK},
        )
        ep = ack.body["endpoints"][0]
        wait(
            lambda: agent.ep_ids.get("j/c0/0") == ep,
            timeout_s=10,
            what="name resolved by heartbeat",
        )
        _ping(netns)
        wait(lambda: sum(c.size for c in seen) >= 2, timeout_s=15, what="counter batches")
        rows = [c for c in seen if c.size]
        assert all((c["ep"] == ep).all() for c in rows)
        assert rows[-1]["tx_bytes"][0] > 0
        admin = client(router, "admin")
        rep = admin.request(
            MsgType.COMMAND,
            {
                "cmd_id": "o1",
                "agent": "under-h0",
                "name": "overlay_state",
                "args": {"netns": netns},
                "timeout_s": 10,
            },
            timeout_s=20,
            want={MsgType.COMMAND_REPLY},
        )
        assert rep.body["ok"], rep.body
        assert "10.77.0.0" in str(rep.body["result"])  # the connected route of the veth
        rep = admin.request(
            MsgType.COMMAND,
            {"cmd_id": "o2", "agent": "under-h0", "name": "no_such", "args": {}},
            want={MsgType.COMMAND_REPLY},
        )
        assert not rep.body["ok"] and "unknown command" in rep.body["error"]


def test_an_idle_underlay_agent_turns_once_per_counter_sample(cfg, ctx, run_daemon):
    """Its loop sleeps until the next sample: a wait rounded down to whole ms woke it just
    before the sample was due and then polled without sleeping until it was (320-470 turns a
    second at 10 Hz, twice the idle CPU)."""
    ucfg = dataclasses.replace(
        cfg.agent,
        role="underlay",
        name="under-h0",
        host="h0",
        sources=(SourceSpec(endpoint="j/c0/0", kind="netdev", netdev="lo"),),
    )
    agent = UnderlayAgent(ucfg, cfg.security, ctx=ctx)
    turns = []
    tick = agent.tick
    agent.tick = lambda readable, now: turns.append(now) or tick(readable, now)
    with run_daemon(agent):
        time.sleep(2.0)
    assert ucfg.counter_hz * 1.5 <= len(turns) <= ucfg.counter_hz * 2 * 2 + 5, len(turns)


@pytest.mark.root
def test_host_report_reads_the_rnic_ports_the_analyzer_names(netns):
    from skh.orchestrator.agent_underlay import host_report

    def ip(*a):
        subprocess.run(["ip", "-n", netns, *a], check=True, capture_output=True)

    ip("link", "add", "vc", "type", "veth", "peer", "name", "vd")  # left down: the RNIC's own
    rnics = {"0": "va", "1": "vc"}
    got = host_report({"rnics": rnics, "netns": netns})
    assert {k: got[k] for k in ("rnic_state", "peer_down")} == {
        "rnic_state": {"0": "up", "1": "down"},
        "peer_down": [],
    }
    # veths have no RDMA port, but their link statistics count bad frames: read, and zero
    assert got["read"] == ["rnic_state", "peer_down", "port_down_count", "rx_errors"]
    assert got["rx_errors"] == {"0": 0, "1": 0} and "unread" not in got
    before = got["port_down_count"]["0"]
    # the far end goes dark: va stays up but loses its carrier, and its driver counts it
    subprocess.run(["ip", "-n", netns + "b", "link", "set", "vb", "down"], check=True)
    got = host_report({"rnics": rnics, "netns": netns})
    assert got["peer_down"] == [0] and got["port_down_count"]["0"] == before + 1
    empty = host_report({"rnics": {}, "netns": netns})
    assert empty["rnic_state"] == {} and empty["peer_down"] == []


def test_the_vxlan_port_to_learn_outer_ports_on_is_checked():
    from skh.errors import ConfigError
    from skh.orchestrator.config import load_config

    assert load_config(None, {}).agent.learn_vxlan_port == 4789  # watched all the time
    assert load_config(None, {"agent.learn_vxlan_port": 0}).agent.learn_vxlan_port == 0
    for bad in (70000, -1, "x"):
        with pytest.raises(ConfigError, match="learn_vxlan_port"):
            load_config(None, {"agent.learn_vxlan_port": bad})


def test_the_analyzer_reads_a_host_reports_rx_errors_and_only_what_was_read():
    from skh.orchestrator.pipeline.state_source import AgentStateSource

    reply = {
        "ok": True,
        "result": {
            "rnic_state": {"0": "up", "1": "up"},
            "rx_errors": {"0": 12},
            "read": ["rnic_state", "rx_errors"],
            "unread": {"rx_errors": {"1": "no RX error counters for 'eth1'"}},
        },
    }
    rep = AgentStateSource._report_from("h1", reply)
    assert rep.known("rx_errors") and rep.rx_errors == {0: 12} and 1 not in rep.rx_errors
    # an older agent that does not send them: unknown, never "no errors"
    old = {"ok": True, "result": {"rnic_state": {"0": "up"}, "read": ["rnic_state"]}}
    assert not AgentStateSource._report_from("h1", old).known("rx_errors")
