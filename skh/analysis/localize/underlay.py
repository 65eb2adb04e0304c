"""Underlay vote (Algorithm 1, step 3) with exoneration and a greedy explanation of many faults.

Elements are physical links (``a|b``, names sorted) and nodes (switches, RNICs). A failing trace
that reached its destination votes for every element on it. A trace that stopped early votes
only for its *frontier*: the links out of the last node that answered toward the destination and
the nodes behind them (its prefix demonstrably carried the ICMP answers back). With ECMP the
frontier may have several candidate next hops; each gets the vote and healthy traces clear the
ones that work. Every element a healthy trace crosses is cleared.

The suspect is the uncleared element explaining the most failing traces; what it explains is
removed and the rest is explained again (several faults at once). Elements that explain exactly
the same traces are a tie: a link beats its own endpoint node (the more specific claim, the
node stays a candidate); anything else is reported with all its candidates, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from skh.analysis.localize.data import Trace

__all__ = ["UnderlayCulprit", "UnderlayResult", "link_name", "vote"]


def link_name(a: str, b: str) -> str:
    return f"{a}|{b}" if a <= b else f"{b}|{a}"


def _is_link(element: str) -> bool:
    return "|" in element


@dataclass(frozen=True, slots=True)
class UnderlayCulprit:
    component: str
    kind: str  # "link" | "node"
    #: indices of the failing traces it explains
    explains: frozenset[int]
    votes: int
    #: healthy traces through it (non-zero only for a partial-fault suspect, see ``partial``)
    cleared_by: int = 0
    #: elements explaining the same traces equally well (a link's own endpoint nodes included)
    candidates: tuple[str, ...] = ()
    #: a candidate other than the link's own endpoints ties with it: the vote cannot decide
    ambiguous: bool = False
    #: chosen although healthy traces cross it: a fault that hits only some flows (loss, latency)
    partial: bool = False


@dataclass(frozen=True, slots=True)
class UnderlayResult:
    culprits: tuple[UnderlayCulprit, ...]
    #: failing traces no uncleared element explains
    unexplained: frozenset[int]
    votes: dict[str, int] = field(default_factory=dict)
    cleared: dict[str, int] = field(default_factory=dict)


def _known_elements(nodes: Sequence[str | None]) -> tuple[list[str], list[str]]:
    """Links between consecutive answering hops and the answering nodes."""
    links = []
    known = [n for n in nodes if n is not None]
    for a, b in zip(nodes, nodes[1:], strict=False):
        if a is not None and b is not None and a != b:
            links.append(link_name(a, b))
    return links, known


def _frontier_elements(
    tr: Trace, expected: Sequence[Sequence[str]] | None
) -> tuple[list[str], list[str]]:
    """The candidate links and nodes just beyond the last answering hop of a truncated trace."""
    nodes = tr.nodes
    k = max(i for i, n in enumerate(nodes) if n is not None)
    f = nodes[k]
    assert f is not None
    if not expected:
        return [], [f]
    links: set[str] = set()
    nxt: set[str] = set()
    for p in expected:
        if len(p) <= k + 1 or p[k] != f:
            continue
        if any(n is not None and (i >= len(p) or p[i] != n) for i, n in enumerate(nodes)):
            continue
        links.add(link_name(f, p[k + 1]))
        nxt.add(p[k + 1])
    if not links:  # the trace left every expected path: blame its frontier node only
        return [], [f]
    return sorted(links), sorted(nxt)


def _onset_index(tr: Trace, latency_jump_ns: int) -> int:
    """Index of the first hop showing loss or a delay jump, or len(nodes) when none does (the
    link into that hop and everything after it are suspect)."""
    r = tr.hop_rtt_ns
    for k in range(1, len(tr.nodes)):
        if tr.hop_loss and tr.hop_loss[k] > 0:
            return k
        if r and r[k] >= 0 and r[k - 1] >= 0 and r[k] - r[k - 1] > latency_jump_ns:
            return k
    return len(tr.nodes)


def _onset_elements(tr: Trace, latency_jump_ns: int) -> tuple[list[str], list[str]] | None:
    """Where a reached trace's trouble starts, when its hops say: the link into the first hop
    that loses probes (loss accrues from there on), or the first hop whose round trip jumps
    (a queue that delays). None when the hops show nothing."""
    nodes = tr.nodes
    if tr.hop_loss:
        for k in range(1, len(nodes)):
            if tr.hop_loss[k] > 0 and nodes[k] is not None and nodes[k - 1] is not None:
                return [link_name(nodes[k - 1], nodes[k])], []  # type: ignore[arg-type]
    if tr.hop_rtt_ns:
        r = tr.hop_rtt_ns
        for k in range(1, len(nodes)):
            if (
                r[k] >= 0
                and r[k - 1] >= 0
                and r[k] - r[k - 1] > latency_jump_ns
                and nodes[k] is not None
            ):
                return [], [nodes[k]]  # type: ignore[list-item]
    return None


def vote(
    failing: Sequence[Trace],
    healthy: Iterable[Trace],
    *,
    expected_paths: Callable[[Trace], Sequence[Sequence[str]]] | None = None,
    min_partial_votes: int = 2,
    min_partial_share: float = 0.5,
    latency_jump_ns: int = 10_000,
) -> UnderlayResult:
    """Localize underlay faults from flow-pinned traces of failing and healthy pairs.

    ``expected_paths(trace)`` gives the ECMP node paths the trace's pair could take (source RNIC
    to destination RNIC); it resolves the frontier of truncated traces. Without it a truncated
    trace blames only its last answering node. A reached trace whose hops show where loss or
    delay starts (``hop_loss``, ``hop_rtt_ns``; a round-trip step above ``latency_jump_ns``)
    votes only for that spot. A partial suspect needs ``min_partial_votes``
    failing traces and at least ``min_partial_share`` of all traces through it failing.
    """
    explains: dict[str, set[int]] = {}
    for i, tr in enumerate(failing):
        onset = _onset_elements(tr, latency_jump_ns) if tr.reached else None
        if onset is not None:
            links, nodes = onset
        elif tr.reached:
            links, nodes = _known_elements(tr.nodes)
        else:
            links, nodes = _frontier_elements(tr, expected_paths(tr) if expected_paths else None)
        for e in (*links, *nodes):
            explains.setdefault(e, set()).add(i)
    cleared: dict[str, int] = {}
    for tr in healthy:
        # a path judged healthy whose own hops show loss or delay setting in clears nothing
        # from there on: a link that drops 2% lets many probes through, it is not exonerated
        k = _onset_index(tr, latency_jump_ns)
        links, nodes = _known_elements(tr.nodes[:k])
        for e in (*links, *nodes):
            if e in explains:
                cleared[e] = cleared.get(e, 0) + 1
    votes = {e: len(s) for e, s in explains.items()}

    remaining = set(range(len(failing)))
    culprits: list[UnderlayCulprit] = []
    live = {e: s for e, s in explains.items() if e not in cleared}
    while remaining:
        best = _best(live, remaining)
        if best is None:
            break
        c = _culprit(best, live, remaining, votes, 0, partial=False)
        culprits.append(c)
        remaining -= c.explains
    # a fault that loses or delays only some flows lets other flows over the same element pass,
    # which clears it; rank such elements by the share of their traces that fail
    while remaining:
        part = {
            e: s & remaining
            for e, s in explains.items()
            if e in cleared and len(s & remaining) >= min_partial_votes
        }
        if not part:
            break
        ratio = {e: len(s) / (len(s) + cleared[e]) for e, s in part.items()}
        ratio = {e: r for e, r in ratio.items() if r >= min_partial_share}
        if not ratio:
            break
        top = max(ratio.values())
        contenders = {e: part[e] for e, r in ratio.items() if r == top}
        best = _best(contenders, remaining)
        if best is None:
            break
        c = _culprit(best, contenders, remaining, votes, cleared.get(best[0], 0), partial=True)
        culprits.append(c)
        remaining -= c.explains
    return UnderlayResult(tuple(culprits), frozenset(remaining), votes, cleared)


def _best(live: dict[str, set[int]], remaining: set[int]) -> tuple[str, frozenset[int]] | None:
    best_n = 0
    best: list[tuple[str, frozenset[int]]] = []
    for e, s in live.items():
        hit = s & remaining
        n = len(hit)
        if n > best_n:
            best_n, best = n, [(e, frozenset(hit))]
        elif n == best_n and n:
            best.append((e, frozenset(hit)))
    if not best:
        return None
    # stable choice: links first (more specific), then by name
    best.sort(key=lambda t: (not _is_link(t[0]), t[0]))
    return best[0]


def _culprit(
    best: tuple[str, frozenset[int]],
    live: dict[str, set[int]],
    remaining: set[int],
    votes: dict[str, int],
    cleared_by: int,
    *,
    partial: bool,
) -> UnderlayCulprit:
    element, hit = best
    ties = sorted(e for e, s in live.items() if e != element and frozenset(s & remaining) == hit)
    if _is_link(element):
        ends = set(element.split("|"))
        # the link's own RNIC end ties with it by construction when only this link is used:
        # keep it as a candidate (the host's report decides between RNIC and switch port), but
        # it does not make the verdict ambiguous; any other tie does
        link_ties = tuple(t for t in ties if _is_link(t))
        node_ties = tuple(t for t in ties if not _is_link(t))
        other_nodes = tuple(t for t in node_ties if t not in ends or ":rnic" not in t)
        candidates = link_ties + other_nodes + tuple(t for t in node_ties if t in ends)
        ambiguous = bool(link_ties or other_nodes)
    else:
        candidates = tuple(ties)
        ambiguous = bool(ties)
    return UnderlayCulprit(
        component=element,
        kind="link" if _is_link(element) else "node",
        explains=hit,
        votes=votes.get(element, 0),
        cleared_by=cleared_by,
        candidates=candidates,
        ambiguous=ambiguous,
        partial=partial,
    )
