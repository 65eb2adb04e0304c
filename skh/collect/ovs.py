"""Open vSwitch flow tables from real command output, as :class:`FlowRule` lists.

- ``ovs-ofctl dump-flows BR [--names]``: the OpenFlow rules (OVS's own view);
- ``ovs-appctl dpctl/dump-flows [-m]``: the datapath flow cache (megaflows). On the namespace
  testbed's userspace datapath it stands in for the RNIC's offloaded table; on a host with
  hardware offload, ``dpctl/dump-flows type=offloaded`` prints the same format;
- ``ovs-ofctl show BR`` and ``ovs-appctl dpctl/show``: port numbers → names, so both sides
  speak port names.

Match fields are translated to one vocabulary (``dl_src dl_dst dl_type nw_src nw_dst nw_proto
tp_src tp_dst tun_id tun_src tun_dst in_port``, others kept under their own name); actions to
``output:PORT``, ``drop``, ``normal``, ``tnl_pop:PORT`` or the action's own name. Lines that
cannot be read are skipped: a truncated dump yields the rules it holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from skh.analysis.localize import FlowRule, FlowTables

__all__ = [
    "split_top",
    "parse_ofctl_flows",
    "parse_ofctl_show",
    "parse_dpctl_flows",
    "parse_dpctl_show",
    "megaflow_tables",
]

_STATS = {
    "cookie",
    "duration",
    "n_packets",
    "n_bytes",
    "idle_age",
    "hard_age",
    "idle_timeout",
    "hard_timeout",
    "importance",
    "reset_counts",
    "send_flow_rem",
    "check_overlap",
    "out_port",
    "out_group",
}
_PROTO_WORDS = {
    "ip": {"dl_type": "0x0800"},
    "ipv6": {"dl_type": "0x86dd"},
    "arp": {"dl_type": "0x0806"},
    "tcp": {"dl_type": "0x0800", "nw_proto": "6"},
    "udp": {"dl_type": "0x0800", "nw_proto": "17"},
    "icmp": {"dl_type": "0x0800", "nw_proto": "1"},
    "tcp6": {"dl_type": "0x86dd", "nw_proto": "6"},
    "udp6": {"dl_type": "0x86dd", "nw_proto": "17"},
    "icmp6": {"dl_type": "0x86dd", "nw_proto": "58"},
}
_OF_ALIASES = {
    "eth_src": "dl_src",
    "eth_dst": "dl_dst",
    "eth_type": "dl_type",
    "ip_src": "nw_src",
    "ip_dst": "nw_dst",
    "ip_proto": "nw_proto",
    "ipv6_src": "nw_src",
    "ipv6_dst": "nw_dst",
    "tcp_src": "tp_src",
    "tcp_dst": "tp_dst",
    "udp_src": "tp_src",
    "udp_dst": "tp_dst",
    "tunnel_id": "tun_id",
    "tun_ipv4_src": "tun_src",
    "tun_ipv4_dst": "tun_dst",
    "arp_spa": "arp_spa",
    "arp_tpa": "arp_tpa",
}
# datapath key → (field of ours) per sub-field
_DP_FIELDS = {
    "eth": {"src": "dl_src", "dst": "dl_dst"},
    "ipv4": {"src": "nw_src", "dst": "nw_dst", "proto": "nw_proto"},
    "ipv6": {"src": "nw_src", "dst": "nw_dst", "proto": "nw_proto"},
    "tcp": {"src": "tp_src", "dst": "tp_dst"},
    "udp": {"src": "tp_src", "dst": "tp_dst"},
    "tunnel": {"tun_id": "tun_id", "src": "tun_src", "dst": "tun_dst"},
    "arp": {"sip": "arp_spa", "tip": "arp_tpa"},
}
_FULL_MASKS = {
    "255.255.255.255",
    "ff:ff:ff:ff:ff:ff",
    "0xffff",
    "0xff",
    "0xffffffff",
    "0xffffffffffffffff",
}


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def _norm_value(field: str, v: str) -> str:
    if field == "dl_type":
        try:
            return f"0x{int(v, 16 if v.lower().startswith('0x') else 10):04x}"
        except ValueError:
            return v
    if field in ("nw_proto", "tp_src", "tp_dst"):
        try:
            return str(int(v, 0))
        except ValueError:
            return v
    if field == "tun_id":
        try:
            return hex(int(v, 0))
        except ValueError:
            return v
    return v.lower() if field in ("dl_src", "dl_dst") else v


def _port(p: str, names: Mapping[str, str] | None) -> str:
    return names.get(p, p) if names else p


def parse_ofctl_show(text: str) -> dict[str, str]:
    """``ovs-ofctl show`` → {OpenFlow port number (or "LOCAL"): name}."""
    out = {}
    for m in re.finditer(r"^\s*(\d+|LOCAL)\(([^)]+)\):", text, re.M):
        out[m.group(1)] = m.group(2)
    return out


def parse_dpctl_show(text: str) -> dict[str, str]:
    """``ovs-appctl dpctl/show`` → {datapath port number: name}."""
    out = {}
    for m in re.finditer(r"^\s*port (\d+): (\S+)", text, re.M):
        out[m.group(1)] = m.group(2)
    return out


def _of_action(a: str, names: Mapping[str, str] | None) -> str:
    low = a.lower()
    if low in ("drop", ""):
        return "drop"
    if low == "normal":
        return "normal"
    if low.startswith("output:"):
        return f"output:{_port(a.split(':', 1)[1], names)}"
    if a.isdigit():
        return f"output:{_port(a, names)}"
    return a


def parse_ofctl_flows(text: str, port_names: Mapping[str, str] | None = None) -> list[FlowRule]:
    """``ovs-ofctl dump-flows`` → rules. ``port_names`` maps OpenFlow port numbers to names
    (from :func:`parse_ofctl_show`); with ``--names`` output it is not needed."""
    rules = []
    for line in text.splitlines():
        if " actions=" not in line and not line.strip().startswith("actions="):
            continue
        left, _, act = line.strip().partition("actions=")
        match: dict[str, str] = {}
        priority, table, packets, used = 32768, 0, 0, -1.0
        for tok in left.replace(", ", ",").split(","):
            tok = tok.strip()
            if not tok:
                continue
            k, eq, v = tok.partition("=")
            if not eq:
                match.update(_PROTO_WORDS.get(k, {}))
                continue
            try:
                if k == "priority":
                    priority = int(v)
                elif k == "table":
                    table = int(v) if v.isdigit() else 0
                elif k == "n_packets":
                    packets = int(v)
                elif k == "idle_age":
                    used = float(v.rstrip("s"))
                elif k in _STATS:
                    pass
                else:
                    f = _OF_ALIASES.get(k, k)
                    match[f] = _port(v, port_names) if f == "in_port" else _norm_value(f, v)
            except ValueError:
                continue
        actions = tuple(_of_action(a, port_names) for a in split_top(act.strip())) or ("drop",)
        rules.append(
            FlowRule(tuple(sorted(match.items())), actions, priority, table, packets, used)
        )
    return rules


def _dp_value(v: str) -> str | None:
    """Drop wildcarded sub-fields (mask all zero), strip full masks."""
    if "/" not in v:
        return v
    val, mask = v.split("/", 1)
    if not mask.strip("0:.x") or mask in ("::",):
        return None
    return val if mask.lower() in _FULL_MASKS else v


def _dp_actions(act: str, names: Mapping[str, str] | None) -> tuple[str, ...]:
    out = []
    for a in split_top(act):
        if a == "drop":
            out.append("drop")
        elif a.startswith("tnl_push("):
            m = re.search(r"tnl_port\(([^)]+)\)", a)
            out.append(f"output:{_port(m.group(1), names)}" if m else "tnl_push")
        elif a.startswith("tnl_pop("):
            out.append(f"tnl_pop:{_port(a[8:-1], names)}")
        elif re.fullmatch(r"[\w.-]+", a):
            out.append(f"output:{_port(a, names)}")
        else:
            out.append(a.split("(", 1)[0])
    return tuple(out) or ("drop",)


def parse_dpctl_flows(text: str, port_names: Mapping[str, str] | None = None) -> list[FlowRule]:
    """``ovs-appctl dpctl/dump-flows [-m]`` → flows. ``port_names`` maps datapath port numbers
    (and, for tunnels, datapath port names such as ``vxlan_sys_4789``) to the OpenFlow names."""
    flows = []
    for line in text.splitlines():
        line = line.strip()
        if ", actions:" not in line:
            continue
        key, _, rest = line.partition(", packets:")
        if not rest:
            continue
        m_pk = re.match(r"(\d+)", rest)
        m_used = re.search(r"used:([\d.]+)s", rest)
        m_act = re.search(r"actions:(.*?)(?:, dp-extra-info:.*)?$", rest)
        if not m_act:
            continue
        match: dict[str, str] = {}
        for item in split_top(key):
            name, _, args = item.partition("(")
            args = args[:-1] if args.endswith(")") else args
            if name == "ufid:" or name.startswith("ufid:"):
                continue
            if name == "in_port":
                match["in_port"] = _port(args, port_names)
            elif name == "eth_type":
                v = _dp_value(args)
                if v is not None:
                    match["dl_type"] = _norm_value("dl_type", v)
            elif name in _DP_FIELDS:
                for sub in split_top(args):
                    k, eq, v = sub.partition("=")
                    f = _DP_FIELDS[name].get(k)
                    if f is None or not eq:
                        continue
                    dv = _dp_value(v)
                    if dv is not None:
                        match[f] = _norm_value(f, dv)
                if name in ("ipv4", "arp") and "dl_type" not in match:
                    match["dl_type"] = "0x0800" if name == "ipv4" else "0x0806"
        flows.append(
            FlowRule(
                tuple(sorted(match.items())),
                _dp_actions(m_act.group(1).strip(), port_names),
                0,
                0,
                int(m_pk.group(1)) if m_pk else 0,
                float(m_used.group(1)) if m_used else -1.0,
            )
        )
    return flows


def megaflow_tables(
    ofctl_flows: str,
    dpctl_flows: str,
    *,
    ofctl_show: str = "",
    dpctl_show: str = "",
    tunnel_ports: Mapping[str, str] | None = None,
) -> FlowTables:
    """One bridge's OpenFlow rules against the datapath flows entering through its ports.

    ``tunnel_ports`` maps a datapath tunnel port to the bridge's tunnel port
    (``{"vxlan_sys_4789": "vx0"}``): userspace tunnels have their own datapath port.
    """
    of_names = parse_ofctl_show(ofctl_show)
    dp_names = dict(parse_dpctl_show(dpctl_show))
    alias = dict(tunnel_ports or {})
    dp_map = {num: alias.get(name, name) for num, name in dp_names.items()}
    dp_map.update(alias)
    of = parse_ofctl_flows(ofctl_flows, of_names)
    ports = (
        set(of_names.values()) | {r.match_dict.get("in_port", "") for r in of} | set(alias.values())
    )
    ports.discard("")
    dp = []
    for f in parse_dpctl_flows(dpctl_flows, dp_map):
        if f.match_dict.get("in_port") not in ports:
            continue  # another bridge's flow (the underlay bridge of a userspace tunnel)
        # after tnl_push the packet leaves through the underlay bridge: not this bridge's output
        acts = tuple(a for a in f.actions if not a.startswith("output:") or a[7:] in ports)
        dp.append(replace(f, actions=acts or ("drop",)))
    return FlowTables(tuple(of), tuple(dp), megaflow=True)
