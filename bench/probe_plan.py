"""Probing as deployed (issue 17): the per-link probe plan (:mod:`skh.probeplan`) on the eval's
cluster, side by side with the flat policy (every ping pair at 10 probes/s on one path id), in one
run (:func:`skh.eval.plan.planned_probing` has the figures' definitions):

- the busiest container's probes/s under each, and the real agent process at each rate
  (:func:`skh.eval.agent_cost.agent_cost`: the real overlay agent process, its plan from a real
  controller, against a C responder on loopback; CPU % of one core, RSS and USS; the planned run
  rotates over the plan's most path ids), their ratio, and
  the paper's ~1 % of a core;
- skeleton links below the floor (10 probes/s) under each;
- ``ecmp_paths_covered_share``: (pair, ECMP path) probed within 10 s, switch hash drawn at random.

The ping pairs are every pair the eval's simulation has had by the end of its detection run (the
profile's jobs at the start plus the arrivals over the run), as ``skh eval`` counts them; the
fabric is the eval's scaled Lingjun topology.

    python bench/probe_plan.py [--profile quick|full] [--seed 1] [--agent-s 10] [--hash-seeds 20]
    python bench/probe_plan.py --quick     # the quick profile, 3 s agent runs, 5 hash draws

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

from skh.eval.agent_cost import agent_cost
from skh.eval.plan import planned_probing
from skh.eval.profiles import profile as get_profile
from skh.model import Fabric
from skh.sim import LINGJUN_TOPO
from skh.sim.scenario import Simulation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="full", choices=("tiny", "quick", "full"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--agent-s", type=float, default=10.0, help="seconds per agent run (0: skip)")
    ap.add_argument("--hash-seeds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="quick profile, short agent runs")
    args = ap.parse_args()
    if args.quick:
        args.profile, args.agent_s, args.hash_seeds = "quick", 3.0, 5
    prof = get_profile(args.profile)
    t0 = time.perf_counter()
    fabric = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=prof.hosts)
    sim = Simulation.build(
        fabric,
        prof.jobs,
        seed=args.seed,
        arrivals_per_min=prof.arrivals_per_min,
        probe_interval_s=prof.probe_interval_s,
    )
    # the job arrivals of the eval's field run (one seed), without its probes
    duration = int(prof.duration_s)
    for t in range(duration):
        sim._arrive(float(t))
    out = planned_probing(sim, fabric, seed=args.seed, hash_seeds=args.hash_seeds)
    out["regime"] = (
        f"eval profile {prof.name}: Lingjun scaled to {len(fabric.hosts)} hosts x "
        f"{fabric.rails} RNICs, {prof.jobs} jobs + arrivals over {duration} virtual s, seed "
        f"{args.seed}; default policy (budget 100/s sent and 100/s answered per endpoint, links >= "
        "10/s, path coverage "
        "0.995 within 10 s); switch hash uniform at random"
    )
    out["plan_s"] = round(time.perf_counter() - t0, 1)
    b = out["busiest_container"]
    b["ratio_planned_to_flat"] = round(b["planned_probes_per_s"] / b["flat_probes_per_s"], 3)
    if args.agent_s > 0:
        planned = agent_cost(
            b["planned_probes_per_s"],
            args.agent_s,
            paths=out["busiest_paths"],
            answers_per_s=b["planned_answers_per_s"],
        )
        flat = agent_cost(
            b["flat_probes_per_s"], args.agent_s, answers_per_s=b["flat_answers_per_s"]
        )
        out["agent"] = {"planned": planned, "flat": flat}
        if "error" not in planned and "error" not in flat:
            out["agent_cpu_pct_busiest"] = planned["cpu_pct_one_core"]
            out["agent_rss_mb_busiest"] = planned["rss_mb"]
            out["agent_cpu_pct_busiest_flat"] = flat["cpu_pct_one_core"]
            out["agent_cpu_ratio_planned_to_flat"] = round(
                planned["cpu_pct_one_core"] / max(flat["cpu_pct_one_core"], 1e-9), 3
            )
    out["ecmp_paths_covered_share_mean"] = out["ecmp_paths_covered_share"]["planned_mean"]
    out["paper_agent_cpu_pct"] = 1.0
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
