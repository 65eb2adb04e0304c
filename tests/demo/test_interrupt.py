"""``skh demo`` stopped by a signal mid-run (Ctrl-C, systemd, ``timeout``, a CI runner's
SIGTERM) still tears its testbed down: its daemons run in sessions of their own and its
namespaces outlive the process, so a plain exit would leave them behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from demo_helpers import leftovers  # noqa: E402

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.system,
    pytest.mark.timeout(240),
]

#: another prefix than the demo e2e test's, so a leftover of one never passes for the other's
PREFIX = os.environ.get("SKH_TESTBED_PREFIX", "skhd")[:5] + "i"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_mid_run_tears_the_testbed_down(tmp_path, sig):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    out = tmp_path / "report"
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "skh",
            "demo",
            "--prefix",
            PREFIX,
            "--port-base",
            str(25000 + (os.getpid() % 400) * 20),
            "--faults",
            "link_down",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 150
        # the daemons are up (in namespaces, in sessions of their own): the worst time to vanish
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "controller and analyzer up" in line:
                break
        assert any("controller and analyzer up" in x for x in lines), "".join(lines)
        assert leftovers(PREFIX, out / "run")["netns"], "the testbed should be up by now"
        demo.send_signal(sig)
        rest, _ = demo.communicate(timeout=90)
        lines.append(rest)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
            subprocess.run(
                [sys.executable, "-m", "skh", "testbed", "--prefix", PREFIX, "down"],
                cwd=ROOT,
                check=False,
            )
    text = "".join(lines)
    assert demo.returncode == 128 + sig, text
    assert f"interrupted by {sig.name}" in text, text
    assert leftovers(PREFIX, out / "run") == {"links": [], "netns": [], "processes": []}, text
    # what the run had is kept for a report: logs and the last state
    assert (out / "run" / "state.json").exists(), text
