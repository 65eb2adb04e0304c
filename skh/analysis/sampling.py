"""The latency sample: one RTT per pair and sampling period, whatever the probe rate.

Skeleton pairs are probed ten times a second so that a 2 % loss shows within about a second,
but the latency windows, their thresholds and the detector's memory are sized for one sample a
second. The detector keeps this sample and drops the other OKs; the agent forwards it with
every failure and drops the rest before they cross the network (``AgentConfig.ok_sample_s``),
so the analyzer ingests about one record per pair and second, not ten. Both use this rule, so
what the agent forwards always holds what the detector would have picked.

Periods are phased half a period before the pair's first OK, so a schedule of one probe per
period, jitter and all, lands one probe mid-period. Which OK: the first on the path whose turn
it is (``path_id % paths == period_index % paths``), else the first after a quarter of the
period. Taking simply the first would alias with a prober that rotates its flow labels: ten
probes a second over four paths start every second on the same two paths, and a slow third
path would never be sampled.
"""

from __future__ import annotations

import numpy as np

from skh.records import ProbeStatus, pair_keys

__all__ = [
    "FLOW_SLOTS",
    "LATENCY_PATHS",
    "LATENCY_SAMPLE_S",
    "NO_PHASE",
    "ResultThinner",
    "period_samples",
]

LATENCY_SAMPLE_S = 1.0
#: flow labels a prober rotates through (the simulator's and the agents' path ids)
LATENCY_PATHS = 4
#: flow slots per pair the loss side tells apart (``path_id % FLOW_SLOTS``): the fast path's
#: per-flow failure runs, and the OKs the agents forward to end them
FLOW_SLOTS = 8
#: ``phase_ns`` of a pair that has had no OK yet
NO_PHASE = np.iinfo(np.int64).min


def period_samples(
    pid: np.ndarray,
    t_ns: np.ndarray,
    path_id: np.ndarray,
    phase_ns: np.ndarray,
    last_slot: np.ndarray,
    *,
    period_ns: int,
    paths: int,
) -> np.ndarray:
    """Indices of the OK rows that are their pair's sample for a period not sampled yet.

    ``pid`` (dense pair ids, sorted, send times ``t_ns`` rising within a pair) indexes the
    per-pair state ``phase_ns`` (``NO_PHASE`` until the pair's first OK) and ``last_slot`` (the
    newest period already sampled; start it below any period, e.g. at ``NO_PHASE``), which are
    updated in place. Rows must all be OKs."""
    if pid.size == 0:
        return np.zeros(0, np.int64)
    start = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
    first_pid = pid[start]
    new = phase_ns[first_pid] == NO_PHASE
    if new.any():
        phase_ns[first_pid[new]] = t_ns[start[new]] - period_ns // 2
    since = t_ns - phase_ns[pid]
    slot = since // period_ns
    turn = (path_id.astype(np.int64) % paths) == (slot % paths)
    late = since - slot * period_ns >= period_ns // 4
    cand = np.flatnonzero((slot > last_slot[pid]) & (turn | late))
    if cand.size == 0:
        return cand
    pc, sc = pid[cand], slot[cand]
    keep = cand[np.r_[True, (pc[1:] != pc[:-1]) | (sc[1:] != sc[:-1])]]
    pk = pid[keep]
    ends = np.r_[np.flatnonzero(pk[1:] != pk[:-1]), pk.size - 1]
    last_slot[pk[ends]] = slot[keep][ends]
    return keep


class ResultThinner:
    """What an agent forwards of its probes: every result but OK, the OK that ends a run of them
    on the pair or on one of its flows (``path_id % FLOW_SLOTS``; so loss and outage, and an
    outage of one ECMP path, stay told apart), each pair's latency sample (the analyzer would
    drop the other OKs anyway) and each prober's newest result (its progress). At ten probes
    per pair and second about 13 % are forwarded (``bench/analyzer.py``)."""

    def __init__(self, period_s: float = LATENCY_SAMPLE_S, paths: int = LATENCY_PATHS) -> None:
        self.period_ns = int(period_s * 1e9)
        self.paths = paths
        self._keys = np.zeros(0, np.uint64)  # sorted pair keys ...
        self._key_id = np.zeros(0, np.int64)  # ... and their dense ids
        self._phase = np.zeros(0, np.int64)
        self._last_slot = np.zeros(0, np.int64)
        self._last_failed = np.zeros(0, bool)
        self._flow_failed = np.zeros((0, FLOW_SLOTS), bool)

    def _pair_ids(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self._keys, keys)
        found = pos < self._keys.size
        found[found] = self._keys[pos[found]] == keys[found]
        if not found.all():
            new = np.unique(keys[~found])
            n0 = self._phase.size
            allk = np.concatenate([self._keys, new])
            order = np.argsort(allk, kind="stable")
            self._keys = allk[order]
            self._key_id = np.concatenate([self._key_id, np.arange(n0, n0 + new.size)])[order]
            self._phase = np.r_[self._phase, np.full(new.size, NO_PHASE)]
            self._last_slot = np.r_[self._last_slot, np.full(new.size, NO_PHASE)]
            self._last_failed = np.r_[self._last_failed, np.zeros(new.size, bool)]
            self._flow_failed = np.r_[self._flow_failed, np.zeros((new.size, FLOW_SLOTS), bool)]
            pos = np.searchsorted(self._keys, keys)
        return self._key_id[pos]

    def thin(self, batch: np.ndarray) -> np.ndarray:
        if batch.size == 0:
            return batch
        keys = pair_keys(batch["src_ep"], batch["dst_ep"])
        pid = self._pair_ids(keys)
        order = np.lexsort((batch["t_wall_ns"], pid))
        # the columns it reads, in pair order; whole records only of the rows kept (gathering
        # every record was a third of the cost at ten probes per pair and second)
        pid = pid[order]
        t_ns = batch["t_wall_ns"][order]
        path_id = batch["path_id"][order]
        src = batch["src_ep"][order]
        failed = batch["status"][order] != ProbeStatus.OK
        first = np.r_[True, pid[1:] != pid[:-1]]
        prev_failed = np.where(first, self._last_failed[pid], np.r_[False, failed[:-1]])
        keep = failed | prev_failed
        # the same per flow: the OK after a flow's failures
        slot = path_id.astype(np.int64) % FLOW_SLOTS
        fkey = pid * FLOW_SLOTS + slot
        fo = np.lexsort((t_ns, fkey))
        fk, ff = fkey[fo], failed[fo]
        ffirst = np.r_[True, fk[1:] != fk[:-1]]
        fprev = np.where(ffirst, self._flow_failed[pid[fo], slot[fo]], np.r_[False, ff[:-1]])
        keep[fo[fprev & ~ff]] = True
        fends = np.r_[np.flatnonzero(ffirst[1:]), fk.size - 1]
        self._flow_failed[pid[fo][fends], slot[fo][fends]] = ff[fends]
        ok = np.flatnonzero(~failed)
        sampled = period_samples(
            pid[ok],
            t_ns[ok],
            path_id[ok],
            self._phase,
            self._last_slot,
            period_ns=self.period_ns,
            paths=self.paths,
        )
        keep[ok[sampled]] = True
        # each prober's newest result: the analyzer scores a window only once the prober has
        # reported past its end, and a sampled OK can be most of a second old
        newest = np.lexsort((t_ns, src))
        keep[newest[np.r_[src[newest][1:] != src[newest][:-1], True]]] = True
        ends = np.r_[np.flatnonzero(first[1:]), pid.size - 1]
        self._last_failed[pid[ends]] = failed[ends]
        return batch[order[keep]]
