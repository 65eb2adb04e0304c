"""The paper's seven latency features of a window, for every pair at once.

A window of one pair is summarised by ``p25, p50, p75, min, mean, std, max`` of its RTTs. The
detector keeps each pair's recent samples in a fixed-width row (a ring), so the input here is a
padded 2-D array plus a mask: one row per pair, one sort for all of them.
"""

from __future__ import annotations

import numpy as np

from skh.errors import ConfigError

__all__ = ["FEATURE_NAMES", "N_FEATURES", "window_features"]

FEATURE_NAMES: tuple[str, ...] = ("p25", "p50", "p75", "min", "mean", "std", "max")
N_FEATURES = len(FEATURE_NAMES)

# Positions of the three quantiles in FEATURE_NAMES, in order.
_QUANTILES = (0.25, 0.50, 0.75)


def window_features(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Features of one window per row.

    ``values`` is ``(n_pairs, width)``; ``valid`` (same shape, bool) says which cells hold a sample
    of the window. Quantiles interpolate linearly (``numpy.percentile``'s default) and ``std`` is
    the population standard deviation, so a row equals ``np.percentile``/``np.std`` of its valid
    cells. Returns ``(features, counts)``: a float64 ``(n_pairs, 7)`` array (NaN where a row has
    no sample) and the number of samples per row.
    """
    if values.ndim != 2 or valid.shape != values.shape:
        raise ConfigError(
            "The 'values' and 'valid' parameters of "
            "window_features must be 2-D arrays of one shape. "
            f"Got {values.shape} and {valid.shape} instead."
        )
    n_rows = values.shape[0]
    out = np.empty((n_rows, N_FEATURES))
    counts = np.empty(n_rows, np.int64)
    for a in range(0, max(n_rows, 1), _CHUNK_ROWS):
        out[a : a + _CHUNK_ROWS], counts[a : a + _CHUNK_ROWS] = _features(
            values[a : a + _CHUNK_ROWS], valid[a : a + _CHUNK_ROWS]
        )
    return out, counts


#: rows per pass: keeps the float64 temporaries of a pass in cache and peak memory small
_CHUNK_ROWS = 8192


def _features(values: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n_rows = values.shape[0]
    counts = valid.sum(axis=1)
    x = np.where(valid, values, np.inf).astype(np.float64, copy=False)
    x.sort(axis=1)  # invalid cells (inf) go last, so the first counts[i] cells are row i's samples
    out = np.full((n_rows, N_FEATURES), np.nan)
    has = counts > 0
    if not has.any():
        return out, counts
    xs = x[has]
    n = counts[has]
    last = n - 1
    rows = np.arange(xs.shape[0])
    for j, q in enumerate(_QUANTILES):
        pos = q * last
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, last)
        frac = pos - lo
        a = xs[rows, lo]
        b = xs[rows, hi]
        # numpy's own lerp form, so results match np.percentile to the last bit in most cases
        out[has, j] = np.where(frac >= 0.5, b - (b - a) * (1 - frac), a + (b - a) * frac)
    finite = np.where(np.isfinite(xs), xs, 0.0)
    mean = finite.sum(axis=1) / n
    dev = np.where(np.isfinite(xs), xs - mean[:, None], 0.0)
    out[has, 3] = xs[:, 0]
    out[has, 4] = mean
    out[has, 5] = np.sqrt((dev * dev).sum(axis=1) / n)
    out[has, 6] = xs[rows, last]
    return out, counts
