"""One round's detection results from many shards, as the single detector would have told them.

The detector raises at most one event per *stream* and tick (:meth:`Detector._emit`): the
network kinds' new incidents, one event each in kind order (every pair that turned unreachable
in this tick is in one ``unreachable`` event, listed in (src, dst) order); then the open
outages raised once more as flapping (a second ``unreachable`` event, ``flapping`` set, whose
pairs may also be in the first); then the endpoints that turned unhealthy, one ``agent`` event
in id order. Shards tick at the same ``now_ns``, so the merge is the union of the shards'
events of one stream, in the detector's stream order, re-sorted the way the detector sorts.
The explanation, written per shard, is joined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skh.analysis.detect import KINDS, SuspectEvent

__all__ = ["merge_events", "merge_incidents", "event_key", "alert_key"]


def _stream(ev: SuspectEvent) -> tuple[int, int, int]:
    """Where the detector emits ``ev`` in a tick: new network incidents by kind, then the
    flapping re-raises, then the agent event."""
    return (ev.kind == "agent", ev.flapping, KINDS.index(ev.kind))


def merge_events(per_shard: Sequence[Sequence[SuspectEvent]]) -> list[SuspectEvent]:
    by_stream: dict[tuple[int, int, int], list[SuspectEvent]] = {}
    for events in per_shard:
        for ev in events:
            by_stream.setdefault(_stream(ev), []).append(ev)
    out = []
    for stream in sorted(by_stream):
        evs = by_stream[stream]
        kind = evs[0].kind
        if len(evs) == 1:
            out.append(evs[0])
            continue
        if kind == "agent":
            # each endpoint lives on one shard: its withheld pairs come whole with it
            parts = sorted(
                ((e, s, ev) for ev in evs for e, s in zip(ev.endpoints, ev.scores, strict=True)),
                key=lambda t: t[0],
            )
            eps = tuple(e for e, _s, _ev in parts)
            scores = tuple(s for _e, s, _ev in parts)
            runs = {e: r for ev in evs for e, r in _runs(ev).items()}
            pairs = tuple(p for e in eps for p in runs[e])
        else:
            rows = sorted((p, s) for ev in evs for p, s in zip(ev.pairs, ev.scores, strict=True))
            pairs = tuple(p for p, _s in rows)
            scores = tuple(s for _p, s in rows)
            eps = ()
        out.append(
            SuspectEvent(
                kind=kind,
                pairs=pairs,
                scores=scores,
                first_seen_ns=min(ev.first_seen_ns for ev in evs),
                detected_ns=max(ev.detected_ns for ev in evs),
                explanation=" | ".join(ev.explanation for ev in evs),
                endpoints=eps,
                flapping=evs[0].flapping,
            )
        )
    return out


def _runs(ev: SuspectEvent) -> dict[int, list[tuple[int, int]]]:
    """An agent event's pairs per endpoint: the detector lists each new endpoint's withheld pairs
    in turn, in endpoint order. (A pair of two new endpoints is in both runs; where one run ends
    and the next begins with such a pair is ambiguous, and it is given to the earlier one.)"""
    eps = list(ev.endpoints)
    out: dict[int, list[tuple[int, int]]] = {e: [] for e in eps}
    i = 0
    for p in ev.pairs:
        while i < len(eps) - 1 and eps[i] not in p:
            i += 1
        out[eps[i]].append(p)
    return out


def merge_incidents(
    per_shard: Sequence[tuple[set[tuple[int, int]], set[int]]],
) -> tuple[set[tuple[int, int]], set[int]]:
    pairs: set[tuple[int, int]] = set()
    eps: set[int] = set()
    for p, e in per_shard:
        pairs |= p
        eps |= e
    return pairs, eps


def event_key(e: SuspectEvent) -> tuple[Any, ...]:
    """What the sharded and the single analyzer must agree on in a detection event: kind,
    flapping, pairs, first seen, endpoints (the explanation is written per shard)."""
    return (
        e.kind,
        e.flapping,
        tuple(sorted(e.pairs)),
        e.first_seen_ns,
        tuple(sorted(e.endpoints)),
    )


def alert_key(a: Mapping[str, Any]) -> tuple[Any, ...]:
    """... and in an alert: kind, state, job, layer, component, type, pairs and first seen
    (sequence numbers and wall-clock stamps aside)."""
    return (
        a["kind"],
        a.get("state"),
        a.get("job"),
        a.get("layer"),
        a.get("component"),
        a.get("failure_type"),
        tuple(sorted(map(tuple, a.get("pairs", ())))),
        a.get("first_seen_ns"),
    )
