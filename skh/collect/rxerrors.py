"""An RNIC's RX error counters: the frames its port received corrupted.

A link that corrupts frames (a bad cable, a dirty optic, a marginal transceiver) makes the
*receiving* port count them, so the counters of the two RNICs at the ends of a lossy pair say
which end's link takes the corrupted frames (the localizer's CRC tie-break). Two sources, summed:

- the RDMA device's port counters (InfiniBand PortCounters, also kept by RoCE devices: mlx5, rxe)
  ``/sys/class/infiniband/<ibdev>/ports/<port>/counters/symbol_error`` and ``port_rcv_errors``;
  the ``<ibdev>``/``<port>`` of a netdev is the one whose ``gid_attrs/ndevs/*`` names it (RoCE
  GIDs point at their netdev), or any under ``/sys/class/net/<netdev>/device/infiniband/``;
- the netdev's ``rx_crc_errors`` (rtnl link statistics, what ``ip -s -s link`` shows; mlx5 fills
  it from the PHY's ``rx_crc_errors_phy`` of ``ethtool -S``). The caller passes it: inside a
  container's namespace only a netlink dump sees the right device, ``/sys/class/net`` shows the
  reader's own.

The counters are cumulative (since the driver loaded), so one reading says nothing by itself:
readings are compared over time by the localizer.
"""

from __future__ import annotations

import glob
import os

from skh.errors import CapabilityError

__all__ = ["IB_COUNTERS", "ib_ports_of", "rx_errors"]

#: the RDMA port counters that count corrupted received frames
IB_COUNTERS = ("symbol_error", "port_rcv_errors")


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def ib_ports_of(netdev: str, *, sysfs: str = "/sys") -> list[str]:
    """The RDMA port directories (``.../infiniband/<ibdev>/ports/<n>``) of ``netdev``."""
    found: set[str] = set()
    for ndev in glob.glob(f"{sysfs}/class/infiniband/*/ports/*/gid_attrs/ndevs/*"):
        try:
            with open(ndev, encoding="ascii") as f:
                if f.read().strip() == netdev:
                    found.add(os.path.dirname(os.path.dirname(os.path.dirname(ndev))))
        except OSError:
            continue  # an unused GID slot reads EINVAL
    if not found:
        for dev in glob.glob(f"{sysfs}/class/net/{netdev}/device/infiniband/*"):
            found.update(glob.glob(f"{dev}/ports/*"))
    return sorted(found)


def rx_errors(netdev: str, rx_crc_errors: int | None = None, *, sysfs: str = "/sys") -> int:
    """RX errors of ``netdev``'s RNIC: its RDMA ports' :data:`IB_COUNTERS` plus the netdev's
    ``rx_crc_errors`` (``None``: the caller's link dump had no statistics).

    Raises :class:`~skh.errors.CapabilityError` when neither source has a counter (no RDMA
    device on the netdev and no link statistics): the caller reports the flag unread, never 0."""
    total, have = 0, False
    for port in ib_ports_of(netdev, sysfs=sysfs):
        for name in IB_COUNTERS:
            v = _read_int(f"{port}/counters/{name}")
            if v is not None:
                total, have = total + v, True
    if rx_crc_errors is not None:
        total, have = total + int(rx_crc_errors), True
    if not have:
        raise CapabilityError(
            f"no RX error counters for {netdev!r}: no RDMA port under {sysfs}/class/infiniband "
            f"names it (gid_attrs/ndevs) with readable counters/{{{','.join(IB_COUNTERS)}}}, "
            "and its link dump has no statistics"
        )
    return total
