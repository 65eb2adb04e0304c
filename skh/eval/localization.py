"""Localization scored on the simulator: the oracle suite (each fault localized from the suspect
built from its ground truth, :func:`skh.sim.oracle.suspect_from_record`: a diagnostic upper
bound), the end-to-end suite (the real detector's suspect events → the localizer → the
simulated agents' answers, one fault at a time) and :func:`e2e_localization`, which scores a
detection run with overlapping faults on component and type class, as the evaluation reports
it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import binomtest

from skh.analysis.detect import Detector
from skh.analysis.localize import AlertTracker, Suspect, failing_path_ids, probe_view
from skh.failures import TYPE_CLASSES, type_class
from skh.sim.answers import AnswerNoise, SimSource, answer_noise, live_pairs, sim_localizer
from skh.sim.faults import FAULT_SPECS, SIMULATED_TYPES, Fault
from skh.sim.oracle import suspect_from_record

__all__ = [
    "same_component",
    "score",
    "localization_suite",
    "end_to_end_suite",
    "e2e_localization",
    "probe_view",
    "tick_suspects",
    "E2E_WINDOW_S",
    "E2E_REASK_S",
]


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
    noise: AnswerNoise | None = None,
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
        src = _Timed(SimSource(sim, t_s=ts, noise=noise))
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


#: an alert is scored as it stands this long after the first detection of its fault: the host
#: collectors poll every 30 s, so by then every flag has been read after the fault began
E2E_WINDOW_S = 30.0
#: rounds are this far apart (the first at the first detection): each localizes what detection
#: raised so far, with the open alerts as known culprits, and asks again about uncertain ones
E2E_REASK_S = 10.0


def tick_suspects(events: Sequence[Any], probes: np.ndarray) -> list[tuple[Any, Suspect]]:
    """Detection's events of one tick as the localizer takes them, each with the flow labels
    that failed in the recent probe records (agents' events have no pairs to trace)."""
    out = []
    for ev in events:
        pids = failing_path_ids(probes, ev.pairs) if ev.kind != "agent" else None
        out.append((ev, Suspect.from_event(ev, path_ids=pids)))
    return out


def _latest(snaps: Sequence[tuple[float, Any]], t: float) -> Any:
    """The last snapshot taken at or before ``t`` (None when none)."""
    got = None
    for ts, v in snaps:
        if ts > t + 1e-9:
            break
        got = v
    return got


def _ci(k: int, n: int) -> tuple[float | None, float | None]:
    """95 % Wilson interval of ``k / n``."""
    if n <= 0:
        return None, None
    lo, hi = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return round(float(lo), 4), round(float(hi), 4)


def e2e_localization(
    sim: Any,
    run: Mapping[str, Any],
    detected: Mapping[int, Sequence[Any]],
    *,
    skip: Iterable[int] = (),
    window_s: float = E2E_WINDOW_S,
    reask_s: float = E2E_REASK_S,
    noise: AnswerNoise | None = None,
    rnic_dump_interval_s: float = 60.0,
    resolve_after_s: float = 30.0,
) -> dict[str, Any]:
    """End-to-end localization of a detection run, scored on component and type class.

    ``run`` is a detection run on ``sim`` (``records``: the faults injected; ``ticks``: per
    detector tick with events, ``(virtual time, [(event, Suspect), ...])``); ``detected`` maps a
    fault id to the events matched to it; faults in ``skip`` (gray ones) are left out. When the
    run has ``views`` (``[(virtual time, (healthy pairs, responsive endpoints))]``, from
    :func:`probe_view` of the recent probes, taken every few seconds) the rounds read healthy
    pairs and live agents off them as the pipeline does; otherwise every live pair no suspect
    names counts as healthy and no agent as alive. For each
    detected fault, rounds run from its first detection (its flapping re-raise, when there is
    one) every ``reask_s`` until ``window_s`` later (or the fault's end): each localizes every
    suspect detection raised since the first detection — other faults' and false ones included —
    from the simulated agents' noisy answers (``noise``; default: the simulation's regime), with
    the alerts still open as known culprits, and an :class:`AlertTracker` keeps the alerts as
    the pipeline does. The fault is scored on the open alerts at the last round: the component
    is right when a certain alert names it, the type when that alert's type is in the true
    type's class (:data:`skh.failures.TYPE_CLASSES`). Agents' crashes and late agents count like
    any type. Figures over Table 1's types (``in_paper``) and over all, with 95 % Wilson
    intervals; the type confusions and misses are listed. ``spurious_alerts_per_fault``: alerts
    open at the last round that name no fault on during the suspects' window (``window_s``
    before the first round to the last; unexplained alerts always count), listed in
    ``spurious``; ``exact_type_accuracy``: the type itself, no class merged.

    A fault whose first matched event came after it ended (detection matches events up to its
    window past a fault's end) is not scored here: no round can see a fault that is gone, on a
    real cluster as in the simulator, and localizing it anyway would only test whether the
    localizer raises nothing. Its lateness is detection's failure and shows in detection's
    time to detect; it is counted (``detected_after_end``) and listed
    (``detected_after_end_cases``), so the share of faults localization never got to see is
    in the report beside the accuracy."""
    skip = set(skip)
    late: list[dict[str, Any]] = []
    loc = sim_localizer(sim, rnic_dump_interval_s=rnic_dump_interval_s)
    n_ep = max(1, len(sim.cluster.endpoints))
    ticks = list(run["ticks"])
    views = list(run.get("views", ()))
    rows: list[dict[str, Any]] = []
    spurious_seen: list[dict[str, Any]] = []
    spurious = alerts_n = rounds_n = 0
    t_loc = 0.0
    for rec in run["records"]:
        evs = detected.get(rec.fault_id) or []
        if rec.fault_id in skip or not evs:
            continue
        # a flapping re-raise updates the alert: the window starts there, when it came while the
        # fault was still on (a port that came back once is re-raised as it recovers)
        end_ns = int(sim.clock.wall_ns(rec.end_s - 0.5))
        flap = [e for e in evs if getattr(e, "flapping", False) and e.detected_ns < end_ns]
        anchor = min(ev.detected_ns for ev in (flap or evs))
        t0 = (anchor - sim.clock.t0_ns) / 1e9
        if min(ev.detected_ns for ev in evs) >= rec.end_ns >= 0:
            # first detected after it ended (detection counts events up to its window after
            # the end): nothing is left for the rounds to find, on a real cluster as here, so
            # it is no localization case. Detection owns the lateness (its time to detect);
            # the cases are counted and listed, never silently dropped
            late.append(
                {
                    "type": rec.type.name,
                    "component": rec.component,
                    "detected_after_end_s": round(
                        (min(e.detected_ns for e in evs) - rec.end_ns) / 1e9, 2
                    ),
                }
            )
            continue
        t_end = min(t0 + window_s, rec.end_s - 0.5)
        times = [t0, *np.arange(t0 + reask_s, t_end + 1e-9, reask_s).tolist()]
        times = [t for t in times if t <= max(t_end, t0)]
        tracker = AlertTracker(resolve_after_s=resolve_after_s)
        for ts in times:
            sus = [s for t, ss in ticks if t0 - 1e-9 <= t <= ts + 1e-9 for _, s in ss]
            if not sus:
                continue
            view = _latest(views, ts)
            bad = np.array([a * n_ep + b for s in sus for a, b in s.pairs], np.int64)
            if view is None:
                live = sim.pairs[sim.live_pairs(ts)].astype(np.int64)
                healthy, responsive = live[~np.isin(live[:, 0] * n_ep + live[:, 1], bad)], None
            else:
                healthy, responsive = view
                healthy = healthy[~np.isin(healthy[:, 0] * n_ep + healthy[:, 1], bad)]
            c0 = time.perf_counter()
            verdicts = loc.localize(
                sus,
                SimSource(sim, t_s=ts, noise=noise),
                healthy_pairs=healthy,
                now_ns=int(sim.clock.wall_ns(ts)),
                known=tracker.open,
                responsive=responsive,
            )
            t_loc += time.perf_counter() - c0
            rounds_n += 1
            tracker.update(verdicts, int(sim.clock.wall_ns(ts)))
        open_ = tracker.open
        # what an alert may rightly name: a fault on at some point of the suspects' window
        # (one that ended lately keeps its alert until no round confirms it)
        on = [f.component for f in sim.faults if f.start_s <= times[-1] and f.end_s > t0 - window_s]
        alerts_n += len(open_)
        wrong = [v for v in open_ if not any(same_component(v.component, c) for c in on)]
        spurious += len(wrong)
        spurious_seen += [
            {
                "fault": (rec.type.name, rec.component),
                "alert": (v.layer, v.component, v.failure_type.name, v.certain, len(v.pairs)),
            }
            for v in wrong
        ]
        hit = [v for v in open_ if v.certain and same_component(v.component, rec.component)]
        want = type_class(rec.type)
        got = [type_class(v.failure_type) for v in hit]
        rows.append(
            {
                "type": rec.type,
                "component_ok": bool(hit),
                "type_ok": want in got,
                # the type itself, no class merged: what the merges are worth
                "exact_ok": rec.type in [v.failure_type for v in hit],
                "verdict_type": got[0] if got else None,
                "miss": None
                if hit and want in got
                else {
                    "type": rec.type.name,
                    "component": rec.component,
                    "verdicts": [
                        (v.layer, v.component, v.failure_type.name, v.certain) for v in open_[:4]
                    ],
                },
            }
        )

    def block(rs: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(rs)
        kc = sum(r["component_ok"] for r in rs)
        kt = sum(r["type_ok"] for r in rs)
        ke = sum(r["exact_ok"] for r in rs)
        lo_c, hi_c = _ci(kc, n)
        lo_t, hi_t = _ci(kt, n)
        return {
            "n": n,
            "accuracy": round(kc / n, 4) if n else None,
            "accuracy_ci": [lo_c, hi_c],
            "type_accuracy": round(kt / n, 4) if n else None,
            "type_accuracy_ci": [lo_t, hi_t],
            "exact_type_accuracy": round(ke / n, 4) if n else None,
        }

    paper = [r for r in rows if r["type"].in_paper]
    per_type: dict[str, list[dict[str, Any]]] = {}
    confusion: dict[str, dict[str, int]] = {}
    for r in rows:
        per_type.setdefault(r["type"].name, []).append(r)
        if r["component_ok"] and not r["type_ok"]:
            row = confusion.setdefault(type_class(r["type"]), {})
            row[r["verdict_type"]] = row.get(r["verdict_type"], 0) + 1
    return {
        "window_s": window_s,
        "reask_s": reask_s,
        "answers": (noise or answer_noise(sim)).name,
        **block(paper),
        "all_types": block(rows),
        "merged_types": {c.name: sorted(t.name for t in c.members) for c in TYPE_CLASSES},
        "per_type": {
            k: {
                "n": len(v),
                "component": round(sum(r["component_ok"] for r in v) / len(v), 3),
                "type": round(sum(r["type_ok"] for r in v) / len(v), 3),
            }
            for k, v in sorted(per_type.items())
        },
        "type_confusion": confusion,
        "spurious_alerts_per_fault": round(spurious / len(rows), 3) if rows else None,
        "alerts_per_fault": round(alerts_n / len(rows), 3) if rows else None,
        "rounds": rounds_n,
        "localize_s": round(t_loc, 2),
        "misses": [r["miss"] for r in rows if r["miss"]][:16],
        "spurious": spurious_seen[:16],
        "detected_after_end": len(late),
        "detected_after_end_cases": late[:16],
    }
