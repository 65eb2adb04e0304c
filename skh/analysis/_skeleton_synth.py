"""A small, controllable traffic model for testing skeleton inference.

The simulator (``skh.sim``) is the production-scale source of jobs and traffic; this module is the
minimal model the unit tests of :mod:`skh.analysis.skeleton` need to set one knob at a time (noise,
stage shift, stragglers, duration) and to know the exact ground truth.

Model (per job, 1 Hz output, built on a 0.1 s grid then summed per second):

* GPU rank ``g = t + tp*(d + dp*s)`` (TP fastest, then DP, then PP, as Megatron orders them);
  GPU ``g`` sits on host ``g // 8`` and uses the RNIC of rail ``g % 8``; one endpoint per GPU.
* Every iteration, each PP stage's DP all-reduce is one burst; stages burst ``stage_shift_s``
  apart, the last stage first (backward order). In an iteration with a straggling replica
  (probability ``straggler_p``) everybody's all-reduce waits for it, and its own pipeline sends
  are late.
* Pipeline sends between stage ``s`` and ``s+1`` of replica ``d`` are short messages at
  replica-specific times, seen by both ends (the sender's tx is the receiver's rx).
* Noise: multiplicative on bursts, additive co-tenant background per RNIC.

Ground truth: DP peers (same stage and TP rank, same rail, other host) and PP neighbours (same TP
rank and replica, adjacent stage, same rail, other host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SynthJob", "synth_job"]

_FINE = 10  # sub-steps per second
_BYTES = 1.875e9  # 15 Gbit/s, the paper's burst peak


@dataclass(frozen=True, slots=True)
class SynthJob:
    ep_id: np.ndarray  # (n,) uint32
    host: np.ndarray  # (n,) int32
    rail: np.ndarray  # (n,) int32
    stage: np.ndarray  # (n,) int32, ground truth
    bytes_per_s: np.ndarray  # (n, T) float64
    used_pairs: np.ndarray  # (m, 2) uint32, ordered, sorted


def _train_series(
    rng, tp, pp, dp, duration_s, period_s, stage_shift_s, burst_s, noise, p2p_level, straggler_p
):
    n_fine = duration_s * _FINE
    n_iter = int(duration_s / period_s) + 2
    starts = (
        np.cumsum(period_s * (1.0 + 0.02 * rng.standard_normal(n_iter))) - period_s * rng.random()
    )
    late = np.zeros((n_iter, dp))
    slow = np.flatnonzero(rng.random(n_iter) < straggler_p)  # iterations with a straggling replica
    late[slow, rng.integers(0, dp, slow.size)] = rng.uniform(1.0, 3.0, slow.size)
    allreduce = np.zeros((pp, n_fine))
    p2p = np.zeros((dp, max(pp - 1, 0), n_fine))
    width = max(1, int(round(burst_s * _FINE)))
    # the backward pass crosses every stage within one iteration: shrink the shift to fit
    stage_shift_s = min(stage_shift_s, (period_s - burst_s - 1.0) / max(pp - 1, 1))
    for k, t0 in enumerate(starts):
        sync = t0 + late[k].max()
        for s in range(pp):
            i = int(round((sync + 0.6 * period_s + (pp - 1 - s) * stage_shift_s) * _FINE))
            lo, hi = max(i, 0), min(i + width, n_fine)
            if lo < hi:
                allreduce[s, lo:hi] += 1.0 + 0.05 * rng.standard_normal()
        for d in range(dp):
            for s in range(pp - 1):
                # forward microbatch sends, at times only this replica's pipeline knows
                times = t0 + late[k, d] + s * 0.3 + np.sort(rng.uniform(0, 0.5 * period_s, 8))
                idx = np.round(times * _FINE).astype(np.int64)
                idx = idx[(idx >= 0) & (idx < n_fine)]
                np.add.at(p2p[d, s], idx, p2p_level * _FINE)
    coarse = lambda a: a.reshape(*a.shape[:-1], duration_s, _FINE).sum(-1) / _FINE  # noqa: E731
    allreduce, p2p = coarse(allreduce), coarse(p2p)
    g = np.arange(tp * pp * dp)
    d = (g // tp) % dp
    s = g // (tp * dp)
    x = allreduce[s] * (1.0 + noise * rng.standard_normal((g.size, 1)))
    if pp > 1:
        x += np.where((s < pp - 1)[:, None], p2p[d, np.minimum(s, pp - 2)], 0.0)
        x += np.where((s > 0)[:, None], p2p[d, np.maximum(s - 1, 0)], 0.0)
    x += noise * np.abs(rng.standard_normal(x.shape))
    return x


def synth_job(
    tp: int = 8,
    pp: int = 8,
    dp: int = 8,
    *,
    kind: str = "train",
    duration_s: int = 240,
    period_s: float = 20.0,
    stage_shift_s: float = 1.5,
    burst_s: float = 2.0,
    noise: float = 0.1,
    p2p_level: float = 0.1,
    straggler_p: float = 0.05,
    seed: int = 0,
) -> SynthJob:
    """One job's endpoints, throughput and ground truth; ``kind`` is ``train``, ``debug`` (irregular
    traffic between random same-rail peers) or ``idle`` (no traffic yet)."""
    rng = np.random.default_rng(seed)
    g = np.arange(tp * pp * dp)
    host, rail = (g // 8).astype(np.int32), (g % 8).astype(np.int32)
    t, d, s = g % tp, (g // tp) % dp, g // (tp * dp)
    a, b = np.meshgrid(g, g, indexing="ij")
    a, b = a.ravel(), b.ravel()
    same_rail = (rail[a] == rail[b]) & (host[a] != host[b])
    dp_peer = (s[a] == s[b]) & (t[a] == t[b])
    pp_peer = (np.abs(s[a] - s[b]) == 1) & (t[a] == t[b]) & (d[a] == d[b])
    if kind == "train":
        x = _train_series(
            rng,
            tp,
            pp,
            dp,
            duration_s,
            period_s,
            stage_shift_s,
            burst_s,
            noise,
            p2p_level,
            straggler_p,
        )
        used = same_rail & (dp_peer | pp_peer)
    elif kind == "debug":
        on = rng.random((g.size, duration_s)) < 0.2
        x = on * rng.uniform(0.1, 1.0, (g.size, duration_s)) + noise * np.abs(
            rng.standard_normal((g.size, duration_s))
        )
        used = same_rail & (rng.random(a.size) < 0.3)
    elif kind == "idle":
        x = 1e-4 * np.abs(rng.standard_normal((g.size, duration_s)))
        used = same_rail & (dp_peer | pp_peer)
    else:
        raise ValueError(
            f"The 'kind' parameter of synth_job must be train, debug or idle. Got {kind!r} instead."
        )
    pairs = np.stack([a[used], b[used]], axis=1).astype(np.uint32)
    return SynthJob(
        ep_id=g.astype(np.uint32),
        host=host,
        rail=rail,
        stage=s.astype(np.int32),
        bytes_per_s=x * _BYTES,
        used_pairs=pairs,
    )
