"""Helpers shared by the engine tests (imported after tests/engine is put on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable

from skh.probe import Engine, EngineStats


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0, step_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step_s)
    return cond()


def assert_accounted(s: EngineStats) -> None:
    """Every probe and every received datagram is in exactly one counter."""
    assert s.sent + s.send_errors == s.decided + s.in_flight + s.awaiting_direction, s
    assert s.decided == s.records + s.ring_overflow, s
    assert s.received == s.probes_received + s.acks_received + s.icmp_errors + s.drops, s


def quiesce(eng: Engine, timeout_s: float = 5.0, sent: int = 0) -> EngineStats:
    """Stops probing-side activity from mattering: waits until every probe sent has its record.

    The in-flight and awaiting gauges alone are not enough: the engine thread refreshes them once
    per wake-up, so a probe just sent (and answered by a test at once) can still read 0 in flight.
    Nor is the sent counter: it grows once sendmmsg returns, and a test's responder can receive
    and answer the datagram before that; ``sent`` is how many probes the test saw arrive.
    """

    def settled() -> bool:
        s = eng.stats()
        return (
            s.sent >= sent
            and s.sent + s.send_errors == s.records + s.ring_overflow
            and s.in_flight == 0
            and s.awaiting_direction == 0
        )

    wait_for(settled, timeout_s)
    return eng.stats()
