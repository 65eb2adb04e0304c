"""skh.eval.agent_cost over several agent runs: the median run is the result, every run's CPU
is kept and shown; a failed run is an error, not a figure. The harness (bench/agent_process.py)
is replaced by a stand-in whose runs cost what the test says."""

from __future__ import annotations

from types import SimpleNamespace

from skh.eval import agent_cost as ac
from skh.eval.report import _agent_cpu


def _fake(cpus: list[float]) -> SimpleNamespace:
    left = list(cpus)

    def measure(rate, duration_s, *, paths, endpoints, inbound_rate=None):
        cpu = left.pop(0)
        if cpu < 0:
            raise RuntimeError("engine not built")
        return {
            "duration_s": duration_s,
            "probes_per_s": rate,
            "inbound_probes_per_s": rate,
            "inbound_phases": "spread",
            "engine_per_s": {"wakeups": 100.0},
            "cpu_pct_one_core": cpu,
            "bare_floor_cpu_pct": 1.0,
            "rss_mb": 20.0 + cpu,  # tells which run's other figures came along
            "rss_anon_mb": 1.0,
            "uss_mb": 1.0,
            "pss_mb": 1.0,
            "rss_by_mapping_mb": {},
            "rss_imports_mb": {},
        }

    return SimpleNamespace(measure=measure)


def test_the_median_run_is_the_result_and_every_run_is_kept(monkeypatch):
    monkeypatch.setattr(ac, "_harness", lambda: _fake([2.59, 1.84, 2.1]))
    r = ac.agent_cost(800, 20, paths=45, runs=3)
    assert r["cpu_pct_one_core"] == 2.1
    assert r["rss_mb"] == 22.1  # the median run's figures, not a mix of runs
    assert r["cpu_pct_runs"] == [2.59, 1.84, 2.1] and r["runs"] == 3
    assert _agent_cpu(r) == "2.10 (1.84–2.59, 3 runs)"


def test_one_run_reads_as_before(monkeypatch):
    monkeypatch.setattr(ac, "_harness", lambda: _fake([1.5]))
    r = ac.agent_cost(800, 10)
    assert r["cpu_pct_one_core"] == 1.5 and r["cpu_pct_runs"] == [1.5]
    assert _agent_cpu(r) == "1.50"


def test_a_failed_run_is_an_error_not_a_median_of_the_rest(monkeypatch):
    monkeypatch.setattr(ac, "_harness", lambda: _fake([2.0, -1.0, 2.2]))
    r = ac.agent_cost(800, 10, runs=3)
    assert r == {"error": "engine not built"}
