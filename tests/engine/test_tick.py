"""The engine's wake-ups (docs/engine.md, "Wake-ups"): the tick (at most one wake-up per tick,
what arrived meanwhile handled together, RTTs that do not move) and the wall-clock grid
(engines everywhere send in step, so peers' probes arrive together)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from skh.errors import InvalidProbeSpec
from skh.probe import MAX_TICK_S
from skh.records import ProbeStatus, TsSource

sys.path.insert(0, str(Path(__file__).parent))
from skhe_helpers import assert_accounted, quiesce, wait_for  # noqa: E402

TICK_S = 0.005
TARGETS = 10
INTERVAL_S = 0.025  # 400 probes/s in all


def _spread_prober(make_engine, port: int, count: int, **kw):
    """A prober whose targets' phases are spread over the interval (no batching), so the
    responder gets the probes one by one, as from independent peers."""
    prober = make_engine(batch_window_s=0.0, **kw)
    prober.start()
    for k in range(TARGETS):
        prober.add_target(k, "127.0.0.1", port, interval_s=INTERVAL_S, count=count)
        time.sleep(INTERVAL_S / TARGETS)
    return prober


def _answered(prober, n: int) -> np.ndarray:
    assert wait_for(lambda: prober.stats().decided >= n, timeout_s=15), prober.stats()
    return prober.drain()


def test_a_ticking_responder_wakes_once_per_tick_and_its_rtts_do_not_move(make_engine):
    count = 80  # per target: 2 s at 400 probes/s
    plain = make_engine()
    ticking = make_engine(tick_s=TICK_S)
    assert ticking.tick_s == TICK_S  # kernel stamps: the tick applies
    plain.start(), ticking.start()
    w0 = ticking.stats().wakeups
    t0 = time.monotonic()
    probers = [_spread_prober(make_engine, r.local_port, count) for r in (plain, ticking)]
    rows = [_answered(p, TARGETS * count) for p in probers]
    elapsed = time.monotonic() - t0
    s = ticking.stats()
    assert s.probes_received == TARGETS * count
    # one wake-up per tick at most (a probe every 2.5 ms: one per probe without the tick)
    assert s.wakeups - w0 <= elapsed / TICK_S + 5, (s.wakeups - w0, elapsed)
    assert s.wakeups - w0 <= 0.6 * s.probes_received, s
    ok = []
    for r in rows:
        assert len(r) == TARGETS * count
        good = r[r["status"] == ProbeStatus.OK]
        assert len(good) >= 0.98 * len(r), np.unique(r["status"], return_counts=True)
        assert (good["ts_source"] == TsSource.KERNEL).all()
        ok.append(good)
    # the same answers: the tick's wait is the responder's (ACK1 left later), never the network's
    plain_rtt, tick_rtt = (np.median(g["rtt_ns"]) for g in ok)
    assert tick_rtt < 200_000, (plain_rtt, tick_rtt)  # loopback: µs, not the tick's ms
    assert np.median(ok[1]["responder_delay_ns"]) > 5 * tick_rtt, ok[1]["responder_delay_ns"]
    for eng in (*probers, plain, ticking):
        assert_accounted(quiesce(eng))


def test_the_tick_is_not_applied_to_user_clock_stamps(make_engine):
    # user-clock stamps are read when a datagram is read: a tick's wait would be in the RTT
    count = 20
    responder = make_engine(tick_s=TICK_S, kernel_timestamps=False)
    assert responder.tick_s == 0.0
    responder.start()
    prober = _spread_prober(make_engine, responder.local_port, count, kernel_timestamps=False)
    rows = _answered(prober, TARGETS * count)
    ok = rows[rows["status"] == ProbeStatus.OK]
    assert len(ok) >= 0.95 * len(rows) and (ok["ts_source"] == TsSource.USER).all()
    assert np.median(ok["rtt_ns"]) < 1_000_000, np.median(ok["rtt_ns"])  # not ~2.5 ms


def test_tick_validation(make_engine):
    with pytest.raises(InvalidProbeSpec, match="'tick_s' parameter of Engine"):
        make_engine(tick_s=-1e-3)
    with pytest.raises(InvalidProbeSpec, match="at most"):
        make_engine(tick_s=MAX_TICK_S * 2)
    assert make_engine(tick_s=MAX_TICK_S).tick_s == MAX_TICK_S


def test_wall_grid_engines_send_in_step_on_the_wall_clock(make_engine):
    # engines with their own clocks' random grid origins send at their own phases; on the wall
    # clock's grid every engine's batches leave at wall-clock multiples of the interval
    interval_ns, n = 100_000_000, 5
    sink = make_engine()  # never started: the probes are only sent (and recorded lost)
    probers = [make_engine(wall_grid=True, timeout_s=0.05) for _ in range(3)]
    for p in probers:
        p.start()
        p.add_target(1, "127.0.0.1", sink.local_port, interval_s=interval_ns / 1e9, count=n)
        time.sleep(0.037)  # added at different phases
    for p in probers:
        assert wait_for(lambda p=p: p.stats().decided >= n, timeout_s=5), p.stats()
    phases = []
    for p in probers:
        rows = p.drain()
        assert len(rows) == n
        later = rows[rows["seq"] > 0]["t_wall_ns"]  # the first probe leaves at once
        phases += [int(t % interval_ns) for t in later]
    off = [min(ph, interval_ns - ph) for ph in phases]
    assert max(off) < 10_000_000, sorted(off)  # random phases: 12 within 10 ms by chance ~1e-8


def test_wall_grid_validation(make_engine):
    with pytest.raises(InvalidProbeSpec, match="'wall_grid' parameter of Engine"):
        make_engine(wall_grid=True, batch_window_s=0.0)


def test_agent_config_sets_the_engines_tick_and_grid():
    from skh.errors import ConfigError
    from skh.orchestrator.agent_overlay import default_engine_factory
    from skh.orchestrator.config import EndpointSpec, load_config
    from skh.policy import ENGINE_TICK_S

    spec = EndpointSpec(rail=0, ip="127.0.0.1")
    cases = (({}, ENGINE_TICK_S, False), ({"agent.engine_tick_s": 0.002}, 0.002, False))
    cases += (({"agent.engine_tick_s": 0.0}, 0.0, False),)
    cases += (({"agent.engine_wall_grid": True}, ENGINE_TICK_S, True),)
    for over, tick_s, wall_grid in cases:
        eng = default_engine_factory(spec, load_config(None, over).agent)
        try:
            assert (eng.tick_s, eng.wall_grid) == (tick_s, wall_grid)
        finally:
            eng.close()
    for bad in (-0.001, 0.01):
        with pytest.raises(ConfigError, match="agent.engine_tick_s"):
            load_config(None, {"agent.engine_tick_s": bad})
    # the settings' limit is the engine's own: an agent that passes the check starts its engines
    from skh.policy import MAX_ENGINE_TICK_S

    assert MAX_ENGINE_TICK_S == MAX_TICK_S
    eng = default_engine_factory(spec, load_config(None, {"agent.engine_tick_s": MAX_TICK_S}).agent)
    eng.close()
