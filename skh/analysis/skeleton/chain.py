"""Stage 4b: the stage order of a pipeline without data parallelism, from its hosts' idle gaps.

A job without a collective between containers (one replica: PP × TP, DP = 1) has no DP group to
split, so every RNIC of a rail lands in one group and every same-rail pair would be kept. Its
stages' sends cannot name partners either: 1F1B keeps every stage in step (a backward is two
forwards, so stages s and s + 3 send in the same samples), and at 10 Hz a partner's sends
coincide no better than a non-partner's. What does tell the stages apart is the pipeline's
fill and drain: each iteration, stage s receives its first activation a forward pass after
stage s − 1 and finishes its last backward a backward pass before it. So every host idles once
per iteration between its last and its next operation, and that gap is longer by a forward plus
a backward per stage down the pipeline (stage 0 idles least, the last stage most).

The gaps are measured on each host's lower quartile over its rails (flows a few rails carry
alone, co-tenants or storage, do not fill it), matched across hosts by iteration (every host's
gap of one iteration contains the first stage's), and the hosts ordered by their median gap.
The order is used only when every two consecutive hosts differ clearly, iteration by iteration
(replicas of one stage, or stages in one host, have equal gaps and do not); then each host's
partners are the hosts next to it in that order, and the last and first (an interleaved
schedule's wrap-around, which gap lengths cannot rule out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.analysis.skeleton.model import median, robust_sd

__all__ = ["Chain", "pipeline_chain"]

#: an idle stretch shorter than this is a pause inside the steady 1F1B phase, not the
#: iteration's drain-to-fill gap (a stage's steady-state pauses last a forward or two)
_MIN_GAP_S = 1.0
#: consecutive hosts' gap lengths must differ by this many standard errors over iterations
_ORDER_T = 5.0
#: below this many standard errors (or the least step) two hosts' gaps tie
_TIE_T = 2.0
#: and by at least this much in the median (stages differ by a forward and a backward, ~0.5 s
#: and more; the first two stages' gaps differ by a sample or so, an interleaved schedule's
#: wrap-around messages being stage 0's alone: that must read as their tie), and two samples
_MIN_STEP_S = 0.3
#: at least this many iterations matched on every host
_MIN_ITERATIONS = 5
#: a plain pipeline's end stage (one neighbour) carries half the messages of an interior one
#: (two); an interleaved one's ends 1 - 1 / (2 vpp) of them: 0.75 or more (the midpoint; what
#: else a host carries, checkpoints or loads, only raises the ends' share: the wrap is kept)
_END_SHARE = 0.625


@dataclass(frozen=True, slots=True)
class Chain:
    """Hosts (indices into the job's sorted unique hosts) in pipeline order as tiers: each tier
    one stage's host, or hosts the gaps cannot tell apart (linked to each other and to both
    neighbouring tiers); ``wrap`` whether the last tier links back to the first; the weakest
    consecutive step in standard errors; ``why`` says what failed when ``tiers`` is empty."""

    tiers: list[np.ndarray]
    wrap: bool
    weakest_t: float
    iterations: int
    why: str = ""


def _idle_runs(active: np.ndarray, min_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, start, stop) of the runs of ``False`` along each row of ``active`` at least
    ``min_len`` long, inside the series (a run touching either end is cut short and not
    counted), row by row, each row's runs in time order."""
    d = np.diff(active.astype(np.int8), axis=1, prepend=1, append=1)
    row, start = np.nonzero(d == -1)
    stop = np.nonzero(d == 1)[1]  # every row has as many ends as starts, in the same order
    keep = (stop - start >= min_len) & (start > 0) & (stop < active.shape[1])
    return row[keep], start[keep], stop[keep]


def _gaps(active: np.ndarray, min_len: int) -> np.ndarray:
    """(iterations, hosts): each host's idle gap of the iterations every host has one in."""
    n_h, t_len = active.shape
    row, start, stop = _idle_runs(active, min_len)
    count = np.bincount(row, minlength=n_h)
    if count.min() == 0:
        return np.zeros((0, n_h))
    # each host idles once per iteration between drain and fill; pauses inside the steady
    # phase can last seconds too when a job's operations are long. The iteration gaps are the
    # runs of the least length at which every host has as many (within one) as the others
    length = stop - start
    cuts = np.unique(length)
    first = np.r_[0, np.cumsum(count)[:-1]]
    n_long = np.add.reduceat(length >= cuts[:, None], first, axis=1, dtype=np.int64)
    lo, hi = n_long.min(axis=1), n_long.max(axis=1)
    done = np.flatnonzero((lo < _MIN_ITERATIONS) | (hi - lo <= 1))
    i = done[0] if done.size else cuts.size - 1
    if lo[i] < _MIN_ITERATIONS:
        return np.zeros((0, n_h))
    long = length >= cuts[i]
    row, start, stop = row[long], start[long], stop[long]
    # every host's gap of one iteration contains the first stage's, the shortest: take each
    # host's gaps in turn as the reference and keep the one that matches most iterations. The
    # gap of each host around a reference's midpoint is the last one starting before it: one
    # search over every host's starts, each host's a series length apart
    span = t_len + 2
    key = row * span + start
    hosts = np.arange(n_h)[:, None]
    best = np.zeros((0, n_h))
    for h in range(n_h):
        mids = (start[row == h] + stop[row == h]) // 2
        j = np.searchsorted(key, hosts * span + mids, side="right") - 1  # (hosts, mids)
        jj = np.maximum(j, 0)
        ok = ((j >= 0) & (row[jj] == hosts) & (stop[jj] > mids)).all(axis=0)
        if ok.sum() > best.shape[0]:
            best = (stop[jj] - start[jj]).T[ok].astype(np.float64)
    return best


def _fail(why: str, t: float = 0.0, iterations: int = 0) -> Chain:
    return Chain([], True, t, iterations, why)


def pipeline_chain(quartile: np.ndarray, hz: float, idle_bytes_per_s: float) -> Chain:
    """The pipeline order of hosts from ``quartile`` (per host, the lower quartile over its rails
    of the bytes per sample at ``hz``), or why there is none.

    Counters see messages, not compute: stage 0 talks only to stage 1, so its traffic starts and
    ends with stage 1's, and the first two hosts tie. The ends of a plain 1F1B pipeline carry
    half the bytes of the interior (one neighbour, not two): the quieter of the tied pair is
    stage 0, and a pipeline whose two ends are that quiet has no wrap-around link. An interleaved
    one's ends also talk to each other (3/4 of the interior's bytes with two model chunks): the
    tie stays a tier and the wrap-around link is kept."""
    n_h = quartile.shape[0]
    if n_h < 3:
        return _fail("two hosts: nothing to order")
    active = quartile > idle_bytes_per_s / hz
    gaps = _gaps(active, max(2, int(round(_MIN_GAP_S * hz))))
    if gaps.shape[0]:
        # a gap that swallows two iterations (a checkpoint pause) would inflate the spread
        total = gaps.sum(axis=1)
        gaps = gaps[total <= 1.5 * median(total)]
    if gaps.shape[0] < _MIN_ITERATIONS:
        return _fail(f"idle gaps matched on every host in {gaps.shape[0]} iterations only")
    order = np.argsort(median(gaps, axis=0), kind="stable")
    step = np.diff(gaps[:, order], axis=1)  # (iterations, n_h - 1), positive when ordered
    med = median(step, axis=0)
    # robust: a gap matched to the wrong iteration now and then must not swamp the spread
    # (the standard error of a median is 1.25 sd / sqrt(n))
    sd = np.maximum(robust_sd(step, axis=0), 0.5)
    t = med / (1.2533 * sd) * np.sqrt(step.shape[0])
    # a step is clear, or a tie (the hosts stay one tier: linked to each other and to both
    # neighbouring tiers, a longer list but no missed pair); anything between is no order
    min_step = max(2.0, _MIN_STEP_S * hz)
    cut = (med >= min_step) & (t >= _ORDER_T)
    tie = (med < min_step) | (t < _TIE_T)
    if not np.all(cut | tie) or not cut.any():
        weakest = float(t[~tie].min()) if (~tie).any() else 0.0
        return _fail(
            f"hosts' idle gaps do not order them (weakest step {weakest:.1f} standard errors)",
            weakest,
            gaps.shape[0],
        )
    tiers = np.split(order, np.flatnonzero(cut) + 1)
    if tiers[0].size > 2 or any(t.size > 1 for t in tiers[1:]):
        # one replica per stage ties only its first two hosts; more hosts alike in their gaps
        # are replicas of one stage, which burst together: data parallelism, not this case
        return _fail(
            "hosts alike in their idle gaps beyond the first two: replicas, not one pipeline",
            float(t[cut].min()),
            gaps.shape[0],
        )
    # messages per host: its bytes (every message is one activation or its gradient) per
    # iteration-long chunk, the median over chunks (a checkpoint's minutes of writes on every
    # RNIC would lift the quiet ends), against the interior's (a host of no end tier; the
    # busiest when every host is in one)
    chunk = max(1, quartile.shape[1] // (gaps.shape[0] + 1))  # about an iteration or more
    n_chunks = max(1, quartile.shape[1] // chunk)
    volume = median(quartile[:, : n_chunks * chunk].reshape(n_h, n_chunks, -1).sum(axis=2), axis=1)
    first, last = tiers[0], tiers[-1]
    inner = np.concatenate(tiers[1:-1]) if len(tiers) > 2 else np.zeros(0, np.int64)
    ref = float(median(volume[inner])) if inner.size else float(volume.max())
    quiet = volume <= _END_SHARE * ref
    wrap = True
    if last.size == 1 and quiet[last[0]] and int(quiet[first].sum()) == 1:
        wrap = False
        if first.size == 2:  # the quiet one is stage 0, the other stage 1
            tiers = [first[quiet[first]], first[~quiet[first]]] + tiers[1:]
    return Chain(tiers, wrap, float(t[cut].min()), gaps.shape[0])
