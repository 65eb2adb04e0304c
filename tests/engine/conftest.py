"""Fixtures of the engine tests: engines that always get closed, and a veth pair between two
network namespaces (prefix ``skhe-``) that is always torn down."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from skh.probe import Engine


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(**kw) -> Engine:
        kw.setdefault("bind", "127.0.0.1")
        eng = Engine(**kw)
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


@dataclass(frozen=True)
class VethPair:
    ns_a: str
    ns_b: str
    ip_a: str
    ip_b: str

    def fd(self, ns: str) -> int:
        return os.open(f"/run/netns/{ns}", os.O_RDONLY)

    def sh(self, ns: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def veth() -> Iterator[VethPair]:
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"skhe-a-{tag}", f"skhe-b-{tag}"
    va, vb = f"skhe-va{tag}", f"skhe-vb{tag}"
    pair = VethPair(ns_a, ns_b, "198.18.77.1", "198.18.77.2")
    try:
        _ip("netns", "add", ns_a)
        _ip("netns", "add", ns_b)
        _ip("link", "add", va, "netns", ns_a, "type", "veth", "peer", "name", vb, "netns", ns_b)
        for ns, dev, addr in ((ns_a, va, pair.ip_a), (ns_b, vb, pair.ip_b)):
            pair.sh(ns, "ip", "addr", "add", f"{addr}/24", "dev", dev)
            pair.sh(ns, "ip", "link", "set", dev, "up")
            pair.sh(ns, "ip", "link", "set", "lo", "up")
            # the kernel sends ~6 ICMP errors per peer, then 1/s: tests probe faster than that
            pair.sh(ns, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0")
        yield pair
    finally:
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
