"""Stage 4: pipeline partners from each replica's timing, with a rank hint as a prior.

The DP replicas of a stage burst together at the gradient sync, but between syncs each replica
runs its own pipeline: its compute speed, its stragglers and its operations' jitter shift all of
its sends and receives, in every stage, by the same amount. So a replica leaves a *timing
fingerprint*: per window of ``fingerprint_s``, each RNIC's offset from its DP group's mean
series (the residual projected on the mean's derivative, a first-order Taylor estimate of a
small shift). Pipeline partners are the same replica in adjacent stages, so their fingerprints
correlate, and replicas of one stage do not. The offsets are small — a sampling rate that
resolves a microbatch's sends (~10 Hz) shows them far better than 1 Hz.

Per stage boundary, fingerprint correlations are pooled over the rails with the same hosts (a
replica's TP ranks move together) and partners assigned one to one (Hungarian). A partner found
from traffic alone must beat the null spread by ``pair_z`` and the runner-up by
``pair_margin_z``; a rank hint's partner (replica *i* of a stage feeds replica *i* of the next,
replicas in rank order) needs only ``confirm_z`` and no competitor ahead of it. A hint that the
evidence clearly contradicts is dropped and counted; a row without enough evidence keeps every
RNIC of the adjacent group (the list grows, never silently shrinks). With TX and RX apart, the
shared sends' correlation is added to the fingerprints'; as it also carries the replicas' timing,
with a sign the stages' schedules set, the fingerprints alone decide the rows the sum leaves open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.ndimage import uniform_filter1d
from scipy.optimize import linear_sum_assignment

from skh.analysis.skeleton.model import (
    SkeletonParams,
    bipartite,
    both_ways,
    median,
    robust_sd,
    row_quantiles,
    standardize,
)

__all__ = ["Boundary", "Evidence", "PairStats", "fingerprints", "pair_boundaries", "shared_sends"]


def _sync_cap(means: np.ndarray) -> np.ndarray:
    """Per group, the rate above which a sample is the group's own collective burst: three times
    its median rate, or a tenth of its peak (99th percentile) when it idles between bursts."""
    q = row_quantiles(means, (0.5, 0.99))
    return np.maximum(3.0 * q[0], 0.1 * q[1])


@dataclass(frozen=True, slots=True)
class _Groups:
    """The RNICs' groups: a dense index per RNIC, each group's size, and per group size the
    groups of that size with their members (``(groups, size)`` rows, in row order)."""

    gid: np.ndarray
    sizes: np.ndarray
    by_size: list[tuple[np.ndarray, np.ndarray]]


def _groups(group: np.ndarray) -> _Groups:
    order = np.argsort(group, kind="stable")
    starts = np.r_[0, np.flatnonzero(np.diff(group[order])) + 1]
    sizes = np.diff(np.r_[starts, group.size])
    gid = np.empty(group.size, np.int64)
    gid[order] = np.repeat(np.arange(starts.size), sizes)
    by_size = []
    for s in np.unique(sizes).tolist():
        which = np.flatnonzero(sizes == s)
        by_size.append((which, order[starts[which][:, None] + np.arange(s)]))
    return _Groups(gid, sizes, by_size)


def _pairwise(v: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    """numpy's pairwise sum (``pairwise_sum`` in its add loop: in order below 8 terms, eight
    running sums in blocks of 128, halves above) of the rows ``v[rows[i]]``, element by
    element, in whole-row passes."""
    n = len(rows)
    if n < 8:
        out = v[rows[0]]  # numpy starts from -0.0, which changes no term
        for r in rows[1:]:
            out += v[r]
        return out
    if n <= 128:
        acc = [v[r] for r in rows[:8]]
        i = 8
        while i < n - n % 8:
            for j in range(8):
                acc[j] += v[rows[i + j]]
            i += 8
        out = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for r in rows[i:]:
            out += v[r]
        return out
    half = n // 2 - (n // 2) % 8
    return _pairwise(v, rows[:half]) + _pairwise(v, rows[half:])


def _means(v: np.ndarray, groups: _Groups) -> np.ndarray:
    """Each group's mean series: ``np.add.reduceat`` over its members' rows in row order, over
    its size, to the bit. reduceat adds the first row to numpy's pairwise sum of the others
    column by column, a strided pass per column (and its members gathered first); here the
    same sums in whole-row passes over the members."""
    out = np.empty((groups.sizes.size, v.shape[1]))
    for which, members in groups.by_size:
        first = v[members[:, 0]]
        if members.shape[1] > 1:
            first += _pairwise(v, list(members[:, 1:].T))
        out[which] = first / members.shape[1]
    return out


def fingerprints(
    x: np.ndarray, group: np.ndarray, hz: float, params: SkeletonParams
) -> tuple[np.ndarray, int]:
    """Per-RNIC timing offset from its group's mean series, one per window of ``fingerprint_s``
    (at least 5 samples), and the number of windows. Members of single-RNIC groups get zeros
    (no group to be offset from).

    The offset is the residual (series minus group mean) projected on the mean's derivative: a
    first-order estimate that stays linear for shifts below a sample, where a cross-correlation
    peak would alias on a dense train of sends. The gradient-sync bursts are clipped first (at
    three times the group's median rate): the group makes them in lockstep, so they carry no
    replica timing, and their edges would drown the sends' in sampling-clock noise.
    """
    n, t_len = x.shape
    w = max(5, int(round(params.fingerprint_s * hz)))
    nw = t_len // w
    if nw < 3:
        return np.zeros((n, 0)), 0
    groups = _groups(group)
    gid, sizes = groups.gid, groups.sizes
    z = standardize(np.minimum(x, _sync_cap(_means(x, groups))[gid][:, None]), inplace=True)
    means = _means(z, groups)
    # residual and its product with the derivative in z's place (no other use of it)
    resid = np.subtract(z, means[gid], out=z)[:, : nw * w].reshape(n, nw, w)
    deriv = np.gradient(means, axis=1)[:, : nw * w].reshape(-1, nw, w)
    num = np.multiply(resid, deriv[gid], out=resid).sum(axis=2)
    den = (deriv**2).sum(axis=2)[gid] + 1e-12
    delta = -num / den
    delta[sizes[gid] < 2] = 0.0
    return delta, nw


def shared_sends(
    tx: np.ndarray, rx: np.ndarray, group: np.ndarray, hz: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each RNIC's sent and received bytes with its group's mean and everything slower than
    ~0.3 s removed, standardized: a pipeline send is one pulse on the sender's TX and the
    receiver's RX in the same sample, so partners' series share spikes nobody else has."""
    groups = _groups(group)
    gid = groups.gid
    width = max(3, int(round(0.3 * hz)) | 1)
    out = []
    cap = _sync_cap(_means(tx + rx, groups))[gid]
    for v in (tx, rx):
        v = np.minimum(v, cap[:, None])  # the lockstep bursts carry no partner
        r = np.subtract(v, _means(v, groups)[gid], out=v)
        slow = uniform_filter1d(r, width, axis=1, output=np.empty_like(r))  # not zeroed first
        out.append(standardize(np.subtract(r, slow, out=slow), inplace=True))
    return out[0], out[1]


@dataclass(frozen=True, slots=True)
class Boundary:
    """Two adjacent stage blocks on one rail: endpoint indices, rows in rank order."""

    a: np.ndarray
    b: np.ndarray
    #: keep the whole other group for every row (the groups may be replicas of one stage)
    whole: bool = False


@dataclass(slots=True)
class PairStats:
    links: int = 0
    evidence: int = 0  # partners named by traffic alone
    confirmed: int = 0  # rank-hint partners confirmed by traffic
    contradicted: int = 0  # rank-hint partners the traffic names another partner for
    unconfirmed: int = 0  # rank-hint partners the traffic could not confirm (not used)
    sets: int = 0  # rows keeping a few tied candidates (replicas that move together)
    widened: int = 0  # of them, rows whose set grew to the block its tied rows share
    whole: int = 0  # rows keeping the whole adjacent group
    null_z: list[float] = field(default_factory=list)


_NULL_SHIFTS = 8


def _shifts(t_len: int, min_shift: int, period: float) -> np.ndarray:
    """Circular shifts for the null: whole iterations (``period`` samples). Every replica starts
    an iteration with the others, so at no shift two replicas' schedules are in phase, and
    only a shift by whole iterations keeps them so while their timing draws differ; other
    shifts would make the null too narrow. Without a period, spread shifts."""
    if period > 0:
        cand = np.arange(1, int(t_len / period) + 1) * period
        cand = cand[(cand >= min_shift) & (cand <= t_len - min_shift)]
        if cand.size >= 3:
            pick = np.linspace(0, cand.size - 1, min(_NULL_SHIFTS, cand.size))
            return np.rint(cand[np.rint(pick).astype(np.int64)]).astype(np.int64)
    return np.linspace(min_shift, t_len - min_shift, _NULL_SHIFTS).astype(np.int64)


def _zscores(
    c: np.ndarray, pair: Any, t_len: int, min_shift: int, floor: float, period: float
) -> np.ndarray:
    """Evidence matrix ``c`` in units of its null: the same statistic between the series with one
    side circularly shifted by ``min_shift`` or more samples (``pair(shift)``), where no send can
    be shared and no timing agree, over every pair and a few shifts. It keeps the series' own
    autocorrelation, and stays right however many entries carry signal (a whole expert-parallel
    group may). Too short a series falls back to the matrix's median and robust spread, floored
    at ``floor``."""
    if t_len >= 4 * min_shift:
        null = np.stack([pair(int(k)) for k in _shifts(t_len, min_shift, period)])
        return (c - null.mean()) / max(floor, float(null.std()))
    if c.size > 4:
        return (c - median(c.ravel())) / max(floor, float(robust_sd(c.ravel())))
    return c / floor


def _evidence(a_rows, b_rows, fp, nw, window_s, sends, hz: float, period_s: float) -> np.ndarray:
    """Partner evidence (z units) between the rows of two stage blocks pooled over rails, as a
    ``(views, g, g)`` stack: the timing fingerprints' and, with TX/RX apart, the shared sends'
    combined (summed), then the fingerprints' alone (:func:`_decide` says why both)."""
    g = a_rows[0].size
    zs = []
    if nw:
        # a replica's TP ranks move together: its rails' offsets are one signal plus noise
        da = standardize(sum(fp[a] for a in a_rows), inplace=True)
        db = standardize(sum(fp[b] for b in b_rows), inplace=True)

        def fp_corr(k: int) -> np.ndarray:
            return da @ np.roll(db, k, axis=1).T / nw

        zs.append(_zscores(fp_corr(0), fp_corr, nw, 10, 1.0 / np.sqrt(nw), period_s / window_s))
    if sends is not None:
        tx, rx = sends
        t = tx.shape[1]
        # every rail's rows side by side, (g, rails, t): one product per shift for all rails
        ia, ib = np.stack(a_rows, axis=1), np.stack(b_rows, axis=1)
        a_tx, a_rx = tx[ia].reshape(g, -1), rx[ia].reshape(g, -1)
        b_tx, b_rx = tx[ib], rx[ib]

        def sends_corr(k: int) -> np.ndarray:
            # A's sends with B's receives and B's sends with A's receives, B shifted by k
            c = a_tx @ np.roll(b_rx, k, axis=2).reshape(g, -1).T
            c += a_rx @ np.roll(b_tx, k, axis=2).reshape(g, -1).T
            return c / (t * len(a_rows))

        zs.append(
            _zscores(sends_corr(0), sends_corr, t, int(5 * hz) + 1, 1.0 / np.sqrt(t), period_s * hz)
        )
    if not zs:
        return np.zeros((1, g, g))
    if len(zs) == 1:
        return zs[0][None]
    return np.stack([sum(zs) / np.sqrt(len(zs)), zs[0]])


def pair_boundaries(
    boundaries: list[Boundary],
    fp: np.ndarray,
    nw: int,
    sends: tuple[np.ndarray, np.ndarray] | None,
    host: np.ndarray,
    ep_id: np.ndarray,
    hinted: bool,
    hz: float,
    period_s: float,
    params: SkeletonParams,
    prior: Evidence | None = None,
) -> tuple[list[np.ndarray], PairStats, Evidence]:
    """Pairs across each stage boundary, and what decided them.

    Per row: the partner the assignment names when it beats the null by ``pair_z`` and the
    runner-up by ``pair_margin_z``; with a hint, the hint's partner when it beats the null by
    ``confirm_z`` and every other candidate of its row and column by the same margin, or when
    the evidence's assignment picks the hint's partner, the rows where it does together beat
    the null by ``confirm_z`` and this row agrees (at least one sigma, no candidate a sigma
    ahead, no strong rival within the margin); else,
    when a few candidates tie for the best (replicas that move together: the CP ranks of a
    replica, the replicas of an MoE expert-parallel group) and beat every other by the margin,
    all of them, and every candidate of the rows whose sets share one with it
    (:func:`_close_ties`); else the whole adjacent group.

    ``prior`` is the evidence of earlier windows of the same job (per boundary, keyed by its two
    host sets): it adds up with this window's (Stouffer, weighted by seconds, at most
    ``MAX_EVIDENCE_S``), and the sum is returned for the next window.
    """
    seconds = nw * params.fingerprint_s if nw else 0.0
    if sends is not None:
        seconds = sends[0].shape[1] / hz
    evidence: Evidence = {}
    pooled: dict[tuple[bytes, bytes], list[Boundary]] = {}
    for bd in boundaries:
        key = (np.sort(host[bd.a]).tobytes(), np.sort(host[bd.b]).tobytes())
        pooled.setdefault(key, []).append(bd)
    out: list[np.ndarray] = []
    st = PairStats()
    for key, members in pooled.items():
        # align every rail's rows on the first rail's hosts, so rails pool row by row
        ref = members[0]
        aligned = [
            (bd.a[_align(host[ref.a], host[bd.a])], bd.b[_align(host[ref.b], host[bd.b])])
            for bd in members
        ]
        g = ref.a.size
        pos = np.arange(g)  # the hint's partner: the same row (rank order) of the next stage
        sets = [np.zeros(0, np.int64)] * g
        grown = np.zeros(g, bool)
        if ref.whole:
            ok_find = ok_hint = contra = np.zeros(g, bool)
            col = pos
        elif g == 1:
            ok_find = ok_hint = np.ones(1, bool)
            col = np.zeros(1, np.int64)
            contra = np.zeros(1, bool)
        else:
            zv = _evidence(
                [a for a, _ in aligned],
                [b for _, b in aligned],
                fp,
                nw,
                max(5, round(params.fingerprint_s * hz)) / hz,
                sends,
                hz,
                period_s,
            )
            zv = _accumulate(key, zv, host[ref.a], host[ref.b], seconds, prior, evidence)
            col, ok_find, ok_hint, sets, best = _decide(zv[0], params)
            sets, grown = _close_ties(sets, g)
            st.null_z.append(float(median(best)))
            if zv.shape[0] > 1:
                # The shared-sends statistic at 10 Hz carries the replicas' own timing too, with
                # a sign set by the two stages' schedules: on TP = PP = DP = 8 it reads about -3
                # sigma for the true partners of interior stages (and the other rows of their
                # column up to +4), +10 between the first and the last stage, which exchange
                # nothing. Summed with the fingerprints it can cancel them. The fingerprints
                # alone say which rows are one replica (partners are one replica in adjacent
                # stages), by the same rules: they decide the rows the sum leaves open, on
                # columns the sum has not given to another row.
                f_col, f_find, f_hint, _, _ = _decide(zv[1], params)
                taken = np.zeros(g, bool)
                taken[col[ok_find]] = True
                add = f_find & ~ok_find & ~taken[f_col]
                ok_find = ok_find | add
                col = np.where(add, f_col, col)
                ok_hint = ok_hint | (f_hint & ~(f_find & (f_col != pos)) & ~taken[pos])
            contra = ok_find & (col != pos)
        for a, b in aligned:
            st.links += g
            if hinted:
                use = ok_hint & ~contra
                st.confirmed += int(use.sum())
                st.contradicted += int(contra.sum())
                st.unconfirmed += int((~use & ~contra).sum())
                partner = np.where(use, pos, col)
                decided = use | ok_find
                st.evidence += int((ok_find & ~use).sum())
            else:
                partner = col
                decided = ok_find
                st.evidence += int(ok_find.sum())
            if decided.any():
                sel = np.flatnonzero(decided)
                out.append(both_ways(ep_id[a[sel]], ep_id[b[partner[sel]]]))
            for i in np.flatnonzero(~decided):
                if sets[i].size:
                    st.sets += 1
                    st.widened += int(grown[i])
                    out.append(bipartite(ep_id[a[i : i + 1]], ep_id[b[sets[i]]]))
                else:
                    # no clear partner: keep every adjacent-stage RNIC of the other group
                    st.whole += 1
                    out.append(bipartite(ep_id[a[i : i + 1]], ep_id[b]))
            # an RNIC of the other stage nobody chose keeps this whole group too
            taken = np.zeros(b.size, bool)
            taken[partner[decided]] = True
            for i in np.flatnonzero(~decided):
                taken[sets[i]] = True
            if not taken.all():
                out.append(bipartite(ep_id[b[~taken]], ep_id[a]))
    return out, st, evidence


def _decide(z: np.ndarray, params: SkeletonParams):
    """One evidence matrix's verdict per row: the assignment's partner, whether traffic alone
    names it, whether it confirms the hint's partner (the same row), a tie set, and each row's
    assigned z (see :func:`pair_boundaries`)."""
    g = z.shape[0]
    pos = np.arange(g)
    row, col = linear_sum_assignment(-z)
    best = z[row, col]
    masked = z.copy()
    masked[row, col] = -np.inf
    runner = np.maximum(masked.max(axis=1), masked[:, col].max(axis=0))
    ok_find = (best >= params.pair_z) & (best - runner >= params.pair_margin_z)
    if g == 2:
        # two replicas' residuals are each other's negative: whatever is left of them
        # (replicas that move together leave no sends in it) reads as one partner or
        # the other with equal confidence, so traffic alone does not pair them
        ok_find[:] = False
    hint_z = z[pos, pos]
    others = z.copy()
    others[pos, pos] = -np.inf
    rival = np.maximum(others.max(axis=1), others.max(axis=0)[pos])
    lead = hint_z - rival
    # a row confirms the hint alone, or the hint's rows together do (their evidence adds
    # up over the boundary) and this row agrees: positive, no candidate clearly ahead,
    # and no strong rival alongside (a tie of replicas that move together, which the
    # hint would break at random)...
    # ... together over the rows where the hint is what the evidence's assignment picks
    agree = col == pos
    joint = float(hint_z[agree].sum() / np.sqrt(agree.sum())) if agree.any() else 0.0
    tied = (rival >= params.pair_z) & (lead < params.pair_margin_z)
    ok_hint = ((hint_z >= params.confirm_z) & (lead >= params.pair_margin_z)) | (
        agree & (joint >= params.confirm_z) & (hint_z >= 1.0) & (lead >= -1.0) & ~tied
    )
    sets = [np.zeros(0, np.int64)] * g
    top = z.max(axis=1)
    for i in np.flatnonzero(~ok_find & (top >= params.pair_z)) if g > 2 else ():
        # a tie of at least two (one alone would be a partner the margin refused)
        tie = np.flatnonzero(z[i] >= top[i] - params.pair_margin_z)
        rest = np.delete(z[i], tie)
        if 2 <= tie.size <= g // 2 and (
            rest.size == 0 or z[i, tie].min() - rest.max() >= params.pair_margin_z
        ):
            sets[i] = tie
    return col, ok_find, ok_hint, sets, best


def _close_ties(sets: list[np.ndarray], g: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Tie sets closed over the rows they share candidates with, and which rows grew.

    Replicas that move together (an MoE expert-parallel group) tie as a block: each of their rows
    ties with every replica of the block in the next stage, and which one is the partner the
    evidence cannot say. Noise in a strong block (z ~20 +- 3 on a 4-replica EP group) leaves
    some row's set short of the block, and the true partner, taken by the block's other rows'
    sets, was then probed by none of them: a silent miss. So rows whose sets share a candidate
    are one block, and each keeps every candidate of it (one larger than half the group keeps
    the whole group, as the set rule would)."""
    parent = np.arange(2 * g)  # rows 0..g-1, candidates g..2g-1

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    for i, s in enumerate(sets):
        for j in s:
            parent[root(g + int(j))] = root(i)
    roots = np.array([root(g + j) for j in range(g)])
    grown = np.zeros(g, bool)
    out = list(sets)
    for i, s in enumerate(sets):
        if s.size:
            block = np.flatnonzero(roots == root(i))
            grown[i] = block.size > s.size
            out[i] = block if block.size <= g // 2 else np.zeros(0, np.int64)
    return out, grown


#: evidence older than this much traffic no longer counts (a job's timing may drift)
MAX_EVIDENCE_S = 1800.0

#: per stage boundary (its two host sets): the z matrices (views of :func:`_evidence`) in host
#: order, and their seconds
Evidence = dict[tuple[bytes, bytes], tuple[np.ndarray, float]]


def _accumulate(key, z, hosts_a, hosts_b, seconds, prior: Evidence | None, out: Evidence):
    """This window's z matrix combined with the prior's of the same boundary; recorded in
    ``out`` (host order) and returned in the rows' order."""
    ia, ib = np.argsort(hosts_a, kind="stable"), np.argsort(hosts_b, kind="stable")
    zs = z[:, ia][:, :, ib]
    w = seconds
    prev = None
    if prior is not None:
        if key in prior:
            prev = prior[key]
        elif key[::-1] in prior:  # the stages came out in the other order
            prev = (prior[key[::-1]][0].transpose(0, 2, 1), prior[key[::-1]][1])
    if prev is not None and prev[0].shape == zs.shape:
        zp, wp = prev
        wp = min(wp, max(MAX_EVIDENCE_S - w, 0.0))
        if wp > 0:
            zs = (zs * np.sqrt(w) + zp * np.sqrt(wp)) / np.sqrt(w + wp)
            w += wp
    out[key] = (zs, w)
    back_a, back_b = np.argsort(ia), np.argsort(ib)
    return zs[:, back_a][:, :, back_b]


def _align(ref_hosts: np.ndarray, hosts: np.ndarray) -> np.ndarray:
    """Permutation of ``hosts`` that lists them in the order of ``ref_hosts`` (same sets)."""
    o = np.argsort(hosts, kind="stable")
    return o[np.searchsorted(hosts[o], ref_hosts)]
