"""Traffic-skeleton inference on the jobs people run, under every rank-hint regime.

Prints one JSON object. Counters are assumed sampled at ``sample_hz`` (10 Hz: the underlay agent
reads VF byte counters that fast; see ``counter_cost`` in ``bench/probe_overhead.py``-style
figures in the report) over ``window_s`` seconds of training. Every job runs in the simulator
(:mod:`skh.sim.traffic`: per-replica pipeline schedules, shared partner bursts, loaders,
checkpoints, background) on seeds derived from ``--seed`` (default 1). Seeds 1, 11 and 31 were
looked at while the method was changed (session 7: the one-replica chain; 31 showed a silent
miss that was fixed), and 57 in session 29 (two silent misses: a contradicted rank hint's
partners, fixed); 4 and 73 only measured.

Keys:

* ``coverage_min``: the minimum, over every job of the mix and every hint regime and every job
  of the 40K-RNIC cluster (pod-order hints), of the share of the job's used pairs (the
  simulator's ground truth) that the inferred list probes; ``silent_misses``: (job, regime)
  cases whose coverage is below 1.0 while the mode claims a confident skeleton (each listed in
  ``silent_miss_cases``).
* ``list_ratio_vs_truth``: per hint regime (``pod_order``: pod ordinals in training-rank order;
  ``registration_order``: containers in the order they became ready; ``none``; ``shuffled``:
  pod ordinals unrelated to ranks), ``p50``/``p90``/``max`` of list size / ground-truth size
  over the job mix; ``list_ratio_vs_truth_1hz`` the same at 1 Hz for comparison.
* ``list_ratio_vs_same_rail``: one TP = PP = DP = 8 job (512 GPUs), pod-order hint, list size /
  same-rail size (paper: 9/64 = 0.14); ``paper_list_ratio``.
* ``infer_s_40k_rnics``: CPU seconds (one thread) to infer every job of a 40,960-RNIC cluster
  drawn by ``skh.sim.jobs.generate_jobs``; ``infer_detail`` has wall time, job and endpoint
  counts, modes and coverage, and the machine's load average while it ran (CPU time on a shared
  machine runs longer than on an idle one). ``--against REV`` also times the skeleton package of
  git revision ``REV`` on the same jobs, each job's two inferences back to back in alternating
  order (same load for both): ``infer_against`` has its CPU seconds and how many jobs' results
  (mode, digest, reason) differ.
* ``field`` (with ``--field-draws N``): the coverage over N draws of the quick evaluation's own
  job population (190 jobs on 384 Lingjun hosts, each inferred as ``skh eval`` infers it),
  ``coverage_min_draw`` the worst draw's (CI's skeleton-coverage gate, 0.999, reads one draw),
  and every job missing pairs. Session 14: CI's draw 75919706 failed the gate on one MoE job;
  41 draws before its fix missed that job alone, none after.
* ``jobs``: per job of the mix and hint regime: shape, traffic regime, mode, hint outcome,
  coverage and ratio; ``hint_outcomes`` counts them per regime.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # the goal is one core

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from skh.analysis.skeleton import infer_skeleton, pairs_coverage  # noqa: E402
from skh.model import Cluster, Fabric, JobShape, same_rail_pairs  # noqa: E402
from skh.sim.jobs import HostPool, SimJob, generate_jobs, make_job  # noqa: E402
from skh.sim.traffic import TrafficModel  # noqa: E402

SAMPLE_HZ = 10.0
WINDOW_S = 240
WINDOWS = 2  # consecutive windows; the second's inference carries the first's evidence
HINTS = ("pod_order", "registration_order", "none", "shuffled")

#: traffic regimes of the mix (keywords of TrafficModel)
REGIMES: dict[str, dict] = {
    "default": {},
    "jitter20": {"jitter": 0.2, "straggler_p": 0.2},
    "contention": {"contention_bytes_per_s": 5e8},
    "checkpoint": {"checkpoint_every_s": (120.0, 200.0), "checkpoint_s": (20.0, 40.0)},
    "heavy_p2p": {"pp_share": (0.5, 1.0)},
}


@dataclass(frozen=True)
class Spec:
    """One job of the mix: ``shape`` is (tp, pp, dp, ep); ``plan`` extra make_job keywords."""

    name: str
    kind: str
    shape: tuple[int, int, int, int]
    regime: str = "default"
    plan: dict = field(default_factory=dict)
    period_s: float = 15.0
    share_hosts: bool = False  # two such jobs on the two halves of the same hosts


def mix(quick: bool) -> list[Spec]:
    out = [
        Spec("megatron 1F1B", "train", (8, 2, 8, 1), "default", period_s=12.0),
        Spec("megatron 1F1B", "train", (8, 4, 8, 1), "jitter20", period_s=18.0),
        Spec("megatron 1F1B", "train", (8, 8, 4, 1), "contention", period_s=22.0),
        Spec("megatron 1F1B", "train", (8, 4, 16, 1), "heavy_p2p", period_s=16.0),
        Spec("megatron interleaved", "train", (8, 4, 8, 1), "default", {"vpp": 2}, 14.0),
        Spec("megatron interleaved", "train", (8, 8, 4, 1), "checkpoint", {"vpp": 2}, 20.0),
        Spec("zero-3/fsdp", "fsdp", (1, 1, 32, 1), "default", {"rnics": 8}, 9.0),
        Spec("zero-3/fsdp", "fsdp", (1, 1, 64, 1), "jitter20", {"rnics": 8}, 11.0),
        Spec("tp2 in 8-rnic containers", "train", (2, 4, 16, 1), "default", {"rnics": 8}, 15.0),
        Spec("tp4 in 8-rnic containers", "train", (4, 2, 16, 1), "contention", {"rnics": 8}, 13.0),
        Spec("tp4, two stages a container", "train", (4, 4, 1, 1), "default", {"rnics": 8}, 10.0),
        Spec("context parallel", "train", (8, 2, 4, 1), "checkpoint", {"cp": 2}, 17.0),
        Spec("moe expert parallel", "ep", (8, 2, 8, 4), "default", period_s=19.0),
        Spec("moe expert parallel", "ep", (8, 1, 16, 8), "jitter20", period_s=12.0),
        Spec(
            "4-rnic containers, shared hosts",
            "train",
            (4, 2, 4, 1),
            "default",
            {"rnics": 4},
            11.0,
            True,
        ),  # fmt: skip
        Spec(
            "4-rnic containers, shared hosts",
            "train",
            (4, 2, 4, 1),
            "heavy_p2p",
            {"rnics": 4},
            13.0,
            True,
        ),  # fmt: skip
        Spec("data parallel", "train", (8, 1, 16, 1), "checkpoint", period_s=10.0),
        Spec("pipeline only", "train", (8, 4, 1, 1), "jitter20", period_s=16.0),
        # stages s and s + 3 of a 1F1B pipeline send in the same phase (a backward is two
        # forwards): at 10 Hz they once read as two replicas of fewer stages
        Spec("pipeline only", "train", (8, 8, 1, 1), "default", period_s=26.0),
    ]
    if not quick:
        out += [
            Spec("megatron 1F1B", "train", (8, 2, 32, 1), "jitter20", period_s=25.0),
            Spec("megatron 1F1B", "train", (8, 16, 2, 1), "default", period_s=30.0),
            Spec("megatron interleaved", "train", (8, 4, 4, 1), "contention", {"vpp": 2}, 9.0),
            Spec("tp2 in 8-rnic containers", "train", (2, 2, 32, 1), "jitter20", {"rnics": 8}),
            Spec("context parallel", "train", (8, 4, 2, 1), "heavy_p2p", {"cp": 2}, 21.0),
            Spec("moe expert parallel", "ep", (8, 4, 8, 2), "contention", period_s=16.0),
        ]
    return out


def _place(specs: list[Spec], seed: int) -> list[tuple[Spec, SimJob]]:
    """Each job on its own small cluster; jobs that share hosts share one."""
    out: list[tuple[Spec, SimJob]] = []
    shared: tuple[Cluster, HostPool] | None = None
    for i, sp in enumerate(specs):
        tp, pp, dp, ep = sp.shape
        gpus = tp * pp * dp * sp.plan.get("cp", 1)
        hosts = max(2, gpus // sp.plan.get("rnics", tp))
        if sp.share_hosts:
            if shared is None:
                c = Cluster(Fabric.from_params(hosts=hosts))
                shared = (c, HostPool(c))
            cluster, pool = shared
        else:
            cluster = Cluster(Fabric.from_params(hosts=hosts))
            pool = HostPool(cluster)
        job = make_job(
            cluster,
            f"mix{i}",
            JobShape(tp, pp, dp, ep),
            kind=sp.kind,  # type: ignore[arg-type]
            pool=pool,
            iteration_s=sp.period_s,
            seed=seed * 1000 + i,
            **sp.plan,
        )
        out.append((sp, job))
    return out


def _hint(job: SimJob, regime: str, rng: np.random.Generator) -> np.ndarray | None:
    n_cont = int(job.container.max()) + 1
    if regime == "pod_order":
        return job.container
    if regime == "registration_order":
        ready = job.ready_s[:: job.plan.rnics] + rng.uniform(0, 1e-3, n_cont)
        return np.argsort(np.argsort(ready))[job.container]
    if regime == "shuffled":
        return rng.permutation(n_cont)[job.container]
    return None


def _window(
    jobs: list[SimJob], seed: int, hz: float, regime: str, windows: int = WINDOWS
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per job, per consecutive window: (bytes through each endpoint, bytes sent) per sample."""
    model = TrafficModel(jobs, seed=seed, sample_hz=hz, **REGIMES[regime])
    t0 = float(np.ceil(model.train_start.max())) + 1.0
    cuts = np.cumsum([j.n_endpoints for j in jobs])[:-1]
    out: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in jobs]
    for w in range(windows):
        tx, rx = model.window(t0 + w * WINDOW_S, int(WINDOW_S * hz))
        for i, (a, b) in enumerate(zip(np.split(tx + rx, cuts), np.split(tx, cuts), strict=True)):
            out[i].append((a, b))
    return out


def _infer(job: SimJob, windows, hz: float, hint):
    """Inference over consecutive windows, each window's evidence carried into the next."""
    sk = None
    for x, tx in windows:
        sk = infer_skeleton(
            job.ep_ids, job.host, job.rail, x, tx_bytes=tx, sample_hz=hz, container=hint,
            job=job.name, prior=sk,
        )  # fmt: skip
    return sk


def _q(v: list[float]) -> dict[str, float]:
    a = np.asarray(v, np.float64)
    return {
        "p50": round(float(np.quantile(a, 0.5)), 3),
        "p90": round(float(np.quantile(a, 0.9)), 3),
        "max": round(float(a.max()), 3),
    }


def accuracy(quick: bool, seed: int) -> dict:
    placed = _place(mix(quick), seed)
    rng = np.random.default_rng(seed)
    # traffic: jobs sharing hosts in one model (their RNICs are apart), the others alone
    series: dict[tuple[int, float], list[tuple[np.ndarray, np.ndarray]]] = {}
    for hz in (SAMPLE_HZ, 1.0):
        groups: dict[tuple, list[int]] = {}
        for i, (sp, _) in enumerate(placed):
            groups.setdefault(("shared",) if sp.share_hosts else (i,), []).append(i)
        for members in groups.values():
            # one traffic regime per model: shared jobs each take theirs from their own model
            for i in members:
                xs = _window([placed[k][1] for k in members], seed * 7919 + i, hz,
                             placed[i][0].regime)  # fmt: skip
                series[(i, hz)] = xs[members.index(i)]
    rows, ratios, ratios_1hz = [], {h: [] for h in HINTS}, {h: [] for h in HINTS}
    cov_min, silent, outcomes = 1.0, [], {h: {} for h in HINTS}
    for i, (sp, job) in enumerate(placed):
        truth = job.skeleton_pairs
        same_rail = same_rail_pairs(job.ep_ids, job.rail, job.host).shape[0]
        for h in HINTS:
            hint = _hint(job, h, rng)
            for hz, store in ((SAMPLE_HZ, ratios), (1.0, ratios_1hz)):
                sk = _infer(job, series[(i, hz)], hz, hint)  # fmt: skip
                cov = pairs_coverage(truth, sk.pairs)
                ratio = sk.pairs.shape[0] / max(truth.shape[0], 1)
                store[h].append(ratio)
                if hz != SAMPLE_HZ:
                    continue
                cov_min = min(cov_min, cov)
                outcomes[h][sk.hint] = outcomes[h].get(sk.hint, 0) + 1
                if cov < 1.0 and sk.confident:
                    silent.append({"job": i, "hint": h, "coverage": round(cov, 4)})
                s = job.shape
                rows.append(
                    {
                        "job": i,
                        "what": sp.name,
                        "shape": f"{job.kind} TP{s.tp} PP{s.pp} DP{s.dp}"
                        + (f" EP{s.ep}" if s.ep > 1 else "")
                        + (f" CP{job.plan.cp}" if job.plan.cp > 1 else "")
                        + (f" VPP{job.plan.vpp}" if job.plan.vpp > 1 else "")
                        + f" ({job.plan.rnics}-RNIC containers)",
                        "regime": sp.regime,
                        "hint": h,
                        "mode": sk.mode,
                        "hint_outcome": sk.hint,
                        "stages": sk.n_stages,
                        "coverage": round(cov, 4),
                        "ratio": round(ratio, 3),
                        "oracle_vs_same_rail": round(truth.shape[0] / max(same_rail, 1), 3),
                        "pp_paired": round(sk.scores.get("pp_paired", 1.0), 3),
                    }
                )
    return {
        "coverage_min": cov_min,
        "silent_misses": len(silent),
        "silent_miss_cases": silent,
        "list_ratio_vs_truth": {h: _q(v) for h, v in ratios.items()},
        "list_ratio_vs_truth_1hz": {h: _q(v) for h, v in ratios_1hz.items()},
        "hint_outcomes": outcomes,
        "jobs": rows,
    }


def paper_job(seed: int) -> dict:
    cluster = Cluster(Fabric.from_params(hosts=64))
    job = make_job(cluster, "paper", JobShape(8, 8, 8), iteration_s=15.0, seed=seed * 1000 + 999)
    (windows,) = _window([job], seed, SAMPLE_HZ, "default")
    sk = _infer(job, windows, SAMPLE_HZ, job.container)
    sr = same_rail_pairs(job.ep_ids, job.rail, job.host).shape[0]
    return {
        "list_ratio_vs_same_rail": round(sk.pairs.shape[0] / sr, 4),
        "mode": sk.mode,
        "hint_outcome": sk.hint,
        "coverage": pairs_coverage(job.skeleton_pairs, sk.pairs),
    }


def _against(rev: str):
    """``infer_skeleton`` of the skeleton package at git revision ``rev``, imported apart from
    this tree's (its modules renamed; the rest of ``skh`` is this tree's)."""
    root = Path(__file__).resolve().parent.parent
    pkg = "skh/analysis/skeleton"
    name = f"_skeleton_{rev.replace('/', '_').replace('~', '_').replace('^', '_')}"
    files = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:{pkg}"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    dst = Path(tempfile.mkdtemp(prefix="skh-against-")) / name
    dst.mkdir()
    for f in files:
        if f.endswith(".py"):
            text = subprocess.run(
                ["git", "show", f"{rev}:{pkg}/{f}"],
                cwd=root, check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            (dst / f).write_text(text.replace("skh.analysis.skeleton", name))
    sys.path.insert(0, str(dst.parent))
    return importlib.import_module(name).infer_skeleton


def _full_shape(job: SimJob) -> str:
    """Every dimension of a job's layout, for the cases a run names."""
    s, p = job.shape, job.plan
    return (
        f"{job.kind} TP{s.tp} PP{s.pp} DP{s.dp} EP{s.ep} CP{p.cp} VPP{p.vpp} "
        f"({p.rnics}-RNIC containers)"
    )


def timing(n_rnics: int, seed: int, against=None) -> dict:
    cluster = Cluster(Fabric.from_params(hosts=n_rnics // 8))
    # ~2.5 hosts per job (the paper: 40K endpoints over ~2K jobs); asking a little more than fits
    # makes generate_jobs halve the largest until the cluster is full
    jobs = generate_jobs(cluster, max(1, n_rnics // 20), seed=seed, lifetime_median_s=1e9)
    cpu = wall = cpu_against = 0.0
    differ = 0
    modes: dict[str, int] = {}
    used = covered = 0
    cov_min, silent = 1.0, []
    load0 = os.getloadavg()[0]
    for i, job in enumerate(jobs):
        ((x, tx),) = _window([job], seed, SAMPLE_HZ, "default", windows=1)[0]
        args = (job.ep_ids, job.host, job.rail, x)
        kw = {"tx_bytes": tx, "sample_hz": SAMPLE_HZ, "container": job.container}
        if against is not None and i % 2:
            c = time.process_time()
            other = against(*args, **kw)
            cpu_against += time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        sk = infer_skeleton(*args, **kw)
        cpu += time.process_time() - c
        wall += time.perf_counter() - t
        if against is not None and not i % 2:
            c = time.process_time()
            other = against(*args, **kw)
            cpu_against += time.process_time() - c
        if against is not None:
            differ += (other.mode, other.digest, other.reason) != (sk.mode, sk.digest, sk.reason)
        modes[sk.mode] = modes.get(sk.mode, 0) + 1
        used += job.skeleton_pairs.shape[0]
        cov = pairs_coverage(job.skeleton_pairs, sk.pairs)
        covered += round(cov * job.skeleton_pairs.shape[0])
        cov_min = min(cov_min, cov)
        if cov < 1.0 and sk.confident:
            silent.append(
                {
                    "job": job.name,
                    "shape": _full_shape(job),
                    "coverage": round(cov, 4),
                }
            )
    out = {
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        # one-minute load averages at the start and the end, and the cores
        "load": [round(load0, 2), round(os.getloadavg()[0], 2), os.cpu_count()],
        "jobs": len(jobs),
        "rnics": int(sum(j.n_endpoints for j in jobs)),
        "modes": modes,
        "coverage": covered / max(used, 1),
        # these jobs (generate_jobs' mix, pod-order hints, one window) count too
        "coverage_min": round(cov_min, 4),
        "silent_misses": len(silent),
        "silent_miss_cases": silent,
    }
    if against is not None:
        out["against"] = {"cpu_s": round(cpu_against, 2), "jobs_differ": differ}
    return out


def field(draws: int, seed: int) -> dict:
    """Coverage over ``draws`` draws of the quick evaluation's own job population (the field
    profile's cluster and job count, each job inferred as the eval infers it, from its first
    ``skeleton_s`` of counters with its pod-order hint): the population CI's skeleton-coverage
    gate samples one draw of. A job missing pairs there fails the gate (0.999) on its own."""
    from skh.eval import THRESHOLDS
    from skh.eval.field import infer_job
    from skh.eval.profiles import profile
    from skh.sim import LINGJUN_TOPO

    prof = profile("quick")
    fabric = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=prof.hosts)
    rng = np.random.default_rng(seed)
    seeds = [int(s) for s in rng.integers(1, 2**31 - 1, draws)]
    jobs = used = covered = 0
    worst, misses = 1.0, []
    for s in seeds:
        cluster = Cluster(fabric)
        drawn = generate_jobs(
            cluster, prof.jobs, seed=s, pool=HostPool(cluster), start_s=(-1800, 0)
        )
        d_used = d_cov = 0
        for job in drawn:
            sk = infer_job(job, s, prof.skeleton_s)
            cov = pairs_coverage(job.skeleton_pairs, sk.pairs)
            n = job.skeleton_pairs.shape[0]
            d_used += n
            d_cov += round(cov * n)
            if cov < 1.0:
                misses.append(
                    {
                        "seed": s,
                        "job": job.name,
                        "shape": _full_shape(job),
                        "mode": sk.mode,
                        "coverage": round(cov, 4),
                    }
                )
        jobs += len(drawn)
        used += d_used
        covered += d_cov
        worst = min(worst, d_cov / max(d_used, 1))
    return {
        "draws": draws,
        "seeds": seeds,
        "jobs": jobs,
        "coverage": round(covered / max(used, 1), 6),
        # the gate's figure, per draw: its worst
        "coverage_min_draw": round(worst, 6),
        "gate": THRESHOLDS["skeleton_coverage"],
        "jobs_missing_pairs": misses,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the smaller job mix")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--against", metavar="REV", help="also time the skeleton package of git revision REV"
    )
    ap.add_argument(
        "--field-draws",
        type=int,
        default=0,
        metavar="N",
        help="also the coverage over N draws of the quick eval's job population (~3-5 s each)",
    )
    args = ap.parse_args(argv)
    if args.field_draws < 0:
        ap.error(f"--field-draws must be 0 or more, not {args.field_draws}")
    t_all = time.perf_counter()
    acc = accuracy(args.quick, args.seed)
    paper = paper_job(args.seed)
    big = timing(40960, args.seed, _against(args.against) if args.against else None)
    result = {
        "sample_hz": SAMPLE_HZ,
        "window_s": WINDOW_S,
        # over the job mix and the 40K-RNIC cluster's jobs alike
        "coverage_min": min(acc["coverage_min"], big["coverage_min"]),
        "silent_misses": acc["silent_misses"] + big["silent_misses"],
        "silent_miss_cases": acc["silent_miss_cases"] + big["silent_miss_cases"],
        "coverage_min_mix": acc["coverage_min"],
        "silent_misses_mix": acc["silent_misses"],
        "list_ratio_vs_truth": acc["list_ratio_vs_truth"],
        "list_ratio_vs_truth_1hz": acc["list_ratio_vs_truth_1hz"],
        "list_ratio_vs_same_rail": paper["list_ratio_vs_same_rail"],
        "paper_job": paper,
        "paper_list_ratio": round(9 / 64, 4),
        "infer_s_40k_rnics": big["cpu_s"],
        "infer_detail": big,
        "infer_goal_s": 10.0,
        "infer_against": {"rev": args.against, **big.pop("against")} if args.against else None,
        "field": field(args.field_draws, args.seed) if args.field_draws else None,
        "hint_outcomes": acc["hint_outcomes"],
        "jobs": acc["jobs"],
        "seed": args.seed,
        "quick": args.quick,
        "bench_wall_s": round(time.perf_counter() - t_all, 1),
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
