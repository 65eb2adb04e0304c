"""ORACLE diagnostic — not what the system sees. :func:`suspect_from_record` builds the suspect
detection *would* raise for a simulated fault from the fault's ground truth (its exact affected
pairs, the failing path ids, its symptom and flapping flag, the crashed or slow agents). It
scores localization apart from detection, as an upper bound; every figure from it must be
labelled oracle. End-to-end figures start from the detector's own suspect events instead
(:func:`skh.eval.localization.end_to_end_suite`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from skh.analysis.localize import Suspect
from skh.sim.answers import live_pairs
from skh.sim.faults import FAULT_SPECS, RowSet

__all__ = ["suspect_from_record"]


def suspect_from_record(sim: Any, rec: Any, t_s: float) -> Suspect:
    """ORACLE: the suspect detection would raise for a simulated fault at ``t_s``, from its ground
    truth (never what the pipeline sees): the affected pairs whose probes fail right now, on
    which path ids, with the fault's symptom; crashed or slow agents (and crashed containers,
    which miss heartbeats too) as endpoint health bits."""
    fault = sim.faults[rec.fault_id]
    spec = FAULT_SPECS[rec.type]
    pairs = live_pairs(sim, rec.affected_pairs, t_s)
    path_ids: dict[tuple[int, int], tuple[int, ...]] = {}
    if pairs.size:
        n = sim.n_path_ids
        src, dst = np.tile(pairs[:, 0], n), np.tile(pairs[:, 1], n)
        pid = np.repeat(np.arange(n), pairs.shape[0])
        rows = RowSet(sim.index, sim.eps, src, dst, pid, np.full(src.size, t_s))
        hit = (sim.engine.affected(fault, rows) & sim.engine.on_now(fault, rows.t_s)).reshape(n, -1)
        for j in np.flatnonzero(hit.any(axis=0)):
            path_ids[(int(pairs[j, 0]), int(pairs[j, 1]))] = tuple(
                int(k) for k in np.flatnonzero(hit[:, j])
            )
    agents: dict[int, int] = {}
    if spec.target == "container" and spec.symptom in ("agent_down", "agent_slow", "unreachable"):
        bits = 8 if spec.symptom == "agent_slow" else 1
        c = sim.eps.container_id(rec.component)
        mine = np.flatnonzero(sim.eps.container == c)
        alive = (sim.ep_ready_s[mine] <= t_s) & (sim.ep_end_s[mine] > t_s)
        agents = {int(e): bits for e in mine[alive]}
    symptom = {
        "unreachable": "unreachable",
        "flapping": "unreachable",
        "loss": "loss",
        "latency": "latency",
        "agent_down": "unreachable",
        "agent_slow": "latency",
    }[spec.symptom]
    if spec.symptom in ("agent_down", "agent_slow"):
        path_ids = {}  # the monitor's endpoint failed: detection withholds the pair verdicts
    return Suspect(
        tuple(sorted(path_ids)),
        symptom,
        int(rec.start_ns),
        flapping=spec.symptom == "flapping",
        path_ids=path_ids,
        agents=agents,
    )
