"""Verdicts over time: one per culprit within a round (:func:`merge_verdicts`), one alert per fault
while it lasts (:class:`AlertTracker`), resolved when no round confirms it any more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from skh.analysis.localize.data import SYMPTOM_RANK, Verdict
from skh.errors import ConfigError

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

    A verdict whose key (layer, component, type) is already open is the same fault: it updates
    the open alert (pairs, detected-at) but keeps the first first-seen. An open alert that no
    round has confirmed for ``resolve_after_s`` is resolved.
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

    def update(self, verdicts: Iterable[Verdict], now_ns: int) -> AlertUpdate:
        new, ongoing = [], []
        for v in verdicts:
            k = v.key
            old = self._open.get(k)
            if old is None:
                self._open[k] = v
                new.append(v)
            else:
                merged = replace(
                    join_verdicts(old, v), detected_at_ns=old.detected_at_ns, evidence=v.evidence
                )
                self._open[k] = merged
                ongoing.append(merged)
            self._seen_ns[k] = now_ns
        resolved = []
        for k in [k for k, t in self._seen_ns.items() if now_ns - t >= self.resolve_after_ns]:
            resolved.append(self._open.pop(k))
            del self._seen_ns[k]
        return AlertUpdate(tuple(new), tuple(ongoing), tuple(resolved))
