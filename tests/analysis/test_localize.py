"""Localization on a small hand-built world: every step, every layer, both layers at once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from skh.analysis.localize import (
    AlertTracker,
    FailureType,
    FlowRule,
    FlowTables,
    HostReport,
    Localizer,
    OverlayTables,
    Suspect,
    Trace,
    diff_flow_tables,
    failing_path_ids,
    link_name,
    vote,
    walk_overlay,
)
from skh.errors import ConfigError
from skh.model import Cluster, Container, Fabric, Job, JobShape, same_rail_pairs
from skh.records import ProbeStatus, empty_probes

F = FailureType


class World:
    """12 hosts × 2 rails, 3 segments, 2 spines; one job with one container per host.

    Implements the StateSource protocol and computes which pairs fail for injected faults.
    """

    def __init__(self) -> None:
        self.fabric = Fabric.from_params(
            hosts=12, rnics_per_host=2, hosts_per_segment=4, spines=2, cores=0
        )
        self.cluster = Cluster(self.fabric)
        self.cluster.add_job(
            Job(
                "j",
                JobShape(tp=2, dp=12),
                tuple(Container(f"c{h}", "j", f"host{h}", (0, 1)) for h in range(12)),
            )
        )
        arr = self.cluster.endpoint_arrays()
        self.pairs = [
            tuple(map(int, p)) for p in same_rail_pairs(arr["ep_id"], arr["rail"], arr["host"])
        ]
        self.down: set[str] = set()  # link names or node names that drop everything
        self.lossy: set[str] = set()  # elements that lose some packets (traces still complete)
        self.overlay_drop: dict[str, set[str]] = {}  # overlay node -> dst keys with no entry
        self.overlay_loop: tuple[str, str, str] | None = None  # (node, key, wrong next)
        self.overlay_down: set[str] = set()
        self.reports: dict[str, HostReport] = {}
        self.tables: dict[tuple[str, int], FlowTables] = {}
        self.dumps = 0

    # -- model helpers ----------------------------------------------------------------------
    def ep(self, i):
        return self.cluster.endpoints[i]

    def path(self, pair):
        a, b = self.ep(pair[0]), self.ep(pair[1])
        ra, rb = self.fabric.rnic(a.host, a.rail), self.fabric.rnic(b.host, b.rail)
        paths = self.fabric.ecmp_paths(ra, rb)
        return paths[hash((min(pair), max(pair))) % len(paths)]

    @staticmethod
    def elements(path):
        return [*path, *(link_name(x, y) for x, y in zip(path, path[1:], strict=False))]

    def vf(self, ep):
        return f"{ep.host}/vf:{ep.container}.{ep.rail}"

    # -- StateSource ---------------------------------------------------------------------------
    def traceroute(self, pair, path_id=0):
        p = self.path(pair)
        nodes = [p[0]]
        for x, y in zip(p, p[1:], strict=False):
            if link_name(x, y) in self.down or y in self.down or x in self.down:
                return Trace(pair, tuple(nodes), False)
            nodes.append(y)
        return Trace(pair, tuple(nodes), True)

    def overlay_tables(self, host):
        nh: dict[str, dict[str, str]] = {}
        for ep in self.cluster.endpoints:
            if ep.host == host:
                vf, rep = self.vf(ep), f"{host}/rep:{ep.container}.{ep.rail}"
                nh[vf] = {"*": rep}
                nh[rep] = {"*": f"{host}/ovs", ep.name: vf}
        ovs: dict[str, str] = {}
        for ep in self.cluster.endpoints:
            if ep.host == host:
                ovs[ep.name] = f"{host}/rep:{ep.container}.{ep.rail}"
            else:
                ovs[ep.name] = f"{host}/vtep{ep.rail}"
        nh[f"{host}/ovs"] = ovs
        for r in (0, 1):
            nh[f"{host}/vtep{r}"] = {
                ep.name: f"{ep.host}/vtep{r}" for ep in self.cluster.endpoints if ep.host != host
            }
            nh[f"{host}/vtep{r}"]["*"] = f"{host}/ovs"  # decapsulated traffic goes to the switch
        for node, keys in self.overlay_drop.items():
            if node in nh:
                for k in keys:
                    nh[node].pop(k, None)
                nh[node].pop("*", None) if keys == {"*"} else None
        if self.overlay_loop and self.overlay_loop[0] in nh:
            node, key, nxt = self.overlay_loop
            nh[node][key] = nxt
        return OverlayTables(
            host, nh, frozenset(n for n in self.overlay_down if n.startswith(host + "/"))
        )

    def flow_tables(self, host, rail):
        self.dumps += 1
        return self.tables.get((host, rail))

    def host_report(self, host):
        return self.reports.get(host)

    # -- ground truth of symptoms --------------------------------------------------------------
    def failing(self):
        out = []
        for p in self.pairs:
            els = set(self.elements(self.path(p)))
            if els & (self.down | self.lossy):
                out.append(p)
                continue
            a, b = self.ep(p[0]), self.ep(p[1])
            walk = walk_overlay(p, self.vf(a), b.name, self.vf(b), self.overlay_tables)
            if walk.status != "ok":
                out.append(p)
        return out

    def healthy(self, failing):
        f = set(failing)
        return np.array([p for p in self.pairs if p not in f], np.int64).reshape(-1, 2)

    def run(self, symptom="unreachable", *, extra=(), refused=(), flapping=False, loc=None):
        failing = sorted(set(self.failing()) | set(extra))
        assert failing, "the fault touched no pair"
        loc = loc or Localizer(self.cluster)
        s = Suspect(tuple(failing), symptom, 1_000, frozenset(refused), flapping)
        return loc.localize([s], self, healthy_pairs=self.healthy(failing), now_ns=2_000)


def named(v):
    """What a verdict blames: (layer, component, failure type)."""
    return (v.layer, v.component, v.failure_type)


def only(verdicts):
    assert len(verdicts) == 1, [
        (v.layer, v.component, v.failure_type.name, len(v.pairs)) for v in verdicts
    ]
    return verdicts[0]


# -- underlay ----------------------------------------------------------------------------------
def test_switch_port_down_is_the_link():
    w = World()
    w.down.add("spine1|tor0r0")
    v = only(w.run())
    assert named(v) == ("underlay", "spine1|tor0r0", F.SWITCH_PORT_DOWN)
    assert v.certain and v.severity == 3 and v.first_seen_ns == 1_000 and v.detected_at_ns == 2_000
    assert v.job == "j" and len(v.pairs) == len(w.failing())


def test_switch_offline_is_the_switch():
    w = World()
    w.down.add("spine0")
    v = only(w.run())
    assert named(v) == ("underlay", "spine0", F.SWITCH_OFFLINE)


def test_crc_and_flapping_and_congestion_on_a_link():
    for symptom, flapping, ftype in (
        ("loss", False, F.CRC_ERROR),
        ("loss", True, F.SWITCH_PORT_FLAPPING),
        ("latency", False, F.CC_ISSUE),
    ):
        w = World()
        w.lossy.add("spine1|tor1r1")
        v = only(w.run(symptom, flapping=flapping))
        assert named(v) == ("underlay", "spine1|tor1r1", ftype)


def test_access_link_down_is_what_the_rnics_report_says():
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    # no report: the switch port, the RNIC's port and an RNIC dead with its port up all fit;
    # the verdict says so (uncertain, both components, the types open) instead of guessing
    v = only(w.run())
    assert not v.certain and {v.component, *v.candidates} == {"host2:rnic0|tor0r0", "host2:rnic0"}
    assert {t for t, _p in v.type_candidates} == {
        F.SWITCH_PORT_DOWN,
        F.RNIC_PORT_DOWN,
        F.RNIC_HW_FAILURE,
        F.BOND_ERROR,
    }
    assert v.type_pending and 0 < v.type_confidence < 0.75
    # no light from the switch: its port
    w.reports["host2"] = HostReport("host2", peer_down=frozenset({0}))
    assert named(only(w.run())) == ("underlay", "host2:rnic0|tor0r0", F.SWITCH_PORT_DOWN)
    for state, ftype in (
        ("down", F.RNIC_PORT_DOWN),
        ("hw_error", F.RNIC_HW_FAILURE),
        ("flapping", F.RNIC_PORT_FLAPPING),
    ):
        w.reports["host2"] = HostReport("host2", rnic_state={0: state})
        v = only(w.run())
        assert named(v) == ("rnic", "host2:rnic0", ftype)
    # every flag read, all clear: the RNIC died with its port up (hardware or bond: one class)
    w.reports["host2"] = HostReport("host2")
    v = only(w.run())
    assert named(v)[:2] == ("rnic", "host2:rnic0") and v.certain and not v.type_pending
    assert v.failure_type in (F.RNIC_HW_FAILURE, F.BOND_ERROR)


@pytest.mark.parametrize(
    "field,value,layer,comp,ftype",
    [
        ("gid_changed", frozenset({1}), "rnic", "host5:rnic1", F.RNIC_GID_CHANGE),
        ("bond_degraded", frozenset({1}), "rnic", "host5:rnic1", F.BOND_ERROR),
        ("pcie_errors", frozenset({1}), "host", "host5", F.PCIE_NIC_ERROR),
        ("gpudirect_broken", frozenset({1}), "host", "host5", F.GPUDIRECT_RDMA_ERROR),
        ("rdma_fallback", frozenset({"c5"}), "overlay", "j/c5", F.NOT_USING_RDMA),
        ("hugepage_mismatch", True, "host", "host5", F.HUGEPAGE_MISCONFIG),
        ("offload_churn", frozenset({1}), "rnic", "host5:rnic1", F.REPETITIVE_FLOW_OFFLOADING),
    ],
)
def test_endpoint_side_faults_come_from_the_host_report(field, value, layer, comp, ftype):
    w = World()
    ep_ids = [e.ep_id for e in w.cluster.endpoints if e.host == "host5" and e.rail == 1]
    extra = [p for p in w.pairs if set(p) & set(ep_ids)]
    w.reports["host5"] = HostReport("host5", **{field: value})
    v = only(w.run("latency", extra=extra))
    assert named(v) == (layer, comp, ftype)


def test_a_host_fault_on_every_rnic_is_one_verdict():
    w = World()
    ep_ids = {e.ep_id for e in w.cluster.endpoints if e.host == "host5"}
    extra = [p for p in w.pairs if set(p) & ep_ids]
    w.reports["host5"] = HostReport("host5", pcie_errors=frozenset({0, 1}))
    v = only(w.run("latency", extra=extra))
    assert named(v) == ("host", "host5", F.PCIE_NIC_ERROR)
    assert len(v.pairs) == len(extra)


# -- overlay -------------------------------------------------------------------------------------
def test_overlay_break_names_the_hop():
    w = World()
    dst = w.cluster.endpoint("j/c6/0")
    w.overlay_drop["host1/ovs"] = {dst.name}
    v = only(w.run())
    assert named(v) == ("overlay", "host1/ovs", F.OVERLAY_BLACKHOLE)
    assert v.evidence["chain"][-1] == "host1/ovs"


def test_the_reverse_of_a_broken_overlay_pair_is_the_same_fault():
    # a probe's reply crosses the broken direction too: the reverse pair fails with it, though
    # its own walk looks fine and its underlay trace reaches its destination
    w = World()
    dst = w.cluster.endpoint("j/c6/0")
    w.overlay_drop["host1/ovs"] = {dst.name}
    forward = w.failing()
    v = only(w.run(extra=[(b, a) for a, b in forward]))
    assert named(v) == ("overlay", "host1/ovs", F.OVERLAY_BLACKHOLE)
    assert set(v.pairs) == set(forward) | {(b, a) for a, b in forward}


def test_overlay_loop_names_where_it_closes():
    w = World()
    dst = w.cluster.endpoint("j/c6/0")
    # host1's VTEP sends c6's traffic to host2, whose switch sends it back to host1
    w.overlay_loop = ("host1/vtep0", dst.name, "host2/vtep0")
    w2_tables = w.overlay_tables

    def tables(host):
        t = w2_tables(host)
        if host == "host2":
            nh = {k: dict(v) for k, v in t.next_hop.items()}
            nh["host2/vtep0"][dst.name] = "host1/vtep0"
            nh["host2/vtep0"]["*"] = "host2/ovs"
            return dataclasses.replace(t, next_hop=nh)
        return t

    w.overlay_tables = tables
    vs = w.run()
    loops = [v for v in vs if v.failure_type == F.OVERLAY_LOOP]
    assert loops and loops[0].layer == "overlay"
    assert loops[0].component in ("host1/vtep0", "host2/vtep0")


def test_container_crash_vs_agent_crash():
    w = World()
    w.overlay_down |= {"host3/vf:c3.0", "host3/vf:c3.1"}
    vs = w.run()
    assert {named(v) for v in vs} == {("overlay", "j/c3", F.CONTAINER_CRASH)}

    w = World()
    dead = {e.ep_id for e in w.cluster.endpoints if e.container == "c3"}
    extra = [p for p in w.pairs if p[1] in dead]
    v = only(w.run(extra=extra, refused=extra))
    assert named(v) == ("agent", "j/c3", F.AGENT_CRASH)
    # a late agent, known from heartbeats, is kept apart too
    w.reports["host3"] = HostReport("host3", agents_late=frozenset({"c3"}))
    v = only(w.run("latency", extra=extra))
    assert named(v) == ("agent", "j/c3", F.LATE_AGENT)


def test_agent_events_from_detection():
    w = World()
    c3 = [e.ep_id for e in w.cluster.endpoints if e.container == "c3"]
    loc = Localizer(w.cluster)
    # missed heartbeats, VF still there: the agent died, not the container
    s = Suspect((), "unreachable", 5, agents={c3[0]: 1, c3[1]: 1})
    v = only(loc.localize([s], w, now_ns=9))
    assert named(v) == ("agent", "j/c3", F.AGENT_CRASH)
    assert v.evidence["endpoints"] == c3 and v.first_seen_ns == 5
    s = Suspect((), "latency", 5, agents={c3[0]: 8})
    assert only(loc.localize([s], w, now_ns=9)).failure_type == F.LATE_AGENT
    # missed heartbeats and the VF is gone: the container crashed
    w.overlay_down |= {"host3/vf:c3.0", "host3/vf:c3.1"}
    s = Suspect((), "unreachable", 5, agents={c3[0]: 1})
    v = only(loc.localize([s], w, now_ns=9))
    assert named(v) == ("overlay", "j/c3", F.CONTAINER_CRASH)


def test_a_stopped_agent_silent_like_a_dead_one_is_late_when_its_host_sees_it_alive():
    """SIGSTOP (make demo-all's agent_hang): heartbeats and probes stop as after a crash, but the
    host's report lists the process as alive and stopped, and a restart would not help."""
    w = World()
    c3 = [e.ep_id for e in w.cluster.endpoints if e.container == "c3"]
    loc = Localizer(w.cluster)
    s = Suspect((), "unreachable", 5, agents={c3[0]: 1, c3[1]: 1})
    assert only(loc.localize([s], w, now_ns=9)).failure_type == F.AGENT_CRASH
    w.reports["host3"] = HostReport("host3", agents_late=frozenset({"c3"}))
    v = only(loc.localize([s], w, now_ns=9))
    assert named(v) == ("agent", "j/c3", F.LATE_AGENT) and v.symptom == "unreachable"
    # a report that also says dead (another process of that container) does not overrule
    w.reports["host3"] = HostReport(
        "host3", agents_late=frozenset({"c3"}), agents_dead=frozenset({"c3"})
    )
    assert only(loc.localize([s], w, now_ns=9)).failure_type == F.AGENT_CRASH


def test_suspect_from_detection_event():
    @dataclasses.dataclass
    class Ev:
        kind: str
        pairs: tuple
        scores: tuple
        first_seen_ns: int
        endpoints: tuple = ()

    s = Suspect.from_event(Ev("latency-long", ((1, 2), (3, 4)), (3.0, 4.0), 7))
    assert (s.symptom, s.pairs, s.first_seen_ns) == ("latency", ((1, 2), (3, 4)), 7)
    s = Suspect.from_event(Ev("agent", (), (1, 8), 7, (5, 6)))
    assert s.agents == {5: 1, 6: 8} and s.symptom == "unreachable"
    with pytest.raises(ConfigError):
        Suspect.from_event(Ev("weird", (), (), 0))


def test_both_layers_at_once():
    w = World()
    w.down.add("spine1|tor0r0")
    dst = w.cluster.endpoint("j/c7/1")
    w.overlay_drop["host5/ovs"] = {dst.name}
    vs = w.run()
    got = {named(v) for v in vs}
    assert got == {
        ("underlay", "spine1|tor0r0", F.SWITCH_PORT_DOWN),
        ("overlay", "host5/ovs", F.OVERLAY_BLACKHOLE),
    }
    assert sum(len(v.pairs) for v in vs) == len(w.failing())


def test_two_underlay_faults_at_once():
    w = World()
    w.down |= {"spine1|tor0r0", "spine0|tor1r1"}
    got = {(v.component, v.failure_type) for v in w.run()}
    assert got == {("spine1|tor0r0", F.SWITCH_PORT_DOWN), ("spine0|tor1r1", F.SWITCH_PORT_DOWN)}


# -- RNIC ----------------------------------------------------------------------------------------
#: the World's overlay keys (endpoint names) of c4's rail-1 endpoint and of its first peer
_OWN, _PEER = "j/c4/1", "j/c0/1"


def _rules():
    enc = FlowRule((("in_port", "rep0"), ("nw_dst", _PEER)), ("tnl_push:vx0",), priority=100)
    dec = FlowRule((("in_port", "vx0"), ("nw_dst", _OWN)), ("output:rep0",), priority=100)
    drop = FlowRule((("in_port", "rep0"),), ("drop",), priority=10)
    return enc, dec, drop


def test_rnic_check_when_both_layers_are_clear():
    enc, dec, drop = _rules()
    for offloaded, ftype in (
        (
            (dec, drop),
            F.OFFLOADING_FAILURE,
        ),  # the encap rule never made it: encap/decap not offloaded
        ((enc, drop), F.REPETITIVE_FLOW_OFFLOADING),  # a plain rule evicted: the Fig. 18 slow path
        (
            (drop, enc, dec),
            F.SUBOPTIMAL_FLOW_OFFLOADING,
        ),  # the broad drop rule ahead of the specific ones
    ):
        w = World()
        exp = (enc, dec, drop)
        if ftype == F.REPETITIVE_FLOW_OFFLOADING:
            exp = (enc, dataclasses.replace(dec, actions=("output:rep0",)), drop)
            offloaded = (enc, drop)
        if ftype == F.SUBOPTIMAL_FLOW_OFFLOADING:
            offloaded = tuple(dataclasses.replace(r, priority=0) for r in offloaded)
        w.tables[("host4", 1)] = FlowTables(exp, offloaded)
        ep = w.cluster.endpoint("j/c4/1")
        extra = [p for p in w.pairs if ep.ep_id in p][:3]
        v = only(w.run("latency", extra=extra))
        assert named(v) == ("rnic", "host4:rnic1", ftype), offloaded
        assert "diff" in v.evidence


def test_rnic_dump_is_rate_limited():
    enc, dec, drop = _rules()
    w = World()
    w.tables[("host4", 1)] = FlowTables((enc, dec, drop), (dec, drop))
    ep = w.cluster.endpoint("j/c4/1")
    extra = [p for p in w.pairs if ep.ep_id in p][:2]
    loc = Localizer(w.cluster, rnic_dump_interval_s=60)
    for _ in range(3):
        only(w.run("latency", extra=extra, loc=loc))
    # one check in three rounds: a dump and the second dump that confirms what it found
    assert w.dumps == 2


def test_a_clean_dump_is_taken_again_sooner_for_a_latency_culprit_and_no_more():
    # a repetitive offload evicts the RNIC's flows only some of the time: the first dump came
    # in an off-window (clean). With the 60 s limit for every dump the RNIC was not read again
    # while the fault lasted; a clean dump is retaken after 10 s, a dirty one holds 60 s
    enc, dec, drop = _rules()
    w = World()
    ep = w.cluster.endpoint("j/c4/1")
    extra = [p for p in w.pairs if ep.ep_id in p][:3]
    healthy = w.healthy(extra)
    clean = FlowTables((enc, dec, drop), (enc, dec, drop))
    evicted = FlowTables((enc, dec, drop), (enc, drop))
    log: list[tuple[float, str, int]] = []
    now = {"t": 0.0}

    def flow_tables(host, rail):
        log.append((now["t"], host, rail))
        if (host, rail) != ("host4", 1):
            return None
        return evicted if now["t"] >= 13.0 else clean

    w.flow_tables = flow_tables  # type: ignore[method-assign]
    loc = Localizer(w.cluster, rnic_dump_interval_s=60)

    def round_at(t_s, symptom="latency", loc=loc):
        now["t"] = t_s
        s = Suspect(tuple(extra), symptom, 0)
        return loc.localize([s], w, healthy_pairs=healthy, now_ns=int(t_s * 1e9))

    for t in (0.0, 4.0, 8.0, 12.0, 16.0, 20.0):
        assert [v.layer for v in round_at(t)] == ["unexplained"]
    v = only(round_at(24.0))
    assert v.component == "host4:rnic1"
    assert v.failure_type in (F.OFFLOADING_FAILURE, F.REPETITIVE_FLOW_OFFLOADING)
    # cost: clean dumps 10 s apart (0, 12 s), the dirty one with its confirming dump (24 s)
    assert [t for t, h, r in log if (h, r) == ("host4", 1)] == [0.0, 12.0, 24.0, 24.0]
    # every RNIC at most once per 10 s while clean
    for key in {(h, r) for _t, h, r in log}:
        ts = [t for t, h, r in log if (h, r) == key and t < 24.0]
        assert all(b - a >= 10.0 for a, b in zip(ts, ts[1:], strict=False)), (key, ts)
    # a dirty dump holds for the full limit
    n = len(log)
    for t in (28.0, 36.0, 48.0):
        round_at(t)
    assert ("host4", 1) not in {(h, r) for _t, h, r in log[n:]}
    # a loss culprit keeps the full limit for clean dumps too
    log.clear()
    loc2 = Localizer(w.cluster, rnic_dump_interval_s=60)
    for t in (100.0, 112.0, 124.0, 136.0):
        round_at(t, "loss", loc2)
    per = {(h, r): {t for t, hh, rr in log if (hh, rr) == (h, r)} for _t, h, r in log}
    assert per and all(len(ts) == 1 for ts in per.values()), per


def _two_hosts_slow_on_every_rail(w):
    """Latency on both rails between host0 and host1, which probe only each other (a two-host
    job in the inferred skeleton): every pair elsewhere is fine."""
    eps = w.cluster.endpoints
    mine = {e.ep_id for e in eps if e.host in ("host0", "host1")}
    slow = [p for p in w.pairs if set(p) <= mine and w.ep(p[0]).host != w.ep(p[1]).host]
    healthy = np.array([p for p in w.pairs if not set(p) & mine], np.int64)
    assert {w.ep(p[0]).rail for p in slow} == {0, 1}
    return Suspect(tuple(slow), "latency", 1_000_000_000), healthy


def test_two_hosts_slow_only_with_each_other_are_one_host_board_verdict():
    # the host board (GPUDirect, PCIe, hugepages) slows every RNIC of one host; when its only
    # peer is one other host, either board explains every slow pair: one host verdict, the
    # other host its candidate, not one congestion verdict per rail's links
    w = World()
    s, healthy = _two_hosts_slow_on_every_rail(w)
    v = only(Localizer(w.cluster).localize([s], w, healthy_pairs=healthy, now_ns=20_000_000_000))
    assert (v.layer, v.component_kind) == ("host", "host") and not v.certain
    assert {v.component, *v.candidates} == {"host0", "host1"}
    assert v.failure_type in (F.GPUDIRECT_RDMA_ERROR, F.PCIE_NIC_ERROR, F.HUGEPAGE_MISCONFIG)
    # one host's board flags, read fresh during the failure, are all clear: the other's board
    for cleared, slow_host in (("host1", "host0"), ("host0", "host1")):
        w.reports = {cleared: HostReport(cleared)}
        v = only(
            Localizer(w.cluster).localize([s], w, healthy_pairs=healthy, now_ns=20_000_000_000)
        )
        assert named(v)[:2] == ("host", slow_host) and v.certain, (v.component, v.candidates)
    # a clear reading from before the failure began clears nothing
    w.reports = {"host1": HostReport("host1", age_s={"gpudirect_broken": 60.0})}
    v = only(Localizer(w.cluster).localize([s], w, healthy_pairs=healthy, now_ns=20_000_000_000))
    assert not v.certain and {v.component, *v.candidates} == {"host0", "host1"}
    # one host's report names its board: that host
    w.reports = {"host1": HostReport("host1", pcie_errors=frozenset({0, 1}))}
    v = only(Localizer(w.cluster).localize([s], w, healthy_pairs=healthy, now_ns=20_000_000_000))
    assert named(v) == ("host", "host1", F.PCIE_NIC_ERROR) and v.certain
    # the second host's own check comes before a tie is called: its container's traffic left
    # RDMA (all its rails slow too), which its report says
    w.reports = {"host1": HostReport("host1", rdma_fallback=frozenset({"c1"}))}
    v = only(Localizer(w.cluster).localize([s], w, healthy_pairs=healthy, now_ns=20_000_000_000))
    assert named(v) == ("overlay", "j/c1", F.NOT_USING_RDMA) and v.certain


def test_nothing_found_is_unexplained_not_forced():
    w = World()
    extra = w.pairs[:2]
    v = only(w.run("latency", extra=extra))
    assert v.layer == "unexplained" and v.failure_type == F.UNKNOWN and not v.certain


def test_a_tie_is_reported_with_candidates():
    w = World()
    w.lossy.add("spine1|tor0r0")
    failing = w.failing()[:1]
    # no exoneration at all: every element of the single path ties
    loc = Localizer(w.cluster, max_exoneration_traces=0)
    s = Suspect(tuple(failing), "loss", 0)
    vs = loc.localize([s], w, now_ns=1)
    v = only(vs)
    assert v.layer == "underlay" and not v.certain and len(v.candidates) >= 2


# -- pieces --------------------------------------------------------------------------------------
def test_vote_exonerates_and_explains_greedily():
    fail = [
        Trace((0, 1), ("a", "t0", "s0", "t1", "b"), True),
        Trace((2, 3), ("c", "t0", "s0", "t1", "d"), True),
    ]
    ok = [
        Trace((4, 5), ("a", "t0", "s1", "t1", "b"), True),
        Trace((6, 7), ("c", "t0", "s1", "t1", "d"), True),
        Trace((10, 11), ("a", "t0", "s0", "t2", "e"), True),
    ]
    res = vote(fail, ok)
    assert [c.component for c in res.culprits] == ["s0|t1"]
    assert res.culprits[0].explains == {0, 1} and not res.culprits[0].ambiguous
    assert res.cleared["s0|t0"] == 1 and "s0|t1" not in res.cleared


def test_walk_overlay_statuses():
    t = OverlayTables(
        "h", {"h/a": {"*": "h/b"}, "h/b": {"k": "h/c", "x": "h/a"}, "h/c": {}}, frozenset({"h/d"})
    )
    tables = {"h": t}
    assert walk_overlay((0, 1), "h/a", "k", "h/c", tables).status == "ok"
    w = walk_overlay((0, 1), "h/a", "y", "h/c", tables)
    assert (w.status, w.hop, w.chain) == ("break", "h/b", ("h/a", "h/b"))
    w = walk_overlay((0, 1), "h/a", "x", "h/c", tables)
    assert (w.status, w.hop) == ("loop", "h/a")
    t2 = OverlayTables("h", {"h/a": {"*": "h/d"}}, frozenset({"h/d"}))
    assert walk_overlay((0, 1), "h/a", "k", "h/c", {"h": t2}).status == "down"
    assert walk_overlay((0, 1), "h/a", "k", "g/c", {"h": t}).status == "break"  # host g cannot tell


def test_diff_flow_tables_kinds():
    enc, dec, drop = _rules()
    d = diff_flow_tables((enc, dec), (enc, enc, dataclasses.replace(dec, actions=("drop",)), drop))
    s = d.summary()
    assert s == {"missing": 0, "stale": 2, "duplicated": 1, "misordered": 0, "not_in_hw": 0}
    d = diff_flow_tables((enc, dec, drop), (enc, dataclasses.replace(dec, in_hw=False), drop))
    assert d.summary()["not_in_hw"] == 1 and not d.missing
    assert not diff_flow_tables((enc, dec, drop), (enc, dec, drop))


def test_alert_tracker_dedups_and_resolves():
    w = World()
    w.down.add("spine0")
    trk = AlertTracker(resolve_after_s=30)
    u = trk.update(w.run(), now_ns=0)
    assert len(u.new) == 1 and not u.ongoing and not u.resolved
    u = trk.update(w.run(), now_ns=10 * 10**9)
    assert not u.new and len(u.ongoing) == 1 and u.ongoing[0].first_seen_ns == 1_000
    u = trk.update([], now_ns=45 * 10**9)
    assert len(u.resolved) == 1 and not trk.open


def test_bad_inputs_are_refused():
    w = World()
    with pytest.raises(ConfigError):
        Suspect(((0, 1),), "slow", 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Localizer(w.cluster).localize([Suspect(((0, 10_000),), "loss", 0)], w)
    with pytest.raises(ConfigError):
        Localizer(w.cluster, rnic_dump_interval_s=-1)
    assert Localizer(w.cluster).localize([], w) == []


def test_failing_path_ids_from_probe_records():
    recs = empty_probes(10)
    recs["src_ep"], recs["dst_ep"] = [0, 0, 0, 0, 0, 2, 2, 4, 4, 0], [1, 1, 1, 1, 1, 3, 3, 5, 5, 1]
    recs["path_id"] = [0, 1, 2, 3, 4, 0, 1, 0, 1, 5]
    S = ProbeStatus
    recs["status"] = [0, S.LOST, 0, S.REPLY_LOST, S.LOCAL_ERROR, 0, S.INVALID, 0, 0, S.UNREACHABLE]
    got = failing_path_ids(recs, [(0, 1), (2, 3), (9, 9)])
    # lost (either direction) or unreachable on path ids 1, 3 and 5; a probe we failed to send or
    # a malformed answer says nothing of its path; a pair with none lost (latency) traces every id
    assert got == {(0, 1): (1, 3, 5), (2, 3): (0, 1)}
    assert failing_path_ids(recs[:0], [(0, 1)]) == {}


def test_verdicts_serialize_to_plain_types():
    import json

    w = World()
    w.down.add("spine0")
    d = only(w.run()).as_dict()
    back = json.loads(json.dumps(d))
    assert back["component"] == "spine0" and back["failure_type"] == "switch_offline"
    assert back["severity"] == "critical" and back["failure_type_id"] == 4 and back["pairs"]


def test_hop_loss_pins_the_link_and_does_not_exonerate_it():
    # one failing trace: loss sets in at t0 -> s0; a "healthy" trace over the same link shows the
    # same onset (2% loss lets most probes through): it must not clear the link
    fail = [Trace((0, 1), ("a", "t0", "s0", "t1", "b"), True, (0, 0, 0.02, 0.02, 0.02))]
    ok = [
        Trace((2, 3), ("c", "t0", "s0", "t2", "d"), True, (0, 0, 0.02, 0.02, 0.02)),
        Trace((4, 5), ("a", "t0", "s1", "t1", "b"), True, (0, 0, 0, 0, 0)),
    ]
    res = vote(fail, ok)
    assert [c.component for c in res.culprits] == ["s0|t0"] and not res.culprits[0].partial
    # the same with a delay jump: the hop where the round trip jumps is the suspect
    slow = [
        Trace((0, 1), ("a", "t0", "s0", "t1", "b"), True, (), (0, 2_000, 40_000, 41_000, 42_000))
    ]
    assert [c.component for c in vote(slow, []).culprits] == ["s0"]


def test_delay_on_an_access_link_keeps_the_rnic_as_a_candidate():
    w = World()
    ep = w.cluster.endpoint("j/c4/1")
    extra = [p for p in w.pairs if ep.ep_id in p]
    v = only(w.run("latency", extra=extra))
    assert v.layer == "underlay" and v.component.startswith("host4:rnic1|") and not v.certain
    assert "host4:rnic1" in v.candidates


def test_a_reply_side_pair_alone_is_absorbed_by_the_black_hole_that_breaks_its_way_back():
    # host1's switch has no rule for c6's rail-0 endpoint: c1→c6 breaks at host1/ovs. The reply
    # side c6→c1 walks fine, but its replies take the broken way back. Seen alone in a later
    # round (its reverse already explained), it belongs to the open black hole, not unexplained
    w = World()
    c1, c6, c7 = (w.cluster.endpoint(f"j/{c}/0").ep_id for c in ("c1", "c6", "c7"))
    w.overlay_drop["host1/ovs"] = {w.ep(c6).name}
    loc = Localizer(w.cluster)
    first = only(loc.localize([Suspect(((c1, c6),), "unreachable", 1_000)], w, now_ns=2_000))
    assert named(first) == ("overlay", "host1/ovs", F.OVERLAY_BLACKHOLE)
    reply = [Suspect(((c6, c1),), "unreachable", 3_000)]
    v = only(loc.localize(reply, w, now_ns=4_000, known=[first]))
    assert named(v) == ("overlay", "host1/ovs", F.OVERLAY_BLACKHOLE)
    assert v.pairs == ((c6, c1),)
    # the same when this round's own walks name the hop (another peer's reply side beside it)
    w.overlay_drop["host1/ovs"] |= {w.ep(c7).name}
    v = only(loc.localize([Suspect(((c1, c6), (c7, c1)), "unreachable", 1_000)], w, now_ns=2_000))
    assert named(v) == ("overlay", "host1/ovs", F.OVERLAY_BLACKHOLE)
    assert set(v.pairs) == {(c1, c6), (c7, c1)}
    # a way back that breaks where no verdict points may be a peer that never sends: unexplained
    v = only(loc.localize(reply, w, now_ns=4_000))
    assert (v.layer, v.pairs) == ("unexplained", ((c6, c1),))


@pytest.mark.parametrize("bad_host,other", [("host0", "host1"), ("host1", "host0")])
def test_a_crc_tie_between_two_rnics_is_broken_by_their_rx_error_counters(bad_host, other):
    # one lossy pair between two RNICs under one ToR, neither RNIC on any other probed pair:
    # every element of the path explains it (both access links, both RNICs). The RNIC that
    # receives the corrupted frames counts them; two readings say which one it is
    w = World()
    eps = w.cluster.endpoints
    a = next(e.ep_id for e in eps if e.host == "host0" and e.rail == 0)
    b = next(e.ep_id for e in eps if e.host == "host1" and e.rail == 0)
    tor = w.fabric.rnic(bad_host, 0).tor
    assert tor == w.fabric.rnic(other, 0).tor
    w.lossy.add(link_name(f"{bad_host}:rnic0", tor))
    healthy = np.array([p for p in w.pairs if a not in p and b not in p], np.int64)
    loc = Localizer(w.cluster)
    s = Suspect(((a, b), (b, a)), "loss", 1_000_000_000)

    def round_at(t_s, bad_n, other_n, *, missing=(), loc=loc):
        w.reports = {
            bad_host: HostReport(bad_host, rx_errors={0: bad_n, 1: 4}),
            other: HostReport(
                other,
                rx_errors={} if other in missing else {0: other_n, 1: 9},
                read=frozenset({"rnic_state", "peer_down"}) if other in missing else None,
            ),
        }
        return only(loc.localize([s], w, healthy_pairs=healthy, now_ns=int(t_s * 1_000_000_000)))

    # one reading: no growth known yet, the tie stands
    v = round_at(5, 100, 7)
    assert not v.certain and len(v.candidates) == 3
    # ten seconds on: the bad end's count grew by thousands, the other's by one
    v = round_at(15, 2100, 8)
    assert named(v) == ("underlay", link_name(f"{bad_host}:rnic0", tor), F.CRC_ERROR)
    assert v.certain and v.evidence["rx_errors_grew"] == {
        f"{bad_host}:rnic0": 2000,
        f"{other}:rnic0": 1,
    }
    # both ends growing, or one end's counters unknown: no reason to prefer either
    for counts, missing in (((300, 300), ()), ((2100, 8), (other,))):
        fresh = Localizer(w.cluster)
        round_at(5, 100, 7, loc=fresh)
        v = round_at(15, 100 + counts[0], 7 + counts[1], missing=missing, loc=fresh)
        assert not v.certain and len(v.candidates) == 3


def test_a_vf_of_an_endpoint_gone_has_no_owner():
    """An overlay hop at the VF of an endpoint that left names no endpoint (the localizer keeps
    its model, whose ids are never reused), unless a live endpoint took the VF over."""
    w = World()
    loc = Localizer(w.cluster)
    gone, kept = w.cluster.endpoints[0], w.cluster.endpoints[1]
    vf = loc.overlay_endpoint(gone)[0]
    assert loc._owner(vf, lambda _h: None) is gone
    w.cluster.release(gone.ep_id)
    loc._index()
    assert loc._owner(vf, lambda _h: None) is None
    assert loc._owner(loc.overlay_endpoint(kept)[0], lambda _h: None) is kept
    back = w.cluster.add_endpoint(job="j", container="c0", host="host0", rail=0)
    loc._index()
    assert loc._owner(vf, lambda _h: None) is back and back.ep_id == 24  # 12 hosts x 2 rails
