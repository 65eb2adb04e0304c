import numpy as np
import pytest

from skh.errors import ConfigError, TopologyError
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs
from skh.sim.jobs import HostPool, generate_jobs, make_job


def _cluster(hosts=64):
    return Cluster(Fabric.from_params(hosts=hosts, hosts_per_segment=16, spines=4))


def test_512_gpu_skeleton_is_9_of_63_same_rail_peers():
    cluster = _cluster()
    job = make_job(cluster, "llm", JobShape(tp=8, pp=8, dp=8))
    assert job.n_endpoints == 512 and len(set(job.host.tolist())) == 64
    peers = np.bincount(job.skeleton_pairs[:, 0], minlength=512)
    interior = (job.pp_stage > 0) & (job.pp_stage < 7)
    # 7 DP peers + 2 PP neighbours inside the pipeline, 7 + 1 at its two ends
    assert (peers[job.ep_ids[interior]] == 9).all()
    assert (peers[job.ep_ids[~interior]] == 8).all()
    arrays = cluster.endpoint_arrays()
    full = same_rail_pairs(arrays["ep_id"], arrays["rail"], arrays["host"])
    assert (np.bincount(full[:, 0], minlength=512) == 63).all()
    # the skeleton is a subset of the same-rail preload, and symmetric
    fset = {tuple(p) for p in full.tolist()}
    sk = {tuple(p) for p in job.skeleton_pairs.tolist()}
    assert sk <= fset
    assert {(b, a) for a, b in sk} == sk
    # DP groups: one per (stage, rail), 8 members on one rail and 8 hosts
    groups = job.dp_groups()
    assert len(groups) == 64
    for g in groups:
        assert g.size == 8
        assert len(set(job.rail[g].tolist())) == 1 and len(set(job.host[g].tolist())) == 8


def test_pp_neighbours_are_adjacent_stages_same_dp_rank():
    cluster = _cluster(16)
    job = make_job(cluster, "j", JobShape(tp=8, pp=4, dp=4))
    stage, dprank = job.pp_stage, job.dp_rank
    for a, b in job.skeleton_pairs.tolist():
        if stage[a] == stage[b]:
            continue
        assert abs(int(stage[a]) - int(stage[b])) == 1
        assert dprank[a] == dprank[b] and job.rail[a] == job.rail[b]


def test_four_rnic_containers_share_one_half():
    cluster = _cluster(8)
    pool = HostPool(cluster)
    j = make_job(cluster, "half", JobShape(tp=4, pp=1, dp=4), pool=pool)
    halves = {int(r) // 4 for r in j.rail}
    assert len(halves) == 1 and len(set(j.host.tolist())) == 4
    used = {(int(h), int(r) // 4) for h, r in zip(j.host, j.rail, strict=True)}
    for name in ("k1", "k2", "k3"):
        k = make_job(cluster, name, JobShape(tp=4, pp=1, dp=4), pool=pool)
        mine = {(int(h), int(r) // 4) for h, r in zip(k.host, k.rail, strict=True)}
        assert len({r // 4 for r in k.rail.tolist()}) == 1
        assert not mine & used
        used |= mine
    assert len(used) == 16  # 8 hosts × 2 halves, all handed out once
    assert len(cluster.endpoints) == 64 and not j.needs_safe_list
    with pytest.raises(TopologyError):
        make_job(cluster, "full", JobShape(tp=4, pp=1, dp=1), pool=pool)


def test_ready_times_and_lifetime():
    cluster = _cluster(16)
    j = make_job(cluster, "j", JobShape(8, 2, 8), start_s=100.0, lifetime_s=50.0, seed=3)
    assert (j.ready_s >= 100.0).all() and (j.ready_s <= 700.0).all()
    assert j.ready_s.max() - j.ready_s.min() > 30.0  # containers become ready minutes apart
    assert j.alive(120.0) and not j.alive(150.0)
    # one readiness per container
    for c in range(16):
        assert len(set(j.ready_s[j.container == c].tolist())) == 1


def test_make_job_validates():
    cluster = _cluster(4)
    with pytest.raises(ConfigError):
        make_job(cluster, "x", JobShape(tp=2))
    with pytest.raises(ConfigError):
        make_job(cluster, "x", JobShape(tp=8, dp=2), hosts=["host0"])
    with pytest.raises(ConfigError):
        make_job(cluster, "x", JobShape(tp=8, dp=3, ep=2), kind="ep")


def test_generate_jobs_fits_and_is_deterministic():
    def run():
        cluster = Cluster(Fabric.from_params(hosts=128, hosts_per_segment=16, spines=4))
        jobs = generate_jobs(cluster, 60, seed=11)
        return cluster, jobs

    c1, j1 = run()
    c2, j2 = run()
    assert [j.name for j in j1] == [j.name for j in j2]
    assert all(
        np.array_equal(a.skeleton_pairs, b.skeleton_pairs) for a, b in zip(j1, j2, strict=True)
    )
    hosts = [(c.host, c.rails) for c in (e for j in j1 for e in j.job.containers)]
    assert len(hosts) == len(set(hosts))  # no GPU half given twice
    kinds = {j.kind for j in j1}
    assert kinds == {"train", "ep", "debug", "fsdp"}
    assert any(j.plan.rnics == 4 for j in j1)
    assert any(j.shape.tp < j.plan.rnics and j.kind != "fsdp" for j in j1)
    assert any(j.plan.vpp > 1 for j in j1)
    assert len(c1.endpoints) == len(c2.endpoints)


@pytest.mark.parametrize(
    "shape", [JobShape(8, 1, 2), JobShape(8, 3, 5), JobShape(4, 4, 2), JobShape(8, 2, 1)]
)
def test_skeleton_matches_a_brute_force_reference(shape):
    cluster = _cluster(16)
    job = make_job(cluster, "j", shape)
    want = set()
    n = job.n_endpoints
    for i in range(n):
        for k in range(n):
            if i == k or job.rail[i] != job.rail[k]:
                continue
            same_stage = job.pp_stage[i] == job.pp_stage[k]
            pp_nb = (
                abs(int(job.pp_stage[i]) - int(job.pp_stage[k])) == 1
                and job.dp_rank[i] == job.dp_rank[k]
            )
            if same_stage or pp_nb:
                want.add((int(job.ep_ids[i]), int(job.ep_ids[k])))
    got = [tuple(p) for p in job.skeleton_pairs.tolist()]
    assert len(got) == len(set(got)) and set(got) == want


def _brute_force_truth(job):
    """Used pairs from first principles: GPU g = t + TP(c + CP(d + DP s)); a stage's GPUs of one
    TP rank collect over the network on their rail; pipeline neighbours (and, interleaved, the
    last stage to the first) send through the NIC on the destination's rail and get the reply
    through the sender's."""
    s, plan = job.shape, job.plan
    r = plan.rnics
    per_stage = s.tp * plan.cp * s.dp
    gpus = per_stage * s.pp
    cont = np.arange(gpus) // r
    ep = job.ep_ids
    want = set()
    for g1 in range(gpus):
        for g2 in range(gpus):
            if cont[g1] == cont[g2]:
                continue
            same_stage = g1 // per_stage == g2 // per_stage
            if same_stage and g1 % r == g2 % r:
                want.add((int(ep[g1]), int(ep[g2])))
    links = [(g, g + per_stage) for g in range(gpus - per_stage)]
    if plan.vpp > 1 and s.pp > 2:
        links += [(g, g - (s.pp - 1) * per_stage) for g in range((s.pp - 1) * per_stage, gpus)]
    for a, b in links:
        if cont[a] == cont[b]:
            continue
        for rail in (a % r, b % r):
            e1, e2 = int(ep[cont[a] * r + rail]), int(ep[cont[b] * r + rail])
            want |= {(e1, e2), (e2, e1)}
    return want


@pytest.mark.parametrize(
    "shape,plan",
    [
        (JobShape(2, 4, 16), {"rnics": 8}),  # TP 2 in 8-RNIC containers: 4 replicas a container
        (JobShape(4, 4, 1), {"rnics": 8}),  # two stages a container: PXN crosses rails
        (JobShape(4, 8, 1), {"rnics": 8, "vpp": 2}),  # and the interleaved wrap-around
        (JobShape(8, 4, 2), {"vpp": 2}),
        (JobShape(8, 2, 2), {"cp": 2}),
        (JobShape(2, 2, 2), {"rnics": 4, "cp": 2}),
    ],
)
def test_new_layouts_match_a_brute_force_reference(shape, plan):
    job = make_job(_cluster(32), "j", shape, **plan)
    got = {tuple(p) for p in job.skeleton_pairs.tolist()}
    assert got == _brute_force_truth(job)
    assert all(job.rail[a - job.ep_ids[0]] == job.rail[b - job.ep_ids[0]] for a, b in got)


def test_fsdp_uses_every_same_rail_pair():
    cluster = _cluster(8)
    job = make_job(cluster, "z", JobShape(1, 1, 32), kind="fsdp", rnics=8)
    full = same_rail_pairs(job.ep_ids, job.rail, job.host)
    assert np.array_equal(job.skeleton_pairs, full)
    with pytest.raises(ConfigError):
        make_job(cluster, "bad", JobShape(1, 2, 16), kind="fsdp", rnics=8)


def test_plans_that_do_not_fit_containers_are_rejected():
    cluster = _cluster(16)
    with pytest.raises(ConfigError):  # a stage of 12 GPUs neither fills nor packs 8-RNIC containers
        make_job(cluster, "a", JobShape(2, 2, 6), rnics=8)
    with pytest.raises(ConfigError):  # TP must stay inside a container
        make_job(cluster, "b", JobShape(8, 2, 2), rnics=4)
    with pytest.raises(ConfigError):  # interleaving needs microbatches a multiple of PP
        make_job(cluster, "c", JobShape(8, 4, 2), vpp=2, microbatches=6)
