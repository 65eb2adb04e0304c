"""Stages 2 and 3: the stage split into equal DP groups, and the order of the stages.

A DP group's members burst at the same instants (every gradient sync, and with a distributed
optimizer every parameter all-gather too); the pipeline stages burst a backward (or forward)
pass apart. So two RNICs of one stage have near-identical series, two of different stages do
not, and the farther apart their stages, the less alike. Hence:

* **Split**: RNICs are clustered by the correlation of their burst series (average linkage)
  into ``k`` equal groups, for each ``k`` dividing their count, finest first; ``k`` is accepted
  when every member is closer to its own group than to any other by ``gap_ratio`` times the
  spread of the within-group similarities, and no two groups' bursts start at the same instants
  (merging stages only lengthens the list; splitting a DP group would miss pairs). When a
  host's RNICs are alike (one stage per container, the usual layout), hosts are clustered on
  the lower quartile of their rails' series — sharper, and blind to flows on a few rails — and
  every rail follows; otherwise each rail on its own (containers holding several stages). A
  rank hint's blocks ("stage = rank // (containers / k)") are tested the same way, and used
  when they are finer than what the traffic alone resolves.
* **Order**: stages are ordered by spectral seriation of the groups' mutual similarity (the
  Fiedler vector), and a split is accepted only when every stage's neighbours in that order
  are its most similar groups: groups that do not line up as a pipeline are parts of stages
  (a CP ring's pairs, an expert-parallel group) and a coarser split is tried.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.ndimage import maximum_filter1d, minimum_filter1d
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import squareform

from skh.analysis.skeleton.model import (
    SkeletonParams,
    clip01,
    median,
    parabolic,
    robust_sd,
    row_quantiles,
    standardize,
)

__all__ = ["Split", "bursts", "coherence", "host_quartile", "split_stages"]

_MIN_MARGIN = 0.005  # correlation margin below which groups are never told apart
_ORDER_SLACK = 0.05  # how far a stage's neighbour may trail its most similar groups
#: how far a stage's neighbours must lead every other group for the order to count as clear:
#: seriation always returns an order, and one whose neighbours lead by a hair is a guess (40K
#: cluster seed 14, TP8 PP4 DP2: stages 3 and 4 swapped on a lead of 0.007, a confident list
#: missing a fifth of the pairs). Leads of the right orders seen: 0.036 and more (held-out 40K
#: seeds 4, 5, 7-10, ~116 orders); the weakest wrong one 0.007
_ORDER_MARGIN = 0.02
#: a DP group's members start their bursts within this of each other (sampling clocks and
#: timers agree to milliseconds; two pipeline stages are a backward pass, ~0.1-1 s, apart)
_LOCKSTEP_S = 0.03
#: the members of a DP group burst as one (one collective): each one's burst series correlates
#: with its group's others' at least this much (0.90-1.0 for the simulator's DP groups and 0.93
#: on the gloo testbed; 0.58-0.78 for pipeline stages that send in one 1F1B phase)
_LOCKSTEP_COHERENCE = 0.85
#: groups that start this share of their bursts in lockstep may be replicas of one stage
#: (CP2 replicas split as stages: 30-50 % over 12 cases; pipeline stages: 0 % outside
#: checkpoints, mostly 5-12 % with a checkpoint's writes, at most 24 % seen; ~2 % by chance
#: for 7 bursts in 22 s at 10 Hz). Linking two stages whole only lengthens the list, missing a
#: replica's pairs is a silent miss: the bar sits at half the replicas' lowest share.
_SHARED_ONSETS = 0.15
#: collective bursts take a few tenths of an iteration at most; more is a pipeline's traffic
_MAX_BURST_DUTY = 0.4
#: shorter spikes are not a gradient sync (an MoE layer's all-to-all, a CP ring step) when a
#: series has longer bursts too
_MIN_BURST_S = 0.3
#: a series' lasting bursts set its peak when their top reaches this share of its whole peak
#: (spikes riding on them may double it; a one-sample sync's series, opened, keeps only idle)
_LONG_PEAK = 0.25


@dataclass(frozen=True, slots=True)
class _Clusters:
    label: np.ndarray  # cluster per item, 0..k-1
    k: int
    score: float  # the weakest item's margin over what is needed, halved and capped at 1
    order: np.ndarray  # clusters in pipeline order
    #: whether every cluster's neighbours in ``order`` are its most similar clusters (else a
    #: neighbour trails some other cluster within ``_ORDER_SLACK``: the order is a guess)
    order_clear: bool = True


def _group_sums(feat: np.ndarray, label: np.ndarray, k: int) -> np.ndarray:
    """``(k, T)``: the rows of ``feat`` summed per label, each group's in row order (what
    ``np.add.at`` gives, bit for bit, without its per-row cost; ``np.add.reduceat`` sums in
    another order)."""
    count = np.bincount(label, minlength=k)
    rows = feat[np.argsort(label, kind="stable")]
    if count.min() == count.max():
        return rows.reshape(k, -1, feat.shape[1]).sum(axis=1)
    ends = np.cumsum(count)
    return np.stack([rows[e - c : e].sum(axis=0) for e, c in zip(ends, count, strict=True)])


def _onsets(m: np.ndarray) -> np.ndarray:
    """Sub-sample times of a series' big rising edges: the peaks of its first difference above
    half the largest one, refined by a parabola."""
    d = np.diff(m)
    if d.size < 3:
        return np.zeros(0)
    i = np.flatnonzero((d[1:-1] > d[:-2]) & (d[1:-1] >= d[2:]) & (d[1:-1] >= 0.5 * d.max())) + 1
    return i + 0.5 + parabolic(d[i - 1], d[i], d[i + 1])


def _nearest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance (samples) from each onset in ``a`` to the nearest one in ``b`` (non-empty)."""
    j = np.searchsorted(b, a)
    return np.minimum(
        np.abs(a - b[np.clip(j - 1, 0, b.size - 1)]), np.abs(a - b[np.clip(j, 0, b.size - 1)])
    )


def _onset_gap(a: np.ndarray, b: np.ndarray) -> float:
    """Median distance (samples) from each onset in ``a`` to the nearest one in ``b``."""
    if a.size == 0 or b.size == 0:
        return float("inf")
    return float(median(_nearest(a, b)))


def _row_onset_gaps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_onset_gap` of each row of ``a`` to the same row of ``b`` (series of one length),
    in one pass over all rows: the same values as row by row."""
    d = np.diff(np.concatenate([a, b]), axis=1)
    n = a.shape[0]
    if d.shape[1] < 3:
        return np.full(n, np.inf)
    mid = d[:, 1:-1]
    peak = (mid > d[:, :-2]) & (mid >= d[:, 2:]) & (mid >= 0.5 * d.max(axis=1, keepdims=True))
    row, i = np.nonzero(peak)  # row by row, each row's onsets in time order
    i = i + 1
    on = i + 0.5 + parabolic(d[row, i - 1], d[row, i], d[row, i + 1])
    in_a = row < n
    ra, oa, rb, ob = row[in_a], on[in_a], row[~in_a] - n, on[~in_a]
    first = np.searchsorted(rb, np.arange(n + 1))  # row r of b: ob[first[r]:first[r + 1]]
    has = first[ra + 1] > first[ra]
    ra, oa = ra[has], oa[has]
    # each onset's place among its own row's onsets of b (rows apart by more than a series)
    span = float(a.shape[1] + 2)
    j = np.searchsorted(rb * span + ob, ra * span + oa)
    lo, hi = first[ra], first[ra + 1] - 1
    dist = np.minimum(np.abs(oa - ob[np.clip(j - 1, lo, hi)]), np.abs(oa - ob[np.clip(j, lo, hi)]))
    # each row's median, as np.median takes it (the middle one, or the mean of the middle two)
    order = np.lexsort((dist, ra))
    dist, ra = dist[order], ra[order]
    count = np.bincount(ra, minlength=n)
    start = np.r_[0, np.cumsum(count)[:-1]]
    out = np.full(n, np.inf)
    ok = count > 0
    c, s0 = count[ok], start[ok]
    out[ok] = (dist[s0 + (c - 1) // 2] + dist[s0 + c // 2]) / 2
    return out


def _shared_onsets(a: np.ndarray, b: np.ndarray, within: float) -> float:
    """Share of the onsets in ``a`` with one in ``b`` at most ``within`` samples away."""
    if a.size == 0 or b.size == 0:
        return 0.0
    return float(np.mean(_nearest(a, b) <= within))


def _same_timing(
    feat: np.ndarray,
    label: np.ndarray,
    k: int,
    near: np.ndarray,
    hz: float,
    params: SkeletonParams,
) -> bool:
    """Whether some cluster's bursts start at the instants of the cluster most like it: parts of
    one stage (a context-parallel pair, an expert-parallel group, RNICs alike in what they write
    to storage) resemble each other more than their stage, but share its gradient syncs to the
    sample, where two stages are a backward (or forward) pass apart."""
    sums = _group_sums(feat, label, k)
    size = np.bincount(label, minlength=k)
    on = [_onsets(m) for m in sums / size[:, None]]
    # how far a member's bursts start from its group's others (a group of two stages, as pairs
    # of stages of a one-replica pipeline would make, is as far apart as the stages)
    loo = (sums[label] - feat) / np.maximum(size[label] - 1, 1)[:, None]
    jitter = median(_row_onset_gaps(feat, loo))
    if jitter > _LOCKSTEP_S * hz:
        return True  # the members themselves are not in lockstep: not one DP group
    need = max(params.min_gap_s * hz, params.gap_ratio * float(jitter))
    return any(_onset_gap(on[c], on[near[c]]) < need for c in range(k))


def _shared_links(feat: np.ndarray, label: np.ndarray, order: np.ndarray, hz: float) -> np.ndarray:
    """``(k, k)`` in stage order: whether two groups start a share of their bursts in lockstep.

    Replicas of one stage (each replica's context-parallel pair, in lockstep) drift apart by
    their speed, often by less than a sample and either way, so at 10 Hz their burst series
    differ more than a CP pair's and can pass for pipeline stages; but the gradient syncs they
    share, and the steps where neither drifted, start in the same instant. Pipeline stages share
    none, bar what every RNIC of a job does at once (a checkpoint's writes): such groups are
    linked whole, not refused as stages (refusing would merge a real pipeline's stages too)."""
    k = order.size
    sums = _group_sums(feat, label, k)
    on = [_onsets(m) for m in (sums / np.bincount(label, minlength=k)[:, None])[order]]
    within = _LOCKSTEP_S * hz
    out = np.zeros((k, k), bool)
    for i in range(k):
        for j in range(i + 1, k):
            share = max(_shared_onsets(on[i], on[j], within), _shared_onsets(on[j], on[i], within))
            out[i, j] = out[j, i] = share >= _SHARED_ONSETS
    return out


def _check(
    sim: np.ndarray,
    feat: np.ndarray,
    label: np.ndarray,
    k: int,
    hz: float,
    params: SkeletonParams,
) -> float | None:
    """The score of a partition of items into ``k`` equal clusters, or None if some item is not
    clearly closer to its own cluster than to every other one, or two clusters burst at the same
    instants."""
    n = label.size
    g = n // k
    if np.bincount(label, minlength=k).tolist() != [g] * k or g < 2:
        return None
    onehot = np.zeros((n, k))
    onehot[np.arange(n), label] = 1.0
    s = sim - np.diag(np.diag(sim))
    to = s @ onehot  # similarity sums to each cluster
    own = to[np.arange(n), label] / (g - 1)
    to /= g
    to[np.arange(n), label] = -np.inf
    margin = own - to.max(axis=1)
    same = (label[:, None] == label[None, :]) & ~np.eye(n, dtype=bool)
    spread = float(robust_sd(sim[same])) if same.sum() > 3 else 0.0
    # a margin is a difference of two means over ~g similarities each
    need = max(_MIN_MARGIN, params.gap_ratio * spread * np.sqrt(1.0 / (g - 1) + 1.0 / g))
    if margin.min() < need:
        return None
    q = onehot.T @ s @ onehot
    np.fill_diagonal(q, -np.inf)
    if _same_timing(feat, label, k, q.argmax(axis=1), hz, params):
        return None
    return clip01(float(margin.min() / need) / 2.0)


def _balanced(sim: np.ndarray, label: np.ndarray, k: int) -> np.ndarray:
    """Equal clusters nearest to ``label``'s: every item to one of ``n/k`` slots per cluster, by
    assignment on the mean similarity to each cluster, twice."""
    n = label.size
    g = n // k
    for _ in range(2):
        onehot = np.zeros((n, k))
        onehot[np.arange(n), label] = 1.0
        to = sim @ onehot / np.maximum(onehot.sum(axis=0), 1.0)
        _, slot = linear_sum_assignment(-np.repeat(to, g, axis=1))
        label = slot // g
    return label


def _fits(sim: np.ndarray, label: np.ndarray, k: int) -> np.ndarray:
    """Per item, whether it is at least as close to its own cluster as to any other."""
    n = label.size
    onehot = np.zeros((n, k))
    onehot[np.arange(n), label] = 1.0
    s = sim - np.diag(np.diag(sim))
    to = s @ onehot / np.maximum(onehot.sum(0) - onehot, 1.0)
    own = to[np.arange(n), label]
    to[np.arange(n), label] = -np.inf
    return own >= to.max(axis=1)


def _kernels() -> tuple[Any, int] | None:
    """scipy's private kernels of ``linkage(y, "average")`` and ``fcluster(.., "maxclust")``:
    their public wrappers check the input and walk array-API layers that cost more than the tree
    of a job's few hosts. Private, so used only while they still give the public functions'
    results on a small tree (checked once here); otherwise the public functions are used."""
    try:
        from scipy.cluster import _hierarchy
        from scipy.cluster.hierarchy import _LINKAGE_METHODS

        average = _LINKAGE_METHODS["average"]
        y = np.array([0.3, 0.9, 0.5, 0.8, 0.4, 0.2])
        tree = _hierarchy.nn_chain(y, 4, average)
        label = np.zeros(4, np.intc)
        _hierarchy.cluster_maxclust_dist(tree, label, 4, 2)
        ok = np.array_equal(tree, linkage(y, "average")) and np.array_equal(
            label, fcluster(tree, 2, "maxclust")
        )
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return (_hierarchy, average) if ok else None


_KERNELS = _kernels()


def _average_linkage(y: np.ndarray, n: int) -> np.ndarray:
    """``linkage(y, "average")`` of the condensed distances ``y`` between ``n`` items."""
    if _KERNELS is None:
        return linkage(y, "average")
    hierarchy, average = _KERNELS
    return hierarchy.nn_chain(np.ascontiguousarray(y, np.float64), n, average)


def _maxclust(tree: np.ndarray, k: int) -> np.ndarray:
    """``fcluster(tree, k, "maxclust") - 1`` (``tree`` is what ``linkage`` just built)."""
    if _KERNELS is None:
        return (fcluster(tree, k, "maxclust") - 1).astype(np.int64)
    label = np.zeros(tree.shape[0] + 1, np.intc)
    _KERNELS[0].cluster_maxclust_dist(tree, label, label.size, k)
    return label.astype(np.int64) - 1


def _cluster(sim: np.ndarray, feat: np.ndarray, hz: float, params: SkeletonParams) -> _Clusters:
    """The finest clear split of items with similarity matrix ``sim`` into equal clusters that
    line up as a pipeline: average-linkage clusters, balanced when they come out unequal.
    Clusters that are clear but do not line up (each one's neighbours in the seriation are not
    its most similar) are parts of stages, not stages: a coarser split is tried."""
    n = sim.shape[0]
    one = _Clusters(np.zeros(n, np.int64), 1, 1.0, np.zeros(1, np.int64))
    if n < 4:
        return one
    dist = np.clip(1.0 - sim, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    tree = _average_linkage(squareform((dist + dist.T) / 2, checks=False), n)
    for k in range(n // 2, 1, -1):
        if n % k:
            continue
        label = _maxclust(tree, k)
        if label.max() + 1 == k and np.bincount(label).min() != n // k:
            label = _balanced(sim, label, k)
        c = _candidate(sim, feat, label, k, hz, params)
        if c is not None:
            return c
    return one


def _candidate(
    sim: np.ndarray,
    feat: np.ndarray,
    label: np.ndarray,
    k: int,
    hz: float,
    params: SkeletonParams,
) -> _Clusters | None:
    """``label`` as a stage split if it is clear and lines up as a pipeline."""
    score = _check(sim, feat, label, k, hz, params)
    if score is None:
        return None
    order, ordered, clear = _order(sim, label, k)
    return _Clusters(label, k, score, order, clear) if ordered else None


def _similarity(sim: np.ndarray, label: np.ndarray, k: int) -> np.ndarray:
    """``(k, k)``: the clusters' mean similarity."""
    onehot = np.zeros((label.size, k))
    onehot[np.arange(label.size), label] = 1.0
    return onehot.T @ sim @ onehot / np.outer(onehot.sum(0), onehot.sum(0))


def _fit(q: np.ndarray, order: np.ndarray) -> tuple[bool, bool]:
    """Whether every cluster's neighbours in ``order`` are (within ``_ORDER_SLACK``) its most
    similar clusters, and whether they lead every other cluster by ``_ORDER_MARGIN``."""
    k = order.size
    qo = q[np.ix_(order, order)]
    np.fill_diagonal(qo, -np.inf)
    ok = clear = True
    for i in range(k):
        nb = [j for j in (i - 1, i + 1) if 0 <= j < k]
        # a neighbour may trail another group by a little (two stages a pass apart in one
        # burst kind and two passes in the other look alike), not by a stage's worth
        top = np.sort(qo[i])[::-1][len(nb) - 1]
        ok &= bool(np.all(qo[i, nb] >= top - _ORDER_SLACK))
        rest = np.delete(qo[i], nb + [i])
        clear &= bool(rest.size == 0 or qo[i, nb].min() >= rest.max() + _ORDER_MARGIN)
    return ok, ok and clear


def _order(sim: np.ndarray, label: np.ndarray, k: int) -> tuple[np.ndarray, bool, bool]:
    """Stage order of clusters by spectral seriation of their mean similarity, and how it fits
    (:func:`_fit`: a clear order, or else another order fits about as well)."""
    if k <= 2:
        return np.arange(k), True, True
    q = _similarity(sim, label, k)
    w = q - q.min()
    np.fill_diagonal(w, 0.0)
    lap = np.diag(w.sum(axis=1)) - w
    _, vec = np.linalg.eigh(lap)
    order = np.argsort(vec[:, 1], kind="stable")
    return order, *_fit(q, order)


def _hint_order(sim: np.ndarray, c: _Clusters, h_rank: np.ndarray) -> np.ndarray | None:
    """When the traffic's stage order is a near tie: the order the rank hint gives the stages,
    as positions in ``c.order``, if the hint holds each stage in one block of ranks and that
    order fits the traffic too (within ``_ORDER_SLACK``); else None."""
    lo = np.array([h_rank[c.label == j].min() for j in range(c.k)])
    hi = np.array([h_rank[c.label == j].max() for j in range(c.k)])
    seq = np.argsort(lo)
    if np.any(lo[seq][1:] <= hi[seq][:-1]) or not _fit(_similarity(sim, c.label, c.k), seq)[0]:
        return None
    pos = np.empty(c.k, np.int64)
    pos[c.order] = np.arange(c.k)
    return pos[seq]


@dataclass(frozen=True, slots=True)
class Split:
    """The stage split of a job: per rail, a ``(k, g)`` array of endpoint indices (stage blocks
    in pipeline order; rows of a block in rank-hint order, else host order)."""

    blocks: list[np.ndarray]
    score: float  # the weakest boundary's clarity (1 when no boundary)
    how: str
    coherence: np.ndarray  # each split item's correlation with its group's other members
    order_clear: bool = True  # see _Clusters.order_clear
    #: ``(k, k)`` in stage order: groups sharing burst instants (:func:`_shared_links`); None
    #: where the split is per rail
    shared: np.ndarray | None = None
    #: :func:`host_quartile` of the series, hosts in sorted order (the pipeline chain reads it)
    quartile: np.ndarray | None = None
    #: where the traffic's stage order is a near tie, the rank hint's order of the blocks (their
    #: positions; :func:`_hint_order`): the same order (``order_clear`` then True: the hint
    #: settles the tie), or another one whose neighbours are linked beside the traffic's
    hint_order: np.ndarray | None = None


def coherence(feat: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Each item's correlation with the mean of its cluster's other members (do the cluster's
    bursts co-occur?); items alone in their cluster are left out."""
    k = int(label.max()) + 1
    sums = _group_sums(feat, label, k)
    size = np.bincount(label, minlength=k)
    keep = size[label] > 1
    if keep.all():  # the usual case: no copy of the series
        loo = sums[label]
        loo = standardize(np.subtract(loo, feat, out=loo), inplace=True)
        return (loo * feat).mean(axis=1)
    loo = standardize(sums[label[keep]] - feat[keep], inplace=True)
    return (loo * feat[keep]).mean(axis=1) if keep.any() else np.ones(1)


def _rank_rows(idx: np.ndarray, rank: np.ndarray, host: np.ndarray) -> np.ndarray:
    return idx[np.lexsort((host[idx], rank[idx]))]


def _blocks(stage, order, k, rail_inv, n_rails, rank, host) -> list[np.ndarray]:
    """Per rail, the ``(k, g)`` block of each stage's RNICs in pipeline order (``stage``: a
    host-wide label per RNIC, every rail with the same equal groups), rows as
    :func:`_rank_rows` orders them: one stable sort for all rails."""
    pos = np.empty(k, np.int64)
    pos[order] = np.arange(k)
    idx = np.lexsort((host, rank, pos[stage], rail_inv))
    return list(idx.reshape(n_rails, k, -1))


def _burst_part(x: np.ndarray, hz: float) -> np.ndarray:
    """What exceeds three times a series' median rate and half its peak rate (for at least
    ``_MIN_BURST_S``: a grey opening removes shorter spikes). The peak is the 99th percentile of
    the series opened so (its bursts that last, without the spikes riding on them) where that
    reaches ``_LONG_PEAK`` of the whole series' own, else of the whole series (a gradient sync
    at line rate may last one sample)."""
    # Quantiles of every sample. Those of every tenth-second one (a tenth of the cost) alias
    # with a job's period: a gradient sync one sample long recurs on the same tenth of a
    # second, so the subsample held every sync or none. Holding none, the peak was the idle
    # rate, the level near zero and every byte of probing a "burst" (the demo's 4 s iterations:
    # its DP 4 job's hosts in bursts 62 % of the time, one inference in two; on CI its PP 2 x
    # DP 2 job read as one stage without collective bursts). Spikes riding on longer bursts
    # (all-to-alls on a gradient sync) were left out of the peak only when the subsample
    # happened to miss them (tests/analysis/test_skeleton.py, 4 of its 10 phases failed).
    q = row_quantiles(x, (0.5, 0.99))
    peak = q[1]
    width = int(round(_MIN_BURST_S * hz))
    opened = None
    if width > 1:
        # a flat opening along time: erosion then dilation (grey_opening with size (1, width),
        # without its n-d machinery; outputs given: left to the filters, they are zeroed first).
        # Of the series itself: shifting a row by its level and clipping at zero commute with
        # it, so the burst part's opening below is this one shifted
        eroded = minimum_filter1d(x, width, axis=1, output=np.empty_like(x))
        opened = maximum_filter1d(eroded, width, axis=1, output=np.empty_like(eroded))
        lasting = row_quantiles(opened, (0.99,))[0]
        peak = np.where(lasting >= _LONG_PEAK * peak, lasting, peak)
    level = np.maximum(3.0 * q[0], 0.5 * peak)[:, None]
    y = x - level
    np.maximum(y, 0.0, out=y)
    if opened is not None:
        np.subtract(opened, level, out=opened)
        np.maximum(opened, 0.0, out=opened)
        # a series whose bursts are mostly shorter than that (a gradient sync at line rate may
        # last a tenth of a second) is kept whole rather than erased. Mostly in time, not in
        # bytes: an all-to-all spike riding on a gradient sync outweighs the sync's plateau
        # above the level, and a series kept whole for it bursts at its spikes, which the
        # other expert-parallel group's series, opened, does not (a job's groups that share
        # every sync then look like stages apart)
        kept = np.count_nonzero(opened, axis=1) >= 0.25 * np.count_nonzero(y, axis=1)
        if not kept.all():
            opened[~kept] = y[~kept]
        y = opened
    return y


def bursts(x: np.ndarray, hz: float, part: np.ndarray | None = None) -> np.ndarray:
    """The standardized collective bursts of each series (:func:`_burst_part`). Gradient syncs
    and parameter all-gathers are a stage's own bursts, identical on every member; pipeline
    sends, a context-parallel ring's steps, MoE all-to-alls, loads and checkpoints run shorter
    or lower, and some of those tie a replica's RNICs together more than their stage (the whole
    series would split a stage into its CP pairs or EP groups). Series without bursts are kept
    whole. ``part``: :func:`_burst_part` of ``x`` when the caller has it already."""
    y = _burst_part(x, hz) if part is None else part
    if np.any(y.max(axis=1) <= 0):
        y = x
    return standardize(y)


def _collective(part: np.ndarray) -> bool:
    """Whether burst parts (:func:`_burst_part`, one row per host) look like collectives: every
    host has some, and they fill at most ``_MAX_BURST_DUTY`` of the time."""
    return bool((part.max(axis=1) > 0).all()) and (
        float(median((part > 0).mean(axis=1))) <= _MAX_BURST_DUTY
    )


def host_quartile(x: np.ndarray, hinv: np.ndarray, rail_inv: np.ndarray) -> np.ndarray:
    """Per host (``hinv``: host index per row, every host on the same rails once each), the lower
    quartile of its rails' series, interpolated as ``np.quantile`` does."""
    n_h = int(hinv.max()) + 1
    n_r = x.shape[0] // n_h
    row = np.empty((n_h, n_r), np.int64)
    row[hinv, rail_inv] = np.arange(x.shape[0])
    # a host's rails in consecutive rows (the usual order) are a view of each rail, else a copy
    by_rail = (
        x.reshape(n_h, n_r, -1).transpose(1, 0, 2)
        if np.array_equal(row.ravel(), np.arange(x.shape[0]))
        else x[row.T]
    )
    q = 0.25 * (n_r - 1)
    lo, hi = int(np.floor(q)), int(np.ceil(q))
    # The hi + 1 smallest of each host's rails, kept sorted while the rails come in one by one
    # (an insertion, two elementwise passes per place): a sort along the rails, strided, costs
    # two to three times more; min and max pick values, so the result is the sort's to the bit.
    # The first rails fill the places (what a minimum with infinity would give).
    low: list[np.ndarray] = []
    tmp = np.empty((n_h, x.shape[1]))
    for v in by_rail:
        filled = len(low)
        if filled <= hi:
            low.append(np.maximum(low[-1], v) if low else v.copy())
        for j in range(min(filled, hi + 1) - 1, 0, -1):
            np.minimum(low[j], np.maximum(low[j - 1], v, out=tmp), out=low[j])
        if filled:
            np.minimum(low[0], v, out=low[0])
    return low[lo] + (q - lo) * (low[hi] - low[lo])


def split_stages(
    x: np.ndarray,
    host: np.ndarray,
    hinv: np.ndarray,
    rail_inv: np.ndarray,
    n_rails: int,
    rank: np.ndarray,
    hinted: bool,
    hz: float,
    params: SkeletonParams,
) -> Split:
    """Stage blocks per rail from the byte series ``x`` at ``hz`` (and a rank hint); ``hinv``
    numbers the hosts (``np.unique(host, return_inverse=True)``)."""
    n_h = int(hinv.max()) + 1
    # a host's rails burst together when it holds one stage; the lower quartile of its rails
    # keeps those bursts and drops what a few rails carry alone (co-tenant or storage flows,
    # which may outgrow the bursts themselves), before the bursts are cut out
    quartile = host_quartile(x, hinv, rail_inv)
    part_h = _burst_part(quartile, hz)
    feat = bursts(quartile, hz, part_h)
    sim_h = feat @ feat.T / x.shape[1]
    one = np.zeros(n_h, np.int64)
    if not _collective(part_h):
        # a host without bursts, or "bursts" most of the time (a pipeline's own sends), means
        # no collective between containers (a job without data parallelism): no DP group
        blocks = _blocks(one[hinv], np.zeros(1, np.int64), 1, rail_inv, n_rails, rank, host)
        how = "no collective bursts: one group per rail"
        return Split(blocks, 1.0, how, coherence(feat, one), quartile=quartile)
    c = _cluster(sim_h, feat, hz, params)
    how = "stages split by burst similarity per host"
    h_rank = None
    if hinted:
        h_rank = np.zeros(n_h, np.int64)
        h_rank[hinv] = rank
        h_rank = np.argsort(np.argsort(h_rank, kind="stable"), kind="stable")
        # the hint's blocks, tested with the same margin, when finer than the traffic's own
        for k in range(n_h // 2, c.k, -1):
            if n_h % k:
                continue
            hc = _candidate(sim_h, feat, h_rank // (n_h // k), k, hz, params)
            if hc is not None:
                c, how = hc, "rank layout confirmed by burst similarity"
                break
    if c.k == 1:
        blocks = _blocks(c.label[hinv], c.order, 1, rail_inv, n_rails, rank, host)
        coh = coherence(feat, c.label)
        return Split(blocks, c.score, how, coh, c.order_clear, quartile=quartile)
    coh = coherence(feat, c.label)
    if coh.min() < _LOCKSTEP_COHERENCE:
        # Faster samples see a pipeline's train of sends as a comb of short bursts, and a 1F1B
        # schedule's stages s and s + 3 (a backward is two forwards) send in the same phase:
        # their combs pass for one group's bursts; neighbouring stages exchange the sends, so
        # theirs correlate too, per second as well (a PP4 DP1 job read as 2 stages x 2
        # replicas, its middle link unprobed: CI draw 1535673014). A DP group runs one
        # collective, so its members' burst series are the same series; stages differ in
        # warm-up and cool-down. Groups alike only in part are no DP groups.
        blocks = _blocks(one[hinv], np.zeros(1, np.int64), 1, rail_inv, n_rails, rank, host)
        how = (
            f"groups alike only in part (a member's coherence {coh.min():.2f} < "
            f"{_LOCKSTEP_COHERENCE}): one group per rail"
        )
        return Split(blocks, 1.0, how, coherence(feat, one), quartile=quartile)
    shared = _shared_links(feat, c.label, c.order, hz)
    clear, hint_order = c.order_clear, None
    if h_rank is not None and not clear:
        hint_order = _hint_order(sim_h, c, h_rank)
        ident = np.arange(c.k)
        if hint_order is not None and (
            np.array_equal(hint_order, ident) or np.array_equal(hint_order, ident[::-1])
        ):
            clear = True
    # the rails must agree (one stage per container): a host holding several stages does not,
    # and then most of its RNICs sit nearer another group on their own rail; each RNIC's own
    # burst series tells (not needed above: most jobs are a few hosts of one stage)
    z = bursts(x, hz)
    fit = [
        _fits(z[idx] @ z[idx].T / z.shape[1], c.label[hinv[idx]], c.k)
        for idx in (np.flatnonzero(rail_inv == r) for r in range(n_rails))
    ]
    share = float(np.mean(np.concatenate(fit)))
    if share >= 0.8:
        blocks = _blocks(c.label[hinv], c.order, c.k, rail_inv, n_rails, rank, host)
        return Split(blocks, c.score, how, coh, clear, shared, quartile, hint_order)
    per_rail = _split_per_rail(z, rail_inv, n_rails, rank, host, hz, params)
    if max(b.shape[0] for b in per_rail.blocks) == 1:
        # No rail resolves anything alone. Co-tenant or storage flows on single RNICs
        # (independent per RNIC) blur each rail's own series and the RNIC-to-RNIC similarities
        # above, which the hosts' lower quartile drops; then each RNIC still correlates best
        # with its own group's (clean) host series. An RNIC of a host holding several stages
        # does not: its stage's bursts are missing from its host's quartile.
        onehot = np.zeros((n_h, c.k))
        onehot[np.arange(n_h), c.label] = 1.0
        corr = z @ standardize(onehot.T @ feat).T / z.shape[1]
        mine = c.label[hinv]
        own = corr[np.arange(mine.size), mine]
        corr[np.arange(mine.size), mine] = -np.inf
        near = float(np.mean(own >= corr.max(axis=1)))
        if near >= 0.8:
            blocks = _blocks(c.label[hinv], c.order, c.k, rail_inv, n_rails, rank, host)
            how += (
                f" (rails too noisy alone: {share:.0%} of RNICs nearest their group's RNICs, "
                f"{near:.0%} nearest its host series)"
            )
            return Split(blocks, c.score, how, coh, clear, shared, quartile, hint_order)
    return replace(per_rail, quartile=quartile)


def _split_per_rail(z, rail_inv, n_rails, rank, host, hz, params) -> Split:
    """Stage blocks from each rail's own burst series (containers holding several stages)."""
    blocks, scores, coh, clear = [], [], [], True
    for r in range(n_rails):
        idx = np.flatnonzero(rail_inv == r)
        zr = z[idx]
        sim = zr @ zr.T / z.shape[1]
        c = _cluster(sim, zr, hz, params)
        coh.append(coherence(zr, c.label))
        pos = np.empty(c.k, np.int64)
        pos[c.order] = np.arange(c.k)
        st = pos[c.label]
        blocks.append(np.stack([_rank_rows(idx[st == j], rank, host) for j in range(c.k)]))
        scores.append(c.score)
        clear &= c.order_clear
    how = "stages split by burst similarity per rail"
    return Split(blocks, float(min(scores)), how, np.concatenate(coh), clear)
