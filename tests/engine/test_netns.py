"""The engine across a real veth pair between two network namespaces (root)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from skh.errors import CapabilityError
from skh.probe import Engine
from skh.records import ProbeStatus, TsSource

sys.path.insert(0, str(Path(__file__).parent))
from skhe_helpers import assert_accounted, quiesce, wait_for  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.netns]


@pytest.fixture
def pair(veth, make_engine):
    fa, fb = veth.fd(veth.ns_a), veth.fd(veth.ns_b)
    try:
        responder = make_engine(bind="0.0.0.0", netns_fd=fb, endpoint_id=2)
        prober = make_engine(bind="0.0.0.0", netns_fd=fa, endpoint_id=1, timeout_s=0.2)
    finally:
        os.close(fa), os.close(fb)
    responder.start(), prober.start()
    return prober, responder


def run(prober: Engine, host: str, port: int, n: int, interval_s: float = 0.005):
    before = prober.stats().decided
    prober.add_target(9, host, port, interval_s=interval_s, count=n)
    assert wait_for(lambda: prober.stats().decided - before >= n, timeout_s=10)
    rows = prober.drain()
    assert len(rows) == n
    return rows


def test_rtt_across_veth(veth, pair):
    prober, responder = pair
    rows = run(prober, veth.ip_b, responder.local_port, 100)
    ok = rows[rows["status"] == ProbeStatus.OK]
    assert len(ok) >= 95, np.unique(rows["status"], return_counts=True)
    # A stamp that is late (a cold first packet on a loaded machine) falls back to the user clock,
    # labelled as such; the kernel clock must carry all but a few.
    kernel = ok["ts_source"] == TsSource.KERNEL
    assert kernel.mean() >= 0.95, np.unique(ok["ts_source"], return_counts=True)
    assert (ok["ts_source"][~kernel] == TsSource.USER).all()
    assert (ok["rtt_ns"] > 0).all() and np.median(ok["rtt_ns"]) < 500_000
    assert_accounted(prober.stats())
    assert_accounted(quiesce(responder))
    assert responder.stats().probes_received == prober.stats().sent


def test_dropping_firewall_means_all_lost(veth, pair):
    prober, responder = pair
    port = responder.local_port
    veth.sh(
        veth.ns_b,
        "nft",
        f"add table inet skhe; add chain inet skhe in {{ type filter hook input priority 0; }}; "
        f"add rule inet skhe in udp dport {port} drop",
    )
    try:
        rows = run(prober, veth.ip_b, port, 30)
    finally:
        veth.sh(veth.ns_b, "nft", "delete table inet skhe")
    assert len(rows) >= 30
    assert (rows["status"] == ProbeStatus.LOST).all()
    assert (rows["rtt_ns"] == -1).all()
    assert responder.stats().probes_received == 0
    assert_accounted(prober.stats())


def test_rejecting_firewall_means_unreachable(veth, pair):
    prober, responder = pair
    port = responder.local_port
    veth.sh(
        veth.ns_b,
        "nft",
        f"add table inet skhe; add chain inet skhe in {{ type filter hook input priority 0; }}; "
        f"add rule inet skhe in udp dport {port} reject with icmp type admin-prohibited",
    )
    try:
        rows = run(prober, veth.ip_b, port, 20)
    finally:
        veth.sh(veth.ns_b, "nft", "delete table inet skhe")
    assert (rows["status"] == ProbeStatus.UNREACHABLE).all()
    assert prober.stats().icmp_errors == len(rows)


def test_closed_port_is_refused_and_unrouted_is_unreachable(veth, pair):
    prober, responder = pair
    rows = run(prober, veth.ip_b, 9, 10)  # host up, nothing listening
    assert (rows["status"] == ProbeStatus.REFUSED).all()
    rows = run(prober, "203.0.113.7", 7471, 10)  # no route at all in the namespace
    assert (rows["status"] == ProbeStatus.UNREACHABLE).all()
    s = prober.stats()
    assert s.send_errors == len(rows)
    assert_accounted(s)


def test_veth_has_no_nic_clock(veth):
    fd = veth.fd(veth.ns_a)
    try:
        dev = f"skhe-va{veth.ns_a.rsplit('-', 1)[1]}"
        with pytest.raises(CapabilityError):
            Engine(bind="0.0.0.0", netns_fd=fd, hw_timestamps=True, device=dev)
    finally:
        os.close(fd)


def test_paths_across_veth_and_their_icmp_errors(veth, pair):
    prober, responder = pair
    for path_id in (0, 3, 4):
        prober.add_target(
            20 + path_id,
            veth.ip_b,
            responder.local_port,
            interval_s=0.005,
            path_id=path_id,
            count=20,
        )
        prober.add_target(40 + path_id, veth.ip_b, 9, interval_s=0.005, path_id=path_id, count=5)
    assert wait_for(lambda: prober.stats().decided >= 75)
    rows = prober.drain()
    ok = rows[rows["dst_ep"] < 40]
    refused = rows[rows["dst_ep"] >= 40]
    assert len(ok) == 60 and (ok["status"] == ProbeStatus.OK).all()
    assert (ok["ts_source"] == TsSource.KERNEL).all()
    assert len(refused) == 15 and (refused["status"] == ProbeStatus.REFUSED).all()
    assert sorted(set(refused["path_id"].tolist())) == [0, 3, 4]


@pytest.mark.parametrize("direction", ["request", "reply"])
def test_loss_by_direction_across_veth(veth, pair, direction):
    """nftables on the responder's side drops 20 % of the probes (input) or 20 % of the replies
    (output), at random: the records say which direction, and the counts match what the
    responder saw."""
    prober, responder = pair
    port = responder.local_port
    hook, match = ("input", f"udp dport {port}") if direction == "request" else ("output", "")
    match = match or f"udp sport {port}"
    veth.sh(
        veth.ns_b,
        "nft",
        f"add table inet skhe; add chain inet skhe c {{ type filter hook {hook} priority 0; }}; "
        f"add rule inet skhe c {match} numgen random mod 100 < 20 drop",
    )
    n = 600
    try:
        rows = run(prober, veth.ip_b, port, n, interval_s=0.002)
    finally:
        veth.sh(veth.ns_b, "nft", "delete table inet skhe")
    s = quiesce(prober)
    r = quiesce(responder)
    assert_accounted(s)
    counts = {st: int((rows["status"] == st).sum()) for st in ProbeStatus}
    answered = counts[ProbeStatus.OK] + counts[ProbeStatus.INVALID]
    # only a probe whose later probes all went unanswered too can stay LOST: the last one or two
    assert counts[ProbeStatus.LOST] <= 3, counts
    if direction == "request":
        dropped = s.sent - r.probes_received  # exactly the requests that never arrived
        assert counts[ProbeStatus.REPLY_LOST] == 0, counts
        assert dropped - 3 <= counts[ProbeStatus.REQUEST_LOST] <= dropped, (dropped, counts)
        assert answered == r.probes_received
        # binomial(600, 0.2): mean 120, sd 9.8
        assert 70 <= counts[ProbeStatus.REQUEST_LOST] <= 170, counts
    else:
        assert r.probes_received == s.sent  # every request arrived
        assert counts[ProbeStatus.REQUEST_LOST] == 0, counts
        assert counts[ProbeStatus.REPLY_LOST] + counts[ProbeStatus.LOST] == n - answered
        # a probe loses an answer with probability 1 - 0.8^2 = 0.36: mean 216, sd 11.8
        assert 150 <= counts[ProbeStatus.REPLY_LOST] <= 280, counts
