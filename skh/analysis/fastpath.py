"""Fast path: unreachability and loss bursts, decided per batch instead of at a window's end.

A RoCE fabric is built to lose nothing, and a connectivity loss longer than 4 s fails a
collective, so failed probes (``LOST`` or ``UNREACHABLE``) are acted on as soon as they arrive:

- **unreachable**: the pair's most recent probes all failed, at least ``unreachable_after`` in
  a row and spanning at least ``unreachable_after_s`` of send time (a pair probed ten times a
  second loses two probes in a row to a 2 % loss every few minutes: that is still loss); or
  at least one failed and the failure is *corroborated*: ``corroborate_pairs`` pairs (itself
  included) sharing one of its endpoints, in either direction, are failing right now (one
  RNIC, port or switch failure breaks many pairs at once, which is why one failed probe then
  suffices; a lossy access link now and then fails two of them at once too, and is then
  called unreachable, which localization still pins to the right link).
- **loss**: at least ``loss_count`` failures within ``loss_window_s`` while the pair's latest
  probe succeeded (CRC errors; a dead link that only some of the pair's ECMP paths cross).
  ``loss_count`` defaults to 1 because a RoCE fabric's healthy loss is zero: one lost probe is
  already a fault. Raise it where the fabric has background loss. A lone, uncorroborated
  failure is therefore decided by the pair's next probe: OK makes it loss, another failure an
  outage. That costs one probe interval and keeps an outage from first being called loss.

Only failures that were *reported* count: a missing record is never a loss, so an agent that
is late or dead cannot fake a network failure (that is the health module's business).
``REFUSED`` is not a failure either: the network delivered the probe and the responder's host
said nobody listens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError

__all__ = ["FastPathConfig", "FastPathState", "FastFlags"]


@dataclass(frozen=True, slots=True)
class FastPathConfig:
    unreachable_after: int = 2
    unreachable_after_s: float = 0.5
    corroborate_pairs: int = 2
    #: a failure corroborates others only while it is this recent
    corroborate_window_s: float = 2.0
    loss_count: int = 1
    loss_window_s: float = 10.0
    #: failure timestamps kept per pair (must be >= loss_count)
    history: int = 4

    def __post_init__(self) -> None:
        for name in ("unreachable_after", "corroborate_pairs", "loss_count"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"The '{name}' parameter of FastPathConfig must be >= 1. "
                    f"Got {getattr(self, name)!r} instead."
                )
        if not self.unreachable_after_s >= 0:
            raise ConfigError(
                "The 'unreachable_after_s' parameter of FastPathConfig must be >= 0. "
                f"Got {self.unreachable_after_s!r} instead."
            )
        if self.history < self.loss_count:
            raise ConfigError(
                "The 'history' parameter of FastPathConfig must be >= loss_count "
                f"({self.loss_count}). Got {self.history!r} instead."
            )


@dataclass(frozen=True, slots=True)
class FastFlags:
    """Pairs the fast path flags now, by kind, with the first failure of the episode."""

    unreachable: np.ndarray
    unreachable_first_ns: np.ndarray
    unreachable_fails: np.ndarray
    loss: np.ndarray
    loss_first_ns: np.ndarray
    loss_fails: np.ndarray


class FastPathState:
    def __init__(self, config: FastPathConfig, n_pairs: int = 0) -> None:
        self.config = config
        self._dtype = np.dtype(
            [
                ("consec", "<i4"),  # failures since the last OK (by send time)
                ("run_first_ns", "<i8"),  # send time of the first failure of that run
                ("last_t_ns", "<i8"),  # newest send time seen, to keep runs in order
                ("fail_pos", "<i8"),
                ("fail_ns", "<i8", (config.history,)),  # ring of recent failure send times
            ]
        )
        self._blank = np.zeros(1, self._dtype)
        self._blank["run_first_ns"] = -1
        self._blank["last_t_ns"] = -1
        self._blank["fail_ns"] = -1
        self.state = np.repeat(self._blank, n_pairs)

    def resize(self, n_pairs: int) -> None:
        grown = np.repeat(self._blank, n_pairs)
        keep = min(n_pairs, len(self.state))
        grown[:keep] = self.state[:keep]
        self.state = grown

    def take(self, keep: np.ndarray) -> None:
        self.state = self.state[keep]

    def clear_pairs(self, pids: np.ndarray) -> None:
        self.state[pids] = self._blank

    def update(self, pids: np.ndarray, t_ns: np.ndarray, failed: np.ndarray) -> None:
        """Fold one batch of probe outcomes (``failed``: LOST/UNREACHABLE; the rest: OK) in,
        sorted by pair then send time.

        A record older than the pair's newest one still lands in the failure history but does
        not reorder the current run.
        """
        if len(pids) == 0:
            return
        p, t, f = pids, t_ns, failed
        s = self.state
        fresh = t > s["last_t_ns"][p]

        # failure history ring: position = per-pair counter + rank among this batch's failures
        fp, ft = p[f], t[f]
        if len(fp):
            start = np.flatnonzero(np.r_[True, fp[1:] != fp[:-1]])
            rank = np.arange(len(fp)) - np.repeat(start, np.diff(np.r_[start, len(fp)]))
            pos = (s["fail_pos"][fp] + rank) % self.config.history
            s["fail_ns"][fp, pos] = ft
            s["fail_pos"][fp[start]] += np.diff(np.r_[start, len(fp)])

        # current run: only in-order records move it
        p, t, f = p[fresh], t[fresh], f[fresh]
        if len(p) == 0:
            return
        bounds = np.flatnonzero(np.r_[True, p[1:] != p[:-1], True])
        first, end = bounds[:-1], bounds[1:]
        up = p[first]
        idx = np.arange(len(p))
        # index of the last OK in each group (-1 when the group has none)
        ok_idx = np.where(~f, idx, -1)
        last_ok = np.maximum.reduceat(ok_idx, first)
        has_ok = last_ok >= first
        n_fail_group = np.add.reduceat(f.astype(np.int64), first)
        trailing = end - 1 - last_ok  # failures after the last OK
        old = s["consec"][up]
        s["consec"][up] = np.where(has_ok, trailing, old + n_fail_group)
        # first failure of the current run
        after_ok = np.minimum(last_ok + 1, len(p) - 1)
        run_first_new = np.where(trailing > 0, t[after_ok], -1)
        first_fail_in_group = np.where(f, idx, len(p))
        ffi = np.minimum.reduceat(first_fail_in_group, first)
        cont_first = np.where(
            old > 0, s["run_first_ns"][up], np.where(ffi < end, t[np.minimum(ffi, len(p) - 1)], -1)
        )
        s["run_first_ns"][up] = np.where(has_ok, run_first_new, cont_first)
        s["last_t_ns"][up] = t[end - 1]

    def evaluate(
        self, now_ns: int, src: np.ndarray, dst: np.ndarray, n_endpoints: int
    ) -> FastFlags:
        """Which pairs are unreachable or lossy at ``now_ns``. ``src``/``dst`` are the endpoint
        ids of the first ``len(src)`` pairs, the live ones (for corroboration)."""
        cfg = self.config
        s = self.state[: len(src)]
        consec = s["consec"]
        failing = consec > 0
        recent = failing & (s["run_first_ns"] >= now_ns - int(cfg.corroborate_window_s * 1e9))
        # failing pairs per endpoint, either direction (a dead RNIC breaks a->b and b->a alike)
        by_ep = np.bincount(src[recent], minlength=n_endpoints) + np.bincount(
            dst[recent], minlength=n_endpoints
        )
        corroborated = recent & (
            (by_ep[src] >= cfg.corroborate_pairs) | (by_ep[dst] >= cfg.corroborate_pairs)
        )
        span_ns = np.where(failing, s["last_t_ns"] - s["run_first_ns"], -1)
        outage = (consec >= cfg.unreachable_after) & (span_ns >= int(cfg.unreachable_after_s * 1e9))
        unreach = outage | corroborated
        u = np.flatnonzero(unreach)

        horizon = now_ns - int(cfg.loss_window_s * 1e9)
        fails = s["fail_ns"]
        in_win = fails >= horizon
        n_recent = in_win.sum(axis=1)
        first_recent = np.where(in_win, fails, np.iinfo(np.int64).max).min(axis=1)
        lossy = (n_recent >= cfg.loss_count) & ~unreach & (consec == 0)
        lo = np.flatnonzero(lossy)
        return FastFlags(
            unreachable=u,
            unreachable_first_ns=s["run_first_ns"][u],
            unreachable_fails=consec[u].astype(np.int64),
            loss=lo,
            loss_first_ns=first_recent[lo],
            loss_fails=n_recent[lo].astype(np.int64),
        )
