"""Per-endpoint byte counters for skeleton inference, sampled by the underlay agent at
``agent.counter_hz`` (10 Hz by default, :data:`skh.orchestrator.config.DEFAULT_COUNTER_HZ`).

Three pluggable sources, each naming the endpoint (``job/container/rail``) it measures:

* :class:`NetdevSource`: netdev stats of the VF's host-side representor or veth, in any named
  network namespace — per namespace and tick, the thread enters it, reads
  ``/proc/thread-self/net/dev`` and asks each device's flags (one ioctl). A pyroute2 link dump
  cost ~11 ms of CPU per 8-RNIC sample (11 % of a core at 10 Hz); this ~0.7 ms
  (``bench/counter_rate.py``).
* :class:`VfSource`: IFLA_VF_STATS of VF *n* on a PF (``ip link show PF`` with VF info).
* :class:`RdmaSysfsSource`: RDMA port counters under ``<root>/sys/class/infiniband``; the
  ``root`` lets tests point it at a fake tree.

:class:`CounterSampler` samples them all and returns one :data:`~skh.records.COUNTER_DTYPE` row
per source whose endpoint id is known.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

# pyroute2 is imported with the agent, before it reports READY=1, not by the first sample inside
# its watchdog-guarded loop (on an emulated CPU that first import outlasted WatchdogSec=30)
from pyroute2 import IPRoute, NetNS

from skh.collect.netdev import in_netns, oper_up, read_netdev
from skh.errors import ConfigError, TestbedError
from skh.orchestrator.config import SourceSpec
from skh.records import empty_counters

__all__ = [
    "Sample",
    "NetdevSource",
    "VfSource",
    "RdmaSysfsSource",
    "CounterSampler",
    "make_source",
    "parse_vf_stats",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sample:
    oper_up: bool
    tx_bytes: int
    rx_bytes: int
    tx_dropped: int
    rx_dropped: int


class LinkDumps:
    """Per namespace and tick, one read of its devices (netdev sources) and one netlink link dump
    (VF sources), shared by every source there."""

    def __init__(self) -> None:
        self._handles: dict[str, Any] = {}
        self._cache: dict[tuple[str, Any], dict[str, Any]] = {}

    def begin_tick(self) -> None:
        self._cache.clear()

    def _handle(self, netns: str) -> Any:
        h = self._handles.get(netns)
        if h is None:
            h = self._handles[netns] = NetNS(netns) if netns else IPRoute()
        return h

    def netdev(self, netns: str) -> dict[str, Sample]:
        """Every device of ``netns`` ("" = the agent's own) by name, from its ``net/dev`` and
        flags; empty when the namespace is gone (a container that stopped)."""
        key = (netns, "netdev")
        if key not in self._cache:
            out: dict[str, Sample] = {}
            try:
                with in_netns(netns or None):
                    stats = read_netdev()
                    # a socket opened inside stays there: the flags ioctl asks that namespace
                    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            except TestbedError:
                stats = {}
            else:
                with sock:
                    for dev, (rx_b, rx_d, tx_b, tx_d) in stats.items():
                        out[dev] = Sample(oper_up(sock, dev), tx_b, rx_b, tx_d, rx_d)
            self._cache[key] = out  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]

    def links(self, netns: str, *, vf: bool = False) -> dict[str, Any]:
        key = (netns, vf)
        if key not in self._cache:
            msgs = (
                self._handle(netns).get_links(ext_mask=1) if vf else self._handle(netns).get_links()
            )
            self._cache[key] = {m.get("ifname"): m for m in msgs}
        return self._cache[key]

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()


class Source(Protocol):
    endpoint: str

    def sample(self, dumps: LinkDumps) -> Sample | None: ...


@dataclass(frozen=True, slots=True)
class NetdevSource:
    endpoint: str
    netdev: str
    netns: str = ""

    def sample(self, dumps: LinkDumps) -> Sample | None:
        return dumps.netdev(self.netns).get(self.netdev)


def parse_vf_stats(msg: Any, vf: int) -> Sample | None:
    """The IFLA_VF_STATS of VF ``vf`` from a PF's RTM_NEWLINK message (pyroute2 nla objects)."""
    vfinfo = msg.get_attr("IFLA_VFINFO_LIST")
    if vfinfo is None:
        return None
    for info in vfinfo.get_attrs("IFLA_VF_INFO"):
        mac = info.get_attr("IFLA_VF_MAC")
        if mac is None or int(mac["vf"]) != vf:
            continue
        st = info.get_attr("IFLA_VF_STATS")
        if st is None:
            return None
        link_state = info.get_attr("IFLA_VF_LINK_STATE")
        up = (
            link_state is None or int(link_state["link_state"]) != 2
        )  # 2 = IFLA_VF_LINK_STATE_DISABLE
        return Sample(
            up,
            int(st.get_attr("IFLA_VF_STATS_TX_BYTES") or 0),
            int(st.get_attr("IFLA_VF_STATS_RX_BYTES") or 0),
            int(st.get_attr("IFLA_VF_STATS_TX_DROPPED") or 0),
            int(st.get_attr("IFLA_VF_STATS_RX_DROPPED") or 0),
        )
    return None


@dataclass(frozen=True, slots=True)
class VfSource:
    endpoint: str
    pf: str
    vf: int
    netns: str = ""

    def sample(self, dumps: LinkDumps) -> Sample | None:
        msg = dumps.links(self.netns, vf=True).get(self.pf)
        return None if msg is None else parse_vf_stats(msg, self.vf)


@dataclass(frozen=True, slots=True)
class RdmaSysfsSource:
    endpoint: str
    device: str
    port: int = 1
    root: str = "/"

    def _dir(self) -> Path:
        return Path(self.root) / "sys/class/infiniband" / self.device / "ports" / str(self.port)

    def sample(self, dumps: LinkDumps) -> Sample | None:
        d = self._dir()

        def read(rel: str) -> int:
            try:
                return int((d / rel).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return 0

        try:
            state = (d / "state").read_text()
        except OSError:
            return None
        # port_{xmit,rcv}_data count 4-octet words (InfiniBand PortCounters)
        return Sample(
            "ACTIVE" in state,
            4 * read("counters/port_xmit_data"),
            4 * read("counters/port_rcv_data"),
            read("counters/port_xmit_discards"),
            read("hw_counters/out_of_buffer"),
        )


def make_source(spec: SourceSpec) -> Source:
    if spec.kind == "netdev":
        if not spec.netdev:
            raise ConfigError(f"counter source for {spec.endpoint}: kind netdev needs 'netdev'")
        return NetdevSource(spec.endpoint, spec.netdev, spec.netns)
    if spec.kind == "vf":
        if not spec.netdev or spec.vf < 0:
            raise ConfigError(
                f"counter source for {spec.endpoint}: kind vf needs 'netdev' (the PF) and 'vf'"
            )
        return VfSource(spec.endpoint, spec.netdev, spec.vf, spec.netns)
    if spec.kind == "rdma":
        if not spec.device:
            raise ConfigError(f"counter source for {spec.endpoint}: kind rdma needs 'device'")
        return RdmaSysfsSource(spec.endpoint, spec.device, spec.port, spec.root)
    raise ConfigError(f"unknown counter source kind {spec.kind!r}")


class CounterSampler:
    """Samples every source once per call; sources whose endpoint id is unknown are skipped."""

    def __init__(self, sources: Iterable[Source]) -> None:
        self.sources = list(sources)
        self.dumps = LinkDumps()
        self.failures = 0

    def sample(self, ep_ids: Mapping[str, int]) -> np.ndarray:
        self.dumps.begin_tick()
        out = empty_counters(len(self.sources))
        n = 0
        t_ns = time.time_ns()
        for src in self.sources:
            ep = ep_ids.get(src.endpoint)
            if ep is None:
                continue
            try:
                s = src.sample(self.dumps)
            except OSError as exc:  # a namespace that vanished, a netlink hiccup: next tick retries
                log.debug("counter source %s failed: %s", src, exc)
                s = None
            if s is None:
                self.failures += 1
                continue
            out[n] = (
                ep,
                s.oper_up,
                (0, 0, 0),
                t_ns,
                s.tx_bytes,
                s.rx_bytes,
                s.tx_dropped,
                s.rx_dropped,
            )
            n += 1
        return out[:n]

    def close(self) -> None:
        self.dumps.close()
