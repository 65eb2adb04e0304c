"""Collectors against real kernels state: a flow-pinned trace across routers in namespaces, one
pinned to a VXLAN flow's outer 5-tuple across two ECMP paths, and the pyroute2 overlay reader on
a kernel-VXLAN overlay whose forwarding graph the walk follows."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
import uuid

import pytest

from skh.analysis.localize import FailureType, Localizer, Suspect, walk_overlay
from skh.collect.linux import (
    LocalEndpoint,
    linux_overlay_tables,
    parse_bridge_fdb,
    parse_ip_route,
    read_linux_state,
)
from skh.collect.netdev import in_netns
from skh.collect.trace import paris_trace, vxlan_trace
from skh.collect.vxlan import InnerFlow, OuterPortLearner
from skh.model import Cluster, Fabric

pytestmark = [pytest.mark.root, pytest.mark.netns]


def sh(script: str) -> str:
    return subprocess.run(
        ["bash", "-ec", script], check=True, capture_output=True, text=True, timeout=60
    ).stdout


@pytest.fixture
def names():
    tag = uuid.uuid4().hex[:4]
    made: list[str] = []

    def ns(base: str) -> str:
        name = f"skhl-{tag}{base}"
        sh(f"ip netns add {name}; ip -n {name} link set lo up")
        made.append(name)
        return name

    yield ns
    for name in made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_paris_trace_follows_and_stops_at_the_frontier(names):
    h1, r1, r2, h2 = names("h1"), names("r1"), names("r2"), names("h2")
    sh(f"""
    ip link add e0 netns {h1} type veth peer name e0 netns {r1}
    ip link add e1 netns {r1} type veth peer name e0 netns {r2}
    ip link add e1 netns {r2} type veth peer name e0 netns {h2}
    ip -n {h1} addr add 10.9.1.1/24 dev e0; ip -n {r1} addr add 10.9.1.254/24 dev e0
    ip -n {r1} addr add 10.9.12.0/31 dev e1; ip -n {r2} addr add 10.9.12.1/31 dev e0
    ip -n {r2} addr add 10.9.2.254/24 dev e1; ip -n {h2} addr add 10.9.2.1/24 dev e0
    for n in {h1} {r1} {r2} {h2}; do
      for d in e0 e1; do ip -n $n link set $d up 2>/dev/null || true; done
    done
    for n in {r1} {r2} {h2}; do ip netns exec $n sysctl -qw net.ipv4.icmp_ratelimit=0; done
    for n in {r1} {r2}; do
      ip netns exec $n sysctl -qw net.ipv4.ip_forward=1 net.ipv4.icmp_errors_use_inbound_ifaddr=1
    done
    ip -n {h1} route add default via 10.9.1.254; ip -n {h2} route add default via 10.9.2.254
    ip -n {r1} route add 10.9.2.0/24 via 10.9.12.1; ip -n {r2} route add 10.9.1.0/24 via 10.9.12.0
    """)

    def trace(max_ttl: int, timeout_s: float, all_at_once: bool):
        with in_netns(h1):
            return paris_trace(
                "10.9.2.1",
                src="10.9.1.1",
                sport=40002,
                max_ttl=max_ttl,
                timeout_s=timeout_s,
                all_at_once=all_at_once,
            )

    for all_at_once in (True, False):
        res = trace(6, 1.0, all_at_once)
        assert res.reached and res.addrs == ("10.9.1.254", "10.9.12.1", "10.9.2.1")
        assert [h.icmp for h in res.hops] == ["time-exceeded", "time-exceeded", "unreachable"]
    # r2 silently drops everything for h2: the trace ends at r2, the frontier
    sh(f"ip -n {r2} route replace blackhole 10.9.2.1/32")
    for all_at_once in (True, False):
        t0 = time.monotonic()
        res = trace(4, 0.3, all_at_once)
        took_s = time.monotonic() - t0
        assert not res.reached and res.addrs == ("10.9.1.254", None, None, None)
        # (r2 drops before its TTL check, so the last answering hop is r1: the link r1–r2 or r2)
        # three silent hops: one timeout with every TTL in flight, three one by one
        assert (took_s < 0.6) if all_at_once else (took_s >= 0.9), (all_at_once, took_s)


def test_a_trace_whose_answers_cannot_be_told_apart_is_taken_one_ttl_at_a_time(monkeypatch):
    # a router that quotes only the 8 bytes RFC 792 requires leaves no payload to match; the
    # trace is then taken again one TTL at a time, over loopback here
    from skh.collect import trace

    calls = []
    real = trace._receive

    def short_quotes(s):
        got = real(s)
        calls.append(got)
        return None if got is None else (b"", got[1])

    monkeypatch.setattr(trace, "_receive", short_quotes)
    res = paris_trace("127.0.0.1", src="127.0.0.1", sport=40003, max_ttl=3, timeout_s=0.5)
    assert res.reached and res.addrs == ("127.0.0.1",) and calls


def test_pyroute2_overlay_state_walks_and_breaks(names):
    a, b, ca, cb = names("a"), names("b"), names("ca"), names("cb")
    sh(f"""
    ip link add rnic0 netns {a} type veth peer name rnic0 netns {b}
    for pair in "{a} 0 1" "{b} 1 0"; do set -- $pair; h=$1; g=$2; o=$3
      ip -n $h addr add 10.0.0.$((g+1))/24 dev rnic0; ip -n $h link set rnic0 up
      ip -n $h link add vx0 type vxlan id 1000 local 10.0.0.$((g+1)) dev rnic0 \
        dstport 4789 nolearning
      ip -n $h link set vx0 address 02:00:00:00:00:0$g; ip -n $h link set vx0 up
      ip -n $h addr add 172.16.$g.0/32 dev vx0
      ip -n $h route add 172.16.$o.0/24 via 172.16.$o.0 dev vx0 onlink
      ip -n $h neigh add 172.16.$o.0 lladdr 02:00:00:00:00:0$o dev vx0 nud permanent
      bridge -n $h fdb append 02:00:00:00:00:0$o dev vx0 dst 10.0.0.$((o+1))
    done
    for pair in "{a} {ca} 0" "{b} {cb} 1"; do set -- $pair; h=$1; c=$2; g=$3
      ip link add vf0 netns $c type veth peer name c0v0 netns $h
      ip -n $h link set c0v0 up; ip -n $h route add 172.16.$g.1/32 dev c0v0
      ip -n $c addr add 172.16.$g.1/32 dev vf0; ip -n $c link set vf0 up
    done
    """)
    st_a, st_b = read_linux_state(a), read_linux_state(b)
    # pyroute2 and the iproute2 parsers see the same state
    assert {(r.dst, r.dev, r.gateway) for r in st_a.routes if r.table == "main"} == {
        (r.dst, r.dev, r.gateway) for r in parse_ip_route(sh(f"ip -n {a} -j route"))
    }
    assert {(e.mac, e.dev, e.dst) for e in st_a.fdb if e.dst} == {
        (e.mac, e.dev, e.dst) for e in parse_bridge_fdb(sh(f"bridge -n {a} -j fdb show")) if e.dst
    }
    assert st_a.links["vx0"] == "vxlan"
    vteps = {"10.0.0.1": "A", "10.0.0.2": "B"}
    dsts = ["172.16.0.1", "172.16.1.1"]
    eps = {
        "A": [LocalEndpoint("A/vf:c0.0", "172.16.0.1", "c0v0")],
        "B": [LocalEndpoint("B/vf:c1.0", "172.16.1.1", "c0v0")],
    }

    def tables(state_a, state_b):
        return {
            "A": linux_overlay_tables("A", state_a, eps["A"], dsts, vteps),
            "B": linux_overlay_tables("B", state_b, eps["B"], dsts, vteps),
        }

    def walk(state_a, state_b):
        return walk_overlay(
            (0, 1), "A/vf:c0.0", "172.16.1.1", "B/vf:c1.0", tables(state_a, state_b)
        )

    def walk_now():
        return walk(read_linux_state(a), read_linux_state(b))

    w = walk(st_a, st_b)
    assert w.status == "ok", w
    assert w.chain == (
        "A/vf:c0.0",
        "A/rep:c0v0",
        "A/route",
        "A/vtep:vx0",
        "B/decap:vx0",
        "B/route",
        "B/rep:c0v0",
        "B/vf:c1.0",
    )
    # the testbed's FDB black hole: the VTEP mapping of B's MAC is gone on A
    sh(f"bridge -n {a} fdb del 02:00:00:00:00:01 dev vx0 dst 10.0.0.2")
    w = walk(read_linux_state(a), st_b)
    assert (w.status, w.hop) == ("break", "A/vtep:vx0")
    # the localizer, fed the hosts' real state, names the hop
    fab = Fabric.from_params(hosts=2, rnics_per_host=1, hosts_per_segment=2, spines=1, cores=0)
    cl = Cluster(fab)
    cl.add_endpoint(job="j", container="c0", host="host0", rail=0, ip="172.16.0.1")
    cl.add_endpoint(job="j", container="c1", host="host1", rail=0, ip="172.16.1.1")
    alias = {"host0": "A", "host1": "B"}

    class Source:  # what the hosts' agents would answer, read from the namespaces now
        def overlay_tables(self, host):
            return tables(read_linux_state(a), read_linux_state(b))[host]

        def traceroute(self, pair, path_id):
            return None

        def flow_tables(self, host, rail):
            return None

        def host_report(self, host):
            return None

    loc = Localizer(
        cl, overlay_endpoint=lambda ep: (f"{alias[ep.host]}/vf:c{ep.host[-1]}.0", ep.ip)
    )
    (v,) = loc.localize([Suspect(((0, 1),), "unreachable", 0)], Source(), now_ns=1)
    assert (v.layer, v.component, v.failure_type) == (
        "overlay",
        "A/vtep:vx0",
        FailureType.OVERLAY_BLACKHOLE,
    )
    sh(f"bridge -n {a} fdb append 02:00:00:00:00:01 dev vx0 dst 10.0.0.2")
    # the testbed's overlay loop: B routes the destination back to A
    sh(f"ip -n {b} route replace 172.16.1.1/32 via 172.16.0.0 dev vx0 onlink")
    sh(f"ip -n {b} neigh replace 172.16.0.0 lladdr 02:00:00:00:00:00 dev vx0 nud permanent")
    w = walk_now()
    assert w.status == "loop" and w.hop == "A/route"
    # the container's VF peer goes down: the representor is down
    sh(f"ip -n {b} route replace 172.16.1.1/32 dev c0v0; ip -n {cb} link set vf0 down")
    w = walk_now()
    assert (w.status, w.hop) == ("down", "B/rep:c0v0")


def _skh_probe(path_id: int) -> bytes:
    """An skh PROBE as the engine sends it (csrc/proto.h: magic, version, type, flags,
    ts_source, session, seq, path_id, ...), padded to the minimum probe length."""
    hdr = struct.pack("!IBBBBIIHH", 0x534B4850, 1, 1, 0, 0, 7, 1, path_id, 0)
    return hdr + bytes(96 - len(hdr))


def test_a_vxlan_flows_trace_takes_the_ecmp_path_its_frames_take(names):
    """Two VTEPs over a fabric with two equal-cost paths (hashing the outer 5-tuple): each
    overlay probe flow's frames take the path its outer source port hashes to, which the kernel
    draws from the inner flow with a per-boot seed. (The routers hash the outer 5-tuple as a
    switch does, policy 3; policy 1 reuses the inner flow's hash the frame's skb carries.) The
    learner sees the port leave, the pinned trace crosses the router the frames crossed
    (counted on the routers), reaches the far VTEP, and stops there when that router silently
    drops, while a flow on the other path still reaches."""
    h1, r1, ra, rb, r3, h2 = (names(n) for n in ("h1", "r1", "ra", "rb", "r3", "h2"))
    sh(f"""
    ip link add rnic0 netns {h1} type veth peer name e0 netns {r1}
    ip link add ua netns {r1} type veth peer name d0 netns {ra}
    ip link add ub netns {r1} type veth peer name d0 netns {rb}
    ip link add d1 netns {ra} type veth peer name ua netns {r3}
    ip link add d1 netns {rb} type veth peer name ub netns {r3}
    ip link add e0 netns {r3} type veth peer name rnic0 netns {h2}
    ip -n {h1} addr add 10.9.1.1/24 dev rnic0; ip -n {r1} addr add 10.9.1.254/24 dev e0
    ip -n {r1} addr add 10.9.11.0/31 dev ua; ip -n {ra} addr add 10.9.11.1/31 dev d0
    ip -n {r1} addr add 10.9.12.0/31 dev ub; ip -n {rb} addr add 10.9.12.1/31 dev d0
    ip -n {ra} addr add 10.9.21.0/31 dev d1; ip -n {r3} addr add 10.9.21.1/31 dev ua
    ip -n {rb} addr add 10.9.22.0/31 dev d1; ip -n {r3} addr add 10.9.22.1/31 dev ub
    ip -n {r3} addr add 10.9.2.254/24 dev e0; ip -n {h2} addr add 10.9.2.1/24 dev rnic0
    for n in {h1} {r1} {ra} {rb} {r3} {h2}; do
      for d in rnic0 e0 ua ub d0 d1; do ip -n $n link set $d up 2>/dev/null || true; done
      ip netns exec $n sysctl -qw net.ipv4.icmp_ratelimit=0
    done
    for n in {r1} {ra} {rb} {r3}; do
      ip netns exec $n sysctl -qw net.ipv4.ip_forward=1 net.ipv4.icmp_errors_use_inbound_ifaddr=1 \
        net.ipv4.fib_multipath_hash_policy=3 net.ipv4.fib_multipath_hash_fields=0x37
    done
    ip -n {h1} route add default via 10.9.1.254; ip -n {h2} route add default via 10.9.2.254
    ip -n {r1} route add 10.9.2.0/24 nexthop via 10.9.11.1 nexthop via 10.9.12.1
    ip -n {r3} route add 10.9.1.0/24 nexthop via 10.9.21.0 nexthop via 10.9.22.0
    for n in {ra} {rb}; do
      ip -n $n route add 10.9.1.0/24 via 10.9.$([ $n = {ra} ] && echo 11.0 || echo 12.0)
    done
    ip -n {ra} route add 10.9.2.0/24 via 10.9.21.1; ip -n {rb} route add 10.9.2.0/24 via 10.9.22.1
    for pair in "{h1} 1 2" "{h2} 2 1"; do set -- $pair; h=$1; g=$2; o=$3
      ip -n $h link add vx0 type vxlan id 1000 local 10.9.$g.1 dev rnic0 dstport 4789 nolearning
      ip -n $h link set vx0 address 02:00:00:00:00:0$g; ip -n $h link set vx0 up
      ip -n $h addr add 172.30.0.$g/24 dev vx0
      ip -n $h neigh add 172.30.0.$o lladdr 02:00:00:00:00:0$o dev vx0 nud permanent
      bridge -n $h fdb append 02:00:00:00:00:0$o dev vx0 dst 10.9.$o.1
    done
    """)
    via = {"10.9.11.1": ra, "10.9.12.1": rb}

    def rx(ns: str) -> int:
        return int(sh(f"ip netns exec {ns} cat /sys/class/net/d0/statistics/rx_packets"))

    socks = []
    with in_netns(h1):
        for _ in range(16):  # one overlay socket per path id, as the UDP engine keeps
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("172.30.0.1", 0))
            socks.append(s)
        # learning runs ahead of any trace, as the host agent runs it (the frames below are the
        # flows' only frames until a trace looks them up: no lookup waits for one)
        learner = OuterPortLearner(ttl_s=300.0)
        learner.start()
    try:
        taken: dict[int, str] = {}  # path id -> the router its frames crossed
        for pid, s in enumerate(socks):
            before = {ns: rx(ns) for ns in via.values()}
            for _ in range(40):
                s.sendto(_skh_probe(pid), ("172.30.0.2", 7000))
            time.sleep(0.05)
            grew = [ns for ns in via.values() if rx(ns) - before[ns] >= 40]
            assert len(grew) == 1, (pid, grew)
            taken[pid] = grew[0]
        # the flows spread over both paths (else this test could pass with one fixed path)
        assert set(taken.values()) == set(via.values()), taken

        def pinned(pid: int):
            stop = threading.Event()

            def keep_probing():  # the engine probes on while the flow is traced
                while not stop.wait(0.05):
                    socks[pid].sendto(_skh_probe(pid), ("172.30.0.2", 7000))

            t = threading.Thread(target=keep_probing)
            t.start()
            try:
                with in_netns(h1):
                    flow = InnerFlow("172.30.0.1", "172.30.0.2", pid)
                    seen = learner.lookup("10.9.2.1", flow, 0.0)
                    assert seen is not None, learner.error
                    return vxlan_trace(
                        "10.9.2.1",
                        src="10.9.1.1",
                        outer_sport=seen.sport,
                        inner=seen.inner,
                        max_ttl=6,
                        timeout_s=0.5,
                    )
            finally:
                stop.set()
                t.join()

        t0 = time.monotonic()
        for pid, router in taken.items():
            res = pinned(pid)
            assert res.reached, (pid, res)
            assert res.addrs[0] == "10.9.1.254" and res.addrs[-1] == "10.9.2.1", res
            assert via[res.addrs[1]] == router, (pid, res.addrs, router)
        # a pinned trace that reaches stops at the hop before the silent far VTEP once the plain
        # trace beside it found the destination, instead of waiting out its 0.5 s timeout each
        assert time.monotonic() - t0 < 0.5 * len(taken) / 2
        # router ra silently drops everything for h2: flows through ra stop at r1, the others
        # still reach
        sh(f"ip -n {ra} route replace blackhole 10.9.2.0/24")
        for pid in (
            min(p for p, r in taken.items() if r == ra),
            min(p for p, r in taken.items() if r == rb),
        ):
            res = pinned(pid)
            if taken[pid] == ra:
                assert not res.reached and res.addrs[:2] == ("10.9.1.254", None), res
            else:
                assert res.reached and via[res.addrs[1]] == rb, res
    finally:
        learner.stop()
        for s in socks:
            s.close()
