"""The commands agents run for the analyzer and the operator, and the arguments each may take.

The controller checks every relayed command here before it forwards it (the command must exist
for the agent's role, every argument must be known and of its form, timeouts and retries within
bounds), and each agent checks again before it runs one: an argument reaches ``ip netns exec``,
``ovs-ofctl`` or a traceroute only as a plain name, address or number. A network namespace is a
name (never a path: ``/`` and ``..`` would reach any namespace of the host), an interface or
bridge name cannot start like an option.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from skh.errors import ProtocolError

__all__ = ["check_command", "check_delivery", "COMMANDS", "TIMEOUT_RANGE_S", "RETRIES_MAX"]

#: a relayed command's per-attempt timeout, and its resends
TIMEOUT_RANGE_S = (0.05, 300.0)
RETRIES_MAX = 10

_NETNS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,15}$")  # IFNAMSIZ


def _netns(v: Any) -> str:
    if not isinstance(v, str) or (v and (not _NETNS.match(v) or v in (".", ".."))):
        raise ProtocolError(f"netns must be a namespace name, not {str(v)[:80]!r}")
    return v


def _ifname(v: Any) -> str:
    if not isinstance(v, str) or not _IFNAME.match(v):
        raise ProtocolError(f"{str(v)[:80]!r} is not an interface or bridge name")
    return v


def _ip(v: Any) -> str:
    try:
        return str(ipaddress.ip_address(v if isinstance(v, str) else ""))
    except ValueError:
        raise ProtocolError(f"{str(v)[:80]!r} is not an IP address") from None


def _int(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ProtocolError(f"{str(v)[:40]!r} is not an int in [{lo}, {hi}]")
        return v

    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError(f"{str(v)[:40]!r} is not true or false")
    return v


def _rnics(v: Any) -> dict[str, str]:
    if not isinstance(v, Mapping) or len(v) > 256:
        raise ProtocolError("rnics must be a map of at most 256 rails to netdevs")
    out = {}
    for rail, dev in v.items():
        if not isinstance(rail, str) or not rail.isdigit() or not 0 <= int(rail) < 256:
            raise ProtocolError(f"rail {str(rail)[:20]!r} is not in [0, 255]")
        out[rail] = _ifname(dev)
    return out


_PORT = _int(1, 65535)
#: command -> (roles whose agents run it, {argument: (check, required)})
COMMANDS: dict[str, tuple[tuple[str, ...], dict[str, tuple[Callable[[Any], Any], bool]]]] = {
    "stats": (("overlay", "underlay"), {}),
    "pinglist": (("overlay",), {}),
    "traceroute": (
        ("underlay",),
        {
            "dst": (_ip, True),
            "src": (_ip, False),
            "sport": (_PORT, False),
            "dport": (_PORT, False),
            "max_ttl": (_int(1, 64), False),
            "netns": (_netns, False),
            # an overlay probe flow whose VXLAN outer 5-tuple the trace takes
            "inner_src": (_ip, False),
            "inner_dst": (_ip, False),
            "path_id": (_int(0, 65535), False),
            "reply": (_bool, False),
            "learn_ms": (_int(0, 30000), False),
            "vxlan_port": (_PORT, False),
        },
    ),
    "dump_flows": (
        ("underlay",),
        {"bridge": (_ifname, False), "datapath": (_bool, False), "netns": (_netns, False)},
    ),
    "overlay_state": (("underlay",), {"netns": (_netns, False)}),
    "host_report": (("underlay",), {"rnics": (_rnics, False), "netns": (_netns, False)}),
    "rnic_flows": (("underlay",), {"rail": (_int(0, 255), True)}),
}


def check_command(name: str, args: Any, role: str = "") -> dict[str, Any]:
    """The checked arguments of command ``name`` for an agent of ``role`` ("" = any role);
    raises ProtocolError naming what is wrong."""
    spec = COMMANDS.get(name)
    if spec is None:
        raise ProtocolError(f"unknown command {name[:64]!r}")
    roles, params = spec
    if role and role not in roles:
        raise ProtocolError(f"command {name!r} is not run by {role} agents")
    if not isinstance(args, Mapping):
        raise ProtocolError(f"{name}: args must be a map")
    unknown = set(args) - set(params)
    if unknown:
        raise ProtocolError(f"{name}: unknown argument(s) {sorted(map(str, unknown))[:8]}")
    out = {}
    for key, (check, required) in params.items():
        if key not in args:
            if required:
                raise ProtocolError(f"{name}: missing argument {key!r}")
            continue
        try:
            out[key] = check(args[key])
        except ProtocolError as exc:
            raise ProtocolError(f"{name}: {key}: {exc}") from None
    if name == "dump_flows" and not out.get("datapath") and "bridge" not in out:
        raise ProtocolError("dump_flows: a bridge, or datapath = true")
    return out


def check_delivery(timeout_s: Any, retries: Any) -> tuple[float, int]:
    """A requester's per-attempt timeout and resends, within bounds."""
    lo, hi = TIMEOUT_RANGE_S
    if (
        not isinstance(timeout_s, (int, float))
        or isinstance(timeout_s, bool)
        or not math.isfinite(timeout_s)
        or not lo <= timeout_s <= hi
    ):
        raise ProtocolError(f"timeout_s must be in [{lo}, {hi}] s, got {timeout_s!r}")
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= RETRIES_MAX:
        raise ProtocolError(f"retries must be an int in [0, {RETRIES_MAX}], got {retries!r}")
    return float(timeout_s), retries
