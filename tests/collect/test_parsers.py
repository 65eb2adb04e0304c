"""Parsers on recorded real command output (tests/collect/data/record.sh), and on odd input."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from skh.analysis.localize import FailureType, FlowRule, FlowTables, diff_megaflows, walk_overlay
from skh.analysis.localize.classify import classify_flow_diff
from skh.collect.linux import (
    LinuxState,
    LocalEndpoint,
    linux_overlay_tables,
    parse_bridge_fdb,
    parse_ip_link,
    parse_ip_neigh,
    parse_ip_route,
)
from skh.collect.ovs import (
    megaflow_tables,
    parse_dpctl_flows,
    parse_dpctl_show,
    parse_ofctl_flows,
    parse_ofctl_show,
    split_top,
)
from skh.collect.tc import parse_tc_filters
from skh.collect.traceroute import as_trace, parse_paris_json, parse_traceroute

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def ovs_tables(of="ovs-ofctl-dump-flows.txt", dp="ovs-dpctl-dump-flows.txt"):
    return megaflow_tables(
        read(of),
        read(dp),
        ofctl_show=read("ovs-ofctl-show.txt"),
        dpctl_show=read("ovs-dpctl-show.txt"),
        tunnel_ports={"vxlan_sys_4789": "vx0"},
    )


# -- OVS ------------------------------------------------------------------------------------------
def test_ofctl_dump_flows_numbers_and_names_agree():
    names = parse_ofctl_show(read("ovs-ofctl-show.txt"))
    assert names == {"1": "vx0", "2": "rep0", "LOCAL": "br-int"}
    by_num = parse_ofctl_flows(read("ovs-ofctl-dump-flows.txt"), names)
    by_name = parse_ofctl_flows(read("ovs-ofctl-dump-flows-names.txt"))
    assert len(by_num) == 5
    key = lambda rs: sorted((r.priority, r.match, r.actions) for r in rs)  # noqa: E731
    assert key(by_num) == key(by_name)
    enc = next(r for r in by_num if r.match_dict.get("in_port") == "rep0")
    assert enc.match_dict == {"dl_type": "0x0800", "in_port": "rep0", "nw_dst": "192.168.88.2"}
    assert enc.actions == ("output:vx0",) and enc.priority == 100 and enc.packets == 3
    drop = next(r for r in by_num if r.priority == 200)
    assert drop.actions == ("drop",)
    assert [r.actions for r in by_num if r.priority == 0] == [("normal",)]
    assert parse_ofctl_flows(read("ovs-ofctl-dump-flows-normal.txt"))[0].match == ()


def test_dpctl_dump_flows_plain_and_verbose():
    ports = parse_dpctl_show(read("ovs-dpctl-show.txt"))
    assert ports["4"] == "vxlan_sys_4789" and ports["5"] == "rep0"
    plain = parse_dpctl_flows(read("ovs-dpctl-dump-flows.txt"), ports)
    assert (
        len(plain)
        == sum(1 for ln in read("ovs-dpctl-dump-flows.txt").splitlines() if "actions:" in ln)
        > 10
    )
    dec = [f for f in plain if f.match_dict.get("nw_dst") == "192.168.88.1"]
    assert dec and dec[0].actions == ("output:rep0",) and dec[0].packets == 2
    pop = [f for f in plain if any(a.startswith("tnl_pop:") for a in f.actions)]
    assert pop and pop[0].match_dict["tp_dst"] == "4789"
    verbose = parse_dpctl_flows(read("ovs-dpctl-dump-flows-m.txt"))
    tun = [f for f in verbose if "tun_id" in f.match_dict]
    assert tun and all(f.match_dict["tun_id"] == "0x3e8" for f in tun)
    # masked-out sub-fields (…/0, …/00:00:…) are wildcards, not matches
    assert not any(v.endswith("/0") or v.endswith("/::") for f in verbose for _, v in f.match)


def test_real_ovs_tables_agree_and_evicted_flows_show():
    healthy = ovs_tables()
    assert healthy.megaflow and healthy.offloaded
    assert not healthy.diff(), healthy.diff().summary()
    # datapath flows deleted while traffic uses the OpenFlow rules: the slow-path (Fig. 18) case
    evicted = ovs_tables("ovs-ofctl-dump-flows-evicted.txt", "ovs-dpctl-dump-flows-evicted.txt")
    d = evicted.diff()
    assert {r.match_dict.get("nw_dst") for r in d.missing} == {"192.168.88.1", "192.168.88.2"}


def test_a_datapath_flow_that_disagrees_with_openflow_is_stale():
    t = ovs_tables()
    # OVS now says drop for 192.168.88.2, the cached flow still forwards
    of = [
        FlowRule(r.match, ("drop",), r.priority, r.table, r.packets, r.used_s)
        if r.match_dict.get("nw_dst") == "192.168.88.2"
        else r
        for r in t.expected
    ]
    d = diff_megaflows(of, t.offloaded)
    assert len(d.stale) == 1 and d.stale[0].match_dict["nw_dst"] == "192.168.88.2"
    # a higher-priority rule that the cache ignores: the cache follows the wrong rule
    hi = FlowRule((("dl_type", "0x0800"), ("nw_dst", "192.168.88.2")), ("drop",), 300)
    d = diff_megaflows([*t.expected, hi], t.offloaded)
    assert d.misordered and d.misordered[0][0] is hi


def test_split_top_respects_parentheses():
    assert split_top("a(b,c),d,e(f(g,h)),") == ["a(b,c)", "d", "e(f(g,h))"]


# -- Linux ----------------------------------------------------------------------------------------
def test_ip_route_json_and_text_agree():
    j, t = parse_ip_route(read("ip-route.json")), parse_ip_route(read("ip-route.txt"))
    assert j == t
    assert [r for r in j if r.dev == "vx0"][0].gateway == "172.16.1.0"
    allt = parse_ip_route(read("ip-route-all.json"))
    assert {r.table for r in allt} >= {"main", "local"}
    assert parse_ip_route(read("ip-route-container.json"))[0].dst == "172.16.0.0/16"


def test_neigh_and_fdb():
    n = parse_ip_neigh(read("ip-neigh.json"))
    assert n == [n[0]] and n[0].lladdr == "02:00:00:00:00:01" and n[0].dev == "vx0"
    j, t = (
        parse_bridge_fdb(read("bridge-fdb-show.json")),
        parse_bridge_fdb(read("bridge-fdb-show.txt")),
    )
    assert [(e.mac, e.dev, e.dst) for e in j] == [(e.mac, e.dev, e.dst) for e in t]
    vtep = [e for e in j if e.dst]
    assert [(e.mac, e.dev, e.dst) for e in vtep] == [("02:00:00:00:00:01", "vx0", "10.0.0.2")]
    # with "dev vx0" bridge leaves the device out of each row
    only_vx0 = parse_bridge_fdb(read("bridge-fdb-show-vx0.json"), dev="vx0")
    assert [(e.mac, e.dev, e.dst) for e in only_vx0 if e.dst] == [
        ("02:00:00:00:00:01", "vx0", "10.0.0.2")
    ]


def test_recorded_linux_state_gives_the_overlay_chain():
    kinds, down = parse_ip_link(read("ip-link-detail.json"))
    assert kinds["vx0"] == "vxlan" and kinds["c0v0"] == "veth" and "vx0" not in down
    state = LinuxState(
        tuple(parse_ip_route(read("ip-route-all.json"))),
        tuple(parse_ip_neigh(read("ip-neigh.json"))),
        tuple(parse_bridge_fdb(read("bridge-fdb-show.json"))),
        kinds,
        down,
    )
    local = [LocalEndpoint("A/vf:c0.0", "172.16.0.1", "c0v0")]
    t = linux_overlay_tables("A", state, local, ["172.16.0.1", "172.16.1.1"], {"10.0.0.2": "B"})
    assert t.next_hop["A/route"] == {"172.16.0.1": "A/rep:c0v0", "172.16.1.1": "A/vtep:vx0"}
    assert t.next_hop["A/vtep:vx0"] == {"172.16.1.1": "B/decap:vx0"}
    w = walk_overlay((0, 1), "A/vf:c0.0", "172.16.1.1", "B/vf:c1.0", {"A": t})
    # host B reported nothing here: the walk stops at the first hop it cannot see past
    assert w.chain[:5] == ("A/vf:c0.0", "A/rep:c0v0", "A/route", "A/vtep:vx0", "B/decap:vx0")


def test_real_evicted_flows_classify_as_the_fig18_case():
    d = ovs_tables("ovs-ofctl-dump-flows-evicted.txt", "ovs-dpctl-dump-flows-evicted.txt").diff()
    assert classify_flow_diff(d) == FailureType.REPETITIVE_FLOW_OFFLOADING


# -- tc ------------------------------------------------------------------------------------------
def test_tc_filters_text_and_json_agree_and_say_not_in_hw():
    text = parse_tc_filters(read("tc-filter-show.txt"), dev="tca")
    js = parse_tc_filters(read("tc-filter-show.json"), dev="tca")
    assert text == js and len(js) == 2
    spec, wide = js
    assert spec.match_dict == {"dl_type": "0x0800", "in_port": "tca", "nw_dst": "172.16.1.1"}
    assert wide.match_dict["nw_dst"] == "172.16.1.0/24" and spec.priority > wide.priority
    assert spec.actions == ("output:tcb",) and spec.in_hw is False
    # OVS wants both in the NIC, the kernel says neither got there: an offload failure
    want = tuple(FlowRule(r.match, r.actions, r.priority) for r in js)
    d = FlowTables(want, tuple(js)).diff()
    assert len(d.not_in_hw) == 2 and not d.missing and not d.stale
    assert classify_flow_diff(d) == FailureType.OFFLOADING_FAILURE


# -- traceroute -----------------------------------------------------------------------------------
def test_traceroute_outputs():
    ok = parse_traceroute(read("traceroute-ok.txt"))
    assert (
        ok.reached
        and ok.addrs == ("10.9.1.254", "10.9.12.1", "10.9.2.1")
        and len(ok.hops[0].rtt_ms) == 3
    )
    silent = parse_traceroute(read("traceroute-silent.txt"))
    assert not silent.reached and silent.addrs[:3] == ("10.9.1.254", "10.9.12.1", None)
    unr = parse_traceroute(read("traceroute-unreachable.txt"))
    assert not unr.reached and unr.hops[0].icmp == "unreachable" and unr.hops[0].code == 1  # !H
    bh = parse_traceroute(read("traceroute-blackhole.txt"))
    assert not bh.reached and set(bh.addrs) == {None}
    paris = parse_paris_json(read("paris-trace.json"))
    assert paris.reached and paris.hops[0].addr == "10.9.1.254"
    names = {"10.9.1.254": "r1", "10.9.12.1": "r2", "10.9.2.1": "h2"}
    tr = as_trace((0, 1), silent, names, src_node="h1")
    assert tr.nodes == ("h1", "r1", "r2") and not tr.reached
    tr = as_trace((0, 1), ok, names, src_node="h1")
    assert tr.nodes == ("h1", "r1", "r2", "h2") and tr.reached


def test_traceroute_ecmp_mixing_line():
    text = (
        "traceroute to 10.1.1.1 (10.1.1.1), 30 hops max\n"
        " 2  10.200.0.0  0.477 ms 10.201.0.0  0.066 ms 10.200.0.0  0.012 ms\n"
    )
    hop = parse_traceroute(text).hops[0]
    assert (
        hop.addr == "10.200.0.0"
        and hop.alt_addrs == ("10.201.0.0",)
        and hop.rtt_ms == (0.477, 0.066, 0.012)
    )


# -- odd input: never a crash ---------------------------------------------------------------------
PARSERS = [
    ("ovs-ofctl-dump-flows.txt", parse_ofctl_flows),
    ("ovs-ofctl-dump-flows-names.txt", parse_ofctl_flows),
    ("ovs-dpctl-dump-flows.txt", parse_dpctl_flows),
    ("ovs-dpctl-dump-flows-m.txt", parse_dpctl_flows),
    ("ovs-ofctl-show.txt", parse_ofctl_show),
    ("ovs-dpctl-show.txt", parse_dpctl_show),
    ("ip-route.json", parse_ip_route),
    ("ip-route.txt", parse_ip_route),
    ("ip-neigh.json", parse_ip_neigh),
    ("ip-link-detail.json", parse_ip_link),
    ("bridge-fdb-show.json", parse_bridge_fdb),
    ("bridge-fdb-show.txt", parse_bridge_fdb),
    ("traceroute-ok.txt", parse_traceroute),
    ("paris-trace.json", parse_paris_json),
    ("tc-filter-show.txt", parse_tc_filters),
    ("tc-filter-show.json", parse_tc_filters),
]


@pytest.mark.parametrize("name,parse", PARSERS, ids=[p[0] for p in PARSERS])
def test_truncated_and_garbled_output_does_not_crash(name, parse):
    text = read(name)
    full = parse(text)
    rng = random.Random(name)
    cuts = sorted({rng.randrange(len(text) + 1) for _ in range(60)} | {0, 1, len(text) // 2})
    for cut in cuts:
        part = parse(text[:cut])
        assert len(part) <= max(len(full), 1) + 1 if isinstance(part, list) else True
    for _ in range(30):
        chars = list(text)
        for _ in range(10):
            chars[rng.randrange(len(chars))] = rng.choice("(),=:/ \n!*x0")
        parse("".join(chars))
    for odd in (
        "",
        "\n\n",
        "garbage",
        "[",
        "[{]",
        "{}",
        "null",
        "actions=",
        " 1  * * *",
        "port x: y",
    ):
        parse(odd)


def test_truncated_json_keeps_the_complete_rows():
    text = read("bridge-fdb-show.json")
    cut = text.rfind('{"mac"')
    rows = parse_bridge_fdb(text[: cut + 10])
    assert 0 < len(rows) < len(parse_bridge_fdb(text))
    # cut deep inside the last filter's nested actions: every filter before it survives
    text = read("tc-filter-show.json").strip()
    last = text.rfind('{"protocol"')
    head = parse_tc_filters(text[:last].rstrip(",") + "]", dev="tca")
    assert head and parse_tc_filters(text[:-20], dev="tca") == head


def _vxlan_probe_frame(path_id: int = 5, mtype: int = 1, ihl: int = 5, sport: int = 51234) -> bytes:
    """Ethernet / outer IPv4 / UDP to 4789 / VXLAN / inner Ethernet / IPv4 / UDP / skh header."""
    import socket
    import struct

    skh = struct.pack("!IBBBBIIHH", 0x534B4850, 1, mtype, 0, 0, 7, 1, path_id, 0) + bytes(78)
    inner_udp = struct.pack("!HHHH", 41000, 7000, 8 + len(skh), 0)
    inner_ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 28 + len(skh), 0, 0, 64, 17, 0,
        socket.inet_aton("172.16.0.1"), socket.inet_aton("172.16.1.1"),
    )  # fmt: skip
    inner = b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + inner_ip + inner_udp + skh
    vx = struct.pack("!II", 0x08000000, 1000 << 8)
    udp = struct.pack("!HHHH", sport, 4789, 8 + len(vx) + len(inner), 0)
    opts = bytes(4 * (ihl - 5))
    outer = struct.pack(
        "!BBHHHBBH4s4s", 0x40 | ihl, 0, 0, 0, 0, 64, 17, 0,
        socket.inet_aton("10.0.0.1"), socket.inet_aton("10.0.1.1"),
    ) + opts  # fmt: skip
    return b"\x06" * 6 + b"\x08" * 6 + b"\x08\x00" + outer + udp + vx + inner


def test_an_encapsulated_probe_frame_gives_its_flow_and_outer_port():
    from skh.collect.vxlan import INNER_HEADERS, InnerFlow, parse_probe_frame

    for ihl in (5, 6):  # outer IPv4 options shift everything after them
        got = parse_probe_frame(_vxlan_probe_frame(ihl=ihl))
        assert got is not None
        dst, flow, seen = got
        assert (dst, flow, seen.sport) == (
            "10.0.1.1",
            InnerFlow("172.16.0.1", "172.16.1.1", 5),
            51234,
        )
        # what a trace copies: VXLAN header (I flag set, VNI 1000) through the inner UDP header
        assert len(seen.inner) == INNER_HEADERS and seen.inner[:8] == bytes.fromhex(
            "080000000003e800"
        )
        assert seen.inner[-8:-6] == (41000).to_bytes(2, "big")
    # an answer is the flow's other leg; another message type, a frame to another port and
    # every truncation are nothing, never an exception
    assert parse_probe_frame(_vxlan_probe_frame(mtype=2))[1].reply
    assert not parse_probe_frame(_vxlan_probe_frame(mtype=1))[1].reply
    assert parse_probe_frame(_vxlan_probe_frame(mtype=9)) is None
    assert parse_probe_frame(_vxlan_probe_frame(), vxlan_port=8472) is None
    frame = _vxlan_probe_frame()
    # (the probe header starts 98 bytes before the frame ends, its path id ends 80 before)
    assert all(parse_probe_frame(frame[:n]) is None for n in range(len(frame) - 80))
    rng = random.Random(7)
    for _ in range(200):
        b = bytearray(frame)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        parse_probe_frame(bytes(b))  # flipped bits: a flow or None


def test_the_probe_filter_jumps_to_accept_or_drop_only():
    from skh.collect.vxlan import probe_filter

    prog = probe_filter()
    ret_accept, ret_drop = len(prog) - 2, len(prog) - 1
    assert prog[ret_accept][0] == prog[ret_drop][0] == 0x06 and prog[ret_drop][3] == 0
    for i, (code, jt, jf, _k) in enumerate(prog[:-2]):
        if code & 0x07 == 0x05:  # a jump: each way goes to the next row or to "drop"
            assert {i + 1 + jt, i + 1 + jf} <= {i + 1, ret_drop}, (i, jt, jf)


def test_a_flow_seen_again_with_its_known_port_is_not_parsed_again():
    # the learner runs all the time on the host agent: a frame of a flow it recorded lately
    # under the same outer port costs a slice and a lookup; a new port, another flow or the
    # frame layout it has no fixed offsets for (outer IP options) are parsed and recorded
    from skh.collect.vxlan import InnerFlow, OuterPortLearner

    now = [100.0]
    lp = OuterPortLearner(ttl_s=30.0, clock=lambda: now[0])
    for _ in range(50):
        lp._frame(_vxlan_probe_frame(), now[0])
    assert (lp.frames, lp.recorded) == (50, 1)
    lp._frame(_vxlan_probe_frame(sport=40000), now[0])  # the flow hashed anew (engine restart)
    lp._frame(_vxlan_probe_frame(path_id=6), now[0])
    lp._frame(_vxlan_probe_frame(ihl=6, sport=40000), now[0])
    lp._frame(_vxlan_probe_frame(ihl=6, sport=40000), now[0])
    assert lp.recorded == 5
    flow = InnerFlow("172.16.0.1", "172.16.1.1", 5)
    assert lp.lookup("10.0.1.1", flow, 0.0).sport == 40000
    # refreshed a tenth of the ttl later, so what a lookup finds stays fresh
    now[0] += 3.5
    lp._frame(_vxlan_probe_frame(sport=40000), now[0])
    assert lp.recorded == 6
    # forgotten once no frame came for longer than the ttl
    now[0] += 31
    lp._prune(now[0])
    assert lp.flows() == 0 and lp.lookup("10.0.1.1", flow, 0.0) is None
