"""The kernel's view of offloaded flows: ``tc [-j] [-s] filter show dev DEV ingress``.

Each filter becomes a :class:`FlowRule` whose ``in_hw`` says whether the kernel reports it in
the hardware (``in_hw``) or not (``not_in_hw``: the driver refused it or ``skip_hw`` was set),
so the RNIC check can tell "OVS asked, the NIC never took it" (an offload failure). Matches are
translated to the localizer's field names: flower keys directly, u32 matches at the IPv4 source
(offset 12) and destination (offset 16) as prefixes. Odd or truncated output yields what can
be read.
"""

from __future__ import annotations

import ipaddress
import re

from skh.analysis.localize import FlowRule
from skh.collect.linux import json_rows

__all__ = ["parse_tc_filters"]

_FLOWER_KEYS = {
    "dst_ip": "nw_dst",
    "src_ip": "nw_src",
    "ip_proto": "nw_proto",
    "dst_port": "tp_dst",
    "src_port": "tp_src",
    "dst_mac": "dl_dst",
    "src_mac": "dl_src",
    "enc_key_id": "tun_id",
    "enc_dst_ip": "tun_dst",
    "enc_src_ip": "tun_src",
}
_PROTO = {"ip": "0x0800", "ipv6": "0x86dd", "arp": "0x0806", "802.1Q": "0x8100"}
_U32_OFF = {12: "nw_src", 16: "nw_dst"}


def _u32_prefix(value: str, mask: str) -> str | None:
    try:
        v, m = int(value, 16), int(mask, 16)
    except ValueError:
        return None
    if m == 0:
        return None
    plen = bin(m).count("1")
    addr = str(ipaddress.IPv4Address(v & m))
    return addr if plen == 32 else f"{addr}/{plen}"


def _actions(acts: list) -> tuple[str, ...]:
    out = []
    for a in acts if isinstance(acts, list) else ():
        if not isinstance(a, dict):
            continue
        kind = a.get("kind", "")
        if kind == "mirred":
            out.append(f"output:{a.get('to_dev', '')}")
        elif kind == "gact":
            ctl = a.get("control_action", {})
            out.append("drop" if isinstance(ctl, dict) and ctl.get("type") == "drop" else "pass")
        elif kind == "tunnel_key":
            out.append("encap" if a.get("mode") == "set" else "decap")
        elif kind:
            out.append(str(kind))
    return tuple(out) or ("pass",)


def _from_json(rows: list, dev: str) -> list[FlowRule]:
    out = []
    for r in rows:
        if not isinstance(r, dict):
            continue
        opt = r.get("options")
        if not isinstance(opt, dict) or not (
            "in_hw" in opt or "not_in_hw" in opt or "keys" in opt or "match" in opt
        ):
            continue  # a chain or hash-table header, not a filter
        match: dict[str, str] = {}
        if dev:
            match["in_port"] = dev
        proto = _PROTO.get(str(r.get("protocol", "")))
        if proto:
            match["dl_type"] = proto
        keys = opt.get("keys")
        if isinstance(keys, dict):
            for k, v in keys.items():
                f = _FLOWER_KEYS.get(k)
                if f:
                    match[f] = str(v)
        m = opt.get("match")
        for mm in m if isinstance(m, list) else [m] if isinstance(m, dict) else []:
            f = _U32_OFF.get(mm.get("off")) if isinstance(mm, dict) else None
            if f:
                pfx = _u32_prefix(str(mm.get("value", "")), str(mm.get("mask", "")))
                if pfx:
                    match[f] = pfx
        stats = [a.get("stats", {}) for a in opt.get("actions", ()) if isinstance(a, dict)]
        packets = sum(int(s.get("packets", 0)) for s in stats if isinstance(s, dict))
        in_hw = bool(opt.get("in_hw")) if ("in_hw" in opt or "not_in_hw" in opt) else None
        # tc: the lower pref wins; FlowRule: the higher priority wins
        out.append(
            FlowRule(
                tuple(sorted(match.items())),
                _actions(opt.get("actions", [])),
                -int(r.get("pref", 0)),
                int(r.get("chain", 0)),
                packets,
                -1.0,
                in_hw,
            )
        )
    return out


def _from_text(text: str, dev: str) -> list[FlowRule]:
    out: list[FlowRule] = []
    cur: dict | None = None

    def close() -> None:
        if cur is not None:
            out.append(
                FlowRule(
                    tuple(sorted(cur["match"].items())),
                    tuple(cur["actions"]) or ("pass",),
                    cur["pref"],
                    0,
                    0,
                    -1.0,
                    cur["in_hw"],
                )
            )

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("filter ") and ("in_hw" in s.split() or "not_in_hw" in s.split()):
            close()
            toks = s.split()
            kv = dict(zip(toks[1::2], toks[2::2], strict=False))
            match = {"in_port": dev} if dev else {}
            if _PROTO.get(kv.get("protocol", "")):
                match["dl_type"] = _PROTO[kv["protocol"]]
            pref = -int(kv["pref"]) if kv.get("pref", "").isdigit() else 0
            cur = {"match": match, "actions": [], "pref": pref, "in_hw": "in_hw" in toks}
        elif cur is not None and s.startswith("match "):
            m = re.match(r"match ([0-9a-f]+)/([0-9a-f]+) at (\d+)", s)
            if m and int(m.group(3)) in _U32_OFF:
                pfx = _u32_prefix(m.group(1), m.group(2))
                if pfx:
                    cur["match"][_U32_OFF[int(m.group(3))]] = pfx
        elif cur is not None and s.startswith(
            ("dst_ip ", "src_ip ", "ip_proto ", "dst_port ", "src_port ")
        ):
            k, _, v = s.partition(" ")
            cur["match"][_FLOWER_KEYS[k]] = v.strip()
        elif cur is not None and "action order" in s:
            m = re.search(r"mirred \(Egress (?:Redirect|Mirror) to device (\S+)\)", s)
            cur["actions"].append(
                f"output:{m.group(1)}"
                if m
                else ("drop" if "drop" in s else s.split(":", 1)[-1].split()[0])
            )
    close()
    return out


def parse_tc_filters(text: str, *, dev: str = "") -> list[FlowRule]:
    """``tc [-j] [-s] filter show dev DEV ingress`` → rules (``in_port`` is ``dev``)."""
    rows = json_rows(text)
    return _from_text(text, dev) if rows is None else _from_json(rows, dev)
