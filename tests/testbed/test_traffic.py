"""The training-traffic generator: its plan (pure) and its bursts in real VF counters."""

from __future__ import annotations

import time

import numpy as np
import pytest

from skh.errors import ConfigError
from skh.testbed import Testbed
from skh.testbed.traffic import TrafficConfig, job_skeleton, plan_job


def test_plan_follows_the_job_shape(tbh):
    cluster = Testbed(tbh.SMALL).cluster()  # pure: no namespaces needed
    cfg = TrafficConfig(period_s=2.0, slot_s=0.5, allreduce_bytes=1_000_000, pp_bytes=300_000)
    groups, pairs = job_skeleton(cluster, "job0")
    name = {e.ep_id: e.name for e in cluster.endpoints}
    assert [[name[i] for i in g] for g in groups] == [
        ["job0/c0x0/0", "job0/c1x0/0"],
        ["job0/c0x0/1", "job0/c1x0/1"],
        ["job0/c2x0/0", "job0/c3x0/0"],
        ["job0/c2x0/1", "job0/c3x0/1"],
    ]
    assert sorted((name[a], name[b]) for a, b in pairs) == [
        ("job0/c0x0/0", "job0/c2x0/0"),
        ("job0/c0x0/1", "job0/c2x0/1"),
        ("job0/c1x0/0", "job0/c3x0/0"),
        ("job0/c1x0/1", "job0/c3x0/1"),
    ]
    plan = plan_job(cluster, "job0", cfg)
    # stage 0 container: forward at slot 0, its all-reduce at slot 3, on both rails
    kinds = sorted((s.offset_s, s.kind, s.nbytes) for s in plan["c0x0"])
    assert kinds == [(0.0, "pp_fwd", 300_000)] * 2 + [(1.5, "dp", 1_000_000)] * 2
    # stage 1: backward and all-reduce at slot 2
    assert sorted({(s.offset_s, s.kind) for s in plan["c2x0"]}) == [(1.0, "dp"), (1.0, "pp_bwd")]
    # sends stay on their rail
    ip_rail = {e.ip: e.rail for e in cluster.endpoints}
    assert all(ip_rail[s.src_ip] == ip_rail[s.dst_ip] for sends in plan.values() for s in sends)
    groups1, pairs1 = job_skeleton(cluster, "job1")
    assert len(groups1) == 2 and all(len(g) == 4 for g in groups1) and pairs1 == []
    with pytest.raises(ConfigError):
        plan_job(cluster, "job0", TrafficConfig(period_s=1.0, slot_s=0.5))  # 4 slots do not fit
    with pytest.raises(ConfigError):
        TrafficConfig(datagram_bytes=9000)


@pytest.mark.root
@pytest.mark.netns
def test_bursts_show_in_counters_with_the_right_groups(testbed):
    cfg = TrafficConfig(period_s=2.0, slot_s=0.5, allreduce_bytes=1_000_000, pp_bytes=200_000)
    cluster = testbed.cluster()
    src = testbed.counter_source()
    iterations = 3
    t0_ns = (time.time_ns() // 1_000_000_000 + 3) * 1_000_000_000
    procs = []
    try:
        for job in ("job0", "job1"):
            procs += testbed.start_traffic(job, cfg, iterations=iterations, t0_ns=t0_ns)
        # one sample per slot, just before the slot starts: a burst never starts early and may
        # start late (a loaded machine) by most of a slot and still fall into its own bin
        bin_s = cfg.slot_s
        bins = int(iterations * cfg.period_s / bin_s) + 1
        t0 = t0_ns / 1e9
        rows = []
        for m in range(bins + 1):
            time.sleep(max(0.0, t0 - 0.05 + m * bin_s - time.time()))
            rows.append(src.read())
    finally:
        for p in procs:
            testbed.stop(p)
    tx = np.diff(np.stack([r["tx_bytes"] for r in rows]).astype(np.int64), axis=0)  # (bins, eps)
    rx = np.diff(np.stack([r["rx_bytes"] for r in rows]).astype(np.int64), axis=0)
    per_period = int(cfg.period_s / bin_s)
    phase_tx = np.stack([tx[k::per_period].sum(axis=0) for k in range(per_period)])  # (phase, eps)
    peak = phase_tx.argmax(axis=0)
    # where each endpoint's biggest burst (its all-reduce) lands, in bins of the period
    want_slot = {}
    for ep in cluster.endpoints:
        job = cluster.jobs[ep.job]
        i = [c.name for c in job.containers].index(ep.container)
        stage = i // job.shape.dp
        want_slot[ep.ep_id] = 2 * job.shape.pp - 1 - stage
    for ep in cluster.endpoints:
        assert peak[ep.ep_id] == want_slot[ep.ep_id], (ep.name, phase_tx[:, ep.ep_id])
    # groups recovered from the counters (same burst phase, same job, same rail) are the truth
    seen = {}
    for ep in cluster.endpoints:
        seen.setdefault((ep.job, ep.rail, int(peak[ep.ep_id])), set()).add(ep.ep_id)
    truth = [set(g) for job in ("job0", "job1") for g in job_skeleton(cluster, job)[0]]
    assert sorted(map(sorted, seen.values())) == sorted(map(sorted, truth))
    # byte totals match the plan (datagrams round each burst up), on both sides of every VF
    plan = {**plan_job(cluster, "job0", cfg), **plan_job(cluster, "job1", cfg)}
    ip_ep = {e.ip: e.ep_id for e in cluster.endpoints}
    want_tx = np.zeros(len(cluster.endpoints))
    want_rx = np.zeros(len(cluster.endpoints))
    for sends in plan.values():
        for s in sends:
            # datagrams round each burst up; + 42 bytes of UDP/IP/Ethernet headers each
            nbytes = -(-s.nbytes // cfg.datagram_bytes) * (cfg.datagram_bytes + 42) * iterations
            want_tx[ip_ep[s.src_ip]] += nbytes
            want_rx[ip_ep[s.dst_ip]] += nbytes
    got_tx, got_rx = tx.sum(axis=0), rx.sum(axis=0)
    assert np.allclose(got_tx, want_tx, rtol=0.02), (got_tx, want_tx)
    # receive may lose a few datagrams to backlog drops on 2 busy cores, never gain
    assert (got_rx <= want_rx * 1.02).all() and (got_rx >= want_rx * 0.8).all(), (got_rx, want_rx)
