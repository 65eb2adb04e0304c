"""Scoring detection events against the simulator's ground truth (``FaultRecord``).

An event *matches* a fault when it names one of the fault's affected pairs (for ``agent`` events:
an endpoint of the faulty container) and was detected between the fault's start and its end
plus one detection window (a window closing just after the fault ended still saw it). An event
that fits several (overlapping) faults detects each of them. Then:

- precision = matched events / events; recall = faults with a matched event / faults that touch
  a probed pair;
- the ``_kind`` variants also require the event's kind to fit the fault's symptom (an unreachable
  link or switch under ECMP is pair-level *loss* for pairs whose other paths still work, so those
  accept both; a crashed container takes its agent with it);
- time to detect = the first matched event's ``detected_ns`` − the fault's start.

Per-type precision cannot be "events of type T / events claiming T", because detection does not
name a type (localization does); a type's ``precision_kind`` is the share of the events matched
to its faults whose kind fits its symptom.

Pure data in, data out: the harness (and ``bench/analyzer.py``) pass records and events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from skh.sim.faults import FAULT_SPECS

__all__ = [
    "accepted_kinds",
    "match_events",
    "summarize",
    "detection_scores",
    "wilson",
    "DETECTION_KINDS",
]

DETECTION_KINDS: tuple[str, ...] = ("unreachable", "loss", "latency-short", "latency-long", "agent")


def accepted_kinds(rec: Any) -> set[str]:
    """The event kinds that fit a fault's symptom (see the module doc)."""
    spec = FAULT_SPECS[rec.type]
    sym, target = spec.symptom, spec.target
    if sym == "unreachable":
        ok = {"unreachable"}
        if target in ("link", "switch"):
            ok.add("loss")
        if target == "container":  # a crashed container's agent dies with it
            ok.add("agent")
        return ok
    if sym == "loss":
        return {"loss"}
    if sym == "flapping":
        return {"unreachable", "loss"}
    if sym == "latency":
        return {"latency-short", "latency-long"}
    return {"agent"}


def match_events(
    records: Sequence[Any],
    events: Sequence[Any],
    window_ns: int,
    eps_of: Mapping[int, Iterable[int]],
    ignore: Iterable[int] = (),
) -> tuple[list[Any | None], dict[int, list[Any]]]:
    """Per event, the fault it matches (or None); per fault id, its matched events in order.
    ``eps_of`` maps a container fault's id to the container's endpoint ids.

    An event that fits several faults (they overlap on its pairs, both active when it was
    raised) detects each of them; as *the* fault it matches it names the first one not in
    ``ignore`` (gray faults, scored apart) whose symptom its kind fits, else the first one not
    in ``ignore``, else the first. Handing it to the first fault in
    record order alone made a fault's recall depend on what else was open: a port going down
    on pairs a gray loss already touched was missed, its events claimed by the gray fault and
    then set aside with it.

    A ``latency-long`` event speaks for the whole block it tested (``first_seen_ns`` to
    ``detected_ns``): a fault on its pairs within that block explains it. Matched at the
    block's close alone, a gray fault (+6 us on one flow of four for 200 s) that lifted its
    block's mean 5 %, flagged half an hour later, counted as a false event (field draw
    982641095 + 1893097845)."""
    ignore = set(ignore)
    pairsets = {r.fault_id: set(map(tuple, np.asarray(r.affected_pairs).tolist())) for r in records}
    epsets = {r.fault_id: set(eps_of.get(r.fault_id, ())) for r in records}
    matched: list[Any | None] = [None] * len(events)
    detected: dict[int, list[Any]] = {r.fault_id: [] for r in records}
    for i, ev in enumerate(events):
        fits = []
        for rec in records:
            end = rec.end_ns if rec.end_ns >= 0 else 2**62
            since = ev.first_seen_ns if ev.kind == "latency-long" else ev.detected_ns
            if not (rec.start_ns <= ev.detected_ns and since <= end + window_ns):
                continue
            ps, es = pairsets[rec.fault_id], epsets[rec.fault_id]
            if any(tuple(p) in ps for p in ev.pairs) or any(e in es for e in ev.endpoints):
                fits.append(rec)
                detected[rec.fault_id].append(ev)
        if fits:
            scored = [r for r in fits if r.fault_id not in ignore] or fits
            matched[i] = next((r for r in scored if ev.kind in accepted_kinds(r)), scored[0])
    return matched, detected


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float | None, float | None]:
    """The Wilson score interval (95 % by default) of a proportion ``k / n``."""
    if n <= 0:
        return None, None
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return round(float(max(0.0, c - h)), 4), round(float(min(1.0, c + h)), 4)


def _ratio(num: int, den: int, empty: float | None = None) -> float | None:
    return round(num / den, 4) if den else empty


def summarize(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p99 and max of a list of seconds (None when empty)."""
    if not len(values_s):
        return {"mean": None, "p50": None, "p99": None, "max": None, "n": 0}
    a = np.asarray(values_s, float)
    return {
        "mean": round(float(a.mean()), 2),
        "p50": round(float(np.percentile(a, 50)), 2),
        "p99": round(float(np.percentile(a, 99)), 2),
        "max": round(float(a.max()), 2),
        "n": int(a.size),
    }


def detection_scores(
    records: Sequence[Any],
    events: Sequence[Any],
    window_ns: int,
    eps_of: Mapping[int, Iterable[int]],
    *,
    paper_only: bool = True,
    ignore: Iterable[int] = (),
    invisible_are_misses: bool = False,
    masked: Iterable[int] = (),
) -> dict[str, Any]:
    """Precision, recall and time to detect, overall and per fault type. With ``paper_only``
    the headline numbers count only the paper's 19 types (events matched to the simulator's
    extra types — agent crash, late agent, vswitch loop — are left out of precision too); the
    per-type table always lists every type injected. Faults in ``ignore`` (gray faults, scored
    apart) count nowhere: neither their detection nor their events. With
    ``invisible_are_misses`` a fault no probed pair crosses is a miss (it sits on pairs the jobs
    use, so a probe list that skips them failed), else it is left out of recall. Faults in
    ``masked`` (every probe they touched was failed outright by another fault:
    :meth:`skh.sim.faults.FaultEngine.masked`) are left out of recall and counted and listed
    apart: no monitor could have seen them."""
    ignore = set(ignore)
    masked = set(masked) - ignore
    matched, detected = match_events(records, events, window_ns, eps_of, ignore)
    keep = [
        (m, ev)
        for m, ev in zip(matched, events, strict=True)
        if m is None or m.fault_id not in ignore
    ]
    matched, events = [m for m, _ in keep], [ev for _, ev in keep]
    records = [r for r in records if r.fault_id not in ignore]
    hidden = [r for r in records if r.fault_id in masked]
    visible = [
        r
        for r in records
        if (len(r.affected_pairs) or invisible_are_misses) and r.fault_id not in masked
    ]

    def counts(rec: Any) -> bool:
        return not paper_only or FAULT_SPECS[rec.type].in_paper

    head = [r for r in visible if counts(r)]
    ev_head = [(m, ev) for m, ev in zip(matched, events, strict=True) if m is None or counts(m)]
    n_match = sum(m is not None for m, _ in ev_head)
    n_kind = sum(m is not None and ev.kind in accepted_kinds(m) for m, ev in ev_head)

    def first_s(r: Any) -> float:
        return (min(ev.detected_ns for ev in detected[r.fault_id]) - r.start_ns) / 1e9

    found = [r for r in head if detected[r.fault_id]]
    found_kind = [
        r for r in head if any(ev.kind in accepted_kinds(r) for ev in detected[r.fault_id])
    ]
    per_type: dict[str, dict[str, Any]] = {}
    for t in sorted({r.type for r in visible}):
        fs = [r for r in visible if r.type == t]
        evs = [ev for r in fs for ev in detected[r.fault_id]]
        spec = FAULT_SPECS[t]
        per_type[t.name] = {
            "no": int(t),
            "name": spec.name,
            "layer": spec.layer,
            "in_paper": spec.in_paper,
            "faults": len(fs),
            "detected": sum(bool(detected[r.fault_id]) for r in fs),
            "recall": _ratio(sum(bool(detected[r.fault_id]) for r in fs), len(fs)),
            "events": len(evs),
            "precision_kind": _ratio(sum(ev.kind in accepted_kinds(fs[0]) for ev in evs), len(evs)),
            "ttd_s": summarize([first_s(r) for r in fs if detected[r.fault_id]]),
        }
    per_kind = {}
    for kind in DETECTION_KINDS:
        evk = [(m, ev) for m, ev in ev_head if ev.kind == kind]
        per_kind[kind] = {
            "events": len(evk),
            "matched": sum(m is not None for m, _ in evk),
            "precision": _ratio(sum(m is not None for m, _ in evk), len(evk)),
        }
    ttd = summarize([first_s(r) for r in found])
    return {
        "faults": len(head),
        "events": len(ev_head),
        "matched_events": n_match,
        "detected_faults": len(found),
        "invisible_faults": sum(not len(r.affected_pairs) for r in head),
        "masked_faults": sum(counts(r) for r in hidden),
        "masked": [f"{r.type.name}@{r.component}" for r in hidden if counts(r)],
        "precision": _ratio(n_match, len(ev_head), 1.0),
        "recall": _ratio(len(found), len(head)),
        "precision_kind": _ratio(n_kind, len(ev_head), 1.0),
        "recall_kind": _ratio(len(found_kind), len(head)),
        "ttd_s": ttd,
        "per_type": per_type,
        "per_kind": per_kind,
        "missed": [f"{r.type.name}@{r.component}" for r in head if not detected[r.fault_id]],
        "false_events": [
            # whole: the explanation names the worst pair and its evidence, what a replay needs
            f"{ev.kind}@{ev.detected_ns}: {ev.explanation}"
            for m, ev in ev_head
            if m is None
        ][:20],
    }
