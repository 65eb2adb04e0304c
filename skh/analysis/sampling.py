"""The latency sample: one RTT per pair and sampling period, whatever the probe rate.

Skeleton pairs are probed ten times a second so that a 2 % loss shows within about a second,
but the latency windows, their thresholds and the detector's memory are sized for one sample a
second. The detector keeps this sample and drops the other OKs; the agent forwards it with
every failure and drops the rest before they cross the network (``AgentConfig.thin_results``),
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

__all__ = ["LATENCY_PATHS", "LATENCY_SAMPLE_S", "NO_PHASE", "period_samples"]

LATENCY_SAMPLE_S = 1.0
#: flow labels a prober rotates through (the simulator's and the agents' path ids)
LATENCY_PATHS = 4
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
