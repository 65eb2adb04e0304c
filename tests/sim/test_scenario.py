import numpy as np
import pytest

from skh.errors import ConfigError
from skh.failures import FailureType
from skh.model import Cluster, Fabric, JobShape
from skh.records import COUNTER_DTYPE, PROBE_DTYPE, ProbeStatus, TsSource
from skh.sim.faults import Fault
from skh.sim.jobs import HostPool, make_job
from skh.sim.scenario import Simulation


def _sim(seed, **kw):
    fabric = Fabric.from_params(hosts=128, hosts_per_segment=16, spines=4)
    return Simulation.build(fabric, 30, seed=seed, start_s=(-900.0, 0.0), **kw)


def _digest(sim, seconds, step_s=1):
    probes, counters, beats = [], [], []
    for st in sim.run(seconds, step_s=step_s):
        probes.append(st.probes)
        counters.append(st.counters)
        beats.append(st.heartbeats)
    return np.concatenate(probes), np.concatenate(counters), np.concatenate(beats)


def test_deterministic_under_a_seed_whatever_the_stepping():
    a = _digest(_sim(5), 30)
    b = _digest(_sim(5), 30, step_s=7)
    for x, y in zip(a, b, strict=True):
        assert x.tobytes() == y.tobytes()
    c = _digest(_sim(6), 30)
    assert a[0].tobytes() != c[0].tobytes()
    assert a[0].dtype == PROBE_DTYPE and a[1].dtype == COUNTER_DTYPE


def test_probe_rtts_match_the_paper_anchor():
    sim = _sim(1)
    p, _, _ = _digest(sim, 20)
    assert p.size > 1000
    assert (p["status"] == ProbeStatus.OK).all() and (p["ts_source"] == TsSource.HW).all()
    rtt = p["rtt_ns"] / 1000
    assert 12 <= np.median(rtt) <= 16
    assert np.quantile(rtt, 0.999) < 20
    # more links, more delay: same-ToR pairs are faster than cross-ToR pairs
    hops = sim.index.route(sim.eps.rnic[p["src_ep"]], sim.eps.rnic[p["dst_ep"]], 0).hops
    if (hops == 2).any() and (hops == 4).any():
        assert np.median(rtt[hops == 2]) < np.median(rtt[hops == 4])
    # replies carry the responder and prober delays
    assert (p["responder_delay_ns"] > 0).all() and (p["prober_delay_ns"] > 0).all()
    # probes cycle over path ids; sequence numbers grow per pair
    assert set(np.unique(p["path_id"]).tolist()) == {0, 1, 2, 3}
    assert (np.diff(p["t_wall_ns"]) >= 0).all()


def test_only_ready_endpoints_are_probed():
    fabric = Fabric.from_params(hosts=8, hosts_per_segment=8, spines=1)
    cluster = Cluster(fabric)
    job = make_job(cluster, "j", JobShape(8, 1, 4), ready_delay_s=[0.0, 0.0, 30.0, 120.0])
    sim = Simulation(cluster, [job], seed=0, probe_interval_s=0.5)
    late = set(job.ep_ids[job.container >= 2].tolist())
    first, _, _ = _digest(sim, 10)
    # 10 s × 2 probes/s × 8 rails × the 2 ready pairs' directions
    assert first.size == 10 * 2 * 8 * 2
    assert late.isdisjoint(first["src_ep"].tolist()) and late.isdisjoint(first["dst_ep"].tolist())
    sim.clock.now_s = 200.0
    later, counters, _ = _digest(sim, 2)
    assert late <= set(later["src_ep"].tolist())
    assert counters.size == 2 * job.n_endpoints  # counters for every created container


def test_ping_modes_and_explicit_pairs():
    fabric = Fabric.from_params(hosts=16, hosts_per_segment=8, spines=2)
    cluster = Cluster(fabric)
    job = make_job(cluster, "j", JobShape(8, 2, 8), ready_delay_s=np.zeros(16))
    sk = Simulation(cluster, [job], seed=0)
    full = Simulation(cluster, [job], seed=0, ping="same_rail")
    assert sk.pairs.shape[0] == job.skeleton_pairs.shape[0]
    assert full.pairs.shape[0] == 16 * 15 * 8
    sk.set_ping_pairs(job.skeleton_pairs[:5])
    st = sk.step()
    assert {tuple(x) for x in np.stack([st.probes["src_ep"], st.probes["dst_ep"]], 1).tolist()} == {
        tuple(x) for x in job.skeleton_pairs[:5].tolist()
    }
    with pytest.raises(ConfigError):
        sk.set_ping_pairs(np.array([[0, 10**6]]))


def test_counters_are_cumulative_and_show_port_down():
    fabric = Fabric.from_params(hosts=8, hosts_per_segment=8, spines=1)
    cluster = Cluster(fabric)
    job = make_job(cluster, "j", JobShape(8, 2, 4), ready_delay_s=np.zeros(8), iteration_s=10.0)
    sim = Simulation(cluster, [job], seed=0)
    e = cluster.endpoints[0]
    sim.inject(Fault(FailureType.RNIC_PORT_DOWN, f"{e.host}:rnic0", 5.0, 10.0))
    steps = list(sim.run(30))
    tx = np.stack([s.counters["tx_bytes"] for s in steps])
    assert (np.diff(tx.astype(np.int64), axis=0) >= 0).all()
    assert tx[-1].min() > 1e9  # bursts of ~GB/s happened on every endpoint
    up = np.stack([s.counters["oper_up"] for s in steps])
    assert (up[5:10, 0] == 0).all() and (up[:5, 0] == 1).all() and (up[10:, 0] == 1).all()
    assert (up[:, 1:] == 1).all()
    # while its link is down the endpoint's counters stand still
    assert (tx[5:10, 0] == tx[4, 0]).all() and tx[-1, 0] > tx[9, 0]


def test_agent_crash_over_udp_is_refused(small_sim):
    sim = Simulation(small_sim.cluster, small_sim.jobs, seed=1, transport="udp")
    c = sim.cluster.endpoints[0].container
    sim.inject(Fault(FailureType.AGENT_CRASH, c, 0.0))
    p = sim.step().probes
    to = sim.eps.container[p["dst_ep"]] == sim.eps.container_id(c)
    assert to.any() and (p["status"][to] == ProbeStatus.REFUSED).all()


def test_job_churn_adds_jobs_and_pairs():
    fabric = Fabric.from_params(hosts=256, hosts_per_segment=16, spines=4)
    sim = Simulation.build(fabric, 10, seed=2, arrivals_per_min=120.0)
    n0, p0 = len(sim.jobs), sim.pairs.shape[0]
    list(sim.run(10))  # ~20 arrivals
    assert len(sim.jobs) > n0 and sim.pairs.shape[0] >= p0
    assert len(sim.cluster.endpoints) == len(sim.eps)


def test_validation():
    fabric = Fabric.from_params(hosts=8, hosts_per_segment=8, spines=1)
    cluster = Cluster(fabric)
    with pytest.raises(ConfigError):
        Simulation(cluster, [], probe_interval_s=0)
    with pytest.raises(ConfigError):
        Simulation(cluster, [], transport="tcp")
    with pytest.raises(ConfigError):
        Simulation(cluster, []).step(0)
    pool = HostPool(cluster)
    assert pool.free_hosts == 8


def test_with_a_probe_policy_pairs_probe_as_the_controller_plans_them():
    """The simulated agents probe each pair at the interval and over the path ids the
    controller's per-job plan gives it (skh.probeplan on the job's pairs and the fabric): the
    eval then measures the deployed policy, not every pair at 10 Hz over four ids."""
    from skh.probeplan import FabricLinks, ProbePolicy, plan_probes

    fabric = Fabric.from_params(hosts=64, hosts_per_segment=8, spines=4)
    policy = ProbePolicy(budget_per_s=40.0)
    sim = Simulation.build(
        fabric, 6, seed=3, start_s=(-900.0, -600.0), probe_interval_s=0.1, probe_policy=policy
    )
    dur = 20
    got = np.concatenate([sim.step(1).probes for _ in range(dur)])
    fl = FabricLinks(fabric)
    checked = 0
    for job in sim.jobs:
        pairs = np.unique(job.skeleton_pairs.astype(np.uint32), axis=0)
        key = [sim.index.rnic_key(int(r)) for r in sim.eps.rnic[pairs.ravel()]]
        plan = plan_probes(pairs, policy, links=fl.incidence(key[0::2], key[1::2]))
        for (s, d), iv, n in zip(plan.pairs, plan.interval_s, plan.paths, strict=True):
            mine = got[(got["src_ep"] == s) & (got["dst_ep"] == d)]
            if mine.size == 0:
                continue  # not ready yet, or its job ended
            assert abs(mine.size - dur / iv) <= 1, (s, d, mine.size, iv)
            assert set(mine["path_id"].tolist()) == set(range(min(int(n), mine.size)))
            checked += 1
    assert checked > 100
    # the plan holds each source to its budget: some pairs are slower than 10 Hz, paths > 4
    assert sim._pair_iv.max() > 0.1 and sim._pair_paths.max() > 4
    assert sim.n_path_ids >= sim._pair_paths.max()


def test_counters_come_at_the_agents_rate_and_add_up_to_the_traffic():
    """``counter_hz`` counter rows per live endpoint and second, each the cumulative bytes at the
    end of its interval, as the underlay agent ships them (the demo's pipeline reads 10 Hz, as
    deployed); the pipeline's history reads the rate back from the timestamps."""
    from skh.orchestrator.config import DEFAULT_COUNTER_HZ
    from skh.orchestrator.pipeline.history import CounterHistory

    fabric = Fabric.from_params(hosts=16, hosts_per_segment=8, spines=2)
    sim = Simulation.build(
        fabric, 3, seed=2, start_s=(-900.0, -600.0), counter_hz=DEFAULT_COUNTER_HZ
    )
    _, counters, _ = _digest(sim, 30)
    hz = DEFAULT_COUNTER_HZ
    for ep in np.unique(counters["ep"])[:5]:
        c = counters[counters["ep"] == ep]
        assert c.size == 30 * hz
        assert np.allclose(np.diff(c["t_ns"]), 1e9 / hz)
        assert (np.diff(c["tx_bytes"].astype(np.int64)) >= 0).all()
    hist = CounterHistory(120.0)
    hist.add(counters)
    busy = np.unique(counters["ep"])
    x, tx, got_hz = hist.series(busy)
    assert got_hz == hz and x.shape[0] == busy.size and x.sum() > 0 and (tx <= x + 1).all()
    with pytest.raises(ConfigError):
        Simulation.build(fabric, 1, seed=2, counter_hz=0)
