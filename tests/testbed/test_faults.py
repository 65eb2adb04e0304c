"""Each fault kind breaks exactly what it should, names it in the model's vocabulary, and
clearing it restores the network."""

from __future__ import annotations

import errno
import subprocess
import time

import pytest

from skh.errors import ConfigError
from skh.failures import FailureType
from skh.testbed.counters import CounterEntry, NetnsCounters
from skh.testbed.faults import Faults

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture
def faults(testbed):
    f = Faults(testbed)
    yield f
    f.clear_all()  # a failed test must not leave its fault for the next one
    assert f.list() == []


def under(testbed, tbh, g, g2, r, n=4):
    L = testbed.layout
    return tbh.probe(
        L.host_ns(g), L.rnic_ip(g, r), L.host_ns(g2), L.rnic_ip(g2, r), n=n, timeout_s=0.1
    )


def over(testbed, tbh, a, b, r, n=4, timeout_s=0.1, size=64):
    cl = testbed.cluster()
    ea = next(e for e in cl.endpoints if e.container == a and e.rail == r)
    eb = next(e for e in cl.endpoints if e.container == b and e.rail == r)
    return tbh.probe(
        testbed.endpoint_ns(ea),
        ea.ip,
        testbed.endpoint_ns(eb),
        eb.ip,
        n=n,
        timeout_s=timeout_s,
        size=size,
    )


@pytest.mark.parametrize("at", ["tor0r0", "host1:rnic0"])
def test_link_down_breaks_one_rail_of_one_host(testbed, tbh, faults, at):
    truth = faults.inject("link_down", link=("tor0r0", "host1:rnic0"), at=at)
    if at == "tor0r0":
        assert (truth.layer, truth.component, truth.paper_type) == (
            "underlay",
            ("host1:rnic0", "tor0r0"),
            2,
        )
    else:
        assert (truth.layer, truth.component, truth.paper_type) == ("rnic", "host1:rnic0", 7)
    assert under(testbed, tbh, 1, 3, 0).answered == 0
    assert under(testbed, tbh, 0, 1, 0).answered == 0
    assert under(testbed, tbh, 1, 3, 1).answered == 4  # other rail of the same host
    assert under(testbed, tbh, 0, 3, 0).answered == 4  # same rail, other hosts
    assert over(testbed, tbh, "c1x0", "c3x0", 0).answered == 0
    assert over(testbed, tbh, "c1x0", "c3x0", 1).answered == 4
    faults.clear(truth.id)
    assert under(testbed, tbh, 1, 3, 0).answered == 4
    assert under(testbed, tbh, 0, 1, 0).answered == 4
    assert over(testbed, tbh, "c1x0", "c3x0", 0).answered == 4


@pytest.mark.parametrize("at", ["tor0r1", "spine0"])
def test_uplink_down_moves_flows_to_the_other_spine(testbed, tbh, faults, at):
    truth = faults.inject("link_down", link=("tor0r1", "spine0"), at=at)
    assert truth.component == ("spine0", "tor0r1") and truth.layer == "underlay"
    L = testbed.layout
    owners = testbed.ip_owners()

    def second_hops() -> set[str]:
        return {
            owners.get(h, h)
            for s in range(40000, 40008)
            for h in tbh.trace(L.host_ns(0), L.rnic_ip(0, 1), L.rnic_ip(2, 1), sport=s, max_ttl=2)[
                1:
            ]
        }

    # the ToR drops the dead ECMP member at once, whichever end went down
    assert second_hops() == {"spine1"}
    faults.clear(truth.id)
    assert second_hops() == {"spine0", "spine1"}


def test_flapping_toggles_reachability_and_oper_state(testbed, tbh, faults):
    truth = faults.inject(
        "link_flap", link=("tor1r1", "host2:rnic1"), at="host2:rnic1", down_s=0.4, up_s=0.4
    )
    assert (truth.layer, truth.component, truth.paper_type) == ("rnic", "host2:rnic1", 8)
    cluster = testbed.cluster()
    vf = cluster.endpoint("job0/c2x0/1")
    vf_src = testbed.counter_source()
    # the RNIC port and the ToR port facing it, read by the same counter reader
    ports = NetnsCounters(
        [
            CounterEntry(0, testbed.layout.host_ns(2), "rnic1"),
            CounterEntry(1, testbed.layout.tor_ns(1, 1), "h2"),
        ]
    )
    ok, vf_oper, port_oper = [], [], []
    t_end = time.monotonic() + 2.4
    while time.monotonic() < t_end:
        ok.append(under(testbed, tbh, 0, 2, 1, n=1).answered)
        vf_oper.append(bool(vf_src.read()["oper_up"][vf.ep_id]))
        port_oper.append(tuple(ports.read()["oper_up"]))
        time.sleep(0.05)
    assert 0 in ok and 1 in ok
    assert (0, 0) in port_oper and (1, 1) in port_oper  # both ends of the flapping link
    # the VF stays up: the flap is on the RNIC's port, which the representor does not see
    assert all(vf_oper)
    faults.clear(truth.id)
    assert under(testbed, tbh, 0, 2, 1, n=4).answered == 4
    assert over(testbed, tbh, "c0x0", "c2x0", 1).answered == 4
    assert ports.read()["oper_up"].all()


def test_silent_switch_failure_keeps_ports_up_and_drops_the_rail(testbed, tbh, faults):
    truth = faults.inject("switch_down", switch="tor0r1")
    assert (truth.layer, truth.component, truth.paper_type) == ("underlay", "tor0r1", 4)
    ports = NetnsCounters([CounterEntry(0, testbed.layout.host_ns(0), "rnic1")])
    assert ports.read()["oper_up"].all()  # gray failure: the host sees carrier
    assert under(testbed, tbh, 0, 1, 1).answered == 0  # same ToR
    assert under(testbed, tbh, 0, 2, 1).answered == 0  # across the spines
    assert under(testbed, tbh, 0, 2, 0).answered == 4  # the other rail
    assert under(testbed, tbh, 2, 3, 1).answered == 4  # the other segment's ToR on that rail
    faults.clear(truth.id)
    assert under(testbed, tbh, 0, 1, 1).answered == 4
    assert under(testbed, tbh, 0, 2, 1).answered == 4
    with pytest.raises(ConfigError):
        faults.inject("switch_down", switch="spine0")


def test_packet_loss_drops_the_set_share_and_only_big_frames_when_asked(testbed, tbh, faults):
    L = testbed.layout
    truth = faults.inject("loss", link=("tor1r0", "host3:rnic0"), percent=50, direction="in")
    assert (truth.layer, truth.component) == ("underlay", ("host3:rnic0", "tor1r0"))
    res = tbh.probe(
        L.host_ns(3), L.rnic_ip(3, 0), L.host_ns(2), L.rnic_ip(2, 0), n=100, timeout_s=0.02
    )
    assert 25 <= res.arrived <= 75, res.arrived  # ±5 sigma of Binomial(100, 0.5)
    # only host3 → ToR is lossy: the other direction and the other host are clean
    assert (
        tbh.probe(
            L.host_ns(2), L.rnic_ip(2, 0), L.host_ns(3), L.rnic_ip(3, 0), n=50, timeout_s=0.02
        ).arrived
        == 50
    )
    table = truth.detail["nft_table"]
    assert table.startswith(tbh.PREFIX)
    listing = subprocess.run(
        ["ip", "netns", "exec", L.tor_ns(1, 0), "nft", "list", "tables"],
        capture_output=True,
        text=True,
    ).stdout
    assert table in listing
    faults.clear(truth.id)
    listing = subprocess.run(
        ["ip", "netns", "exec", L.tor_ns(1, 0), "nft", "list", "tables"],
        capture_output=True,
        text=True,
    ).stdout
    assert table not in listing
    assert (
        tbh.probe(
            L.host_ns(3), L.rnic_ip(3, 0), L.host_ns(2), L.rnic_ip(2, 0), n=50, timeout_s=0.02
        ).arrived
        == 50
    )

    crc = faults.inject(
        "loss", link=("tor1r0", "host3:rnic0"), percent=100, direction="both", min_len=1000
    )
    small = tbh.probe(
        L.host_ns(3), L.rnic_ip(3, 0), L.host_ns(2), L.rnic_ip(2, 0), n=20, timeout_s=0.05, size=64
    )
    big = tbh.probe(
        L.host_ns(3),
        L.rnic_ip(3, 0),
        L.host_ns(2),
        L.rnic_ip(2, 0),
        n=20,
        timeout_s=0.05,
        size=2000,
    )
    assert small.answered == 20 and big.arrived == 0
    faults.clear(crc.id)


def test_fdb_blackhole_breaks_one_direction_of_one_rail_between_two_hosts(testbed, tbh, faults):
    truth = faults.inject("fdb_blackhole", host="host0", peer="host3", rail=0)
    assert (truth.layer, truth.component) == ("overlay", ("host0:vx0", "host3:vx0"))
    assert truth.paper_type == FailureType.OVERLAY_BLACKHOLE  # not 16, an offloading fault
    cluster = testbed.cluster()
    src = testbed.counter_source()
    vtep = NetnsCounters([CounterEntry(0, testbed.layout.host_ns(0), "vx0")])
    before, vtep_before = src.read(), vtep.read()
    res = over(testbed, tbh, "c0x0", "c3x0", 0, n=10)
    assert res.arrived == 0
    # host3 → host0 requests arrive, the replies die at host0's VTEP
    back = over(testbed, tbh, "c3x1", "c0x1", 0)
    assert back.arrived == 4 and back.answered == 0
    assert over(testbed, tbh, "c0x0", "c3x0", 1).answered == 4  # other rail
    assert over(testbed, tbh, "c0x0", "c2x0", 0).answered == 4  # other peer
    assert under(testbed, tbh, 0, 3, 0).answered == 4  # underlay untouched
    # the drop is visible on the source VTEP (tx_dropped), not on any VF
    after = src.read()
    assert (after["tx_dropped"] == before["tx_dropped"]).all()
    assert vtep.read()["tx_dropped"][0] - vtep_before["tx_dropped"][0] >= 10
    faults.clear(truth.id)
    assert over(testbed, tbh, "c0x0", "c3x0", 0).answered == 4
    assert cluster.endpoint("job0/c0x0/0").ip


def test_overlay_loop_answers_time_exceeded_from_the_looping_vteps(testbed, tbh, faults):
    truth = faults.inject("overlay_loop", hosts=("host0", "host1"), dst_host="host3", rail=1)
    assert (truth.layer, truth.component) == ("overlay", ("host0:vx1", "host1:vx1"))
    assert truth.paper_type == FailureType.OVERLAY_LOOP
    res = over(testbed, tbh, "c0x0", "c3x0", 1, n=4)
    assert res.arrived == 0 and errno.EHOSTUNREACH in res.errors
    L = testbed.layout
    hops = tbh.trace(
        L.container_ns(0, 0), L.vf_ip(0, 0, 1), L.vf_ip(3, 0, 1), sport=41001, max_ttl=6
    )
    owners = testbed.ip_owners()
    named = [owners.get(h, h) for h in hops]
    assert named[1:5] == ["host1:vx1", "host0:vx1", "host1:vx1", "host0:vx1"], named
    assert over(testbed, tbh, "c0x0", "c3x0", 0).answered == 4  # other rail
    assert over(testbed, tbh, "c0x0", "c2x0", 1).answered == 4  # other destination host
    faults.clear(truth.id)
    assert over(testbed, tbh, "c0x0", "c3x0", 1).answered == 4
    assert over(testbed, tbh, "c1x0", "c3x0", 1).answered == 4


def test_slow_path_delays_only_the_selected_flow(testbed, tbh, faults):
    base = over(testbed, tbh, "c0x0", "c2x0", 0, n=15).p50_us
    truth = faults.inject("slow_path", host="host0", rail=0, dst="c2x0", delay_ms=5)
    assert (truth.layer, truth.component, truth.paper_type) == ("rnic", "host0:rnic0", 15)
    slow = over(testbed, tbh, "c0x0", "c2x0", 0, n=15, timeout_s=0.5)
    assert slow.answered == 15
    assert slow.p50_us > base + 4000, (base, slow.p50_us)
    # UDP payloads that need a checksum survive the relay too
    assert over(testbed, tbh, "c0x0", "c2x0", 0, n=3, timeout_s=0.5, size=3000).answered == 3
    for other in (("c0x0", "c3x0", 0), ("c0x0", "c2x0", 1), ("c2x0", "c1x0", 0)):
        assert over(testbed, tbh, *other, n=10).p50_us < base + 2000, other
    faults.clear(truth.id)
    assert over(testbed, tbh, "c0x0", "c2x0", 0, n=15).p50_us < base + 2000
    assert (
        "dy"
        not in subprocess.run(
            ["ip", "-n", testbed.layout.host_ns(0), "-br", "link"], capture_output=True, text=True
        ).stdout
    )


def test_agent_crash_kills_the_agent_and_clear_restarts_it(testbed, tbh, faults):
    ns = testbed.container_ns("c1x1")
    rec = testbed.spawn(["sleep", "600"], ns=ns, role="agent-c1x1")
    assert rec.alive() and rec.pid in tbh.procs_in(ns)
    truth = faults.inject("agent_crash", pid=rec.pid)
    assert (truth.layer, truth.component) == ("endpoint", "agent-c1x1")
    assert truth.paper_type == FailureType.AGENT_CRASH
    assert not rec.alive()
    cleared = faults.clear(truth.id)
    new = testbed.find_process(cleared.detail["respawned_pid"])
    assert new is not None and new.alive() and new.ns == ns and new.argv == rec.argv
    testbed.stop(new)


def test_agent_hang_stops_and_clear_resumes(testbed, faults):
    rec = testbed.spawn(["sleep", "600"], ns=testbed.container_ns("c1x0"), role="agent-c1x0")
    truth = faults.inject("agent_hang", pid=rec.pid, name="agent-c1x0")
    assert (truth.layer, truth.component) == ("endpoint", "agent-c1x0")
    assert truth.paper_type == FailureType.LATE_AGENT
    assert _state(rec.pid) == "T"
    faults.clear(truth.id)
    assert _state(rec.pid) == "S"
    testbed.stop(rec)


def _state(pid: int) -> str:
    deadline = time.monotonic() + 2
    while True:
        stat = open(f"/proc/{pid}/stat").read()
        state = stat[stat.rindex(")") + 2]
        if state != "R" or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def test_container_crash_cuts_every_rail_of_one_container(testbed, tbh, faults):
    ns = testbed.container_ns("c2x1")
    rec = testbed.spawn(["sleep", "600"], ns=ns, role="agent-c2x1")
    truth = faults.inject("container_crash", container="c2x1")
    assert (truth.layer, truth.component, truth.paper_type) == ("endpoint", "c2x1", 17)
    assert not rec.alive()
    cluster = testbed.cluster()
    src = testbed.counter_source()
    rows = src.read()
    for ep in cluster.endpoints:
        assert rows["oper_up"][ep.ep_id] == (ep.container != "c2x1")
    for r in (0, 1):
        res = over(testbed, tbh, "c0x1", "c3x1", r)
        assert res.answered == 4
        # sanity of the prober itself
        res = tbh.probe(
            testbed.container_ns("c0x1"),
            testbed.layout.vf_ip(0, 1, r),
            testbed.container_ns("c0x1"),
            testbed.layout.vf_ip(0, 1, r),
            n=1,
        )
        assert res.answered == 1
    cleared = faults.clear(truth.id)
    for r in (0, 1):
        assert over(testbed, tbh, "c0x1", "c2x1", r).answered == 4
    assert src.read()["oper_up"].all()
    (pid,) = cleared.detail["respawned_pids"]
    new = testbed.find_process(pid)
    assert new.alive() and new.ns == ns
    testbed.stop(new)


def test_fault_arguments_are_checked(testbed, faults):
    with pytest.raises(ConfigError):
        faults.inject("link_down", link=("tor0r0", "host3:rnic0"))  # host3 is in segment 1
    with pytest.raises(ConfigError):
        faults.inject("nonsense")
    with pytest.raises(ConfigError):
        faults.inject("overlay_loop", hosts=("host0", "host0"), dst_host="host3", rail=0)
    assert faults.list() == []
