"""Traffic-skeleton inference: the endpoint pairs a training job really uses (paper §5.1,
DESIGN §5), from each RNIC's throughput at 1 Hz over a few minutes.

Why it works: every gradient synchronisation is a burst on every RNIC of a DP group at the same
moment, pipeline stages burst one after another (the backward pass reaches them in turn), and
collectives stay on their rail. So, per rail, the RNICs fall into equal-size groups (one per PP
stage) of identical burst timing, ordered by their time shift, and the skeleton of an RNIC is its
group (DP peers) plus its partner in each adjacent group (PP neighbours).

Method, per job (the paper gives no STFT window, hop, distance or linkage; these are ours):

1. **Regime** (STFT). ``scipy.signal.stft`` with a 64 s Hann window and a 16 s hop (75 %
   overlap): 64 s holds at least two iterations of the paper's ~30 s training round, so the burst
   train's fundamental is inside every frame; 16 s is how finely the regime is followed in time.
   Each RNIC's log-magnitude spectrogram is compared with the job's median one by correlation
   distance (1 − Pearson); RNICs that do not share the job's burst regime lower the confidence.
   The iteration period is the autocorrelation peak of the RNIC-averaged power spectrum, and the
   peak's height is the job's **periodicity**: debug jobs have none, and the extra bursts of
   expert-parallel all-to-all lower it.
2. **Time shift.** A magnitude cannot see where in the period a burst sits, which is exactly what
   separates pipeline stages, so each RNIC's shift is the lag of its cross-correlation peak with a
   job template, refined below a second by a parabola and taken on the period circle.
3. **Constrained clustering** (Eq. 1–3: equal group sizes, the size divides N, no two RNICs of a
   host in a group — one RNIC per host and rail is checked up front).

   a. *Rank layout.* Megatron orders ranks TP, then DP, then PP, and pods are numbered by rank,
      so the hypothesis "stage = container rank // DP" is tested: container shifts are cut by
      rank into ``k`` equal blocks for each ``k`` dividing the container count, finest first,
      and ``k`` is accepted only if adjacent blocks differ clearly and in one direction, every
      container sits nearer its own block than half a step, and no block's halves differ (a
      block hiding two stages). Then PP partners follow from the ranks: replica *i* of stage
      *j* feeds replica *i* of stage *j + 1*.
   b. *Otherwise, per rail:* shifts are sorted around the circle, cut at the widest gap and split
      into ``k`` equal groups for each divisor ``k``; the finest split whose every boundary is a
      real gap (wider than the groups' own spread) wins — merging stages only lengthens the list,
      splitting a DP group would miss pairs. PP partners come from residual correlation
      (series minus group mean: a pipeline send leaves the same trace on both ends), by
      assignment (Hungarian), pooled over rails with the same host groups and required to win on
      most rails alone; a row without such evidence keeps the whole adjacent group.
4. **Validation against live bursts.** Each RNIC's correlation with its group's leave-one-out
   mean (do the group's bursts co-occur?), the clarity of the split, agreement of the rails,
   co-bursts that the stage shifts do not explain (all-to-all), and a scan of the residual
   correlation of the same-rail pairs outside the skeleton (a strong one is a missed pair: it is
   added; many mean the structure does not explain the traffic).

The confidence is the weakest of these scores. Below ``min_confidence``, or when the evidence
cannot fit (too little traffic yet, no regular burst train as in debug jobs, expert-parallel
all-to-all, hosts binding different rails as with containers of fewer than 8 RNICs), the result
keeps a safe superset — the same-rail list or, if a peer may sit on another rail, every
cross-host pair of the job — and says why. A missed used pair is worse than a longer list.

Cost per job is a few FFTs per RNIC plus, per rail, sorting and an O(g²) assignment per stage
boundary; the O(n²) scan for missed pairs is limited to rails of ``missed_scan_max`` RNICs.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft
from scipy.optimize import linear_sum_assignment
from scipy.signal import stft

from skh.errors import ConfigError
from skh.model import same_rail_pairs
from skh.records import pair_keys, split_pair_keys

__all__ = [
    "SkeletonParams",
    "Skeleton",
    "infer_skeleton",
    "traffic_changed",
    "pairs_coverage",
]

log = logging.getLogger(__name__)

MODE_SKELETON = "skeleton"
MODE_SAME_RAIL = "fallback_same_rail"
MODE_GROUP_WIDE = "fallback_group_wide"


@dataclass(frozen=True, slots=True)
class SkeletonParams:
    """Knobs of :func:`infer_skeleton`; the defaults are what the module docstring argues for."""

    window_s: int = 64  # STFT window (≥ 2 iterations of a ~30 s round)
    hop_s: int = 16  # STFT hop (change-detector reaction time)
    min_duration_s: int = 90  # below this there are too few iterations to trust
    min_period_s: float = 3.0
    max_period_s: float = 60.0
    min_cycles: float = 3.0  # the series must hold this many periods
    # mean rate below this: no training traffic yet (co-tenant noise)
    idle_bytes_per_s: float = 10e6
    min_periodicity: float = 0.25  # autocorrelation at the period: below = no burst train at all
    # below this: bursts besides the gradient syncs (all-to-all, debug)
    regular_periodicity: float = 0.5
    max_common: float = 0.08  # share of stage traffic in co-bursts the shifts do not explain
    min_coherence: float = 0.3  # correlation with the group's other members
    gap_ratio: float = 3.0  # boundary gap ≥ gap_ratio × the groups' robust lag spread
    min_gap_s: float = 0.3  # and at least this (1 Hz samples resolve ~1/3 s with interpolation)
    pair_z: float = 4.0  # PP partner must beat the null spread by this many sigmas
    pair_margin_z: float = 2.0  # and the runner-up by this many
    missed_z: float = 8.0  # residual correlation outside the skeleton that counts as a missed pair
    missed_scan_max: int = 1024  # scan all same-rail pairs of rails up to this many RNICs
    max_unexplained: float = 0.02  # fraction of RNICs with missed pairs tolerated (they are added)
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


@dataclass(frozen=True, slots=True, eq=False)
class Skeleton:
    """What the controller needs to replace a job's preload list (``apply_skeleton``) and what an
    operator needs to trust it.

    ``pairs`` are ordered (src, dst) endpoint ids, sorted and unique; ``digest`` changes exactly
    when ``pairs`` do, so a controller versions a list by digest and skips re-applying the same
    one. ``group``/``stage`` are per endpoint, aligned with ``ep_id`` (−1 where not inferred);
    groups are numbered job-wide; stages are in rank order when the rank layout is confirmed,
    else in burst order on each rail.
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
# helpers


def _digest(pairs: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(pairs, "<u4").tobytes(), digest_size=8).hexdigest()


def _unique_pairs(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        return np.zeros((0, 2), np.uint32)
    p = np.concatenate(chunks)
    return split_pair_keys(np.unique(pair_keys(p[:, 0], p[:, 1])))


def _all_pairs(ep: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Every ordered pair among ``ep`` on different hosts."""
    a, b = np.meshgrid(np.arange(ep.size), np.arange(ep.size), indexing="ij")
    keep = host[a] != host[b]
    return np.stack([ep[a[keep]], ep[b[keep]]], axis=1)


def _bipartite(ep_a: np.ndarray, ep_b: np.ndarray) -> np.ndarray:
    a, b = np.meshgrid(ep_a, ep_b, indexing="ij")
    a, b = a.ravel(), b.ravel()
    return np.concatenate([np.stack([a, b], 1), np.stack([b, a], 1)])


def pairs_coverage(used: np.ndarray, probed: np.ndarray) -> float:
    """Fraction of ``used`` ordered pairs that ``probed`` contains (1.0 when nothing is used)."""
    used = np.asarray(used, np.uint64).reshape(-1, 2)
    probed = np.asarray(probed, np.uint64).reshape(-1, 2)
    if used.shape[0] == 0:
        return 1.0
    ku = pair_keys(used[:, 0], used[:, 1])
    kp = pair_keys(probed[:, 0], probed[:, 1])
    return float(np.isin(ku, kp).mean())


def _standardize(x: np.ndarray) -> np.ndarray:
    z = x - x.mean(axis=1, keepdims=True)
    sd = z.std(axis=1, keepdims=True)
    return z / np.where(sd > 0, sd, 1.0)


def _parabolic(y_m: np.ndarray, y_0: np.ndarray, y_p: np.ndarray) -> np.ndarray:
    den = y_m - 2.0 * y_0 + y_p
    peaked = den < 0
    off = 0.5 * (y_m - y_p) / np.where(peaked, den, -1.0)
    return np.clip(np.where(peaked, off, 0.0), -0.5, 0.5)


def _clip01(v: float) -> float:
    return float(min(1.0, max(0.0, v)))


# ---------------------------------------------------------------------------------------------
# step 1: regime and period


def _period(power: np.ndarray, t_len: int, params: SkeletonParams) -> tuple[float, float]:
    """Iteration period (s) and periodicity (normalized autocorrelation there) from the mean
    power spectrum; ``(0, 0)`` when no period fits the series."""
    acf = irfft(power, n=2 * (power.size - 1))[:t_len]
    if acf[0] <= 0:
        return 0.0, 0.0
    lags = np.arange(t_len)
    acf = acf / acf[0] * t_len / np.maximum(t_len - lags, 1)  # unbiased
    hi = int(min(params.max_period_s, t_len / params.min_cycles))
    lo = int(np.ceil(params.min_period_s))
    if hi - lo < 2:
        return 0.0, 0.0
    seg = acf[lo - 1 : hi + 2]
    peaks = np.flatnonzero((seg[1:-1] > seg[:-2]) & (seg[1:-1] >= seg[2:])) + lo
    if peaks.size == 0:
        return 0.0, 0.0
    # Multiples of the period peak too, and jitter blurs each lag differently; the biased
    # estimate (fewer overlapping samples at long lags) favours the fundamental, so take the
    # shortest lag whose biased peak is near the highest one.
    biased = acf[peaks] * (t_len - peaks) / t_len
    p = int(peaks[np.argmax(biased >= 0.7 * biased.max())])
    off = float(_parabolic(acf[p - 1 : p], acf[p : p + 1], acf[p + 1 : p + 2])[0])
    return p + off, float(acf[p])


def _atypical(x: np.ndarray, params: SkeletonParams) -> np.ndarray:
    """Per-RNIC correlation distance of its log-magnitude STFT to the job's median one."""
    nper = min(params.window_s, x.shape[1])
    hop = min(params.hop_s, nper)
    _, _, s = stft(
        x,
        nperseg=nper,
        noverlap=nper - hop,
        detrend="constant",
        boundary=None,
        padded=False,
        axis=-1,
    )
    feat = np.log1p(np.abs(s[:, 1:, :]).reshape(x.shape[0], -1).astype(np.float32))
    feat -= feat.mean(axis=1, keepdims=True)
    med = np.median(feat, axis=0)
    med -= med.mean()
    num = feat @ med
    den = np.linalg.norm(feat, axis=1) * np.linalg.norm(med) + 1e-12
    return 1.0 - num / den


# ---------------------------------------------------------------------------------------------
# step 2: time shift


def _lags(z: np.ndarray, period_s: float) -> np.ndarray:
    """Per-row lag (s) of the cross-correlation peak with a job template, in (−P/2, P/2]."""
    n, t_len = z.shape
    nfft = next_fast_len(2 * t_len, real=True)
    f = rfft(z, n=nfft, axis=1)
    # one sample past ±P/2 on each side, so a peak near the edge is still a local maximum; the
    # refined lag is wrapped back onto the period circle
    half = int(np.ceil(period_s / 2)) + 1
    win = np.r_[np.arange(nfft - half, nfft), np.arange(0, half + 1)]  # lags −half..half

    def peak(ref_f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        xc = irfft(f * np.conj(ref_f), n=nfft, axis=1)[:, win]
        i = np.clip(np.argmax(xc[:, 1:-1], axis=1) + 1, 1, win.size - 2)
        rows = np.arange(n)
        off = _parabolic(xc[rows, i - 1], xc[rows, i], xc[rows, i + 1])
        return i - half, off

    # the most periodic-looking row as a first reference, then the aligned mean as a template
    ref = int(np.argmax(np.abs(f[:, 1:]).max(axis=1)))
    lag0, _ = peak(f[ref])
    cols = (np.arange(t_len)[None, :] + lag0[:, None]) % t_len
    template = z[np.arange(n)[:, None], cols].mean(axis=0)
    lag, off = peak(rfft(template, n=nfft))
    return _wrap(lag + off, period_s)


# ---------------------------------------------------------------------------------------------
# step 3: constrained clustering on one rail


@dataclass(frozen=True, slots=True)
class _Split:
    order: np.ndarray  # member indices (into the rail) sorted by unwrapped lag
    k: int
    score: float  # min over boundaries of gap / need, halved and capped at 1 (1 when k = 1)


def _robust_sd(v: np.ndarray) -> np.ndarray:
    med = np.median(v, axis=-1, keepdims=True)
    return 1.4826 * np.median(np.abs(v - med), axis=-1)


def _split_rail(
    lag: np.ndarray, host: np.ndarray, period_s: float, params: SkeletonParams
) -> _Split:
    n = lag.size
    order = np.argsort(lag, kind="stable")
    s = lag[order]
    # unwrap on the period circle at the widest gap, so a stage straddling ±P/2 stays whole
    gaps = np.r_[np.diff(s), s[0] + period_s - s[-1]]
    cut = int(np.argmax(gaps)) + 1
    if cut < n:
        order = np.r_[order[cut:], order[:cut]]
        s = np.r_[s[cut:], s[:cut] + period_s]
    best = _Split(order, 1, 1.0)
    for k in range(2, n + 1):
        if n % k:
            continue
        g = n // k
        blocks = s.reshape(k, g)
        spread = _robust_sd(blocks) if g > 2 else np.ptp(blocks, axis=1) / 2
        gap = blocks[1:, 0] - blocks[:-1, -1]
        need = np.maximum(params.min_gap_s, params.gap_ratio * np.maximum(spread[1:], spread[:-1]))
        if np.all(gap >= need):
            hosts = host[order].reshape(k, g)
            srt = np.sort(hosts, axis=1)
            if g > 1 and np.any(srt[:, 1:] == srt[:, :-1]):
                continue  # two endpoints of one host (shared RNIC) in a group: Eq. 3
            score = _clip01(float(np.min(gap / need)) / 2.0)
            means = blocks.mean(axis=1)
            if k >= 3 and means[0] + period_s - means[-1] <= np.diff(means).max():
                # the stages fill the period evenly: where the pipeline starts is a guess, and a
                # wrong guess would pair non-neighbours
                score = 0.0
            best = _Split(order, k, score)
    return best


# ---------------------------------------------------------------------------------------------
# step 3a: the rank layout (Megatron orders ranks TP, then DP, then PP; pods are numbered by rank)


def _container_rank(
    ep_id: np.ndarray, host: np.ndarray, container: np.ndarray | None
) -> tuple[np.ndarray, int]:
    """Dense container rank per endpoint (0 = first rank)."""
    if container is None:
        hosts, inv = np.unique(host, return_inverse=True)
        first = np.full(hosts.size, np.iinfo(np.int64).max)
        np.minimum.at(first, inv, ep_id.astype(np.int64))
        rank = np.empty(hosts.size, np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(hosts.size)
        return rank[inv], int(hosts.size)
    _, inv = np.unique(container, return_inverse=True)
    return inv.astype(np.int64), int(inv.max()) + 1


def _wrap(v: np.ndarray | float, period_s: float):
    return (np.asarray(v) + period_s / 2) % period_s - period_s / 2


def _circ_mean(lags: np.ndarray, period_s: float, axis: int = -1) -> np.ndarray:
    ang = np.exp(2j * np.pi * lags / period_s)
    return np.angle(ang.mean(axis=axis)) * period_s / (2 * np.pi)


@dataclass(frozen=True, slots=True)
class _Layout:
    stage: np.ndarray  # stage per container rank
    k: int
    score: float


def _rank_layout(
    lag: np.ndarray, cont: np.ndarray, n_cont: int, period_s: float, params: SkeletonParams
) -> _Layout | None:
    """Test the hypothesis "stage = container rank // DP" against the bursts.

    Container shifts (circular mean over its RNICs) are cut by rank into ``k`` equal blocks for
    each ``k`` dividing the container count, finest first; ``k`` is accepted when every pair of
    adjacent blocks differs in mean shift by ``1.5 × pair_z`` standard errors, all in one
    direction (the pipeline order), every container is within 0.3 of a step of its block's shift,
    and no block's two halves differ by more than chance or 0.2 of a step (a block that hides
    several stages would pair the wrong replicas). None when no ``k ≥ 2`` fits.
    """
    if n_cont < 2:
        return None
    ang = np.zeros(n_cont, np.complex128)
    np.add.at(ang, cont, np.exp(2j * np.pi * lag / period_s))
    c_lag = np.angle(ang) * period_s / (2 * np.pi)
    # The RNICs of one container (its TP ranks) belong to one stage, so their spread around the
    # container's shift is the measurement noise; a container shift averages n/n_cont of them.
    per = lag.size / n_cont
    dev = _wrap(lag - c_lag[cont], period_s)
    sigma = max(1.4826 * float(np.median(np.abs(dev))) / np.sqrt(per), 0.02) if per > 1 else 0.3
    for k in range(n_cont, 1, -1):
        if n_cont % k:
            continue
        g = n_cont // k
        blocks = c_lag.reshape(k, g)
        means = _circ_mean(blocks, period_s)
        step = _wrap(np.diff(means), period_s)
        se = sigma * np.sqrt(2.0 / g)
        need = max(params.pair_z * 1.5 * se, params.min_gap_s / 2)
        if np.any(np.abs(step) < need) or not (np.all(step > 0) or np.all(step < 0)):
            continue
        if g >= 2:
            # Every container close to its block's shift, and the block's halves alike: a block
            # that merges m stages spreads over (m − 1)/m of a step and its halves sit half a
            # step apart, while a real stage differs only by noise.
            dev = _wrap(blocks - means[:, None], period_s)
            if np.abs(dev).max() >= 0.3 * np.abs(step).min():
                continue
            h = g // 2
            halves = _wrap(
                _circ_mean(blocks[:, g - h :], period_s) - _circ_mean(blocks[:, :h], period_s),
                period_s,
            )
            if np.any(
                np.abs(halves)
                >= min(params.pair_z * sigma * np.sqrt(2.0 / h), 0.2 * np.abs(step).min())
            ):
                continue
        return _Layout(
            np.repeat(np.arange(k), g), k, _clip01(float(np.abs(step).min() / need) / 2.0)
        )
    return None


def _common_bursts(z: np.ndarray, lag: np.ndarray, blocks: np.ndarray, period_s: float) -> float:
    """How much traffic the stages share beyond their shifted burst trains: the mean covariance,
    across pairs of stages, of each stage's mean series minus the stage-aligned average, as a
    fraction of the stage series' variance.

    About zero for pipeline training (what is left is independent noise and activations); large
    for expert-parallel all-to-all, which bursts on every RNIC of the job at the same instants.
    Needs three stages or more (with two, the two remainders mirror each other); 0 otherwise.
    """
    k = blocks.shape[1]
    if k < 3:
        return 0.0
    members = blocks.transpose(1, 0, 2).reshape(k, -1)  # stage → its endpoints on every rail
    means = z[members].mean(axis=1)
    shift = np.rint(_circ_mean(lag[members], period_s)).astype(np.int64)
    t_len = z.shape[1]
    t = np.arange(t_len)
    aligned = means[np.arange(k)[:, None], (t[None, :] + shift[:, None]) % t_len].mean(axis=0)
    rest = means - aligned[(t[None, :] - shift[:, None]) % t_len]
    edge = int(np.abs(shift).max()) + 1  # samples the circular alignment wrapped around
    if t_len - 2 * edge < 8:
        return 0.0
    rest = rest[:, edge:-edge] - rest[:, edge:-edge].mean(axis=1, keepdims=True)
    cov = rest @ rest.T / rest.shape[1]
    power = float(means[:, edge:-edge].var(axis=1).mean())
    return float(cov[np.triu_indices(k, 1)].mean() / power) if power > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# the entry point


def _validate(ep_id, host, rail, x) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ep_id = np.asarray(ep_id)
    host = np.asarray(host)
    rail = np.asarray(rail)
    x = np.asarray(x, np.float64)
    n = ep_id.shape[0] if ep_id.ndim == 1 else -1
    if n < 0 or host.shape != (n,) or rail.shape != (n,):
        raise ConfigError(
            "The 'ep_id', 'host' and 'rail' parameters of infer_skeleton must be 1-D arrays "
            "of one length. "
            f"Got shapes {ep_id.shape}, {host.shape} and {rail.shape} instead."
        )
    if x.ndim != 2 or x.shape[0] != n:
        raise ConfigError(
            f"The 'bytes_per_s' parameter of infer_skeleton must be an (n, T) array with n = {n}. "
            f"Got shape {x.shape} instead."
        )
    if np.unique(ep_id).size != n:
        raise ConfigError("The 'ep_id' parameter of infer_skeleton must hold unique endpoint ids.")
    if not np.isfinite(x).all():
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    return ep_id.astype(np.uint32), host.astype(np.int64), rail.astype(np.int64), x


def infer_skeleton(
    ep_id: np.ndarray,
    host: np.ndarray,
    rail: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    container: np.ndarray | None = None,
    job: str = "",
    params: SkeletonParams | None = None,
) -> Skeleton:
    """Infer one job's traffic skeleton from its endpoints' throughput series.

    ``ep_id``, ``host`` (any integer host index) and ``rail`` describe the job's ``n`` endpoints;
    ``bytes_per_s`` is ``(n, T)``, one sample per second, aligned in time across endpoints.
    ``container`` is each endpoint's container rank in the job (the pod index a training operator
    gives, ``worker-<i>``, in training-rank order). When the bursts confirm that its contiguous
    blocks are the pipeline stages, replica *i* of a stage is paired with replica *i* of the
    next — unless residual correlation names another partner. Without it, containers are hosts
    in registration order (smallest endpoint id), which may still reveal the stages but not
    the replica order, so PP partners then come from evidence alone.
    """
    params = params or SkeletonParams()
    ep_id, host, rail, x = _validate(ep_id, host, rail, bytes_per_s)
    if container is not None:
        container = np.asarray(container)
        if container.shape != ep_id.shape:
            raise ConfigError(
                "The 'container' parameter of infer_skeleton must have one entry per endpoint "
                f"({ep_id.size}). "
                f"Got shape {container.shape} instead."
            )
    n, t_len = x.shape
    group = np.full(n, -1, np.int32)
    stage = np.full(n, -1, np.int32)

    def result(
        mode: str, reason: str, confidence: float, pairs: np.ndarray, period_s: float, scores
    ) -> Skeleton:
        return Skeleton(
            job,
            mode,
            confidence,
            reason,
            pairs,
            _digest(pairs),
            ep_id,
            group,
            stage,
            period_s,
            dict(scores or {}),
        )

    def fallback(
        mode: str, reason: str, confidence: float, period_s: float = 0.0, scores=None
    ) -> Skeleton:
        pairs = (
            _unique_pairs([_all_pairs(ep_id, host)])
            if mode == MODE_GROUP_WIDE
            else same_rail_pairs(ep_id, rail, host)
        )
        log.info("job %s: %s (%s)", job, mode, reason)
        return result(mode, reason, confidence, pairs, period_s, scores)

    # Structure: a rail-wise skeleton needs every host of the job on the same rails, one
    # endpoint per (host, rail); containers binding different rail sets (fewer than 8 RNICs) may
    # talk across rails.
    rails, rail_inv = np.unique(rail, return_inverse=True)
    hosts = np.unique(host)
    if hosts.size < 2:
        return fallback(
            MODE_SAME_RAIL, "a single host: its traffic stays on NVLink/PCIe, no pair to probe", 1.0
        )
    if n != hosts.size * rails.size or np.unique(host * rails.size + rail_inv).size != n:
        return fallback(
            MODE_GROUP_WIDE,
            f"{hosts.size} hosts do not all bind the same {rails.size} rails once each: "
            "a peer may sit on another rail, so every cross-host pair of the job is kept",
            1.0,
        )
    # Enough traffic?
    if t_len < params.min_duration_s:
        return fallback(
            MODE_SAME_RAIL,
            f"too little traffic yet: {t_len} s of series, need {params.min_duration_s} s",
            0.0,
        )
    # Training starts only once every container is up; keep the span where all RNICs carry
    # traffic (the start of a window may still be the idle wait for the last container).
    active = x > params.idle_bytes_per_s
    seen = active.any(axis=1)
    if not seen.all():
        return fallback(
            MODE_SAME_RAIL,
            f"too little traffic yet: {int((~seen).sum())} of {n} RNICs never above "
            f"{params.idle_bytes_per_s:.0f} B/s",
            0.0,
        )
    start = int(active.argmax(axis=1).max())
    stop = t_len - int(active[:, ::-1].argmax(axis=1).max())
    if stop - start < params.min_duration_s:
        return fallback(
            MODE_SAME_RAIL,
            f"too little traffic yet: all RNICs active for {max(stop - start, 0)} s, "
            f"need {params.min_duration_s} s",
            0.0,
        )
    x = x[:, start:stop]
    t_len = x.shape[1]

    z = _standardize(x)
    nfft = next_fast_len(2 * t_len, real=True)
    power = (np.abs(rfft(z, n=nfft, axis=1)) ** 2).mean(axis=0)
    period_s, periodicity = _period(power, t_len, params)
    scores = {"periodicity": periodicity}
    if period_s == 0.0 or periodicity < params.min_periodicity:
        return fallback(
            MODE_SAME_RAIL,
            f"no regular burst train (periodicity {periodicity:.2f} < {params.min_periodicity}): "
            "debug or all-to-all traffic fits no DP/PP skeleton",
            _clip01(periodicity / params.min_periodicity) * 0.5,
            period_s,
            scores,
        )
    dist = _atypical(x, params)
    lag = _lags(z, period_s)

    cont, n_cont = _container_rank(ep_id, host, container)
    layout = _rank_layout(lag, cont, n_cont, period_s, params)
    # The bursts confirm which containers form a stage, not which replica is which inside it:
    # the partner of replica i is replica i of the next stage only if ranks were given.
    ranked = layout is not None and container is not None
    # Each entry: (stage blocks of one or all rails as an (R, k, g) array of endpoint indices,
    # rows of a block ordered by container rank, and the split's separation score).
    if layout is not None:
        order = np.lexsort((cont, layout.stage[cont], rail_inv))
        splits = [(order.reshape(rails.size, layout.k, -1), layout.score)]
    else:
        splits = []
        for r in range(rails.size):
            idx = np.flatnonzero(rail_inv == r)
            sp = _split_rail(lag[idx], host[idx], period_s, params)
            splits.append((idx[sp.order].reshape(1, sp.k, -1), sp.score))

    pair_chunks: list[np.ndarray] = []
    gid = 0
    coh_all, ks = [], []
    boundaries: list[tuple[np.ndarray, np.ndarray, bool]] = []  # adjacent stages, rank-ordered?
    rail_groups: list[np.ndarray] = []
    for blocks, _ in splits:
        n_r, k, g = blocks.shape
        ks += [k] * n_r
        flat = blocks.reshape(n_r * k, g)
        group[flat] = gid + np.arange(n_r * k)[:, None]
        stage[flat] = np.tile(np.arange(k), n_r)[:, None]
        gid += n_r * k
        rail_groups += list(blocks.reshape(n_r, k * g))
        if g > 1:
            # DP peers: every ordered pair inside a block (hosts differ: one endpoint per host
            # and rail)
            e = ep_id[flat]
            off = ~np.eye(g, dtype=bool)
            a = np.broadcast_to(e[:, :, None], (n_r * k, g, g))[:, off]
            b = np.broadcast_to(e[:, None, :], (n_r * k, g, g))[:, off]
            pair_chunks.append(np.stack([a.ravel(), b.ravel()], axis=1))
            # do the block's bursts co-occur? each member against the mean of the others
            zm = z[flat]
            loo = _standardize(((zm.sum(axis=1, keepdims=True) - zm) / (g - 1)).reshape(-1, t_len))
            coh_all.append((loo * zm.reshape(-1, t_len)).mean(axis=1))
        boundaries += [
            (blocks[r, j], blocks[r, j + 1], ranked) for r in range(n_r) for j in range(k - 1)
        ]
    sep_scores = [sc for _, sc in splits]
    common = float(np.mean([_common_bursts(z, lag, blocks, period_s) for blocks, _ in splits]))

    coherence = np.concatenate(coh_all) if coh_all else np.ones(1)
    # residuals: what is left of each series once its group's common bursts are removed
    by_group = np.argsort(group, kind="stable")
    starts = np.r_[0, np.flatnonzero(np.diff(group[by_group])) + 1]
    sizes = np.diff(np.r_[starts, n])
    means = np.add.reduceat(z[by_group], starts, axis=0) / sizes[:, None]
    resid = z - means[group]
    rn = resid / np.maximum(np.linalg.norm(resid, axis=1, keepdims=True), 1e-12)
    pp_pairs, pp = _pp_neighbours(boundaries, rn, host, ep_id, params, t_len)
    pair_chunks.extend(pp_pairs)
    pairs = _unique_pairs(pair_chunks)

    missed, scanned = _missed_pairs(rail_groups, rn, host, ep_id, group, pairs, params, t_len)
    if missed.shape[0]:
        pairs = _unique_pairs([pairs, missed])
    unexplained = np.unique(missed.ravel()).size / n if missed.size else 0.0

    k_mode = np.bincount(ks).argmax()
    scores.update(
        separation=float(min(sep_scores)),
        coherence=float(np.quantile(coherence, 0.05)),
        rail_agreement=float(np.mean(np.asarray(ks) == k_mode)),
        typical=float(np.mean(dist < 0.5)),
        pp_paired=(pp["ranked"] + pp["evidence"]) / pp["links"] if pp["links"] else 1.0,
        common_bursts=common,
        unexplained=float(unexplained),
    )
    parts = {
        "periodicity": _clip01(periodicity / params.regular_periodicity * 0.5),
        "no all-to-all": _clip01(1.0 - common / params.max_common * 0.5),
        "separation": scores["separation"],
        "coherence": _clip01(scores["coherence"] / params.min_coherence * 0.5)
        if k_mode > 0
        else 1.0,
        "rail agreement": scores["rail_agreement"],
        "typical RNICs": _clip01(scores["typical"] * 2 - 1),
        "explained pairs": _clip01(1.0 - unexplained / params.max_unexplained * 0.5),
    }
    limit = min(parts, key=parts.get)
    confidence = parts[limit]
    why = {
        "periodicity": "traffic besides the gradient syncs blurs the burst train "
        f"(periodicity {periodicity:.2f}): "
        "all-to-all or irregular traffic",
        "no all-to-all": f"the stages share co-bursts their shifts do not explain ({common:.2f}): "
        "expert-parallel all-to-all",
        "separation": "the stage boundaries are not clear",
        "coherence": "some group's bursts do not co-occur "
        f"(5th-percentile coherence {scores['coherence']:.2f})",
        "rail agreement": "the rails disagree on the stage count",
        "typical RNICs": "many RNICs have an atypical burst regime (STFT)",
        "explained pairs": f"{unexplained:.1%} of RNICs correlate with peers outside the skeleton",
    }[limit]
    how = (
        "rank layout confirmed by burst shifts"
        if layout is not None
        else "stages split by burst shift per rail"
    )
    desc = (
        f"period {period_s:.1f} s, {int(k_mode)} stage(s) × "
        f"{n // len(rails) // max(int(k_mode), 1)} RNICs per rail ({how}); PP partners: "
        f"{pp['ranked']} of {pp['links']} links from the rank order, {pp['evidence']} from "
        "residual correlation, the rest keep the whole adjacent group"
        + (
            f" ({pp['contradicted']} where residual correlation contradicts the rank order)"
            if pp["contradicted"]
            else ""
        )
        + (
            f"; {missed.shape[0]} pairs added for unexplained residual correlation"
            if missed.shape[0]
            else ""
        )
        + (f" (scanned {scanned} of {len(rails)} rails)" if scanned < len(rails) else "")
    )
    if confidence < params.min_confidence:
        return fallback(
            MODE_SAME_RAIL,
            f"confidence {confidence:.2f}: {why}; inferred {desc}",
            confidence,
            period_s,
            scores,
        )
    reason = f"{desc}; confidence limited by {limit}: {why}"
    return result(MODE_SKELETON, reason, confidence, pairs, period_s, scores)


# ---------------------------------------------------------------------------------------------
# step 4: PP neighbours, step 5: missed pairs


def _pp_neighbours(
    boundaries: list[tuple[np.ndarray, np.ndarray, bool]],
    rn: np.ndarray,
    host: np.ndarray,
    ep_id: np.ndarray,
    params: SkeletonParams,
    t_len: int,
) -> tuple[list[np.ndarray], dict[str, int]]:
    """Pairs across each stage boundary ``(a, b, ranked)``.

    ``ranked`` boundaries come from a confirmed rank layout: ``a[i]`` feeds ``b[i]``, unless the
    residual evidence names another partner for some row — then the rank order is not the
    pipeline order there and the whole boundary keeps every adjacent-stage peer. Other
    boundaries take the partners the evidence names and the whole adjacent group elsewhere.
    Evidence is pooled over rails with the same host groups.
    """
    null_sd = 1.0 / np.sqrt(t_len)
    pooled: dict[tuple[bytes, bytes], list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]] = {}
    for a, b, ranked in boundaries:
        oa, ob = np.argsort(host[a], kind="stable"), np.argsort(host[b], kind="stable")
        inv_b = np.empty_like(ob)
        inv_b[ob] = np.arange(ob.size)
        key = (host[a[oa]].tobytes(), host[b[ob]].tobytes())
        pooled.setdefault(key, []).append((a[oa], b[ob], inv_b[oa] if ranked else None))
    out: list[np.ndarray] = []
    stats = {"ranked": 0, "evidence": 0, "contradicted": 0, "links": 0}

    def both_ways(ea: np.ndarray, eb: np.ndarray) -> np.ndarray:
        return np.concatenate([np.stack([ea, eb], 1), np.stack([eb, ea], 1)])

    for members in pooled.values():
        per_rail = np.stack([rn[a] @ rn[b].T for a, b, _ in members])
        c = per_rail.mean(axis=0)
        g = c.shape[0]
        if g == 1:
            ok = np.ones(1, bool)  # one RNIC per stage on this rail: its neighbour is the only one
            col = np.zeros(1, np.int64)
        else:
            row, col = linear_sum_assignment(-c)
            best = c[row, col]
            masked = c.copy()
            masked[row, col] = -np.inf
            runner = np.maximum(masked.max(axis=1), masked[:, col].max(axis=0))
            off = c[np.isfinite(masked)]
            # rails sharing host groups share the hosts' timing too, so pooling does not shrink
            # the null: keep the single-series floor
            null = max(null_sd, float(_robust_sd(off))) if off.size > 3 else null_sd
            z = params.pair_z if len(members) > 1 else params.pair_z + 1.0
            ok = (best >= z * null) & (best - runner >= params.pair_margin_z * null)
            if len(members) > 1:
                # the same partner must win on most rails on its own, not just on the average
                agree = (per_rail.argmax(axis=2) == col[None, :]).mean(axis=0)
                ok &= agree >= 0.75
        for a, b, pos in members:
            stats["links"] += g
            if pos is not None:
                if not np.any(ok & (col != pos)):
                    out.append(both_ways(ep_id[a], ep_id[b[pos]]))
                    stats["ranked"] += g
                    continue
                stats["contradicted"] += g
                out.append(_bipartite(ep_id[a], ep_id[b]))
                continue
            if ok.any():
                sel = np.flatnonzero(ok)
                out.append(both_ways(ep_id[a[sel]], ep_id[b[col[sel]]]))
                stats["evidence"] += int(ok.sum())
            if not ok.all():
                # no clear partner: keep every adjacent-stage RNIC of the other group, both ways
                out.append(_bipartite(ep_id[a[~ok]], ep_id[b]))
                taken = np.zeros(b.size, bool)
                taken[col[ok]] = True
                out.append(_bipartite(ep_id[b[~taken]], ep_id[a]))
    return out, stats


def _missed_pairs(
    rail_groups, rn, host, ep_id, group, pairs, params, t_len
) -> tuple[np.ndarray, int]:
    """Same-rail pairs outside ``pairs`` whose residuals correlate strongly: traffic the
    inferred structure does not explain. Rails above ``missed_scan_max`` RNICs are skipped
    (the dense scan is O(n²)); the count of scanned rails is returned."""
    thr = params.missed_z / np.sqrt(t_len)
    have = pair_keys(pairs[:, 0], pairs[:, 1])
    found, scanned = [], 0
    for idx in rail_groups:
        if idx.size > params.missed_scan_max:
            continue
        scanned += 1
        c = rn[idx] @ rn[idx].T
        gi = group[idx]
        c[gi[:, None] == gi[None, :]] = 0.0  # DP peers are in the skeleton already
        i, j = np.nonzero(np.triu(c >= thr, 1))
        if i.size == 0:
            continue
        a, b = idx[i], idx[j]
        keep = host[a] != host[b]
        a, b = ep_id[a[keep]], ep_id[b[keep]]
        cand = np.concatenate([np.stack([a, b], 1), np.stack([b, a], 1)])
        key = pair_keys(cand[:, 0], cand[:, 1])
        pos = np.minimum(np.searchsorted(have, key), have.size - 1)
        found.append(cand[have[pos] != key])
    miss = np.concatenate(found) if found else np.zeros((0, 2), np.uint32)
    return miss.astype(np.uint32), scanned


# ---------------------------------------------------------------------------------------------
# re-inference


def traffic_changed(
    prev: Skeleton,
    ep_id: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    params: SkeletonParams | None = None,
) -> tuple[bool, str]:
    """Cheap check whether a job's traffic no longer fits ``prev`` (re-infer when it says so).

    Changed when the endpoints differ, when a fallback was due to missing traffic and there now
    is some, when the iteration period moved by more than 15 %, or when some group's bursts
    stopped co-occurring (an RNIC's correlation with its group's other members below
    ``min_coherence``). One FFT per RNIC and one pass over the groups.
    """
    params = params or SkeletonParams()
    ep_id = np.asarray(ep_id, np.uint32)
    x = np.nan_to_num(np.asarray(bytes_per_s, np.float64))
    if x.ndim != 2 or x.shape[0] != ep_id.size:
        raise ConfigError(
            "The 'bytes_per_s' parameter of traffic_changed must be an (n, T) array with "
            f"n = {ep_id.size}. "
            f"Got shape {x.shape} instead."
        )
    if not np.array_equal(np.sort(ep_id), np.sort(prev.ep_id)):
        return True, "the job's endpoints changed"
    if prev.mode != MODE_SKELETON:
        if prev.mode == MODE_GROUP_WIDE:
            return False, "irregular rail layout: nothing traffic can change"
        enough = x.shape[1] >= params.min_duration_s and bool(
            np.all(x.mean(axis=1) >= params.idle_bytes_per_s)
        )
        return (
            enough,
            "traffic now available for inference" if enough else "still too little traffic",
        )
    pos = np.searchsorted(ep_id, prev.ep_id, sorter=np.argsort(ep_id))
    x = x[np.argsort(ep_id)[pos]]
    z = _standardize(x)
    nfft = next_fast_len(2 * x.shape[1], real=True)
    period_s, periodicity = _period(
        (np.abs(rfft(z, n=nfft, axis=1)) ** 2).mean(axis=0), x.shape[1], params
    )
    if periodicity < params.min_periodicity or abs(period_s - prev.period_s) > 0.15 * prev.period_s:
        return (
            True,
            f"period {prev.period_s:.1f} s -> {period_s:.1f} s (periodicity {periodicity:.2f})",
        )
    order = np.argsort(prev.group, kind="stable")
    bounds = np.flatnonzero(np.diff(prev.group[order])) + 1
    worst = 1.0
    for members in np.split(order, bounds):
        if members.size < 2 or prev.group[members[0]] < 0:
            continue
        zm = z[members]
        loo = _standardize((zm.sum(axis=0, keepdims=True) - zm) / (members.size - 1))
        worst = min(worst, float((loo * zm).mean(axis=1).min()))
    if worst < params.min_coherence:
        return True, f"a group's bursts no longer co-occur (coherence {worst:.2f})"
    return False, "traffic still fits the skeleton"
