"""Linux overlay state (routes, neighbours, bridge/VXLAN FDB) from command output or pyroute2, and
the overlay forwarding graph localization walks.

Parsers take ``ip [-j] route``, ``ip [-j] neigh`` and ``bridge [-j] fdb show`` output (JSON or
text; odd lines are skipped). :func:`read_linux_state` reads the same from a namespace with
pyroute2. :func:`linux_overlay_tables` turns one host's state into :class:`OverlayTables` for the
routed-vSwitch overlay of the namespace testbed (and of flannel/Calico-style hosts)::

    host/vf:<container>.<rail>  →  host/rep:<dev>  →  host/route  →  host/vtep:<vxlan dev>
      →  remote/decap:<vxlan dev>  →  remote/route  →  remote/rep:<dev>  →  remote/vf:…

A destination without a route, a gateway without a neighbour entry or a MAC without an FDB
entry is a missing next hop (the walk reports the break there); routes that send a destination
back and forth between hosts make the walk revisit a node (a loop).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from skh.analysis.localize import OverlayTables

__all__ = [
    "Route",
    "Neigh",
    "FdbEntry",
    "LinuxState",
    "LocalEndpoint",
    "parse_ip_route",
    "parse_ip_neigh",
    "parse_bridge_fdb",
    "parse_ip_link",
    "read_linux_state",
    "linux_overlay_tables",
]


@dataclass(frozen=True, slots=True)
class Route:
    dst: str  # a prefix; "0.0.0.0/0" for default
    dev: str = ""
    gateway: str = ""
    type: str = "unicast"  # unicast | blackhole | unreachable | prohibit | local | ...
    table: str = "main"


@dataclass(frozen=True, slots=True)
class Neigh:
    dst: str
    dev: str
    lladdr: str = ""
    state: str = ""


@dataclass(frozen=True, slots=True)
class FdbEntry:
    mac: str
    dev: str
    dst: str = ""  # remote VTEP address (VXLAN)
    vni: int = -1
    state: str = ""


@dataclass(frozen=True, slots=True)
class LinuxState:
    routes: tuple[Route, ...] = ()
    neighs: tuple[Neigh, ...] = ()
    fdb: tuple[FdbEntry, ...] = ()
    #: device name → kind ("vxlan", "veth", "bridge", ...); "" when unknown
    links: Mapping[str, str] = field(default_factory=dict)
    #: device names that are not oper-up
    down: frozenset[str] = frozenset()


def json_rows(text: str) -> list | None:
    """The elements of a JSON list (``ip -j``, ``bridge -j``, ``tc -j`` output); of a truncated
    one, the complete leading elements. ``None`` when the text is not a JSON list at all."""
    s = text.strip()
    if not s.startswith("["):
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        pass
    else:
        return obj if isinstance(obj, list) else []
    dec = json.JSONDecoder()
    out = []
    i = 1
    while True:
        while i < len(s) and s[i] in " \t\r\n,":
            i += 1
        try:
            row, i = dec.raw_decode(s, i)
        except json.JSONDecodeError:
            return out
        out.append(row)


def _prefix(dst: str) -> str:
    if dst in ("default", ""):
        return "0.0.0.0/0"
    try:
        return str(ipaddress.ip_network(dst, strict=False))
    except ValueError:
        return ""


_ROUTE_TYPES = {
    "blackhole",
    "unreachable",
    "prohibit",
    "local",
    "broadcast",
    "multicast",
    "throw",
    "anycast",
}


def parse_ip_route(text: str) -> list[Route]:
    """``ip [-j] route [show table all]`` → routes."""
    rows = json_rows(text)
    out: list[Route] = []
    if rows is not None:
        for r in rows:
            if not isinstance(r, dict):
                continue
            dst = _prefix(str(r.get("dst", "")))
            if not dst:
                continue
            out.append(
                Route(
                    dst,
                    str(r.get("dev", "")),
                    str(r.get("gateway", "")),
                    str(r.get("type", "unicast")),
                    str(r.get("table", "main")),
                )
            )
        return out
    for line in text.splitlines():
        toks = line.split()
        if not toks:
            continue
        rtype = "unicast"
        if toks[0] in _ROUTE_TYPES:
            rtype = toks.pop(0)
            if not toks:
                continue
        dst = _prefix(toks[0])
        if not dst:
            continue
        kv = dict(zip(toks[1::2], toks[2::2], strict=False))
        out.append(Route(dst, kv.get("dev", ""), kv.get("via", ""), rtype, kv.get("table", "main")))
    return out


def parse_ip_neigh(text: str) -> list[Neigh]:
    """``ip [-j] neigh`` → neighbour entries (FAILED/INCOMPLETE ones have no lladdr)."""
    rows = json_rows(text)
    out: list[Neigh] = []
    if rows is not None:
        for r in rows:
            if isinstance(r, dict) and "dst" in r and "dev" in r:
                state = r.get("state", [])
                out.append(
                    Neigh(
                        str(r["dst"]),
                        str(r["dev"]),
                        str(r.get("lladdr", "")).lower(),
                        ",".join(state) if isinstance(state, list) else str(state),
                    )
                )
        return out
    for line in text.splitlines():
        toks = line.split()
        if len(toks) < 3 or "dev" not in toks:
            continue
        kv = dict(zip(toks[1::2], toks[2::2], strict=False))
        out.append(Neigh(toks[0], kv.get("dev", ""), kv.get("lladdr", "").lower(), toks[-1]))
    return out


def parse_bridge_fdb(text: str, *, dev: str = "") -> list[FdbEntry]:
    """``bridge [-j] fdb show [dev DEV]`` → FDB entries. With ``dev DEV`` bridge leaves the
    device out of each row: pass it as ``dev``."""
    rows = json_rows(text)
    out: list[FdbEntry] = []
    if rows is not None:
        for r in rows:
            if isinstance(r, dict) and "mac" in r:
                vni = r.get("vni", r.get("src_vni", -1))
                out.append(
                    FdbEntry(
                        str(r["mac"]).lower(),
                        str(r.get("ifname", dev)),
                        str(r.get("dst", "")),
                        int(vni) if isinstance(vni, int) else -1,
                        str(r.get("state", "")),
                    )
                )
        return out
    for line in text.splitlines():
        toks = line.split()
        if not toks or ":" not in toks[0]:
            continue
        kv = dict(zip(toks[1::2], toks[2::2], strict=False))
        try:
            vni = int(kv.get("vni", -1))
        except ValueError:
            vni = -1
        state = "permanent" if "permanent" in toks else ("static" if "static" in toks else "")
        out.append(FdbEntry(toks[0].lower(), kv.get("dev", dev), kv.get("dst", ""), vni, state))
    return out


def parse_ip_link(text: str) -> tuple[dict[str, str], frozenset[str]]:
    """``ip [-j] -d link`` → (device → kind, devices not oper-up). Plain text has no kinds."""
    rows = json_rows(text)
    kinds: dict[str, str] = {}
    down: set[str] = set()
    if rows is not None:
        for r in rows:
            if not isinstance(r, dict) or "ifname" not in r:
                continue
            name = str(r["ifname"])
            info = r.get("linkinfo")
            kinds[name] = str(info.get("info_kind", "")) if isinstance(info, dict) else ""
            if r.get("operstate") not in ("UP", "UNKNOWN"):
                down.add(name)
        return kinds, frozenset(down)
    for line in text.splitlines():
        m = re.match(r"^\d+: ([^:@\s]+)(?:@\S+)?: <[^>]*>.*? state (\S+)", line)
        if m:
            kinds[m.group(1)] = ""
            if m.group(2) not in ("UP", "UNKNOWN"):
                down.add(m.group(1))
    return kinds, frozenset(down)


def read_linux_state(netns: str | None = None) -> LinuxState:
    """Read routes (all tables), IPv4 neighbours, the bridge FDB and link kinds with pyroute2,
    from the current namespace or from ``netns`` (a name under /run/netns)."""
    from pyroute2 import IPRoute

    kw = {"netns": netns} if netns else {}
    with IPRoute(**kw) as ipr:
        names: dict[int, str] = {}
        kinds: dict[str, str] = {}
        down: set[str] = set()
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            names[link["index"]] = name
            info = link.get_attr("IFLA_LINKINFO")
            kinds[name] = (info.get_attr("IFLA_INFO_KIND") if info else "") or ""
            if link.get_attr("IFLA_OPERSTATE") not in ("UP", "UNKNOWN"):
                down.add(name)
        routes = []
        for r in ipr.get_routes(family=socket.AF_INET):
            if r["type"] not in (1, 6, 7, 8):  # unicast, blackhole, unreachable, prohibit
                continue
            dst = r.get_attr("RTA_DST")
            plen = r["dst_len"]
            table = r.get_attr("RTA_TABLE") or r["table"]
            routes.append(
                Route(
                    f"{dst or '0.0.0.0'}/{plen}",
                    names.get(r.get_attr("RTA_OIF"), ""),
                    r.get_attr("RTA_GATEWAY") or "",
                    {1: "unicast", 6: "blackhole", 7: "unreachable", 8: "prohibit"}[r["type"]],
                    "main" if table == 254 else str(table),
                )
            )
        neighs = [
            Neigh(
                n.get_attr("NDA_DST"),
                names.get(n["ifindex"], ""),
                (n.get_attr("NDA_LLADDR") or "").lower(),
            )
            for n in ipr.get_neighbours(family=socket.AF_INET)
            if n.get_attr("NDA_DST")
        ]
        fdb = []
        for n in ipr.get_neighbours(family=socket.AF_BRIDGE):
            mac = n.get_attr("NDA_LLADDR")
            if not mac:
                continue
            vni = n.get_attr("NDA_VNI")
            fdb.append(
                FdbEntry(
                    mac.lower(),
                    names.get(n["ifindex"], ""),
                    n.get_attr("NDA_DST") or "",
                    vni if vni is not None else -1,
                )
            )
    return LinuxState(tuple(routes), tuple(neighs), tuple(fdb), kinds, frozenset(down))


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    """An endpoint on this host: its overlay node (as the localizer names it), address and the
    host-side device of its VF (the representor, or the veth peer on the testbed)."""

    node: str
    ip: str
    rep_dev: str


def _lpm(
    routes: Sequence[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, Route]], ip: str
) -> Route | None:
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return None
    for net, r in routes:
        if a.version == net.version and a in net:
            return r
    return None


def linux_overlay_tables(
    host: str,
    state: LinuxState,
    local: Iterable[LocalEndpoint],
    destinations: Iterable[str],
    vtep_hosts: Mapping[str, str],
    *,
    table: str = "main",
) -> OverlayTables:
    """One host's forwarding graph toward ``destinations`` (overlay IPs, the walk's keys).

    ``vtep_hosts`` maps underlay (VTEP) addresses to host names, so an FDB entry names the
    remote host whose ``decap`` node the chain continues at.
    """
    routes = sorted(
        ((ipaddress.ip_network(r.dst, strict=False), r) for r in state.routes if r.table == table),
        key=lambda t: -t[0].prefixlen,
    )
    neigh = {(n.dst, n.dev): n.lladdr for n in state.neighs if n.lladdr}
    fdb: dict[tuple[str, str], str] = {}
    for e in state.fdb:
        if e.dst:
            fdb.setdefault((e.mac, e.dev), e.dst)
    nh: dict[str, dict[str, str]] = {}
    down: set[str] = set()
    route_node = f"{host}/route"
    rep_of_dev: dict[str, str] = {}
    for ep in local:
        rep = f"{host}/rep:{ep.rep_dev}"
        rep_of_dev[ep.rep_dev] = rep
        nh[ep.node] = {"*": rep}
        nh[rep] = {"*": route_node, ep.ip: ep.node}
        if ep.rep_dev in state.down:
            down.add(rep)
    nh[route_node] = {}
    vteps: dict[str, dict[str, str]] = {}
    for d in destinations:
        r = _lpm(routes, d)
        if r is None or r.type != "unicast" or not r.dev:
            continue  # no usable route: the walk breaks at host/route
        if r.dev in rep_of_dev:
            nh[route_node][d] = rep_of_dev[r.dev]
            continue
        if state.links.get(r.dev, "vxlan") != "vxlan":
            nh[route_node][d] = f"{host}/dev:{r.dev}"
            continue
        vtep = f"{host}/vtep:{r.dev}"
        nh[route_node][d] = vtep
        if r.dev in state.down:
            down.add(vtep)
        mac = neigh.get((r.gateway or d, r.dev))
        remote = vtep_hosts.get(fdb.get((mac, r.dev), "")) if mac else None
        entry = vteps.setdefault(vtep, {})
        if remote:
            entry[d] = f"{remote}/decap:{r.dev}"
    nh.update(vteps)
    # decapsulated traffic from any remote VTEP continues at this host's routing
    for dev, kind in state.links.items():
        if kind == "vxlan":
            nh[f"{host}/decap:{dev}"] = {"*": route_node}
    return OverlayTables(host, nh, frozenset(down))
