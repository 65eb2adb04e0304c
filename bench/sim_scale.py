"""Wall time and peak memory of the simulator at the paper's scale.

Simulates ``--minutes`` of a ``--hosts`` × 8-RNIC cluster (the real Lingjun topology, pods
replicated) with ``--jobs`` jobs probing their ground-truth skeletons at 1 probe/s per pair, with
random faults at raised rates, and consumes every probe and counter batch (as an analyzer
would: counts by status). Side by side in one run, the same cluster probing the same-rail
preload lists instead (``--compare-preload``; bounded to ``--preload-seconds``) shows what the
skeleton saves; ``--stress`` adds ~600K preload pairs of 250 big jobs for 60 s (the vectorized
path at ten times the skeleton's pair count). Prints one JSON object.

Goal (issue 5): ≤ 60 s and ≤ 4 GiB on one core for 10 min, 4,096 hosts, 2,000 jobs.
"""

from __future__ import annotations

import os

# one core: keep numpy's helpers from spreading (set before numpy loads)
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from skh.model import Fabric  # noqa: E402
from skh.records import ProbeStatus  # noqa: E402
from skh.sim import LINGJUN_TOPO  # noqa: E402
from skh.sim.scenario import Simulation  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _run(sim: Simulation, seconds: int) -> dict:
    probes = counters = beats = events = 0
    status = np.zeros(8, np.int64)
    rtt_sum = 0.0
    t = time.perf_counter()
    for st in sim.run(seconds):
        p = st.probes
        probes += p.size
        status += np.bincount(p["status"], minlength=8)[:8]
        rtt_sum += float(p["rtt_ns"][p["status"] == ProbeStatus.OK].sum())
        counters += st.counters.size
        beats += st.heartbeats.size
        events += len(st.events)
    wall = time.perf_counter() - t
    ok = int(status[ProbeStatus.OK])
    return {
        "sim_wall_s": round(wall, 3),
        "virtual_s": seconds,
        "probes": probes,
        "probes_per_wall_s": round(probes / wall) if wall > 0 else None,
        "lost": int(status[ProbeStatus.LOST]),
        "unreachable": int(status[ProbeStatus.UNREACHABLE]),
        "mean_rtt_us": round(rtt_sum / ok / 1000, 3) if ok else None,
        "counter_rows": counters,
        "heartbeats": beats,
        "fault_events": events,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--fault-rate-scale",
        type=float,
        default=300.0,
        help="multiplier on the per-server-year fault rates (default: a few faults per 10 min)",
    )
    ap.add_argument(
        "--compare-preload", action="store_true", help="also time same-rail preload probing"
    )
    ap.add_argument("--preload-seconds", type=int, default=30)
    ap.add_argument(
        "--stress",
        action="store_true",
        help="also probe the same-rail preload lists of 250 big jobs (~600K pairs) for 60 s",
    )
    ap.add_argument("--quick", action="store_true", help="512 hosts, 250 jobs, 1 minute")
    args = ap.parse_args(argv)
    if args.quick:
        args.hosts, args.jobs, args.minutes = 512, 250, 1.0
    seconds = int(round(args.minutes * 60))

    t0 = time.perf_counter()
    fabric = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=args.hosts)
    sim = Simulation.build(fabric, args.jobs, seed=args.seed)
    faults = sim.inject_random(float(seconds), rate_scale=args.fault_rate_scale)
    build_s = time.perf_counter() - t0
    res = _run(sim, seconds)
    wall = time.perf_counter() - t0
    out = {
        "bench": "sim_scale",
        "quick": args.quick,
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(_rss_mb(), 1),
        "build_s": round(build_s, 3),
        "hosts": len(fabric.hosts),
        "rnics": len(fabric.hosts) * fabric.rails,
        "jobs": len(sim.jobs),
        "endpoints": len(sim.cluster.endpoints),
        "skeleton_pairs": int(sim.pairs.shape[0]),
        "faults_injected": len(faults),
        "skeleton": res,
        "goal": {"wall_s": 60, "peak_rss_mb": 4096},
    }
    if args.compare_preload:
        pre = Simulation(sim.cluster, sim.jobs, seed=args.seed, ping="same_rail", pool=sim.pool)
        out["preload_pairs"] = int(pre.pairs.shape[0])
        out["preload"] = _run(pre, args.preload_seconds)
        out["peak_rss_mb_after_preload"] = round(_rss_mb(), 1)
    if args.stress:
        t1 = time.perf_counter()
        big = Simulation.build(
            fabric,
            250,
            seed=args.seed,
            ping="same_rail",
            job_kw={"size_weights": {8: 0.3, 16: 0.4, 32: 0.3}},
        )
        big.inject_random(60.0, rate_scale=args.fault_rate_scale * 10)
        out["stress_build_s"] = round(time.perf_counter() - t1, 3)
        out["stress_pairs"] = int(big.pairs.shape[0])
        out["stress"] = _run(big, 60)
        out["peak_rss_mb_after_stress"] = round(_rss_mb(), 1)
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
