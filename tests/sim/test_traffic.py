import numpy as np
import pytest

from skh.model import Cluster, Fabric, JobShape
from skh.sim.jobs import make_job
from skh.sim.traffic import TrafficModel, pipeline_schedule, throughput

#: only the job's own traffic: no loads, checkpoints, co-tenants or timing noise
QUIET = {
    "background_bytes_per_s": 0.0,
    "loader_bytes": (0.0, 0.0),
    "checkpoint_every_s": (1e9, 1e9),
    "sample_jitter_s": 0.0,
    "clock_sigma_s": 0.0,
}


def _job(shape=None, kind="train", iteration_s=12.0, **plan):
    cluster = Cluster(Fabric.from_params(hosts=64, hosts_per_segment=16, spines=4))
    shape = shape or JobShape(8, 4, 4)
    n_cont = shape.tp * shape.pp * shape.dp * plan.get("cp", 1) // plan.get("rnics", shape.tp)
    return make_job(
        cluster, "j", shape, kind=kind, iteration_s=iteration_s, seed=4,
        ready_delay_s=np.zeros(n_cont), **plan,
    )  # fmt: skip


def _period(x):
    """The first autocorrelation peak between 5 and 30 s near the highest one (a distributed
    optimizer's two bursts per iteration put more power in a harmonic than in the fundamental,
    and jitter can make a multiple of the period peak higher)."""
    z = x - x.mean()
    acf = np.correlate(z, z, "full")[z.size - 1 :][5:31]
    peak = np.flatnonzero((acf[1:-1] > acf[:-2]) & (acf[1:-1] >= acf[2:])) + 1
    return 5 + int(peak[np.argmax(acf[peak] >= 0.8 * acf[peak].max())])


def test_bursts_repeat_at_the_iteration_period():
    job = _job()
    ep, m = throughput(job, 600, seed=1)
    assert ep.tolist() == job.ep_ids.tolist() and m.shape == (job.n_endpoints, 600)
    periods = np.array([_period(m[i]) for i in range(0, job.n_endpoints, 7)])
    assert np.median(np.abs(periods - 12.0)) < 1.0
    # a gradient sync sends and receives near 15 Gbps at its peak, mostly far less in between
    assert 2.0e9 < np.quantile(m, 0.99) < 4.2e9
    assert np.median(m) < 0.6e9


def test_pipeline_schedule_is_1f1b():
    s = pipeline_schedule(4, 1, 8)
    # warm-up, steady state and cool-down: (M + PP - 1) slots of forward + backward
    assert s.span == pytest.approx(3 * (8 + 4 - 1))
    assert s.first.tolist() == [0.0, 1.0, 2.0, 3.0]  # stage s waits for s forwards
    assert np.all(np.diff(s.last) < 0)  # the last stage finishes its backwards first
    assert s.msg_t.size == 2 * 8 * 3  # a forward and a backward message per microbatch and link
    inter = pipeline_schedule(4, 2, 8)
    wrap = (inter.msg_src == 3) & (inter.msg_dst == 0)
    assert wrap.sum() == 8  # the last stage feeds model chunk 2 on the first stage


def test_a_pipeline_send_is_the_senders_tx_and_the_receivers_rx():
    """Partners' series share every send: the receiver's burst is the sender's burst."""
    job = _job(JobShape(8, 2, 4))
    tm = TrafficModel([job], seed=2, sample_hz=100.0, **QUIET)
    tx, rx = tm.window(float(job.ready_s.max()) + 5.0, 6000)
    rail0 = job.rail == 0
    a = np.flatnonzero(rail0 & (job.pp_stage == 0))
    b = np.flatnonzero(rail0 & (job.pp_stage == 1))
    a, b = a[np.argsort(job.dp_rank[a])], b[np.argsort(job.dp_rank[b])]
    # what stage 0 sends on top of its group's common pattern, and what stage 1 receives
    ra = tx[a] - tx[a].mean(axis=0)
    rb = rx[b] - rx[b].mean(axis=0)
    c = np.corrcoef(ra, rb)[: a.size, a.size :]
    assert np.all(np.argmax(c, axis=1) == np.arange(a.size))
    assert np.diag(c).min() > 0.5


def test_dp_groups_burst_together_and_stages_shift():
    job = _job(JobShape(8, 4, 4))
    tm = TrafficModel([job], seed=2, sample_hz=10.0, **QUIET)
    m = tm.matrix(float(job.ready_s.max()) + 5.0, 3000)
    z = (m - m.mean(1, keepdims=True)) / m.std(1, keepdims=True)
    corr = z @ z.T / m.shape[1]
    same_group = job.dp_group[:, None] == job.dp_group[None, :]
    off = ~np.eye(job.n_endpoints, dtype=bool)
    assert corr[same_group & off].mean() > 0.9
    # each stage's gradient sync starts once its last backward is done: the last stage first
    onsets = []
    for s in range(4):
        x = m[job.pp_stage == s].mean(0)
        onsets.append(np.flatnonzero(np.diff((x > 0.5 * x.max()).astype(int)) == 1)[:5])
    onsets = np.array(onsets)
    assert np.all(np.diff(onsets, axis=0) < 0)


def test_rates_do_not_depend_on_the_stepping_and_stop_at_end():
    job = _job(iteration_s=10.0)
    tm = TrafficModel([job], seed=9, sample_hz=10.0)
    t0 = float(np.floor(job.ready_s.max()))
    tx, _ = tm.window(t0, 500)
    b = np.stack([tm.rates(t0 + i) for i in range(50)], 1)
    assert np.allclose(tx.reshape(tx.shape[0], 50, 10).sum(axis=2), b)
    fresh = TrafficModel([job], seed=9, sample_hz=10.0)
    assert np.array_equal(fresh.window(t0 + 33.3, 77)[0], tm.window(t0 + 33.3, 77)[0])
    quiet = tm.rates(job.ready_s.min() - 100)
    assert quiet.max() < 1e8  # only co-tenant background


def test_debug_jobs_are_irregular_and_moe_all_to_all_stays_in_its_group():
    dbg = _job(JobShape(8, 1, 2), kind="debug")
    _, m = throughput(dbg, 300, seed=3)
    z = (m - m.mean(1, keepdims=True)) / (m.std(1, keepdims=True) + 1e-9)
    assert np.abs(np.corrcoef(z)[~np.eye(16, dtype=bool)]).mean() < 0.2
    moe = _job(JobShape(8, 1, 8, ep=4), kind="ep")
    tm = TrafficModel([moe], seed=3, sample_hz=10.0, **QUIET)
    tx, _ = tm.window(float(moe.ready_s.max()) + 5.0, 2400)
    r = tx[moe.rail == 0]
    r = r - r.mean(axis=0)
    c = np.corrcoef(r)
    group = moe.dp_rank[moe.rail == 0] // 4
    same = (group[:, None] == group[None, :]) & ~np.eye(group.size, dtype=bool)
    assert c[same].mean() > c[group[:, None] != group[None, :]].mean() + 0.3


def test_fsdp_collectives_are_job_wide_and_lockstep():
    job = _job(JobShape(1, 1, 32), kind="fsdp", rnics=8)
    _, m = throughput(job, 120, seed=5, sample_hz=10.0, **QUIET)
    z = (m - m.mean(1, keepdims=True)) / m.std(1, keepdims=True)
    assert (z @ z.T / m.shape[1])[~np.eye(job.n_endpoints, dtype=bool)].min() > 0.9


def test_a_block_whose_pulses_all_fall_outside_bins_float_bytes():
    from skh.sim.traffic import _bin_pulses, _Pulses

    p = _Pulses.empty()
    p.add([0], [50.0], 1.0, 1000.0)  # after the block
    tx, rx = _bin_pulses(p, 2, np.zeros(2), 0.0, 10.0, 20)
    assert tx.dtype == rx.dtype == np.float64 and not tx.any() and not rx.any()
    p.add([1], [0.5], 0.05, 500.0)
    tx, rx = _bin_pulses(p, 2, np.zeros(2), 0.0, 10.0, 20)
    assert tx[1, 5] == rx[1, 5] == 500.0 and tx.sum() == rx.sum() == 500.0
