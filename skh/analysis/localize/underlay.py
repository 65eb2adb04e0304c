"""Underlay vote (Algorithm 1, step 3) with exoneration and a greedy explanation of many faults.

Elements are physical links (``a|b``, names sorted) and nodes (switches, RNICs). A failing trace
that reached its destination votes for every element on it. A trace that stopped early votes
only for its *frontier*: the links out of the last node that answered toward the destination and
the nodes behind them (its prefix demonstrably carried the ICMP answers back). With ECMP the
frontier may have several candidate next hops; each gets the vote and healthy traces clear the
ones that work. Every element a healthy trace crosses is cleared.

Real traces are noisy, and the vote reads them as mtr's users do:

- a silent hop is unknown, not broken: where every ECMP path the fabric model allows agrees on
  the node there, it is filled in; a switch seen silent in a trace that went on past it
  answers nobody, so a trace that stops right before it may have stopped one hop later (so may
  one where only the source answered, when its first hop forwards other traces); a trace that
  stops one hop short of a destination that answers other traces lost its last answer, and
  says nothing;
- loss at a hop counts only if it persists to every later hop (a control plane that rate-limits
  its ICMP answers loses them at that hop alone); a trace showing such non-persisting loss
  says only that its loss starts somewhere from the earliest persisting hop on; and no hop
  loss counts in a round whose healthy traces lose answers at their destination too (it
  rate-limits them);
- hop round trips are mostly the answering CPU's time: a delay step between hops counts only
  while the healthy traces' steps stay below the jump threshold (a control plane that answers
  in microseconds), never under millisecond CPU noise.

The suspect is the uncleared element explaining the most failing traces; what it explains is
removed and the rest is explained again (several faults at once). Elements that explain exactly
the same traces are a tie: a link beats its own endpoint node (the more specific claim, the
node stays a candidate); anything else is reported with all its candidates, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from skh.analysis.localize.data import Trace

__all__ = [
    "UnderlayCulprit",
    "UnderlayResult",
    "fill_silent",
    "known_elements",
    "last_answer_lost",
    "silent_switches",
    "link_name",
    "loss_trusted",
    "rtt_trusted",
    "vote",
]


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


def known_elements(nodes: Sequence[str | None]) -> tuple[list[str], list[str]]:
    """Links between consecutive answering hops and the answering nodes."""
    links = []
    known = [n for n in nodes if n is not None]
    for a, b in zip(nodes, nodes[1:], strict=False):
        if a is not None and b is not None and a != b:
            links.append(link_name(a, b))
    return links, known


def _consistent(tr: Trace, expected: Sequence[Sequence[str]] | None) -> list[Sequence[str]]:
    """The expected paths that agree with every answering hop of ``tr``."""
    if not expected:
        return []
    return [
        p
        for p in expected
        if len(p) >= len(tr.nodes) and all(n is None or p[i] == n for i, n in enumerate(tr.nodes))
    ]


def last_answer_lost(
    tr: Trace,
    answering: frozenset[str],
    expected_paths: Callable[[Trace], Sequence[Sequence[str]]] | None,
    silent: frozenset[str] = frozenset(),
) -> bool:
    """A trace that stopped one hop short of its destination, or short of switches that
    answer nobody (``silent``) and then its destination, while the destination answered
    other traces of the round: its last answer, not its probe, was lost."""
    if expected_paths is None:
        return False
    k = max(i for i, n in enumerate(tr.nodes) if n is not None)
    paths = _consistent(Trace(tr.pair, tr.nodes[: k + 1], False), expected_paths(tr))
    return bool(paths) and all(
        len(p) >= k + 2 and p[-1] in answering and set(p[k + 1 : -1]) <= silent for p in paths
    )


def silent_switches(
    traces: Iterable[Trace], expected_paths: Callable[[Trace], Sequence[Sequence[str]]] | None
) -> frozenset[str]:
    """Switches that stayed silent in traces that went on past them: they answer nobody."""
    if expected_paths is None:
        return frozenset()
    return frozenset(
        p[i]
        for tr in traces
        if tr.reached and None in tr.nodes
        for p in _consistent(tr, expected_paths(tr))
        for i, n in enumerate(tr.nodes)
        if n is None
    )


def fill_silent(tr: Trace, expected: Sequence[Sequence[str]] | None) -> tuple[str | None, ...]:
    """``tr``'s nodes with each silent hop before its last answering one named, where every
    expected path that agrees with the answering hops has the same node there."""
    nodes = list(tr.nodes)
    last = max(i for i, n in enumerate(nodes) if n is not None)
    if all(n is not None for n in nodes[: last + 1]):
        return tuple(nodes)
    paths = _consistent(tr, expected)
    for i in range(last + 1):
        if nodes[i] is None and paths and len({p[i] for p in paths}) == 1:
            nodes[i] = paths[0][i]
    return tuple(nodes)


def _frontier_elements(
    tr: Trace,
    expected: Sequence[Sequence[str]] | None,
    silent: frozenset[str] = frozenset(),
    forwarding: frozenset[str] = frozenset(),
) -> tuple[list[str], list[str]]:
    """The candidate links and nodes just beyond the last answering hop of a truncated trace:
    one hop further where the next node is a switch known to answer nobody, or where only the
    source answered and its first hop is known to forward (other traces went past it), so its
    silence here may be its rate limit."""
    nodes = tr.nodes
    k = max(i for i, n in enumerate(nodes) if n is not None)
    f = nodes[k]
    assert f is not None
    if not expected:
        return [], [f]
    links: set[str] = set()
    nxt: set[str] = set()
    for p in _consistent(Trace(tr.pair, nodes[: k + 1], False), expected):
        if len(p) <= k + 1:
            continue
        links.add(link_name(f, p[k + 1]))
        nxt.add(p[k + 1])
        beyond = p[k + 1] in silent or (k == 0 and p[1] in forwarding)
        if beyond and len(p) > k + 2:
            # its answer never comes: the probe may have passed it and died beyond
            links.add(link_name(p[k + 1], p[k + 2]))
            nxt.add(p[k + 2])
    if not links:  # the trace left every expected path: blame its frontier node only
        return [], [f]
    return sorted(links), sorted(nxt)


def loss_trusted(
    healthy: Sequence[Trace], failing: Sequence[Trace] = (), *, max_share: float = 0.5
) -> bool:
    """Hop loss shares are worth reading when no trace of the round shows answers being
    rate-limited: loss that shrinks along a path (a probe lost before a hop cannot come back
    after it) or most healthy traces losing answers at their destination (a few may cross a
    lossy element and still be judged healthy). A responder that
    rate-limits its ICMP answers shows loss on every trace, faulty or not, and then no hop's
    loss says where a fault is."""
    for tr in (*healthy, *failing):
        loss = tr.hop_loss
        if not loss:
            continue
        seen = [loss[i] for i, n in enumerate(tr.nodes) if n is not None]
        if any(b < a - 1e-9 for a, b in zip(seen, seen[1:], strict=False)):
            return False
    ends = [tr.hop_loss[-1] for tr in healthy if tr.reached and tr.hop_loss]
    return not ends or sum(x > 0 for x in ends) <= max_share * len(ends)


def _persisting_loss(tr: Trace) -> tuple[int, bool] | None:
    """Where a reached trace's loss may start: the first hop from which every later answering
    hop loses too (mtr's reading), and whether the trace is clean (no hop before it shows loss
    that does not persist: nothing rate-limited its answers). None when the last hop loses
    nothing."""
    loss = tr.hop_loss
    if not loss:
        return None
    answered = [i for i, n in enumerate(tr.nodes) if n is not None and i > 0]
    if not answered or loss[answered[-1]] <= 0:
        return None
    onset = answered[-1]
    for i in reversed(answered):
        if loss[i] > 0:
            onset = i
        else:
            break
    clean = all(loss[i] <= 0 for i in answered if i < onset)
    return onset, clean


def _onset_index(
    tr: Trace, latency_jump_ns: int, use_rtt: bool = True, use_loss: bool = True
) -> int:
    """Index of the first hop from which loss persists, or where a trusted delay jump shows,
    or len(nodes) when none does (the link into that hop and everything after it are
    suspect)."""
    got = _persisting_loss(tr) if use_loss else None
    k_loss = got[0] if got else len(tr.nodes)
    r = tr.hop_rtt_ns
    if use_rtt and r:
        for k in range(1, k_loss):
            if r[k] >= 0 and r[k - 1] >= 0 and r[k] - r[k - 1] > latency_jump_ns:
                return k
    return k_loss


def _onset_elements(
    tr: Trace, latency_jump_ns: int, use_rtt: bool = True, use_loss: bool = True
) -> tuple[list[str], list[str]] | None:
    """Where a reached trace's trouble starts, when its hops say: the link into the first hop
    from which loss persists (every element from there on when rate limiting blurred the
    hops before), or the first hop whose round trip jumps (a queue that delays). None when
    the hops show nothing."""
    nodes = tr.nodes
    got = _persisting_loss(tr) if use_loss else None
    if got is not None:
        k, clean = got
        if nodes[k - 1] is not None:
            if clean:
                return [link_name(nodes[k - 1], nodes[k])], []  # type: ignore[arg-type]
            links, known = known_elements(nodes[k - 1 :])
            return links, known[1:]
    if use_rtt and tr.hop_rtt_ns:
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


def rtt_trusted(
    healthy: Sequence[Trace],
    latency_jump_ns: int,
    failing: Sequence[Trace] = (),
    *,
    max_share: float = 0.02,
) -> bool:
    """Hop round trips are worth reading when they behave like forwarding delay: healthy
    traces' hop-to-hop steps stay below the jump threshold and no trace's round trip drops by
    more than it along the path. A switch CPU's milliseconds of answering time make every step
    look like a queue, and half of them negative."""
    steps = n = 0
    for tr in (*healthy, *failing):
        r = [x for x in tr.hop_rtt_ns if x >= 0]
        if any(b < a - latency_jump_ns for a, b in zip(r, r[1:], strict=False)):
            return False
    for tr in healthy:
        r = tr.hop_rtt_ns
        for k in range(1, len(r)):
            if r[k] >= 0 and r[k - 1] >= 0:
                n += 1
                steps += abs(r[k] - r[k - 1]) > latency_jump_ns
    return n == 0 or steps <= max_share * n


def vote(
    failing: Sequence[Trace],
    healthy: Iterable[Trace],
    *,
    expected_paths: Callable[[Trace], Sequence[Sequence[str]]] | None = None,
    min_partial_votes: int = 2,
    min_partial_share: float = 0.5,
    latency_jump_ns: int = 10_000,
    soft: Iterable[int] = (),
) -> UnderlayResult:
    """Localize underlay faults from flow-pinned traces of failing and healthy pairs.

    ``expected_paths(trace)`` gives the ECMP node paths the trace's pair could take (source RNIC
    to destination RNIC); it resolves the frontier of truncated traces. Without it a truncated
    trace blames only its last answering node. A reached trace whose hops show where loss or
    delay starts (``hop_loss``, ``hop_rtt_ns``; a round-trip step above ``latency_jump_ns``)
    votes only for that spot. A partial suspect needs ``min_partial_votes``
    failing traces and at least ``min_partial_share`` of all traces through it failing.
    ``soft`` are the failing traces of pairs that only slow down or lose some probes: a partial
    element covering more of them than the best uncleared element is taken first (a slow switch
    whose unflagged pairs clear it, rather than each host's access link). The last partial pass
    counts only pairs an element carries every failing flow of.
    """
    healthy = list(healthy)
    use_rtt = rtt_trusted(healthy, latency_jump_ns, failing)
    use_loss = loss_trusted(healthy, failing)

    def filled(tr: Trace) -> Trace:
        nodes = fill_silent(tr, expected_paths(tr) if expected_paths else None)
        return tr if nodes == tr.nodes else replace(tr, nodes=nodes)

    failing = [filled(t) for t in failing]
    healthy = [filled(t) for t in healthy]
    silent = silent_switches((*failing, *healthy), expected_paths)
    # nodes other traces went past (they answered and something further answered too)
    forwarding = frozenset(
        n
        for tr in (*failing, *healthy)
        for i, n in enumerate(tr.nodes)
        if n is not None and i > 0 and any(x is not None for x in tr.nodes[i + 1 :])
    )
    # nodes that answered some trace of the round (a trace's source is not an answer): alive
    answering = frozenset(n for tr in (*failing, *healthy) for n in tr.nodes[1:] if n is not None)
    explains: dict[str, set[int]] = {}
    for i, tr in enumerate(failing):
        if not tr.reached and last_answer_lost(tr, answering, expected_paths):
            continue  # the destination answers other traces: this one's answer was rate-limited
        onset = _onset_elements(tr, latency_jump_ns, use_rtt, use_loss) if tr.reached else None
        if onset is not None:
            links, nodes = onset
        elif tr.reached:
            links, nodes = known_elements(tr.nodes)
        else:
            links, nodes = _frontier_elements(
                tr, expected_paths(tr) if expected_paths else None, silent, forwarding
            )
        for e in (*links, *nodes):
            explains.setdefault(e, set()).add(i)
    cleared: dict[str, int] = {}
    for tr in healthy:
        # a path judged healthy whose own hops show loss or delay setting in clears nothing
        # from there on: a link that drops 2% lets many probes through, it is not exonerated
        k = _onset_index(tr, latency_jump_ns, use_rtt, use_loss)
        links, nodes = known_elements(tr.nodes[:k])
        for e in (*links, *nodes):
            if e in explains:
                cleared[e] = cleared.get(e, 0) + 1
    votes = {e: len(s) for e, s in explains.items()}
    # in the last partial pass an element explains a pair only where it lies on every failing
    # flow of the pair: a pair that fails as well on flows avoiding it (one slow RNIC's flows
    # over both spines) fails for a reason it does not carry. Not in the first pass's wide
    # partial: there a ToR, which carries every flow of its pairs, would outrun the culprits
    # that pass names (a mass round named a dozen ToRs when it did)
    by_pair: dict[tuple[int, int], set[int]] = {}
    for i, tr in enumerate(failing):
        by_pair.setdefault(tr.pair, set()).add(i)
    whole = {e: {i for i in s if by_pair[failing[i].pair] <= s} for e, s in explains.items()}

    remaining = set(range(len(failing)))
    culprits: list[UnderlayCulprit] = []
    live = {e: s for e, s in explains.items() if e not in cleared}
    soft = set(soft)
    while remaining:
        best = _best(live, remaining)
        if best is None:
            break
        wide = _wide_partial(explains, cleared, remaining & soft, min_partial_votes)
        if wide is not None and set(best[1]) <= soft and len(best[1]) < len(wide[1]):
            # slow or lossy pairs that one element carries, most of its traced flows failing,
            # beat the unharmed-looking elements that cover fewer of them
            # (detection flags only some of a slow switch's pairs, the rest clear it)
            e = wide[0]
            c = _culprit(wide, {e: explains[e]}, remaining, votes, cleared[e], partial=True)
        else:
            c = _culprit(best, live, remaining, votes, 0, partial=False)
        culprits.append(c)
        remaining -= c.explains
    # a fault that loses or delays only some flows lets other flows over the same element pass,
    # which clears it; rank such elements by the share of their traces that fail
    while remaining:
        part = {
            e: s & remaining
            for e, s in whole.items()
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


def _wide_partial(
    explains: dict[str, set[int]],
    cleared: dict[str, int],
    remaining: set[int],
    min_votes: int,
    min_share: float = 0.5,
) -> tuple[str, frozenset[int]] | None:
    """The cleared element explaining the most of ``remaining`` with at least ``min_share`` of
    its traced flows failing (None when none explains ``min_votes``)."""
    got: list[tuple[int, float, str, frozenset[int]]] = []
    for e, s in explains.items():
        if e not in cleared:
            continue
        hit = frozenset(s & remaining)
        share = len(hit) / (len(hit) + cleared[e])
        if len(hit) >= min_votes and share >= min_share:
            got.append((len(hit), share, e, hit))
    if not got:
        return None
    _n, _share, e, hit = max(got)  # most covered, then the larger failing share
    return e, hit


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
