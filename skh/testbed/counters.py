"""A fast 1 Hz reader of per-interface counters across network namespaces.

For each namespace it ``setns()``-es the calling thread, reads ``/proc/thread-self/net/dev``
(about 6 µs per interface, against ~0.3 ms for a netlink dump parsed by pyroute2) and asks the
oper state with one ``SIOCGIFFLAGS`` ioctl per device. Rows are ``COUNTER_DTYPE`` keyed by
endpoint id, so a :class:`NetnsCounters` plugs into the underlay agent as a counter source.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError, TestbedError
from skh.records import COUNTER_DTYPE
from skh.testbed.netns import in_netns

__all__ = ["CounterEntry", "NetnsCounters", "read_netdev", "oper_up"]

_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_RUNNING = 0x40  # RFC 2863 oper state "up" (carrier present)


@dataclass(frozen=True, slots=True)
class CounterEntry:
    """Which device carries endpoint ``ep``'s counters.

    ``swap``: the device is the VF's host-side representor (or veth peer), whose receive side is
    the VF's transmit side; rows are always from the VF's point of view.
    """

    ep: int
    ns: str | None
    dev: str
    swap: bool = False


def read_netdev() -> dict[str, tuple[int, int, int, int]]:
    """``{dev: (rx_bytes, rx_dropped, tx_bytes, tx_dropped)}`` of the calling thread's namespace."""
    out = {}
    with open("/proc/thread-self/net/dev") as f:
        lines = f.readlines()
    for line in lines[2:]:
        name, _, rest = line.partition(":")
        v = rest.split()
        out[name.strip()] = (int(v[0]), int(v[3]), int(v[8]), int(v[11]))
    return out


def oper_up(sock: socket.socket, dev: str) -> bool:
    try:
        res = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("16sH14x", dev.encode(), 0))
    except OSError:
        return False
    flags = struct.unpack_from("16sH", res)[1]
    return bool(flags & _IFF_UP) and bool(flags & _IFF_RUNNING)


class NetnsCounters:
    """Counter source over ``entries``; :meth:`read` returns one ``COUNTER_DTYPE`` row per entry,
    in entry order.

    A device or namespace that has vanished (a crashed container) reads ``oper_up = 0`` with
    its last known byte counts, so per-second differences stay non-negative.
    """

    def __init__(self, entries: Iterable[CounterEntry]) -> None:
        self.entries = tuple(entries)
        if not all(isinstance(e, CounterEntry) for e in self.entries):
            raise ConfigError(
                "The 'entries' parameter of NetnsCounters must hold CounterEntry objects."
            )
        eps = [e.ep for e in self.entries]
        if len(set(eps)) != len(eps):
            raise ConfigError("The 'entries' parameter of NetnsCounters lists an endpoint twice.")
        self._groups: dict[str | None, list[tuple[int, str, bool]]] = {}
        for i, e in enumerate(self.entries):
            self._groups.setdefault(e.ns, []).append((i, e.dev, e.swap))
        self._last = np.zeros(len(self.entries), COUNTER_DTYPE)
        self._last["ep"] = eps

    def __len__(self) -> int:
        return len(self.entries)

    def read(self) -> np.ndarray:
        out = self._last.copy()
        out["oper_up"] = 0
        for ns, items in self._groups.items():
            try:
                with in_netns(ns):
                    stats = read_netdev()
                    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            except (TestbedError, OSError):
                out["t_ns"][[i for i, _, _ in items]] = time.time_ns()
                continue
            t_ns = time.time_ns()
            with sock:
                for i, dev, swap in items:
                    row = out[i]
                    row["t_ns"] = t_ns
                    v = stats.get(dev)
                    if v is None:
                        continue
                    rx_b, rx_d, tx_b, tx_d = v
                    if swap:
                        rx_b, rx_d, tx_b, tx_d = tx_b, tx_d, rx_b, rx_d
                    row["rx_bytes"], row["rx_dropped"], row["tx_bytes"], row["tx_dropped"] = (
                        rx_b,
                        rx_d,
                        tx_b,
                        tx_d,
                    )
                    row["oper_up"] = oper_up(sock, dev)
        self._last = out
        return out.copy()
