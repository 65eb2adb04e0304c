"""Long-term check: slow drifts of a pair's latency, block against block.

Healthy RTTs of a pair are modelled as log-normal, ``ln X ~ N(mu, sigma^2)`` (paper §5.2). Time is
cut into blocks (30 min). Each block keeps only ``n, sum ln x, sum (ln x)^2`` per pair, so a fit
is three numbers and a block costs 24 bytes per pair. When a block closes it is tested against
the blocks 1, 2 and 3 before it (the paper's T+0.5 h, T+1 h, T+1.5 h against T) with a one-sided
Z-test on the mean of ``ln x``::

    z = (mean_new - mu_ref) / (sigma_ref / sqrt(n_new))

With thousands of samples per block any shift is "significant", so a pair is flagged only when,
against at least one reference, all three hold:

- ``z >= z_crit`` (default 5: with 360K pairs × 3 tests per block, a Gaussian tail of 3e-7 keeps
  the expected false alarms from chance alone near 0.3 per block), and
- Cohen's ``d = (mean_new - mu_ref) / sigma_ref >= min_effect_d`` (default 0.5, a medium effect:
  the new block's typical sample sits half a healthy spread above the old one), and
- the median ratio ``exp(mean_new - mu_ref) - 1 >= min_rel_increase`` (default 5 %: on a 10 µs
  RoCE RTT that is 0.5 µs, a tenth of the shift the paper calls harmful).

Only increases count: lower latency is not a failure. Samples autocorrelate, so z alone would
overstate confidence; the two effect-size floors are what keep steady pairs quiet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError

__all__ = ["LongTermConfig", "LongTermFlags", "LongTermState"]


@dataclass(frozen=True, slots=True)
class LongTermConfig:
    block_s: float = 1800.0
    #: reference lags in blocks: 1, 2, 3 blocks back = T+0.5 h, T+1 h, T+1.5 h for 30-min blocks
    lags: tuple[int, ...] = (1, 2, 3)
    z_crit: float = 5.0
    min_effect_d: float = 0.5
    min_rel_increase: float = 0.05
    #: samples a block needs before it can serve as a reference or be tested: a fifth of a
    #: 30-min block at one sample a second (a pair probed every 5 s still has them). A pair
    #: that began 40 s before its first block closed had 37 samples there, 6 % under its
    #: usual mean, and the next block was "up 6 %, z = 52.7" (field draw 982641095 +
    #: 1893097845, once the analyzer kept every sample the agents forwarded)
    min_samples: int = 360

    def __post_init__(self) -> None:
        if not self.block_s > 0:
            raise ConfigError(
                "The 'block_s' parameter of LongTermConfig must be > "
                f"0. Got {self.block_s!r} instead."
            )
        if not self.lags or min(self.lags) < 1:
            raise ConfigError(
                "The 'lags' parameter of LongTermConfig must be positive "
                f"block counts. Got {self.lags!r} instead."
            )
        if self.min_samples < 2:
            raise ConfigError(
                "The 'min_samples' parameter of LongTermConfig must be "
                f">= 2. Got {self.min_samples!r} instead."
            )


@dataclass(frozen=True, slots=True)
class LongTermFlags:
    """Pairs flagged when one block closed, with the strongest reference's numbers."""

    block: int
    pids: np.ndarray
    z: np.ndarray
    effect_d: np.ndarray
    rel_increase: np.ndarray
    lag_blocks: np.ndarray


class LongTermState:
    """Per-pair block sums in a ring of ``max(lags) + 1`` blocks."""

    def __init__(self, config: LongTermConfig, n_pairs: int = 0) -> None:
        self.config = config
        self._ring = max(config.lags) + 1
        self._dtype = np.dtype(
            [
                ("n", "<f8", (self._ring,)),
                ("s1", "<f8", (self._ring,)),
                ("s2", "<f8", (self._ring,)),
            ]
        )
        self.state = np.zeros(n_pairs, self._dtype)
        #: block index held by each ring slot (-1: none); global, all pairs share block boundaries
        self.slot_block = np.full(self._ring, -1, np.int64)
        self.block_ns = int(config.block_s * 1e9)

    def resize(self, n_pairs: int) -> None:
        grown = np.zeros(n_pairs, self._dtype)
        keep = min(n_pairs, len(self.state))
        grown[:keep] = self.state[:keep]
        self.state = grown

    def take(self, keep: np.ndarray) -> None:
        """Keep only the pairs ``keep`` (old ids), renumbered 0..len(keep)-1."""
        self.state = self.state[keep]

    def clear_pairs(self, pids: np.ndarray) -> None:
        self.state[pids] = np.zeros(1, self._dtype)

    def add(
        self, pids: np.ndarray, t_ns: np.ndarray, rtt_us: np.ndarray, closed_before_block: int
    ) -> None:
        """Accumulate OK samples; samples of blocks already tested (``< closed_before_block``) or
        of blocks older than the ring are dropped."""
        block = t_ns // self.block_ns
        ok = (block >= closed_before_block) & (rtt_us > 0)
        if not ok.any():
            return
        pids, block, ln = pids[ok], block[ok], np.log(rtt_us[ok])
        for b in np.unique(block):
            slot = int(b % self._ring)
            if self.slot_block[slot] != b:
                # the slot's previous block is out of every lag's reach now
                self.state["n"][:, slot] = 0.0
                self.state["s1"][:, slot] = 0.0
                self.state["s2"][:, slot] = 0.0
                self.slot_block[slot] = b
            sel = block == b
            n_p = len(self.state)
            p, x = pids[sel], ln[sel]
            self.state["n"][:, slot] += np.bincount(p, minlength=n_p)
            self.state["s1"][:, slot] += np.bincount(p, weights=x, minlength=n_p)
            self.state["s2"][:, slot] += np.bincount(p, weights=x * x, minlength=n_p)

    def test_block(self, block: int, eligible: np.ndarray | None = None) -> LongTermFlags:
        """Test closed block ``block`` of every pair (or of the pairs of the ``eligible`` mask,
        which covers the first ``len(eligible)`` pairs) against its references."""
        cfg = self.config
        st = self.state if eligible is None else self.state[: len(eligible)]
        empty = np.empty(0)
        slot = block % self._ring
        if self.slot_block[slot] != block:
            return LongTermFlags(
                block, np.empty(0, np.intp), empty, empty, empty, np.empty(0, np.int64)
            )
        n = st["n"][:, slot]
        mean = st["s1"][:, slot] / np.maximum(n, 1)
        best_z = np.full(len(n), -np.inf)
        best = np.zeros((4, len(n)))  # d, rel, lag, flagged
        for lag in cfg.lags:
            rslot = (block - lag) % self._ring
            if self.slot_block[rslot] != block - lag:
                continue
            rn = st["n"][:, rslot]
            with np.errstate(invalid="ignore", divide="ignore"):
                mu = st["s1"][:, rslot] / rn
                var = (
                    np.maximum(st["s2"][:, rslot] / rn - mu * mu, 0.0) * rn / np.maximum(rn - 1, 1)
                )
                sigma = np.sqrt(var)
                shift = mean - mu
                z = shift / (sigma / np.sqrt(np.maximum(n, 1)))
                d = shift / sigma
            rel = np.expm1(shift)
            ok = (n >= cfg.min_samples) & (rn >= cfg.min_samples) & (sigma > 0)
            hit = ok & (z >= cfg.z_crit) & (d >= cfg.min_effect_d) & (rel >= cfg.min_rel_increase)
            better = hit & (z > best_z)
            best_z = np.where(better, z, best_z)
            best[0] = np.where(better, d, best[0])
            best[1] = np.where(better, rel, best[1])
            best[2] = np.where(better, lag, best[2])
            best[3] = np.where(hit, 1.0, best[3])
        flagged = best[3] > 0
        if eligible is not None:
            flagged &= eligible
        pids = np.flatnonzero(flagged)
        return LongTermFlags(
            block, pids, best_z[pids], best[0][pids], best[1][pids], best[2][pids].astype(np.int64)
        )
