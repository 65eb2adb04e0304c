"""Engines sharing one thread (skh.probe.EngineThread): they probe and answer as engines with a
thread each do, one wake-up serves them all, and each comes and goes without the others."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from skh.errors import InvalidProbeSpec
from skh.orchestrator.agent_overlay import shared_engine_factory
from skh.orchestrator.config import EndpointSpec, load_config
from skh.probe import Engine, EngineThread
from skh.records import ProbeStatus, TsSource

sys.path.insert(0, str(Path(__file__).parent))
from skhe_helpers import assert_accounted, quiesce, wait_for  # noqa: E402


def engine_threads() -> int:
    """Threads of this process named as the engines' loops name theirs."""
    n = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            n += (task / "comm").read_text().strip() == "skh-engine"
        except FileNotFoundError:  # ended meanwhile
            pass
    return n


def ok_rows(eng: Engine, n: int) -> np.ndarray:
    assert wait_for(lambda: eng.stats().decided >= n, timeout_s=10), eng.stats()
    rows = eng.drain()
    assert len(rows) >= n
    return rows


def three_on_one_thread(make_engine) -> tuple[int, EngineThread, list[Engine]]:
    """Engines 1, 2, 3 started on one thread: the threads before, the thread, the engines."""
    base = engine_threads()
    thread = EngineThread()
    engines = [make_engine(endpoint_id=i, thread=thread) for i in (1, 2, 3)]
    for e in engines:
        e.start()
    assert engine_threads() == base + 1
    return base, thread, engines


def test_engines_on_one_thread_probe_and_answer_as_engines_with_a_thread_each(make_engine):
    base, _thread, (a, b, c) = three_on_one_thread(make_engine)
    a.add_target(2, "127.0.0.1", b.local_port, interval_s=0.005, count=100)
    a.add_target(3, "127.0.0.1", c.local_port, interval_s=0.005, count=100)
    b.add_target(1, "127.0.0.1", a.local_port, interval_s=0.005, count=100)
    for eng, n in ((a, 200), (b, 100)):
        rows = ok_rows(eng, n)
        ok = rows[rows["status"] == ProbeStatus.OK]
        why = f"{rows[:4]}\n{a.stats()}\n{b.stats()}\n{c.stats()}"
        assert len(ok) == len(rows), np.unique(rows["status"], return_counts=True)
        assert (ok["ts_source"] == TsSource.KERNEL).all(), why
        assert (ok["rtt_ns"] > 0).all() and np.median(ok["rtt_ns"]) < 200_000
    for e in (a, b, c):
        assert_accounted(quiesce(e))
    assert c.stats().probes_received == 100 and b.stats().probes_received == 100
    # the same engines with a thread each: one more thread per engine
    d, e = (make_engine(endpoint_id=i) for i in (4, 5))
    d.start()
    e.start()
    assert engine_threads() == base + 3


def test_one_wake_up_serves_every_engine_on_the_thread(make_engine):
    """Each engine counts the turns of the thread it runs on: on one thread they all count the
    same turns, and with a tick no more of them than one per tick."""
    thread = EngineThread()
    engines = [make_engine(endpoint_id=i, thread=thread, tick_s=0.005) for i in range(4)]
    for eng in engines:
        eng.start()
    t0 = time.monotonic()
    w0 = [eng.stats().wakeups for eng in engines]
    for i, eng in enumerate(engines):  # each probes the next at 200/s: 800 probes/s in all
        peer = engines[(i + 1) % 4]
        eng.add_target(i + 1, "127.0.0.1", peer.local_port, interval_s=0.005)
    time.sleep(1.0)
    w1 = [eng.stats().wakeups for eng in engines]
    wall = time.monotonic() - t0
    turns = [x - y for x, y in zip(w1, w0, strict=True)]
    assert max(turns) - min(turns) <= 3, turns  # read a turn apart at most
    assert max(turns) <= wall / 0.005 + 5, turns
    for eng in engines:
        s = eng.stats()
        assert s.probes_received >= 100 and s.ok >= 100, s


def test_idle_engines_on_one_thread_sleep(make_engine):
    """Once the turns their starts asked for are over (each start wakes the thread: how many
    turns that makes depends on when the thread ran between them), idle engines take none."""
    thread = EngineThread()
    engines = [make_engine(thread=thread) for _ in range(3)]
    for eng in engines:
        eng.start()

    def turns() -> list[int]:
        return [eng.stats().wakeups for eng in engines]

    before = turns()
    for _ in range(50):  # settled: no turn in 0.2 s
        time.sleep(0.2)
        now = turns()
        if now == before:
            break
        before = now
    time.sleep(1.0)
    assert turns() == before, (before, turns())


def test_an_engine_stops_starts_and_closes_while_the_others_on_its_thread_go_on(make_engine):
    base, thread, (a, b, c) = three_on_one_thread(make_engine)
    a.add_target(3, "127.0.0.1", c.local_port, interval_s=0.01)
    b.add_target(3, "127.0.0.1", c.local_port, interval_s=0.01)
    assert wait_for(lambda: b.stats().ok >= 10)
    a.stop()  # off the thread: its probes stop, b's go on
    sent = a.stats().sent
    ok_b = b.stats().ok
    assert wait_for(lambda: b.stats().ok >= ok_b + 20)
    assert a.stats().sent == sent
    a.start()  # back on the same thread, with its targets
    assert wait_for(lambda: a.stats().sent >= sent + 10)
    assert engine_threads() == base + 1
    # the thread lives while an engine runs on it, whoever else holds it
    del thread
    gc.collect()
    a.close()
    ok_b = b.stats().ok
    assert wait_for(lambda: b.stats().ok >= ok_b + 20)
    b.stop()
    c.stop()  # the last one: the thread ends with it, and starts again with the next
    assert engine_threads() == base
    c.start()
    assert engine_threads() == base + 1
    b.close()
    c.close()
    assert engine_threads() == base


def test_thread_must_be_an_engine_thread():
    with pytest.raises(InvalidProbeSpec, match="thread"):
        Engine(thread="skh-engine")  # type: ignore[arg-type]


@pytest.mark.parametrize("shared", [True, False])
def test_an_agents_engines_share_one_thread_unless_told_not_to(shared):
    cfg = load_config(None, {"agent.engine_shared_thread": shared}).agent
    make = shared_engine_factory(cfg)
    base = engine_threads()
    engines = [make(EndpointSpec(rail=r, ip="127.0.0.1"), cfg) for r in range(3)]
    try:
        for eng in engines:
            eng.start()
        assert engine_threads() == base + (1 if shared else 3)
    finally:
        for eng in engines:
            eng.close()
