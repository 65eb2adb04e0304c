"""Ping lists: preload = same-rail, different-host pairs; only ready destinations are active; an
agent's copy, fed the published changes, stays equal to the controller's; skeletons replace the
pair set in one version."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skh.errors import TopologyError
from skh.model import same_rail_pairs
from skh.orchestrator.jobcopy import JobCopy
from skh.orchestrator.pinglist import EndpointInfo, JobPingLists, page_records
from skh.wire import ENDPOINT_TEXT, Codec, MsgType


def _job(layout, ready=()):
    """layout: list of (host, rail) per endpoint id."""
    j = JobPingLists("j")
    for ep, (host, rail) in enumerate(layout):
        j.upsert(
            EndpointInfo(ep, "j", f"c{host}", f"h{host}", rail, ip="127.0.0.1", port=1000 + ep)
        )
    if ready:
        j.set_ready(ready)
    return j


_layouts = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=40, unique=True
)


@settings(max_examples=80, deadline=None)
@given(layout=_layouts, data=st.data())
def test_ping_list_is_the_same_rail_list_of_ready_peers(layout, data):
    ready = data.draw(st.sets(st.integers(0, len(layout) - 1)))
    j = _job(layout, sorted(ready))
    pre = j.preload_pairs()
    hosts = np.array([h for h, _ in layout])
    rails = np.array([r for _, r in layout])
    assert np.array_equal(pre, same_rail_pairs(np.arange(len(layout)), rails, hosts))
    for src, (host, rail) in enumerate(layout):
        want = sorted(
            d for d, (h, r) in enumerate(layout) if r == rail and h != host and d in ready
        )
        assert j.ping_list(src).tolist() == want
    act = j.active_pairs()
    assert all(
        h != layout[d][0] and layout[s][1] == layout[d][1] and d in ready
        for s, d in act.tolist()
        for h in [layout[s][0]]
    )
    assert len(act) == sum(len(j.ping_list(s)) for s in range(len(layout)))


def test_agent_copy_follows_published_changes_and_detects_gaps():
    codec = Codec()
    ctl = _job([(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)])
    agent = JobPingLists.from_snapshot(
        codec.decode(codec.encode(MsgType.JOB_SNAPSHOT, "c", 1, ctl.snapshot())).body
    )
    assert agent.ping_list(0).size == 0  # preloaded, nothing ready yet

    def wire(mtype: MsgType, body: dict) -> tuple[MsgType, dict]:
        # announcement bodies hold their records pre-encoded: they reach an agent decoded
        return mtype, codec.decode(codec.encode(mtype, "c", 2, body)).body

    msgs = [
        wire(MsgType.READY_ANNOUNCE, ctl.set_ready([1, 2])),
        wire(MsgType.READY_ANNOUNCE, ctl.set_ready([4])),
        wire(MsgType.ENDPOINTS_DOWN, ctl.set_down([2], "agent lost")),
        wire(MsgType.SKELETON, ctl.apply_skeleton(np.array([[0, 1], [3, 4], [1, 0]]), 1)),
    ]
    assert ctl.set_ready([1]) is None  # no change, no message, no version
    assert agent.apply(*msgs[0]) and agent.ping_list(0).tolist() == [1, 2]
    assert not agent.apply(*msgs[2])  # skipped one: a gap, the agent must resync
    for m in msgs[1:]:
        assert agent.apply(*m)
    assert agent.apply(*msgs[0])  # stale: ignored
    assert agent.version == ctl.version == 4
    for ep in range(5):
        assert agent.ping_list(ep).tolist() == ctl.ping_list(ep).tolist()
    assert (
        ctl.ping_list(0).tolist() == [1]
        and ctl.ping_list(3).tolist() == [4]
        and ctl.ping_list(1).size == 0
    )


def test_skeleton_checks():
    j = _job([(0, 0), (1, 0)], ready=[0, 1])
    with pytest.raises(TopologyError, match="unknown"):
        j.apply_skeleton(np.array([[0, 9]]), 1)
    j.apply_skeleton(np.array([[0, 1]]), 2)
    with pytest.raises(TopologyError, match="not newer"):
        j.apply_skeleton(np.array([[1, 0]]), 2)
    assert j.active_pairs().tolist() == [[0, 1]]


def test_reregistration_with_a_new_address_deactivates_until_ready():
    j = _job([(0, 0), (1, 0)], ready=[0, 1])
    same = j.endpoints[1]
    assert j.upsert(same) is None and j.endpoints[1].ready  # same address: controller restart
    moved = EndpointInfo(1, "j", "c1", "h1", 0, ip="127.0.0.1", port=4242)
    down = j.upsert(moved)
    assert down is not None and down["endpoints"] == [1] and not j.endpoints[1].ready
    assert j.ping_list(0).size == 0


@settings(max_examples=60, deadline=None)
@given(layout=_layouts, data=st.data())
def test_lists_are_counted_and_shown_in_part_without_listing_them(layout, data):
    ready = sorted(data.draw(st.sets(st.integers(0, len(layout) - 1))))
    j = _job(layout, ready)
    if data.draw(st.booleans()):
        pre = j.preload_pairs()
        pick = data.draw(st.lists(st.integers(0, max(0, len(pre) - 1)), max_size=6, unique=True))
        if len(pre):
            j.apply_skeleton(pre[sorted(pick)] if pick else pre[:1], 1)
    listed = j.preload_pairs()
    if j.skeleton is not None:  # the skeleton, and the preload pairs of what it names not
        named = np.isin(listed, j.skeleton)
        listed = np.unique(np.r_[j.skeleton, listed[~named.all(axis=1)]], axis=0)
    np.testing.assert_array_equal(listed, j.listed_pairs())
    active = j.active_pairs()
    assert j.pair_counts() == {
        "preload": len(j.preload_pairs()),
        "pairs": len(listed),
        "active": len(active),
    }
    limit = data.draw(st.integers(0, 50))
    np.testing.assert_array_equal(j.first_pairs(limit), active[:limit].reshape(-1, 2))
    everything = listed[np.lexsort((listed[:, 1], listed[:, 0]))] if len(listed) else listed
    np.testing.assert_array_equal(
        j.first_pairs(limit, ready_only=False), everything[:limit].reshape(-1, 2)
    )


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 200), min_size=1, max_size=60, unique=True),
    changes=st.lists(st.tuples(st.integers(0, 59), st.booleans()), max_size=30),
    limit=st.integers(1, 16),
)
def test_pages_of_shared_records_follow_every_change(ids, changes, limit):
    """Snapshot pages are cut from the job's columns and kept; whatever order endpoints arrive
    in and whatever changes between reads, the pages read after the change are the
    controller's state."""
    codec = Codec()
    j = JobPingLists("j")
    for ep in ids:  # not always increasing: a page's records stay in id order
        j.upsert(EndpointInfo(ep, "j", f"c{ep}", f"h{ep % 3}", ep % 2, ip="10.0.0.1", port=ep))
    for k, ready in changes:
        read_pages(codec, j, limit)  # encoded (and shared) before the change
        ep = ids[k % len(ids)]
        if ready:
            j.set_ready([ep])
        else:
            j.set_down([ep], "test")
        moved = EndpointInfo(ep, "j", f"c{ep}", f"h{ep % 3}", ep % 2, ip="10.0.0.2", port=ep)
        if k % 3 == 0:
            j.upsert(moved)
    got = read_pages(codec, j, limit)
    assert [e["ep"] for e in got] == sorted(ids)
    assert got == [j.endpoints[ep].to_wire() for ep in sorted(ids)]


def read_pages(codec, j, limit):
    out, after = [], -1
    while after is not None:
        page = codec.decode(codec.encode(MsgType.JOB_SNAPSHOT, "c", 1, j.snapshot(after, limit)))
        out += page_records(page.body["records"])
        after = page.body["next"]
    return out


def test_text_tables_stay_bounded_by_the_values_records_hold():
    # an agent re-registering with a new address each time: the job's table of addresses is
    # rebuilt from the live records instead of growing for ever, and pages stay right
    codec = Codec()
    j = JobPingLists("j")
    for ep in range(4):
        j.upsert(EndpointInfo(ep, "j", f"c{ep}", "h", 0, ip="10.0.0.1", port=ep))
    for k in range(300):
        j.upsert(EndpointInfo(0, "j", "c0", "h", 0, ip=f"10.1.{k // 256}.{k % 256}", port=0))
        got = read_pages(codec, j, 2)
        assert got == [j.endpoints[ep].to_wire() for ep in range(4)]
    assert len(j._strings[list(ENDPOINT_TEXT).index("ip")]) <= 2 * 4 + 64 + 1


def test_a_newcomer_keeps_its_preload_pairs_until_a_skeleton_names_it():
    """An elastic job grows after its skeleton was applied (or a container comes back under a
    new id): the new endpoints are named by no pair, so they would go unprobed, and unprobing,
    until the job is re-inferred (minutes of history). They keep their same-rail pairs, both
    ways, on the controller and on every agent's copy alike, until a skeleton names them."""
    codec = Codec()
    # hosts 0-2 on rails 0 and 1; the skeleton links hosts 0-1 and 1-2 per rail
    ctl = _job([(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)], ready=range(6))
    ctl.apply_skeleton(
        np.array([[0, 1], [1, 0], [1, 2], [2, 1], [3, 4], [4, 3], [4, 5], [5, 4]]), 1
    )
    assert ctl.ping_list(0).tolist() == [1] and ctl.newcomer_pairs().size == 0
    agent = JobCopy.from_snapshot(
        codec.decode(codec.encode(MsgType.JOB_SNAPSHOT, "c", 1, ctl.snapshot())).body
    )
    # host 3 joins with an RNIC on rail 0
    ctl.upsert(EndpointInfo(6, "j", "c3", "h3", 0, ip="127.0.0.1", port=1006))
    body = ctl.set_ready([6])
    assert agent.apply(
        MsgType.READY_ANNOUNCE,
        codec.decode(codec.encode(MsgType.READY_ANNOUNCE, "c", 2, body)).body,
    )
    want = {6: [0, 1, 2], 0: [1, 6], 1: [0, 2, 6], 2: [1, 6], 3: [4], 4: [3, 5], 5: [4]}
    for src, dsts in want.items():
        assert ctl.ping_list(src).tolist() == dsts == agent.destinations(src), src
    assert ctl.pair_counts()["pairs"] == 8 + 6
    # re-inferred: the skeleton names the newcomer; its other preload pairs go
    body = ctl.apply_skeleton(np.r_[ctl.skeleton, [[2, 6], [6, 2]]], 2)
    assert agent.apply(
        MsgType.SKELETON, codec.decode(codec.encode(MsgType.SKELETON, "c", 3, body)).body
    )
    assert ctl.ping_list(6).tolist() == [2] == agent.destinations(6)
    assert ctl.ping_list(0).tolist() == [1] == agent.destinations(0)
