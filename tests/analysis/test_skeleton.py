"""Traffic-skeleton inference against the simulator's ground truth, on the jobs people run and
under every rank-hint regime (counters at 10 Hz unless a test says otherwise)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from skh.analysis.skeleton import (
    MODE_SKELETON,
    Skeleton,
    SkeletonParams,
    infer_skeleton,
    pairs_coverage,
    traffic_changed,
)
from skh.analysis.skeleton.stages import bursts
from skh.demo.live import DemoSpec
from skh.errors import ConfigError
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs
from skh.sim import LINGJUN_TOPO
from skh.sim.jobs import HostPool, SimJob, generate_jobs, make_job
from skh.sim.traffic import TrafficModel, counter_series

HZ = 10.0
WINDOW_S = 240


def _job(shape, *, kind="train", seed=0, period=15.0, **plan) -> SimJob:
    tp, pp, dp, ep = shape
    hosts = max(2, tp * pp * dp * plan.get("cp", 1) // plan.get("rnics", tp))
    cluster = Cluster(Fabric.from_params(hosts=hosts))
    return make_job(
        cluster, "j", JobShape(tp, pp, dp, ep), kind=kind, iteration_s=period, seed=seed, **plan
    )


def _traffic(jobs, *, seed=0, hz=HZ, t0=None, window_s=WINDOW_S, **kw):
    """Per job: (bytes through each endpoint, bytes sent) per sample, once every job trains."""
    model = TrafficModel(jobs, seed=seed, sample_hz=hz, **kw)
    start = float(np.ceil(model.train_start.max())) + 1.0 if t0 is None else t0
    tx, rx = model.window(start, int(window_s * hz))
    cuts = np.cumsum([j.n_endpoints for j in jobs])[:-1]
    return list(zip(np.split(tx + rx, cuts), np.split(tx, cuts), strict=True))


def _infer(job, x, tx=None, *, hint="pod", hz=HZ, **kw) -> Skeleton:
    rank = {"pod": job.container, "none": None}.get(hint, hint) if isinstance(hint, str) else hint
    return infer_skeleton(
        job.ep_ids, job.host, job.rail, x, tx_bytes=tx, sample_hz=hz, container=rank, **kw
    )


def _ratio(sk: Skeleton, job: SimJob) -> float:
    return sk.pairs.shape[0] / job.skeleton_pairs.shape[0]


def _check_pairs(sk: Skeleton, job: SimJob) -> None:
    p = sk.pairs
    assert p.dtype == np.uint32 and p.ndim == 2 and p.shape[1] == 2
    key = (p[:, 0].astype(np.uint64) << np.uint64(32)) | p[:, 1]
    assert np.all(key[1:] > key[:-1]), "pairs must be sorted and unique"
    host_of = dict(zip(job.ep_ids.tolist(), job.host.tolist(), strict=True))
    assert all(host_of[a] != host_of[b] for a, b in p.tolist())


@pytest.fixture(scope="module")
def paper():
    """Two consecutive 240 s windows of the paper's job."""
    job = _job((8, 8, 8, 1), seed=1)
    ((x, tx),) = _traffic([job], seed=1, window_s=2 * WINDOW_S)
    return job, x, tx


def test_paper_job_gives_nine_of_63_peers(paper):
    """512 GPUs at TP = PP = DP = 8, pod-order hint: every RNIC probes its 7 DP peers, its 2 PP
    neighbours (the first and last stage each other: an interleaved schedule's link, which
    timing cannot rule out) — 9 of 63, once two windows of evidence have added up."""
    job, x, tx = paper
    half = x.shape[1] // 2
    first = _infer(job, x[:, :half], tx[:, :half])
    sk = _infer(job, x[:, half:], tx[:, half:], prior=first)
    assert sk.confident and sk.hint in ("confirmed", "partly confirmed"), sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    assert pairs_coverage(job.skeleton_pairs, first.pairs) == 1.0
    # 9/63 = 0.143 when every partner is confirmed. The interior stages' shared-sends evidence
    # reads against their true partners (their schedules' timing, not their sends): there the
    # fingerprints alone decide, and no row keeps the whole adjacent group (the gate: 0.15)
    sr = same_rail_pairs(job.ep_ids, job.rail, job.host)
    assert sk.pairs.shape[0] / sr.shape[0] <= 0.15, sk.reason
    assert sk.hint == "confirmed", sk.reason
    assert np.median(np.bincount(sk.pairs[:, 0] - job.ep_ids[0])) == 9
    for members in job.dp_groups():
        assert np.unique(sk.group[members - job.ep_ids[0]]).size == 1
    assert sk.n_stages == 8
    assert abs(np.corrcoef(sk.stage, job.pp_stage)[0, 1]) == pytest.approx(1.0)
    assert sk.period_s == pytest.approx(15.0, rel=0.05)
    _check_pairs(sk, job)


@pytest.mark.parametrize("seed", [3, 7])
def test_interior_partners_are_confirmed_by_the_replicas_timing(seed):
    """Between interior stages of TP = PP = DP = 8 the shared-sends statistic reads about -3
    sigma for the true partners (their schedules' timing, not the sends), which cancelled the
    fingerprints' +5: rows there kept whole adjacent groups (0.175 and 0.206 of the same-rail
    list on these seeds, hint partly confirmed). The fingerprints alone decide where the sum
    does not: 0.143 (9/63), every partner confirmed."""
    job = _job((8, 8, 8, 1), seed=seed)
    ((x, tx),) = _traffic([job], seed=seed, window_s=2 * WINDOW_S)
    half = x.shape[1] // 2
    sk = _infer(job, x[:, half:], tx[:, half:], prior=_infer(job, x[:, :half], tx[:, :half]))
    sr = same_rail_pairs(job.ep_ids, job.rail, job.host)
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    assert sk.hint == "confirmed" and sk.pairs.shape[0] / sr.shape[0] <= 0.15, sk.reason


def test_without_a_hint_the_timing_pairs_replicas_where_it_is_clear(paper):
    """Alone, a row must beat the null by 4 sigma and its runner-up by 2; the rest keep the whole
    adjacent group (2.4x the truth for this job): the list is shorter, never short."""
    job, x, tx = paper
    sk = _infer(job, x, tx, hint="none")
    assert sk.confident and sk.hint == "none", sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    assert sk.scores["pp_paired"] >= 0.3 and _ratio(sk, job) <= 2.2, sk.reason


def test_result_does_not_depend_on_row_order(paper):
    job, x, tx = paper
    a = _infer(job, x, tx)
    p = np.random.default_rng(0).permutation(job.ep_ids.size)
    b = infer_skeleton(
        job.ep_ids[p], job.host[p], job.rail[p], x[p], tx_bytes=tx[p], sample_hz=HZ,
        container=job.container[p],
    )  # fmt: skip
    assert a.confident and b.confident
    assert a.digest == b.digest and np.array_equal(a.pairs, b.pairs)
    assert np.array_equal(b.stage, a.stage[p])


@pytest.fixture(scope="module")
def pp4():
    job = _job((8, 4, 8, 1), seed=2, period=13.0)
    ((x, tx),) = _traffic([job], seed=2)
    return job, x, tx


def test_a_hint_that_names_other_partners_is_dropped_and_reported(pp4):
    """The silent miss of the rank-trusting design: stage blocks right, replicas permuted inside
    a stage. The traffic names other partners: the hint is dropped, nothing is missed."""
    job, x, tx = pp4
    rng = np.random.default_rng(3)
    n_cont = int(job.container.max()) + 1
    perm = np.arange(n_cont).reshape(4, 8)
    for row in perm:
        rng.shuffle(row)
    sk = _infer(job, x, tx, hint=perm.ravel()[job.container])
    assert sk.hint == "contradicted" and "contradicted by traffic and dropped" in sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    shuffled = _infer(job, x, tx, hint=rng.permutation(n_cont)[job.container])
    assert shuffled.hint == "contradicted", shuffled.reason
    assert pairs_coverage(job.skeleton_pairs, shuffled.pairs) == 1.0


def test_a_right_hint_is_confirmed_and_gives_the_ground_truth(pp4):
    job, x, tx = pp4
    sk = _infer(job, x, tx)
    assert sk.hint in ("confirmed", "partly confirmed"), sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0 and _ratio(sk, job) <= 1.5


def test_weak_evidence_grows_the_list_and_says_why(pp4):
    """At 1 Hz a replica's timing barely shows and stage shifts of a backward pass blur: the
    right hint is not confirmed, the list grows (whole adjacent groups, or one group per rail)
    and keeps every used pair."""
    job, _, _ = pp4
    ((x, tx),) = _traffic([job], seed=2, hz=1.0)
    sk = _infer(job, x, tx, hz=1.0)
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    assert sk.hint != "confirmed" and _ratio(sk, job) > 1.3, sk.reason
    assert "keep the whole adjacent group" in sk.reason or "1 stage(s)" in sk.reason


MIX = [
    ("fsdp", (1, 1, 32, 1), {"rnics": 8}, 9.0, {}),
    ("train", (2, 4, 16, 1), {"rnics": 8}, 15.0, {}),
    ("train", (4, 4, 1, 1), {"rnics": 8}, 10.0, {}),
    ("train", (8, 2, 4, 1), {"cp": 2}, 17.0, {"checkpoint_every_s": (120.0, 150.0)}),
    ("ep", (8, 2, 8, 4), {}, 19.0, {}),
    ("train", (8, 4, 4, 1), {"vpp": 2}, 14.0, {"jitter": 0.2, "straggler_p": 0.2}),
    ("train", (8, 2, 8, 1), {}, 12.0, {"contention_bytes_per_s": 5e8}),
]


@pytest.mark.parametrize("kind,shape,plan,period,regime", MIX, ids=lambda v: str(v))
def test_jobs_people_run_keep_every_used_pair(kind, shape, plan, period, regime):
    job = _job(shape, kind=kind, seed=5, period=period, **plan)
    ((x, tx),) = _traffic([job], seed=5, **regime)
    for hint in ("pod", "none"):
        sk = _infer(job, x, tx, hint=hint)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert _ratio(sk, job) <= 2.0, (hint, sk.reason)
        _check_pairs(sk, job)


def test_an_expert_parallel_tie_keeps_its_whole_block():
    """MoE TP8 PP2 DP8 EP4 (job 12 of bench/skeleton.py's quick mix, seed 3): the 4 replicas of
    an EP group move together, so each row ties with its group's 4 replicas in the next stage
    (z ~20 +- 3 over two windows). One row's set held 2 of them and left out its partner, which
    the other rows' sets had taken: 16 used pairs probed by nobody under a confident skeleton
    (coverage 0.984 under every hint). Rows whose tied sets share a candidate keep the union,
    and the reason says how many grew."""
    job = _job((8, 2, 8, 4), kind="ep", seed=3012, period=19.0)
    ((x, tx),) = _traffic([job], seed=3 * 7919 + 12, window_s=2 * WINDOW_S)
    half = x.shape[1] // 2
    for hint in ("pod", "none"):
        first = _infer(job, x[:, :half], tx[:, :half], hint=hint)
        sk = _infer(job, x[:, half:], tx[:, half:], hint=hint, prior=first)
        assert sk.confident, sk.reason
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert "widened to the block" in sk.reason and _ratio(sk, job) <= 1.5, sk.reason
        _check_pairs(sk, job)


def test_expert_groups_sharing_every_sync_are_one_stage():
    """MoE TP8 PP1 DP4 EP2 of the quick field profile's draw 75919706 (job00149; CI failed the
    skeleton-coverage gate on it, 0.997 < 0.999): each EP group's all-to-all spikes ride on the
    gradient syncs all four hosts share. One host's series had so much of its bytes in those
    spikes that its bursts were kept whole (spikes and all) while the others were opened to
    their syncs: its EP group then looked like a pipeline stage apart from the other, with
    1-to-1 partners, and the DP pairs across the groups went unprobed (coverage 0.67 under the
    pod-order hint)."""
    cluster = Cluster(Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=384))
    jobs = generate_jobs(cluster, 190, seed=75919706, pool=HostPool(cluster), start_s=(-1800, 0))
    job = next(j for j in jobs if j.name == "job00149")
    assert (job.kind, job.shape) == ("ep", JobShape(8, 1, 4, 2)), "the draw changed: re-find it"
    tx, rx = counter_series(job, WINDOW_S, 75919706, sample_hz=HZ)
    for hint in ("pod", "none"):
        sk = _infer(job, tx + rx, tx, hint=hint)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert _ratio(sk, job) <= 1.5, (hint, sk.reason)


def test_a_stage_order_by_a_hair_is_not_clear():
    """TP8 PP4 DP2 of the 40K-RNIC cluster's seed 14 (bench/skeleton.py's job02026): the
    seriation put the last two stages the wrong way round, its neighbours leading the other
    stages' similarity by 0.007 only, and called the order clear: a confident list linking
    stages 2-4 and 3-1, missing the 2-3 pairs (coverage 0.8). Such an order is a guess: every
    two stages are linked and the reason says so."""
    cluster = Cluster(Fabric.from_params(hosts=5120))
    jobs = generate_jobs(cluster, 2048, seed=14, lifetime_median_s=1e9)
    job = next(j for j in jobs if j.name == "job02026")
    assert (job.kind, job.shape) == ("train", JobShape(8, 4, 2)), "the draw changed: re-find it"
    # the bench's window: from the second after training starts
    t0_s = float(np.ceil(job.ready_s.max())) + 1.0
    tx, rx = counter_series(job, WINDOW_S, 14, sample_hz=HZ, t0_s=t0_s)
    for hint in ("pod", "none"):
        sk = _infer(job, tx + rx, tx, hint=hint)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert "stage order unclear" in sk.reason, (hint, sk.reason)
        # with the hint's partners, 6 stage links of 4 (the wrap-around included): 1.6x truth
        assert hint != "pod" or _ratio(sk, job) <= 1.6, sk.reason


def test_the_rank_hint_settles_a_near_tie_in_stage_order():
    """The paper's job (TP = PP = DP = 8), seed 31: traffic orders its eight stages as the hint
    does, but one stage's neighbour trails a non-neighbour within the slack: without the hint
    every two stages were linked (0.22 of the same-rail list, not the paper's 0.14). A hint
    whose order fits the traffic about as well settles the tie; without one the order stays a
    guess and every two stages are linked. (Seed 6 until session 29: its tie came from a burst
    level set by every tenth sample, which spikes riding on the syncs lifted by chance.)"""
    cluster = Cluster(Fabric.from_params(hosts=64))
    job = make_job(cluster, "paper", JobShape(8, 8, 8), iteration_s=15.0, seed=31999)
    tx, rx = counter_series(job, WINDOW_S, 31, sample_hz=HZ, t0_s=np.ceil(job.ready_s.max()) + 1)
    same_rail = same_rail_pairs(job.ep_ids, job.rail, job.host).shape[0]
    sk = _infer(job, tx + rx, tx, hint="pod")
    assert "near tie" in sk.reason and sk.pairs.shape[0] / same_rail <= 0.15, sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    # the hint's stage blocks in another order, which the traffic does not fit: it settles
    # nothing
    perm = np.r_[0:4, 5, 4, 6, 7]  # stages 4 and 5 (0-based) swap places in the ranks
    sk = _infer(job, tx + rx, tx, hint=job.container % 8 + 8 * perm[job.container // 8])
    assert "every two stages linked" in sk.reason, sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0


def test_spikes_riding_on_shared_syncs_do_not_hide_them():
    """Two series share every gradient sync (a second's plateau a little over the burst level);
    all-to-all spikes ride on the syncs at each series' own instants, and one series' spikes
    carry most of its bytes above the level. Both must come out as their syncs: the burst cut
    keeps a series whole only when its bursts are mostly shorter than the cut's width in time,
    not in bytes."""
    rng = np.random.default_rng(5)
    period, t_len = 147, 2400
    x = rng.exponential(1e6, (2, t_len))
    for start in range(20, t_len - 20, period):
        x[:, start : start + 10] += 3.0e8 + rng.uniform(0.0, 0.6e8, (2, 10))
        x[0, [start + 2, start + 7]] += 3.0e8  # big spikes: most of row 0's bytes over the level
        x[1, [start + 4]] += 1.0e8
    z = bursts(x, HZ)
    assert float(z[0] @ z[1]) / t_len > 0.9


@pytest.mark.parametrize("dp,seed", [(4, 101), (4, 116), (2, 116)])
def test_context_parallel_replicas_are_one_stage(dp, seed):
    """TP8 CP2 without a pipeline: each replica's CP pair steps its ring in lockstep and the
    replicas drift apart by their speed, often less than a sample, so at 10 Hz the replicas'
    burst series differ more than a CP pair's and once passed for pipeline stages with 1-to-1
    partners: a confident list missing the gradient sync's cross pairs (coverage 0.71, 0.71 and
    0.67 here, the only misses of 30 seeds per shape; held-out seed 73 of bench/skeleton.py,
    TP8 CP2 DP2: 0.67). They share their gradient syncs to the instant, which pipeline stages
    do not: such groups are linked whole, and the list is still the used pairs alone."""
    job = _job((8, 1, dp, 1), seed=seed, period=10.0 + seed % 13, cp=2)
    ((x, tx),) = _traffic([job], seed=seed)
    for hint in ("pod", "none"):
        sk = _infer(job, x, tx, hint=hint)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert _ratio(sk, job) <= 1.5, (hint, sk.reason)
        _check_pairs(sk, job)


def test_jobs_sharing_hosts_are_told_apart():
    cluster = Cluster(Fabric.from_params(hosts=8))
    pool = HostPool(cluster)
    jobs = [
        make_job(cluster, f"h{i}", JobShape(4, 2, 4), pool=pool, iteration_s=11.0 + i, seed=i)
        for i in range(2)
    ]
    assert set(jobs[0].host.tolist()) == set(jobs[1].host.tolist())
    for job, (x, tx) in zip(jobs, _traffic(jobs, seed=7), strict=True):
        sk = _infer(job, x, tx)
        assert sk.confident and pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
        assert _ratio(sk, job) <= 1.1, sk.reason


def test_debug_traffic_keeps_the_same_rail_list():
    job = _job((8, 2, 2, 1), kind="debug", seed=3)
    ((x, tx),) = _traffic([job], seed=3)
    sk = _infer(job, x, tx)
    assert sk.mode == "fallback_same_rail" and "no common bursts" in sk.reason, sk.reason
    assert np.array_equal(sk.pairs, same_rail_pairs(job.ep_ids, job.rail, job.host))
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0


def test_before_training_starts_there_is_too_little_traffic():
    """Until every container is ready the job does not train: only co-tenant background."""
    cluster = Cluster(Fabric.from_params(hosts=16))
    job = make_job(cluster, "early", JobShape(8, 4, 4), ready_delay_s=[0.0] * 15 + [500.0], seed=1)
    ((x, tx),) = _traffic([job], seed=1, t0=100.0)
    sk = _infer(job, x, tx)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason
    assert not sk.replaces(None)  # the preload list stays


def test_window_that_starts_before_training_uses_the_training_part():
    job = _job((8, 4, 4, 1), seed=2, period=12.0)
    start = float(np.floor(job.ready_s.max()))
    ((x, tx),) = _traffic([job], seed=2, t0=start - 60.0)
    sk = _infer(job, x, tx)
    assert sk.confident and pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
    # with only 30 s of training in the window, it is too early to tell
    ((x, tx),) = _traffic([job], seed=2, t0=start - 210.0)
    sk = _infer(job, x, tx)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason


def test_versioning_replaces_only_changed_lists(pp4):
    job, x, tx = pp4
    sk = _infer(job, x, tx)
    assert sk.replaces(None) and not sk.replaces(sk.digest)
    debug = _job((8, 2, 2, 1), kind="debug", seed=3)
    ((dx, dtx),) = _traffic([debug], seed=3)
    fb = _infer(debug, dx, dtx)
    # a job whose traffic stopped fitting gets its safe list back
    assert fb.mode == "fallback_same_rail" and fb.replaces(sk.digest)


def test_traffic_changed_tracks_the_job(pp4):
    job, x, _ = pp4
    first = _infer(job, x[:, : x.shape[1] // 2 + 300])
    assert first.confident, first.reason
    changed, why = traffic_changed(first, job.ep_ids, x[:, 600:], sample_hz=HZ)
    assert not changed, why
    # the job is restarted with another layout: groups no longer burst together
    mixed = x[np.random.default_rng(0).permutation(job.ep_ids.size)]
    changed, why = traffic_changed(first, job.ep_ids, mixed, sample_hz=HZ)
    assert changed and "co-occur" in why
    # another iteration period
    slower = _job((8, 4, 8, 1), seed=2, period=21.0)
    ((sx, _),) = _traffic([slower], seed=2)
    changed, why = traffic_changed(first, job.ep_ids, sx, sample_hz=HZ)
    assert changed and "period" in why
    # endpoints left (an elastic job shrank)
    assert traffic_changed(first, job.ep_ids[:-8], x[:-8], sample_hz=HZ)[0]


def test_fallback_for_missing_traffic_asks_for_reinference_once_traffic_flows(pp4):
    job, x, _ = pp4
    idle = np.full_like(x, 1e3)
    sk = _infer(job, idle)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason
    assert not traffic_changed(sk, job.ep_ids, idle, sample_hz=HZ)[0]
    assert traffic_changed(sk, job.ep_ids, x, sample_hz=HZ)[0]


def test_containers_on_different_rails_keep_every_cross_host_pair():
    """Two containers bind rails 0-3, two bind rails 4-7: a peer may be on another rail."""
    host = np.repeat(np.arange(4), 4)
    rail = np.r_[np.tile(np.arange(4), 2), np.tile(np.arange(4, 8), 2)]
    ep = np.arange(16, dtype=np.uint32)
    sk = infer_skeleton(ep, host, rail, np.full((16, 200), 5e7))
    assert sk.mode == "fallback_group_wide" and "another rail" in sk.reason
    assert sk.pairs.shape[0] == 16 * 12  # every ordered pair on different hosts
    assert pairs_coverage(same_rail_pairs(ep, rail, host), sk.pairs) == 1.0


def test_single_host_job_has_nothing_to_probe():
    sk = infer_skeleton(np.arange(8, dtype=np.uint32), np.zeros(8), np.arange(8), np.ones((8, 300)))
    assert sk.pairs.shape == (0, 2) and sk.mode == "fallback_same_rail"


def test_digest_is_deterministic_and_tracks_pairs(pp4):
    job, x, tx = pp4
    a = _infer(job, x, tx)
    b = _infer(job, x.copy(), tx.copy())
    assert a.digest == b.digest and np.array_equal(a.pairs, b.pairs) and len(a.digest) == 16
    c = _infer(job, x[:, :450], tx[:, :450])
    assert c.digest != a.digest


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host": np.zeros(3)},
        {"bytes_per_s": np.zeros((3, 100))},
        {"bytes_per_s": np.zeros(8)},
        {"ep_id": np.zeros(8, np.uint32)},
        {"container": np.zeros(3)},
        {"tx_bytes": np.zeros((8, 99))},
        {"sample_hz": 0.0},
    ],
)
def test_bad_arguments_are_rejected(kwargs):
    args = {
        "ep_id": np.arange(8, dtype=np.uint32),
        "host": np.arange(8) // 4,
        "rail": np.arange(8) % 4,
        "bytes_per_s": np.ones((8, 100)),
    }
    extra = {k: kwargs.pop(k) for k in ("container", "tx_bytes", "sample_hz") if k in kwargs}
    args.update(kwargs)
    with pytest.raises(ConfigError):
        infer_skeleton(args["ep_id"], args["host"], args["rail"], args["bytes_per_s"], **extra)


def test_bad_params_are_rejected():
    with pytest.raises(ConfigError):
        SkeletonParams(hop_s=0)
    with pytest.raises(ConfigError):
        SkeletonParams(min_period_s=10.0, max_period_s=5.0)
    with pytest.raises(ConfigError):
        SkeletonParams(min_confidence=1.5)
    with pytest.raises(ConfigError):
        SkeletonParams(fingerprint_s=0.0)


def test_co_tenant_flows_on_single_rnics_do_not_hide_the_stages():
    """500 MB/s of bursty storage/co-tenant flows per RNIC (as large as a gradient sync, each
    RNIC on its own) blur every rail's series, so the rails alone resolve no stage; the hosts'
    lower quartile drops those flows and each RNIC still follows its host group's series: the
    host split stands (it fell back to the whole same-rail list before, 6.5x the truth on the
    bench's TP8 PP8 DP4 job)."""
    job = _job((8, 4, 4, 1), seed=7, period=17.0)
    ((x, tx),) = _traffic([job], seed=7, contention_bytes_per_s=5e8)
    sk = _infer(job, x, tx)
    assert sk.mode == MODE_SKELETON and "rails too noisy alone" in sk.reason, sk.reason
    assert sk.n_stages == 4
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0 and _ratio(sk, job) <= 1.5


@pytest.mark.parametrize("hint", ["pod", "none"])
def test_a_deep_pipeline_without_data_parallelism_is_not_read_as_replicas(hint):
    """TP8 PP8 DP1 (the eval's held-out job a000049-00000): a 1F1B stage's backward is two
    forwards, so stages s and s + 3 send in the same phase. At 10 Hz their trains of sends
    looked like one DP group's bursts: read confidently as 4 stages x 2 replicas, 4 of its 7
    stage links unprobed (coverage 0.571). There is no collective: every used pair is kept."""
    job = _job((8, 8, 1, 1), seed=3, period=26.0)
    ((x, tx),) = _traffic([job], seed=3)
    sk = _infer(job, x, tx, hint=hint)
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
    assert "one replica per stage" in sk.reason, sk.reason


def test_pipeline_neighbours_alike_per_second_are_not_read_as_replicas():
    """CI draw 1535673014 + 1617177968: a TP8 PP4 DP1 job arriving at 955 s (its third host
    ready 150 s after the first), read as 2 stages x 2 replicas: the neighbours (hosts of stages
    0 and 1, 2 and 3) exchange the pipeline's sends, so their bursts correlate (0.63-0.71) and
    show per second too, and the per-second test let that through as a collective. The link
    between stages 1 and 2 went unprobed (coverage 0.667, the draw's skeleton coverage 0.998956
    under the 0.999 gate). A DP group's members run one collective: lockstep (0.895-1.0 over the
    eval's splits, 0.93 on the gloo testbed) is what tells them, per second or not."""
    j = _job((8, 4, 1, 1), period=31.246709700695362, microbatches=16)
    off = np.uint32(3700)
    j = replace(
        j,
        ep_ids=j.ep_ids + off,
        skeleton_pairs=j.skeleton_pairs + off,
        host=np.repeat([259, 316, 336, 29], 8).astype(j.host.dtype),
        ready_s=np.repeat([1011.7515, 1108.9149, 1015.9021, 979.4721], 8),
        start_s=955.0,
    )
    tx, rx = counter_series(j, 240, 1535673014, sample_hz=HZ)
    sk = _infer(j, tx + rx, tx)
    assert pairs_coverage(j.skeleton_pairs, sk.pairs) == 1.0, sk.reason
    assert "one replica per stage" in sk.reason, sk.reason


@pytest.mark.parametrize(
    "shape,plan,period,regime",
    [
        ((8, 8, 1, 1), {}, 26.0, {}),
        ((8, 4, 1, 1), {}, 16.0, {"jitter": 0.2, "straggler_p": 0.2}),
        ((4, 8, 1, 1), {"rnics": 8}, 18.0, {}),
        ((8, 4, 1, 1), {"vpp": 2}, 14.0, {}),
        # the bench's 40K cluster (seed 1) had one: its ends are busy in fewer samples than
        # the interior, but carry 3/4 of its bytes (a plain pipeline's ends 1/2)
        ((8, 8, 1, 1), {"vpp": 2}, 25.0, {}),
    ],
    ids=["pp8", "pp4-jitter", "tp4-in-8", "pp4-interleaved", "pp8-interleaved"],
)
def test_a_pipeline_without_data_parallelism_is_ordered_by_its_idle_gaps(
    shape, plan, period, regime
):
    """One replica per stage: no DP group to split, and 1F1B's sends coincide in phase across
    stages, so before the chain every same-rail pair was kept (4x the truth for PP8, 2x for PP4
    in the bench). Each iteration's fill and drain make a host's idle gap longer by a forward
    and a backward per stage down the pipeline: the hosts in that order, whatever the hint
    says; a plain pipeline's ends (half the messages) get no wrap-around link, an interleaved
    one keeps it."""
    job = _job(shape, seed=4, period=period, **plan)
    ((x, tx),) = _traffic([job], seed=4, **regime)
    shuffled = np.random.default_rng(4).permutation(job.container.max() + 1)[job.container]
    for hint in ("pod", "none", shuffled):
        sk = _infer(job, x, tx, hint=hint)
        assert sk.mode == MODE_SKELETON and "one replica per stage" in sk.reason, sk.reason
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
        _check_pairs(sk, job)
        # interleaved: the ends' tie stays a tier and the wrap-around link is kept
        assert _ratio(sk, job) <= (1.5 if plan.get("vpp", 1) > 1 else 1.0), sk.reason
    assert _infer(job, x, tx).hint == "confirmed"


def test_an_unclear_stage_order_links_every_two_stages():
    """TP8 PP4 DP2 interleaved (the bench's 40K cluster, seed 11, had one): the stages' mutual
    similarities nearly tie (0.82-0.84), and the seriation put the second stage between the
    fourth and the first; its true neighbour the third was as like it as those. Only adjacent
    stages (and the ends' wrap) were linked: 2 of 6 stage links unprobed, confidently. An order
    that the similarities do not single out is a guess: every two stages are linked. (Seed 31:
    since session 29's burst level, seed 11's rank hint settles its order, a near tie.)"""
    job = _job((8, 4, 2, 1), seed=31, period=9.4, vpp=2)
    ((x, tx),) = _traffic([job], seed=31)
    for hint in ("pod", "none"):
        sk = _infer(job, x, tx, hint=hint)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (hint, sk.reason)
        assert sk.n_stages == 4 and "stage order unclear" in sk.reason, (hint, sk.reason)
    # the hint's partners, confirmed by the replicas' timing, keep the extra links one to one
    assert _ratio(sk, job) <= 2.4 and _ratio(_infer(job, x, tx), job) <= 1.7


def _gapped(gap_samples, volume, *, period=160, t_len=2400, hz=HZ):
    """Per host a series busy but for one idle gap per iteration, gaps centred alike (a later
    stage's contains an earlier one's), ``volume`` bytes per busy sample (x 1e7)."""
    t = np.arange(t_len)
    out = np.zeros((len(gap_samples), t_len))
    for h, (g, v) in enumerate(zip(gap_samples, volume, strict=True)):
        idle = np.abs((t % period) - period / 2) < g / 2
        out[h] = np.where(idle, 0.0, v * 1e7)
    return out


def test_chain_ties_the_first_two_stages_of_an_interleaved_pipeline():
    """The bench's held-out seed 31 (40K cluster, TP8 PP4 DP1 VPP2): stage 0's gap came out a
    sample longer than stage 1's (its wrap-around messages are its own), a step of 1 sample at
    5.5 standard errors that ordered 1 before 0; with the wrap-around link the list missed the
    1-2 and 3-0 links (coverage 0.5), confidently. A step of a sample or two is a tie: the two
    stay one tier, linked to each other and to both neighbouring tiers."""
    from skh.analysis.skeleton.chain import pipeline_chain

    q = _gapped([54, 53, 58, 61], [0.75, 1.0, 1.0, 0.75])
    c = pipeline_chain(q, HZ, 10e6)
    assert [t.tolist() for t in c.tiers] == [[0, 1], [2], [3]] and c.wrap, c
    # a plain pipeline's quiet ends (half the bytes) break the tie and drop the wrap-around
    c = pipeline_chain(_gapped([54, 54, 60, 66], [0.5, 1.0, 1.0, 0.5]), HZ, 10e6)
    assert [t.tolist() for t in c.tiers] == [[0], [1], [2], [3]] and not c.wrap, c
    # replicas of a stage (equal gaps beyond the first two) are no pipeline
    assert not pipeline_chain(_gapped([54, 60, 60, 66], [1.0] * 4), HZ, 10e6).tiers


@pytest.mark.parametrize("seed", range(4))
def test_numeric_helpers_give_numpys_values(seed):
    """The skeleton's own median, quantile and standardize stand in for numpy's on every job;
    the inferred skeletons stay the same only while their values do (ties and zeros too)."""
    from skh.analysis.skeleton.model import median, quantile, standardize

    rng = np.random.default_rng(seed)
    for t in range(200):
        shape = tuple(int(s) for s in rng.integers(1, 12, rng.integers(1, 4)))
        x = rng.standard_normal(shape) * 10 ** rng.uniform(-3, 9)
        x = (np.round(x) if t % 3 == 0 else x).astype(np.float32 if t % 2 else np.float64)
        x[..., 0] = 0.0 if t % 5 == 0 else x[..., 0]
        if t % 4 == 0:
            x = x[..., ::2]  # a strided view, as the skeleton's slices are
        z = x - x.mean(axis=-1, keepdims=True)
        sd = z.std(axis=-1, keepdims=True)
        assert standardize(x).tobytes() == (z / np.where(sd > 0, sd, 1.0)).tobytes()
        for axis in range(x.ndim):
            for keepdims in (False, True):
                want = np.median(x, axis=axis, keepdims=keepdims)
                got = median(x, axis=axis, keepdims=keepdims)
                assert got.dtype == want.dtype and np.array_equal(got, want)
        for q in (0.0, 0.05, 0.25, 0.5, 0.7, 1.0):
            assert quantile(x.ravel(), q) == float(np.quantile(x.ravel(), q))


@pytest.mark.parametrize("kernels", [True, False], ids=["scipy-kernels", "public-scipy"])
def test_group_means_and_tree_cuts_give_numpys_and_scipys_values(kernels, monkeypatch):
    """partners._means stands in for np.add.reduceat (groups of every size, 128 and more
    members included), stages._average_linkage for linkage and stages._maxclust for
    fcluster's maxclust cut, to the bit, through scipy's private kernels and through the public
    functions a scipy without them falls back to; host_quartile is the sort's lower quartile."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    from skh.analysis.skeleton import stages
    from skh.analysis.skeleton.partners import _groups, _means
    from skh.analysis.skeleton.stages import _average_linkage, _maxclust, host_quartile

    if not kernels:
        monkeypatch.setattr(stages, "_KERNELS", None)

    rng = np.random.default_rng(0)
    for n, k in [(1, 1), (7, 3), (16, 2), (40, 4), (160, 1), (300, 2), (90, 30)]:
        group = rng.integers(0, k, n) * 5 - 3
        x = rng.standard_normal((n, 17)) * 10 ** rng.uniform(-3, 9, (n, 1))
        x[rng.random(x.shape) < 0.1] = -0.0
        order = np.argsort(group, kind="stable")
        starts = np.r_[0, np.flatnonzero(np.diff(group[order])) + 1]
        want = np.add.reduceat(x[order], starts, axis=0) / np.diff(np.r_[starts, n])[:, None]
        assert _means(x, _groups(group)).tobytes() == want.tobytes()
    for n_h, n_r in [(1, 1), (2, 2), (3, 8), (5, 4), (4, 12)]:
        x = np.round(rng.random((n_h * n_r, 30)) * 5)  # ties too
        mix = rng.permutation(n_h * n_r)  # rows in any order
        hinv, rail_inv = np.repeat(np.arange(n_h), n_r)[mix], np.tile(np.arange(n_r), n_h)[mix]
        s = np.sort(x[np.lexsort((rail_inv, hinv))].reshape(n_h, n_r, -1), axis=1)
        q = 0.25 * (n_r - 1)
        lo, hi = int(np.floor(q)), int(np.ceil(q))
        want = s[:, lo] + (q - lo) * (s[:, hi] - s[:, lo])
        assert host_quartile(x, hinv, rail_inv).tobytes() == want.tobytes()
    for n in (4, 9, 24):
        d = np.round(rng.random((n, n)) * 8) / 8  # ties too
        y = squareform((d + d.T) / 2 * (1 - np.eye(n)), checks=False)
        tree = linkage(y, "average")
        assert _average_linkage(y, n).tobytes() == tree.tobytes()
        for k in range(2, n // 2 + 1):
            assert np.array_equal(_maxclust(tree, k), fcluster(tree, k, "maxclust") - 1)


def _demo_counters(start: int) -> tuple[np.ndarray, ...]:
    """The demo's PP 2 x DP 2 job as its hosts' counters show it at 10 Hz (4 hosts x 4 rails;
    tests/demo/test_demo_e2e.py): every 4 s, each stage's gradient sync (4 MB, one sample long:
    a namespace sends it in milliseconds) and the pipeline's 0.6 MB sends, over the probes' bytes
    (a rail's repeat every half second, as the demo's agent on host 0 counted them: an engine
    sends its round at once, so some samples hold none); the series starts ``start`` samples
    into an iteration."""
    probes = np.array(
        [
            [0, 1590, 318, 954, 954],
            [0, 636, 1272, 318, 1590],
            [954, 0, 1272, 636, 954],
            [1908, 0, 1590, 318, 0],
        ]
    )
    n_h, n_r, period, t_len = 4, 4, 40, 600
    host = np.repeat(np.arange(n_h), n_r)
    rail = np.tile(np.arange(n_r), n_h)
    stage = host // 2
    base = np.tile(probes, (n_h, (start + t_len) // 5 + 1))[:, : start + t_len] / 2.0
    tx, rx = base.copy(), base.copy()
    it = np.arange(0, tx.shape[1] - period + 1, period)
    for s, sync in ((0, 30), (1, 20)):
        rows = stage == s
        for part in (tx, rx):  # a ring's member sends and receives its share at once
            part[np.ix_(rows, it + sync)] += 2e6
    fwd, bwd = it, it + 20  # stage 0 sends forward at 0 s, stage 1 backward at 2 s
    tx[np.ix_(stage == 0, fwd)] += 6e5
    rx[np.ix_(stage == 1, fwd)] += 6e5
    tx[np.ix_(stage == 1, bwd)] += 6e5
    rx[np.ix_(stage == 0, bwd)] += 6e5
    ep = np.arange(n_h * n_r, dtype=np.uint32)
    return ep, host, rail, (tx + rx)[:, start:], tx[:, start:], stage


@pytest.mark.parametrize("start", range(10))
def test_syncs_one_sample_long_are_bursts_at_any_phase(start):
    """CI run of stop 40: the demo's PP 2 x DP 2 job read as "1 stage(s) ... no collective
    bursts". A burst's level came from every tenth sample's quantiles, and a sync one sample long
    that recurs every 4 s sits on the same tenth of a second: the subsample held every sync or
    (nine starts in ten) none, and then the level was the probes' and their bytes the "bursts"
    (three of these ten starts failed so, with CI's words; the demo's own counters: its DP 4
    job's hosts bursting 62 % of the time in one inference in two)."""
    ep, host, rail, x, tx, stage = _demo_counters(start)
    params = SkeletonParams(**DemoSpec().pipeline_settings()["skeleton"])  # the demo's own
    sk = infer_skeleton(ep, host, rail, x, tx_bytes=tx, sample_hz=HZ, params=params)
    assert sk.mode == MODE_SKELETON and sk.n_stages == 2, sk.reason
    assert "no collective bursts" not in sk.reason, sk.reason
    # the stages' DP groups, per rail, and nothing across stages
    same = {tuple(sorted(map(int, p))) for p in sk.pairs.tolist()}
    for a, b in same:
        assert rail[a] == rail[b], (a, b)
    want = {
        (int(a), int(b))
        for a in ep
        for b in ep
        if a < b and rail[a] == rail[b] and stage[a] == stage[b] and host[a] != host[b]
    }
    assert want <= same, sk.reason


def test_a_contradicted_hint_names_no_partners():
    """bench/skeleton.py's seed 57, job 24 (an MoE job, TP8 PP4 DP8 EP2, under 500 MB/s of
    co-tenant flows per RNIC), its ranks in the containers' registration order: the hint's stage
    blocks are not the traffic's and it was reported dropped, but where the traffic's own best
    guess named the partner the hint named, the rows together "confirmed" it: 3 wrong partners
    of 256 kept confidently (coverage 0.985). A contradicted hint names no partner; the rows
    keep their tied candidates, as without a hint."""
    cluster = Cluster(Fabric.from_params(hosts=32))
    job = make_job(cluster, "mix24", JobShape(8, 4, 8, 2), kind="ep", iteration_s=16.0, seed=57024)
    model = TrafficModel([job], seed=57 * 7919 + 24, sample_hz=HZ, contention_bytes_per_s=5e8)
    t0 = float(np.ceil(model.train_start.max())) + 1.0
    n_cont = int(job.container.max()) + 1
    ready = job.ready_s[:: job.plan.rnics] + np.random.default_rng(0).uniform(0, 1e-3, n_cont)
    hint = np.argsort(np.argsort(ready))[job.container]
    sk = plain = None
    for w in range(2):  # the bench's two windows, evidence carried over
        tx, rx = model.window(t0 + w * WINDOW_S, int(WINDOW_S * HZ))
        sk = _infer(job, tx + rx, tx, hint=hint, prior=sk)
        plain = _infer(job, tx + rx, tx, hint="none", prior=plain)
    assert sk.confident and sk.hint == "contradicted", sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
    assert "0 confirming the rank hint" in sk.reason, sk.reason
    assert np.array_equal(sk.pairs, plain.pairs), (sk.reason, plain.reason)
