"""The RNIC RX error counters, read from a sysfs tree laid out as the kernel lays it out."""

from __future__ import annotations

import pytest

from skh.collect.rxerrors import ib_ports_of, rx_errors
from skh.errors import CapabilityError


def _port(root, ibdev, port, ndevs, **counters):
    d = root / "class" / "infiniband" / ibdev / "ports" / str(port)
    (d / "counters").mkdir(parents=True)
    (d / "gid_attrs" / "ndevs").mkdir(parents=True)
    for i, nd in enumerate(ndevs):
        (d / "gid_attrs" / "ndevs" / str(i)).write_text(nd + "\n")
    for name, v in counters.items():
        (d / "counters" / name).write_text(f"{v}\n")
    return d


def test_the_rdma_port_of_a_netdev_and_its_counters(tmp_path):
    p = _port(tmp_path, "mlx5_0", 1, ["eth2", "eth2"], symbol_error=7, port_rcv_errors=30)
    _port(tmp_path, "mlx5_1", 1, ["eth3"], symbol_error=1000, port_rcv_errors=1000)
    assert ib_ports_of("eth2", sysfs=str(tmp_path)) == [str(p)]
    # the RDMA port's counters plus the netdev's bad-FCS count
    assert rx_errors("eth2", 5, sysfs=str(tmp_path)) == 42
    assert rx_errors("eth2", sysfs=str(tmp_path)) == 37
    # a netdev without an RDMA port still has its link statistics
    assert rx_errors("eth9", 3, sysfs=str(tmp_path)) == 3


def test_a_pci_rnic_found_through_its_netdevs_device(tmp_path):
    ib = tmp_path / "class" / "net" / "ens1" / "device" / "infiniband" / "mlx5_2" / "ports" / "1"
    (ib / "counters").mkdir(parents=True)
    (ib / "counters" / "symbol_error").write_text("4\n")
    (ib / "counters" / "port_rcv_errors").write_text("garbage\n")  # unreadable: skipped
    assert rx_errors("ens1", sysfs=str(tmp_path)) == 4


def test_no_counters_at_all_is_a_clear_error_not_zero(tmp_path):
    _port(tmp_path, "rxe0", 1, ["eth0"])  # a port whose counters directory is empty
    with pytest.raises(CapabilityError, match="no RX error counters for 'eth0'"):
        rx_errors("eth0", sysfs=str(tmp_path))
    with pytest.raises(CapabilityError, match="no RX error counters for 'nope'"):
        rx_errors("nope", sysfs=str(tmp_path / "absent"))
