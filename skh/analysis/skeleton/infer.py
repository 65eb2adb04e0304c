"""The entry points: :func:`infer_skeleton` runs the stages in order; :func:`traffic_changed` tells
when to run them again."""

from __future__ import annotations

import logging

import numpy as np

from skh.analysis.skeleton.chain import pipeline_chain
from skh.analysis.skeleton.model import (
    MODE_GROUP_WIDE,
    MODE_SAME_RAIL,
    MODE_SKELETON,
    Skeleton,
    SkeletonParams,
    all_pairs,
    digest,
    quantile,
    standardize,
    unique_pairs,
)
from skh.analysis.skeleton.partners import (
    Boundary,
    Evidence,
    PairStats,
    fingerprints,
    pair_boundaries,
    shared_sends,
)
from skh.analysis.skeleton.spectrum import atypical, per_second, period
from skh.analysis.skeleton.stages import bursts, coherence, split_stages
from skh.analysis.skeleton.validate import confidence
from skh.errors import ConfigError
from skh.model import same_rail_pairs

__all__ = ["infer_skeleton", "traffic_changed"]

log = logging.getLogger(__name__)


def _validate(ep_id, host, rail, x, hz, container):
    ep_id = np.asarray(ep_id)
    host = np.asarray(host)
    rail = np.asarray(rail)
    x = np.asarray(x, np.float64)
    n = ep_id.shape[0] if ep_id.ndim == 1 else -1
    if n < 0 or host.shape != (n,) or rail.shape != (n,):
        raise ConfigError(
            "The 'ep_id', 'host' and 'rail' parameters of infer_skeleton must be 1-D arrays "
            "of one length. "
            f"Got shapes {ep_id.shape}, {host.shape} and {rail.shape} instead."
        )
    if x.ndim != 2 or x.shape[0] != n:
        raise ConfigError(
            f"The 'bytes_per_s' parameter of infer_skeleton must be an (n, T) array with n = {n}. "
            f"Got shape {x.shape} instead."
        )
    if _repeats(ep_id):
        raise ConfigError("The 'ep_id' parameter of infer_skeleton must hold unique endpoint ids.")
    if not (isinstance(hz, int | float) and np.isfinite(hz) and hz > 0):
        raise ConfigError(
            f"The 'sample_hz' parameter of infer_skeleton must be > 0. Got {hz!r} instead."
        )
    if container is not None:
        container = np.asarray(container)
        if container.shape != (n,):
            raise ConfigError(
                "The 'container' parameter of infer_skeleton must have one entry per endpoint "
                f"({n}). "
                f"Got shape {container.shape} instead."
            )
        _, container = _dense(container)
    if not np.isfinite(x).all():
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    return ep_id.astype(np.uint32), host.astype(np.int64), rail.astype(np.int64), x, container


def _dense(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` of a 1-D ``a`` (its sorted values, and each entry's
    index among them) from one sort and a search, without np.unique's machinery."""
    s = np.sort(a)
    first = np.ones(s.size, bool)
    first[1:] = s[1:] != s[:-1]
    values = s[first]
    return values, np.searchsorted(values, a)


def _repeats(a: np.ndarray) -> bool:
    """Whether some value of ``a`` occurs twice (a sort, without np.unique's machinery)."""
    s = np.sort(a, axis=None)
    return bool((s[1:] == s[:-1]).any())


def _registration_rank(ep_id: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Hosts in order of their smallest endpoint id (what registration order gives)."""
    hosts, inv = np.unique(host, return_inverse=True)
    first = np.full(hosts.size, np.iinfo(np.int64).max)
    np.minimum.at(first, inv, ep_id.astype(np.int64))
    rank = np.empty(hosts.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(hosts.size)
    return rank[inv]


def infer_skeleton(
    ep_id: np.ndarray,
    host: np.ndarray,
    rail: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    tx_bytes: np.ndarray | None = None,
    sample_hz: float = 1.0,
    container: np.ndarray | None = None,
    job: str = "",
    params: SkeletonParams | None = None,
    prior: Skeleton | None = None,
) -> Skeleton:
    """Infer one job's traffic skeleton from its endpoints' byte counters.

    ``ep_id``, ``host`` (any integer host index) and ``rail`` describe the job's ``n`` endpoints;
    ``bytes_per_s`` is ``(n, T)``: the bytes through each endpoint (TX + RX) per sample, ``T``
    samples at ``sample_hz``, aligned in time across endpoints; ``tx_bytes``, when given, the
    transmitted part of them (the rest was received), which lets a send show on both ends.
    ``container`` is a rank hint:
    each endpoint's container rank in the job (the pod ordinal a training operator gives,
    ``worker-<i>``, or the ``RANK`` order where the platform exposes it). It is only a prior:
    stage blocks and partners it implies are used where the traffic confirms them, and a hint
    the traffic contradicts is dropped and reported (``Skeleton.hint``). ``prior`` is the job's
    skeleton of the preceding window: while the job keeps its shape (:func:`traffic_changed`),
    its partner evidence adds up with this window's, so partners too weak to tell in one window
    are told in a few.
    """
    params = params or SkeletonParams()
    hz = sample_hz
    ep_id, host, rail, x, hint = _validate(ep_id, host, rail, bytes_per_s, hz, container)
    tx = None
    if tx_bytes is not None:
        tx = np.asarray(tx_bytes, np.float64)
        if tx.shape != x.shape:
            raise ConfigError(
                "The 'tx_bytes' parameter of infer_skeleton must have the shape of bytes_per_s "
                f"{x.shape}. Got shape {tx.shape} instead."
            )

    n, t_len = x.shape
    group = np.full(n, -1, np.int32)
    stage = np.full(n, -1, np.int32)

    evidence: dict = {}

    def result(mode, reason, conf, pairs, period_s, scores, hint_state="none") -> Skeleton:
        return Skeleton(
            job,
            mode,
            conf,
            reason,
            pairs,
            digest(pairs),
            ep_id,
            group,
            stage,
            period_s,
            dict(scores or {}),
            hint_state,
            evidence,
        )

    def fallback(mode, reason, conf, period_s=0.0, scores=None, hint_state="none") -> Skeleton:
        pairs = (
            unique_pairs([all_pairs(ep_id, host)])
            if mode == MODE_GROUP_WIDE
            else same_rail_pairs(ep_id, rail, host)
        )
        log.info("job %s: %s (%s)", job, mode, reason)
        return result(mode, reason, conf, pairs, period_s, scores, hint_state)

    # Structure: a rail-wise skeleton needs every host of the job on the same rails, one
    # endpoint per (host, rail); containers binding different rail sets (fewer than 8 RNICs) may
    # talk across rails.
    rails, rail_inv = _dense(rail)
    hosts, hinv = _dense(host)
    if hosts.size < 2:
        return fallback(
            MODE_SAME_RAIL, "a single host: its traffic stays on NVLink/PCIe, no pair to probe", 1.0
        )
    if n != hosts.size * rails.size or _repeats(host * rails.size + rail_inv):
        return fallback(
            MODE_GROUP_WIDE,
            f"{hosts.size} hosts do not all bind the same {rails.size} rails once each: "
            "a peer may sit on another rail, so every cross-host pair of the job is kept",
            1.0,
        )
    x1, hz1 = per_second(x, hz)
    span = _active_span(t_len, x1, hz1, hz, params)
    if isinstance(span, str):
        return fallback(MODE_SAME_RAIL, span, 0.0)
    # the span is whole seconds: its per-second sums are those of the whole series
    x, x1 = x[:, span[0]], x1[:, span[1]]
    period_s, periodicity = period(standardize(x1), hz1, params)
    scores: dict[str, float] = {"periodicity": periodicity}
    rank = hint if hint is not None else _registration_rank(ep_id, host)
    split = split_stages(x, host, hinv, rail_inv, rails.size, rank, hint is not None, hz, params)

    # groups and DP peers
    gid = 0
    ks = []
    dp_chunks: list[np.ndarray] = []
    for blocks in split.blocks:
        k, g = blocks.shape
        ks.append(k)
        group[blocks] = gid + np.arange(k)[:, None]
        stage[blocks] = np.arange(k)[:, None]
        gid += k
    # every ordered pair inside a group, for all groups of one size at once
    sizes: dict[int, list[np.ndarray]] = {}
    for blocks in split.blocks:
        sizes.setdefault(blocks.shape[1], []).append(blocks.reshape(-1, blocks.shape[1]))
    for g, rows in sizes.items():
        if g > 1:
            e = ep_id[np.concatenate(rows)]
            off = ~np.eye(g, dtype=bool)
            a = np.broadcast_to(e[:, :, None], (e.shape[0], g, g))[:, off]
            b = np.broadcast_to(e[:, None, :], (e.shape[0], g, g))[:, off]
            dp_chunks.append(np.stack([a.ravel(), b.ravel()], axis=1))
    coh = quantile(split.coherence, 0.05)
    if max(ks) == 1 and hosts.size >= 3:
        # one group per rail: no DP group split. A pipeline without data parallelism still
        # orders its hosts by their fill-and-drain gaps (:mod:`.chain`), which refuses hosts
        # alike in their gaps (replicas of a stage)
        chain = pipeline_chain(split.quartile, hz, params.idle_bytes_per_s)
        if chain.tiers:
            pairs = _chain_pairs(chain, ep_id, hinv, rail_inv, group, stage)
            scores.update(chain_t=chain.weakest_t, iterations=float(chain.iterations))
            hint_state = _chain_hint(hint, hinv, chain.tiers)
            reason = (
                f"period {period_s:.1f} s, one replica per stage: {len(chain.tiers)} pipeline "
                f"tiers ordered by their hosts' idle gaps (weakest step "
                f"{chain.weakest_t:.1f} standard errors over {chain.iterations} iterations)"
                + ("; the last tier linked back to the first" if chain.wrap else "")
                + ("; rank hint contradicted by traffic and dropped"
                   if hint_state == "contradicted" else "")
            )  # fmt: skip
            conf = min(1.0, chain.weakest_t / 10.0)
            return result(MODE_SKELETON, reason, conf, pairs, period_s, scores, hint_state)
        scores["chain_t"] = chain.weakest_t
    if coh < params.min_coherence and max(ks) == 1:
        return fallback(
            MODE_SAME_RAIL,
            f"no common bursts (5th-percentile coherence {coh:.2f}, "
            f"periodicity {periodicity:.2f}): debug or irregular traffic fits no DP/PP skeleton",
            0.0,
            period_s,
            scores,
        )

    # pipeline partners: adjacent stages, and the last stage back to the first (an interleaved
    # schedule's wrap-around, which burst timing cannot tell from a plain one); when the order
    # is a guess (a stage as like a non-neighbour as a neighbour), the rank hint's neighbours
    # too if it orders the stages otherwise but about as well, else every two stages
    # groups that share burst instants may be replicas of one stage: linked whole, whatever
    # their places in the order
    boundaries = []
    links_of: dict[int, list[tuple[int, int, bool]]] = {}  # per stage count, as every rail's
    for blocks in split.blocks:
        k = blocks.shape[0]
        if k not in links_of:
            links = _chain_links(np.arange(k))
            alt = split.hint_order
            if not split.order_clear and alt is not None and alt.size == k:
                links += _chain_links(alt)  # traffic and hint differ within the evidence
            elif not split.order_clear:
                links = [(i, j) for i in range(k) for j in range(i + 1, k)]
            shared = split.shared if split.shared is not None else np.zeros((k, k), bool)
            links += [tuple(pair) for pair in np.argwhere(np.triu(shared)).tolist()]
            first: dict[frozenset, tuple[int, int]] = {}
            for pair in links:
                first.setdefault(frozenset(pair), pair)
            links = list(first.values())
            links_of[k] = [(i, j, bool(shared[i, j])) for i, j in links]
        boundaries += [Boundary(blocks[i], blocks[j], w) for i, j, w in links_of[k]]
    pp_chunks, ps = [], PairStats()
    if boundaries:
        fp, nw = fingerprints(x, group, hz, params)
        sends = None
        if tx is not None:  # only pipeline partners read the sends: cleaned for them alone
            tx = tx[:, span[0]]
            if not np.isfinite(tx).all():
                tx = np.nan_to_num(tx)
            tx = np.clip(tx, 0.0, x)
            sends = shared_sends(tx, x - tx, group, hz)

        def pair(hinted: bool) -> tuple[list[np.ndarray], PairStats, Evidence]:
            return pair_boundaries(
                boundaries,
                fp,
                nw,
                sends,
                host,
                ep_id,
                hinted,
                hz,
                period_s,
                params,
                prior.evidence if prior is not None else None,
            )

        # A hint the traffic contradicts is dropped, its partners with it: whose stages are
        # not blocks of its ranks names no partners at all, and one whose partners the
        # traffic names otherwise names the rest no better. Its partners confirmed jointly
        # (rows agreeing together) were the traffic's own guesses where the hint named the
        # same: bench/skeleton.py seed 57, an MoE job under contention with registration-order
        # ranks, kept 3 such wrong partners of 256, confidently (coverage 0.985).
        pp_chunks, ps, evidence = pair(
            hint is not None and _stages_in_rank_blocks(hint, split.blocks)
        )
        if ps.contradicted:
            named_otherwise = ps.contradicted
            pp_chunks, ps, evidence = pair(False)
            ps.contradicted = named_otherwise
    pairs = unique_pairs(dp_chunks + pp_chunks)

    k_mode = int(np.bincount(ks).argmax())
    scores.update(
        separation=float(split.score),
        coherence=coh,
        rail_agreement=float(np.mean(np.asarray(ks) == k_mode)),
        typical=float(np.mean(atypical(x1, hz1, params) < 0.5)),
        pp_paired=(ps.links - ps.whole - ps.sets) / ps.links if ps.links else 1.0,
        # each RNIC against its group, the baseline traffic_changed compares with
        member_coherence=_member_coherence(bursts(x1, hz1), group),
    )
    conf, limit = confidence(scores, k_mode > 0, params)
    hint_state = _hint_state(hint, split.blocks, ps)
    why = {
        "separation": "the stage boundaries are not clear",
        "coherence": "some group's bursts do not co-occur "
        f"(5th-percentile coherence {scores['coherence']:.2f})",
        "rail agreement": "the rails disagree on the stage count",
        "typical RNICs": "many RNICs have an atypical burst regime (STFT)",
    }[limit]
    desc = _describe(period_s, k_mode, n // rails.size, split.how, ps, hint_state)
    if split.order_clear and split.hint_order is not None:
        desc += "; stage order a near tie in traffic, as the rank hint orders it"
    elif split.hint_order is not None:
        desc += (
            "; stage order unclear (a stage as like a non-neighbour as a neighbour) and the "
            "rank hint's another: both orders' neighbours linked"
        )
    elif not split.order_clear:
        desc += (
            "; stage order unclear (a stage as like a non-neighbour as a neighbour): "
            "every two stages linked"
        )
    if conf < params.min_confidence:
        return fallback(
            MODE_SAME_RAIL,
            f"confidence {conf:.2f}: {why}; inferred {desc}",
            conf,
            period_s,
            scores,
            hint_state,
        )
    reason = f"{desc}; confidence limited by {limit}: {why}"
    return result(MODE_SKELETON, reason, conf, pairs, period_s, scores, hint_state)


def _chain_links(order: np.ndarray) -> list[tuple[int, int]]:
    """Pipeline partners of stages (block positions) in ``order``: neighbours, and the last
    back to the first (an interleaved schedule's wrap-around, which burst timing cannot tell
    from a plain one)."""
    k = order.size
    ends = [(int(order[-1]), int(order[0]))] if k >= 3 else []
    return [(int(order[j]), int(order[j + 1])) for j in range(k - 1)] + ends


def _chain_pairs(chain, ep_id, hinv, rail_inv, group, stage) -> np.ndarray:
    """Every rail's pairs between consecutive tiers, inside tiers, and from the last tier back
    to the first when ``chain.wrap``; fills ``group`` (tier and rail) and ``stage`` (tier)."""
    n_rails = int(rail_inv.max()) + 1
    ep_of = np.empty((int(hinv.max()) + 1, n_rails), np.int64)
    ep_of[hinv, rail_inv] = np.arange(ep_id.size)
    tiers = chain.tiers
    links = list(zip(tiers[:-1], tiers[1:], strict=True))
    if chain.wrap and len(tiers) >= 3:
        links.append((tiers[-1], tiers[0]))
    links += [(t, t) for t in tiers if t.size > 1]
    for i, t in enumerate(tiers):
        stage[ep_of[t]] = i
        group[ep_of[t]] = i * n_rails + np.arange(n_rails)
    # host pairs once, then the same pairs on every rail
    a, b = (
        np.concatenate([np.repeat(p, q.size) for p, q in links]),
        np.concatenate([np.tile(q, p.size) for p, q in links]),
    )
    keep = a != b
    a, b = np.r_[a[keep], b[keep]], np.r_[b[keep], a[keep]]
    return unique_pairs([np.stack([ep_id[ep_of[a]].ravel(), ep_id[ep_of[b]].ravel()], axis=1)])


def _chain_hint(hint, hinv, tiers) -> str:
    """Whether the rank hint lists the hosts in the tiers' order (either way round)."""
    if hint is None:
        return "none"
    rank = np.full(int(hinv.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(rank, hinv, hint)
    lo = np.array([rank[t].min() for t in tiers])
    hi = np.array([rank[t].max() for t in tiers])
    up = bool(np.all(hi[:-1] < lo[1:]))
    down = bool(np.all(lo[:-1] > hi[1:]))
    return "confirmed" if up or down else "contradicted"


def _active_span(
    t_len: int, x1: np.ndarray, hz1: float, hz: float, params: SkeletonParams
) -> tuple[slice, slice] | str:
    """The span where every RNIC carries traffic (training starts only once every container is
    up; the start of a window may still be the idle wait for the last one), as slices of the
    series (``t_len`` samples at ``hz``) and of its per-second sums ``x1`` (:func:`per_second`),
    or why there is too little of it. Activity is judged per second: a tenth-second sample of
    background noise can exceed a rate its second does not."""
    n = x1.shape[0]
    if t_len < params.min_duration_s * hz:
        return (
            f"too little traffic yet: {t_len / hz:.0f} s of series, need {params.min_duration_s} s"
        )
    f = int(round(hz / hz1))
    active = x1 > params.idle_bytes_per_s / hz1
    seen = active.any(axis=1)
    if not seen.all():
        return (
            f"too little traffic yet: {int((~seen).sum())} of {n} RNICs never above "
            f"{params.idle_bytes_per_s:.0f} B/s"
        )
    start = int(active.argmax(axis=1).max())
    stop = x1.shape[1] - int(active[:, ::-1].argmax(axis=1).max())
    if (stop - start) / hz1 < params.min_duration_s:
        return (
            f"too little traffic yet: all RNICs active for {max(stop - start, 0) / hz1:.0f} s, "
            f"need {params.min_duration_s} s"
        )
    return slice(start * f, stop * f), slice(start, stop)


def _stages_in_rank_blocks(hint: np.ndarray, blocks: list[np.ndarray]) -> bool:
    """Whether every stage holds one contiguous block of container ranks (the rails' blocks of
    one shape at once: stages whose lowest ranks tie overlap in either order)."""
    shapes: dict[tuple[int, ...], list[np.ndarray]] = {}
    for b in blocks:
        if b.shape[0] > 1:  # one stage is one block
            shapes.setdefault(b.shape, []).append(b)
    for same in shapes.values():
        r = hint[np.stack(same)]  # (rails, stages, rows)
        lo, hi = r.min(axis=2), r.max(axis=2)
        order = np.argsort(lo, axis=1)
        lo, hi = np.take_along_axis(lo, order, 1), np.take_along_axis(hi, order, 1)
        if np.any(lo[:, 1:] <= hi[:, :-1]):
            return False
    return True


def _hint_state(hint, blocks: list[np.ndarray], ps: PairStats) -> str:
    if hint is None:
        return "none"
    if ps.contradicted or not _stages_in_rank_blocks(hint, blocks):
        return "contradicted"
    if ps.links and ps.confirmed == ps.links:
        return "confirmed"
    return "partly confirmed" if ps.confirmed else "unconfirmed"


def _describe(period_s, k, per_rail, how, ps, hint_state) -> str:
    g = per_rail // max(k, 1)
    text = f"period {period_s:.1f} s, {k} stage(s) × {g} RNICs per rail ({how})"
    if ps.links:
        text += (
            f"; PP partners: {ps.links - ps.whole - ps.sets} of {ps.links} from traffic"
            f" ({ps.confirmed} confirming the rank hint)"
            + (f", {ps.sets} keep a few tied candidates" if ps.sets else "")
            + (
                f" ({ps.widened} widened to the block of replicas their tied rows share)"
                if ps.widened
                else ""
            )
            + f", {ps.whole} keep the whole adjacent group (evidence too weak)"
        )
    if hint_state == "contradicted":
        text += (
            f"; rank hint contradicted by traffic and dropped"
            f" ({ps.contradicted} partners named otherwise"
            + (", stage blocks not in rank order" if ps.contradicted == 0 else "")
            + ")"
        )
    elif hint_state in ("unconfirmed", "partly confirmed"):
        text += f"; rank hint {hint_state}: {ps.unconfirmed} partners it names not used"
    return text


def traffic_changed(
    prev: Skeleton,
    ep_id: np.ndarray,
    bytes_per_s: np.ndarray,
    *,
    sample_hz: float = 1.0,
    params: SkeletonParams | None = None,
) -> tuple[bool, str]:
    """Cheap check whether a job's traffic no longer fits ``prev`` (re-infer when it says so).

    Changed when the endpoints differ, when a fallback was due to missing traffic and there now
    is some, when the iteration period moved by more than 15 %, or when some group's bursts
    stopped co-occurring (an RNIC's correlation with its group's other members below
    ``min_coherence``). One FFT per RNIC and one pass over the groups.
    """
    params = params or SkeletonParams()
    ep_id = np.asarray(ep_id, np.uint32)
    x = np.nan_to_num(np.asarray(bytes_per_s, np.float64))
    if x.ndim != 2 or x.shape[0] != ep_id.size:
        raise ConfigError(
            "The 'bytes_per_s' parameter of traffic_changed must be an (n, T) array with "
            f"n = {ep_id.size}. "
            f"Got shape {x.shape} instead."
        )
    if not np.array_equal(np.sort(ep_id), np.sort(prev.ep_id)):
        return True, "the job's endpoints changed"
    if prev.mode != MODE_SKELETON:
        if prev.mode == MODE_GROUP_WIDE:
            return False, "irregular rail layout: nothing traffic can change"
        enough = x.shape[1] >= params.min_duration_s * sample_hz and bool(
            np.all(x.mean(axis=1) * sample_hz >= params.idle_bytes_per_s)
        )
        return (
            enough,
            "traffic now available for inference" if enough else "still too little traffic",
        )
    pos = np.searchsorted(ep_id, prev.ep_id, sorter=np.argsort(ep_id))
    x = x[np.argsort(ep_id)[pos]]
    x1, hz1 = per_second(x, sample_hz)
    z = standardize(x1)
    period_s, periodicity = period(z, hz1, params)
    if prev.period_s and (period_s == 0.0 or abs(period_s - prev.period_s) > 0.15 * prev.period_s):
        return (
            True,
            f"period {prev.period_s:.1f} s -> {period_s:.1f} s (periodicity {periodicity:.2f})",
        )
    worst = _member_coherence(bursts(x1, hz1), prev.group)
    baseline = prev.scores.get("member_coherence", 1.0)
    if worst < min(params.min_coherence, baseline) or worst < baseline - 0.25:
        return True, (
            f"a group's bursts no longer co-occur (5th-percentile coherence {worst:.2f}, "
            f"was {baseline:.2f})"
        )
    return False, "traffic still fits the skeleton"


def _member_coherence(zb: np.ndarray, group: np.ndarray) -> float:
    """5th percentile over RNICs in groups of two or more of their correlation with their
    group's other members (burst series, per second); 1 when there is no such group."""
    keep = group >= 0
    if not keep.any():
        return 1.0
    if keep.all() and np.bincount(group).all():  # labels 0..k-1 already (no copy of zb)
        return quantile(coherence(zb, group), 0.05)
    _, label = np.unique(group[keep], return_inverse=True)
    return quantile(coherence(zb[keep], label), 0.05)
