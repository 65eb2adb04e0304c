"""Per-endpoint byte-counter history, binned into whole seconds for skeleton inference."""

from __future__ import annotations

import numpy as np

from skh.records import COUNTER_DTYPE

__all__ = ["CounterHistory"]


class CounterHistory:
    """Per-endpoint cumulative byte counts over the last ``history_s``, binned on the sampling
    grid for skeleton inference.

    Each sampling interval's bytes go to the bin (of ``1 / hz`` s) its closing sample falls in.
    Host agents sample on the wall clock's grid at ``(k + phase) / hz`` with the same phase
    (:mod:`skh.orchestrator.agent_underlay`); a burst that starts on a whole second lands in the
    same bin on every host (interpolating the cumulative count instead would smear it over two
    bins by a host-dependent share and blur the timing inference reads). The rate is each
    endpoint's own (the median step of its sample times, rounded to a whole rate); a job's series
    use the slowest of its endpoints', so agents at 1 Hz still give whole-second series.
    Transmitted bytes are kept apart: a pipeline send is a pulse on the sender's TX and the
    receiver's RX at once, which is how inference tells partners.
    """

    def __init__(self, history_s: float) -> None:
        self.history_ns = int(history_s * 1e9)
        self._parts: list[np.ndarray] = []
        self._t = np.zeros(0, np.int64)
        self._ep = np.zeros(0, np.uint32)
        self._bytes = np.zeros(0, np.float64)
        self._tx = np.zeros(0, np.float64)

    def add(self, rows: np.ndarray) -> None:
        if rows.size:
            self._parts.append(np.asarray(rows, COUNTER_DTYPE))

    def forget(self, eps: np.ndarray) -> None:
        """Endpoints gone: their rows go (their ids may name other endpoints later)."""
        self._fold()
        keep = ~np.isin(self._ep, eps)
        self._t, self._ep = self._t[keep], self._ep[keep]
        self._bytes, self._tx = self._bytes[keep], self._tx[keep]

    def _fold(self) -> None:
        if not self._parts:
            return
        rows = np.concatenate(self._parts)
        self._parts = []
        t = np.concatenate([self._t, rows["t_ns"]])
        ep = np.concatenate([self._ep, rows["ep"]])
        tx = np.concatenate([self._tx, rows["tx_bytes"].astype(np.float64)])
        total = np.concatenate(
            [self._bytes, rows["tx_bytes"].astype(np.float64) + rows["rx_bytes"]]
        )
        keep = t >= t.max() - self.history_ns
        order = np.lexsort((t[keep], ep[keep]))
        self._t, self._ep = t[keep][order], ep[keep][order]
        self._bytes, self._tx = total[keep][order], tx[keep][order]

    def _rows(self, e: int) -> slice:
        return slice(*np.searchsorted(self._ep, [e, e + 1]))

    def _hz(self, e: int) -> int:
        """The endpoint's sampling rate: its median step, as whole samples per second."""
        t = self._t[self._rows(e)]
        if t.size < 3:
            return 1
        return int(min(100, max(1, round(1e9 / float(np.median(np.diff(t)))))))

    def rate_hz(self, eps: np.ndarray) -> int:
        """The rate ``eps``' series are binned at: the slowest endpoint's."""
        self._fold()
        return min((self._hz(e) for e in np.asarray(eps).tolist()), default=1)

    def _bins(self, e: int, hz: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = self._rows(e)
        t, b, tx = self._t[r], self._bytes[r], self._tx[r]
        step = 1_000_000_000 // hz
        return t[1:] // step, np.maximum(np.diff(b), 0.0), np.maximum(np.diff(tx), 0.0)

    def _range(self, eps: np.ndarray, hz: int) -> tuple[int, int]:
        """The bins every one of ``eps`` covers: [lo, hi)."""
        lo, hi = None, None
        for e in np.asarray(eps).tolist():
            r = self._rows(e)
            if r.stop - r.start < 2:
                return 0, 0
            step = 1_000_000_000 // hz
            first, last = self._t[r.start + 1] // step, self._t[r.stop - 1] // step
            lo = int(first) if lo is None else max(lo, int(first))
            hi = int(last) + 1 if hi is None else min(hi, int(last) + 1)
        return (lo, hi) if lo is not None and hi is not None and hi > lo else (0, 0)

    def span_s(self, eps: np.ndarray) -> float:
        """Seconds covered by every one of ``eps``."""
        hz = self.rate_hz(eps)
        lo, hi = self._range(eps, hz)
        return float(hi - lo) / hz

    def series(self, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """``(bytes, tx_bytes, hz)``: ``(n, T)`` bytes through (TX + RX) and sent by ``eps`` per
        bin of ``1 / hz`` s, on the bins all of them cover."""
        hz = self.rate_hz(eps)
        lo, hi = self._range(eps, hz)
        out = np.zeros((len(eps), hi - lo))
        out_tx = np.zeros_like(out)
        for i, e in enumerate(np.asarray(eps).tolist()):
            sec, d, dtx = self._bins(e, hz)
            sel = (sec >= lo) & (sec < hi)
            np.add.at(out[i], sec[sel] - lo, d[sel])
            np.add.at(out_tx[i], sec[sel] - lo, dtx[sel])
        return out, out_tx, hz

    def rates(self, eps: np.ndarray) -> np.ndarray:
        """``(n, T)`` bytes through each of ``eps`` per bin (:meth:`series`)."""
        return self.series(eps)[0]
