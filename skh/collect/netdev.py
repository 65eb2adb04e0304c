"""Per-interface counters and oper state of a network namespace, read the cheap way.

:func:`in_netns` ``setns()``-es the calling thread into a named namespace for a block;
:func:`read_netdev` then reads ``/proc/thread-self/net/dev`` (about 6 µs per interface, against
~0.3 ms for a netlink dump parsed by pyroute2) and :func:`oper_up` asks one device's oper state
with a ``SIOCGIFFLAGS`` ioctl. The underlay agent's counter sources and the testbed's counter
reader both build on these.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import socket
import struct
from collections.abc import Iterator

from skh.errors import TestbedError

__all__ = ["NETNS_DIR", "in_netns", "read_netdev", "oper_up"]

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_RUNNING = 0x40  # RFC 2863 oper state "up" (carrier present)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


@contextlib.contextmanager
def in_netns(ns: str | None) -> Iterator[None]:
    """Move the calling thread into namespace ``ns`` (a name under ``NETNS_DIR``) for the block
    (``None``: stay); :class:`TestbedError` when it does not exist.

    Sockets created inside the block stay in ``ns`` after it; ``/proc/thread-self/net`` and
    ``/proc/sys/net`` opened inside it show ``ns``.
    """
    if ns is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(f"{NETNS_DIR}/{ns}", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise TestbedError(f"network namespace {ns!r} does not exist") from exc
        try:
            _setns(fd)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


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
    """Whether ``dev`` (in ``sock``'s namespace) is administratively up and has carrier."""
    try:
        res = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("16sH14x", dev.encode(), 0))
    except OSError:
        return False
    flags = struct.unpack_from("16sH", res)[1]
    return bool(flags & _IFF_UP) and bool(flags & _IFF_RUNNING)
