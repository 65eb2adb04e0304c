"""skh.ptp: PTP lock/offset from linuxptp's pmc, the TAI/UTC shift, and one-way delays that exist
only when both ends are locked. Parsing runs on pmc output captured from a real ptp4l pair, and a
real free-running ptp4l pair checks the lock rules end to end (root: a namespace of our own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from skh import ptp
from skh.errors import CapabilityError

SLAVE_UNCALIBRATED = """\
sending: GET TIME_STATUS_NP
sending: GET TIME_PROPERTIES_DATA_SET
\tce7c60.fffe.65ec68-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP 
\t\tmaster_offset              111
\t\tingress_time               1795979295490037585
\t\tcumulativeScaledRateOffset +0.000000000
\t\tscaledLastGmPhaseChange    0
\t\tgmTimeBaseIndicator        0
\t\tlastGmPhaseChange          0x0000'0000000000000000.0000
\t\tgmPresent                  true
\t\tgmIdentity                 ce60da.fffe.08117f
sending: GET PORT_DATA_SET
\tce7c60.fffe.65ec68-0 seq 1 RESPONSE MANAGEMENT TIME_PROPERTIES_DATA_SET 
\t\tcurrentUtcOffset      37
\t\tleap61                0
\t\tleap59                0
\t\tcurrentUtcOffsetValid 0
\t\tptpTimescale          0
\t\ttimeTraceable         0
\t\tfrequencyTraceable    0
\t\ttimeSource            0xa0
\tce7c60.fffe.65ec68-1 seq 2 RESPONSE MANAGEMENT PORT_DATA_SET 
\t\tportIdentity            ce7c60.fffe.65ec68-1
\t\tportState               UNCALIBRATED
\t\tlogMinDelayReqInterval  0
\t\tpeerMeanPathDelay       0
"""

GRANDMASTER = """\
sending: GET TIME_STATUS_NP
sending: GET PORT_DATA_SET
\tce60da.fffe.08117f-0 seq 0 RESPONSE MANAGEMENT TIME_STATUS_NP 
\t\tmaster_offset              0
\t\tingress_time               0
\t\tgmPresent                  false
\t\tgmIdentity                 ce60da.fffe.08117f
\tce60da.fffe.08117f-1 seq 1 RESPONSE MANAGEMENT PORT_DATA_SET 
\t\tportIdentity            ce60da.fffe.08117f-1
\t\tportState               MASTER
"""


def slave(offset: int, *, state: str = "SLAVE", utc_valid: int = 1, timescale: int = 1) -> str:
    return (
        SLAVE_UNCALIBRATED.replace("UNCALIBRATED", state)
        .replace("master_offset              111", f"master_offset              {offset}")
        .replace("currentUtcOffsetValid 0", f"currentUtcOffsetValid {utc_valid}")
        .replace("ptpTimescale          0", f"ptpTimescale          {timescale}")
    )


def test_locked_slave():
    s = ptp.parse_pmc(slave(-42))
    assert s.locked and s.offset_ns == -42 and s.gm_present and s.port_state == "SLAVE"
    assert s.utc_offset_s == 37 and s.ptp_timescale
    assert "ce60da.fffe.08117f" in s.reason


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (SLAVE_UNCALIBRATED, "port state UNCALIBRATED"),
        (slave(5_000), "offset 5000 ns exceeds"),
        ("sending: GET TIME_STATUS_NP\n", "no answer from ptp4l"),
        ("", "no answer from ptp4l"),
    ],
)
def test_not_locked(text, why):
    s = ptp.parse_pmc(text)
    assert not s.locked and why in s.reason


def test_grandmaster_is_its_own_reference():
    s = ptp.parse_pmc(GRANDMASTER)
    assert s.locked and s.port_state == "MASTER" and not s.gm_present and s.offset_ns == 0


def test_utc_offset_only_when_valid():
    assert ptp.parse_pmc(slave(1, utc_valid=0)).utc_offset_s is None
    assert ptp.parse_pmc(slave(1)).utc_offset_s == 37


def test_one_way_only_when_both_ends_are_locked():
    send = np.array([1_000, 2_000, 3_000], dtype=np.int64)
    recv = send + np.array([700, 650, 900])
    a, b = ptp.parse_pmc(slave(-30)), ptp.parse_pmc(slave(45))
    ow = ptp.one_way_delays(send, recv, a, b)
    assert ow is not None and ow.delay_ns.tolist() == [700, 650, 900] and ow.error_ns == 75
    assert ptp.one_way_delays(send, recv, a, ptp.parse_pmc(SLAVE_UNCALIBRATED)) is None
    assert ptp.one_way_delays(send, recv, ptp.parse_pmc(""), b) is None


def test_phc_tai_stamps_shift_to_utc():
    s = ptp.parse_pmc(slave(0))
    tai = np.array([1_795_979_332_000_000_123], dtype=np.int64)
    assert ptp.phc_to_utc_ns(tai, s).tolist() == [1_795_979_295_000_000_123]
    # an ARB-timescale PHC is not shifted; a PTP one without a valid offset cannot be
    assert ptp.phc_to_utc_ns(tai, ptp.parse_pmc(slave(0, timescale=0))).tolist() == tai.tolist()
    with pytest.raises(CapabilityError, match="no valid UTC offset"):
        ptp.phc_to_utc_ns(tai, ptp.parse_pmc(slave(0, utc_valid=0)))


def test_kernel_tai_offset_is_whole_seconds():
    off = ptp.kernel_tai_offset_s()
    assert isinstance(off, int) and 0 <= off < 100


@pytest.mark.skipif(
    shutil.which("pmc") is None, reason="linuxptp is not installed (tools/setup-debian.sh)"
)
def test_real_pmc_without_ptp4l(tmp_path):
    s = ptp.query(uds_address=str(tmp_path / "no-ptp4l.sock"), timeout_s=5)
    assert not s.locked and "no answer from ptp4l" in s.reason


@pytest.mark.root
@pytest.mark.skipif(
    shutil.which("ptp4l") is None, reason="linuxptp is not installed (tools/setup-debian.sh)"
)
def test_real_ptp4l_pair_grandmaster_locked_free_running_slave_not(tmp_path):
    """Two real ptp4l on a veth pair in a namespace of our own, software stamps. The slave runs
    free (free_running: it never steers this machine's clock), so it stays UNCALIBRATED: the
    grandmaster must read as locked, the slave must not, and no one-way delay may come out."""
    ns = f"skhv-ptp{os.getpid()}"
    procs: list[subprocess.Popen] = []

    def start(iface: str, name: str, *extra: str) -> str:
        sock = str(tmp_path / f"{name}.sock")
        cfg = tmp_path / f"{name}.cfg"
        cfg.write_text(
            "[global]\n"
            f"uds_address {sock}\n"
            "free_running 1\nlogAnnounceInterval -3\n"
            "logSyncInterval -4\nlogMinDelayReqInterval -4\nannounceReceiptTimeout 2\n"
            + "".join(f"{e}\n" for e in extra)
        )
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, "ptp4l", "-2", "-S", "-i", iface, "-f", str(cfg)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        return sock

    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (
            "link add skhv-pa type veth peer name skhv-pb",
            "link set skhv-pa up",
            "link set skhv-pb up",
        ):
            subprocess.run(["ip", "-n", ns, *cmd.split()], check=True)
        gm = start("skhv-pa", "gm", "priority1 100")
        sl = start("skhv-pb", "slave", "slaveOnly 1")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.5)
            s_gm, s_sl = ptp.query(uds_address=gm), ptp.query(uds_address=sl)
            if s_gm.port_state == "MASTER" and s_sl.gm_present:
                break
        assert s_gm.locked and s_gm.port_state == "MASTER", s_gm
        assert s_sl.gm_present and not s_sl.locked and s_sl.port_state != "SLAVE", s_sl
        assert s_sl.offset_ns is not None
        assert ptp.one_way_delays(np.array([10]), np.array([25]), s_gm, s_sl) is None
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", ns], check=False)
