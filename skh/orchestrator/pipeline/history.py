"""Per-endpoint byte-counter history, binned into whole seconds for skeleton inference."""

from __future__ import annotations

import numpy as np

from skh.records import COUNTER_DTYPE

__all__ = ["CounterHistory"]


class CounterHistory:
    """Per-endpoint cumulative byte counts over the last ``history_s``, binned into whole
    seconds for skeleton inference.

    Each sampling interval's bytes go to the second its closing sample falls in. Host agents
    sample at 1 Hz with their own phase; a burst that starts on a whole second lands in the same
    bin on every host whatever that phase (interpolating the cumulative count instead would
    smear it over two bins by a host-dependent share and blur the stage shifts inference reads).
    """

    def __init__(self, history_s: float) -> None:
        self.history_ns = int(history_s * 1e9)
        self._parts: list[np.ndarray] = []
        self._t = np.zeros(0, np.int64)
        self._ep = np.zeros(0, np.uint32)
        self._bytes = np.zeros(0, np.float64)

    def add(self, rows: np.ndarray) -> None:
        if rows.size:
            self._parts.append(np.asarray(rows, COUNTER_DTYPE))

    def _fold(self) -> None:
        if not self._parts:
            return
        rows = np.concatenate(self._parts)
        self._parts = []
        self._t = np.concatenate([self._t, rows["t_ns"]])
        self._ep = np.concatenate([self._ep, rows["ep"]])
        self._bytes = np.concatenate(
            [self._bytes, rows["tx_bytes"].astype(np.float64) + rows["rx_bytes"]]
        )
        keep = self._t >= self._t.max() - self.history_ns
        order = np.lexsort((self._t[keep], self._ep[keep]))
        self._t, self._ep, self._bytes = (
            self._t[keep][order],
            self._ep[keep][order],
            self._bytes[keep][order],
        )

    def _bins(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        m = self._ep == e
        t, b = self._t[m], self._bytes[m]
        return t[1:] // 1_000_000_000, np.maximum(np.diff(b), 0.0)

    def _range(self, eps: np.ndarray) -> tuple[int, int]:
        """The whole seconds every one of ``eps`` covers: [lo, hi)."""
        lo, hi = None, None
        for e in np.asarray(eps).tolist():
            sec, _ = self._bins(e)
            if sec.size == 0:
                return 0, 0
            lo = int(sec[0]) if lo is None else max(lo, int(sec[0]))
            hi = int(sec[-1]) + 1 if hi is None else min(hi, int(sec[-1]) + 1)
        return (lo, hi) if lo is not None and hi is not None and hi > lo else (0, 0)

    def span_s(self, eps: np.ndarray) -> float:
        """Whole seconds covered by every one of ``eps``."""
        self._fold()
        lo, hi = self._range(eps)
        return float(hi - lo)

    def rates(self, eps: np.ndarray) -> np.ndarray:
        """``(n, T)`` bytes per second of ``eps`` on the whole seconds all of them cover."""
        self._fold()
        lo, hi = self._range(eps)
        out = np.zeros((len(eps), hi - lo))
        for i, e in enumerate(np.asarray(eps).tolist()):
            sec, d = self._bins(e)
            sel = (sec >= lo) & (sec < hi)
            np.add.at(out[i], sec[sel] - lo, d[sel])
        return out
