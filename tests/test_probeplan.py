"""The probe plan: path rotation sized from the ECMP width, the per-endpoint budget, and link
floors paid for within it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skh.analysis.sampling import FLOW_SLOTS
from skh.errors import ConfigError, ProtocolError
from skh.model import Fabric
from skh.orchestrator.config import load_config
from skh.probeplan import FabricLinks, ProbePlan, ProbePolicy, paths_needed, plan_probes


def test_path_ids_follow_the_coupon_collector_bound():
    n = paths_needed(np.array([1, 2, 3, 4, 9]), 0.995, 64)
    assert n.tolist() == [1, 8, 14, 19, 45]
    for m, k in zip([2, 3, 4, 9], n[1:].tolist(), strict=True):
        # the chance that one given path is missed by all k hashed ids is within the target,
        # and one id fewer would not be
        assert (1 - 1 / m) ** k <= 0.005 < (1 - 1 / m) ** (k - 1)
    assert paths_needed(16, 0.995, 64).item() == 64  # capped (UDP engines keep 64 ports)


def test_the_budget_caps_every_source_and_shares_it_evenly():
    pol = ProbePolicy(budget_per_s=100.0)
    busy = np.column_stack([np.zeros(32, np.uint32), np.arange(1, 33)])
    quiet = np.array([[40, 41], [40, 42]], np.uint32)
    plan = plan_probes(np.vstack([quiet, busy]), pol)
    assert plan.pairs[:, 0].tolist() == [0] * 32 + [40, 40]  # sorted by (src, dst)
    src, rate = plan.endpoint_rates()
    assert dict(zip(src.tolist(), rate.round(3).tolist(), strict=True)) == {0: 100.0, 40: 20.0}
    assert set(plan.interval_ms[:32].tolist()) == {320}  # 32 peers share 100 probes/s
    assert set(plan.interval_ms[32:].tolist()) == {100}  # under budget: the policy's interval
    assert set(plan.paths.tolist()) == {19}  # no fabric: 4 ECMP paths assumed
    assert plan.lookup(40) == {41: (0.1, 19), 42: (0.1, 19)}


def test_a_link_few_pairs_cross_gets_its_floor_within_the_budget():
    fab = Fabric.from_params(hosts=8, rnics_per_host=1, hosts_per_segment=2, spines=2)
    links = FabricLinks(fab)
    # one pair across the spines (its ECMP paths split over two spines, 4 spine links) and a
    # pair under one ToR
    pairs = np.array([[0, 2], [0, 1]], np.uint32)
    rnic = {0: "host0:rnic0", 1: "host1:rnic0", 2: "host2:rnic0"}
    inc = links.incidence([rnic[a] for a in (0, 0)], [rnic[b] for b in (1, 2)])
    # the access links' own floor is the next test's
    plan = plan_probes(pairs, ProbePolicy(access_link_min_per_s=0), links=inc)
    assert inc.ecmp_paths.tolist() == [1, 2]
    # each spine link sees half the pair's probes: 20/s makes 10/s per spine link
    assert plan.lookup(0) == {1: (0.1, 1), 2: (0.05, 8)}
    s = plan.summary()
    assert s["links_below_floor"] == 0 and s["link_rate_min"] == pytest.approx(10.0)
    assert dict(zip(plan.link_names, plan.link_rate.tolist(), strict=True))[
        ("spine0", "tor0r0")
    ] == pytest.approx(10.0)
    # a budget too small for the floor: the budget wins and the plan says what falls short
    tight = plan_probes(pairs, ProbePolicy(budget_per_s=15.0, access_link_min_per_s=0), links=inc)
    assert tight.endpoint_rates()[1].max() <= 15.0
    assert tight.summary()["links_below_floor"] > 0


def test_access_links_get_their_floor_within_the_budget():
    """A sparse skeleton's access link carries one pair both ways (2 x 10/s): the access floor
    (160/s) probes that pair 8x as fast, while a source whose peers already load its access link
    beyond the floor, is left as it was, and one whose budget is spent goes no faster."""
    fab = Fabric.from_params(hosts=8, rnics_per_host=1, hosts_per_segment=2, spines=2)
    links = FabricLinks(fab)
    rnic = [f"host{i}:rnic0" for i in range(8)]
    # 0 <-> 2 (across the spines), and 3 <-> 4..7 (80/s on 3's access link at 10/s a pair)
    pairs = np.array(
        [[0, 2], [2, 0]] + [[3, d] for d in range(4, 8)] + [[d, 3] for d in range(4, 8)],
        np.uint32,
    )
    pairs = np.unique(pairs, axis=0)
    inc = links.incidence([rnic[a] for a in pairs[:, 0]], [rnic[b] for b in pairs[:, 1]])
    assert inc.access.sum() == 7  # the 7 RNICs' access links, no switch link
    plan = plan_probes(pairs, ProbePolicy(), links=inc)
    # 80/s each way pays the floor; the millisecond grid rounds 12.5 ms down to 12
    assert plan.lookup(0)[2][0] == plan.lookup(2)[0][0] == 0.012
    # source 3's peers' access links carry one pair each: sped up as far as 3's budget goes
    # (100/s over 4 peers)
    assert {iv for iv, _n in plan.lookup(3).values()} == {0.04}
    assert plan.endpoint_rates()[1].max() <= 100.0
    rate = dict(zip(plan.link_names, plan.link_rate.tolist(), strict=True))
    assert rate[("host0:rnic0", "tor0r0")] == pytest.approx(500.0 / 3)
    # 4..7 would probe 3 at the fastest a floor may (100/s, their budget), but 3 answers at
    # most 100/s: 25/s each, and 3 probes each at 25/s (its budget): 50/s on their access
    # links, short of the floor, and the plan says so
    assert {iv for iv, _n in plan.lookup(4).values()} == {0.04}
    assert plan.endpoint_rates(answered=True)[1].max() <= 100.0
    assert rate[("host4:rnic0", "tor2r0")] == pytest.approx(50.0)
    assert plan.summary()["links_below_floor"] == 4
    # without the answer budget, 4..7 go to 100/s each (125/s on their links) and 3 answers 400/s
    open_ = plan_probes(pairs, ProbePolicy(answer_budget_per_s=1000.0), links=inc)
    assert {iv for iv, _n in open_.lookup(4).values()} == {0.01}
    assert open_.summary()["endpoint_answers_max"] == pytest.approx(400.0)
    # within the budget: 30 probes/s per endpoint cannot pay 80/s, the budget wins and says so
    tight = plan_probes(pairs, ProbePolicy(budget_per_s=30.0), links=inc)
    assert tight.endpoint_rates()[1].max() <= 30.0
    assert tight.summary()["links_below_floor"] > 0
    # no access floor: the old 10/s per pair
    flat = plan_probes(pairs, ProbePolicy(access_link_min_per_s=0), links=inc)
    assert flat.lookup(0)[2][0] == 0.1


def test_path_coverage_sets_a_rate_floor():
    # 45 path ids (9 ECMP paths) must all be probed within coverage_s = 10 s: 4.5 probes/s
    pol = ProbePolicy(interval_s=1.0, default_ecmp_paths=9)
    plan = plan_probes(np.array([[1, 2]]), pol)
    assert plan.paths.tolist() == [45]
    assert plan.interval_ms.tolist() == [222]
    assert plan.summary()["pairs_slower_than_coverage"] == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=300),
    st.floats(5.0, 500.0),
    st.floats(5.0, 500.0),
)
def test_no_source_ever_exceeds_its_budget(raw, budget, answer_budget):
    pairs = np.array([p for p in raw if p[0] != p[1]] or [(0, 1)], np.uint32)
    pol = ProbePolicy(budget_per_s=budget, answer_budget_per_s=answer_budget)
    plan = plan_probes(pairs, pol)
    _, rate = plan.endpoint_rates()
    assert (rate <= budget + 1e-6).all()
    _, answered = plan.endpoint_rates(answered=True)
    assert (answered <= answer_budget + 1e-6).all()
    assert (plan.interval_ms >= 20).all()
    assert np.array_equal(plan.pairs, np.unique(pairs, axis=0))


def test_plan_round_trips_the_wire_and_refuses_a_misfit():
    pairs = np.array([[1, 2], [1, 3], [2, 1]], np.uint32)
    plan = plan_probes(pairs, ProbePolicy())
    back = ProbePlan.from_wire(plan.to_wire(), plan.pairs, plan.policy)
    assert np.array_equal(back.interval_ms, plan.interval_ms)
    assert np.array_equal(back.paths, plan.paths)
    with pytest.raises(ProtocolError):
        ProbePlan.from_wire(plan.to_wire(), plan.pairs[:2], plan.policy)
    with pytest.raises(ProtocolError):
        ProbePlan.from_wire({"interval_ms": b"\0\0" * 3, "paths": b"\1\0" * 3}, pairs, plan.policy)
    assert ProbePolicy.from_wire(ProbePolicy().to_wire()) == ProbePolicy()
    with pytest.raises(ProtocolError):
        ProbePolicy.from_wire({"budget_per_s": -1})


def test_controller_settings_make_the_policy_and_name_a_bad_one():
    cfg = load_config(None, {"controller.probe_budget_per_s": 50, "controller.ok_sample_s": 0.5})
    pol = ProbePolicy.from_config(cfg.controller)
    assert (pol.budget_per_s, pol.ok_sample_s, pol.interval_s) == (50.0, 0.5, 0.1)
    with pytest.raises(ConfigError, match="controller.probe_max_paths"):
        load_config(None, {"controller.probe_max_paths": 65})
    assert pol.differences(interval_s=0.1, ok_sample_s=1.0) == [
        "ok_sample_s: 1 here, 0.5 from the controller"
    ]


def test_plans_at_the_paper_scale_fabric_are_fast():
    """Every ToR pair's ECMP set is worked out once: a Lingjun pod of 847 hosts x 8 rails."""
    from skh.sim import LINGJUN_TOPO

    fab = Fabric.from_lingjun(LINGJUN_TOPO)
    hosts = list(fab.hosts)
    rng = np.random.default_rng(1)
    n = 20_000
    a, b = rng.integers(len(hosts), size=n), rng.integers(len(hosts), size=n)
    rail = rng.integers(8, size=n)
    keep = a != b
    src = [f"{hosts[i]}:rnic{r}" for i, r in zip(a[keep], rail[keep], strict=True)]
    dst = [f"{hosts[i]}:rnic{r}" for i, r in zip(b[keep], rail[keep], strict=True)]
    pairs = np.column_stack([np.arange(keep.sum()), np.arange(keep.sum()) + n]).astype(np.uint32)
    inc = FabricLinks(fab).incidence(src, dst)
    plan = plan_probes(pairs, ProbePolicy(), links=inc)
    # one ToR, or the 2-3 spines two of the pod's segments share
    assert set(np.unique(inc.ecmp_paths).tolist()) == {1, 2, 3}
    s = plan.summary()
    assert s["pairs_slower_than_coverage"] == 0 and s["endpoint_rate_max"] <= 100.0
    # every link meets its floor but access links whose one pair, one way, already goes as fast
    # as a floor may (100/s, short of the 160/s access floor)
    short = plan.link_rate < plan.link_floor - 1e-9
    assert s["links_below_floor"] == short.sum() > 0
    assert np.allclose(plan.link_rate[short], 1.0 / ProbePolicy().min_interval_s)


def test_the_eval_plans_its_cluster_and_covers_every_ecmp_path():
    """``skh eval``'s probing-as-deployed figures on the tiny profile: every link at its floor,
    no endpoint over its budget, and nearly every (pair, ECMP path) probed within 10 s where one
    path id per pair leaves paths unprobed."""
    from skh.eval.plan import planned_probing
    from skh.sim import LINGJUN_TOPO
    from skh.sim.scenario import Simulation

    fab = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=64)
    sim = Simulation.build(fab, 10, seed=2, probe_interval_s=0.1)
    out = planned_probing(sim, fab, seed=2, hash_seeds=5)
    assert out["plan"]["endpoint_rate_max"] <= 100.0
    assert out["links_below_floor"]["planned"] == 0
    cov = out["ecmp_paths_covered_share"]
    assert cov["planned_min"] >= 0.99
    if set(out["ecmp_paths_per_pair"]) != {"1"}:
        assert cov["one_path_id_mean"] < cov["planned_min"]
    b = out["busiest_container"]
    assert b["planned_probes_per_s"] <= 8 * 100.0
    assert out == planned_probing(sim, fab, seed=2, hash_seeds=5)  # deterministic


def test_path_coverage_counts_every_window_not_the_whole_rotation():
    """A path is covered when no window of 10 s misses it: with 10 ids at 2 s (5 per window) a
    path whose ids sit 6 apart is missed by some window."""
    from skh.eval.plan import path_coverage

    class Fixed:
        """A generator whose hash puts id i on path i % 2 (and path 0 for the one-id draw)."""

        def integers(self, lo, hi):
            hi = np.asarray(hi)
            return np.arange(hi.size) % 2 if hi.size > 1 else np.zeros(1, np.int64)

    pol = ProbePolicy(interval_s=2.0, min_interval_s=0.02)
    plan = ProbePlan(
        np.array([[0, 1]], np.uint32),
        np.array([2000], np.uint16),
        np.array([10], np.uint16),
        pol,
        np.zeros(0),
    )
    # ids alternate paths: gaps of 2 <= 5 probes per window: both paths covered
    assert path_coverage(plan, np.array([2]), Fixed())[0] == 1.0
    # three paths, ids 0..9 on paths i % 2: path 2 never hashed onto
    assert path_coverage(plan, np.array([3]), Fixed())[0] == pytest.approx(2 / 3)

    class Lumpy(Fixed):
        def integers(self, lo, hi):
            hi = np.asarray(hi)
            # path 1 only at ids 0 and 6: a cyclic gap of 6 > 5
            return (np.isin(np.arange(hi.size), [0, 6])).astype(np.int64)

    assert path_coverage(plan, np.array([2]), Lumpy())[0] == 0.5


def test_a_job_without_pairs_has_an_empty_incidence_and_plan():
    fl = FabricLinks(Fabric.from_params(hosts=8, hosts_per_segment=4, spines=2))
    inc = fl.incidence([], [])
    assert inc.pair.size == 0 and inc.ecmp_paths.size == 0
    assert plan_probes(np.zeros((0, 2), np.uint32), ProbePolicy(), links=inc).pairs.shape == (0, 2)


def test_the_longest_rotation_fits_the_detectors_flow_slots():
    """The detector keeps one failure run per path id (``FLOW_SLOTS``): a policy may not rotate
    over more ids, or the detector would fold a dead ECMP path in with working ones."""
    assert ProbePolicy(max_paths=FLOW_SLOTS).max_paths == FLOW_SLOTS
    with pytest.raises(ConfigError, match="max_paths"):
        ProbePolicy(max_paths=FLOW_SLOTS + 1)


@pytest.mark.parametrize(
    "policy",
    [
        ProbePolicy(),
        ProbePolicy(interval_s=0.05, budget_per_s=37.0, ok_sample_s=0.0),
        ProbePolicy(interval_s=0.25, min_interval_s=0.01, budget_per_s=400.0, max_paths=7),
        ProbePolicy(coverage_s=1.0, default_ecmp_paths=9, budget_per_s=13.0),
        ProbePolicy(interval_s=3.0, min_interval_s=1.0, budget_per_s=1.0, ok_sample_s=5.0),
        ProbePolicy(budget_per_s=100.0, answer_budget_per_s=30.0),
    ],
)
def test_an_agents_own_plan_of_one_source_is_the_planners(policy):
    """An overlay agent plans its preload list without numpy (skh.policy.source_plan): on a
    same-rail list (k + 1 endpoints, each probing the k others) each pair gets what plan_probes
    gives it, budget edges (sent and answered) included."""
    from skh.policy import source_plan

    for k in [*range(1, 40), 63, 64, 99, 100, 101, 333, 700]:
        ep = np.arange(k + 1)
        src, dst = np.repeat(ep, k + 1), np.tile(ep, k + 1)
        plan = plan_probes(np.column_stack([src, dst])[src != dst], policy)
        assert set(plan.interval_ms.tolist()) == {round(source_plan(k, policy)[0] * 1000)}
        assert set(plan.paths.tolist()) == {source_plan(k, policy)[1]}


def test_an_agent_reads_its_rows_of_the_skeletons_plan():
    from array import array

    from skh.errors import ProtocolError
    from skh.policy import plan_rows

    rng = np.random.default_rng(5)
    pairs = np.unique(rng.integers(0, 30, (200, 2)), axis=0)
    plan = plan_probes(pairs, ProbePolicy(budget_per_s=40.0))
    src, dst = array("I", pairs[:, 0].tolist()), array("I", pairs[:, 1].tolist())
    for ep in range(31):
        assert plan_rows(plan.to_wire(), src, dst, ep) == plan.lookup(ep)
    with pytest.raises(ProtocolError):
        plan_rows(plan.to_wire(), src[:-1], dst[:-1], 3)
    bad = plan.to_wire() | {"paths": bytes(2 * len(src))}
    with pytest.raises(ProtocolError):
        plan_rows(bad, src, dst, 3)


def test_a_hot_destination_answers_within_its_budget_and_its_askers_probe_elsewhere():
    """Twenty sources each probe one hot destination and one peer of their own: the hot one is
    asked 20 x 10/s, twice its answer budget, so its askers probe it at 5/s, and the budget
    that frees goes to nobody (their other pairs already get the 10/s they want); without a
    fabric no floor asks more."""
    hot = 100
    pairs = np.array([[s, hot] for s in range(20)] + [[s, 200 + s] for s in range(20)], np.uint32)
    plan = plan_probes(pairs, ProbePolicy(answer_budget_per_s=100.0))
    answered = dict(zip(*plan.endpoint_rates(answered=True), strict=True))
    assert answered[hot] <= 100.0 + 1e-9
    assert answered[hot] == pytest.approx(100.0, rel=0.05)
    assert {plan.lookup(s)[hot][0] for s in range(20)} == {0.2}
    assert {plan.lookup(s)[200 + s][0] for s in range(20)} == {0.1}
    # a destination asked less than its budget is left alone
    loose = plan_probes(pairs, ProbePolicy(answer_budget_per_s=400.0))
    assert {loose.lookup(s)[hot][0] for s in range(20)} == {0.1}


def test_the_answer_budget_never_pushes_a_source_past_its_own():
    """Source 0 has 60 peers and a budget of 20/s, far too little for their floors (19 path
    ids each within coverage_s = 1 s: 19/s a pair): each gets 1/3 probe/s. Its peer 100 is
    also probed by ten sources whose floors want 19/s each, past 100's answer budget of 50/s;
    fitting 100's answers slows those ten, and must not raise 0's pair toward the floor 0's own
    budget could not pay."""
    pairs = np.array(
        [[0, d] for d in range(100, 160)] + [[s, 100] for s in range(1, 11)], np.uint32
    )
    pol = ProbePolicy(budget_per_s=20.0, answer_budget_per_s=50.0, coverage_s=1.0)
    plan = plan_probes(pairs, pol)
    src, sent = plan.endpoint_rates()
    assert sent[src == 0][0] <= 20.0 + 1e-9
    dst, answered = plan.endpoint_rates(answered=True)
    assert answered[dst == 100][0] <= 50.0 + 1e-9
    rows = plan.lookup(0)
    assert rows[100][0] >= max(iv for iv, _n in rows.values() if iv != rows[100][0])
