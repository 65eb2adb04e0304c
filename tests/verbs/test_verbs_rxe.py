"""The verbs transport on real soft-RoCE: rxe0/rxe1 on a veth pair inside the test VM
(tools/rxe-vm/run-in-rxe-vm.sh; GID 0 = link-local IPv6, GID 1 = IPv4 192.0.2.1/.2).
rxe has no completion timestamps, so every record here must come from the software fallback."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from skh.errors import CapabilityError
from skh.probe import Engine, capabilities
from skh.records import ProbeStatus, TsSource

pytestmark = pytest.mark.verbs

LL0, LL1 = "fe80::ff:fe00:1", "fe80::ff:fe00:2"
V4_0, V4_1 = "::ffff:192.0.2.1", "::ffff:192.0.2.2"
INTERVAL_S = 0.005


def sysfs_gid(dev: str, index: int) -> tuple[ipaddress.IPv6Address, str]:
    """(GID, type) of the kernel's own table, as a cross-check of what the transport chose."""
    port = Path(f"/sys/class/infiniband/{dev}/ports/1")
    raw = (port / "gids" / str(index)).read_text().strip()
    return ipaddress.IPv6Address(raw), (port / "gid_attrs/types" / str(index)).read_text().strip()


def run_probes(a: Engine, b: Engine, seconds: float, *, path_id: int = 0) -> np.ndarray:
    addr = b.local_address()
    a.add_target(7, "", 0, interval_s=INTERVAL_S, gid=addr["gid"], qpn=addr["qpn"], path_id=path_id)
    time.sleep(seconds)
    a.remove_target(7)
    time.sleep(a.timeout_s + 0.3)  # let every probe in flight be decided
    return a.drain()


def assert_valid_rtts(rows: np.ndarray, *, at_least: int) -> np.ndarray:
    """The clock-domain check: plenty of probes, nearly all OK, every OK one on the user clock
    with a positive RTT that is below the app-level round trip (zero valid RTTs fails here)."""
    ok = rows[rows["status"] == ProbeStatus.OK]
    assert len(ok) >= at_least, (
        f"only {len(ok)} valid RTTs of {len(rows)} probes: {np.bincount(rows['status'])}"
    )
    assert len(ok) >= 0.9 * len(rows)
    assert set(ok["ts_source"].tolist()) == {TsSource.USER}, (
        "rxe has no CQE stamps: all must be labelled USER"
    )
    assert (ok["rtt_ns"] > 0).all() and (ok["responder_delay_ns"] >= 0).all()
    assert (ok["prober_delay_ns"] >= 0).all()
    assert np.median(ok["rtt_ns"]) < 50e6  # TCG is slow, but not 50 ms per round trip
    now = time.time_ns()
    assert (abs(ok["t_wall_ns"] - now) < 120e9).all(), "t_wall_ns must be CLOCK_REALTIME"
    return ok


def test_verbs_is_available_in_the_vm():
    assert "verbs" in capabilities()


def test_ipv4_gid_is_chosen_never_index_0_by_default():
    assert sysfs_gid("rxe0", 1) == (ipaddress.IPv6Address(V4_0), "RoCE v2")
    with Engine(transport="verbs", device="rxe0") as e:
        assert e.local_address()["gid"] == V4_0 and e.local_address()["gid_index"] == 1
        assert e.local_port == e.local_address()["qpn"] > 1
    # by netdev name, and by the exact configured address
    with Engine(transport="verbs", device="rxev1") as e:
        assert (e.local_address()["gid"], e.local_address()["gid_index"]) == (V4_1, 1)
    with Engine(transport="verbs", bind="192.0.2.2") as e:
        assert e.local_address()["gid"] == V4_1


def test_ipv6_link_local_gid_only_when_asked():
    assert sysfs_gid("rxe1", 0) == (ipaddress.IPv6Address(LL1), "RoCE v2")
    with Engine(transport="verbs", device="rxe1", bind=LL1) as e:
        assert (e.local_address()["gid"], e.local_address()["gid_index"]) == (LL1, 0)
    # "::" means a routable IPv6 GID; rxe has only the link-local one, which must not be guessed
    with pytest.raises(CapabilityError, match="no RoCE v2 IPv6 GID"):
        Engine(transport="verbs", device="rxe1", bind="::")
    # an explicit index overrides the choice
    with Engine(transport="verbs", device="rxe0", gid_index=0, bind=LL0) as e:
        assert e.local_address()["gid_index"] == 0


def test_unknown_device_is_named_in_the_error():
    with pytest.raises(
        CapabilityError, match="no RDMA device or network interface named 'nosuch0'"
    ):
        Engine(transport="verbs", device="nosuch0")


def test_hw_timestamps_required_fails_on_rxe():
    # the create_cq_ex(COMPLETION_TIMESTAMP) -> EOPNOTSUPP fallback, made an error when asked
    with pytest.raises(CapabilityError) as exc:
        Engine(transport="verbs", device="rxe0", hw_timestamps=True)
    assert exc.value.errno == errno.EOPNOTSUPP
    assert "no usable completion timestamps" in str(exc.value)


@pytest.mark.parametrize(
    ("dev_a", "dev_b", "bind_a", "bind_b"),
    [
        ("rxe0", "rxe1", "0.0.0.0", "0.0.0.0"),
        ("rxe0", "rxe1", LL0, LL1),
        ("rxe0", "rxe0", "0.0.0.0", "0.0.0.0"),
        ("rxe0", "rxe0", LL0, LL0),
    ],
    ids=["rxe0-rxe1-ipv4", "rxe0-rxe1-ipv6ll", "rxe0-rxe0-ipv4", "rxe0-rxe0-ipv6ll"],
)
def test_ud_probes_record_rtts(dev_a, dev_b, bind_a, bind_b):
    with (
        Engine(endpoint_id=1, transport="verbs", device=dev_a, bind=bind_a, timeout_s=0.5) as a,
        Engine(endpoint_id=2, transport="verbs", device=dev_b, bind=bind_b, timeout_s=0.5) as b,
    ):
        rows = run_probes(a, b, 1.0, path_id=9)
        sa, sb = a.stats(), b.stats()
    assert_valid_rtts(rows, at_least=40)
    assert (
        (rows["src_ep"] == 1).all() and (rows["dst_ep"] == 7).all() and (rows["path_id"] == 9).all()
    )
    assert sb.probes_received >= len(rows) - 2 and sb.replies_sent == 2 * sb.probes_received
    assert sa.send_errors == 0 and sa.drops == 0 and sb.reply_errors == 0


def test_loss_is_detected_when_the_responder_stops():
    with Engine(endpoint_id=1, transport="verbs", device="rxe0", timeout_s=0.3) as a:
        b = Engine(endpoint_id=2, transport="verbs", device="rxe1")
        b.start()
        addr = b.local_address()
        a.add_target(7, "", 0, interval_s=INTERVAL_S, gid=addr["gid"], qpn=addr["qpn"])
        time.sleep(0.8)
        b.close()  # the QP is gone: probes to it vanish silently (UD has no NAK)
        t_stop = time.time_ns()
        time.sleep(1.2)
        a.remove_target(7)
        time.sleep(0.6)
        rows = a.drain()
    # The responder's first replies wait for its address handle to the prober (off its engine
    # thread: ~10 ms here, ~300 ms on a starved host); replies later than the 0.3 s timeout are
    # honest reply loss, never LOST or a stalled responder.
    first_ok = rows["t_wall_ns"][rows["status"] == ProbeStatus.OK].min()
    warming = rows[rows["t_wall_ns"] < first_ok]
    assert (warming["status"] == ProbeStatus.REPLY_LOST).all(), warming
    before = rows[(rows["t_wall_ns"] >= first_ok) & (rows["t_wall_ns"] < t_stop - 50e6)]
    after = rows[rows["t_wall_ns"] > t_stop + 50e6]
    assert_valid_rtts(before, at_least=20)
    assert len(after) >= 20
    assert (after["status"] == ProbeStatus.LOST).all()
    assert (after["rtt_ns"] == -1).all()


def test_cli_probe_and_respond_over_verbs():
    """`skh respond --transport verbs` answers an in-process prober while `skh probe --transport
    verbs` probes an in-process responder (both CLIs at once: each start costs seconds under
    TCG)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    skh = [sys.executable, "-m", "skh"]
    with (
        Engine(endpoint_id=2, transport="verbs", device="rxe1") as local_resp,
        Engine(endpoint_id=1, transport="verbs", device="rxe0", timeout_s=0.5) as local_prober,
    ):
        addr = local_resp.local_address()
        probe = subprocess.Popen(
            [
                *skh,
                "probe",
                "--transport",
                "verbs",
                "--device",
                "rxe0",
                "-c",
                "20",
                "-i",
                "0.02",
                "-W",
                "0.5",
                "--json",
                f"{addr['gid']}/{addr['qpn']}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        resp = subprocess.Popen(
            [
                *skh,
                "respond",
                "--transport",
                "verbs",
                "--device",
                "rxe1",
                "--gid-index",
                "1",
                "--duration",
                "120",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            line = resp.stderr.readline()
            m = re.search(r"answering on (\S+)/(\d+)", line)
            assert m, f"no verbs address in {line!r}"
            assert m.group(1) == V4_1
            local_prober.add_target(3, "", 0, interval_s=0.02, gid=m.group(1), qpn=int(m.group(2)))
            out, err = probe.communicate(timeout=120)
            assert probe.returncode == 0, err
            summary = json.loads(out)["targets"][0]
            assert (
                summary["ok"] >= 18 and summary["clock"] == "user" and summary["rtt_us"]["p50"] > 0
            )
            time.sleep(1.0)  # the CLI prober may finish right after the responder came up
            local_prober.remove_target(3)
            time.sleep(0.8)
            rows = local_prober.drain()
            assert_valid_rtts(rows, at_least=10)
        finally:
            for p in (probe, resp):
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=30)
