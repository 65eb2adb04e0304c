"""A CLOCK_REALTIME step during a probe: kernel software stamps are CLOCK_REALTIME, so a step
between T2 and T5 would be in the RTT. The engine reads the realtime clock's offset from the
monotonic one at T1 and when it reads ACK1; a changed offset marks the record INVALID (never an
RTT). The step is simulated for one process by an LD_PRELOAD shim of clock_gettime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skh.records import ProbeStatus

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def shim(tmp_path_factory, c_builder) -> Path:
    return c_builder(
        tmp_path_factory.mktemp("step"), "clockstep", [str(HERE / "clockstep_shim.c")], "-ldl"
    )


def run(env_extra: dict) -> dict:
    out = subprocess.run(
        [sys.executable, str(HERE / "clockstep_run.py")],
        capture_output=True,
        text=True,
        env={**os.environ, **env_extra},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_a_stepped_realtime_clock_invalidates_the_probes_it_fell_into(shim):
    # +5 s and back every 100 ms; answers come 30 ms late: about 30 % of probes see a step
    res = run(
        {"LD_PRELOAD": str(shim), "SKH_STEP_PERIOD_NS": "100000000", "SKH_STEP_NS": "5000000000"}
    )
    status = res["status"]
    invalid = status.count(ProbeStatus.INVALID)
    assert len(status) == 100
    assert res["clock_steps"] == invalid
    assert 12 <= invalid <= 50, status  # binomial(100, 0.3): mean 30, sd 4.6
    assert status.count(ProbeStatus.OK) == 100 - invalid
    # no RTT carries a 5 s step (the Python responder's user-clock stamps put its scheduling, ms
    # on a busy machine, into these RTTs)
    assert max(r for r, s in zip(res["rtt"], status, strict=True) if s == ProbeStatus.OK) < 1e9


def test_without_a_step_nothing_is_invalid():
    res = run({})
    assert res["status"] == [ProbeStatus.OK] * 100 and res["clock_steps"] == 0
