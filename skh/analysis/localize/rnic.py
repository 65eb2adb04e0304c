"""RNIC check (Algorithm 1, step 4): what OVS wants offloaded against what the RNIC holds.

Two comparisons:

- :func:`diff_flow_tables`: both sides are rule lists with the same match vocabulary (an RNIC's
  offloaded rules against the OVS rules that should be offloaded, or tc's view). Missing, stale
  (gone from OVS or other actions), duplicated and mis-ordered rules, plus rules the kernel
  says never reached the hardware.
- :func:`diff_megaflows`: OpenFlow rules against a datapath flow cache (OVS's own megaflows,
  the namespace testbed's stand-in for the RNIC table). A cached flow is checked against the
  highest-priority OpenFlow rule it falls under; an OpenFlow rule in use with no cached flow
  under it means its packets take the slow path.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from skh.analysis.localize.data import FlowDiff, FlowRule

__all__ = ["diff_flow_tables", "diff_megaflows", "covers"]


def _key(r: FlowRule) -> tuple[int, tuple[tuple[str, str], ...]]:
    return (r.table, tuple(sorted(r.match)))


def _value_covers(general: str, specific: str) -> bool:
    if general == specific:
        return True
    if "/" in general:  # an address prefix
        try:
            return ipaddress.ip_address(specific.split("/")[0]) in ipaddress.ip_network(
                general, strict=False
            )
        except ValueError:
            return False
    return False


def covers(general: FlowRule | dict[str, str], specific: FlowRule | dict[str, str]) -> bool:
    """Every field ``general`` matches on, ``specific`` matches too, on a value inside it."""
    g = general.match_dict if isinstance(general, FlowRule) else general
    s = specific.match_dict if isinstance(specific, FlowRule) else specific
    return all(f in s and _value_covers(v, s[f]) for f, v in g.items())


def _precedence(
    rules: Sequence[FlowRule], *, by_position: bool = False
) -> dict[tuple[int, tuple[tuple[str, str], ...]], int]:
    """Rank of each rule key: lower wins. OVS ranks by priority (ties: table order); a hardware
    table is searched in its order (``by_position``), first match wins."""
    if by_position:
        order = sorted(range(len(rules)), key=lambda i: (rules[i].table, i))
    else:
        order = sorted(range(len(rules)), key=lambda i: (rules[i].table, -rules[i].priority, i))
    out: dict[tuple[int, tuple[tuple[str, str], ...]], int] = {}
    for rank, i in enumerate(order):
        out.setdefault(_key(rules[i]), rank)
    return out


def diff_flow_tables(expected: Sequence[FlowRule], offloaded: Sequence[FlowRule]) -> FlowDiff:
    """Compare two rule lists keyed by (table, match). ``offloaded`` is in the order the
    hardware searches it; OVS's rules rank by priority."""
    exp = {_key(r): r for r in expected}
    seen: dict[tuple[int, tuple[tuple[str, str], ...]], FlowRule] = {}
    duplicated: list[FlowRule] = []
    stale: list[FlowRule] = []
    for r in offloaded:
        k = _key(r)
        if k in seen:
            duplicated.append(r)
            continue
        seen[k] = r
        e = exp.get(k)
        if e is None or tuple(e.actions) != tuple(r.actions):
            stale.append(r)
    missing = [r for k, r in exp.items() if k not in seen]
    misordered = _misordered(expected, offloaded, exp, seen)
    not_in_hw = [r for r in seen.values() if r.in_hw is False]
    return FlowDiff(
        tuple(missing), tuple(stale), tuple(duplicated), tuple(misordered), tuple(not_in_hw)
    )


def _misordered(expected, offloaded, exp, seen) -> list[tuple[FlowRule, FlowRule]]:
    """Overlapping rules present on both sides whose precedence is inverted on the RNIC."""
    both = [r for k, r in exp.items() if k in seen]
    if len(both) < 2:
        return []
    rank_e = _precedence(expected)
    rank_o = _precedence(offloaded, by_position=True)
    # index by (field, value) so only rules that can overlap are compared
    by_item: dict[tuple[str, str], list[FlowRule]] = {}
    by_prefix: dict[str, list[FlowRule]] = {}  # rules matching a field on a prefix
    wild: list[FlowRule] = []
    for r in both:
        if not r.match:
            wild.append(r)
        for f, v in r.match:
            by_item.setdefault((f, v), []).append(r)
            if "/" in v:
                by_prefix.setdefault(f, []).append(r)
    out: list[tuple[FlowRule, FlowRule]] = []
    done: set[tuple[int, int]] = set()
    for r in both:
        cands = {id(x): x for item in r.match for x in by_item.get(item, ())}
        cands.update((id(x), x) for f, _ in r.match for x in by_prefix.get(f, ()))
        cands.update((id(x), x) for x in wild)
        for g in cands.values():
            if g is r or g.table != r.table or not covers(g, r):
                continue
            pair = (id(r), id(g))
            if pair in done:
                continue
            done.add(pair)
            kr, kg = _key(r), _key(g)
            # the specific rule r overlaps the general g; their order must be the same on both sides
            if (rank_e[kr] < rank_e[kg]) != (rank_o[kr] < rank_o[kg]):
                winner_e, winner_o = (r, g) if rank_e[kr] < rank_e[kg] else (g, r)
                out.append((winner_e, winner_o))
    return out


def _outputs(actions: Sequence[str]) -> frozenset[str]:
    return frozenset(a for a in actions if a != "normal")


def diff_megaflows(
    openflow: Sequence[FlowRule], datapath: Sequence[FlowRule], *, active_within_s: float = 10.0
) -> FlowDiff:
    """Check a datapath flow cache against the OpenFlow rules it was derived from.

    Both sides must use the same port names (map datapath port numbers and tunnel ports to
    OpenFlow names first, see :mod:`skh.collect.ovs`). A ``normal`` OpenFlow action (MAC
    learning) accepts any cached output. ``active_within_s`` bounds how recently an OpenFlow
    rule must have been used to count as active.
    """
    ranked = sorted(openflow, key=lambda r: (r.table, -r.priority))
    stale: list[FlowRule] = []
    misordered: list[tuple[FlowRule, FlowRule]] = []
    covered: set[int] = set()
    seen: dict[tuple[tuple[str, str], ...], FlowRule] = {}
    duplicated: list[FlowRule] = []
    for dp in datapath:
        k = tuple(sorted(dp.match))
        if k in seen:
            duplicated.append(dp)
            continue
        seen[k] = dp
        under = [r for r in ranked if r.table == 0 and covers(r, dp)]
        if not under:
            stale.append(dp)
            continue
        top = under[0]
        covered.add(id(top))
        if "normal" in top.actions or _outputs(top.actions) == _outputs(dp.actions):
            continue
        # the cache follows a lower-priority rule: it was installed in the wrong order or the
        # higher rule came later and the cache was never revalidated
        agree = next((r for r in under[1:] if _outputs(r.actions) == _outputs(dp.actions)), None)
        if agree is not None:
            misordered.append((top, agree))
        else:
            stale.append(dp)
    missing = [
        r
        for r in ranked
        if id(r) not in covered
        and r.packets > 0
        and 0 <= r.used_s <= active_within_s
        and "normal" not in r.actions
    ]
    return FlowDiff(tuple(missing), tuple(stale), tuple(duplicated), tuple(misordered), ())
