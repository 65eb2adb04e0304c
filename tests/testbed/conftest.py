"""Fixtures for the namespace-testbed tests: a small testbed per module (always torn down and
checked to leave nothing behind) and in-process UDP probes between namespaces (sockets are
created inside a namespace with setns(), then driven from the test thread)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from skh.collect import trace
from skh.model import JobShape
from skh.testbed import JobSpec, Testbed, TestbedSpec
from skh.testbed.netns import in_netns, list_netns, pids_in_netns, socket_in
from skh.testbed.spec import owns
from skh.testbed.testbed import OWNER_ENV, default_state_dir

#: CI and ``make demo`` use the default; on a shared development machine another prefix keeps
#: concurrent runs of two people from removing each other's testbed
PREFIX = os.environ.get("SKH_TESTBED_PREFIX", "skht")

#: 4 hosts in 2 segments × 2 rails, 2 spines, 2 containers per host; job0 is PP 2 × DP 2 on slot 0
#: of every host, job1 is DP 4 on slot 1
SMALL = TestbedSpec(
    hosts=4,
    rnics_per_host=2,
    hosts_per_segment=2,
    spines=2,
    containers_per_host=2,
    jobs=(JobSpec("job0", JobShape(tp=2, pp=2, dp=2)), JobSpec("job1", JobShape(tp=2, pp=1, dp=4))),
)


def leftovers(prefix: str = PREFIX) -> dict[str, list]:
    """Everything of ``prefix`` still present: namespaces, root links, nft tables, processes (the
    ones a testbed of ``prefix`` spawned, by the owner mark in their environment, so another
    prefix's testbed running beside this one does not count), and its state directory."""
    links = [n for n in os.listdir("/sys/class/net") if owns(prefix, n)]
    tables = []
    res = os.popen("nft list tables 2>/dev/null").read()
    for line in res.splitlines():
        if line.split()[-1:] and owns(prefix, line.split()[-1]):
            tables.append(line)
    mark = f"{OWNER_ENV}={prefix}".encode()
    procs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            procs.append((int(entry), cmd))
    namespaces = [n for n in list_netns(prefix) if owns(prefix, n)]
    state = default_state_dir(prefix)
    # what is left inside it, or the empty directory itself
    kept = (sorted(str(p) for p in state.rglob("*")) or [str(state)]) if state.exists() else []
    return {
        "namespaces": namespaces,
        "links": links,
        "nft": tables,
        "processes": procs,
        "state": kept,
    }


def assert_clean(prefix: str = PREFIX) -> None:
    left = leftovers(prefix)
    assert not any(left.values()), f"testbed left objects behind: {left}"


@pytest.fixture(scope="module")
def testbed():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    tb = Testbed(SMALL, prefix=PREFIX)
    try:
        tb.up()
        yield tb
    finally:
        tb.down()
    assert_clean()


@dataclass
class ProbeResult:
    sent: int
    arrived: int  # at the responder
    answered: int  # replies back at the prober
    rtts_us: list[float]
    errors: list[int]  # errnos the prober saw (ECONNREFUSED, EHOSTUNREACH, ...)

    @property
    def p50_us(self) -> float:
        r = sorted(self.rtts_us)
        return r[len(r) // 2] if r else float("inf")


def udp_probe(
    src_ns: str,
    src_ip: str,
    dst_ns: str,
    dst_ip: str,
    *,
    n: int = 10,
    timeout_s: float = 0.2,
    sport: int = 0,
    size: int = 64,
) -> ProbeResult:
    """Sequential UDP echo probes src→dst with the responder driven in this same thread."""
    tx = socket_in(src_ns)
    rx = socket_in(dst_ns)
    try:
        tx.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR: ICMP errors as errnos
        tx.bind((src_ip, sport))
        tx.setblocking(False)
        rx.bind((dst_ip, 0))
        port = rx.getsockname()[1]
        arrived = answered = 0
        rtts, errors = [], []
        for seq in range(n):
            t0 = time.perf_counter_ns()
            try:
                tx.sendto(struct.pack("!Iq", seq, t0).ljust(size, b"x"), (dst_ip, port))
            except OSError as exc:
                # no route (a downed RNIC flushes its routes), or a queued ICMP error
                errors.append(exc.errno)
            ready, _, _ = select.select([rx], [], [], timeout_s)
            if ready:
                data, addr = rx.recvfrom(65535)
                arrived += 1
                rx.sendto(data, addr)
            deadline = time.monotonic() + (timeout_s if ready else 0.01)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                r, _, x = select.select([tx], [], [tx], left)
                if not r and not x:
                    break
                try:
                    data = tx.recv(65535)
                except BlockingIOError:
                    with contextlib.suppress(BlockingIOError):
                        tx.recvmsg(512, 512, socket.MSG_ERRQUEUE)
                    continue
                except OSError as exc:
                    errors.append(exc.errno)
                    continue
                if struct.unpack("!I", data[:4])[0] == seq:
                    answered += 1
                    rtts.append((time.perf_counter_ns() - t0) / 1e3)
                    break
        return ProbeResult(n, arrived, answered, rtts, errors)
    finally:
        tx.close()
        rx.close()


def paris_trace(
    src_ns: str, src_ip: str, dst_ip: str, *, sport: int, max_ttl: int = 8, timeout_s: float = 0.5
) -> list[str | None]:
    """Hop addresses (None: silent) of a flow-pinned traceroute from namespace ``src_ns``."""
    with in_netns(src_ns):
        res = trace.paris_trace(
            dst_ip, src=src_ip, sport=sport, max_ttl=max_ttl, timeout_s=timeout_s
        )
    return [h.addr for h in res.hops]


@pytest.fixture
def tbh():
    """The helpers of this module, for test modules (conftest is not importable as a module)."""
    return SimpleNamespace(
        probe=udp_probe,
        trace=paris_trace,
        procs_in=procs_in,
        leftovers=leftovers,
        assert_clean=assert_clean,
        SMALL=SMALL,
        PREFIX=PREFIX,
    )


def procs_in(ns: str) -> list[int]:
    ino = os.stat(f"/run/netns/{ns}").st_ino
    return pids_in_netns({ino})
