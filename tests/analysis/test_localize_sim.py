"""Localization on the simulator: every fault type, both layers at once, and end to end from the
real detector's suspect events."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from skh.analysis.detect import Detector
from skh.analysis.localize import FailureType, Suspect, failing_path_ids
from skh.eval.localization import localization_suite, score
from skh.failures import FAILURES
from skh.model import Fabric
from skh.sim.answers import SimSource, live_pairs, sim_localizer
from skh.sim.faults import SIMULATED_TYPES, Fault
from skh.sim.scenario import Simulation


@pytest.fixture(scope="module")
def suite():
    fabric = Fabric.from_params(hosts=96, rnics_per_host=8, hosts_per_segment=8, spines=4, cores=1)
    sim = Simulation.build(fabric, n_jobs=32, seed=11)
    return localization_suite(sim, trials=2, seed=11)


def test_every_fault_type_on_the_right_component(suite):
    single = [r for r in suite if "+" not in r["label"]]
    per_type: dict[str, list[bool]] = defaultdict(list)
    for r in single:
        per_type[r["label"]].append(r["ok"])
    # every simulated type was detectable and localized (19 of the paper + agent crash, late
    # agent, vswitch loop)
    assert set(per_type) == {t.name for t in SIMULATED_TYPES}
    wrong = {k: v for k, v in per_type.items() if sum(v) / len(v) < 0.98}
    assert not wrong, [r for r in single if not r["ok"]]
    # a right verdict is in the layer the type table says
    layers = {(r["label"], r["verdicts"][0][0]) for r in single if r["ok"]}
    assert {(k, FAILURES[FailureType[k]].verdict_layer) for k, _ in layers} == layers


def test_both_layers_at_once(suite):
    both = [r for r in suite if "+" in r["label"]]
    scored = [r for r in both if not r["masked"]]
    assert len(scored) >= 0.5 * len(both) and len(scored) >= 20
    ok = sum(r["ok"] for r in scored) / len(scored)
    assert ok >= 0.98, [r for r in scored if not r["ok"]]
    # both culprits are named, one per layer, in each right answer
    assert all(len(r["verdicts"]) == 2 for r in scored if r["ok"])


def _run_until_suspects(sim, det, seconds, after_s):
    recent: list[np.ndarray] = []
    for step in sim.run(seconds):
        det.ingest(step.probes)
        det.heartbeat(step.heartbeats, sim.clock.now_ns)
        recent = [*recent[-4:], step.probes]
        events = det.tick(sim.clock.now_ns)
        if events and sim.clock.now_s > after_s:
            probes = np.concatenate(recent)
            return [
                Suspect.from_event(e, path_ids=failing_path_ids(probes, e.pairs)) for e in events
            ]
    return []


@pytest.mark.parametrize(
    "ftype,pick,want_type",
    [
        (
            FailureType.SWITCH_PORT_DOWN,
            lambda c: [x for x in c if "spine" in x][0],
            FailureType.SWITCH_PORT_DOWN,
        ),
        (FailureType.AGENT_CRASH, lambda c: c[0], FailureType.AGENT_CRASH),
        (FailureType.CONTAINER_CRASH, lambda c: c[1], FailureType.CONTAINER_CRASH),
    ],
)
def test_end_to_end_from_the_detector(ftype, pick, want_type):
    fabric = Fabric.from_params(hosts=48, rnics_per_host=8, hosts_per_segment=4, spines=4, cores=1)
    sim = Simulation.build(fabric, n_jobs=16, seed=3, start_s=(-60.0, 0.0))
    comp = pick(sim.candidates(ftype))
    sim.inject(Fault(ftype, comp, 20.0, 300.0))
    suspects = _run_until_suspects(sim, Detector(), 40, 20.0)
    assert suspects, "the detector raised nothing"
    verdicts = sim_localizer(sim).localize(
        suspects,
        SimSource(sim),
        healthy_pairs=live_pairs(sim, sim.pairs, sim.clock.now_s),
        now_ns=sim.clock.now_ns,
    )
    assert score(verdicts, [comp]), [(v.layer, v.component, v.failure_type.name) for v in verdicts]
    assert verdicts[0].failure_type == want_type
    assert verdicts[0].first_seen_ns <= verdicts[0].detected_at_ns
