"""Traffic-skeleton inference against the simulator's ground truth and a controllable model."""

from __future__ import annotations

import numpy as np
import pytest

from skh.analysis._skeleton_synth import synth_job
from skh.analysis.skeleton import (
    Skeleton,
    SkeletonParams,
    infer_skeleton,
    pairs_coverage,
    traffic_changed,
)
from skh.errors import ConfigError
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs
from skh.sim.jobs import HostPool, make_job
from skh.sim.traffic import TrafficModel

DURATION_S = 240


def _place(specs, seed=0, **traffic_kw):
    """Place jobs ``(kind, (tp, pp, dp, ep), period_s)`` and return them with 240 s of traffic
    taken once every job trains."""
    hosts = sum(pp * dp for _, (_, pp, dp, _), _ in specs)
    cluster = Cluster(Fabric.from_params(hosts=hosts))
    pool = HostPool(cluster)
    jobs = [
        make_job(
            cluster,
            f"j{i}",
            JobShape(*shape),
            kind=kind,
            pool=pool,
            iteration_s=period,
            seed=seed + i,
        )
        for i, (kind, shape, period) in enumerate(specs)
    ]
    model = TrafficModel(jobs, seed=seed, **traffic_kw)
    x = model.matrix(float(np.ceil(model.train_start.max())) + 1.0, DURATION_S)
    return list(zip(jobs, np.split(x, np.cumsum([j.n_endpoints for j in jobs])[:-1]), strict=True))


def _infer(job, x, **kw) -> Skeleton:
    return infer_skeleton(
        job.ep_ids, job.host, job.rail, x, container=job.container, job=job.name, **kw
    )


def _check_pairs(sk: Skeleton, host_of: dict[int, int]) -> None:
    p = sk.pairs
    assert p.dtype == np.uint32 and p.ndim == 2 and p.shape[1] == 2
    key = (p[:, 0].astype(np.uint64) << np.uint64(32)) | p[:, 1]
    assert np.all(key[1:] > key[:-1]), "pairs must be sorted and unique"
    assert np.all(p[:, 0] != p[:, 1])
    assert all(host_of[a] != host_of[b] for a, b in p[:: max(1, len(p) // 500)].tolist())


def test_paper_job_gives_nine_of_63_peers():
    """512 GPUs at TP = PP = DP = 8: an interior RNIC probes its 7 DP peers and 2 PP neighbours."""
    ((job, x),) = _place([("train", (8, 8, 8, 1), 15.0)])
    sk = _infer(job, x)
    assert sk.mode == "skeleton" and sk.confident and sk.confidence >= 0.5, sk.reason
    assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0
    sr = same_rail_pairs(job.ep_ids, job.rail, job.host)
    assert sk.pairs.shape[0] / sr.shape[0] <= 0.15
    degree = np.bincount(sk.pairs[:, 0] - job.ep_ids[0])
    interior = (job.pp_stage > 0) & (job.pp_stage < 7)
    assert set(degree[interior].tolist()) == {9} and set(degree[~interior].tolist()) == {8}
    # inferred groups are the DP groups and stages follow the pipeline
    for members in job.dp_groups():
        idx = members - job.ep_ids[0]
        assert np.unique(sk.group[idx]).size == 1
    assert sk.n_stages == 8
    assert abs(np.corrcoef(sk.stage, job.pp_stage)[0, 1]) == pytest.approx(1.0)
    assert sk.period_s == pytest.approx(15.0, rel=0.05)
    _check_pairs(sk, dict(zip(job.ep_ids.tolist(), job.host.tolist(), strict=True)))


def test_result_does_not_depend_on_row_order():
    ((job, x),) = _place([("train", (8, 4, 8, 1), 15.0)], seed=4)
    a = _infer(job, x)
    p = np.random.default_rng(0).permutation(job.ep_ids.size)
    b = infer_skeleton(job.ep_ids[p], job.host[p], job.rail[p], x[p], container=job.container[p])
    assert a.confident and b.confident
    assert a.digest == b.digest and np.array_equal(a.pairs, b.pairs)
    assert np.array_equal(b.stage, a.stage[p])


SHAPES = [
    ("train", (8, 1, 2, 1), 12.0),
    ("train", (8, 1, 64, 1), 20.0),
    ("train", (8, 2, 8, 1), 9.0),
    ("train", (8, 4, 16, 1), 25.0),
    ("train", (8, 8, 2, 1), 6.0),
    ("train", (8, 16, 2, 1), 14.0),
    ("train", (8, 16, 4, 1), 30.0),
    ("train", (4, 4, 8, 1), 11.0),
    ("train", (4, 8, 4, 1), 17.0),
    ("ep", (8, 4, 8, 2), 13.0),
    ("ep", (8, 8, 4, 4), 16.0),
    ("debug", (8, 2, 2, 1), 15.0),
]


@pytest.fixture(scope="module")
def mix():
    return [(job, x, _infer(job, x)) for job, x in _place(SHAPES, seed=3)]


def test_mix_covers_every_used_pair(mix):
    used = covered = 0
    for job, _, sk in mix:
        cov = pairs_coverage(job.skeleton_pairs, sk.pairs)
        used += job.skeleton_pairs.shape[0]
        covered += cov * job.skeleton_pairs.shape[0]
        assert cov >= 0.999, (job.name, job.shape, sk.mode, sk.reason)
    assert covered / used >= 0.999


def test_typical_jobs_get_the_ground_truth_list(mix):
    for job, _, sk in mix:
        if job.kind != "train":
            continue
        assert sk.mode == "skeleton", (job.shape, sk.reason)
        truth = job.skeleton_pairs
        # nothing missing and nothing extra: the list is the ground truth itself
        assert sk.pairs.shape == truth.shape and np.array_equal(sk.pairs, truth), job.shape


def test_all_to_all_and_debug_jobs_keep_the_same_rail_list(mix):
    for job, _, sk in mix:
        if job.kind == "train":
            continue
        assert sk.mode == "fallback_same_rail", (job.kind, sk.reason)
        assert np.array_equal(sk.pairs, same_rail_pairs(job.ep_ids, job.rail, job.host))
        assert 0.0 <= sk.confidence < 0.5
        word = "all-to-all" if job.kind == "ep" else "burst train"
        assert word in sk.reason, sk.reason


def test_heavy_noise_and_stragglers_keep_coverage():
    specs = [
        ("train", (8, 8, 4, 1), 12.0),
        ("train", (8, 4, 8, 1), 20.0),
        ("train", (4, 16, 2, 1), 25.0),
    ]
    for job, x in _place(specs, seed=11, noise_sigma=0.5, straggler_p=0.3, jitter=0.08):
        sk = _infer(job, x)
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, (job.shape, sk.reason)


def test_wrong_rank_hint_is_not_trusted():
    """Container ranks that are not the pipeline layout must not pair the wrong replicas: the
    per-rail split takes over and keeps every adjacent-stage peer without evidence."""
    rng = np.random.default_rng(0)
    for job, x in _place([("train", (8, 8, 8, 1), 15.0), ("train", (8, 16, 4, 1), 20.0)], seed=5):
        shuffled = rng.permutation(job.container.max() + 1)[job.container]
        sk = infer_skeleton(job.ep_ids, job.host, job.rail, x, container=shuffled)
        assert "rank layout confirmed" not in sk.reason
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason


def test_residual_correlation_pairs_pipeline_neighbours():
    """Where pipeline sends leave a shared trace on both ends (the synthetic model), the
    residual correlation finds most PP partners even without a usable rank order."""
    job = synth_job(8, 8, 8, seed=2)
    hosts = np.unique(job.host)
    shuffled = np.random.default_rng(1).permutation(hosts.size)[np.searchsorted(hosts, job.host)]
    sk = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s, container=shuffled)
    assert sk.mode == "skeleton", sk.reason
    assert pairs_coverage(job.used_pairs, sk.pairs) == 1.0
    assert sk.scores["pp_paired"] >= 0.6
    # per rail: 64 RNICs in 8 stages; DP peers 64 × 7; PP links over 7 boundaries, both ways
    dp_pairs, pp_exact, pp_whole_group = 64 * 7, 7 * 8 * 2, 7 * 8 * 8 * 2
    exact, whole = 8 * (dp_pairs + pp_exact), 8 * (dp_pairs + pp_whole_group)
    assert exact == job.used_pairs.shape[0]
    assert sk.pairs.shape[0] < (exact + whole) / 2


def test_rank_order_contradicted_by_evidence_keeps_the_whole_adjacent_stage():
    """Ranks that put the stages in blocks but the replicas of one stage in another order: the
    pipeline sends' shared trace names other partners, so that boundary is not trusted."""
    job = synth_job(8, 4, 8, seed=3)
    hosts = np.unique(job.host)  # host h is stage h // 8, replica h % 8
    rank = hosts.copy()
    rank[8:16] = rank[8:16][::-1]  # stage 1's replicas reversed
    sk = infer_skeleton(
        job.ep_id,
        job.host,
        job.rail,
        job.bytes_per_s,
        container=rank[np.searchsorted(hosts, job.host)],
    )
    assert pairs_coverage(job.used_pairs, sk.pairs) == 1.0, sk.reason
    assert "contradicts the rank order" in sk.reason
    # without the hint, the stages are still found and the evidence pairs the replicas
    plain = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s)
    assert pairs_coverage(job.used_pairs, plain.pairs) == 1.0 and plain.scores["pp_paired"] > 0.5


def test_sub_second_stage_shift_merges_stages_safely():
    job = synth_job(8, 8, 4, stage_shift_s=0.1, seed=4)
    sk = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s)
    assert pairs_coverage(job.used_pairs, sk.pairs) == 1.0, sk.reason


def test_before_training_starts_there_is_too_little_traffic():
    """Until every container is ready the job does not train: only co-tenant background."""
    cluster = Cluster(Fabric.from_params(hosts=16))
    job = make_job(cluster, "early", JobShape(8, 4, 4), ready_delay_s=[0.0] * 15 + [500.0], seed=1)
    x = TrafficModel([job], seed=1).matrix(100.0, DURATION_S)
    sk = _infer(job, x)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason
    assert not sk.replaces(None)  # the preload list stays


def test_window_that_starts_before_training_uses_the_training_part():
    cluster = Cluster(Fabric.from_params(hosts=32))
    job = make_job(cluster, "warm", JobShape(8, 8, 4), iteration_s=12.0, seed=2)
    model = TrafficModel([job], seed=2)
    x = model.matrix(float(np.floor(model.train_start[0])) - 100.0, DURATION_S)
    sk = _infer(job, x)
    assert sk.mode == "skeleton", sk.reason
    assert np.array_equal(sk.pairs, job.skeleton_pairs)
    # with only 30 s of training in the window, it is too early to tell
    early = model.matrix(float(np.floor(model.train_start[0])) - 210.0, DURATION_S)
    sk = _infer(job, early)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason


def test_versioning_replaces_only_changed_lists(mix):
    by_kind = {job.kind: sk for job, _, sk in mix}
    train, ep = by_kind["train"], by_kind["ep"]
    assert train.replaces(None) and not train.replaces(train.digest)
    # the job's traffic stopped fitting: its safe list must come back
    assert ep.mode == "fallback_same_rail" and ep.replaces(train.digest)


def test_sim_traffic_is_stable_across_windows():
    ((job, x),) = _place([("train", (8, 4, 8, 1), 12.0)], seed=9)
    sk = _infer(job, x[:, :150])
    assert sk.confident, sk.reason
    changed, why = traffic_changed(sk, job.ep_ids, x[:, 90:])
    assert not changed, why


def test_too_little_traffic_keeps_the_same_rail_list():
    job = synth_job(8, 4, 4, seed=0)
    short = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s[:, :45])
    assert short.mode == "fallback_same_rail" and "too little traffic" in short.reason
    idle = synth_job(8, 4, 4, kind="idle", seed=0)
    sk = infer_skeleton(idle.ep_id, idle.host, idle.rail, idle.bytes_per_s)
    assert sk.mode == "fallback_same_rail" and "too little traffic" in sk.reason
    assert np.array_equal(sk.pairs, same_rail_pairs(idle.ep_id, idle.rail, idle.host))


def test_containers_on_different_rails_keep_every_cross_host_pair():
    """Two containers bind rails 0-3, two bind rails 4-7: a peer may be on another rail."""
    host = np.repeat(np.arange(4), 4)
    rail = np.r_[np.tile(np.arange(4), 2), np.tile(np.arange(4, 8), 2)]
    ep = np.arange(16, dtype=np.uint32)
    x = np.full((16, 200), 5e7)
    sk = infer_skeleton(ep, host, rail, x)
    assert sk.mode == "fallback_group_wide" and "another rail" in sk.reason
    assert sk.pairs.shape[0] == 16 * 12  # every ordered pair on different hosts
    assert pairs_coverage(same_rail_pairs(ep, rail, host), sk.pairs) == 1.0


def test_single_host_job_has_nothing_to_probe():
    job = synth_job(8, 1, 1, seed=0)
    sk = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s)
    assert sk.pairs.shape == (0, 2) and sk.mode == "fallback_same_rail"


def test_digest_is_deterministic_and_tracks_pairs():
    job = synth_job(8, 4, 4, seed=7)
    a = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s)
    b = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s.copy())
    assert a.digest == b.digest and np.array_equal(a.pairs, b.pairs)
    c = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s[:, :45])
    assert c.digest != a.digest
    assert len(a.digest) == 16


def test_traffic_change_triggers_reinference():
    job = synth_job(8, 4, 8, seed=1, duration_s=480)
    first = infer_skeleton(job.ep_id, job.host, job.rail, job.bytes_per_s[:, :240])
    assert first.confident, first.reason
    later = job.bytes_per_s[:, 240:]
    changed, why = traffic_changed(first, job.ep_id, later)
    assert not changed, why
    # the job is restarted with another layout: groups no longer burst together
    mixed = later[np.random.default_rng(0).permutation(job.ep_id.size)]
    changed, why = traffic_changed(first, job.ep_id, mixed)
    assert changed and "co-occur" in why
    # a different iteration period
    slower = synth_job(8, 4, 8, seed=1, period_s=31.0)
    changed, why = traffic_changed(first, job.ep_id, slower.bytes_per_s)
    assert changed and "period" in why
    # endpoints left
    assert traffic_changed(first, job.ep_id[:-8], later[:-8])[0]


def test_fallback_for_missing_traffic_asks_for_reinference_once_traffic_flows():
    idle = synth_job(8, 4, 4, kind="idle", seed=0)
    sk = infer_skeleton(idle.ep_id, idle.host, idle.rail, idle.bytes_per_s)
    assert not traffic_changed(sk, idle.ep_id, idle.bytes_per_s)[0]
    busy = synth_job(8, 4, 4, seed=0)
    assert traffic_changed(sk, busy.ep_id, busy.bytes_per_s)[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"host": np.zeros(3)},
        {"bytes_per_s": np.zeros((3, 100))},
        {"bytes_per_s": np.zeros(8)},
        {"ep_id": np.zeros(8, np.uint32)},
        {"container": np.zeros(3)},
    ],
)
def test_bad_arguments_are_rejected(kwargs):
    args = {
        "ep_id": np.arange(8, dtype=np.uint32),
        "host": np.arange(8) // 4,
        "rail": np.arange(8) % 4,
        "bytes_per_s": np.ones((8, 100)),
    }
    extra = {"container": kwargs.pop("container")} if "container" in kwargs else {}
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
