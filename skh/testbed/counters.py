"""A fast reader of per-interface counters across network namespaces.

For each namespace it reads the counters and oper states with :mod:`skh.collect.netdev` (one
``setns()``, one read of ``/proc/thread-self/net/dev``, one ioctl per device). Rows are
``COUNTER_DTYPE`` keyed by endpoint id, so a :class:`NetnsCounters` plugs into the underlay
agent as a counter source.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from skh.collect.netdev import in_netns, oper_up, read_netdev
from skh.errors import ConfigError, TestbedError
from skh.records import COUNTER_DTYPE

__all__ = ["CounterEntry", "NetnsCounters"]


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
