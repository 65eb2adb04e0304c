"""Stage 5: validation of an inferred skeleton against the live bursts, and its confidence."""

from __future__ import annotations

from skh.analysis.skeleton.model import SkeletonParams, clip01

__all__ = ["confidence"]


def confidence(scores: dict[str, float], multi: bool, params: SkeletonParams) -> tuple[float, str]:
    """The weakest validation score, scaled so that 0.5 is the edge of trust, and its name."""
    parts = {
        "separation": scores["separation"],
        "coherence": clip01(scores["coherence"] / params.min_coherence * 0.5) if multi else 1.0,
        "rail agreement": scores["rail_agreement"],
        "typical RNICs": clip01(scores["typical"] * 2 - 1),
    }
    limit = min(parts, key=parts.get)
    return parts[limit], limit
