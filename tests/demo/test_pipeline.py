"""The analyzer's pipeline without daemons: counter binning, configuration, alert life cycle,
and the whole pipeline over the simulator (``skh demo --sim``)."""

from __future__ import annotations

import numpy as np
import pytest

from skh.errors import ConfigError
from skh.model import Fabric
from skh.orchestrator.pipeline import CounterHistory, PipelineConfig
from skh.records import empty_counters


def _rows(ep: int, t_s: list[float], total: list[int]) -> np.ndarray:
    r = empty_counters(len(t_s))
    r["ep"] = ep
    r["t_ns"] = [int(t * 1e9) for t in t_s]
    r["tx_bytes"] = total
    return r


def test_counter_bins_put_a_burst_in_the_same_second_whatever_the_sampling_phase():
    h = CounterHistory(300)
    # a 1000-byte burst at t = 12.0 s; host A samples at x.3, host B at x.9
    h.add(_rows(0, [10.3, 11.3, 12.3, 13.3, 14.3], [0, 0, 1000, 1000, 1000]))
    h.add(_rows(1, [10.9, 11.9, 12.9, 13.9, 14.9], [0, 0, 1000, 1000, 1000]))
    x = h.rates(np.array([0, 1]))
    # bin s holds the interval closing in second s: seconds 11..14 on both
    assert h.span_s(np.array([0, 1])) == x.shape[1] == 4
    assert x.tolist() == [[0.0, 1000.0, 0.0, 0.0], [0.0, 1000.0, 0.0, 0.0]]
    # an endpoint without samples has no span
    assert h.span_s(np.array([0, 7])) == 0.0


def test_pipeline_config_is_checked_at_the_boundary():
    fab = Fabric.from_params(hosts=2, rnics_per_host=1).to_mapping()
    cfg = PipelineConfig.from_mapping(
        {
            "fabric": fab,
            "detector": {
                "window_s": 4.0,
                "hop_s": 2.0,
                "latency_sample_s": 0.25,
                "fast": {"loss_count": 3},
            },
        }
    )
    assert cfg.detector.window_s == 4.0 and cfg.detector.fast.loss_count == 3
    with pytest.raises(ConfigError, match="unknown pipeline setting"):
        PipelineConfig.from_mapping({"fabric": fab, "nope": 1})
    with pytest.raises(ConfigError, match="detector.fast"):
        PipelineConfig.from_mapping({"fabric": fab, "detector": {"fast": {"nope": 1}}})
    with pytest.raises(ConfigError, match="fabric"):
        PipelineConfig.from_mapping({})
    with pytest.raises(ConfigError, match="resolve_after_s"):
        PipelineConfig(fabric=fab, resolve_after_s=0)


def test_the_pipeline_over_the_simulator_catches_localizes_and_resolves_each_fault():
    from skh.demo.simmode import SCRIPT, simulate

    res = simulate(seed=1, say=lambda _m: None)
    assert len(res["outcomes"]) == len(SCRIPT)
    for o in res["outcomes"]:
        assert o.detected is not None, o.truth
        assert o.resolved is not None and o.resolved["ts_ns"] > o.cleared_ns, o.truth
        # one open alert per fault while it lasts, however many rounds confirm it
        assert (
            sum(
                a.get("alert_id") == o.detected["alert_id"] and a.get("state") == "open"
                for a in res["alerts"]
            )
            == 1
        )
    # skeletons replaced the preload lists of the jobs whose traffic fits one, and cover what is
    # used
    confident = [j for j, s in res["skeletons"].items() if s["mode"] == "skeleton"]
    assert confident
    for j in confident:
        s = res["skeletons"][j]
        assert set(map(tuple, s["truth"])) <= set(map(tuple, s["applied"]))


class _FakeClient:
    """Answers relayed commands from a table; records what was asked."""

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def commands(self, calls, *, timeout_s):
        out = []
        for agent, name, args in calls:
            self.asked.append((agent, name, dict(args)))
            out.append(self.answers(agent, name, args))
        return out


def test_agent_state_source_turns_agent_answers_into_localizer_input():
    from skh.model import Cluster, JobShape
    from skh.orchestrator.pipeline import AgentStateSource
    from skh.testbed import JobSpec, Testbed, TestbedSpec

    tb = Testbed(
        TestbedSpec(
            hosts=2,
            rnics_per_host=1,
            hosts_per_segment=2,
            spines=1,
            containers_per_host=1,
            jobs=(JobSpec("j", JobShape(tp=1, pp=1, dp=2)),),
        ),
        prefix="skhu",
    )
    cluster: Cluster = tb.cluster()
    a, b = cluster.endpoints
    ra, rb = cluster.fabric.rnic(a.host, 0), cluster.fabric.rnic(b.host, 0)
    tor = ra.tor
    gw = next(ip for ip, node in tb.ip_owners().items() if node == tor)

    def answers(agent, name, args):
        if name == "traceroute":
            hops = [
                {"ttl": 1, "addr": gw, "rtt_ms": [0.1], "icmp": "time-exceeded"},
                {"ttl": 2, "addr": args["dst"], "rtt_ms": [5.2], "icmp": "unreachable", "code": 3},
            ]
            return {
                "ok": True,
                "result": {"trace": {"dst": args["dst"], "reached": True, "hops": hops}},
            }
        if name == "host_report":
            return {"ok": True, "result": {"rnic_state": {"0": "up"}, "peer_down": [0]}}
        if name == "rnic_flows":
            rule = {"match": {"out_port": "rnic0"}, "actions": ["output:rnic0"], "priority": 1}
            return {"ok": True, "result": {"expected": [rule], "offloaded": []}}
        if name == "overlay_state":
            return {"ok": False, "error": "unknown command"}
        raise AssertionError(name)

    cfg = PipelineConfig(
        fabric=cluster.fabric.to_mapping(),
        addr_owner=tb.ip_owners(),
        host_agents={a.host: "ul-a", b.host: "ul-b"},
        vf_devices={e.name: tb.representor(e)[1] for e in cluster.endpoints},
    )
    client = _FakeClient(answers)
    src = AgentStateSource(client, cluster, cfg)
    t = src.traceroute((a.ep_id, b.ep_id), 0)
    assert t.nodes == (ra.key, tor, rb.key) and t.reached
    # ICMP answers' round trips are control-plane noise, not forwarding delay: not given to the vote
    assert t.hop_rtt_ns == ()
    assert client.asked[0] == (
        "ul-a",
        "traceroute",
        {
            "dst": rb.ip,
            "src": ra.ip,
            "sport": client.asked[0][2]["sport"],
            "dport": 33434,
            "max_ttl": 6,
        },
    )
    # one trace per RNIC pair and path id: asked again, answered from the cache
    src.traceroute((a.ep_id, b.ep_id), 0)
    assert sum(n == "traceroute" for _a, n, _x in client.asked) == 1
    rep = src.host_report(b.host)
    assert rep.peer_down == frozenset({0}) and rep.rnic_state == {0: "up"}
    # a real agent reads port state only: every flag only the simulator models is unknown,
    # never "healthy"
    assert rep.known("peer_down") and rep.known("rnic_state")
    assert not rep.known("bond_degraded") and not rep.known("gid_changed")
    assert src.overlay_tables(b.host) is None  # a failed command is no evidence, not a crash
    diff = src.flow_tables(a.host, 0).diff()
    assert len(diff.missing) == 1 and not diff.stale


def test_an_event_on_the_reverse_of_an_alerted_pair_confirms_that_alert():
    # a probe and its reply cross both directions: (b, a) failing next to an open alert on
    # (a, b) is the same fault, not a new one for the localizer to pin on something else
    from types import SimpleNamespace

    from skh.orchestrator.pipeline import Pipeline

    fab = Fabric.from_params(hosts=2, rnics_per_host=1).to_mapping()
    p = Pipeline(
        PipelineConfig(fabric=fab), source_factory=lambda _c: None, apply_skeleton=lambda *_a: True
    )
    p._watch[("overlay", "host0/vtep:vx0", 20)] = ({(1, 3)}, set())
    reverse = SimpleNamespace(pairs=[(3, 1)], endpoints=[])
    other = SimpleNamespace(pairs=[(3, 1), (2, 3)], endpoints=[])
    assert p._unexplained([reverse, other]) == [other]
