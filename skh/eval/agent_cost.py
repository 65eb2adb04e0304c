"""Agent cost: CPU and RSS of a real agent process probing at the skeleton's rate, measured by the
probe-overhead harness (``bench/probe_overhead.py``: the C engine in its own process against a
C responder in another, on loopback). Wall-clock measurements: never part of the deterministic
table."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["agent_cost"]

log = logging.getLogger(__name__)

_HARNESS = Path(__file__).resolve().parents[2] / "bench" / "probe_overhead.py"


def _harness() -> ModuleType | None:
    if not _HARNESS.is_file():
        return None
    spec = importlib.util.spec_from_file_location("skh_bench_probe_overhead", _HARNESS)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def agent_cost(rate_per_s: float, duration_s: float, *, paths: int = 1) -> dict[str, Any]:
    """Run one agent at ``rate_per_s`` probes/s for ``duration_s``, each target's probes rotating
    over ``paths`` path ids; its CPU % of one core and RSS. Returns ``{"error": ...}`` when the
    engine or the harness is not available here."""
    mod = _harness()
    if mod is None:
        return {"error": f"probe-overhead harness not found at {_HARNESS}"}
    try:
        with mod.responder(None, "127.0.0.1") as port:
            r = mod.c_agent(
                None, "127.0.0.1", port, float(rate_per_s), float(duration_s), paths=paths
            )
    except Exception as exc:  # noqa: BLE001 - a missing engine build is reported, not fatal
        log.warning("agent cost not measured: %s", exc)
        return {"error": str(exc)[-300:]}
    return {
        "rate_per_s": round(float(rate_per_s), 1),
        "duration_s": duration_s,
        "paths": paths,
        "probes": r["probes"],
        "answered": r["answered"],
        "cpu_pct_one_core": round(100.0 * r["cpu_s"] / r["wall_s"], 2) if r["wall_s"] else None,
        "rss_mb": round(r["rss_mb"], 1),
        "rss_anon_mb": round(r["rss_anon_mb"], 1),
        "net_rtt_us_p50": r["net_rtt_us"]["p50"],
        "path": "loopback",
    }
