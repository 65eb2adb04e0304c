"""bench/agent_transports.py, briefly: both transports' engines, made by the agent's factory,
probe and answer at the planned rate in one process with their peers, and the verbs side finds
the stand-in's NIC thread (so its CPU is not counted as the agent's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from skh.policy import ENGINE_TICK_S

ROOT = Path(__file__).resolve().parents[2]


def test_both_transports_probe_and_answer_at_the_planned_rate():
    rate = 320.0
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench/agent_transports.py"), "--runs", "1"]
        + ["--duration", "3", "--rate", str(rate), "--peers", "4", "--paths", "6"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for transport in ("udp", "verbs"):
        run = got[transport]["runs"][0]
        assert 0.8 * rate <= run["probes_per_s"] <= 1.2 * rate, (transport, run)
        assert 0.8 * rate <= run["answered_per_s"] <= 1.2 * rate, (transport, run)
        assert run["lost_per_s"] == 0, (transport, run)
        assert 0 < run["wakeups_per_s"] <= 1 / ENGINE_TICK_S + 10, (transport, run)  # its tick
    assert got["udp"]["runs"][0]["nic_thread_cpu_pct"] is None
    assert got["verbs"]["runs"][0]["nic_thread_cpu_pct"] is not None
