"""The alert bodies the pipeline publishes: fault verdicts (open, resolved) and skeletons."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from skh.analysis.detect import SuspectEvent
from skh.analysis.localize import Verdict
from skh.analysis.skeleton import Skeleton
from skh.failures import type_class

__all__ = ["verdict_alert", "resolved_verdict", "skeleton_alert"]


def verdict_alert(
    v: Verdict,
    state: str,
    event: SuspectEvent | None = None,
    *,
    localization: Mapping[str, Any] | None = None,
    max_pairs: int = 32,
) -> dict[str, Any]:
    """The alert body of a verdict (JSON-friendly). ``event`` is the detection event it
    answers; ``localization`` what the round read to place it (``took_s``, ``reads``)."""
    out: dict[str, Any] = {
        "kind": "fault",
        "state": state,
        # the type's class, not the type: an alert whose type a later round refines keeps its id
        "alert_id": "|".join(str(x) for x in v.key),
        "job": v.job,
        "layer": v.layer,
        "component": v.component,
        "component_kind": v.component_kind,
        "failure_type": v.failure_type.name.lower(),
        "failure_type_id": int(v.failure_type),
        "type_class": type_class(v.failure_type).lower(),
        "type_confidence": round(v.type_confidence, 3),
        "type_candidates": [[t.name.lower(), round(float(p), 3)] for t, p in v.type_candidates],
        "symptom": v.symptom,
        "severity": v.severity.name.lower() if state == "open" else "info",
        "pairs": [list(p) for p in v.pairs[:max_pairs]],
        "n_pairs": len(v.pairs),
        "first_seen_ns": int(v.first_seen_ns),
        "detected_at_ns": int(v.detected_at_ns),
        "evidence": dict(v.evidence),
        "candidates": list(v.candidates),
    }
    if event is not None:
        out["detection"] = {
            "kind": event.kind,
            "explanation": event.explanation,
            "detected_ns": int(event.detected_ns),
            "first_seen_ns": int(event.first_seen_ns),
            "n_pairs": len(event.pairs),
            "n_endpoints": len(event.endpoints),
        }
    if localization is not None:
        out["localization"] = dict(localization)
    return out


def resolved_verdict(v: Verdict, now_ns: int) -> Verdict:
    """The verdict as resolved: ``detected_at_ns`` kept, the resolution time in its evidence."""
    return replace(v, evidence={**dict(v.evidence), "resolved_at_ns": int(now_ns)})


def skeleton_alert(job: str, sk: Skeleton, version: int) -> dict[str, Any]:
    """The alert body announcing skeleton ``version`` of ``job`` (JSON-friendly)."""
    return {
        "kind": "skeleton",
        "state": "event",
        "alert_id": f"skeleton|{job}|{version}",
        "severity": "info",
        "job": job,
        "layer": "skeleton",
        "component": job,
        "mode": sk.mode,
        "confidence": round(float(sk.confidence), 3),
        "reason": sk.reason,
        "version": version,
        "n_pairs": int(len(sk.pairs)),
        "period_s": round(float(sk.period_s), 3),
        "pairs": sk.pairs.tolist(),
        "ep_id": sk.ep_id.tolist(),
        "group": sk.group.tolist(),
        "stage": sk.stage.tolist(),
    }
