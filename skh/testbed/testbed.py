"""Build, describe and tear down the namespace testbed; spawn and track processes inside it.

A :class:`Testbed` is a spec plus a prefix plus a state directory. ``up()`` first removes what a
crashed earlier run with the same prefix left behind (processes living in its namespaces,
namespaces, root-namespace links, nft tables), then builds everything with a handful of
iproute2 batches and writes ``state.json``. ``down()`` removes everything and verifies it is gone.
:meth:`Testbed.load` reopens a running testbed from its state file (what ``skh testbed`` does
between invocations).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import skh
from skh.errors import TestbedError
from skh.model import Cluster, Container, Endpoint, Fabric, Host, Job, Rnic, Switch
from skh.testbed import netns as nx
from skh.testbed.spec import (
    DEFAULT_PREFIX,
    MTU,
    OVERLAY_MTU,
    Layout,
    Placement,
    TestbedSpec,
    owns,
    preferred_mgmt_octet,
)
from skh.testbed.traffic import TrafficConfig, plan_document, plan_job

__all__ = [
    "Testbed",
    "ProcRecord",
    "default_state_dir",
    "cleanup_stale",
    "choose_mgmt_octet",
    "mgmt_octets_in_use",
]

log = logging.getLogger(__name__)

STATE_ROOT = Path("/run/skh-testbed")
#: environment variable naming the prefix of the testbed that spawned a process (and its children)
OWNER_ENV = "SKH_TESTBED_OWNER"
_GC_THRESH = (
    "net.ipv4.neigh.default.gc_thresh1",
    "net.ipv4.neigh.default.gc_thresh2",
    "net.ipv4.neigh.default.gc_thresh3",
)
#: the ARP table limit is global (summed over all namespaces); raised while a testbed is up
_GC_WANT = (8192, 32768, 65536)

_ROUTER_SYSCTLS = {
    "net.ipv4.ip_forward": 1,
    "net.ipv4.icmp_ratelimit": 0,
    "net.ipv4.icmp_msgs_per_sec": 100000,
    "net.ipv4.icmp_msgs_burst": 100000,
    # ECMP hashes the 5-tuple on the wire, as a switch does: source and destination address,
    # protocol, ports (fields 0x37), so different UDP source ports take different spines (what
    # flow-pinned probes rely on). Not policy 1: it reuses a hash the skb already carries, and a
    # VXLAN frame carries its *inner* flow's (the VTEP computed it for the outer source port, and
    # veth keeps it across namespaces), so frames went where no trace of their outer header went
    "net.ipv4.fib_multipath_hash_fields": 0x37,
    "net.ipv4.fib_multipath_hash_policy": 3,
    # a time-exceeded reply names the ingress interface, i.e. the probe's own path under ECMP
    "net.ipv4.icmp_errors_use_inbound_ifaddr": 1,
    "net.ipv4.conf.all.rp_filter": 0,
    "net.ipv4.conf.default.rp_filter": 0,
}
_SWITCH_SYSCTLS = {
    **_ROUTER_SYSCTLS,
    # a switch drops an ECMP member whose port lost carrier at once (hardware does), instead of
    # hashing part of its flows into a dead link until routing converges
    "net.ipv4.conf.all.ignore_routes_with_linkdown": 1,
    "net.ipv4.conf.default.ignore_routes_with_linkdown": 1,
}
_QUIET_SYSCTLS = {
    # no IPv6 router solicitations / DAD packets polluting the byte counters
    "net.ipv6.conf.all.disable_ipv6": 1,
    "net.ipv6.conf.default.disable_ipv6": 1,
}
_HOST_SYSCTLS = {
    **_ROUTER_SYSCTLS,
    "net.ipv4.conf.all.arp_ignore": 1,
    "net.ipv4.conf.all.arp_announce": 2,
}
_CONTAINER_SYSCTLS = {
    # a dead agent must answer port-unreachable to every probe, not one per second
    "net.ipv4.icmp_ratelimit": 0,
    "net.ipv4.icmp_msgs_per_sec": 100000,
    "net.ipv4.icmp_msgs_burst": 100000,
}


def default_state_dir(prefix: str = DEFAULT_PREFIX) -> Path:
    return STATE_ROOT / prefix


#: held while a testbed chooses its management /16 and builds (testbeds of other prefixes
#: coming up at the same moment must not both take the same free one)
MGMT_LOCK = Path("/run/lock/skh-testbed-mgmt.lock")


def mgmt_octets_in_use() -> set[int]:
    """Second octets of the 10.x.0.0/16 networks that a root-namespace address or route already
    reaches into (a route as wide as the /16 or wider loses to our connected route and does not
    count)."""
    used: set[int] = set()
    nets: list[str] = []
    addrs = nx.run(["ip", "-j", "-4", "addr", "show"], check=False).stdout or "[]"
    for link in json.loads(addrs):
        nets += [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", ())]
    routes = nx.run(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout
    nets += [r["dst"] for r in json.loads(routes or "[]") if r.get("dst", "default") != "default"]
    for text in nets:
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(text, strict=False)
            if net.prefixlen >= 16 and net.network_address in ipaddress.ip_network("10.0.0.0/8"):
                used.add(net.network_address.packed[1])
    return used


def choose_mgmt_octet(prefix: str, used: set[int]) -> int:
    """The prefix's preferred management octet, or the next free one of 200-250 after it."""
    first = preferred_mgmt_octet(prefix)
    span = list(range(200, 251))
    start = span.index(first)
    for octet in span[start:] + span[:start]:
        if octet not in used:
            return octet
    raise TestbedError(
        "no free management subnet: 10.200.0.0/16 to 10.250.0.0/16 are all in use in the root"
        " namespace (other testbeds up?)"
    )


@dataclass(frozen=True, slots=True)
class ProcRecord:
    """A process the testbed started (and will stop)."""

    pid: int
    start_ticks: int
    ns: str | None
    argv: tuple[str, ...]
    role: str
    log: str

    def alive(self) -> bool:
        return nx.proc_start_ticks(self.pid) == self.start_ticks

    def to_dict(self) -> dict:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ProcRecord:
        return cls(d["pid"], d["start_ticks"], d["ns"], tuple(d["argv"]), d["role"], d["log"])


def _python_env() -> dict[str, str]:
    """Environment for ``python -m skh...`` children: find this very skh package."""
    env = dict(os.environ)
    root = str(Path(skh.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _namespaces(prefix: str) -> list[str]:
    return [n for n in nx.list_netns(prefix) if owns(prefix, n)]


def _root_links(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if owns(prefix, n))


def _root_nft_tables(prefix: str) -> list[tuple[str, str]]:
    if not shutil.which("nft"):
        return []
    res = nx.run(["nft", "list", "tables"], check=False)
    out = []
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table" and owns(prefix, parts[2]):
            out.append((parts[1], parts[2]))
    return out


def cleanup_stale(prefix: str = DEFAULT_PREFIX, state_dir: Path | None = None) -> dict[str, int]:
    """Remove everything carrying ``prefix``: processes recorded in the state file or living in
    its namespaces, the namespaces, root-namespace links and nft tables. Returns counts."""
    state_dir = Path(state_dir) if state_dir else default_state_dir(prefix)
    counts = {"processes": 0, "namespaces": 0, "links": 0, "nft_tables": 0}
    state = _load_state_file(state_dir)
    recorded = [ProcRecord.from_dict(p) for p in (state or {}).get("processes", ())]
    pids = [p.pid for p in recorded if p.alive()]
    names = _namespaces(prefix)
    inodes = {i for i in (nx.netns_inode(n) for n in names) if i is not None}
    pids += nx.pids_in_netns(inodes)
    pids = sorted(set(pids))
    if pids:
        nx.terminate(pids)
        counts["processes"] = len(pids)
    if names:
        nx.ip_batch((f"netns del {n}" for n in names), check=False)
        # a namespace whose mount point is half gone still fails "netns del"; retry one by one
        for n in _namespaces(prefix):
            nx.run(["ip", "netns", "del", n], check=False)
        counts["namespaces"] = len(names)
    for fam, name in _root_nft_tables(prefix):
        nx.run(["nft", "delete", "table", fam, name], check=False)
        counts["nft_tables"] += 1
    links = _root_links(prefix)
    for link in links:
        nx.run(["ip", "link", "del", link], check=False)
    counts["links"] = len(links)
    if state and state.get("gc_thresh_orig"):
        _restore_gc_thresh(state["gc_thresh_orig"])
    _wait_gone(prefix)
    # only what the testbed itself writes: a --state-dir may hold other files
    for name in ("state.json", "state.tmp", "lock"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    for sub in ("logs", "traffic", "gloo"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    with contextlib.suppress(OSError):
        state_dir.rmdir()
        if state_dir.parent == STATE_ROOT:
            STATE_ROOT.rmdir()
    return counts


def _wait_gone(prefix: str, timeout_s: float = 10.0) -> None:
    """Namespace teardown is asynchronous in the kernel: wait until the root links are gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _root_links(prefix) and not _namespaces(prefix):
            return
        time.sleep(0.05)
    raise TestbedError(
        f"testbed {prefix!r} teardown left {_namespaces(prefix)}"
        f" namespaces and {_root_links(prefix)} links"
    )


def _read_gc_thresh() -> list[int]:
    return [int(Path("/proc/sys/" + k.replace(".", "/")).read_text()) for k in _GC_THRESH]


def _restore_gc_thresh(orig: Sequence[int]) -> None:
    # only if nobody changed them since we raised them
    if _read_gc_thresh() == [max(o, w) for o, w in zip(orig, _GC_WANT, strict=True)]:
        nx.write_sysctls(None, dict(zip(_GC_THRESH, orig, strict=True)))


def wait_ready(rec: ProcRecord, timeout_s: float = 10.0) -> None:
    """Wait for a helper process to print ``ready`` on its log (its sockets are open)."""
    deadline = time.monotonic() + timeout_s
    path = Path(rec.log)
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if b"ready" in path.read_bytes():
                return
        if not rec.alive():
            break
        time.sleep(0.01)
    tail = path.read_text(errors="replace")[-500:] if path.exists() else ""
    raise TestbedError(f"{rec.role} (pid {rec.pid}) did not become ready: {tail}")


def _load_state_file(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "state.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("unreadable testbed state %s: %s", state_dir, exc)
        return None


class Testbed:
    """The emulated cluster of one spec under one prefix (see :mod:`skh.testbed.spec` for names)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(
        self,
        spec: TestbedSpec,
        *,
        prefix: str = DEFAULT_PREFIX,
        state_dir: str | Path | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        self.layout = Layout(spec, prefix)
        self.spec = spec
        self.prefix = prefix
        self.state_dir = Path(state_dir) if state_dir else default_state_dir(prefix)
        #: where spawned processes write their output; None: the state directory's ``logs/``,
        #: which ``down`` removes (a kept directory is what one sends when a run fails)
        self.log_dir = Path(log_dir) if log_dir else None

    @classmethod
    def load(cls, prefix: str = DEFAULT_PREFIX, state_dir: str | Path | None = None) -> Testbed:
        """Reopen the running testbed of ``prefix`` from its state file."""
        sd = Path(state_dir) if state_dir else default_state_dir(prefix)
        state = _load_state_file(sd)
        if state is None:
            raise TestbedError(f"no testbed is up under prefix {prefix!r} (no {sd / 'state.json'})")
        tb = cls(TestbedSpec.from_dict(state["spec"]), prefix=state["prefix"], state_dir=sd)
        tb.layout.mgmt_octet = int(state["mgmt"]["root_ip"].split(".")[1])
        return tb

    # -- state --------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.state_dir / "state.json"

    @contextlib.contextmanager
    def transact(self) -> Iterator[dict]:
        """Read-modify-write the state file under an exclusive lock."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            state = _load_state_file(self.state_dir)
            if state is None:
                raise TestbedError(f"testbed {self.prefix!r} is not up")
            yield state
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1))
            os.replace(tmp, self.state_path)

    def state(self) -> dict:
        state = _load_state_file(self.state_dir)
        if state is None:
            raise TestbedError(f"testbed {self.prefix!r} is not up")
        return state

    # -- up / down ----------------------------------------------------------------------------
    def up(self) -> dict[str, float]:
        """Build the testbed (after removing stale leftovers). Returns phase timings in seconds."""
        if os.geteuid() != 0:
            raise TestbedError("the namespace testbed needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        t0 = time.monotonic()
        stale = cleanup_stale(self.prefix, self.state_dir)
        if any(stale.values()):
            log.warning("removed stale testbed objects of prefix %s: %s", self.prefix, stale)
        t1 = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        MGMT_LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(MGMT_LOCK, "a") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            # two root devices on one /16 route it to the older one: this testbed's agents
            # would never reach its controller ("0 of 4 host agents registered")
            self.layout.mgmt_octet = choose_mgmt_octet(self.prefix, mgmt_octets_in_use())
            if self.layout.mgmt_octet != preferred_mgmt_octet(self.prefix):
                log.warning(
                    "testbed %s: management subnet 10.%d.0.0/16 is taken, using %s",
                    self.prefix,
                    preferred_mgmt_octet(self.prefix),
                    self.layout.mgmt_net(),
                )
            orig = _read_gc_thresh()
            state = self._describe()
            state["gc_thresh_orig"] = orig
            state["processes"] = []
            state["faults"] = []
            state["next_fault"] = 1
            # written first so that a failed build is still cleaned up by down() / the next up()
            self.state_path.write_text(json.dumps(state, indent=1))
            try:
                nx.write_sysctls(
                    None,
                    {k: max(o, w) for k, o, w in zip(_GC_THRESH, orig, _GC_WANT, strict=True)},
                )
                self._build()
            except BaseException:
                with contextlib.suppress(Exception):
                    cleanup_stale(self.prefix, self.state_dir)
                raise
        t2 = time.monotonic()
        log.info(
            "testbed %s up: %d namespaces in %.2f s",
            self.prefix,
            len(self.layout.all_namespaces()),
            t2 - t1,
        )
        return {"cleanup_s": t1 - t0, "build_s": t2 - t1}

    def down(self) -> dict[str, int]:
        """Stop every process, delete every namespace and link of this prefix; verify."""
        return cleanup_stale(self.prefix, self.state_dir)

    def _build(self) -> None:
        L, s = self.layout, self.spec
        nss = L.all_namespaces()
        root = [f"netns add {n}" for n in nss]
        root += self._link_lines()
        nx.ip_batch(root)
        for g in range(s.hosts):
            nx.write_sysctls(L.host_ns(g), {**_HOST_SYSCTLS, **_QUIET_SYSCTLS})
        for p, r in L.tors():
            nx.write_sysctls(L.tor_ns(p, r), {**_SWITCH_SYSCTLS, **_QUIET_SYSCTLS})
        for i in range(s.spines):
            nx.write_sysctls(L.spine_ns(i), {**_SWITCH_SYSCTLS, **_QUIET_SYSCTLS})
        for c in L.placements:
            nx.write_sysctls(
                L.container_ns(c.host, c.slot), {**_CONTAINER_SYSCTLS, **_QUIET_SYSCTLS}
            )
        nx.write_sysctls(L.mgmt_ns, _QUIET_SYSCTLS)
        nx.write_sysctls(None, {f"net.ipv6.conf.{L.mgmt_root_dev}.disable_ipv6": 1})
        jobs: list[tuple[list[str], str, str]] = []  # (lines, ns, tool)
        for i in range(s.spines):
            jobs.append((self._spine_lines(i), L.spine_ns(i), "ip"))
        for p, r in L.tors():
            jobs.append((self._tor_lines(p, r), L.tor_ns(p, r), "ip"))
        for g in range(s.hosts):
            jobs.append((self._host_lines(g), L.host_ns(g), "ip"))
            fdb = self._fdb_lines(g)
            if fdb:
                jobs.append((fdb, L.host_ns(g), "bridge"))
        for c in L.placements:
            jobs.append((self._container_lines(c), L.container_ns(c.host, c.slot), "ip"))
        jobs.append((self._mgmt_lines(), L.mgmt_ns, "ip"))
        # fdb batches need the vxlan devices of their host batch: run hosts' ip batches first
        self._run_parallel([j for j in jobs if j[2] == "ip"])
        self._run_parallel([j for j in jobs if j[2] == "bridge"])
        nx.ip_batch(
            [
                f"addr add {L.mgmt_root_ip()}/16 dev {L.mgmt_root_dev}",
                f"link set {L.mgmt_root_dev} up",
            ]
        )

    @staticmethod
    def _run_parallel(jobs: list[tuple[list[str], str, str]], width: int = 8) -> None:
        pending = list(jobs)
        running: list[tuple[subprocess.Popen, str, str]] = []
        errors = []
        while pending or running:
            while pending and len(running) < width:
                lines, ns, tool = pending.pop(0)
                text = "\n".join(lines) + "\n"
                proc = subprocess.Popen(
                    [tool, "-n", ns, "-b", "-"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                running.append((proc, ns, text))
            proc, ns, text = running.pop(0)
            _, err = proc.communicate(text, timeout=60)
            if proc.returncode != 0:
                errors.append(f"{ns}: {err.strip()}")
        if errors:
            raise TestbedError("testbed build failed: " + "; ".join(errors))

    # -- batch lines --------------------------------------------------------------------------
    def _link_lines(self) -> list[str]:
        L, s = self.layout, self.spec
        out = []
        for p, r in L.tors():
            for i in range(s.spines):
                out.append(
                    f"link add sp{i} netns {L.tor_ns(p, r)} "
                    f"address {L.uplink_mac(i, p, r, True)} mtu {MTU} "
                    f"type veth peer name t{p}r{r} netns {L.spine_ns(i)} "
                    f"address {L.uplink_mac(i, p, r, False)} mtu {MTU}"
                )
        for g in range(s.hosts):
            p = L.segment(g)
            for r in range(s.rnics_per_host):
                out.append(
                    f"link add rnic{r} netns {L.host_ns(g)} address {L.rnic_mac(g, r)} mtu {MTU} "
                    f"type veth peer name h{g} netns {L.tor_ns(p, r)} mtu {MTU}"
                )
            out.append(
                f"link add mgmt0 netns {L.host_ns(g)} type veth peer name h{g} netns {L.mgmt_ns}"
            )
        for c in L.placements:
            out += self.vf_link_lines(c)
            out.append(
                f"link add mgmt0 netns {L.container_ns(c.host, c.slot)} type veth peer name "
                f"{c.name} netns {L.mgmt_ns}"
            )
        out.append(f"link add {L.mgmt_root_dev} type veth peer name uplink netns {L.mgmt_ns}")
        return out

    def vf_link_lines(self, c: Placement) -> list[str]:
        """Root-namespace ``ip -b`` lines creating the VFs of container ``c``."""
        L = self.layout
        return [
            f"link add vf{r} netns {L.container_ns(c.host, c.slot)} "
            f"address {L.vf_mac(c.host, c.slot, r)} mtu {OVERLAY_MTU} "
            f"type veth peer name c{c.slot}v{r} netns {L.host_ns(c.host)} "
            f"address {L.GW_MAC} mtu {OVERLAY_MTU}"
            for r in range(self.spec.rnics_per_host)
        ]

    # Port state: what an admin-down port loses (its routes and, since the kernel flushes them
    # too, its permanent neighbours) and what recovery therefore re-applies. Every underlay
    # neighbour is permanent, as a controller that knows the cabling would program it: no ARP
    # traffic in the counters, no resolution delay after a repaired link, and no pressure on the
    # kernel's global neighbour-table limit.
    def spine_port_lines(self, i: int, p: int, r: int) -> list[str]:
        L, dev = self.layout, f"t{p}r{r}"
        tor_ip = L.uplink_ip(i, p, r, True)
        return [
            f"neigh replace {tor_ip} lladdr {L.uplink_mac(i, p, r, True)} dev {dev} nud permanent",
            f"route replace 10.{r}.{p}.0/24 via {tor_ip} dev {dev}",
        ]

    def tor_uplink_lines(self, i: int, p: int, r: int) -> list[str]:
        L = self.layout
        hops = " ".join(
            f"nexthop via {L.uplink_ip(k, p, r, False)} dev sp{k}" for k in range(self.spec.spines)
        )
        return [
            f"neigh replace {L.uplink_ip(i, p, r, False)} lladdr {L.uplink_mac(i, p, r, False)} "
            f"dev sp{i} nud permanent",
            f"route replace default {hops}",
        ]

    def tor_bridge_lines(self, p: int, r: int) -> list[str]:
        L = self.layout
        return [
            f"neigh replace {L.rnic_ip(g, r)} lladdr {L.rnic_mac(g, r)} dev br0 nud permanent"
            for g in L.hosts_in_segment(p)
        ]

    def rnic_port_lines(self, g: int, r: int) -> list[str]:
        """Routes and neighbours of RNIC ``r`` of host ``g``, including the overlay routes over
        its VTEP."""
        L = self.layout
        p, ip, dev = L.segment(g), L.rnic_ip(g, r), f"rnic{r}"
        out = [f"neigh replace {L.tor_gw(p, r)} lladdr {L.tor_mac(p, r)} dev {dev} nud permanent"]
        for g2 in L.hosts_in_segment(p):
            if g2 != g:
                out.append(
                    f"neigh replace {L.rnic_ip(g2, r)} lladdr {L.rnic_mac(g2, r)} "
                    f"dev {dev} nud permanent"
                )
        out += [
            f"route replace 10.{r}.{p}.0/24 dev {dev} src {ip} table {100 + r}",
            f"route replace default via {L.tor_gw(p, r)} dev {dev} table {100 + r}",
        ]
        if r == 0:
            out.append(f"route replace 10.0.0.0/8 via {L.tor_gw(p, 0)} dev rnic0")
        return out

    def overlay_route_lines(self, g: int, r: int) -> list[str]:
        L = self.layout
        return [
            f"route replace {L.vtep_ip(g2, r)}/24 via {L.vtep_ip(g2, r)} dev vx{r} onlink"
            for g2 in range(self.spec.hosts)
            if g2 != g
        ]

    def _spine_lines(self, i: int) -> list[str]:
        L = self.layout
        out = ["link set lo up"]
        for p, r in L.tors():
            dev = f"t{p}r{r}"
            out += [f"addr add {L.uplink_ip(i, p, r, False)}/31 dev {dev}", f"link set {dev} up"]
            out += self.spine_port_lines(i, p, r)
        return out

    def _tor_lines(self, p: int, r: int) -> list[str]:
        L = self.layout
        out = [
            "link set lo up",
            f"link add br0 address {L.tor_mac(p, r)} mtu {MTU} type bridge stp_state 0 "
            "forward_delay 0 mcast_snooping 0",
            f"addr add {L.tor_gw(p, r)}/24 dev br0",
            "link set br0 up",
        ]
        for g in L.hosts_in_segment(p):
            out += [f"link set h{g} master br0", f"link set h{g} up"]
        out += self.tor_bridge_lines(p, r)
        for i in range(self.spec.spines):
            out += [f"addr add {L.uplink_ip(i, p, r, True)}/31 dev sp{i}", f"link set sp{i} up"]
        for i in range(self.spec.spines):
            out += self.tor_uplink_lines(i, p, r)
        return out

    def _host_lines(self, g: int) -> list[str]:
        L, s = self.layout, self.spec
        out = ["link set lo up", f"addr add {L.mgmt_host_ip(g)}/16 dev mgmt0", "link set mgmt0 up"]
        out.append("rule add to 172.16.0.0/12 lookup main pref 500")
        for r in range(s.rnics_per_host):
            ip = L.rnic_ip(g, r)
            out += [
                f"addr add {ip}/24 dev rnic{r}",
                f"link set rnic{r} up",
                f"rule add from {ip} lookup {100 + r} pref {1000 + r}",
            ]
            out += self.rnic_port_lines(g, r)
        for r in range(s.rnics_per_host):
            out += [
                f"link add vx{r} address {L.vtep_mac(g, r)} mtu {OVERLAY_MTU} "
                f"type vxlan id {1000 + r} "
                f"local {L.rnic_ip(g, r)} dev rnic{r} dstport 4789 nolearning",
                f"addr add {L.vtep_ip(g, r)}/32 dev vx{r}",
                f"link set vx{r} up",
            ]
            for g2 in range(s.hosts):
                if g2 != g:
                    out.append(
                        f"neigh add {L.vtep_ip(g2, r)} lladdr {L.vtep_mac(g2, r)} "
                        f"dev vx{r} nud permanent"
                    )
            out += self.overlay_route_lines(g, r)
        for c in L.placements:
            if c.host == g:
                out += self.representor_lines(c)
        return out

    def representor_lines(self, c: Placement) -> list[str]:
        L = self.layout
        out = []
        for r in range(self.spec.rnics_per_host):
            rep, ip = f"c{c.slot}v{r}", L.vf_ip(c.host, c.slot, r)
            out += [
                f"link set {rep} up",
                f"route add {ip}/32 dev {rep}",
                f"neigh add {ip} lladdr {L.vf_mac(c.host, c.slot, r)} dev {rep} nud permanent",
            ]
        return out

    def fdb_line(self, r: int, g2: int, op: str = "append") -> str:
        """The ``bridge`` line mapping host ``g2``'s rail-``r`` VTEP MAC (for any other host)."""
        L = self.layout
        return f"fdb {op} {L.vtep_mac(g2, r)} dev vx{r} dst {L.rnic_ip(g2, r)}"

    def _fdb_lines(self, g: int) -> list[str]:
        s = self.spec
        return [
            self.fdb_line(r, g2)
            for r in range(s.rnics_per_host)
            for g2 in range(s.hosts)
            if g2 != g
        ]

    def vf_lines(self, c: Placement) -> list[str]:
        """Container-namespace lines configuring the VFs of container ``c``."""
        L = self.layout
        out = []
        for r in range(self.spec.rnics_per_host):
            out += [
                f"addr add {L.vf_ip(c.host, c.slot, r)}/32 dev vf{r}",
                f"link set vf{r} up",
                f"neigh add {L.GW_IP} lladdr {L.GW_MAC} dev vf{r} nud permanent",
                f"route add 172.{16 + r}.0.0/16 via {L.GW_IP} dev vf{r} onlink",
            ]
        return out

    def _container_lines(self, c: Placement) -> list[str]:
        L = self.layout
        return [
            "link set lo up",
            f"addr add {L.mgmt_container_ip(c.host, c.slot)}/16 dev mgmt0",
            "link set mgmt0 up",
            *self.vf_lines(c),
        ]

    def _mgmt_lines(self) -> list[str]:
        L = self.layout
        out = [
            "link set lo up",
            "link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0",
            "link set br0 up",
        ]
        ports = (
            [f"h{g}" for g in range(self.spec.hosts)] + [c.name for c in L.placements] + ["uplink"]
        )
        for port in ports:
            out += [f"link set {port} master br0", f"link set {port} up"]
        return out

    # -- description --------------------------------------------------------------------------
    def _describe(self) -> dict[str, Any]:
        L, s = self.layout, self.spec
        R = s.rnics_per_host
        hosts = {}
        for g in range(s.hosts):
            hosts[L.host_name(g)] = {
                "ns": L.host_ns(g),
                "segment": L.segment(g),
                "mgmt_ip": L.mgmt_host_ip(g),
                "rnics": [
                    {
                        "rail": r,
                        "dev": f"rnic{r}",
                        "ip": L.rnic_ip(g, r),
                        "tor": L.tor_name(L.segment(g), r),
                        "tor_port": f"h{g}",
                        "vtep": f"vx{r}",
                        "vtep_ip": L.vtep_ip(g, r),
                        "vtep_mac": L.vtep_mac(g, r),
                    }
                    for r in range(R)
                ],
            }
        switches = {}
        for p, r in L.tors():
            switches[L.tor_name(p, r)] = {
                "ns": L.tor_ns(p, r),
                "tier": "tor",
                "segment": p,
                "rail": r,
                "gateway": L.tor_gw(p, r),
            }
        for i in range(s.spines):
            switches[L.spine_name(i)] = {"ns": L.spine_ns(i), "tier": "spine"}
        containers = {}
        for c in L.placements:
            containers[c.name] = {
                "ns": L.container_ns(c.host, c.slot),
                "host": L.host_name(c.host),
                "job": c.job,
                "index": c.index,
                "mgmt_ip": L.mgmt_container_ip(c.host, c.slot),
                "vfs": [
                    {
                        "rail": r,
                        "dev": f"vf{r}",
                        "ip": L.vf_ip(c.host, c.slot, r),
                        "mac": L.vf_mac(c.host, c.slot, r),
                        "representor": f"c{c.slot}v{r}",
                    }
                    for r in range(R)
                ],
            }
        return {
            "version": 1,
            "prefix": self.prefix,
            "created_ns": time.time_ns(),
            "spec": s.to_dict(),
            "namespaces": L.all_namespaces(),
            "mgmt": {
                "ns": L.mgmt_ns,
                "root_dev": L.mgmt_root_dev,
                "root_ip": L.mgmt_root_ip(),
                "net": L.mgmt_net(),
            },
            "hosts": hosts,
            "switches": switches,
            "containers": containers,
            "ip_owners": self.ip_owners(),
            # the model, loadable without this package: Fabric.from_mapping(state["fabric"])
            "fabric": self.fabric().to_mapping(),
            "endpoints": [
                {
                    "ep_id": e.ep_id,
                    "name": e.name,
                    "job": e.job,
                    "container": e.container,
                    "host": e.host,
                    "rail": e.rail,
                    "ip": e.ip,
                    "netdev": e.netdev,
                    "ns": self.endpoint_ns(e),
                    "representor": list(self.representor(e)),
                }
                for e in self.cluster().endpoints
            ],
        }

    def ip_owners(self) -> dict[str, str]:
        """Every underlay/overlay address → the model node that owns it (what a traceroute hop
        means): ToR gateways and uplinks → ``tor<p>r<r>``, spine ports → ``spine<s>``, RNICs →
        ``host<g>:rnic<r>``, VTEPs → ``host<g>:vx<r>``, VFs → ``c<g>x<k>``."""
        L, s = self.layout, self.spec
        out: dict[str, str] = {}
        for p, r in L.tors():
            out[L.tor_gw(p, r)] = L.tor_name(p, r)
            for i in range(s.spines):
                out[L.uplink_ip(i, p, r, True)] = L.tor_name(p, r)
                out[L.uplink_ip(i, p, r, False)] = L.spine_name(i)
        for g in range(s.hosts):
            for r in range(s.rnics_per_host):
                out[L.rnic_ip(g, r)] = L.rnic_key(g, r)
                out[L.vtep_ip(g, r)] = L.vtep_name(g, r)
        for c in L.placements:
            for r in range(s.rnics_per_host):
                out[L.vf_ip(c.host, c.slot, r)] = c.name
        return out

    # -- the model ----------------------------------------------------------------------------
    def fabric(self) -> Fabric:
        L, s = self.layout, self.spec
        spines = tuple(L.spine_name(i) for i in range(s.spines))
        switches = {n: Switch(n, "spine") for n in spines}
        for p, r in L.tors():
            switches[L.tor_name(p, r)] = Switch(L.tor_name(p, r), "tor", spines, rail=r, segment=p)
        hosts = {}
        for g in range(s.hosts):
            p = L.segment(g)
            rnics = tuple(
                Rnic(
                    L.host_name(g),
                    r,
                    L.tor_name(p, r),
                    name=f"rnic{r}",
                    netdev=f"rnic{r}",
                    ip=L.rnic_ip(g, r),
                )
                for r in range(s.rnics_per_host)
            )
            hosts[L.host_name(g)] = Host(L.host_name(g), p, rnics)
        return Fabric(hosts, switches)

    def cluster(self) -> Cluster:
        """The fabric plus every job, container and endpoint, with dense endpoint ids in job,
        container, rail order (the ids :meth:`counter_source` keys its rows by)."""
        L, s = self.layout, self.spec
        cluster = Cluster(self.fabric())
        rails = tuple(range(s.rnics_per_host))
        for job in s.effective_jobs():
            placed = [c for c in L.placements if c.job == job.name]
            containers = tuple(
                Container(c.name, job.name, L.host_name(c.host), rails) for c in placed
            )
            cluster.jobs[job.name] = Job(job.name, job.shape, containers)
            for c in placed:
                for r in rails:
                    cluster.add_endpoint(
                        job=job.name,
                        container=c.name,
                        host=L.host_name(c.host),
                        rail=r,
                        ip=L.vf_ip(c.host, c.slot, r),
                        netdev=f"vf{r}",
                    )
        return cluster

    def placement(self, container: str) -> Placement:
        c = self.layout.by_container.get(container)
        if c is not None:
            return c
        raise TestbedError(
            f"unknown container {container!r}; have {[c.name for c in self.layout.placements]}"
        )

    def container_ns(self, container: str) -> str:
        c = self.placement(container)
        return self.layout.container_ns(c.host, c.slot)

    def host_index(self, host: str) -> int:
        if host.startswith("host") and host[4:].isdigit() and int(host[4:]) < self.spec.hosts:
            return int(host[4:])
        raise TestbedError(f"unknown host {host!r}")

    def endpoint_ns(self, ep: Endpoint) -> str:
        return self.container_ns(ep.container)

    def representor(self, ep: Endpoint) -> tuple[str, str]:
        """(host namespace, device) of the host-side representor of endpoint ``ep``'s VF."""
        c = self.placement(ep.container)
        return self.layout.host_ns(c.host), f"c{c.slot}v{ep.rail}"

    def counter_source(self, host: str | None = None, *, cluster: Cluster | None = None):
        """A 1 Hz counter source over the representors of every endpoint (or of one host's)."""
        from skh.testbed.counters import CounterEntry, NetnsCounters

        cluster = cluster or self.cluster()
        entries = []
        for ep in cluster.endpoints:
            if host is not None and ep.host != host:
                continue
            ns, dev = self.representor(ep)
            entries.append(CounterEntry(ep.ep_id, ns, dev, swap=True))
        return NetnsCounters(entries)

    # -- processes ----------------------------------------------------------------------------
    def spawn(
        self,
        argv: Sequence[str],
        *,
        ns: str | None = None,
        role: str = "",
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
    ) -> ProcRecord:
        """Start ``argv`` inside namespace ``ns`` (None: the root namespace), tracked so that
        :meth:`down` stops it. ``python -m skh...`` children find this skh package. Its output
        goes to ``log_path`` (default: a file under :attr:`log_dir`)."""
        self.state()  # raises unless the testbed is up: never start what down() would not stop
        argv = tuple(str(a) for a in argv)
        if argv and argv[0] == "python":
            argv = (sys.executable, *argv[1:])
        if log_path is None:
            logdir = self.log_dir or self.state_dir / "logs"
            logdir.mkdir(parents=True, exist_ok=True)
            log_path = (
                logdir / f"{role or Path(argv[0]).name}-{ns or 'root'}-{time.monotonic_ns()}.log"
            )
        logpath = Path(log_path)
        full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
        with open(logpath, "wb") as logf:
            proc = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                # the owner mark tells this testbed's processes apart from another prefix's
                env={**_python_env(), OWNER_ENV: self.prefix, **(env or {})},
                start_new_session=True,
            )
        ticks = nx.proc_start_ticks(proc.pid)
        # return once the child is inside its namespace (``ip netns exec`` setns()-es, then execs)
        want = nx.netns_inode(ns) if ns else None
        deadline = time.monotonic() + 5.0
        while want is not None and time.monotonic() < deadline and proc.poll() is None:
            try:
                if int(os.readlink(f"/proc/{proc.pid}/ns/net")[5:-1]) == want:
                    break
            except OSError:
                break
            time.sleep(0.002)
        rec = ProcRecord(proc.pid, ticks or 0, ns, argv, role, str(logpath))
        with self.transact() as st:
            st["processes"] = [p for p in st["processes"] if ProcRecord.from_dict(p).alive()]
            st["processes"].append(rec.to_dict())
        return rec

    def processes(self) -> list[ProcRecord]:
        return [ProcRecord.from_dict(p) for p in self.state().get("processes", ())]

    def find_process(self, pid: int) -> ProcRecord | None:
        for p in self.processes():
            if p.pid == pid:
                return p
        return None

    def stop(self, rec: ProcRecord, *, grace_s: float = 2.0) -> None:
        if rec.alive():
            nx.terminate([rec.pid], grace_s=grace_s)

    def start_traffic(
        self,
        job: str,
        cfg: TrafficConfig | None = None,
        *,
        iterations: int = 0,
        t0_ns: int | None = None,
    ) -> list[ProcRecord]:
        """Start the training-traffic generator of ``job`` in each of its containers (one process
        each). Iterations start at ``t0_ns + i * period`` (default: the second after next, so
        bursts begin on whole wall-clock seconds and a sampler at x.5 s bins them cleanly)."""
        cfg = cfg or TrafficConfig()
        cluster = self.cluster()
        plan = plan_job(cluster, job, cfg)
        if t0_ns is None:
            t0_ns = (time.time_ns() // 1_000_000_000 + 2) * 1_000_000_000
        tdir = self.state_dir / "traffic"
        tdir.mkdir(parents=True, exist_ok=True)
        recs = []
        for cname, sends in plan.items():
            binds = [e.ip for e in cluster.job_endpoints(job) if e.container == cname]
            path = tdir / f"{job}-{cname}.json"
            path.write_text(json.dumps(plan_document(sends, binds, cfg, t0_ns, iterations)))
            recs.append(
                self.spawn(
                    ["python", "-m", "skh.testbed.traffic", str(path)],
                    ns=self.container_ns(cname),
                    role=f"traffic-{cname}",
                )
            )
        for rec in recs:
            wait_ready(rec)
        if time.time_ns() > t0_ns:
            log.warning(
                "traffic of %s: generators were ready only after the first iteration's start", job
            )
        return recs

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        state = self.state()
        present = set(_namespaces(self.prefix))
        want = state["namespaces"]
        procs = [ProcRecord.from_dict(p) for p in state.get("processes", ())]
        return {
            "prefix": self.prefix,
            "state": str(self.state_path),
            "spec": state["spec"],
            "namespaces": len(want),
            "namespaces_missing": sorted(set(want) - present),
            "processes": [
                {"pid": p.pid, "role": p.role, "ns": p.ns, "alive": p.alive()} for p in procs
            ],
            "faults": state.get("faults", []),
        }
