"""Localization under the noise real answers carry: one test per noise source (each of these
fails on the phase-1 localizer, which read every hop, flag and table entry at face value), the
alert life cycle of a refined type, and the simulator's noisy answers themselves."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from skh.analysis.localize import (
    AlertTracker,
    FailureType,
    FlowRule,
    FlowTables,
    HostReport,
    Localizer,
    Suspect,
    Trace,
    link_name,
    vote,
)
from skh.analysis.localize.classify import classify_flow_diff
from skh.analysis.localize.data import FlowDiff
from skh.errors import ConfigError
from skh.failures import class_id, type_class

sys.path.insert(0, str(Path(__file__).parent))
from test_localize import World, named, only  # noqa: E402

F = FailureType

# a two-spine pod: every ToR pair has two paths, one per spine
_SPINES = ("s0", "s1")


def _expected(tr: Trace):
    a, b = tr.pair
    src, dst = f"h{a}", f"h{b}"
    ta, tb = f"t{a // 10}", f"t{b // 10}"
    return [(src, ta, s, tb, dst) for s in _SPINES]


# -- traceroutes --------------------------------------------------------------------------------
def test_rate_limited_hops_do_not_place_the_loss():
    # the real lossy link is s0|t1; the first ToR and the spine rate-limit their answers (0.9 and
    # 0.8 of them lost, yet later hops answer): mtr's reading ignores loss that does not persist
    fail = [
        Trace((0, 10), ("h0", "t0", "s0", "t1", "h10"), True, (0, 0.9, 0, 0.05, 0.05)),
        Trace((1, 11), ("h1", "t0", "s0", "t1", "h11"), True, (0, 0, 0.8, 0.1, 0.1)),
    ]
    ok = [
        Trace((2, 12), ("h2", "t0", "s1", "t1", "h12"), True, (0, 0.9, 0, 0, 0)),
        Trace((3, 23), ("h3", "t0", "s0", "t2", "h23"), True, (0, 0, 0.7, 0, 0)),
    ]
    res = vote(fail, ok, expected_paths=_expected)
    assert res.culprits[0].component == "s0|t1", res.culprits


def test_a_silent_switch_moves_the_frontier_one_hop_on():
    # s0 never answers (seen in a healthy trace that went on past it); the link s0|t2 is down:
    # the failing trace stops at t0, but the probe died beyond the silent spine
    fail = [Trace((0, 20), ("h0", "t0", None, None, None), False)]
    ok = [
        Trace((1, 11), ("h1", "t0", None, "t1", "h11"), True),  # via s0, silent
        Trace((2, 12), ("h2", "t0", "s1", "t1", "h12"), True),
        Trace((3, 13), ("h3", "t0", "s0", "t1", "h13"), True),  # an answer through s0 once
    ]
    res = vote(fail, ok, expected_paths=_expected)
    assert res.culprits, res
    assert {res.culprits[0].component, *res.culprits[0].candidates} >= {"s0|t2"}


def test_millisecond_hop_rtts_are_not_read_as_a_queue():
    # the switch CPUs answer in ~ms: round trips jump and drop along every path; the delay is
    # on s0 (+30 us), visible only in which pairs are slow
    cpu = (0, 1_200_000, 300_000, 2_100_000, 90_000)
    fail = [
        Trace((0, 10), ("h0", "t0", "s0", "t1", "h10"), True, (), cpu),
        Trace((31, 21), ("h31", "t3", "s0", "t2", "h21"), True, (), cpu),
    ]
    ok = [
        Trace(
            (2, 12),
            ("h2", "t0", "s1", "t1", "h12"),
            True,
            (),
            (0, 800_000, 2_500_000, 400_000, 60_000),
        ),
        Trace(
            (3, 23),
            ("h3", "t0", "s1", "t2", "h23"),
            True,
            (),
            (0, 3_000_000, 900_000, 1_000_000, 50_000),
        ),
    ]
    res = vote(fail, ok, expected_paths=_expected)
    assert res.culprits[0].component == "s0", res.culprits


# -- host reports ------------------------------------------------------------------------------
def test_a_missing_flag_is_unknown_not_healthy():
    # the RNIC's port is down; its report lacks the port state (read={peer_down}): the phase-1
    # localizer read the absent state as "up" and blamed the switch port with certainty
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    w.reports["host2"] = HostReport("host2", read=frozenset({"peer_down"}))
    v = only(w.run())
    assert v.component == "host2:rnic0" and v.layer == "rnic"
    assert v.type_pending and F.RNIC_PORT_DOWN in {t for t, _p in v.type_candidates}
    # asked again with the flag there: the alert is refined in place
    trk = AlertTracker()
    trk.update([v], now_ns=1)
    w.reports["host2"] = HostReport("host2", rnic_state={0: "down"})
    v2 = only(w.run())
    up = trk.update([v2], now_ns=2)
    assert not up.new and [x.failure_type for x in up.ongoing] == [F.RNIC_PORT_DOWN]
    assert len(trk.open) == 1 and trk.open[0].key == v.key


def test_a_stale_reading_is_another_fault():
    # the report's GID flag was read 100 s ago (a past fault); the pairs began failing 2 us
    # before now: the offloading failure the tables show is what fails them
    enc = FlowRule((("in_port", "rep0"), ("nw_dst", "j/c0/1")), ("tnl_push:vx0",), priority=100)
    up = FlowRule((("in_port", "*"),), ("upcall",), priority=0)
    w = World()
    w.tables[("host4", 1)] = FlowTables((enc, up), (up,))
    w.reports["host4"] = HostReport(
        "host4", gid_changed=frozenset({1}), age_s={"gid_changed": 100.0}
    )
    ep = w.cluster.endpoint("j/c4/1")
    extra = [p for p in w.pairs if ep.ep_id in p][:3]
    v = only(w.run("latency", extra=extra))
    assert named(v) == ("rnic", "host4:rnic1", F.OFFLOADING_FAILURE)


def test_a_lossy_access_link_flows_cross_unharmed_is_named_when_its_rnic_reads_up():
    # CRC errors on host2's access link lose 2 % of frames: 14 of its 22 pairs lost probes, the
    # other 8 cross it unharmed and clear it, so only the partial vote finds it, tied with its
    # own RNIC (10 mtr cycles rarely show where 2 % loss sets in). The eval's e2e misses: the
    # right link and type, never certain. The RNIC's report reads its port up just now and its
    # tables are clean: the cable or the switch port loses, the link is named with certainty
    w = World()
    ep = w.cluster.endpoint("j/c2/0")
    bad = [p for p in w.pairs if ep.ep_id in p][:14]
    w.reports["host2"] = HostReport("host2", rnic_state={0: "up", 1: "up"})
    v = only(w.run("loss", extra=bad))
    assert named(v) == ("underlay", "host2:rnic0|tor0r0", F.CRC_ERROR)
    assert v.evidence["partial"] and v.certain
    # the port state unknown (not read, or read before the failure): the RNIC stays open
    for rep in (
        HostReport("host2", read=frozenset({"peer_down"})),
        HostReport("host2", rnic_state={0: "up"}, age_s={"rnic_state": 100.0}),
        None,
    ):
        w.reports.pop("host2", None)
        if rep is not None:
            w.reports["host2"] = rep
        v = only(w.run("loss", extra=bad))
        assert named(v) == ("underlay", "host2:rnic0|tor0r0", F.CRC_ERROR)
        assert v.candidates == ("host2:rnic0",) and not v.certain


# -- flow tables -------------------------------------------------------------------------------
def test_idle_peers_rules_missing_from_the_rnic_are_normal():
    # every RNIC of host5 is slow (host board, its flags unknown); OVS also holds rules for idle
    # peers that the RNIC evicted: they are not the failing pairs' and say nothing
    w = World()
    # a peer whose job moved on: nothing goes to it any more
    idle = FlowRule((("in_port", "rep0"), ("nw_dst", "j/c99/0")), ("tnl_push:vx0",), priority=100)
    for rail in (0, 1):
        w.tables[("host5", rail)] = FlowTables((idle,), ())
    w.reports["host5"] = HostReport("host5", read=frozenset({"rnic_state", "peer_down"}))
    eps = {e.ep_id for e in w.cluster.endpoints if e.host == "host5"}
    extra = [p for p in w.pairs if set(p) & eps]
    v = only(w.run("latency", extra=extra))
    assert (v.layer, v.component) == ("host", "host5")
    assert type_class(v.failure_type) == "HOST_BOARD_LATENCY" and not v.type_pending


def test_a_dump_that_raced_the_revalidator_is_checked_again():
    enc = FlowRule((("in_port", "rep0"), ("nw_dst", "j/c0/1")), ("tnl_push:vx0",), priority=100)
    raced = dataclasses.replace(enc, actions=("tnl_push:vx0", "revalidating"))

    class Racing(World):
        def flow_tables(self, host, rail):
            self.dumps += 1
            if (host, rail) != ("host4", 1):
                return None
            # the first dump caught a rule mid-update; the second sees it settled
            return FlowTables((enc,), (raced,) if self.dumps == 1 else (enc,))

    w = Racing()
    ep = w.cluster.endpoint("j/c4/1")
    extra = [p for p in w.pairs if ep.ep_id in p][:2]
    v = only(w.run("latency", extra=extra))
    assert v.layer != "rnic", named(v)


def test_only_stale_rules_is_firmware_not_eviction():
    r = FlowRule((("in_port", "rep0"), ("nw_dst", "x")), ("tnl_push:vx0",), priority=100)
    assert classify_flow_diff(FlowDiff(stale=(r,))) == F.RNIC_FIRMWARE_NOT_RESPONDING
    assert classify_flow_diff(FlowDiff(missing=(r,))) == F.OFFLOADING_FAILURE


# -- flapping and concurrent faults -----------------------------------------------------------
def test_flapping_from_detection_and_from_the_carrier_count():
    ev = type(
        "Ev",
        (),
        {"kind": "unreachable", "pairs": [(0, 1)], "first_seen_ns": 5, "flapping": True},
    )()
    assert Suspect.from_event(ev).flapping
    # no flag from detection: the port's carrier-down count grew between two rounds
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    loc = Localizer(w.cluster)
    trk = AlertTracker()
    for i, count in enumerate((3, 4)):
        w.reports["host2"] = HostReport("host2", rnic_state={0: "down"}, port_down_count={0: count})
        failing = w.failing()
        s = Suspect(tuple(failing), "unreachable", 1_000)
        vs = loc.localize([s], w, healthy_pairs=w.healthy(failing), now_ns=(i + 1) * 10**9)
        trk.update(vs, now_ns=(i + 1) * 10**9)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_FLAPPING)]
    # the port-down alert became a flapping one: still one alert, same id
    assert len(trk.open) == 1 and trk.open[0].failure_type == F.RNIC_PORT_FLAPPING
    assert trk.open[0].key == ("rnic", "host2:rnic0", int(F.RNIC_PORT_DOWN))


def test_a_carrier_count_read_before_the_failure_is_not_a_flap():
    # the collector's first reading of the count (3) is from before the port went down at 5 s;
    # the next (4) is that one down. Growth from a reading taken before the failure began is
    # the port's first down, not a flap (before: named flapping on a port that stays down)
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    loc, trk = Localizer(w.cluster), AlertTracker()
    for now_s, count, age_s in ((6, 3, 10.0), (16, 4, 0.0)):
        w.reports["host2"] = HostReport(
            "host2",
            rnic_state={0: "down"},
            port_down_count={0: count},
            age_s={"port_down_count": age_s},
        )
        failing = w.failing()
        s = Suspect(tuple(failing), "unreachable", 5 * 10**9)
        vs = loc.localize([s], w, healthy_pairs=w.healthy(failing), now_ns=now_s * 10**9)
        trk.update(vs, now_ns=now_s * 10**9)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_DOWN)]
    assert [v.failure_type for v in trk.open] == [F.RNIC_PORT_DOWN]


def test_a_flapping_port_read_up_between_two_downs_is_not_a_dead_rnic():
    # detection says the pairs flap; the first round reads the RNIC's port down, the next reads
    # it up (between two downs) while the pairs still fail at it. A port that comes back is no
    # dead RNIC: still the RNIC's flapping port (before: RNIC_HW_FAILURE, the port read up)
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    loc, trk = Localizer(w.cluster), AlertTracker()
    for now_s, state in ((6, "down"), (16, "up")):
        w.reports["host2"] = HostReport("host2", rnic_state={0: state})
        failing = w.failing()
        s = Suspect(tuple(failing), "unreachable", 5 * 10**9, flapping=True)
        vs = loc.localize([s], w, healthy_pairs=w.healthy(failing), now_ns=now_s * 10**9)
        assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_FLAPPING)], now_s
        trk.update(vs, now_ns=now_s * 10**9)
    # with no reading of the port down, both ports stay open, never a dead RNIC
    vs = Localizer(w.cluster).localize([s], w, healthy_pairs=w.healthy(failing), now_ns=16 * 10**9)
    assert {t for t, _p in vs[0].type_candidates} == {
        F.RNIC_PORT_FLAPPING,
        F.SWITCH_PORT_FLAPPING,
    }, vs


def test_a_port_that_came_back_is_its_open_alert_not_an_unexplained_one():
    # round 1: host2:rnic0's port is down (detection raised its pairs with other segments).
    # Round 2: the port is up, detection still holds those pairs, their traces cross the port
    # again and its other pairs, healthy, clear it in the vote. The open alert explains them: a
    # port that came back is flapping; nothing is left unexplained beside it. A switch port
    # that dies meanwhile elsewhere still gets its own verdict
    w = World()
    w.down.add("host2:rnic0|tor0r0")
    w.reports["host2"] = HostReport("host2", rnic_state={0: "down"})
    mine = w.cluster.endpoint("j/c2/0").ep_id
    far = {e.ep_id for e in w.cluster.endpoints if e.host not in ("host0", "host1", "host3")}
    held = [p for p in w.failing() if mine in p and set(p) <= far]
    loc, trk = Localizer(w.cluster), AlertTracker()
    first = Suspect(tuple(held), "unreachable", 1_000)
    vs = loc.localize([first], w, healthy_pairs=w.healthy(held), now_ns=10**9)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_DOWN)]
    trk.update(vs, now_ns=10**9)
    w.down = {"spine1|tor2r1"}
    w.reports["host2"] = HostReport("host2", rnic_state={0: "up"})
    new = w.failing()
    sus = [first, Suspect(tuple(new), "unreachable", 15 * 10**8)]
    healthy = w.healthy(held + new)
    assert any(mine in p for p in healthy.tolist())
    vs = loc.localize(sus, w, healthy_pairs=healthy, now_ns=2 * 10**9, known=trk.open)
    assert sorted(named(v) for v in vs) == [
        ("rnic", "host2:rnic0", F.RNIC_PORT_FLAPPING),
        ("underlay", "spine1|tor2r1", F.SWITCH_PORT_DOWN),
    ]
    assert trk.update(vs, now_ns=2 * 10**9).new[0].component == "spine1|tor2r1"
    assert [v.failure_type for v in trk.open] == [F.RNIC_PORT_FLAPPING, F.SWITCH_PORT_DOWN]
    # without the open alert nothing says what failed those pairs
    vs = Localizer(w.cluster).localize(sus, w, healthy_pairs=healthy, now_ns=2 * 10**9)
    assert ("unexplained", "", F.UNKNOWN) in {named(v) for v in vs}
    # nor does an open alert whose fault lets traces through (a GID change fails probes only)
    gid = dataclasses.replace(trk.open[0], failure_type=F.RNIC_GID_CHANGE)
    vs = Localizer(w.cluster).localize(sus, w, healthy_pairs=healthy, now_ns=2 * 10**9, known=[gid])
    assert ("unexplained", "", F.UNKNOWN) in {named(v) for v in vs}
    # a later round that sees the port down again does not undo what the alert knows
    w.down = {"host2:rnic0|tor0r0", "spine1|tor2r1"}
    w.reports["host2"] = HostReport("host2", rnic_state={0: "down"})
    vs = loc.localize(sus, w, healthy_pairs=w.healthy(w.failing()), now_ns=3 * 10**9)
    assert ("rnic", "host2:rnic0", F.RNIC_PORT_DOWN) in {named(v) for v in vs}
    trk.update(vs, now_ns=3 * 10**9)
    assert [v.failure_type for v in trk.open] == [F.RNIC_PORT_FLAPPING, F.SWITCH_PORT_DOWN]


def test_a_port_that_came_back_keeps_a_pair_one_of_whose_traces_lost_its_last_answer():
    # as above, but one held pair is traced on two flows and one trace stops one hop short of
    # its destination, which answers the other: its last answer was lost (field answers), no
    # evidence that the pair stops somewhere. The pair is the open alert's come back, not
    # unexplained
    class Lossy(World):
        lost: set = set()

        def traceroute(self, pair, path_id=0):
            t = super().traceroute(pair, path_id)
            if (pair, path_id) in self.lost and t.reached:
                return Trace(pair, t.nodes[:-1], False)
            return t

    w = Lossy()
    w.down.add("host2:rnic0|tor0r0")
    w.reports["host2"] = HostReport("host2", rnic_state={0: "down"})
    mine = w.cluster.endpoint("j/c2/0").ep_id
    far = {e.ep_id for e in w.cluster.endpoints if e.host not in ("host0", "host1", "host3")}
    held = [p for p in w.failing() if mine in p and set(p) <= far]
    loc, trk = Localizer(w.cluster), AlertTracker()
    first = Suspect(tuple(held), "unreachable", 1_000, path_ids={held[0]: (0, 1)})
    vs = loc.localize([first], w, healthy_pairs=w.healthy(held), now_ns=10**9)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_DOWN)]
    trk.update(vs, now_ns=10**9)
    w.down = {"spine1|tor2r1"}
    w.reports["host2"] = HostReport("host2", rnic_state={0: "up"})
    w.lost = {(held[0], 1)}
    new = w.failing()
    sus = [first, Suspect(tuple(new), "unreachable", 15 * 10**8)]
    healthy = w.healthy(held + new)
    vs = loc.localize(sus, w, healthy_pairs=healthy, now_ns=2 * 10**9, known=trk.open)
    assert sorted(named(v) for v in vs) == [
        ("rnic", "host2:rnic0", F.RNIC_PORT_FLAPPING),
        ("underlay", "spine1|tor2r1", F.SWITCH_PORT_DOWN),
    ]
    assert set(held) <= set(next(v for v in vs if v.layer == "rnic").pairs)


def test_known_culprits_are_checked_first():
    # two faults on one host's pairs; the open alert's RNIC is checked first and keeps its pairs
    w = World()
    w.reports["host5"] = HostReport("host5", bond_degraded=frozenset({1}))
    ep = w.cluster.endpoint("j/c5/1")
    extra = [p for p in w.pairs if ep.ep_id in p]
    first = only(w.run("latency", extra=extra))
    again = Localizer(w.cluster).localize(
        [Suspect(tuple(extra), "latency", 1_000)],
        w,
        healthy_pairs=w.healthy(extra),
        now_ns=3_000,
        known=(first,),
    )
    assert [named(v) for v in again] == [named(first)]


def test_alert_ids_carry_the_type_class():
    assert class_id(F.GPUDIRECT_RDMA_ERROR) == class_id(F.HUGEPAGE_MISCONFIG) == 12
    assert class_id(F.BOND_ERROR) == int(F.RNIC_HW_FAILURE)
    assert class_id(F.CRC_ERROR) == int(F.CRC_ERROR)
    with pytest.raises(ValueError):
        HostReport("h", read=frozenset({"no_such_flag"}))


# -- the simulator's noisy answers -------------------------------------------------------------
@pytest.fixture(scope="module")
def sim():
    from skh.model import Fabric
    from skh.sim.scenario import Simulation

    fabric = Fabric.from_params(hosts=32, rnics_per_host=8, hosts_per_segment=8, spines=4, cores=1)
    return Simulation.build(fabric, n_jobs=8, seed=7, start_s=(-300.0, -200.0))


def test_quiet_answers_are_the_simulators_truth(sim):
    from skh.sim.answers import QUIET, SimSource

    p = tuple(int(x) for x in sim.pairs[0])
    tr = SimSource(sim, t_s=1.0, noise=QUIET).traceroute(p, 0)
    assert tr.reached and None not in tr.nodes and set(tr.hop_loss) == {0.0}
    rep = SimSource(sim, t_s=1.0, noise=QUIET).host_report(sim.cluster.endpoints[p[0]].host)
    assert rep.read is None and rep.known("gid_changed") and not rep.age_s


def test_field_answers_carry_their_noise_and_say_so(sim):
    from skh.sim.answers import FIELD_ANSWERS, AnswerNoise, SimSource, answers_measured

    src = SimSource(sim, t_s=5.0, noise=FIELD_ANSWERS)
    pairs = [tuple(int(x) for x in p) for p in sim.pairs[:60]]
    traces = [src.traceroute(p, k % 4) for k, p in enumerate(pairs)]
    # one host's traces one after another empty its ToR's bucket: answers go missing there
    assert any(t.hop_loss and max(t.hop_loss[1:-1], default=0) > 0 for t in traces)
    rtt = [r for t in traces for r in t.hop_rtt_ns[1:-1] if r > 0]
    assert np.median(rtt) > 200_000  # switch CPUs answer in ~ms, not us
    hosts = sorted({e.host for e in sim.cluster.endpoints})
    reps = [src.host_report(h) for h in hosts for _ in range(5)]
    got = answers_measured(sim)
    assert got["answers"] == "field" and got["traces"] == len(traces)
    assert 0 < got["flags_missing"] < 0.2 * got["flags"]
    assert all(
        r is None or r.known("rnic_state", max_age_s=0) or "rnic_state" not in (r.read or ())
        for r in reps
    )
    real = dataclasses.replace(FIELD_ANSWERS, report_readers="real", report_flag_missing_p=0.0)
    r = SimSource(sim, t_s=5.0, noise=real).host_report(hosts[0])
    assert r is None or r.read == frozenset(
        {"rnic_state", "peer_down", "port_down_count", "rx_errors"}
    )
    with pytest.raises(ConfigError):
        AnswerNoise(trace_rate_limit_p=2.0)


def test_an_answer_does_not_hinge_on_the_questions_asked_before_it(sim):
    """A change to detection changes which questions a round asks; the answers to the
    questions both sides ask must stay the same, or an A/B compares two draws of the answer
    noise rather than the change (the responders' rate limits aside: those do depend on
    what was asked before, as on a real switch)."""
    from skh.sim.answers import FIELD_ANSWERS, QUIET, SimSource

    noise = dataclasses.replace(FIELD_ANSWERS, icmp_rate_per_s=0.0, trace_rate_limit_p=0.3)
    pairs = [tuple(int(x) for x in p) for p in sim.pairs[:80]]
    hosts = sorted({e.host for e in sim.cluster.endpoints})

    def ask(first: bool):
        SimSource(sim, noise=QUIET)  # a fresh answer state for the noisy sources below
        src = SimSource(sim, t_s=9.0, noise=noise)
        if not first:
            for k, p in enumerate(pairs[1:]):
                src.traceroute(p, k % 4)
            for h in hosts[6:]:
                src.host_report(h)
        tr = src.traceroute(pairs[0], 1)
        reps = [src.host_report(h) for h in hosts[:6]]
        return tr.nodes, tr.hop_loss, [None if r is None else (r.read, r.age_s) for r in reps]

    assert ask(first=True) == ask(first=False)


def test_a_crc_fault_grows_the_receiving_rnics_rx_errors_only():
    from skh.model import Fabric
    from skh.sim.answers import FIELD_ANSWERS, RX_FRAMES_PER_S, SimSource
    from skh.sim.faults import Fault
    from skh.sim.scenario import Simulation

    fabric = Fabric.from_params(hosts=16, rnics_per_host=8, hosts_per_segment=8, spines=2, cores=1)
    sim = Simulation.build(fabric, n_jobs=2, seed=5, start_s=(-300.0, -200.0))
    link = next(c for c in sim.candidates(FailureType.CRC_ERROR) if ":rnic" in c)
    rnic = next(x for x in link.split("|") if ":rnic" in x)
    host, rail = rnic.rsplit(":rnic", 1)[0], int(rnic.rsplit(":rnic", 1)[1])
    sim.inject(Fault(FailureType.CRC_ERROR, link, 100.0, 200.0, loss_rate=0.001))
    hosts = sorted(fabric.hosts)

    def counts(t_s):
        return {h: SimSource(sim, t_s=t_s).host_report(h).rx_errors for h in hosts}

    before, during, after = counts(95.0), counts(115.0), counts(400.0)
    # the RNIC at the faulty link counts the fault's share of the frames it receives
    assert during[host][rail] - before[host][rail] >= 0.001 * RX_FRAMES_PER_S * 15 - 1
    assert after[host][rail] - during[host][rail] >= 0.001 * RX_FRAMES_PER_S * 85 - 1
    # every other port only ticks now and then: at most a stray error in 20 s, a few in 5 min
    for h in hosts:
        for r in range(8):
            if (h, r) != (host, rail):
                assert 0 <= during[h][r] - before[h][r] <= 1
                assert after[h][r] - during[h][r] <= 20
    grew = sum(
        after[h][r] > during[h][r] for h in hosts for r in range(8) if (h, r) != (host, rail)
    )
    assert grew >= 1  # benign errors exist, so "flat" is a threshold, not zero
    # a field report reads the counters when asked, and may miss them like any flag
    reps = [SimSource(sim, t_s=t, noise=FIELD_ANSWERS).host_report(host) for t in range(100, 400)]
    known = [r for r in reps if r is not None and r.known("rx_errors", max_age_s=0)]
    assert 0.8 * len(reps) < len(known) < len(reps)


def test_a_lost_last_answer_is_not_a_dead_destination():
    # h10 answers one trace; another stops at its ToR (h10's kernel rate-limited that answer):
    # nothing is down, and the vote must not blame h10's access link
    fail = [Trace((1, 10), ("h1", "t0", "s1", "t1", None), False)]
    ok = [Trace((0, 10), ("h0", "t0", "s0", "t1", "h10"), True)]
    assert not vote(fail, ok, expected_paths=_expected).culprits
    # with h10 silent in every trace of the round, the stop is evidence again
    assert vote(fail, [], expected_paths=_expected).culprits


def test_a_slow_switch_some_of_whose_pairs_were_not_flagged():
    # t1 delays every flow through it; detection flagged the pairs of h10, h11 and h12 but not
    # yet h13's, whose trace clears t1: one slow switch, not three slow access links
    fail = [
        Trace((10, 1), ("h10", "t1", "s0", "t0", "h1"), True),
        Trace((11, 2), ("h11", "t1", "s1", "t0", "h2"), True),
        Trace((12, 23), ("h12", "t1", "s0", "t2", "h23"), True),
    ]
    ok = [Trace((13, 3), ("h13", "t1", "s1", "t0", "h3"), True)]
    soft = vote(fail, ok, expected_paths=_expected, soft=range(3))
    assert [c.component for c in soft.culprits] == ["t1"] and soft.culprits[0].partial
    # pairs that are unreachable: a trace through t1 that worked clears it
    hard = vote(fail, ok, expected_paths=_expected)
    assert "t1" not in [c.component for c in hard.culprits]


def test_a_pair_slow_over_both_spines_is_no_spine_links_partial_fault():
    # h1's RNIC slows some of its flows (suboptimal offloading): detection flagged one pair,
    # (1, 12), traced on its 24 failing flow labels, 13 over s0 and 11 over s1. s0's links are
    # cleared by 12 healthy flows, everything else by more. 13 failing flows against 12 clearing
    # named s0's link a partial (slow) culprit (CC_ISSUE; the eval's e2e miss on seed
    # 311581655), but the same pair is as slow over s1: s0 does not explain it. The vote names
    # nothing and the endpoints decide (the RNIC's tables show the offloading). Only the last
    # partial pass asks for whole pairs: 4aaeca2 asked it of the first pass's wide partial
    # too, and a ToR carrying every flow of its pairs then outran the culprits before it
    # (fresh seed 1639607732: a 1,571-trace round named a dozen ToRs CC_ISSUE)
    def tr(a: int, b: int, s: str) -> Trace:
        return Trace((a, b), (f"h{a}", f"t{a // 10}", s, f"t{b // 10}", f"h{b}"), True)

    fail = [tr(1, 12, "s0") for _ in range(13)] + [tr(1, 12, "s1") for _ in range(11)]
    ok = [tr(a, 10 + a, "s0") for a in (2, 3, 4, 5, 6, 7) for _ in range(2)]
    ok += [tr(1, b, "s1") for b in (13, 14, 15, 16, 17, 18) for _ in range(5)]
    ok += [tr(a, 12, "s1") for a in (2, 3, 4, 5, 6, 7) for _ in range(5)]
    got = vote(fail, ok, expected_paths=_expected, soft=range(len(fail)))
    assert not got.culprits and got.unexplained == frozenset(range(len(fail)))
    # two pairs slow over s0 alone, 13 flows against its 12 clearing: its link is the culprit
    two = [tr(1, 12, "s0") for _ in range(7)] + [tr(8, 19, "s0") for _ in range(6)]
    ok2 = ok + [tr(8, b, "s1") for b in (13, 14, 15, 16, 17, 18) for _ in range(5)]
    ok2 += [tr(a, 19, "s1") for a in (2, 3, 4, 5, 6, 7) for _ in range(5)]
    got = vote(two, ok2, expected_paths=_expected, soft=range(len(two)))
    assert [c.component for c in got.culprits][:1] in (["s0|t0"], ["s0|t1"])


def test_a_spine_port_that_came_back_is_known_on_a_pair_traced_off_it_too():
    """A spine port fails only the flows hashed onto it. Once it is up again, detection still
    holds a pair whose failed flows include one off the port (a benign loss there): the trace
    of that flow misses the port, the other crosses it. The open alert explains the pair (the
    port came back: flapping), though not every trace crossed it (field seed 920230969,
    SWITCH_PORT_FLAPPING on P8|S23r4, left unexplained while only elements every trace
    crossed were asked)."""

    class Ecmp(World):
        def path(self, pair, path_id=0):
            a, b = self.ep(pair[0]), self.ep(pair[1])
            ra, rb = self.fabric.rnic(a.host, a.rail), self.fabric.rnic(b.host, b.rail)
            paths = self.fabric.ecmp_paths(ra, rb)
            return paths[path_id % len(paths)]

        def traceroute(self, pair, path_id=0):
            p, nodes = self.path(pair, path_id), []
            for x, y in zip(p, p[1:], strict=False):
                nodes.append(x)
                if link_name(x, y) in self.down or y in self.down or x in self.down:
                    return Trace(pair, tuple(nodes), False)
            return Trace(pair, (*nodes, p[-1]), True)

    w = Ecmp()
    port = "spine1|tor2r1"
    w.down.add(port)
    flows = {
        p: tuple(k for k in range(2) if port in w.elements(w.path(p, k)))
        for p in w.pairs
        if len(w.fabric.ecmp_paths(*(w.fabric.rnic(w.ep(e).host, w.ep(e).rail) for e in p))) == 2
    }
    held = sorted(p for p, ks in flows.items() if ks)
    assert held and all(len(flows[p]) == 1 for p in held)
    healthy = np.array([p for p in w.pairs if p not in set(held)], np.int64)
    loc, trk = Localizer(w.cluster), AlertTracker()
    first = Suspect(tuple(held), "unreachable", 1_000, path_ids={p: flows[p] for p in held})
    vs = loc.localize([first], w, healthy_pairs=healthy, now_ns=10**9)
    assert [named(v) for v in vs] == [("underlay", port, F.SWITCH_PORT_DOWN)]
    trk.update(vs, now_ns=10**9)
    # up again; one held pair was lossy on its other flow too
    w.down = set()
    again = Suspect(tuple(held[:1]), "unreachable", 1_000, path_ids={held[0]: (0, 1)})
    vs = loc.localize([again], w, healthy_pairs=healthy, now_ns=2 * 10**9, known=trk.open)
    assert [named(v) for v in vs] == [("underlay", port, F.SWITCH_PORT_FLAPPING)]


def test_a_port_that_came_back_keeps_a_pair_whose_trace_stopped_short_of_a_silent_tor():
    # as above, but the port's ToR answers nobody and the trace of one held pair's flow stops
    # before it: short of a silent switch and the destination, which answers other traces.
    # Its last answer was lost, not its probe (the flapping end-to-end test, seed 5, after
    # answers were keyed by question: that pair was left unexplained beside the alert)
    class Quiet(World):
        quiet = False
        cut: set = set()

        def traceroute(self, pair, path_id=0):
            t = super().traceroute(pair, path_id)
            if not self.quiet:
                return t
            nodes = tuple(None if n == "tor0r0" else n for n in t.nodes)
            if (pair, path_id) in self.cut and t.reached:
                return Trace(pair, nodes[:-2], False)
            return Trace(pair, nodes, t.reached)

    w = Quiet()
    w.down.add("host2:rnic0|tor0r0")
    w.reports["host2"] = HostReport("host2", rnic_state={0: "down"})
    mine = w.cluster.endpoint("j/c2/0").ep_id
    far = {e.ep_id for e in w.cluster.endpoints if e.host not in ("host0", "host1", "host3")}
    held = [p for p in w.failing() if mine in p and set(p) <= far]
    into = next(p for p in held if p[1] == mine)
    loc, trk = Localizer(w.cluster), AlertTracker()
    first = Suspect(tuple(held), "unreachable", 1_000, path_ids={into: (0, 1)})
    vs = loc.localize([first], w, healthy_pairs=w.healthy(held), now_ns=10**9)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_DOWN)]
    trk.update(vs, now_ns=10**9)
    w.down = set()
    w.reports["host2"] = HostReport("host2", rnic_state={0: "up"})
    w.quiet, w.cut = True, {(into, 1)}
    vs = loc.localize([first], w, healthy_pairs=w.healthy(held), now_ns=2 * 10**9, known=trk.open)
    assert [named(v) for v in vs] == [("rnic", "host2:rnic0", F.RNIC_PORT_FLAPPING)]
    assert into in vs[0].pairs
