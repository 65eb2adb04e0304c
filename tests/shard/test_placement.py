"""Placement, ingest routing and merging, without Ray: where endpoints go, what an ingest
front-end takes from whom, and how the shards' events of one tick become the single
detector's."""

import numpy as np
import pytest
import zmq

from skh.analysis.detect import SuspectEvent
from skh.errors import ConfigError
from skh.orchestrator.analyzer import RoundQuota
from skh.orchestrator.authz import AnalyzerPolicy, KeyBook
from skh.orchestrator.security import Identity
from skh.orchestrator.shard.ingest import IngestRouter
from skh.orchestrator.shard.merge import merge_events
from skh.orchestrator.shard.placement import Placement
from skh.records import ProbeStatus, empty_counters, empty_probes
from skh.wire import Codec, MsgType, probe_batch_body


def _members(job, first_ep, hosts, rails=8):
    return [
        {"ep": first_ep + h * rails + r, "job": job, "rail": r}
        for h in range(hosts)
        for r in range(rails)
    ]


def test_jobs_go_whole_to_the_least_loaded_shard_and_stay_there():
    pl = Placement(2, max_cell_endpoints=64)
    a, b = _members("a", 0, 4), _members("b", 32, 2)
    pl.update(a + b)
    assert pl.home == {"a": 0, "b": 1}
    assert set(pl.ep_shard[:32]) == {0} and set(pl.ep_shard[32:48]) == {1}
    # a third job goes where fewer endpoints are; earlier placements never move
    c = _members("c", 48, 1)
    pl.update(a + b + c)
    assert pl.home["c"] == 1 and set(pl.ep_shard[:32]) == {0}
    # a job gone is no one's home; its endpoints' ids are never reused
    pl.update(a + c)
    assert "b" not in pl.home and pl.jobs_of(1) == {"c"}


def test_a_job_too_big_for_a_shard_is_placed_rail_by_rail():
    pl = Placement(4, max_cell_endpoints=16)
    big = _members("big", 0, 4)  # 32 endpoints, 8 rails
    pl.update(big)
    assert {c for c in pl.cell_shard} == {("big", r) for r in range(8)}
    shard_of_rail = {r: int(pl.ep_shard[r]) for r in range(8)}
    assert sorted(shard_of_rail.values()) == [0, 0, 1, 1, 2, 2, 3, 3]
    for m in big:  # an endpoint sits with every other endpoint of its rail
        assert pl.ep_shard[m["ep"]] == shard_of_rail[m["rail"]]
    # its counters all go to one home shard: skeleton inference reads the whole job
    assert set(pl.ep_home[:32]) == {pl.home["big"]}


def test_records_are_routed_in_order_and_strangers_are_counted():
    pl = Placement(2, max_cell_endpoints=8)
    pl.update(_members("j", 0, 2))  # rails 0..7 of 2 hosts: rail cells over both shards
    p = empty_probes(5)
    p["src_ep"], p["dst_ep"], p["seq"] = [0, 8, 1, 0, 99], [8, 0, 9, 1, 0], [1, 2, 3, 4, 5]
    c = empty_counters(3)
    c["ep"] = [0, 9, 99]
    r = pl.route(p, c, np.array([1, 0, 99]))
    s0, s1 = int(pl.ep_shard[0]), int(pl.ep_shard[1])
    assert s0 != s1
    assert r.probes[s0]["seq"].tolist() == [1, 2, 4] and r.probes[s1]["seq"].tolist() == [3]
    assert r.unplaced == 1 and r.cross_cell == 1  # 0 -> 1 crosses rails; 99 is no one's
    assert sum(x.size for x in r.counters) == 2 and sorted(np.concatenate(r.heartbeats)) == [0, 1]
    with pytest.raises(ConfigError):
        Placement(0)


def test_a_front_end_takes_results_only_for_endpoints_the_sender_owns():
    # the front-end is a door into the analyzer: the analyzer's policy and per-sender caps hold
    book = KeyBook()
    keys = {name: zmq.curve_keypair()[0].decode() for name in ("sc-a", "sc-b")}
    book.set_dynamic(
        [
            Identity(keys["sc-a"], "sc-a", "overlay", "h0", "c0", "j"),
            Identity(keys["sc-b"], "sc-b", "overlay", "h1", "c1", "j"),
        ]
    )
    policy = AnalyzerPolicy(book)
    policy.update({keys["sc-a"]: [0], keys["sc-b"]: [8]}, {"j": [0, 8]})
    pl = Placement(2)
    pl.update(_members("j", 0, 2))
    router = IngestRouter(2, Codec(), policy, RoundQuota(1_000, 3))
    router.set_routes(pl.ep_shard, pl.ep_home)
    codec = Codec()

    def batch(agent, src, dst, n=1):
        p = empty_probes(n)
        p["src_ep"], p["dst_ep"], p["status"], p["rtt_ns"] = src, dst, ProbeStatus.OK, 9_000
        body = probe_batch_body(agent, p, [src])
        return codec.encode(MsgType.PROBE_BATCH, agent, 1, body)

    router.on_frame(batch("sc-a", 0, 8), keys["sc-a"])
    router.on_frame(batch("sc-a", 8, 0), keys["sc-a"])  # b's endpoint: refused
    router.on_frame(batch("sc-b", 8, 0), keys["sc-a"])  # speaking as b: refused
    router.on_frame(batch("sc-a", 0, 8), "")  # no key: no identity
    router.on_frame(batch("sc-b", 8, 0, n=5), keys["sc-b"])  # over b's 3 a round: dropped
    assert router.counters["unauthorized"] == 3 and router.counters["batches"] == 2
    assert router.quota.dropped == 5
    out = router.flush()
    got = np.concatenate([p for p, _c, _h in out])
    assert got[["src_ep", "dst_ep"]].tolist() == [(0, 8)]
    # the dropped batch still said b's agent is alive; the next round has room again
    assert sorted(int(e) for _p, _c, h in out for eps, _t in h for e in eps) == [0, 8]
    router.on_frame(batch("sc-b", 8, 0, n=3), keys["sc-b"])
    assert sum(p.size for p, _c, _h in router.flush()) == 3


def _ev(kind, pairs, scores, first, eps=()):
    return SuspectEvent(kind, tuple(pairs), tuple(scores), first, 100, f"{kind} here", eps)


def test_merged_events_read_like_one_detector_tick():
    a = [_ev("unreachable", [(0, 1), (4, 5)], [3, 4], 50), _ev("agent", [(2, 3)], [1.0], 100, (2,))]
    b = [_ev("loss", [(8, 9)], [1], 70), _ev("unreachable", [(1, 0)], [2], 40)]
    c = [_ev("agent", [(6, 7), (7, 6)], [4.0], 100, (6,)), _ev("agent", [(1, 2)], [8.0], 100, (1,))]
    out = merge_events([a, b, c])
    assert [e.kind for e in out] == ["unreachable", "loss", "agent"]
    un = out[0]
    assert un.pairs == ((0, 1), (1, 0), (4, 5)) and un.scores == (3, 2, 4)
    assert un.first_seen_ns == 40
    ag = out[2]
    assert ag.endpoints == (1, 2, 6) and ag.scores == (8.0, 1.0, 4.0)
    assert ag.pairs == ((1, 2), (2, 3), (6, 7), (7, 6))
    assert merge_events([a]) == [a[0], a[1]] and merge_events([]) == []


def test_cells_that_share_a_corroboration_group_are_placed_together():
    # the detector pools loss evidence over each group (e.g. a ToR): its pairs must all be on
    # one shard, or each shard's group test counts only its part of the group's failures
    pl = Placement(2, max_cell_endpoints=64)
    a, b, c = _members("a", 0, 2), _members("b", 16, 2), _members("c", 32, 2)
    tor = np.full(48, -1)
    tor[[0, 16]] = 7  # a and b each have an RNIC under ToR 7; c shares none
    pl.update(a + b + c, [tor])
    assert pl.ep_shard[0] == pl.ep_shard[16] and set(pl.ep_shard[:32]) == {pl.ep_shard[0]}
    assert set(pl.ep_shard[32:]) == {1 - pl.ep_shard[0]} and pl.split_groups == 0
    # under rail ToRs, rail cells of jobs join per rail: the jobs still spread over shards
    pl = Placement(4, max_cell_endpoints=4)
    big, small = _members("big", 0, 4), _members("small", 32, 1)
    rail = np.array([m["rail"] for m in big + small])
    pl.update(big + small, [rail])
    for r in range(8):  # big's rail r and small's rail r, one shard
        assert len({int(pl.ep_shard[m["ep"]]) for m in big + small if m["rail"] == r}) == 1
    assert len(set(pl.ep_shard.tolist())) == 4 and pl.split_groups == 0
    # ... while a whole-job cell spanning every rail joins every rail's ToRs into one
    pl = Placement(4, max_cell_endpoints=16)
    pl.update(big + small, [rail])
    assert set(pl.ep_shard.tolist()) == {0} and pl.split_groups == 0


def test_cells_join_over_groups_only_up_to_the_component_bound():
    # jobs spanning segments chain every segment's ToRs together: without a bound a fleet's
    # jobs would all land on one shard. Past it the group is split (each shard pools over its
    # part) and counted
    pl = Placement(2, max_cell_endpoints=64, max_component_endpoints=24)
    a, b, c = _members("a", 0, 2), _members("b", 16, 1), _members("c", 24, 2)
    tor = np.full(40, -1)
    tor[[0, 16, 24]] = 5  # a (16 endpoints), b (8) and c (16) each have an RNIC under ToR 5
    pl.update(a + b + c, [tor])
    assert pl.ep_shard[0] == pl.ep_shard[16] != pl.ep_shard[24]  # a + b = 24 fit; c does not
    assert pl.split_groups == 1 and sorted(pl.load.tolist()) == [16, 24]
    with pytest.raises(ConfigError, match="max_component_endpoints"):
        Placement(2, max_component_endpoints=0)


def test_a_group_joining_cells_already_on_two_shards_is_counted_as_split():
    pl = Placement(2, max_cell_endpoints=64)
    a, b = _members("a", 0, 1), _members("b", 8, 1)
    pl.update(a + b)
    assert pl.ep_shard[0] != pl.ep_shard[8]
    tor = np.full(16, -1)
    tor[[0, 8]] = 3
    pl.update(a + b, [tor])  # placed cells never move: the group is split, and said so
    assert pl.ep_shard[0] != pl.ep_shard[8] and pl.split_groups == 1


def test_flapping_re_raises_merge_apart_from_new_outages():
    # the detector emits a tick's new outages and its flapping re-raises as two unreachable
    # events (a pair may be in both); merged as one, pairs repeat and flapping is lost
    def flap(pairs, first):
        return SuspectEvent(
            "unreachable", tuple(pairs), (3.0,) * len(pairs), first, 100, "f", flapping=True
        )

    a = [_ev("unreachable", [(0, 1)], [3], 50), flap([(0, 1)], 20)]
    b = [flap([(4, 5)], 10), _ev("agent", [], [1.0], 100, (9,))]
    c = [_ev("loss", [(6, 7)], [2], 60)]
    out = merge_events([a, b, c])
    assert [(e.kind, e.flapping) for e in out] == [
        ("unreachable", False),
        ("loss", False),
        ("unreachable", True),
        ("agent", False),
    ]
    assert out[0].pairs == ((0, 1),) and out[2].pairs == ((0, 1), (4, 5))
    assert out[2].first_seen_ns == 10
