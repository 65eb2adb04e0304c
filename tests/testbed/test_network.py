"""The built network: underlay reachability and real router hops under ECMP, the VXLAN overlay
on every rail, the management network, and the model exported for it."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from skh.model import Fabric
from skh.testbed.netns import socket_in

pytestmark = [pytest.mark.root, pytest.mark.netns]


def test_underlay_every_rnic_reaches_every_same_rail_rnic(testbed, tbh):
    L = testbed.layout
    for r in range(testbed.spec.rnics_per_host):
        for g in range(testbed.spec.hosts):
            for g2 in range(testbed.spec.hosts):
                if g == g2:
                    continue
                res = tbh.probe(L.host_ns(g), L.rnic_ip(g, r), L.host_ns(g2), L.rnic_ip(g2, r), n=2)
                assert res.answered == 2, (g, g2, r, res)


def test_flow_pinned_trace_shows_tor_spine_tor_and_both_spines(testbed, tbh):
    L = testbed.layout
    fabric = testbed.fabric()
    owners = testbed.ip_owners()
    src, dst = fabric.rnic("host0", 0), fabric.rnic("host3", 0)  # segment 0 → segment 1
    ecmp = set(fabric.ecmp_paths(src, dst))
    spines_seen = set()
    for sport in range(40000, 40012):
        hops = tbh.trace(L.host_ns(0), src.ip, dst.ip, sport=sport)
        path = (src.key, *(owners.get(h, h) for h in hops))
        # the destination answers port-unreachable from its own RNIC address
        assert path in ecmp, (sport, hops, path, ecmp)
        spines_seen.add(path[2])
        # the same 5-tuple keeps its path
        assert tbh.trace(L.host_ns(0), src.ip, dst.ip, sport=sport) == hops
    assert spines_seen == {"spine0", "spine1"}


def test_same_segment_trace_is_one_tor_hop(testbed, tbh):
    L = testbed.layout
    hops = tbh.trace(L.host_ns(0), L.rnic_ip(0, 1), L.rnic_ip(1, 1), sport=40001)
    assert hops == [L.rnic_ip(1, 1)]  # bridged by tor0r1: no router hop


def test_overlay_container_to_container_on_each_rail(testbed, tbh):
    cluster = testbed.cluster()
    eps = cluster.endpoints
    checked = 0
    for a in eps:
        for b in eps:
            if a.rail != b.rail or a.container == b.container:
                continue
            res = tbh.probe(testbed.endpoint_ns(a), a.ip, testbed.endpoint_ns(b), b.ip, n=1)
            assert res.answered == 1, (a.name, b.name, res)
            checked += 1
    assert checked == 2 * 8 * 7


def test_overlay_trace_hides_underlay(testbed, tbh):
    L = testbed.layout
    hops = tbh.trace(L.container_ns(0, 0), L.vf_ip(0, 0, 0), L.vf_ip(3, 0, 0), sport=41000)
    # the source host (answering from its management address, the main table's source), the
    # destination VTEP, the destination VF: no ToR or spine shows up inside the overlay
    owners = testbed.ip_owners()
    assert len(hops) == 3
    assert [owners.get(h, h) for h in hops[1:]] == ["host3:vx0", "c3x0"], hops


def _foreign_holders(ip: str, own_dev: str) -> list[str]:
    """Root-namespace devices other than ``own_dev`` that carry ``ip``."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True)
    return [
        link["ifname"]
        for link in json.loads(out.stdout or "[]")
        if link["ifname"] != own_dev
        and any(a.get("local") == ip for a in link.get("addr_info", ()))
    ]


def test_mgmt_network_reaches_every_agent_namespace_from_root(testbed):
    state = testbed.state()
    # every prefix uses the same management subnet: another testbed up beside this one (a
    # shared development machine, never CI) makes the root side ambiguous
    other = _foreign_holders(state["mgmt"]["root_ip"], testbed.layout.mgmt_root_dev)
    if other:
        pytest.skip(f"another testbed's {other} holds the management address")
    targets = [(h["ns"], h["mgmt_ip"]) for h in state["hosts"].values()]
    targets += [(c["ns"], c["mgmt_ip"]) for c in state["containers"].values()]
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((state["mgmt"]["root_ip"], 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    try:
        for ns, ip in targets:
            cli = socket_in(ns, type=socket.SOCK_STREAM)
            cli.settimeout(2)
            cli.bind((ip, 0))
            cli.connect((state["mgmt"]["root_ip"], port))
            conn, addr = srv.accept()
            assert addr[0] == ip
            conn.close()
            cli.close()
    finally:
        srv.close()


def test_state_file_and_model_agree(testbed):
    state = json.loads(testbed.state_path.read_text())
    fabric = testbed.fabric()
    cluster = testbed.cluster()
    assert Fabric.from_mapping(state["fabric"]).links == fabric.links
    assert [(e["ep_id"], e["name"], e["ip"]) for e in state["endpoints"]] == [
        (e.ep_id, e.name, e.ip) for e in cluster.endpoints
    ]
    assert set(state["hosts"]) == set(fabric.hosts)
    assert set(state["switches"]) == set(fabric.switches)
    assert ("host1:rnic0", "tor0r0") in fabric.links and ("spine1", "tor1r1") in fabric.links
    for ep in cluster.endpoints:
        vf = state["containers"][ep.container]["vfs"][ep.rail]
        assert vf["ip"] == ep.ip and vf["dev"] == ep.netdev
    assert [e.ep_id for e in cluster.endpoints] == list(range(16))
    assert {j: len(cluster.job_endpoints(j)) for j in cluster.jobs} == {"job0": 8, "job1": 8}
    # job0 (PP 2 x DP 2) on slot 0 of each host, job1 (DP 4) on slot 1
    assert [c.host for c in cluster.jobs["job0"].containers] == ["host0", "host1", "host2", "host3"]
    assert all(c.name.endswith("x1") for c in cluster.jobs["job1"].containers)


def test_counters_rows_keyed_by_endpoint_and_see_traffic(testbed, tbh):
    cluster = testbed.cluster()
    src = testbed.counter_source()
    before = src.read()
    assert list(before["ep"]) == [e.ep_id for e in cluster.endpoints]
    assert before["oper_up"].all()
    a, b = cluster.endpoint("job1/c0x1/1"), cluster.endpoint("job1/c2x1/1")
    tbh.probe(testbed.endpoint_ns(a), a.ip, testbed.endpoint_ns(b), b.ip, n=20, size=1000)
    after = src.read()
    d_tx = after["tx_bytes"].astype(int) - before["tx_bytes"].astype(int)
    d_rx = after["rx_bytes"].astype(int) - before["rx_bytes"].astype(int)
    assert d_tx[a.ep_id] >= 20 * 1000 and d_rx[a.ep_id] >= 20 * 1000  # requests out, echoes back
    assert d_rx[b.ep_id] >= 20 * 1000
    others = [e.ep_id for e in cluster.endpoints if e.ep_id not in (a.ep_id, b.ep_id)]
    assert (d_tx[others] < 2000).all()
    per_host = testbed.counter_source("host2").read()
    assert set(per_host["ep"]) == {e.ep_id for e in cluster.endpoints if e.host == "host2"}
