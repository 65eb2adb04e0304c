"""End to end on the simulator: churn plus one fault of each symptom class, detected with the
right kind and nothing else raised."""

from __future__ import annotations

import numpy as np
import pytest

sim_mod = pytest.importorskip("skh.sim.scenario")

from skh.analysis.detect import Detector  # noqa: E402
from skh.failures import FailureType  # noqa: E402
from skh.model import Fabric  # noqa: E402
from skh.sim.faults import Fault  # noqa: E402

FAULTS = [
    (FailureType.RNIC_PORT_DOWN, "unreachable"),
    (FailureType.OFFLOADING_FAILURE, "latency-short"),
    (FailureType.AGENT_CRASH, "agent"),
    (FailureType.CRC_ERROR, "loss"),
]


def test_faults_on_a_churning_simulated_cluster():
    # probed ten times a second, as deployed: loss needs evidence against the baseline
    sim = sim_mod.Simulation.build(
        Fabric.from_params(hosts=24), 5, seed=6, arrivals_per_min=1.0, probe_interval_s=0.1
    )
    det = Detector()
    # long-lived job that probes pairs (a job in one container has none): the faults sit on
    # its components
    job = max((j for j in sim.jobs if j.skeleton_pairs.size), key=lambda j: j.end_s)
    assert job.end_s > 900 and job.skeleton_pairs.size
    src, dst = (int(x) for x in job.skeleton_pairs[0])
    e = sim.cluster.endpoints[src]
    path = sim.index.path_names(int(sim.eps.rnic[src]), int(sim.eps.rnic[dst]), 0)
    comps = {
        FailureType.RNIC_PORT_DOWN: f"{e.host}:rnic{e.rail}",
        FailureType.OFFLOADING_FAILURE: f"{e.host}:rnic{e.rail}",
        FailureType.AGENT_CRASH: e.container,
        FailureType.CRC_ERROR: "|".join(sorted(path[:2])),
    }
    starts = {ft: 330.0 + i * 90.0 for i, (ft, _) in enumerate(FAULTS)}
    records, events, retired = [], [], set()
    for step in sim.run(int(330 + len(FAULTS) * 90)):
        t = step.t_s
        for ft, start in starts.items():
            if t + 1 <= start < t + 2:  # inject before the step that contains the onset
                kw = {"loss_rate": 0.05} if ft == FailureType.CRC_ERROR else {}
                records.append(sim.inject(Fault(ft, comps[ft], start, start + 50.0, **kw)))
        for j in sim.jobs:
            if j.name not in retired and j.end_s <= t + 1:
                retired.add(j.name)
                det.retire(j.ep_ids)
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(t)))
        det.ingest(step.probes)
        events += det.tick(int(sim.clock.wall_ns(t + 1)))
    assert retired, "the scenario should include churn"
    crash_eps = set(
        np.flatnonzero(
            sim.eps.container == sim.eps.container_id(comps[FailureType.AGENT_CRASH])
        ).tolist()
    )
    for rec, (ft, kind) in zip(records, FAULTS, strict=True):
        pairs = set(map(tuple, rec.affected_pairs.tolist()))
        mine = [
            ev
            for ev in events
            if rec.start_ns <= ev.detected_ns <= rec.end_ns + 30 * 10**9
            and (pairs & set(ev.pairs) or crash_eps & set(ev.endpoints))
        ]
        assert mine, f"{ft.name} not detected"
        assert mine[0].kind == kind, (ft.name, [(ev.kind, ev.explanation) for ev in mine])
        ttd_s = (mine[0].detected_ns - rec.start_ns) / 1e9
        assert (
            # agent: heartbeats missed longer than a benign host stall (HealthConfig, 6 s)
            ttd_s <= {"unreachable": 2.0, "loss": 20.0, "latency-short": 30.0, "agent": 7.0}[kind]
        ), (ft.name, ttd_s)

    def explained(ev) -> bool:
        for rec in records:
            if rec.start_ns <= ev.detected_ns <= rec.end_ns + 30 * 10**9:
                if set(map(tuple, rec.affected_pairs.tolist())) & set(ev.pairs) or crash_eps & set(
                    ev.endpoints
                ):
                    return True
        return False

    assert all(explained(ev) for ev in events), [
        ev.explanation for ev in events if not explained(ev)
    ]


def test_healthy_churn_raises_nothing():
    # short-lived jobs: containers start, become ready and stop throughout the run
    sim = sim_mod.Simulation.build(
        Fabric.from_params(hosts=16),
        6,
        seed=5,
        arrivals_per_min=3.0,
        job_kw={"lifetime_median_s": 300.0},
    )
    det = Detector()
    retired, events = set(), []
    n_jobs0 = len(sim.jobs)
    n_eps = 0
    for step in sim.run(700):
        t = step.t_s
        if len(sim.eps) != n_eps:
            # the ToR each endpoint hangs off, as the evaluation sets it
            n_eps = len(sim.eps)
            det.set_endpoint_groups(sim.index.rnic_tor[sim.eps.rnic].astype(np.int64))
        for j in sim.jobs:
            if j.name not in retired and j.end_s <= t + 1:
                retired.add(j.name)
                det.retire(j.ep_ids)
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(t)))
        det.ingest(step.probes)
        events += det.tick(int(sim.clock.wall_ns(t + 1)))
    started = [j for j in sim.jobs[n_jobs0:] if np.min(j.ready_s) < 700]
    assert len(retired) >= 3 and len(started) >= 3, (len(retired), len(started))
    assert det.stats.windows_scored > 0
    assert events == [], [ev.explanation for ev in events]


def test_benign_field_noise_raises_no_network_event():
    """The issue's reproduction, inverted: benign loss (~2e-4 a probe, bad links), heavy-tailed
    jitter, congestion episodes, clock steps, and here far more host stalls past the probe
    timeout and agent restarts than the field regime has, probed ten times a second: not one
    network event (the old fast path raised ~2,500 false loss events an hour on this cluster)."""
    from dataclasses import replace

    from skh.analysis.sampling import ResultThinner
    from skh.sim import LINGJUN_TOPO
    from skh.sim.noise import FIELD

    harsh = replace(
        FIELD,
        name="harsh",
        stalls_per_host_h=30.0,
        stall_median_s=1.2,
        stall_sigma=0.25,
        agent_restarts_per_container_day=86400.0 / 300,
    )
    fabric = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=48)
    sim = sim_mod.Simulation.build(
        fabric, 12, seed=102, probe_interval_s=0.1, noise=harsh, start_s=(-900.0, -600.0)
    )
    det, thinner = Detector(), ResultThinner()
    events, retired = [], set()
    for step in sim.run(600):
        t = step.t_s
        for j in sim.jobs:
            if j.name not in retired and j.end_s <= t + 1:
                retired.add(j.name)
                det.retire(j.ep_ids)
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(t)))
        det.ingest(thinner.thin(step.probes))
        events += det.tick(int(sim.clock.wall_ns(t + 1)))
    m = sim.noise_measured()
    assert m["stall_timeouts"] > 0 and m["agent_restarts"] > 0 and m["request_lost"] > 0
    # known gap: an endpoint whose agent probes nobody cannot vouch for itself (its progress
    # never advances, its numbering never restarts), so a sub-second restart of its agent reads
    # as loss toward it. Every other pair stays quiet
    probers = set(np.unique(sim.pairs[:, 0]).tolist())
    network = [e for e in events if e.kind != "agent"]
    unexplained = [
        (e.kind, e.explanation) for e in network if any(b in probers for _, b in e.pairs)
    ]
    assert unexplained == []
    assert len(network) <= 2
