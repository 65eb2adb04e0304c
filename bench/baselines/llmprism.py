"""An LLMPrism-style baseline for skeleton inference: union-find over RNICs whose bursts co-occur.

For each rail of a job, an RNIC's bursts are the seconds its throughput exceeds half its own 95th
percentile; two RNICs are joined when the Jaccard index of their burst seconds reaches
``min_jaccard``; every same-rail pair inside a connected component is then "used". It has no notion
of pipeline stages: adjacent stages whose bursts overlap merge (long lists), and stages whose
bursts do not overlap are never joined (missed PP pairs).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.csgraph import connected_components

__all__ = ["llmprism_pairs"]


def llmprism_pairs(
    ep_id: np.ndarray,
    host: np.ndarray,
    rail: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    min_jaccard: float = 0.5,
) -> np.ndarray:
    """Ordered (src, dst) pairs the baseline would probe, ``(m, 2)`` uint32."""
    ep_id = np.asarray(ep_id, np.uint32)
    x = np.asarray(bytes_per_s, np.float64)
    burst = x > 0.5 * np.percentile(x, 95, axis=1, keepdims=True)
    out = []
    for r in np.unique(rail):
        idx = np.flatnonzero(rail == r)
        b = burst[idx].astype(np.float32)
        inter = b @ b.T
        cnt = b.sum(axis=1)
        union = cnt[:, None] + cnt[None, :] - inter
        jac = np.where(union > 0, inter / np.maximum(union, 1), 0.0)
        _, roots = connected_components(jac >= min_jaccard, directed=False)
        a, c = np.meshgrid(np.arange(idx.size), np.arange(idx.size), indexing="ij")
        keep = (roots[a] == roots[c]) & (host[idx][a] != host[idx][c])
        out.append(np.stack([ep_id[idx][a[keep]], ep_id[idx][c[keep]]], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2), np.uint32)
