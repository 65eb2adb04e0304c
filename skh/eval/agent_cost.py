"""Agent cost: CPU and memory of the real overlay agent process (``skh agent --role overlay``)
probing at the busiest container's planned rate, as ``bench/agent_process.py`` runs it: a real
controller hands it its ping list and probe plan, its engines (one per endpoint) probe a C
responder on loopback, its results go to a sink. Wall-clock measurements: never part of the
deterministic table."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["agent_cost"]

log = logging.getLogger(__name__)

_HARNESS = Path(__file__).resolve().parents[2] / "bench" / "agent_process.py"


def _harness() -> ModuleType | None:
    if not _HARNESS.is_file():
        return None
    spec = importlib.util.spec_from_file_location("skh_bench_agent_process", _HARNESS)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def agent_cost(
    rate_per_s: float,
    duration_s: float,
    *,
    paths: int = 1,
    endpoints: int = 8,
    answers_per_s: float | None = None,
    runs: int = 1,
) -> dict[str, Any]:
    """The agent with ``endpoints`` endpoints probing ``rate_per_s`` in all for ``duration_s``,
    each pair rotating over ``paths`` path ids, and answering ``answers_per_s`` probes from its
    peers (None: as many as it sends):
    its CPU % of one core, VmRSS (``rss_mb``, and where it is: ``rss_by_mapping_mb``,
    ``rss_imports_mb``), own memory (``uss_mb``: what one more sidecar on a host costs; shared
    library pages count once per host) and the probe rate it reached. ``{"error": ...}`` when
    the engine or the harness is not available here. With ``runs`` > 1 the agent is measured
    that many times, each a fresh agent, and the run of the median CPU is the result
    (``cpu_pct_runs``: every run's, in order): on a small shared machine runs of the same code
    spread by a quarter (1.84-2.59 % in session 32's 20-40 s runs at the busiest container's
    rate), so one short run decides little."""
    mod = _harness()
    if mod is None:
        return {"error": f"agent-process harness not found at {_HARNESS}"}
    got = []
    for _ in range(max(1, runs)):
        try:
            got.append(
                mod.measure(
                    float(rate_per_s),
                    float(duration_s),
                    paths=paths,
                    endpoints=endpoints,
                    inbound_rate=None if answers_per_s is None else float(answers_per_s),
                )
            )
        except Exception as exc:  # noqa: BLE001 - a missing engine build is reported, not fatal
            log.warning("agent cost not measured: %s", exc)
            return {"error": str(exc)[-300:]}
    r = sorted(got, key=lambda x: x["cpu_pct_one_core"])[len(got) // 2]
    return {
        "rate_per_s": round(float(rate_per_s), 1),
        "duration_s": r["duration_s"],
        "paths": paths,
        "endpoints": endpoints,
        "probes_per_s": r["probes_per_s"],
        "inbound_probes_per_s": r["inbound_probes_per_s"],
        # the peers' probes one by one, as independent peers send them (bench/agent_process.py)
        "inbound_phases": r["inbound_phases"],
        "engine_wakeups_per_s": r["engine_per_s"]["wakeups"],
        "cpu_pct_one_core": r["cpu_pct_one_core"],
        "runs": len(got),
        "cpu_pct_runs": [x["cpu_pct_one_core"] for x in got],
        # the agent's datagrams at a bare C engine's cost, measured beside it: for scale
        "bare_floor_cpu_pct": r["bare_floor_cpu_pct"],
        "rss_mb": r["rss_mb"],
        "rss_anon_mb": r["rss_anon_mb"],
        "uss_mb": r["uss_mb"],
        "pss_mb": r["pss_mb"],
        "rss_by_mapping_mb": r["rss_by_mapping_mb"],
        "rss_imports_mb": r["rss_imports_mb"],
        "path": "real overlay agent process, loopback UDP",
    }
