"""State that survives (issue 14): the pipeline works in the controller's endpoint ids whatever
gaps removed jobs left, resumes skeleton versions from the controller, and tracks the alerts a
restarted analyzer found open in its log until their faults clear, including a fault that cleared
while it was down. Run over the simulator (virtual time): its agents' answers feed localization.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from skh.errors import ConfigError
from skh.failures import FailureType
from skh.model import Fabric, same_rail_pairs
from skh.orchestrator.pipeline import Pipeline, PipelineConfig
from skh.records import COUNTER_DTYPE, PROBE_DTYPE, empty_probes
from skh.sim.answers import SimSource, sim_overlay_component, sim_overlay_endpoint
from skh.sim.faults import Fault
from skh.sim.scenario import Simulation

#: the controller's ids: every third id, from 1000 (as if jobs had come and gone)
OFFSET, STRIDE = 1000, 3


def _ctl(ids: Any) -> np.ndarray:
    return np.asarray(ids, np.int64) * STRIDE + OFFSET


def _sim(ids: Any) -> np.ndarray:
    return (np.asarray(ids, np.int64) - OFFSET) // STRIDE


class Harness:
    """The simulator feeding a :class:`Pipeline` as the analyzer daemon would: every id it
    hands over or gets back is a controller id (gapped); the pipeline can be restarted with the
    alerts its log holds open."""

    def __init__(self, seed: int = 1, make_pipeline: Callable[..., Pipeline] = Pipeline) -> None:
        self.make_pipeline = make_pipeline
        fabric = Fabric.from_params(hosts=16, rnics_per_host=8, hosts_per_segment=8, spines=2)
        self.sim = Simulation.build(
            fabric, 4, seed=seed, ping="same_rail", start_s=(-900.0, -600.0)
        )
        self.cfg = PipelineConfig(fabric=fabric.to_mapping(), resolve_after_s=20.0)
        self.preload = {j.name: same_rail_pairs(j.ep_ids, j.rail, j.host) for j in self.sim.jobs}
        self.applied: dict[str, np.ndarray] = {}
        self.versions: list[tuple[str, int]] = []
        self.controller_versions = {j.name: 7 for j in self.sim.jobs}  # the controller's
        self.log: list[dict[str, Any]] = []  # the durable alert log
        self.pipe = self._start()

    def _apply(self, job: str, sk: Any, version: int) -> bool:
        if version <= self.controller_versions[job]:
            return False  # the controller refuses a version it has passed
        pairs = np.asarray(sk.pairs, np.int64)
        assert (pairs >= OFFSET).all() and ((pairs - OFFSET) % STRIDE == 0).all()
        self.controller_versions[job] = version
        self.versions.append((job, version))
        self.applied[job] = _sim(pairs).astype(np.uint32)
        self.sim.set_ping_pairs(
            np.concatenate([self.applied.get(j, p) for j, p in self.preload.items()])
        )
        return True

    def _start(self) -> Pipeline:
        pipe = self.make_pipeline(
            self.cfg,
            source_factory=lambda _cl: SimSource(self.sim),
            apply_skeleton=self._apply,
            overlay_endpoint=sim_overlay_endpoint,
            overlay_component=sim_overlay_component,
        )
        assert pipe.set_endpoints(self.members(), dict(self.controller_versions))
        return pipe

    def members(self) -> list[dict[str, Any]]:
        """The controller's member list (its ids)."""
        return [
            {
                "ep": int(_ctl(e.ep_id)),
                "job": e.job,
                "container": e.container,
                "host": e.host,
                "rail": e.rail,
                "ip": e.ip,
            }
            for e in self.sim.cluster.endpoints
        ]

    def restart(self) -> None:
        """A new analyzer: the alerts still open in the log go to the new pipeline."""
        open_: dict[str, dict[str, Any]] = {}
        for rec in self.log:
            a = rec["alert"]
            if a.get("state") == "open":
                open_[a["alert_id"]] = rec
            elif a.get("state") == "resolved":
                open_.pop(a["alert_id"], None)
        close = getattr(self.pipe, "close", None)
        if close is not None:
            close()
        self.pipe = self._start()
        self.pipe.restore(sorted(open_.values(), key=lambda r: r["seq"]))

    def run(self, duration_s: int, *, down: bool = False) -> None:
        """Advance the simulation; with ``down`` the analyzer hears nothing (it is dead)."""
        for step in self.sim.run(duration_s):
            if down:
                continue
            probes = step.probes.copy()
            probes["src_ep"] = _ctl(probes["src_ep"])
            probes["dst_ep"] = _ctl(probes["dst_ep"])
            counters = step.counters.copy()
            counters["ep"] = _ctl(counters["ep"])
            beats = _ctl(step.heartbeats)
            for a in self.pipe.process(probes, counters, self.sim.clock.now_ns, beats):
                self.log.append({"seq": len(self.log) + 1, "alert": a})

    def faults(self, kind: str) -> list[dict[str, Any]]:
        return [r["alert"] for r in self.log if r["alert"].get("kind") == kind]


def _scenario(h: Harness) -> tuple[Harness, list[dict[str, Any]], list[dict[str, Any]]]:
    """The demo's scenario, in gapped controller ids, with the analyzer killed once while an
    alert is open and once while a fault clears."""
    cands = h.sim.candidates(FailureType.SWITCH_PORT_DOWN)
    h.sim.inject(Fault(FailureType.SWITCH_PORT_DOWN, cands[0], start_s=130.0, end_s=175.0))
    cands = h.sim.candidates(FailureType.RNIC_PORT_DOWN)
    h.sim.inject(
        Fault(FailureType.RNIC_PORT_DOWN, cands[len(cands) // 2], start_s=220.0, end_s=245.0)
    )
    h.run(150)  # skeletons applied, the first fault open
    first_open = [a for a in h.faults("fault") if a["state"] == "open"]
    h.restart()  # killed while it is open; the fault lasts another 25 s
    h.run(80)  # the second fault opens (at 220 s)
    second_open = [a for a in h.faults("fault") if a["state"] == "open"][len(first_open) :]
    h.run(5)
    h.run(30, down=True)  # dead from 235 s to 265 s: the second fault clears at 245 s
    h.restart()
    h.run(60)
    return h, first_open, second_open


@pytest.fixture(scope="module")
def gapped():
    return _scenario(Harness())


def test_the_pipeline_works_in_the_controllers_ids_whatever_their_gaps(gapped):
    h, first_open, _ = gapped
    assert first_open, "the first fault was not detected"
    for a in h.faults("fault"):
        ids = np.asarray(a["pairs"], np.int64).ravel()
        assert ids.size and (ids >= OFFSET).all() and ((ids - OFFSET) % STRIDE == 0).all()
    # skeletons went on from the controller's versions (7), in its ids
    assert h.versions and all(v > 7 for _j, v in h.versions)
    assert all(a["ep_id"][0] >= OFFSET for a in h.faults("skeleton"))


def test_an_alert_open_at_a_restart_stays_one_alert_and_resolves_after_its_fault(gapped):
    h, first_open, _ = gapped
    for a in first_open:
        states = [x["state"] for x in h.faults("fault") if x["alert_id"] == a["alert_id"]]
        # opened once (not again by the restarted pipeline), resolved once
        assert states.count("open") == 1 and states.count("resolved") == 1, states


def test_a_fault_that_cleared_while_the_analyzer_was_down_is_resolved_after_it(gapped):
    h, _, second_open = gapped
    assert second_open, "the second fault was not detected before the analyzer died"
    for a in second_open:
        states = [x["state"] for x in h.faults("fault") if x["alert_id"] == a["alert_id"]]
        assert states[-1] == "resolved", states
    # nothing stays open at the end: every fault cleared
    still = {}
    for a in h.faults("fault"):
        if a["state"] == "open":
            still[a["alert_id"]] = a
        else:
            still.pop(a["alert_id"], None)
    assert not still, sorted(still)


def test_a_restored_alert_whose_type_was_refined_resolves_under_the_id_it_opened_with():
    """An RNIC port down that a later round refined to flapping kept the id it opened with
    (class of RNIC_PORT_DOWN); after a restart its resolution must carry that id, not the
    flapping class's, or the log keeps the alert open for good."""
    from skh.failures import class_id

    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    cfg = PipelineConfig(fabric=fabric.to_mapping(), resolve_after_s=5.0)
    pipe = Pipeline(cfg, source_factory=lambda _c: None, apply_skeleton=lambda *_a: True)
    opened = class_id(FailureType.RNIC_PORT_DOWN)
    assert opened != class_id(FailureType.RNIC_PORT_FLAPPING)
    alert_id = f"rnic|h0:rnic1|{opened}"
    alert = {
        "kind": "fault",
        "state": "open",
        "alert_id": alert_id,
        "job": "j",
        "layer": "rnic",
        "component": "h0:rnic1",
        "failure_type_id": int(FailureType.RNIC_PORT_FLAPPING),
        "type_candidates": [["rnic_port_flapping", 0.7], ["rnic_port_down", 0.3]],
        "first_seen_ns": 1,
        "detected_at_ns": 2,
        "pairs": [[0, 1]],
    }
    pipe.restore([{"seq": 1, "ts_ns": 2, "alert": alert}])
    empty_p, empty_c = np.zeros(0, PROBE_DTYPE), np.zeros(0, COUNTER_DTYPE)
    t0 = 10_000_000_000
    assert pipe.process(empty_p, empty_c, t0) == []  # open again, not announced again
    (v,) = pipe.tracker.open
    assert v.type_candidates[0] == (FailureType.RNIC_PORT_FLAPPING, 0.7)
    out = pipe.process(empty_p, empty_c, t0 + 6_000_000_000)
    assert [(a["alert_id"], a["state"]) for a in out] == [(alert_id, "resolved")]


@pytest.mark.slow
def test_the_sharded_pipeline_tells_the_same_in_gapped_ids(gapped):
    # the analyzer sharded over Ray (issue 19) maps controller ids at the same edge: records,
    # heartbeats and skeleton versions in, alerts and skeletons out, restarts included
    import functools

    from skh.orchestrator.shard import ShardedPipeline, ShardOptions, connect
    from skh.orchestrator.shard.merge import alert_key

    connect("local", min_cpus=2)
    make = functools.partial(
        ShardedPipeline, options=ShardOptions(shards=2, actor_cpus=0.25, checkpoint_rounds=20)
    )
    h, _first, _second = gapped
    try:
        s, _f, _s = _scenario(Harness(make_pipeline=make))
        s.pipe.close()
    finally:
        import ray

        ray.shutdown()
    assert [alert_key(r["alert"]) for r in s.log] == [alert_key(r["alert"]) for r in h.log]
    assert s.versions == h.versions and all(v > 7 for _j, v in s.versions)


def test_the_detector_keeps_an_rnics_link_id_as_jobs_come_and_go():
    """Each endpoint's access link goes to the detector as the (host, rail) it sits on; a new
    job on an RNIC gets the id the RNIC had under the job before, whatever model ids the
    endpoints get (the link's loss history is kept under that id)."""
    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    cfg = PipelineConfig(fabric=fabric.to_mapping())
    pipe = Pipeline(cfg, source_factory=lambda _c: None, apply_skeleton=lambda *_a: True)
    seen = []
    pipe.detector.set_endpoint_links = lambda links: seen.append(np.asarray(links).tolist())

    def ep(i, job, host, rail):
        return {"ep": i, "job": job, "container": host, "host": host, "rail": rail, "ip": ""}

    pipe.set_endpoints([ep(0, "a", "host0", 0), ep(1, "a", "host1", 0), ep(2, "a", "host1", 1)])
    pipe.set_endpoints([ep(2, "a", "host1", 1), ep(7, "b", "host0", 0), ep(9, "b", "host0", 1)])
    # model ids: 0, 1, 2, then 2 keeps 2, 7 -> 3, 9 -> 4; 0 and 1 are gone (no link)
    assert seen == [[0, 1, 2], [-1, -1, 2, 0, 3]]


def test_the_detector_pools_over_the_tors_the_fabric_names(caplog):
    """The deployed pipeline hands the detector each endpoint's ToR (the loss pooling and the
    crossing history `skh eval` measured with), under ids that outlive jobs; an endpoint gone is
    pooled with no one; ``pool_over_tors`` off names none. An endpoint on a host the fabric
    lacks is left out of the model and named (it used to crash the localizer's index)."""
    fabric = Fabric.from_params(hosts=4, rnics_per_host=2, hosts_per_segment=2, spines=1)
    tor = {(h, r): fabric.rnic(h, r).tor for h in fabric.hosts for r in range(2)}
    assert len(set(tor.values())) == 4  # two segments, two rails

    def ep(i, job, host, rail):
        return {"ep": i, "job": job, "container": host, "host": host, "rail": rail, "ip": ""}

    for pool in (True, False):
        cfg = PipelineConfig(fabric=fabric.to_mapping(), pool_over_tors=pool)
        pipe = Pipeline(cfg, source_factory=lambda _c: None, apply_skeleton=lambda *_a: True)
        seen = []
        pipe.detector.set_endpoint_groups = lambda *g, seen=seen: seen.append(
            [np.asarray(x).tolist() for x in g]
        )
        caplog.clear()
        pipe.set_endpoints(
            [ep(0, "a", "host0", 0), ep(1, "a", "host1", 0), ep(2, "a", "host2", 0)]
            + [ep(3, "a", "host2", 1), ep(4, "a", "nowhere", 0)]
        )
        assert pipe.stats["endpoints_not_adopted"] == 1
        assert "a/nowhere/0@nowhere (id 4)" in caplog.text
        assert len(pipe.cluster.endpoints) == 4
        pipe.set_endpoints([ep(3, "a", "host2", 1), ep(8, "b", "host1", 0)])
        assert pipe.stats["endpoints_not_adopted"] == 0
        if not pool:
            assert seen == []
            continue
        # host0 and host1 share segment 0's rail-0 ToR; host2's rails hang off two others
        assert seen[0] == [[0, 0, 1, 2]]
        # 3 keeps model id 3, 8 gets 4 and its ToR's id; 0-2 are gone
        assert seen[1] == [[-1, -1, -1, 2, 0]]
    with pytest.raises(ConfigError, match="pool_over_tors"):
        PipelineConfig(fabric=fabric.to_mapping(), pool_over_tors="yes")


def test_a_registration_listed_twice_is_adopted_once_under_its_newest_id(caplog):
    """Two of the controller's rows naming one endpoint (job, container, rail) made the model's
    update fail half-way (the name taken), the analyzer's worker with it; the newest id is
    watched, the other named."""
    fabric = Fabric.from_params(hosts=2, rnics_per_host=1, hosts_per_segment=2, spines=1)
    pipe = Pipeline(
        PipelineConfig(fabric=fabric.to_mapping()),
        source_factory=lambda _c: None,
        apply_skeleton=lambda *_a: True,
    )

    def ep(i, host):
        return {"ep": i, "job": "a", "container": "c0", "host": host, "rail": 0, "ip": ""}

    assert pipe.set_endpoints([ep(3, "host0"), ep(5, "host1")])
    assert [(e.host, e.ep_id) for e in pipe.cluster.live_endpoints] == [("host1", 0)]
    assert pipe.stats["endpoints_not_adopted"] == 1 and "a/c0/0@host0 (id 3)" in caplog.text
    # the listing fixed: the model changes nothing, the old id stays unwatched
    assert pipe.set_endpoints([ep(5, "host1")])
    assert [(e.host, e.ep_id) for e in pipe.cluster.live_endpoints] == [("host1", 0)]
    assert pipe.stats["endpoints_not_adopted"] == 0


def test_a_job_keeps_being_watched_after_another_job_stops():
    """The analyzer hears ENDPOINTS_DOWN for a stopped job (retire), then the controller's new
    member list: the jobs still running must stay visible to detection, under their own ids."""
    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    pipe = Pipeline(
        PipelineConfig(fabric=fabric.to_mapping()),
        source_factory=lambda _c: None,
        apply_skeleton=lambda *_a: True,
    )

    def ep(i, job, host, rail):
        return {"ep": i, "job": job, "container": job + host, "host": host, "rail": rail, "ip": ""}

    def probe(src, dst, t_ns):
        r = empty_probes(1)
        r["src_ep"], r["dst_ep"], r["t_wall_ns"], r["rtt_ns"] = src, dst, t_ns, 10_000
        pipe.process(r, np.zeros(0, COUNTER_DTYPE), t_ns + 10**9, np.array([src, dst]))

    t0 = 1_700_000_000 * 10**9
    a = [ep(0, "a", "host0", 0), ep(1, "a", "host1", 0)]
    pipe.set_endpoints(a + [ep(2, "b", "host0", 1), ep(3, "b", "host1", 1)])
    probe(2, 3, t0)
    pipe.retire([0, 1])  # job a stopped
    pipe.set_endpoints([ep(2, "b", "host0", 1), ep(3, "b", "host1", 1), ep(4, "c", "host0", 0)])
    probe(2, 3, t0 + 2 * 10**9)
    assert pipe.detector.stats.records_in == 2
    assert pipe.detector.stats.retired_rows == 0


def _another_job_stops(h: Harness, then: Callable[[], None] = lambda: None) -> set[str]:
    """An RNIC port down on job00001's RNIC (it serves that job alone) opens an alert; job00000,
    which holds the lowest ids (each survivor's would move if ids were renumbered), stops
    (ENDPOINTS_DOWN, then the controller's list without it); ``then``; the fault ends, and the
    alert with it. Returns the ids of the alerts open when the job stopped."""
    hosts: dict[str, set[str]] = {}
    for e in h.sim.cluster.endpoints:
        hosts.setdefault(e.job, set()).add(e.host)
    assert [j for j, hs in hosts.items() if "host2" in hs] == ["job00001"]
    h.sim.inject(Fault(FailureType.RNIC_PORT_DOWN, "host2:rnic3", start_s=130.0, end_s=175.0))
    h.run(150)
    opened = {a["alert_id"] for a in h.faults("fault") if a["state"] == "open"}
    h.pipe.retire([m["ep"] for m in h.members() if m["job"] == "job00000"])
    h.pipe.set_endpoints([m for m in h.members() if m["job"] != "job00000"])
    then()
    h.run(90)  # the fault ends at 175 s; the alert resolves 20 s after detection lets it go
    # the alerts went on naming job00001's endpoints (controller ids): one alert each, resolved
    assert opened, "the fault was not detected"
    mine = {m["ep"] for m in h.members() if m["job"] == "job00001"}
    after: dict[str, list[str]] = {}
    for a in h.faults("fault"):
        assert {e for p in a["pairs"] for e in p} <= mine, (a["alert_id"], a["pairs"])
        after.setdefault(a["alert_id"], []).append(a["state"])
    assert set(after) == opened
    assert all(states == ["open", "resolved"] for states in after.values()), after
    return opened


def test_an_alert_open_on_a_job_keeps_naming_its_endpoints_when_another_job_stops():
    """The alert goes on naming its own endpoints (controller ids), stays one alert and
    resolves after its fault, and detection keeps watching the job under its model ids."""
    h = Harness()
    ids = h.pipe.jobs["job00001"].ep_id.copy()
    _another_job_stops(h)
    assert "job00000" not in h.pipe.jobs
    assert (h.pipe.jobs["job00001"].ep_id == ids).all()
    assert not h.pipe.detector.health.is_retired(ids.astype(np.int64)).any()


@pytest.mark.slow
def test_the_sharded_pipeline_numbers_as_the_single_one_when_a_job_stops():
    # its shards follow the coordinator's model ids (the member rows carry them), a shard killed
    # after the job stopped and restored included: the same alerts as the single process
    import functools
    import os
    import signal

    from skh.orchestrator.shard import ShardedPipeline, ShardOptions, connect
    from skh.orchestrator.shard.merge import alert_key

    single = Harness()
    _another_job_stops(single)
    connect("local", min_cpus=2)
    make = functools.partial(
        ShardedPipeline, options=ShardOptions(shards=2, actor_cpus=0.25, checkpoint_rounds=20)
    )
    try:
        s = Harness(make_pipeline=make)
        _another_job_stops(s, lambda: os.kill(s.pipe.shard_pids()[0], signal.SIGKILL))
        assert s.pipe.stats["restores"] >= 1
        s.pipe.close()
    finally:
        import ray

        ray.shutdown()
    assert [alert_key(r["alert"]) for r in s.log] == [alert_key(r["alert"]) for r in single.log]


def _a_job_stops_and_starts_again(h: Harness) -> list[dict[str, Any]]:
    """job00001 stops (ENDPOINTS_DOWN: retired) and its containers start again under the same
    registrations (the controller's list does not change: same ids, model ids kept), are
    announced ready, then an RNIC port down on its RNIC. Returns the fault alerts opened after
    the restart."""
    mine = [m["ep"] for m in h.members() if m["job"] == "job00001"]
    h.run(150)
    h.pipe.retire(mine)
    h.run(20)  # stopped: what its agents would still send is dropped
    assert h.pipe.set_endpoints(h.members())
    h.pipe.ready(mine)
    before = len(h.log)
    h.sim.inject(Fault(FailureType.RNIC_PORT_DOWN, "host2:rnic3", start_s=260.0, end_s=300.0))
    h.run(130)
    opened = [
        r["alert"]
        for r in h.log[before:]
        if r["alert"].get("kind") == "fault" and r["alert"]["state"] == "open"
    ]
    for a in opened:
        assert {e for p in a["pairs"] for e in p} <= set(mine), a
    return opened


def test_a_stopped_container_started_again_under_its_registration_is_watched_again():
    """A restart keeps the container's name, host, rail and address, so it keeps its controller
    and model ids: detection must take it back when it is announced ready (it stayed retired,
    blind to every fault on it, before)."""
    h = Harness()
    assert _a_job_stops_and_starts_again(h), "the fault after the restart was not detected"
    ids = h.pipe.jobs["job00001"].ep_id.astype(np.int64)
    assert not h.pipe.detector.health.is_retired(ids).any()


@pytest.mark.slow
def test_the_sharded_pipeline_watches_a_restarted_container_again():
    import functools

    from skh.orchestrator.shard import ShardedPipeline, ShardOptions, connect
    from skh.orchestrator.shard.merge import alert_key

    single = Harness()
    want = [alert_key(a) for a in _a_job_stops_and_starts_again(single)]
    assert want
    connect("local", min_cpus=2)
    make = functools.partial(ShardedPipeline, options=ShardOptions(shards=2, actor_cpus=0.25))
    try:
        s = Harness(make_pipeline=make)
        got = [alert_key(a) for a in _a_job_stops_and_starts_again(s)]
        s.pipe.close()
    finally:
        import ray

        ray.shutdown()
    assert got == want


def test_a_pipeline_given_model_ids_numbers_its_endpoints_as_the_one_that_gave_them():
    """The sharded analyzer's actors (a restarted one included) get the coordinator's member
    rows with their model ids: whatever changes they missed, they number as it does."""
    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    cfg = PipelineConfig(fabric=fabric.to_mapping())

    def pipeline():
        return Pipeline(cfg, source_factory=lambda _c: None, apply_skeleton=lambda *_a: True)

    def ep(i, job, host, rail):
        return {"ep": i, "job": job, "container": host, "host": host, "rail": rail, "ip": ""}

    coord, actor = pipeline(), pipeline()
    coord.set_endpoints([ep(0, "a", "host0", 0), ep(1, "a", "host1", 0), ep(2, "b", "host0", 1)])
    # job a stops; b's endpoint 2 registers again on another host under its controller id
    rows = [ep(2, "b", "host1", 1), ep(5, "c", "host0", 0)]
    coord.set_endpoints(rows)
    assert sorted(coord.cluster.gone) == [0, 1, 2]
    numbered = [m | {"model": int(coord._model(np.array([m["ep"]]))[0])} for m in rows]
    assert [m["model"] for m in numbered] == [3, 4]
    actor.set_endpoints(numbered)
    assert [e.name for e in actor.cluster.live_endpoints] == ["b/host1/1", "c/host0/0"]
    assert [e.ep_id for e in actor.cluster.live_endpoints] == [3, 4]
    assert actor._model(np.array([0, 1, 2, 5])).tolist() == [-1, -1, 3, 4]
    assert {j: st.ep_id.tolist() for j, st in actor.jobs.items()} == {"b": [3], "c": [4]}


def test_a_gone_model_id_is_given_again_only_once_nothing_names_it():
    """Ids of endpoints gone for REUSE_AFTER_S go to new endpoints (the model stays as big as
    the endpoints alive), except ids an open alert still names; an actor given the
    coordinator's rows numbers as it does."""
    from skh.orchestrator.pipeline.rounds import REUSE_AFTER_S

    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    cfg = PipelineConfig(fabric=fabric.to_mapping(), resolve_after_s=REUSE_AFTER_S + 200)

    def pipeline():
        return Pipeline(cfg, source_factory=lambda _c: None, apply_skeleton=lambda *_a: True)

    def ep(i, job, host, rail):
        return {"ep": i, "job": job, "container": job + host, "host": host, "rail": rail, "ip": ""}

    pipe, actor = pipeline(), pipeline()
    s, t0 = 10**9, 1_700_000_000 * 10**9

    def at(t_ns, rows, src=None, dst=None):
        pipe.process(empty_probes(), np.zeros(0, COUNTER_DTYPE), t_ns)
        pipe.set_endpoints(rows)
        actor.set_endpoints([m | {"model": int(pipe._model(np.array([m["ep"]]))[0])} for m in rows])
        assert actor._to_model.tolist() == pipe._to_model.tolist()
        if src is not None:
            r = empty_probes(1)
            r["src_ep"], r["dst_ep"], r["t_wall_ns"], r["rtt_ns"] = src, dst, t_ns, 10_000
            pipe.process(r, np.zeros(0, COUNTER_DTYPE), t_ns + s)

    at(t0, [ep(0, "a", "host0", 0), ep(1, "a", "host1", 0)] + [ep(2, "b", "host0", 1)])
    alert = {
        "kind": "fault",
        "state": "open",
        "alert_id": "rnic|host0:rnic1|1",
        "layer": "rnic",
        "component": "host0:rnic1",
        "failure_type_id": int(FailureType.RNIC_PORT_DOWN),
        "first_seen_ns": t0,
        "detected_at_ns": t0,
        "pairs": [[2, 1]],
    }
    pipe.restore([{"seq": 1, "ts_ns": t0, "alert": alert}])  # open, naming 1 and 2
    at(t0 + s, [ep(3, "c", "host0", 0)])  # a and b stop, c starts: a new id
    assert pipe._model(np.array([3])).tolist() == [3]
    late = t0 + int(REUSE_AFTER_S * s) + 2 * s
    at(late, [ep(3, "c", "host0", 0), ep(4, "d", "host1", 0), ep(5, "d", "host1", 1)], 4, 3)
    # 0 is free again; 1 and 2 are named by the open alert: d's second endpoint gets a new id
    assert pipe._model(np.array([3, 4, 5])).tolist() == [3, 0, 4]
    assert pipe.detector.stats.records_in == 1 and pipe.detector.stats.retired_rows == 0
    assert pipe.tracker.open and pipe.tracker.open[0].pairs == ((2, 1),)
    end = late + 300 * s  # the alert resolves; its ids are free then
    at(end, [ep(3, "c", "host0", 0), ep(6, "e", "host1", 1)])
    assert not pipe.tracker.open
    assert pipe._model(np.array([3, 6])).tolist() == [3, 1]
    assert len(pipe.cluster.endpoints) == 5 and sorted(pipe.cluster.gone) == [0, 2, 4]
    assert [e.name for e in actor.cluster.live_endpoints] == ["e/ehost1/1", "c/chost0/0"]


def test_a_job_none_is_left_of_goes_and_its_skeleton_version_stays_known():
    fabric = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    pipe = Pipeline(
        PipelineConfig(fabric=fabric.to_mapping()),
        source_factory=lambda _c: None,
        apply_skeleton=lambda *_a: True,
    )

    def ep(i, job, host):
        return {"ep": i, "job": job, "container": host, "host": host, "rail": 0, "ip": ""}

    pipe.set_endpoints([ep(0, "a", "host0"), ep(1, "a", "host1"), ep(2, "b", "host0")])
    pipe.jobs["a"].skeleton_version = 9  # installed here since the controller's last status
    pipe.set_endpoints([ep(2, "b", "host0")])
    assert list(pipe.jobs) == ["b"]
    pipe.set_endpoints([ep(2, "b", "host0"), ep(3, "a", "host1")])  # a name used again
    assert list(pipe.jobs) == ["b", "a"] and pipe.jobs["a"].skeleton_version == 9
