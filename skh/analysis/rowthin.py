"""What an overlay agent forwards of its probes, record by record in plain Python.

:class:`skh.analysis.sampling.ResultThinner` thins the simulator's batches of tens of thousands
of records with numpy; an agent thins its own hundred to a thousand a second, and must not load
numpy for it (~13 MB of each sidecar's memory, docs/probing.md). :class:`RowThinner` applies the
same rule (that module's docstring says it) to records as :data:`skh.layout.PROBE_STRUCT`
tuples: every failure, the OK that ends a run of them on the pair or on one of its flows, each
pair's latency sample per period (:func:`skh.analysis.sampling.period_samples`) and each
prober's newest result. It keeps the same records, in the same order;
tests/analysis/test_sampling.py checks both, and the detector's sampling, on the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FLOW_SLOTS", "NO_PHASE", "RowThinner", "sample_phase_ns"]

#: flow slots per pair the loss side tells apart (``path_id % FLOW_SLOTS``): the fast path's
#: per-flow failure runs, and the OKs the agents forward to end them. One per path id of the
#: longest rotation a probe plan hands out (:class:`skh.policy.ProbePolicy` ``max_paths``):
#: folding a rotation's ids into fewer slots mixes an ECMP path that a dead switch breaks with
#: paths that work, so its outage never runs and reads as random loss (a spine offline broke
#: one or two of 14-45 ids of thousands of pairs; their failures lifted their ToRs' loss tests,
#: and pairs that merely lost a probe were called lossy with them)
FLOW_SLOTS = 64
#: the newest sampled period of a pair that has had no sample yet (int64's least value)
NO_PHASE = -(2**63)
_MUL, _MASK = 0x9E3779B97F4A7C15, 2**64 - 1


def sample_phase_ns(key: int, period_ns: int) -> int:
    """Where a pair's sampling periods start (mod ``period_ns``), from its pair key
    (``src << 32 | dst``) alone: a multiplicative hash, so pairs spread over the period, and
    every party computes the same periods whatever OK it saw first
    (:func:`skh.analysis.sampling.sample_phases_ns` is this on arrays)."""
    return ((key * _MUL) & _MASK) % period_ns


# record fields (skh.layout.PROBE_FIELDS)
_SRC, _DST, _SEQ, _PATH, _STATUS, _T, _RTT = 0, 1, 2, 3, 4, 6, 7
# per-pair state: the latency sample's (skh.analysis.sampling.SAMPLE_STATE), then the pair's
# last result and its flows' (bit i: flow i's last result failed)
_PHASE, _SLOT, _WANT, _ROT, _IV, _LAST_T, _LAST_SEQ, _FAILED, _FLOWS = range(9)


class RowThinner:
    """:class:`skh.analysis.sampling.ResultThinner` on record tuples (``period_s``: the latency
    sample period)."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_ns = int(period_s * 1e9)
        self._pid: dict[int, int] = {}  # pair key -> dense id, as ResultThinner numbers them
        self._state: list[list[int]] = []

    def thin(self, rows: Sequence[tuple]) -> list[tuple]:
        """The records of ``rows`` to forward, by pair (in the order pairs were first seen)
        and send time."""
        if not rows:
            return []
        pid_of = self._pid
        runs: dict[int, list[int]] = {}  # pair key -> its rows, in batch order
        for i, r in enumerate(rows):
            k = r[_SRC] << 32 | r[_DST]
            run = runs.get(k)
            if run is None:
                runs[k] = [i]
            else:
                run.append(i)
        for k in sorted(k for k in runs if k not in pid_of):
            pid_of[k] = len(self._state)  # a batch's new pairs take the next ids in key order
            phase = sample_phase_ns(k, self.period_ns)
            self._state.append([phase, NO_PHASE, 0, 0, 0, 0, -1, 0, 0])
        keep = [False] * len(rows)
        out: list[int] = []  # rows by (pair id, send time, batch position)
        newest: dict[int, int] = {}  # prober -> its newest row
        state = self._state
        for k in sorted(runs, key=pid_of.__getitem__):
            run = runs[k]
            recs = [rows[i] for i in run]
            # one pass for what the pair's rows need: their order and whether all are OK (a
            # few rows per pair and batch: the calls of any()/all() over generators cost more)
            ordered, all_ok, t = True, True, recs[0][_T]
            for r in recs:
                if r[_T] < t:
                    ordered = False
                t = r[_T]
                if r[_STATUS]:
                    all_ok = False
            if not ordered:
                run.sort(key=lambda i: rows[i][_T])  # stable: ties stay in batch order
                recs = [rows[i] for i in run]
            self._pair(state[pid_of[k]], recs, run, keep, all_ok)
            out += run
            last = run[-1]
            src = k >> 32
            if src not in newest or recs[-1][_T] >= rows[newest[src]][_T]:
                newest[src] = last
        for i in newest.values():
            keep[i] = True
        return [rows[i] for i in out if keep[i]]

    def _pair(
        self, st: list[int], recs: list[tuple], idx: list[int], keep: list[bool], all_ok: bool
    ) -> None:
        """One pair's rows of a batch (in send-time order; ``all_ok``: every one is OK):
        failures and the OKs after them, per pair and per flow, then the latency sample."""
        if all_ok and not st[_FAILED] and not st[_FLOWS]:
            # the usual pair: all well before and now, so only its latency sample is kept
            for k in self._samples(st, recs):
                keep[idx[k]] = True
            return
        failed = [r[_STATUS] != 0 for r in recs]
        prev = st[_FAILED]
        for k, f in enumerate(failed):
            if f or prev:
                keep[idx[k]] = True
            prev = f
        st[_FAILED] = failed[-1]
        if st[_FLOWS] or any(failed):
            flows = st[_FLOWS]
            for k, f in enumerate(failed):
                bit = 1 << (recs[k][_PATH] % FLOW_SLOTS)
                if flows & bit and not f:
                    keep[idx[k]] = True
                flows = flows | bit if f else flows & ~bit
            st[_FLOWS] = flows
        ok = [k for k, f in enumerate(failed) if not f]
        if ok:
            for k in self._samples(st, [recs[k] for k in ok]):
                keep[idx[ok[k]]] = True

    def _samples(self, st: list[int], oks: list[tuple]) -> list[int]:
        """:func:`skh.analysis.sampling.period_samples` for one pair's OKs (send-time order):
        the positions of those that are the sample of a period not sampled yet, or on a path
        id past the pair's rotation so far."""
        period = self.period_ns
        first, last = oks[0], oks[-1]
        # the rotation's length: past the largest path id seen; the first OK on a higher one
        # goes out too (ResultThinner.thin says why)
        new_ids: list[int] = []
        top = max(r[_PATH] for r in oks)
        if top >= st[_ROT]:
            new_ids.append(next(k for k, r in enumerate(oks) if r[_PATH] == top))
            st[_ROT] = top + 1
        # the interval: send-time span over seq span, from the pair's newest OK seen before
        # (seqs are u32 serial numbers; a restarted prober's new numbering is skipped)
        had = st[_LAST_SEQ] >= 0
        t0 = st[_LAST_T] if had else first[_T]
        s0 = st[_LAST_SEQ] if had else first[_SEQ]
        dseq = (last[_SEQ] - s0) % 2**32
        dt = last[_T] - t0
        if 0 < dseq < 2**31 and dt > 0:
            st[_IV] = dt // dseq
        st[_LAST_T], st[_LAST_SEQ] = last[_T], last[_SEQ]
        phase, n, iv = st[_PHASE], st[_ROT], st[_IV]
        if iv * 4 >= 3 * period:  # sampling.is_slow: every OK with an RTT is a sample
            st[_SLOT] = (last[_T] - phase) // period
            st[_WANT] = (last[_PATH] + 1) % n
            slow = [k for k, r in enumerate(oks) if r[_RTT] > 0]
            return sorted(set(slow).union(new_ids)) if new_ids else slow
        picked: list[int] = []
        done_slot = st[_SLOT]
        for k, r in enumerate(oks):
            since = r[_T] - phase
            slot = since // period
            if slot <= done_slot or r[_RTT] <= 0:  # an OK without an RTT is no sample
                continue
            # the first OK of the period that the rule takes (a later one may, if this not)
            want = st[_WANT] % n
            x = r[_PATH]
            p_start = phase + slot * period
            turn = x == want
            missed = iv > 0 and not turn and r[_T] - ((x - want) % n) * iv >= p_start + iv // 2
            coming = iv > 0 and r[_T] + ((want - x) % n) * iv < p_start + period - iv // 2
            late = since - slot * period >= period // 4
            if turn or (late and (missed or not coming)):
                if turn or missed:
                    st[_WANT] = (want + 1) % n
                st[_SLOT] = done_slot = slot
                picked.append(k)
        return sorted(set(picked).union(new_ids)) if new_ids else picked
