"""Stage 1: the iteration period and each RNIC's burst regime, from the spectrum."""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import as_strided
from scipy.fft import irfft, next_fast_len, rfft
from scipy.signal import get_window

from skh.analysis.skeleton.model import SkeletonParams, median, parabolic

__all__ = ["per_second", "period", "atypical"]


def per_second(x: np.ndarray, hz: float) -> tuple[np.ndarray, float]:
    """Samples summed into whole seconds, and the new rate (unchanged at 1 Hz or slower): the
    iteration period and the burst regime are seconds-scale, and ten times fewer samples make
    their FFTs ten times cheaper."""
    f = int(hz)
    if f <= 1 or abs(hz - f) > 1e-9:
        return x, hz
    t = x.shape[1] // f
    return x[:, : t * f].reshape(x.shape[0], t, f).sum(axis=2), 1.0


def period(z: np.ndarray, hz: float, params: SkeletonParams) -> tuple[float, float]:
    """Iteration period (s) and periodicity (normalized autocorrelation there) of standardized
    series ``z`` sampled at ``hz``, from the RNIC-averaged power spectrum; ``(0, 0)`` when no
    period fits the series."""
    t_len = z.shape[1]
    nfft = next_fast_len(2 * t_len, real=True)
    power = (np.abs(rfft(z, n=nfft, axis=1)) ** 2).mean(axis=0)
    acf = irfft(power, n=nfft)[:t_len]
    if acf[0] <= 0:
        return 0.0, 0.0
    lags = np.arange(t_len)
    acf = acf / acf[0] * t_len / np.maximum(t_len - lags, 1)  # unbiased
    hi = int(min(params.max_period_s * hz, t_len / params.min_cycles))
    lo = int(np.ceil(params.min_period_s * hz))
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
    off = float(parabolic(acf[p - 1 : p], acf[p : p + 1], acf[p + 1 : p + 2])[0])
    return (p + off) / hz, float(acf[p])


@functools.lru_cache(maxsize=16)
def _hann(n: int) -> np.ndarray:
    return get_window("hann", n)


def atypical(x: np.ndarray, hz: float, params: SkeletonParams) -> np.ndarray:
    """Per-RNIC correlation distance of its log-magnitude STFT to the job's median one: an RNIC
    that does not share the job's burst regime is far from it."""
    nper = min(max(int(params.window_s * hz), 2), x.shape[1])
    hop = min(max(int(params.hop_s * hz), 1), nper)
    # the STFT by hand (scipy.signal.stft's defaults: periodic Hann window, each segment's mean
    # removed, spectrum scaling): the same values without its per-call machinery, which cost
    # more than the FFTs on the small series of a job. The frequency-by-segment order of the
    # features does not matter to the correlation below, as long as every RNIC has the same.
    # every hop-th window of nper samples, as a view (sliding_window_view's, without its checks)
    n_seg = (x.shape[1] - nper) // hop + 1
    step = x.strides[1]
    frames = as_strided(x, (x.shape[0], n_seg, nper), (x.strides[0], hop * step, step))
    frames = frames - frames.mean(axis=2, keepdims=True)
    win = _hann(nper)
    s = rfft(frames * win, axis=2) / win.sum()
    feat = np.log1p(np.abs(s[:, :, 1:]).reshape(x.shape[0], -1).astype(np.float32))
    feat -= feat.mean(axis=1, keepdims=True)
    med = median(feat, axis=0)
    med -= med.mean()
    num = feat @ med
    den = np.linalg.norm(feat, axis=1) * np.linalg.norm(med) + 1e-12
    return 1.0 - num / den
