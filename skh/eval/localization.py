"""Localization scored on the simulator: the oracle suite (each fault localized from the suspect
built from its ground truth, :func:`skh.sim.oracle.suspect_from_record`: a diagnostic upper
bound) and the end-to-end suite (the real detector's suspect events → the localizer → the
simulated agents' answers)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from skh.analysis.detect import Detector
from skh.analysis.localize import Suspect, failing_path_ids
from skh.sim.answers import SimSource, live_pairs, sim_localizer
from skh.sim.faults import FAULT_SPECS, SIMULATED_TYPES, Fault
from skh.sim.oracle import suspect_from_record

__all__ = ["same_component", "score", "localization_suite", "end_to_end_suite"]


def same_component(component: str, truth: str) -> bool:
    # verdicts name a container job/container; the simulator names it by its (unique) name
    return component == truth or component.endswith("/" + truth)


def score(verdicts: Any, truths: Any) -> bool:
    """Right when the verdicts name exactly the true components, each with certainty."""
    if not verdicts or any(not v.certain for v in verdicts):
        return False
    got = [v.component for v in verdicts]
    return all(any(same_component(g, t) for t in truths) for g in got) and all(
        any(same_component(g, t) for g in got) for t in truths
    )


class _Timed:
    """A state source that keeps the time spent answering apart (the real commands' share)."""

    def __init__(self, inner: SimSource) -> None:
        self._inner, self._clock, self.spent_s = inner, time.perf_counter, 0.0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)

        def timed(*a: Any) -> Any:
            t0 = self._clock()
            try:
                return fn(*a)
            finally:
                self.spent_s += self._clock() - t0

        return timed


def localization_suite(
    sim: Any,
    *,
    trials: int = 5,
    types: Any = None,
    both_layers: bool = True,
    seed: int = 0,
    t0_s: float = 10.0,
) -> list[dict]:
    """ORACLE diagnostic: run every fault type ``trials`` times (and, with ``both_layers``, every
    pair of an endpoint-side and a fabric fault once) through the localizer. Each fault is active
    for 3 s and localized 1 s after its onset from the suspect built from its ground truth
    (:func:`skh.sim.oracle.suspect_from_record`), not from the detector's events. Faults that
    touch no probed pair are redrawn (they are not detectable); a fault whose pairs all fail
    harder because of the other fault of its pair is marked ``masked`` (no detector can see it).
    One result dict per fault (group)."""
    rng = np.random.default_rng(seed)
    loc = sim_localizer(sim, rnic_dump_interval_s=0.0)
    n_ep = max(1, len(sim.cluster.endpoints))
    rank = {"latency": 0, "loss": 1, "unreachable": 2}
    out: list[dict] = []
    t = float(t0_s)

    def run(records: list, ts: float, label: str) -> None:
        sus = [suspect_from_record(sim, r, ts) for r in records]
        aff: set = set()
        for s in sus:
            aff |= set(s.pairs)
        lp = live_pairs(sim, sim.pairs, ts)
        codes = lp[:, 0] * n_ep + lp[:, 1]
        bad = np.array([a * n_ep + b for a, b in aff], np.int64)
        healthy = lp[~np.isin(codes, bad)]
        masked = False
        if len(sus) == 2:
            for a, b in ((0, 1), (1, 0)):
                sa, sb = sus[a], sus[b]
                if (
                    sa.pairs
                    and set(sa.pairs) <= set(sb.pairs)
                    and rank[sb.symptom] >= rank[sa.symptom]
                    and not sa.agents
                ):
                    masked = True
        src = _Timed(SimSource(sim, t_s=ts))
        t1 = time.perf_counter()
        verdicts = loc.localize(sus, src, healthy_pairs=healthy, now_ns=sim.clock.wall_ns(ts))
        total = time.perf_counter() - t1
        out.append(
            {
                "label": label,
                "truth": [r.component for r in records],
                "ok": score(verdicts, [r.component for r in records]),
                "masked": masked,
                "pairs": len(aff),
                "localize_ms": (total - src.spent_s) * 1e3,
                "with_source_ms": total * 1e3,
                "verdicts": [
                    (v.layer, v.component, v.failure_type.name, len(v.pairs), v.certain)
                    for v in verdicts
                ],
            }
        )

    for ft in types or list(SIMULATED_TYPES):
        cands = sim.candidates(ft)
        if not cands:
            continue
        for _ in range(trials):
            for _attempt in range(30):
                comp = cands[int(rng.integers(len(cands)))]
                rec = sim.inject(Fault(ft, comp, t, t + 3.0))
                ts, t = t + 1.0, t + 4.0
                s = suspect_from_record(sim, rec, ts)
                if s.pairs or s.agents:
                    run([rec], ts, ft.name)
                    break
    if both_layers:
        over = [
            f
            for f in SIMULATED_TYPES
            if FAULT_SPECS[f].target in ("container", "host", "rnic")
            and FAULT_SPECS[f].symptom not in ("agent_down", "agent_slow")
        ]
        under = [f for f in SIMULATED_TYPES if FAULT_SPECS[f].target in ("link", "switch")]
        k = 0
        for o in over:
            for u in under:
                for _attempt in range(10):
                    k += 1
                    a, b = sim.inject_both_layers(o, u, t, t + 3.0, seed=seed * 1000 + k)
                    ts, t = t + 1.0, t + 4.0
                    sa, sb = suspect_from_record(sim, a, ts), suspect_from_record(sim, b, ts)
                    if (sa.pairs or sa.agents) and (sb.pairs or sb.agents):
                        run([a, b], ts, f"{o.name}+{u.name}")
                        break
    return out


def end_to_end_suite(
    sim: Any,
    *,
    types: Any = None,
    trials: int = 1,
    warmup_s: int = 150,
    active_s: int = 30,
    gap_s: int = 45,
    seed: int = 0,
) -> list[dict]:
    """Faults one after another on one running simulation, detected by the real
    :class:`skh.analysis.detect.Detector` and localized from its suspect events (with the failing
    path ids read from the recent probe records). One result dict per injected fault:
    ``detected`` (an event touched the fault's pairs or endpoints while it was on), ``ttd_s``
    (seconds to the first such event), ``ok`` and ``ttl_s`` (seconds to the certain verdict)."""
    rng = np.random.default_rng(seed)
    det = Detector()
    loc = sim_localizer(sim)
    recent: list[np.ndarray] = []

    def step() -> list:
        nonlocal recent
        s = sim.step(1)
        det.ingest(s.probes)
        det.heartbeat(s.heartbeats, sim.clock.now_ns)
        recent = [*recent[-4:], s.probes]
        return det.tick(sim.clock.now_ns)

    for _ in range(warmup_s):
        step()
    out: list[dict] = []
    for ft in types or list(SIMULATED_TYPES):
        cands = sim.candidates(ft)
        for _ in range(trials):
            t = sim.clock.now_s
            rec = None
            for _attempt in range(30):
                comp = cands[int(rng.integers(len(cands)))]
                probe = suspect_from_record(
                    sim, sim.inject(Fault(ft, comp, t + 1.0, t + 1.0 + active_s)), t + 2.0
                )
                rec = sim.ground_truth[-1]
                if probe.pairs or probe.agents:
                    break
                # nothing to see: retire it
                sim.faults[-1] = Fault(ft, comp, t + 1.0, t + 1.0 + 1e-3)
                rec = None
            if rec is None:
                continue
            mine_pairs = {tuple(p) for p in np.asarray(rec.affected_pairs).tolist()}
            mine_eps = (
                set(np.flatnonzero(sim.eps.container == sim.eps.container_id(comp)).tolist())
                if (sim.faults[-1].spec.target == "container")
                else set()
            )
            result = {
                "label": ft.name,
                "truth": [comp],
                "detected": False,
                "ok": False,
                "verdicts": [],
                "ttd_s": None,
                "ttl_s": None,
                "rounds": 0,
            }
            held: list = []
            for _s in range(active_s):
                events = step()
                hit = [
                    e
                    for e in events
                    if set(map(tuple, e.pairs)) & mine_pairs or set(e.endpoints) & mine_eps
                ]
                if not hit and not held:
                    continue
                # as the pipeline does: each round localizes what detection raised so far, until
                # a round names culprits with certainty (a first round may lack evidence a later
                # event or a later look brings, e.g. an agent's missed heartbeats)
                held += hit
                probes = np.concatenate(recent)
                sus = [
                    Suspect.from_event(e, path_ids=failing_path_ids(probes, e.pairs)) for e in held
                ]
                now = sim.clock.now_s
                lp = live_pairs(sim, sim.pairs, now)
                bad = {p for s in sus for p in s.pairs}
                healthy = np.array(
                    [p for p in map(tuple, lp.tolist()) if p not in bad], np.int64
                ).reshape(-1, 2)
                verdicts = loc.localize(
                    sus, SimSource(sim, t_s=now), healthy_pairs=healthy, now_ns=sim.clock.now_ns
                )
                if not result["detected"]:
                    result.update(detected=True, ttd_s=round(now - (t + 1.0), 1))
                result.update(
                    ok=score(verdicts, [comp]),
                    rounds=result.get("rounds", 0) + 1,
                    ttl_s=round(now - (t + 1.0), 1),
                    verdicts=[
                        (v.layer, v.component, v.failure_type.name, len(v.pairs), v.certain)
                        for v in verdicts
                    ],
                )
                if all(v.certain for v in verdicts):
                    break
            out.append(result)
            # let the fault end and the detector's incidents clear before the next one
            while sim.clock.now_s < t + 1.0 + active_s + gap_s:
                step()
    return out
