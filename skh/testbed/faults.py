"""Reversible fault injection on a running testbed, each with its ground truth.

Every fault names the component in the vocabulary of :mod:`skh.model` (see
:mod:`skh.testbed.spec`): a physical link is its sorted node pair, e.g. ``("host1:rnic0",
"tor0r0")`` or ``("spine1", "tor0r0")``; an RNIC is ``host1:rnic0``; an overlay FDB hop is the
(VTEP, remote VTEP) pair ``("host0:vx0", "host3:vx0")``; an agent or container is its name.

Kinds (layer, component, paper failure type):

* ``link_down``: admin-down one end (``at``) of a link. Switch end: underlay, the link, type 2;
  RNIC end: rnic, the RNIC, type 7.
* ``link_flap``: a helper process toggles that end (``down_s``/``up_s``): types 3 / 8.
* ``loss``: nftables netdev ingress/egress ``numgen`` drop at one end of a link (``min_len``: only
  big frames, CRC-like; ``spare_ports``: VXLAN-carried UDP between two of these inner ports —
  the probers' bound ports, path id 0's flows — passes, every other inner UDP flow (the rotated
  path ids' own source ports) is dropped: an ECMP path that a fixed set of 5-tuples never
  takes): underlay, the link, type 1.
* ``switch_down``: a ToR's bridge goes down while its ports keep carrier (a silent failure):
  underlay, the ToR, type 4.
* ``fdb_blackhole``: a host's VXLAN FDB entry of a peer VTEP is deleted: overlay,
  (VTEP, remote VTEP), type 23 (overlay black hole, ours).
* ``overlay_loop``: two hosts' routes to a third host's containers point at each other
  (TTL-bounded): overlay, (VTEP a, VTEP b), type 22 (ours).
* ``slow_path``: one flow's (or one RNIC's) frames detoured through a userspace delay relay
  (tc u32 + mirred), standing in for flows evicted from the RNIC: rnic, the RNIC, type 15.
* ``agent_crash``: SIGKILL a process (respawned on clear when the testbed started it): endpoint,
  the agent's name, type 20 (ours).
* ``agent_hang``: SIGSTOP a process (SIGCONT on clear): endpoint, the agent's name, type 21 (a
  late agent: alive, answering nothing).
* ``container_crash``: the container's VFs are deleted and its processes killed (both restored on
  clear): endpoint, the container, type 17.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from skh.collect.netdev import oper_up
from skh.errors import ConfigError, TestbedError
from skh.failures import FailureType
from skh.testbed import netns as nx
from skh.testbed.testbed import ProcRecord, Testbed, wait_ready

__all__ = ["FaultTruth", "Faults", "KINDS"]

log = logging.getLogger(__name__)

KINDS = (
    "link_down",
    "link_flap",
    "loss",
    "switch_down",
    "fdb_blackhole",
    "overlay_loop",
    "slow_path",
    "agent_crash",
    "agent_hang",
    "container_crash",
)


@dataclass(frozen=True, slots=True)
class FaultTruth:
    """What was broken, for scoring a detector against."""

    id: int
    kind: str
    layer: str  # underlay | rnic | overlay | endpoint
    component: str | tuple[str, str]
    #: a :class:`skh.failures.FailureType` value (1-19 the paper's Table 1, 20-23 the
    #: monitor's own: agents, overlay loops and black holes); None where no type fits
    paper_type: int | None
    detail: dict[str, Any] = field(default_factory=dict)
    t_inject_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "layer": self.layer,
            "component": list(self.component)
            if isinstance(self.component, tuple)
            else self.component,
            "paper_type": self.paper_type,
            "detail": self.detail,
            "t_inject_ns": self.t_inject_ns,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FaultTruth:
        comp = d["component"]
        return cls(
            d["id"],
            d["kind"],
            d["layer"],
            tuple(comp) if isinstance(comp, list) else comp,
            d["paper_type"],
            d.get("detail", {}),
            d.get("t_inject_ns", 0),
        )


def _sorted_link(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


class Faults:
    """Fault injection on ``tb``; the active faults live in the testbed's state file so that
    ``skh testbed fault clear`` in another process can undo them."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self.L = tb.layout

    # -- public -------------------------------------------------------------------------------
    def inject(self, kind: str, **params: Any) -> FaultTruth:
        if kind not in KINDS:
            raise ConfigError(
                f"The 'kind' parameter of Faults.inject must be one of {KINDS}."
                f" Got {kind!r} instead."
            )
        with self.tb.transact() as st:
            fid = st["next_fault"]
            st["next_fault"] = fid + 1
        fn = getattr(self, f"_inject_{kind}")
        try:
            inspect.signature(fn).bind(fid, **params)
        except TypeError as exc:
            raise ConfigError(f"fault {kind}: {exc}") from exc
        truth, undo = fn(fid, **params)
        truth = dataclasses.replace(truth, t_inject_ns=time.time_ns())
        with self.tb.transact() as st:
            st["faults"].append({**truth.to_dict(), "undo": undo})
        log.info("fault %d injected: %s %s", fid, kind, truth.component)
        return truth

    def list(self) -> list[FaultTruth]:
        return [FaultTruth.from_dict(f) for f in self.tb.state().get("faults", ())]

    def clear(self, fault_id: int) -> FaultTruth:
        with self.tb.transact() as st:
            rec = next((f for f in st["faults"] if f["id"] == fault_id), None)
        if rec is None:
            raise TestbedError(f"no active fault {fault_id}")
        extra = getattr(self, f"_clear_{rec['kind']}")(rec["undo"]) or {}
        with self.tb.transact() as st:
            st["faults"] = [f for f in st["faults"] if f["id"] != fault_id]
        truth = FaultTruth.from_dict(rec)
        if extra:
            truth = dataclasses.replace(truth, detail={**truth.detail, **extra})
        log.info("fault %d cleared", fault_id)
        return truth

    def clear_all(self) -> list[FaultTruth]:
        return [self.clear(f.id) for f in reversed(self.list())]

    # -- link ends ----------------------------------------------------------------------------
    def _node(self, name: str) -> tuple[str, tuple[int, ...]]:
        """('rnic', (g, r)) | ('tor', (p, r)) | ('spine', (s,))."""
        L, s = self.L, self.tb.spec
        if m := re.fullmatch(r"host(\d+):rnic(\d+)", name):
            g, r = int(m[1]), int(m[2])
            if g < s.hosts and r < s.rnics_per_host:
                return "rnic", (g, r)
        elif m := re.fullmatch(r"tor(\d+)r(\d+)", name):
            if (int(m[1]), int(m[2])) in L.tors():
                return "tor", (int(m[1]), int(m[2]))
        elif (m := re.fullmatch(r"spine(\d+)", name)) and int(m[1]) < s.spines:
            return "spine", (int(m[1]),)
        raise ConfigError(f"unknown fabric node {name!r}")

    def _port(self, link: tuple[str, str], at: str | None) -> dict[str, Any]:
        """Resolve one end of a link: namespace, device, restore lines, and the model truth."""
        if len(link) != 2:
            raise ConfigError(f"a link is two node names, got {link!r}")
        a, b = link
        ka, ia = self._node(a)
        kb, ib = self._node(b)
        pair = {ka: ia, kb: ib}
        L, tb = self.L, self.tb
        if set(pair) == {"rnic", "tor"} and len(pair) == 2:
            g, r = pair["rnic"]
            p, r2 = pair["tor"]
            if r != r2 or L.segment(g) != p:
                raise ConfigError(f"{a} and {b} are not linked")
            at = at or L.tor_name(p, r)
            if at == L.rnic_key(g, r):
                return {
                    "ns": L.host_ns(g),
                    "dev": f"rnic{r}",
                    "peer": (L.tor_ns(p, r), f"h{g}"),
                    "restore": tb.rnic_port_lines(g, r) + tb.overlay_route_lines(g, r),
                    "side": "rnic",
                    "link": _sorted_link(a, b),
                    "rnic": L.rnic_key(g, r),
                }
            if at == L.tor_name(p, r):
                return {
                    "ns": L.tor_ns(p, r),
                    "dev": f"h{g}",
                    "peer": (L.host_ns(g), f"rnic{r}"),
                    "restore": [],
                    "side": "switch",
                    "link": _sorted_link(a, b),
                    "rnic": L.rnic_key(g, r),
                }
        elif set(pair) == {"tor", "spine"} and len(pair) == 2:
            p, r = pair["tor"]
            (i,) = pair["spine"]
            at = at or L.tor_name(p, r)
            if at == L.tor_name(p, r):
                return {
                    "ns": L.tor_ns(p, r),
                    "dev": f"sp{i}",
                    "peer": (L.spine_ns(i), f"t{p}r{r}"),
                    "restore": tb.tor_uplink_lines(i, p, r),
                    "side": "switch",
                    "link": _sorted_link(a, b),
                    "rnic": None,
                }
            if at == L.spine_name(i):
                return {
                    "ns": L.spine_ns(i),
                    "dev": f"t{p}r{r}",
                    "peer": (L.tor_ns(p, r), f"sp{i}"),
                    "restore": tb.spine_port_lines(i, p, r),
                    "side": "switch",
                    "link": _sorted_link(a, b),
                    "rnic": None,
                }
        else:
            raise ConfigError(f"{a} - {b} is not a link of the fabric (RNIC-ToR or ToR-spine)")
        raise ConfigError(f"'at' must be one end of {link!r}, got {at!r}")

    def _link_truth(
        self, fid: int, kind: str, port: dict[str, Any], types: tuple[int, int], **detail: Any
    ) -> FaultTruth:
        on_rnic = port["side"] == "rnic"
        return FaultTruth(
            fid,
            kind,
            "rnic" if on_rnic else "underlay",
            port["rnic"] if on_rnic else port["link"],
            types[1] if on_rnic else types[0],
            {"link": list(port["link"]), "ns": port["ns"], "dev": port["dev"], **detail},
        )

    def _set_up(self, undo: dict[str, Any]) -> None:
        """Bring a port back, re-apply what admin-down flushed, and wait until both ends have
        carrier: the kernel reports carrier through linkwatch, up to a second late, and a bridge
        port forwards only then."""
        nx.ip_batch([f"link set {undo['dev']} up"], undo["ns"])
        if undo["restore"]:
            nx.run(
                ["ip", "-n", undo["ns"], "-force", "-b", "-"],
                input="\n".join(undo["restore"]) + "\n",
                check=False,
            )
        ends = [(undo["ns"], undo["dev"]), tuple(undo["peer"])]
        deadline = time.monotonic() + 3.0
        while not all(_oper_up(ns, dev) for ns, dev in ends):
            if time.monotonic() > deadline:
                raise TestbedError(f"{undo['ns']}/{undo['dev']} did not come back up")
            time.sleep(0.02)

    # -- link down / flap ---------------------------------------------------------------------
    def _inject_link_down(self, fid: int, *, link: tuple[str, str], at: str | None = None):
        port = self._port(tuple(link), at)
        nx.ip_batch([f"link set {port['dev']} down"], port["ns"])
        return self._link_truth(fid, "link_down", port, (2, 7)), _set_up_undo(port)

    def _clear_link_down(self, undo: dict[str, Any]) -> None:
        self._set_up(undo)

    def _inject_link_flap(
        self,
        fid: int,
        *,
        link: tuple[str, str],
        at: str | None = None,
        down_s: float = 1.0,
        up_s: float = 1.0,
    ):
        port = self._port(tuple(link), at)
        argv = [
            "python",
            "-m",
            "skh.testbed.flap",
            "--dev",
            port["dev"],
            "--down-s",
            down_s,
            "--up-s",
            up_s,
        ]
        for line in port["restore"]:
            argv += ["--restore", line]
        rec = self.tb.spawn(argv, ns=port["ns"], role=f"fault{fid}-flap")
        wait_ready(rec)
        undo = {**_set_up_undo(port), "proc": rec.to_dict()}
        return self._link_truth(fid, "link_flap", port, (3, 8), down_s=down_s, up_s=up_s), undo

    def _clear_link_flap(self, undo: dict[str, Any]) -> None:
        self.tb.stop(ProcRecord.from_dict(undo["proc"]))
        self._set_up(undo)

    # -- loss ---------------------------------------------------------------------------------
    def _inject_loss(
        self,
        fid: int,
        *,
        link: tuple[str, str],
        at: str | None = None,
        percent: float = 10.0,
        direction: str = "in",
        min_len: int = 0,
        spare_ports: tuple[int, ...] | list[int] = (),
    ):
        if not 0 < float(percent) <= 100:
            raise ConfigError(
                f"The 'percent' parameter of loss must be in (0, 100]. Got {percent!r} instead."
            )
        if direction not in ("in", "out", "both"):
            raise ConfigError(
                "The 'direction' parameter of loss must be in, out or both."
                f" Got {direction!r} instead."
            )
        spare = sorted(set(spare_ports))
        if not all(isinstance(p, int) and 0 < p < 65536 for p in spare):
            raise ConfigError(
                "The 'spare_ports' parameter of loss must be ports in [1, 65535]."
                f" Got {spare_ports!r} instead."
            )
        port = self._port(tuple(link), at)
        per10k = round(float(percent) * 100)
        cond = f"meta length >= {int(min_len)} " if min_len else ""
        if per10k < 10000:
            cond += f"numgen random mod 10000 < {per10k} "
        conds = [cond]
        if spare:
            # outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14): the inner IPv4
            # header starts 50 bytes into the network header, its protocol at 59, the inner
            # UDP ports at 70 and 72
            vx = "meta protocol ip ip protocol udp udp dport 4789 @nh,472,8 17 "
            ports = ", ".join(map(str, spare))
            conds = [f"{vx}@nh,{70 * 8 + off},16 != {{ {ports} }} {cond}" for off in (0, 16)]
        table = f"{self.tb.prefix}_f{fid}"
        hooks = {"in": ["ingress"], "out": ["egress"], "both": ["ingress", "egress"]}[direction]
        chains = "".join(
            f'  chain {h} {{ type filter hook {h} device "{port["dev"]}" priority 0;\n'
            + "".join(f"    {c}counter drop\n" for c in conds)
            + "  }\n"
            for h in hooks
        )
        nx.nft_apply(f"table netdev {table} {{\n{chains}}}\n", port["ns"])
        undo = {"ns": port["ns"], "table": table}
        truth = self._link_truth(
            fid,
            "loss",
            port,
            (1, 1),
            percent=float(percent),
            direction=direction,
            min_len=int(min_len),
            spare_ports=spare,
            nft_table=table,
        )
        # loss at the RNIC end is still a lossy link (CRC-like), not an RNIC fault
        truth = dataclasses.replace(truth, layer="underlay", component=port["link"])
        return truth, undo

    def _clear_loss(self, undo: dict[str, Any]) -> None:
        nx.run(
            ["ip", "netns", "exec", undo["ns"], "nft", "delete", "table", "netdev", undo["table"]]
        )

    def _inject_switch_down(self, fid: int, *, switch: str):
        kind, idx = self._node(switch)
        if kind != "tor":
            raise ConfigError(
                f"switch_down takes a ToR (a spine has no bridge to silence), got {switch!r}"
            )
        ns = self.L.tor_ns(*idx)
        nx.ip_batch(["link set br0 down"], ns)
        # the gateway's connected route comes back with br0; the default route never left
        return FaultTruth(fid, "switch_down", "underlay", switch, 4, {"ns": ns}), {
            "ns": ns,
            "tor": list(idx),
        }

    def _clear_switch_down(self, undo: dict[str, Any]) -> None:
        p, r = undo["tor"]
        nx.ip_batch(["link set br0 up", *self.tb.tor_bridge_lines(p, r)], undo["ns"])

    # -- overlay ------------------------------------------------------------------------------
    def _rail(self, rail: Any) -> int:
        if not isinstance(rail, int) or not 0 <= rail < self.tb.spec.rnics_per_host:
            raise ConfigError(
                f"The 'rail' parameter must be an int in [0, {self.tb.spec.rnics_per_host})."
                f" Got {rail!r} instead."
            )
        return rail

    def _inject_fdb_blackhole(self, fid: int, *, host: str, peer: str, rail: int):
        g, g2, r = self.tb.host_index(host), self.tb.host_index(peer), self._rail(rail)
        if g == g2:
            raise ConfigError("fdb_blackhole needs two different hosts")
        nx.bridge_batch([self.tb.fdb_line(r, g2, "del")], self.L.host_ns(g))
        undo = {"ns": self.L.host_ns(g), "line": self.tb.fdb_line(r, g2, "append")}
        truth = FaultTruth(
            fid,
            "fdb_blackhole",
            "overlay",
            (self.L.vtep_name(g, r), self.L.vtep_name(g2, r)),
            int(FailureType.OVERLAY_BLACKHOLE),
            {
                "host": host,
                "peer": peer,
                "rail": r,
                "mac": self.L.vtep_mac(g2, r),
                "dst": self.L.rnic_ip(g2, r),
            },
        )
        return truth, undo

    def _clear_fdb_blackhole(self, undo: dict[str, Any]) -> None:
        nx.bridge_batch([undo["line"]], undo["ns"])

    def _inject_overlay_loop(self, fid: int, *, hosts: tuple[str, str], dst_host: str, rail: int):
        a, b = (self.tb.host_index(h) for h in hosts)
        c, r = self.tb.host_index(dst_host), self._rail(rail)
        if len({a, b, c}) != 3:
            raise ConfigError(
                "overlay_loop needs three different hosts (two looping, one destination)"
            )
        L = self.L
        net = f"172.{16 + r}.{c}.0/24"
        nx.ip_batch([f"route replace {net} via {L.vtep_ip(b, r)} dev vx{r} onlink"], L.host_ns(a))
        nx.ip_batch([f"route replace {net} via {L.vtep_ip(a, r)} dev vx{r} onlink"], L.host_ns(b))
        restore = f"route replace {net} via {L.vtep_ip(c, r)} dev vx{r} onlink"
        undo = {"nss": [L.host_ns(a), L.host_ns(b)], "line": restore}
        truth = FaultTruth(
            fid,
            "overlay_loop",
            "overlay",
            (L.vtep_name(a, r), L.vtep_name(b, r)),
            int(FailureType.OVERLAY_LOOP),
            {"hosts": list(hosts), "dst_host": dst_host, "rail": r, "prefix": net},
        )
        return truth, undo

    def _clear_overlay_loop(self, undo: dict[str, Any]) -> None:
        for ns in undo["nss"]:
            nx.ip_batch([undo["line"]], ns)

    # -- slow path ----------------------------------------------------------------------------
    def _inject_slow_path(
        self,
        fid: int,
        *,
        host: str,
        rail: int,
        delay_ms: float = 5.0,
        jitter_ms: float = 0.0,
        dst: str | None = None,
        src: str | None = None,
    ):
        """Delay frames leaving ``host``'s RNIC on ``rail``; with ``dst`` (a container) only the
        VXLAN frames to that container's VF, with ``src`` also only from that container."""
        g, r = self.tb.host_index(host), self._rail(rail)
        if not 0 <= float(jitter_ms) <= float(delay_ms):
            raise ConfigError(
                f"slow_path needs 0 <= jitter_ms <= delay_ms, got {jitter_ms!r} and {delay_ms!r}"
            )
        L = self.L
        ns, dev = L.host_ns(g), f"rnic{r}"
        match = "match u32 0 0"
        flow: dict[str, Any] = {}
        if dst is not None:
            d = self.tb.placement(dst)
            if d.host == g:
                raise ConfigError(
                    f"slow_path: {dst} runs on {host} itself; its traffic never leaves the RNIC"
                )
            # outer IPv4 header (20) + UDP (8) + VXLAN (8) + inner Ethernet (14): inner IPv4 at 50
            match = f"match ip dst {L.rnic_ip(d.host, r)}/32 " + _u16_ip_match(
                L.vf_ip(d.host, d.slot, r), 66
            )
            flow["dst"] = L.vf_ip(d.host, d.slot, r)
            if src is not None:
                sp = self.tb.placement(src)
                if sp.host != g:
                    raise ConfigError(f"slow_path: source {src} is not on {host}")
                match += " " + _u16_ip_match(L.vf_ip(sp.host, sp.slot, r), 62)
                flow["src"] = L.vf_ip(sp.host, sp.slot, r)
        vin, vout = f"dy{fid}i", f"dy{fid}o"
        nx.ip_batch(
            [
                f"link add {vin} mtu 9000 type veth peer name {vout} mtu 9000",
                f"link set {vin} up arp off",
                f"link set {vout} up arp off",
            ],
            ns,
        )
        # frames from a veth carry CHECKSUM_PARTIAL; without tx checksum offload on the redirect
        # target the kernel completes them before the relay copies them
        nx.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "ethtool",
                "-K",
                vin,
                "tx",
                "off",
                "tso",
                "off",
                "gso",
                "off",
            ],
            check=False,
        )
        nx.run(
            ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off"],
            check=False,
        )
        undo: dict[str, Any] = {"ns": ns, "dev": dev, "veth": vin, "pref": fid}
        try:
            rec = self.tb.spawn(
                [
                    "python",
                    "-m",
                    "skh.testbed.relay",
                    "--in",
                    vout,
                    "--out",
                    dev,
                    "--delay-ms",
                    delay_ms,
                    "--jitter-ms",
                    jitter_ms,
                ],
                ns=ns,
                role=f"fault{fid}-relay",
            )
            undo["proc"] = rec.to_dict()
            wait_ready(rec)
            nx.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "clsact"])
            nx.run(
                [
                    "tc",
                    "-n",
                    ns,
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "egress",
                    "pref",
                    str(fid),
                    "protocol",
                    "ip",
                    "u32",
                    *match.split(),
                    "action",
                    "mirred",
                    "egress",
                    "redirect",
                    "dev",
                    vin,
                ]
            )
        except BaseException:
            self._clear_slow_path(undo)
            raise
        truth = FaultTruth(
            fid,
            "slow_path",
            "rnic",
            L.rnic_key(g, r),
            15,
            {
                "host": host,
                "rail": r,
                "delay_ms": float(delay_ms),
                "jitter_ms": float(jitter_ms),
                "flow": flow,
                "ns": ns,
                "dev": dev,
            },
        )
        return truth, undo

    def _clear_slow_path(self, undo: dict[str, Any]) -> None:
        ns, dev = undo["ns"], undo["dev"]
        nx.run(
            ["tc", "-n", ns, "filter", "del", "dev", dev, "egress", "pref", str(undo["pref"])],
            check=False,
        )
        others = [
            f
            for f in self.tb.state().get("faults", ())
            if f["kind"] == "slow_path"
            and f["undo"]["ns"] == ns
            and f["undo"]["dev"] == dev
            and f["undo"]["pref"] != undo["pref"]
        ]
        if not others:
            nx.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "clsact"], check=False)
            nx.run(
                ["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "on", "gso", "on"],
                check=False,
            )
        if "proc" in undo:
            self.tb.stop(ProcRecord.from_dict(undo["proc"]))
        nx.ip_batch([f"link del {undo['veth']}"], ns, check=False)

    # -- endpoints ----------------------------------------------------------------------------
    def _inject_agent_crash(self, fid: int, *, pid: int, name: str | None = None):
        if not isinstance(pid, int) or pid <= 1:
            raise ConfigError(
                f"The 'pid' parameter of agent_crash must be a pid > 1. Got {pid!r} instead."
            )
        rec = self.tb.find_process(pid)
        if rec is not None and not rec.alive():
            rec = None
        if nx.proc_start_ticks(pid) is None:
            raise TestbedError(f"agent_crash: no process {pid}")
        _kill9(pid)
        undo = {"proc": rec.to_dict() if rec else None}
        truth = FaultTruth(
            fid,
            "agent_crash",
            "endpoint",
            name or (rec.role if rec and rec.role else f"pid{pid}"),
            int(FailureType.AGENT_CRASH),
            {"pid": pid, "ns": rec.ns if rec else None, "respawn": rec is not None},
        )
        return truth, undo

    def _clear_agent_crash(self, undo: dict[str, Any]) -> dict[str, Any]:
        if not undo["proc"]:
            return {}
        old = ProcRecord.from_dict(undo["proc"])
        new = self.tb.spawn(old.argv, ns=old.ns, role=old.role)
        return {"respawned_pid": new.pid}

    def _inject_agent_hang(self, fid: int, *, pid: int, name: str | None = None):
        if not isinstance(pid, int) or pid <= 1 or nx.proc_start_ticks(pid) is None:
            raise ConfigError(
                f"The 'pid' parameter of agent_hang must be a live pid > 1. Got {pid!r} instead."
            )
        rec = self.tb.find_process(pid)
        os.kill(pid, signal.SIGSTOP)
        undo = {"pid": pid, "start_ticks": nx.proc_start_ticks(pid)}
        truth = FaultTruth(
            fid,
            "agent_hang",
            "endpoint",
            name or (rec.role if rec and rec.role else f"pid{pid}"),
            # alive but answering nothing: what the host agent reports as a late agent
            int(FailureType.LATE_AGENT),
            {"pid": pid, "ns": rec.ns if rec else None},
        )
        return truth, undo

    def _clear_agent_hang(self, undo: dict[str, Any]) -> None:
        if nx.proc_start_ticks(undo["pid"]) == undo["start_ticks"]:
            os.kill(undo["pid"], signal.SIGCONT)

    def _inject_container_crash(self, fid: int, *, container: str):
        c = self.tb.placement(container)
        ns = self.L.container_ns(c.host, c.slot)
        inode = nx.netns_inode(ns)
        tracked = [p for p in self.tb.processes() if p.ns == ns and p.alive()]
        pids = nx.pids_in_netns({inode} if inode else set())
        for pid in pids:
            _kill9(pid)
        nx.ip_batch([f"link del vf{r}" for r in range(self.tb.spec.rnics_per_host)], ns)
        undo = {"container": container, "procs": [p.to_dict() for p in tracked]}
        truth = FaultTruth(
            fid,
            "container_crash",
            "endpoint",
            container,
            17,
            {"ns": ns, "host": self.L.host_name(c.host), "killed": pids},
        )
        return truth, undo

    def _clear_container_crash(self, undo: dict[str, Any]) -> dict[str, Any]:
        c = self.tb.placement(undo["container"])
        nx.ip_batch(self.tb.vf_link_lines(c))
        nx.ip_batch(self.tb.vf_lines(c), self.L.container_ns(c.host, c.slot))
        nx.ip_batch(self.tb.representor_lines(c), self.L.host_ns(c.host))
        respawned = []
        for d in undo["procs"]:
            old = ProcRecord.from_dict(d)
            respawned.append(self.tb.spawn(old.argv, ns=old.ns, role=old.role).pid)
        return {"respawned_pids": respawned}


def _oper_up(ns: str, dev: str) -> bool:
    with nx.in_netns(ns):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            return oper_up(sock, dev)


def _set_up_undo(port: dict[str, Any]) -> dict[str, Any]:
    """What :meth:`Faults._set_up` needs to bring ``port`` back."""
    return {k: port[k] for k in ("ns", "dev", "peer", "restore")}


def _kill9(pid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL (a crash, not a stop: no handler runs) and wait until the pid is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if nx.proc_start_ticks(pid) is None:
            return
        time.sleep(0.01)


def _u16_ip_match(ip: str, offset: int) -> str:
    """u32 selectors for an IPv4 address at a 2-aligned (not 4-aligned) offset from the outer
    IP header: two 16-bit matches (u32 keys must be aligned to their size)."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return (
        f"match u16 0x{a:02x}{b:02x} 0xffff at {offset} "
        f"match u16 0x{c:02x}{d:02x} 0xffff at {offset + 2}"
    )
