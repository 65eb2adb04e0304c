"""Overlay walk (Algorithm 1, step 2): replay a pair's virtual forwarding chain hop by hop."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from skh.analysis.localize.data import OverlayTables, OverlayWalk, Pair

__all__ = ["host_of", "walk_overlay"]

#: no real chain is this long (VF, representor, vswitch, VTEP, and the same on the far side);
#: a walk that gets here without revisiting a node is reported as a loop through fresh names
MAX_HOPS = 64


def host_of(node: str) -> str:
    """The host part of an overlay node name ``host/local``."""
    return node.split("/", 1)[0]


def walk_overlay(
    pair: Pair,
    src_node: str,
    dst_key: str,
    dst_node: str,
    tables_of: Callable[[str], OverlayTables | None] | Mapping[str, OverlayTables],
) -> OverlayWalk:
    """Follow ``src_node``'s chain toward ``dst_key`` until ``dst_node``.

    ``tables_of(host)`` returns the host's :class:`OverlayTables` (or ``None`` when the host
    could not report: its first hop is then the break). A node with no entry for ``dst_key``
    and no default is a **break**; a node seen twice is a **loop** (the hop named is where the
    chain re-enters); a node listed as down is **down**.
    """
    lookup = tables_of.get if isinstance(tables_of, Mapping) else tables_of
    cache: dict[str, OverlayTables | None] = {}
    chain: list[str] = [src_node]
    seen = {src_node}
    node = src_node
    while True:
        h = host_of(node)
        if h not in cache:
            cache[h] = lookup(h)
        tables = cache[h]
        if tables is not None and node in tables.down:
            return OverlayWalk(pair, "down", tuple(chain), node)
        if node == dst_node:
            return OverlayWalk(pair, "ok", tuple(chain), "")
        if tables is None:
            return OverlayWalk(pair, "break", tuple(chain), node)
        entry = tables.next_hop.get(node)
        nxt = None if entry is None else entry.get(dst_key, entry.get("*"))
        if not nxt:
            return OverlayWalk(pair, "break", tuple(chain), node)
        chain.append(nxt)
        if nxt in seen or len(chain) > MAX_HOPS:
            return OverlayWalk(pair, "loop", tuple(chain), nxt)
        seen.add(nxt)
        node = nxt
