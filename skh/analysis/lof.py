"""Batched Local Outlier Factor: every pair's new window against its own look-back, in one pass.

Each pair is an independent LOF problem: its look-back windows are the training set and the new
window is the query, exactly as ``sklearn.neighbors.LocalOutlierFactor(novelty=True,
n_neighbors=k).fit(train).score_samples(query)``. Doing that per pair in Python costs a fitted
estimator per pair; here all pairs share one set of array operations over a ``(pairs, windows,
features)`` block, chunked over pairs to bound temporary memory.

Semantics, matched to scikit-learn (1.9) on purpose:

- ``k_eff = max(1, min(k, n_train - 1))``.
- Training neighbours exclude the point itself (by index, so exact duplicates of a point still
  count as its neighbours at distance 0); the k-distance of a training point is the distance to
  its ``k_eff``-th neighbour.
- ``reach(p, o) = max(d(p, o), k_distance(o))``; ``lrd(p) = 1 / (mean_o reach(p, o) + 1e-10)``;
  ``LOF(q) = mean_o lrd(o) / lrd(q)`` over the ``k_eff`` nearest training points of ``q``; the
  returned score is ``-LOF`` (``score_samples``), and for the training points themselves
  ``negative_outlier_factor_``.
- Distances are exact Euclidean differences (not the Gram-matrix shortcut), in float64.

Ties: when two distinct training points are exactly equidistant at the k-th rank, which one is
a neighbour changes the score, and scikit-learn's choice depends on its search algorithm (brute
force's unstable ``argpartition`` or a KD tree's traversal). Such ties have probability zero for
real-valued latency features and are not reproduced bit for bit; exact *duplicates* (the common
tie, e.g. identical windows) give identical scores either way, since every duplicate has the same
k-distance.

Scaling: none. The seven features share one unit (µs), and LOF is invariant to translating and
uniformly scaling a pair's data (apart from the 1e-10 guard), so per-pair standardisation would
change nothing; per-feature standardisation would be harmful, because the spread of e.g. ``min``
over a quiet look-back is near zero and would blow up any small change. Because LOF is
scale-free, the detector pairs its threshold with an absolute effect-size gate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError

__all__ = ["LofFit", "fit_lof", "score_lof", "batched_lof"]

#: pairs per chunk: small enough that a chunk's (windows, windows, pairs) temporaries stay in cache
_CHUNK_PAIRS = 4096


@dataclass(frozen=True, slots=True)
class LofFit:
    """What scoring needs from a fitted look-back: per pair and training window, the k-distance
    and the local reachability density. Costs ``2 * n_train`` floats per pair, so a detector can
    keep it between look-back changes and score every slide of the window with ``score_lof``."""

    k: int
    kdist: np.ndarray  # (pairs, n_train)
    lrd: np.ndarray  # (pairs, n_train)
    negative_outlier_factor: np.ndarray | None  # (pairs, n_train), when asked for


def _check_train(train: np.ndarray, n_neighbors: int) -> int:
    if train.ndim != 3 or train.shape[1] < 2:
        raise ConfigError(
            "The 'train' parameter of fit_lof must be a (pairs, windows >= 2, features) array. "
            f"Got shape {train.shape} instead."
        )
    if (
        isinstance(n_neighbors, bool)
        or not isinstance(n_neighbors, (int, np.integer))
        or n_neighbors < 1
    ):
        raise ConfigError(
            "The 'n_neighbors' parameter of fit_lof must be an int "
            f">= 1. Got {n_neighbors!r} instead."
        )
    return max(1, min(int(n_neighbors), train.shape[1] - 1))


# Internally the pair axis is last: (train window j, row i, pair p). Reductions over j then add
# whole contiguous planes instead of summing short rows, which is several times faster in numpy.


def _distances(rows_t: np.ndarray, train_t: np.ndarray) -> np.ndarray:
    """Exact Euclidean distances ``d[j, i, p]`` between train window j and row i of pair p, from
    feature-major inputs ``(F, N, p)`` and ``(F, R, p)``."""
    d2 = np.zeros((train_t.shape[1], rows_t.shape[1], train_t.shape[2]))
    for f in range(train_t.shape[0]):
        diff = train_t[f][:, None, :] - rows_t[f][None, :, :]
        d2 += diff * diff
    return np.sqrt(d2)


def _neighbour_means(
    d: np.ndarray, k: int, kdist: np.ndarray, values: tuple[np.ndarray, ...]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """For each row i and pair p of ``d`` (``(N, R, p)``): the k-distance of the row, the mean over
    its k nearest training points j of ``max(d, kdist[j])``, and the mean of each of ``values``
    (``(N, p)`` arrays indexed by j).

    The k nearest are the points with ``d <=`` the k-th smallest distance. That mask is exact
    unless distinct points tie at the k-th distance, so rows where it does not select exactly k
    points are redone with an explicit ``argpartition``.
    """
    kth = np.partition(d, k - 1, axis=0)[k - 1]  # (R, p)
    mask = d <= kth[None]
    reach = np.where(mask, np.maximum(d, kdist[:, None, :]), 0.0).sum(axis=0) / k
    means = [np.where(mask, v[:, None, :], 0.0).sum(axis=0) / k for v in values]
    bad_i, bad_p = np.nonzero(mask.sum(axis=0) != k)
    if bad_i.size:
        cols = d[:, bad_i, bad_p]  # (N, B)
        nbr = np.argsort(cols, axis=0, kind="stable")[:k]  # (k, B): ties go to the lower index
        reach[bad_i, bad_p] = np.maximum(
            np.take_along_axis(cols, nbr, axis=0), kdist[nbr, bad_p]
        ).mean(axis=0)
        for m, v in zip(means, values, strict=True):
            m[bad_i, bad_p] = v[nbr, bad_p].mean(axis=0)
    return kth, reach, means


def fit_lof(train: np.ndarray, n_neighbors: int, *, with_train_scores: bool = False) -> LofFit:
    """Fit every pair's look-back (``(pairs, n_train, features)``) at once."""
    k = _check_train(train, n_neighbors)
    n_pairs, n_train, _ = train.shape
    kdist = np.empty((n_pairs, n_train))
    lrd = np.empty((n_pairs, n_train))
    nof = np.empty((n_pairs, n_train)) if with_train_scores else None
    diag = np.arange(n_train)
    for a in range(0, n_pairs, _CHUNK_PAIRS):
        b = min(n_pairs, a + _CHUNK_PAIRS)
        xt = np.ascontiguousarray(train[a:b].transpose(2, 1, 0), dtype=np.float64)  # (F, N, p)
        d = _distances(xt, xt)
        d[diag, diag] = np.inf  # a point is not its own neighbour (its duplicates still are)
        # kdist of every training point is needed before any reach distance, hence two passes
        kd = np.partition(d, k - 1, axis=0)[k - 1]  # (N, p)
        _, reach, _ = _neighbour_means(d, k, kd, ())
        ld = 1.0 / (reach + 1e-10)
        kdist[a:b] = kd.T
        lrd[a:b] = ld.T
        if nof is not None:
            _, _, (mean_lrd,) = _neighbour_means(d, k, kd, (ld,))
            nof[a:b] = -(mean_lrd / ld).T
    return LofFit(k=k, kdist=kdist, lrd=lrd, negative_outlier_factor=nof)


def score_lof(train: np.ndarray, fit: LofFit, query: np.ndarray) -> np.ndarray:
    """``score_samples`` (``-LOF``) of ``query`` (``(pairs, n_query, features)`` or ``(pairs,
    features)``) against the look-back ``fit`` was made from; same leading shape as ``query``
    without the feature axis."""
    one_query = query.ndim == 2
    q3 = query[:, None, :] if one_query else query
    if q3.ndim != 3 or q3.shape[0] != train.shape[0] or q3.shape[2] != train.shape[2]:
        raise ConfigError(
            "The 'query' parameter of score_lof must be (pairs, "
            "[queries,] features) matching 'train'. "
            f"Got shape {query.shape} for train {train.shape} instead."
        )
    n_pairs = train.shape[0]
    scores = np.empty((n_pairs, q3.shape[1]))
    for a in range(0, n_pairs, _CHUNK_PAIRS):
        b = min(n_pairs, a + _CHUNK_PAIRS)
        xt = np.ascontiguousarray(train[a:b].transpose(2, 1, 0), dtype=np.float64)
        qt = np.ascontiguousarray(q3[a:b].transpose(2, 1, 0), dtype=np.float64)
        d = _distances(qt, xt)  # (N, Q, p)
        _, reach, (mean_lrd,) = _neighbour_means(d, fit.k, fit.kdist[a:b].T, (fit.lrd[a:b].T,))
        lrd_q = 1.0 / (reach + 1e-10)
        scores[a:b] = -(mean_lrd / lrd_q).T
    return scores[:, 0] if one_query else scores


def batched_lof(
    train: np.ndarray,
    query: np.ndarray,
    n_neighbors: int,
    *,
    return_train: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """LOF scores of ``query`` against ``train``, independently per pair: ``fit_lof`` then
    ``score_lof``.

    ``train`` is ``(n_pairs, n_train, n_features)``, ``query`` is ``(n_pairs, n_query,
    n_features)`` (or ``(n_pairs, n_features)`` for one query per pair). Returns the
    ``score_samples`` values, shape ``(n_pairs, n_query)`` (or ``(n_pairs,)``): ``-LOF``, so lower
    is more abnormal and about -1 is normal. With ``return_train`` it also returns
    ``negative_outlier_factor_`` of the training points, ``(n_pairs, n_train)``.
    """
    fit = fit_lof(train, n_neighbors, with_train_scores=return_train)
    scores = score_lof(train, fit, query)
    if return_train:
        assert fit.negative_outlier_factor is not None
        return scores, fit.negative_outlier_factor
    return scores
