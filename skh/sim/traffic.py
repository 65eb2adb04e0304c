"""Per-RNIC training traffic at 1 Hz: what the underlay agent's VF/representor counters see.

Model (per job; times in virtual seconds):

* Training starts once every container is ready (NCCL needs all ranks), at ``train_start_s``.
* Iteration *k* starts at ``train_start + k·P + jitter_k + straggle_k``: ``P`` is the job's
  iteration period, ``jitter_k`` a few % of P, and with probability ``straggler_p`` a straggler
  rank delays the whole iteration (synchronous training waits for the slowest rank).
* Each DP group all-reduces in one burst near the end of the iteration, at up to
  ``burst_bytes_per_s`` (paper: ~15 Gbps per RNIC) for ``burst_s`` seconds; the backward pass
  reaches stage 0 last, so stage ``s`` of ``PP`` bursts ``(PP − 1 − s)·stage_shift_s`` before
  stage 0 (the shift shrinks when the period is too short to hold all stages).
* Between bursts PP endpoints carry activations to their neighbours: a low rate, on in some
  seconds and off in others (idle between layers). Plain DP jobs are idle between bursts.
* EP jobs add job-wide all-to-all bursts at several times per iteration (one per MoE layer);
  debug jobs send irregular, uncorrelated bursts.
* Multiplicative noise on every burst, plus co-tenant background of a few MB/s on every RNIC.

Randomness is drawn per (seed, job, iteration) and per (seed, second), so the value at a time does
not depend on how the caller steps through time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from skh.errors import ConfigError
from skh.records import empty_counters
from skh.sim.jobs import SimJob
from skh.sim.topology import mix_hash, rng_for

__all__ = ["TrafficModel", "throughput", "counter_batch"]

_U = 1.0 / 2**64


def _unit(h: np.ndarray) -> np.ndarray:
    """uint64 hash → uniform float in [0, 1)."""
    return h.astype(np.float64) * _U


class TrafficModel:
    """The 1 Hz byte rates of every endpoint of some jobs.

    ``rates(t)`` gives the bytes each endpoint sends in ``[t, t + 1)``; ``ep_ids`` says which
    endpoints, in order.
    """

    def __init__(
        self,
        jobs: Sequence[SimJob],
        *,
        seed: int = 0,
        burst_bytes_per_s: float = 15e9 / 8,
        burst_s: tuple[float, float] = (1.0, 3.0),
        stage_shift_s: float = 1.0,
        jitter: float = 0.03,
        straggler_p: float = 0.05,
        straggler_s: float = 2.0,
        pp_bytes_per_s: float = 0.08 * 15e9 / 8,
        pp_on_p: float = 0.5,
        noise_sigma: float = 0.15,
        background_bytes_per_s: float = 2e6,
        ep_layers: int = 6,
    ) -> None:
        if not burst_bytes_per_s > 0 or not 0 < burst_s[0] <= burst_s[1]:
            raise ConfigError(
                "The 'burst_bytes_per_s' and 'burst_s' parameters of TrafficModel must be > 0."
            )
        for nm, v in (("jitter", jitter), ("straggler_p", straggler_p), ("pp_on_p", pp_on_p)):
            if not 0.0 <= v <= 1.0:
                raise ConfigError(
                    f"The '{nm}' parameter of TrafficModel must be in [0, 1]. Got {v!r} instead."
                )
        self.seed = int(seed)
        self.jobs = list(jobs)
        self.burst = float(burst_bytes_per_s)
        self.jitter = float(jitter)
        self.straggler_p = float(straggler_p)
        self.straggler_s = float(straggler_s)
        self.pp_rate = float(pp_bytes_per_s)
        self.pp_on_p = float(pp_on_p)
        self.noise_sigma = float(noise_sigma)
        self.background = float(background_bytes_per_s)
        self.ep_layers = int(ep_layers)
        nj = len(self.jobs)
        sizes = np.array([j.n_endpoints for j in self.jobs], np.int64)
        self.ep_ids = (
            np.concatenate([j.ep_ids for j in self.jobs]) if nj else np.zeros(0, np.uint32)
        ).astype(np.uint32)
        self._job_of = np.repeat(np.arange(nj), sizes)
        rng = rng_for(self.seed, 0x7AFF1C)
        self.period = np.array([j.iteration_s for j in self.jobs], np.float64)
        self.train_start = np.array(
            [float(j.ready_s.max()) if j.n_endpoints else 0.0 for j in self.jobs]
        )
        self.end = np.array([j.end_s for j in self.jobs], np.float64)
        self.kind = np.array(
            [{"train": 0, "ep": 1, "debug": 2}[j.kind] for j in self.jobs], np.int8
        )
        self._job_key = mix_hash(np.arange(nj, dtype=np.uint64), np.uint64(self.seed))
        pp = np.array([j.shape.pp for j in self.jobs], np.int64)
        blen = rng.uniform(burst_s[0], burst_s[1], nj)
        # the burst ends the iteration; the backward pass reaches stage 0 last, so each stage
        # bursts a shift earlier than the one before it (the shift shrinks to fit the period)
        stage = (
            np.concatenate([np.maximum(j.pp_stage, 0) for j in self.jobs])
            if nj
            else np.zeros(0, np.int32)
        )
        room = np.maximum(self.period - blen - 0.5, 0.0)
        shift = np.minimum(stage_shift_s, room / np.maximum(pp - 1, 1))
        self._stage_off = room[self._job_of] - stage * shift[self._job_of]
        self._blen = blen[self._job_of]
        self._has_pp = (pp[self._job_of] > 1) & (self.kind[self._job_of] != 2)
        self._amp = self.burst * rng.uniform(0.7, 1.0, nj)[self._job_of]
        self._ep_jobs = np.flatnonzero(self.kind == 1)
        self._dbg_eps = np.flatnonzero(self.kind[self._job_of] == 2)
        #: (k0, iteration starts of k0 - 1, k0, k0 + 1) of the last rates() call
        self._starts: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def n(self) -> int:
        return int(self.ep_ids.size)

    def _iter_start(self, k: np.ndarray) -> np.ndarray:
        """Start of iteration k of every job (k: int64, ``(..., jobs)``)."""
        tag = np.array([1, 2], np.uint64).reshape((2,) + (1,) * k.ndim)
        h1, h2 = _unit(mix_hash(self._job_key, k.astype(np.uint64), tag))
        jit = (h1 * 2 - 1) * self.jitter * self.period
        strag = np.where(
            h2 < self.straggler_p, self.straggler_s * (0.5 + h2 / max(self.straggler_p, 1e-12)), 0.0
        )
        return self.train_start + k * self.period + jit + strag

    def rates(self, t_s: float) -> np.ndarray:
        """Bytes each endpoint (``ep_ids`` order) sends in ``[t_s, t_s + 1)``; float64."""
        n = self.n
        out = np.zeros(n, np.float64)
        if n == 0:
            return out
        t = float(t_s)
        jo = self._job_of
        # per job first (few), then gathered per endpoint
        k0 = np.floor((t - self.train_start) / self.period).astype(np.int64)
        live = ((t + 1 > self.train_start) & (t < self.end))[jo]
        # the previous, current and next iteration of every job; they change once a period, so
        # the last ones are kept
        if self._starts is None or not np.array_equal(self._starts[0], k0):
            k = k0 + np.array([[-1], [0], [1]])
            self._starts = (k0, np.where(k >= 0, self._iter_start(np.maximum(k, 0)), np.inf))
        b0 = self._starts[1][:, jo] + self._stage_off
        ov = np.clip(np.minimum(b0 + self._blen, t + 1) - np.maximum(b0, t), 0.0, 1.0)
        for row in ov:
            out += row * self._amp
        in_burst = (ov > 0).any(axis=0)
        rng = rng_for(self.seed, 0x1B5, int(np.floor(t * 1000)))
        u = rng.random(n)
        # pipeline activations between bursts: on in some seconds, off in others
        pp_on = self._has_pp & ~in_burst & (u < self.pp_on_p)
        out += np.where(pp_on, self.pp_rate * (0.5 + u), 0.0)
        if self._ep_jobs.size:
            # EP: job-wide all-to-all bursts at layer times inside the iteration
            j = self._ep_jobs
            kk = np.maximum(k0[j], 0)
            phase = t - (self.train_start[j] + kk * self.period[j])
            layer = np.arange(100, 100 + self.ep_layers, dtype=np.uint64)[:, None]
            at = _unit(mix_hash(self._job_key[j], kk.astype(np.uint64), layer))
            at *= self.period[j] * 0.8
            hit = ((phase >= at - 0.5) & (phase < at + 0.5)).sum(axis=0, dtype=np.float64)
            per_job = np.zeros(self.period.size)
            per_job[j] = hit
            out += 0.4 * self._amp * per_job[jo]
        if self._dbg_eps.size:
            d = self._dbg_eps
            on = rng.random(d.size) < 0.1
            out[d] = np.where(on, 0.2 * self._amp[d] * rng.random(d.size), 0.0)
        out *= rng.lognormal(0.0, self.noise_sigma, n)
        out = np.where(live, out, 0.0)
        out += rng.exponential(self.background, n)
        return out

    def matrix(self, t0_s: float, duration_s: int) -> np.ndarray:
        """``rates`` at ``t0_s, t0_s + 1, ...``: an ``(n, duration_s)`` float64 matrix."""
        if not isinstance(duration_s, int | np.integer) or duration_s < 1:
            raise ConfigError(
                f"The 'duration_s' parameter of TrafficModel.matrix must be an int >= 1. "
                f"Got {duration_s!r} instead."
            )
        out = np.empty((self.n, int(duration_s)), np.float64)
        for i in range(int(duration_s)):
            out[:, i] = self.rates(t0_s + i)
        return out


def throughput(
    job: SimJob | Sequence[SimJob],
    duration_s: int,
    seed: int = 0,
    *,
    t0_s: float | None = None,
    **model_kw: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-endpoint bytes per second of one job (or several) at 1 Hz.

    Returns ``(ep_ids uint32[n], bytes_per_s float64[n, duration_s])``. ``t0_s`` defaults to the
    moment the (first) job starts training (all its containers ready). Extra keywords go to
    :class:`TrafficModel`.
    """
    jobs = [job] if isinstance(job, SimJob) else list(job)
    model = TrafficModel(jobs, seed=seed, **model_kw)  # type: ignore[arg-type]
    if t0_s is None:
        t0_s = float(model.train_start.min()) if jobs else 0.0
    return model.ep_ids, model.matrix(float(np.floor(t0_s)), duration_s)


def counter_batch(
    ep_ids: np.ndarray,
    t_ns: int,
    tx_total: np.ndarray,
    rx_total: np.ndarray,
    *,
    oper_up: np.ndarray | None = None,
    tx_dropped: np.ndarray | None = None,
    rx_dropped: np.ndarray | None = None,
) -> np.ndarray:
    """One ``COUNTER_DTYPE`` batch of cumulative counters sampled at ``t_ns``."""
    out = empty_counters(len(ep_ids))
    out["ep"] = ep_ids
    out["t_ns"] = t_ns
    out["oper_up"] = 1 if oper_up is None else oper_up
    out["tx_bytes"] = tx_total
    out["rx_bytes"] = rx_total
    if tx_dropped is not None:
        out["tx_dropped"] = tx_dropped
    if rx_dropped is not None:
        out["rx_dropped"] = rx_dropped
    return out
