"""Localization on the simulator: accuracy per fault type and time to localize one fault.

Builds a simulated cluster (default 4,096 hosts × 8 RNICs, 2,000 jobs, skeleton ping lists),
injects every fault type of the simulator (the paper's 19, agent crash, late agent, a vswitch
loop) ``--trials`` times, one at a time, plus every pair of an endpoint-side and a fabric fault at
once, and localizes each from the suspect detection would raise, built from the fault's ground
truth (``skh.sim.oracle``: an ORACLE diagnostic, not the pipeline's view). A fault is right when
the verdicts name exactly its component(s), with certainty. Faults whose pairs all fail harder
because of the other fault of a pair are "masked" (undetectable) and not scored.

``e2e_*``: the same fault types on a smaller running simulation, detected by the real detector
(``skh.analysis.detect``) and localized from its events; accuracy over the detected ones.

Time: ``localize_ms`` is the localizer's own time for one fault, with the time the simulator
spends answering its questions (the stand-in for traceroutes and dumps on agents) taken out;
``with_source_ms`` includes it. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skh.eval.localization import end_to_end_suite, localization_suite  # noqa: E402
from skh.model import Fabric  # noqa: E402
from skh.sim.scenario import Simulation  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--trials", type=int, default=10, help="faults per type")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-both-layers", action="store_true")
    ap.add_argument("--e2e-hosts", type=int, default=64, help="cluster of the end-to-end run")
    ap.add_argument(
        "--e2e-trials", type=int, default=2, help="faults per type, end to end (0: skip)"
    )
    ap.add_argument("--quick", action="store_true", help="512 hosts, 250 jobs, 3 trials per type")
    a = ap.parse_args(argv)
    if a.quick:
        a.hosts, a.jobs, a.trials, a.e2e_trials = 512, 250, 3, 1
    t0 = time.perf_counter()
    fabric = Fabric.from_params(
        hosts=a.hosts, rnics_per_host=8, hosts_per_segment=16, spines=a.spines, cores=1
    )
    sim = Simulation.build(fabric, n_jobs=a.jobs, seed=a.seed)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = localization_suite(sim, trials=a.trials, both_layers=not a.no_both_layers, seed=a.seed)
    suite_s = time.perf_counter() - t1
    scored = [r for r in res if not r["masked"]]
    single = [r for r in scored if "+" not in r["label"]]
    both = [r for r in scored if "+" in r["label"]]
    per_type: dict[str, list[bool]] = defaultdict(list)
    for r in single:
        per_type[r["label"]].append(r["ok"])
    ms = np.array([r["localize_ms"] for r in res]) if res else np.zeros(1)
    ms_src = np.array([r["with_source_ms"] for r in res]) if res else np.zeros(1)
    out = {
        "hosts": a.hosts,
        "rnics": a.hosts * 8,
        "endpoints": len(sim.cluster.endpoints),
        "ping_pairs": int(sim.pairs.shape[0]),
        "faults": len(res),
        "scored": len(scored),
        "masked": len(res) - len(scored),
        "accuracy": round(sum(r["ok"] for r in scored) / max(1, len(scored)), 4),
        "accuracy_single": round(sum(r["ok"] for r in single) / max(1, len(single)), 4),
        "accuracy_both_layers": round(sum(r["ok"] for r in both) / max(1, len(both)), 4),
        "accuracy_per_type": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_type.items())},
        "worst_type_accuracy": round(
            min((sum(v) / len(v) for v in per_type.values()), default=0.0), 3
        ),
        "localize_ms_p50": round(float(np.percentile(ms, 50)), 2),
        "localize_ms_p99": round(float(np.percentile(ms, 99)), 2),
        "localize_ms_max": round(float(ms.max()), 2),
        "with_source_ms_p50": round(float(np.percentile(ms_src, 50)), 2),
        "with_source_ms_p99": round(float(np.percentile(ms_src, 99)), 2),
        "affected_pairs_p50": float(np.median([r["pairs"] for r in res])) if res else 0.0,
        "misses": [
            {"label": r["label"], "truth": r["truth"], "verdicts": r["verdicts"]}
            for r in scored
            if not r["ok"]
        ][:10],
        "build_s": round(build_s, 2),
        "suite_s": round(suite_s, 2),
    }
    if a.e2e_trials > 0:
        out.update(_end_to_end(a))
    print(json.dumps(out))
    return 0


def _end_to_end(a: argparse.Namespace) -> dict:
    """The same faults detected by the real detector on a running simulation, then localized."""
    fabric = Fabric.from_params(
        hosts=a.e2e_hosts, rnics_per_host=8, hosts_per_segment=8, spines=4, cores=1
    )
    sim = Simulation.build(
        fabric, n_jobs=max(4, a.e2e_hosts // 3), seed=a.seed + 5, start_s=(-120.0, 0.0)
    )
    t0 = time.perf_counter()
    res = end_to_end_suite(sim, trials=a.e2e_trials, seed=a.seed)
    det = [r for r in res if r["detected"]]
    per_type: dict[str, list[bool]] = defaultdict(list)
    for r in det:
        per_type[r["label"]].append(r["ok"])
    return {
        "e2e_hosts": a.e2e_hosts,
        "e2e_faults": len(res),
        "e2e_detected": len(det),
        "e2e_accuracy": round(sum(r["ok"] for r in det) / max(1, len(det)), 4),
        "e2e_accuracy_per_type": {
            k: round(sum(v) / len(v), 3) for k, v in sorted(per_type.items())
        },
        "e2e_time_to_detect_s_mean": round(float(np.mean([r["ttd_s"] for r in det])), 2)
        if det
        else None,
        "e2e_time_to_verdict_s_mean": round(float(np.mean([r["ttl_s"] for r in det])), 2)
        if det
        else None,
        "e2e_misses": [
            {"label": r["label"], "truth": r["truth"], "verdicts": r["verdicts"]}
            for r in det
            if not r["ok"]
        ],
        "e2e_s": round(time.perf_counter() - t0, 2),
    }


if __name__ == "__main__":
    raise SystemExit(main())
