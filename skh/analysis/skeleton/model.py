"""The result of skeleton inference, its parameters and the pair-list helpers every stage uses."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from skh.errors import ConfigError
from skh.records import pair_keys, split_pair_keys

__all__ = [
    "MODE_SKELETON",
    "MODE_SAME_RAIL",
    "MODE_GROUP_WIDE",
    "SkeletonParams",
    "Skeleton",
    "pairs_coverage",
]

MODE_SKELETON = "skeleton"
MODE_SAME_RAIL = "fallback_same_rail"
MODE_GROUP_WIDE = "fallback_group_wide"


@dataclass(frozen=True, slots=True)
class SkeletonParams:
    """Knobs of :func:`~skh.analysis.skeleton.infer_skeleton`; the package docstring argues for
    the defaults. Durations are in seconds whatever the sampling rate."""

    window_s: int = 64  # STFT window (≥ 2 iterations of a ~30 s round)
    hop_s: int = 16  # STFT hop (change-detector reaction time)
    min_duration_s: int = 90  # below this there are too few iterations to trust
    min_period_s: float = 3.0
    max_period_s: float = 60.0
    min_cycles: float = 3.0  # the series must hold this many periods
    # mean rate below this: no training traffic yet (co-tenant noise)
    idle_bytes_per_s: float = 10e6
    lag_window: float = 0.25  # stage shifts are searched within ± this share of the period
    min_coherence: float = 0.3  # correlation with the group's other members
    gap_ratio: float = 3.0  # boundary gap ≥ gap_ratio × the groups' robust lag spread
    min_gap_s: float = 0.005  # and at least this (lags are sub-sample precise over many bursts)
    fingerprint_s: float = 2.0  # window of one timing-offset estimate (≥ 5 samples)
    pair_z: float = 5.0  # a partner found from traffic must beat the null by this many sigmas
    pair_margin_z: float = 2.5  # and the runner-up by this many
    confirm_z: float = 3.0  # a rank hint's partner must beat the null by this many sigmas
    min_confidence: float = 0.5

    def __post_init__(self) -> None:
        if not (
            isinstance(self.window_s, int)
            and isinstance(self.hop_s, int)
            and 0 < self.hop_s <= self.window_s
        ):
            raise ConfigError(
                "The 'hop_s' and 'window_s' parameters of SkeletonParams must be ints with "
                f"0 < hop_s <= window_s. "
                f"Got {self.hop_s!r} and {self.window_s!r} instead."
            )
        if not 0 < self.min_period_s < self.max_period_s:
            raise ConfigError(
                f"The 'min_period_s' parameter of SkeletonParams must be > 0 and < max_period_s. "
                f"Got {self.min_period_s!r} and {self.max_period_s!r} instead."
            )
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ConfigError(
                "The 'min_confidence' parameter of SkeletonParams must be in [0, 1]. "
                f"Got {self.min_confidence!r} instead."
            )
        if not 0.0 < self.lag_window <= 0.5:
            raise ConfigError(
                "The 'lag_window' parameter of SkeletonParams must be in (0, 0.5]. "
                f"Got {self.lag_window!r} instead."
            )
        if not self.fingerprint_s > 0:
            raise ConfigError(
                "The 'fingerprint_s' parameter of SkeletonParams must be > 0. "
                f"Got {self.fingerprint_s!r} instead."
            )


@dataclass(frozen=True, slots=True, eq=False)
class Skeleton:
    """What the controller needs to replace a job's preload list (``apply_skeleton``) and what an
    operator needs to trust it.

    ``pairs`` are ordered (src, dst) endpoint ids, sorted and unique; ``digest`` changes exactly
    when ``pairs`` do, so a controller versions a list by digest and skips re-applying the same
    one. ``group``/``stage`` are per endpoint, aligned with ``ep_id`` (−1 where not inferred);
    groups are numbered job-wide; stages are in burst order (the last pipeline stage, whose
    gradients are ready first, is stage 0). ``hint`` says what became of the rank hint:
    ``none``, ``confirmed``, ``partly confirmed``, ``unconfirmed`` (traffic too weak to tell:
    not used) or ``contradicted`` (dropped).
    """

    job: str
    mode: str  # "skeleton" | "fallback_same_rail" | "fallback_group_wide"
    confidence: float
    reason: str
    pairs: np.ndarray  # (m, 2) uint32
    digest: str
    ep_id: np.ndarray  # (n,) uint32
    group: np.ndarray  # (n,) int32
    stage: np.ndarray  # (n,) int32
    period_s: float  # iteration period (0 when unknown)
    # the validation scores behind confidence
    scores: dict[str, float] = field(default_factory=dict)
    hint: str = "none"
    # partner evidence per stage boundary, for the next window (``infer_skeleton(prior=...)``)
    evidence: dict = field(default_factory=dict, repr=False)

    @property
    def confident(self) -> bool:
        return self.mode == MODE_SKELETON

    def replaces(self, applied_digest: str | None) -> bool:
        """Whether this list should replace the one applied (``None``: still the preload list).

        A changed list always does — also a fallback replacing a skeleton, so a job whose
        traffic stopped fitting gets its safe list back; a same-rail fallback before any
        skeleton is the preload list itself. Give each applied list the next version.
        """
        if applied_digest is None:
            return self.mode != MODE_SAME_RAIL
        return self.digest != applied_digest

    @property
    def n_stages(self) -> int:
        return int(self.stage.max()) + 1 if self.stage.size and self.stage.max() >= 0 else 0


# ---------------------------------------------------------------------------------------------
# helpers shared by the stages


def digest(pairs: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(pairs, "<u4").tobytes(), digest_size=8).hexdigest()


def unique_pairs(chunks: list[np.ndarray]) -> np.ndarray:
    chunks = [c for c in chunks if c.size]
    if not chunks:
        return np.zeros((0, 2), np.uint32)
    p = np.concatenate(chunks).astype(np.uint64)
    return split_pair_keys(np.unique(pair_keys(p[:, 0], p[:, 1])))


def all_pairs(ep: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Every ordered pair among ``ep`` on different hosts."""
    a, b = np.meshgrid(np.arange(ep.size), np.arange(ep.size), indexing="ij")
    keep = host[a] != host[b]
    return np.stack([ep[a[keep]], ep[b[keep]]], axis=1)


def bipartite(ep_a: np.ndarray, ep_b: np.ndarray) -> np.ndarray:
    """Every pair between ``ep_a`` and ``ep_b``, both ways."""
    a, b = np.meshgrid(ep_a, ep_b, indexing="ij")
    a, b = a.ravel(), b.ravel()
    return np.concatenate([np.stack([a, b], 1), np.stack([b, a], 1)])


def both_ways(ea: np.ndarray, eb: np.ndarray) -> np.ndarray:
    return np.concatenate([np.stack([ea, eb], 1), np.stack([eb, ea], 1)])


def pairs_coverage(used: np.ndarray, probed: np.ndarray) -> float:
    """Fraction of ``used`` ordered pairs that ``probed`` contains (1.0 when nothing is used)."""
    used = np.asarray(used, np.uint64).reshape(-1, 2)
    probed = np.asarray(probed, np.uint64).reshape(-1, 2)
    if used.shape[0] == 0:
        return 1.0
    ku = pair_keys(used[:, 0], used[:, 1])
    kp = pair_keys(probed[:, 0], probed[:, 1])
    return float(np.isin(ku, kp).mean())


def standardize(x: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """Each series (last axis) less its mean, over its standard deviation (left as it is where
    it has none): ``z / z.std()`` to the bit, as ``z.std()`` computes it (its own mean of ``z``,
    the squares summed), in one temporary and in place, without a third copy of the series.
    ``inplace``: in ``x`` itself (a temporary of the caller's)."""
    n = x.shape[-1]
    # np.add.reduce is what mean, std and sum reduce with, without their wrappers
    z = np.subtract(x, np.add.reduce(x, axis=-1, keepdims=True) / n, out=x if inplace else None)
    d = z - np.add.reduce(z, axis=-1, keepdims=True) / n
    np.multiply(d, d, out=d)
    sd = np.sqrt(np.add.reduce(d, axis=-1, keepdims=True) / n)
    return np.divide(z, np.where(sd > 0, sd, 1.0), out=z)


def median(a: np.ndarray, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """``np.median(a, axis)`` of non-empty ``a`` without NaN: the same values (the middle one,
    or the middle two summed and halved; a zero's sign aside) from one sort, without the
    generic function's machinery, which costs more than the work on a job's few rows (on
    their short series a vectorised sort beats numpy's partition, which median uses)."""
    n = a.shape[axis]
    m = n // 2
    s = np.sort(a, axis=axis)
    if n % 2:
        out = np.take(s, [m], axis=axis)
    else:
        out = (np.take(s, [m - 1], axis=axis) + np.take(s, [m], axis=axis)) / 2
    return out if keepdims else np.squeeze(out, axis)[()]


def quantile(v: np.ndarray, q: float) -> float:
    """``np.quantile(v, q)`` (linear interpolation) of a non-empty 1-D ``v`` without NaN, to
    the bit (numpy's interpolation: from the upper neighbour when the fraction is one half or
    more), from one sort (as :func:`median`)."""
    n = v.size
    pos = (n - 1) * q
    lo = int(np.floor(pos))
    if pos >= n - 1:
        return float(v.max())
    s = np.sort(v)
    a, b = s[lo], s[lo + 1]  # in v's precision, as numpy's
    frac = pos - lo
    return float(b - (b - a) * (1 - frac) if frac >= 0.5 else a + (b - a) * frac)


def row_quantiles(a: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """``np.quantile(a, qs, axis=1)`` (linear interpolation) of a 2-D array from one sort (as
    :func:`median`): the generic function's machinery costs more than the work on a job's few
    rows."""
    m = a.shape[1]
    pos = [q * (m - 1) for q in qs]  # a few numbers: Python's arithmetic, numpy's values
    lo = [math.floor(p) for p in pos]
    hi = [min(i + 1, m - 1) for i in lo]
    s = np.sort(a, axis=1)
    frac = np.array([p - i for p, i in zip(pos, lo, strict=True)])
    return (s[:, lo] + (s[:, hi] - s[:, lo]) * frac).T


def robust_sd(v: np.ndarray, axis: int = -1) -> np.ndarray:
    med = median(v, axis=axis, keepdims=True)
    return 1.4826 * median(np.abs(v - med), axis=axis)


def parabolic(y_m: np.ndarray, y_0: np.ndarray, y_p: np.ndarray) -> np.ndarray:
    """Sub-sample offset of a peak from three samples around it, in [−0.5, 0.5]."""
    den = y_m - 2.0 * y_0 + y_p
    peaked = den < 0
    off = 0.5 * (y_m - y_p) / np.where(peaked, den, -1.0)
    return np.clip(np.where(peaked, off, 0.0), -0.5, 0.5)


def clip01(v: float) -> float:
    return float(min(1.0, max(0.0, v)))
