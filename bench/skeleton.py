"""Traffic-skeleton inference: coverage, list size, inference time and sweep time.

Prints one JSON object:

* ``coverage``: used pairs (the simulator's ground truth) that the inferred lists probe, over a mix
  of simulated jobs (TP 4/8, PP 1–16, DP 2–64, EP and debug jobs, the simulator's noise, jitter,
  stragglers and co-tenant background); ``coverage_min_job`` is the worst job;
  ``coverage_generated_jobs`` the same over every job of each timing cluster below.
* ``list_ratio_vs_same_rail``: skeleton size / same-rail size for the paper's 512-GPU
  TP = PP = DP = 8 job (paper: 9 of 64 destinations); ``list_ratio_typical`` the same over all
  confident train jobs with PP ≥ 2, next to ``oracle_ratio_typical`` (the ground truth's own).
* ``infer_s``: RNIC count → CPU seconds (one thread; CPU time, since the machine may be shared)
  to infer every job of a cluster of that many RNICs (jobs drawn by
  ``skh.sim.jobs.generate_jobs``, 240 s of traffic each); ``infer_detail`` adds wall time, job
  and endpoint counts and the modes chosen.
* ``sweep_s``: RNIC count → seconds for one sweep of full mesh, same-rail and skeleton lists
  under the paper's model (each RNIC probes its list serially, one destination per second, so a
  sweep takes the longest list's length), next to the paper's numbers. Jobs: TP8 PP8 DP{8,16,32}.
* ``llmprism``: the same coverage and ratios for the union-find-over-co-occurring-bursts baseline.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # the goal is one core

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baselines.llmprism import llmprism_pairs  # noqa: E402

from skh.analysis.skeleton import infer_skeleton, pairs_coverage  # noqa: E402
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs  # noqa: E402
from skh.sim.jobs import HostPool, generate_jobs, make_job  # noqa: E402
from skh.sim.traffic import TrafficModel  # noqa: E402

PAPER_SWEEP_S = {
    512: {"full_mesh": 560.25, "same_rail": 64.85, "skeleton": 8.23},
    1024: {"full_mesh": 1123.43, "same_rail": 122.54, "skeleton": 16.91},
    2048: {"full_mesh": 2034.12, "same_rail": 240.54, "skeleton": 25.09},
}
DURATION_S = 240


def _series(jobs, seed: int) -> list[np.ndarray]:
    """Each job's (n, DURATION_S) throughput once every job trains (ready delays ≤ 10 min)."""
    model = TrafficModel(jobs, seed=seed)
    t0 = float(np.ceil(model.train_start.max())) + 1.0
    x = model.matrix(t0, DURATION_S)
    cuts = np.cumsum([j.n_endpoints for j in jobs])[:-1]
    return np.split(x, cuts)


def _infer(job, x):
    return infer_skeleton(job.ep_ids, job.host, job.rail, x, container=job.container, job=job.name)


def _mix_shapes(quick: bool):
    train = [
        (8, 1, 2),
        (8, 1, 32),
        (8, 2, 8),
        (8, 2, 32),
        (8, 4, 4),
        (8, 4, 16),
        (8, 8, 2),
        (8, 8, 8),
        (8, 16, 2),
        (8, 16, 4),
        (4, 4, 8),
        (4, 8, 4),
        (4, 2, 16),
    ]
    if not quick:
        train += [(8, 1, 64), (8, 4, 64), (8, 8, 16), (8, 16, 8), (4, 16, 2), (8, 2, 2)]
    other = [
        ("ep", (8, 4, 8, 2)),
        ("ep", (8, 2, 16, 4)),
        ("debug", (8, 1, 2, 1)),
        ("debug", (8, 2, 1, 1)),
    ]
    return [("train", (tp, pp, dp, 1)) for tp, pp, dp in train] + other


def accuracy(quick: bool, seed: int) -> dict:
    shapes = _mix_shapes(quick)
    hosts = sum(pp * dp for _, (_, pp, dp, _) in shapes) + 64
    cluster = Cluster(Fabric.from_params(hosts=hosts))
    pool = HostPool(cluster)
    rng = np.random.default_rng(seed)
    jobs = []
    for i, (kind, (tp, pp, dp, ep)) in enumerate(shapes):
        period = float(np.clip(rng.lognormal(np.log(15.0), 0.4), 5.0, 40.0))
        jobs.append(
            make_job(
                cluster,
                f"mix{i}",
                JobShape(tp, pp, dp, ep),
                kind=kind,
                pool=pool,
                iteration_s=period,
                seed=seed + i,
            )
        )
    series = _series(jobs, seed)
    used = covered = 0
    worst = 1.0
    typ_sk = typ_sr = typ_truth = 0
    base_cov = base_used = base_len = all_sr = 0
    per_job = []
    for job, x in zip(jobs, series, strict=True):
        sk = _infer(job, x)
        truth = job.skeleton_pairs
        sr = same_rail_pairs(job.ep_ids, job.rail, job.host).shape[0]
        cov = pairs_coverage(truth, sk.pairs)
        used += truth.shape[0]
        covered += round(cov * truth.shape[0])
        worst = min(worst, cov)
        if job.kind == "train" and job.shape.pp >= 2 and sk.confident:
            typ_sk += sk.pairs.shape[0]
            typ_sr += sr
            typ_truth += truth.shape[0]
        base = llmprism_pairs(job.ep_ids, job.host, job.rail, x)
        base_cov += round(pairs_coverage(truth, base) * truth.shape[0])
        base_used += truth.shape[0]
        base_len += base.shape[0]
        all_sr += sr
        s = job.shape
        per_job.append(
            {
                "shape": f"{job.kind} TP{s.tp} PP{s.pp} DP{s.dp}"
                + (f" EP{s.ep}" if s.ep > 1 else ""),
                "period_s": round(job.iteration_s, 1),
                "mode": sk.mode,
                "confidence": round(sk.confidence, 2),
                "coverage": round(cov, 5),
                "ratio": round(sk.pairs.shape[0] / max(sr, 1), 3),
                "oracle_ratio": round(truth.shape[0] / max(sr, 1), 3),
            }
        )
    return {
        "coverage": covered / max(used, 1),
        "coverage_min_job": worst,
        "list_ratio_typical": typ_sk / max(typ_sr, 1),
        "oracle_ratio_typical": typ_truth / max(typ_sr, 1),
        "jobs": per_job,
        "llmprism": {
            "coverage": base_cov / max(base_used, 1),
            "list_ratio_vs_same_rail_all": base_len / max(all_sr, 1),
        },
    }


def sweep(seed: int) -> tuple[dict, float, dict]:
    out = {}
    ratio_512 = 0.0
    base_512 = {}
    for n_rnics, dp in ((512, 8), (1024, 16), (2048, 32)):
        cluster = Cluster(Fabric.from_params(hosts=n_rnics // 8))
        job = make_job(cluster, "sweep", JobShape(8, 8, dp), iteration_s=15.0, seed=seed)
        (x,) = _series([job], seed)
        sk = _infer(job, x)
        sr = same_rail_pairs(job.ep_ids, job.rail, job.host)
        longest = int(np.bincount(sk.pairs[:, 0].astype(np.int64) - int(job.ep_ids[0])).max())
        out[str(n_rnics)] = {
            "full_mesh": n_rnics - 1,
            "same_rail": n_rnics // 8 - 1,
            "skeleton": longest,
            "skeleton_mode": sk.mode,
            "skeleton_coverage": pairs_coverage(job.skeleton_pairs, sk.pairs),
            "paper": PAPER_SWEEP_S[n_rnics],
        }
        if n_rnics == 512:
            ratio_512 = sk.pairs.shape[0] / sr.shape[0]
            base = llmprism_pairs(job.ep_ids, job.host, job.rail, x)
            base_512 = {
                "coverage": pairs_coverage(job.skeleton_pairs, base),
                "list_ratio_vs_same_rail": base.shape[0] / sr.shape[0],
            }
    return out, ratio_512, base_512


def timing(n_rnics: int, seed: int) -> dict:
    cluster = Cluster(Fabric.from_params(hosts=n_rnics // 8))
    # ~2.5 hosts per job (the paper: 40K endpoints over ~2K jobs); asking a little more than fits
    # makes generate_jobs halve the largest until the cluster is full
    jobs = generate_jobs(cluster, max(1, n_rnics // 16), seed=seed, lifetime_median_s=1e9)
    series = _series(jobs, seed)
    t, c = time.perf_counter(), time.process_time()
    sks = [_infer(job, x) for job, x in zip(jobs, series, strict=True)]
    cpu, wall = time.process_time() - c, time.perf_counter() - t
    modes: dict[str, int] = {}
    used = covered = 0
    for job, sk in zip(jobs, sks, strict=True):
        modes[sk.mode] = modes.get(sk.mode, 0) + 1
        used += job.skeleton_pairs.shape[0]
        covered += round(pairs_coverage(job.skeleton_pairs, sk.pairs) * job.skeleton_pairs.shape[0])
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "jobs": len(jobs),
        "rnics": int(sum(j.n_endpoints for j in jobs)),
        "modes": modes,
        "coverage": covered / max(used, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="smaller mix, no 40,960-RNIC point (< 60 s)"
    )
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    acc = accuracy(args.quick, args.seed)
    sweep_s, ratio_512, base_512 = sweep(args.seed)
    sizes = (512, 2048, 16384) if args.quick else (512, 2048, 16384, 40960)
    timings = {str(n): timing(n, args.seed) for n in sizes}
    llm = dict(acc.pop("llmprism"))
    llm["tp8_pp8_dp8"] = base_512
    result = {
        "coverage": acc["coverage"],
        "coverage_min_job": acc["coverage_min_job"],
        "coverage_generated_jobs": {k: v["coverage"] for k, v in timings.items()},
        "list_ratio_vs_same_rail": ratio_512,
        "list_ratio_paper": 9 / 64,
        "list_ratio_typical": acc["list_ratio_typical"],
        "oracle_ratio_typical": acc["oracle_ratio_typical"],
        "infer_s": {k: v["cpu_s"] for k, v in timings.items()},
        "infer_detail": timings,
        "infer_goal_s": {"40960": 10.0},
        "sweep_s": sweep_s,
        "sweep_model": "one destination per second per RNIC; a sweep lasts the longest list",
        "llmprism": llm,
        "jobs": acc["jobs"],
        "quick": args.quick,
        "bench_wall_s": time.perf_counter() - t_all,
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
