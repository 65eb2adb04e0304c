"""The chaos bench's quick profile (``bench/chaos.py --quick``) within the issue's bounds: real
daemons and agents of 4,096 endpoints, kill -9 of each daemon while alerts are open, a rogue
tenant, forged results and 100,000 malformed frames, all judged by state."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = tmp_path_factory.mktemp("chaos")
    done = subprocess.run(
        [sys.executable, "bench/chaos.py", "--quick", "--run-dir", str(run / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout)
    (run / "report.json").write_text(done.stdout)
    return out


def test_the_rogue_tenant_gets_nothing_it_asked_for_and_the_allowed_do(report):
    assert report["endpoints"] >= 4096
    assert report["rogue_ops_tried"] >= 10
    assert report["rogue_ops_accepted"] == 0, report["rogue_ops"]
    assert report["legit_ops_failed"] == 0, report["legit_ops"]
    assert report["forged_records_accepted"] == 0


def test_kills_lose_no_alert_and_leave_none_unresolved(report):
    assert report["daemon_crashes"] == 0, report["crashes"]
    kills = report["kills"]
    assert {k["daemon"] for k in kills} >= {"analyzer", "controller", "underlay", "overlay0"}
    assert all(n >= 1 for n in report["alerts_open_at_kills"]), kills
    assert report["lost_alerts"] == 0
    assert report["unresolved_after_restart"] == 0, kills
    assert report["not_recovered"] == 0, kills


def test_a_flood_of_malformed_frames_leaves_the_daemons_small_and_serving(report):
    flood = report["flood"]
    assert report["malformed_frames_sent"] >= 100_000
    assert flood["sent"]["blowup"] >= 3 and flood["sent"]["oversized"] >= 3
    assert flood["serving_after"]
    assert set(flood["peak_rss_mb"]) == {"controller", "analyzer"}
    assert report["peak_rss_mb_under_flood"] <= 512, flood["peak_rss_mb"]
