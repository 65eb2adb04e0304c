"""Verdicts over time: one per culprit within a round (:func:`merge_verdicts`), one alert per fault
while it lasts (:class:`AlertTracker`), resolved when no round confirms it any more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from skh.analysis.localize.data import SYMPTOM_RANK, Verdict
from skh.errors import ConfigError
from skh.failures import BECOMES, type_class

__all__ = ["AlertTracker", "AlertUpdate", "merge_verdicts", "join_verdicts"]


def merge_verdicts(verdicts: list[Verdict]) -> list[Verdict]:
    """One verdict per (layer, component, type): a host fault found through each of its RNICs
    is one fault."""
    out: dict[tuple[str, str, int], Verdict] = {}
    for v in verdicts:
        old = out.get(v.key)
        out[v.key] = v if old is None else join_verdicts(old, v)
    return list(out.values())


def join_verdicts(a: Verdict, b: Verdict) -> Verdict:
    """``a`` widened by ``b``: their pairs, jobs and candidates, the worse symptom, the earlier
    first-seen."""
    jobs = sorted(set(a.job.split(",")) | set(b.job.split(",")) - {""})
    return replace(
        a,
        job=",".join(jobs),
        pairs=tuple(sorted(set(a.pairs) | set(b.pairs))),
        symptom=max(a.symptom, b.symptom, key=SYMPTOM_RANK.__getitem__),
        severity=max(a.severity, b.severity),
        first_seen_ns=min(a.first_seen_ns, b.first_seen_ns),
        candidates=tuple(dict.fromkeys((*a.candidates, *b.candidates))),
    )


@dataclass(frozen=True, slots=True)
class AlertUpdate:
    new: tuple[Verdict, ...]
    ongoing: tuple[Verdict, ...]
    resolved: tuple[Verdict, ...]


class AlertTracker:
    """Turns rounds of verdicts into alert transitions.

    A verdict whose key (layer, component, type class) is already open is the same fault: it
    updates the open alert (pairs, detected-at) but keeps the first first-seen. So is a verdict
    that *refines* an open alert's type: same layer and component, and its type was among the
    open alert's type candidates (or the open type among its own), or the open type
    :data:`~skh.failures.BECOMES` it — a flag that was missing arrived, a port that went down
    came back and went down again. The alert keeps its id and takes the refined type (a round
    whose type is a guess does not undo what an earlier round knew, nor does a round that sees
    a flapping port down). An uncertain alert whose
    candidate a round names with certainty on pairs it held resolves; so does an open alert
    that no round has confirmed for ``resolve_after_s``.
    """

    def __init__(self, *, resolve_after_s: float = 60.0) -> None:
        if resolve_after_s <= 0:
            raise ConfigError(
                "The 'resolve_after_s' parameter of AlertTracker must be > 0. "
                f"Got {resolve_after_s!r} instead."
            )
        self.resolve_after_ns = int(resolve_after_s * 1e9)
        self._open: dict[tuple[str, str, int], Verdict] = {}
        self._seen_ns: dict[tuple[str, str, int], int] = {}

    @property
    def open(self) -> tuple[Verdict, ...]:
        return tuple(self._open.values())

    def refines(self, v: Verdict) -> tuple[str, str, int] | None:
        """The key of the open alert ``v`` refines (see the class doc), if any."""
        if v.key in self._open:
            return v.key
        mine = {type_class(t) for t, _p in v.type_candidates} | {type_class(v.failure_type)}
        for k, o in self._open.items():
            if (o.layer, o.component) != (v.layer, v.component):
                continue
            theirs = {type_class(t) for t, _p in o.type_candidates}
            if (
                type_class(v.failure_type) in theirs
                or type_class(o.failure_type) in mine
                or BECOMES.get(o.failure_type) == v.failure_type
            ):
                return k
        return None

    def update(self, verdicts: Iterable[Verdict], now_ns: int) -> AlertUpdate:
        new, ongoing = [], []
        for v in verdicts:
            k = self.refines(v)
            old = None if k is None else self._open.get(k)
            if old is None:
                k = v.key
                self._open[k] = v
                new.append(v)
            else:
                # the latest round's view of the type and of what else fits, unless it guesses
                # where the alert already knew (a flag missing or a report lost this round), or
                # sees down a port the alert knows flapping (it went down again: still flapping)
                guess = v.type_pending or not v.certain
                down_again = BECOMES.get(v.failure_type) == old.failure_type
                sure = old if (guess or down_again) and old.certain and not old.type_pending else v
                merged = replace(
                    join_verdicts(old, v),
                    detected_at_ns=old.detected_at_ns,
                    evidence=sure.evidence,
                    failure_type=sure.failure_type,
                    type_candidates=sure.type_candidates,
                    candidates=sure.candidates,
                    alert_class=k[2],
                )
                self._open[k] = merged
                ongoing.append(merged)
            self._seen_ns[k] = now_ns
        # an uncertain alert whose candidate a round has now named with certainty, on pairs it
        # held, was that fault: it resolves rather than lingering beside the located one
        located = [v for v in (*new, *ongoing) if v.certain]
        gone = [
            k
            for k, o in self._open.items()
            if not o.certain
            and any(v.component in o.candidates and set(v.pairs) & set(o.pairs) for v in located)
        ]
        for k in [k for k, t in self._seen_ns.items() if now_ns - t >= self.resolve_after_ns]:
            if k not in gone:
                gone.append(k)
        resolved = []
        for k in gone:
            resolved.append(self._open.pop(k))
            del self._seen_ns[k]
        return AlertUpdate(tuple(new), tuple(ongoing), tuple(resolved))
