"""The evaluation: the paper's tables on the simulator, side by side with the paper's numbers.

One run (:func:`run_eval`) builds the real Lingjun topology scaled to the profile's host count
(8 RNICs each), places a job mix, and measures:

1. **skeleton** — coverage of used pairs and list size of the inferred skeletons of every job
   (``infer_skeleton`` on each job's simulated throughput), against the simulator's ground truth;
2. **detection** — the streaming :class:`~skh.analysis.detect.Detector` fed the simulation second
   by second (probes, heartbeats, retired containers under job churn) while every fault type is
   injected ``rounds`` times, one at a time with a gap, on a component a live job's probed pair
   crosses; scored by :mod:`skh.eval.scoring`; plus **end-to-end localization** of each
   detected fault (:func:`skh.eval.localization.e2e_localization`): rounds over the 30 s after
   its first detection, each localizing every suspect detection raised so far (false ones and
   other faults' included) from the simulated agents' noisy answers, scored on the alerts open
   at the last round, component and type;
3. **localization** — :func:`skh.eval.localization.localization_suite` (oracle: the localizer
   fed the suspect detection would raise for one fault, or one fault in each layer at once),
   per type and layer;
4. **random sampling** — which of the detection run's faults a Pingmesh-style random pinglist
   with the skeleton's per-endpoint budget would have probed across at all;
5. **probing cost** — :func:`skh.eval.probing.sweep_table`;
6. **probing as deployed** — :func:`skh.eval.plan.planned_probing`: the controller's probe plan
   for every ping pair the run had (busiest container's rate, links below the floor, ECMP paths
   covered within 10 s), against the flat policy the simulator probes with;
7. **agent cost** — :func:`skh.eval.agent_cost.agent_cost` at the busiest container's planned
   rate, rotating over the plan's path ids (:data:`AGENT_RUNS` fresh agents, the median shown),
   and at its flat skeleton rate beside it (wall-clock, so kept out of the deterministic table).

The deterministic part of the result is ``table`` (same seed → same table); wall-clock figures
live in ``measured`` and ``timings``. Each seed's field run (sections 2, 4 and, for the first
seed, 1, 6 and the agent rates), the ramps, the oracle localization (3) and the probing sweep
(5) are independent stages: :func:`run_stages` runs them in worker processes and merges them by
name, so the table is the same for any number of workers; the agent cost (7) is measured after
the workers are gone.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from skh.analysis.detect import DetectorConfig
from skh.analysis.skeleton import pairs_coverage
from skh.eval.agent_cost import agent_cost
from skh.eval.field import (
    COUNTER_HZ,
    field_run,
    infer_job,
    inferred_pairs,
    projection,
    ramp_scenario,
)
from skh.eval.localization import e2e_localization, localization_suite
from skh.eval.plan import planned_probing
from skh.eval.probing import random_sample_pairs, sweep_table
from skh.eval.profiles import Profile
from skh.eval.scoring import detection_scores, match_events, summarize, wilson
from skh.eval.stagestore import StageStore, code_id
from skh.failures import FailureType
from skh.model import Fabric, same_rail_pairs
from skh.probeplan import ProbePolicy
from skh.sim import LINGJUN_TOPO
from skh.sim.answers import answers_measured, live_pairs
from skh.sim.faults import FAULT_SPECS, RowSet
from skh.sim.noise import REGIMES, TRAIN_SEEDS, regime
from skh.sim.scenario import Simulation

__all__ = ["run_eval", "THRESHOLDS", "MAXIMA", "PAPER", "commit_id", "draw_seeds"]

log = logging.getLogger(__name__)

#: what CI requires of the quick profile's point estimates (issue 13), at least ...
THRESHOLDS: dict[str, float] = {
    "precision": 0.98,
    "recall": 0.98,
    "e2e_localization_accuracy": 0.95,
    "e2e_type_accuracy": 0.90,
    "skeleton_coverage": 0.999,
}
#: real agent processes measured at the busiest container's rate, the median reported: runs of
#: the same code on a shared 2-core machine spread by a quarter (skh.eval.agent_cost)
AGENT_RUNS = 3
#: ... and at most
MAXIMA: dict[str, float] = {"fp_per_1k_host_hours": 0.5}
#: the paper's headline figures (shared/notes/paper.md §1)
PAPER: dict[str, float] = {
    "precision": 0.982,
    "recall": 0.993,
    "localization_accuracy": 0.957,
    "ttd_mean_s": 8.0,
    "agent_cpu_pct": 1.0,
    "agent_rss_mb": 35.0,
}


def commit_id() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


# ------------------------------------------------------------------------------------ skeleton


def skeleton_section(sim: Simulation, seed: int, duration_s: int) -> dict[str, Any]:
    used = covered = sk_len = sr_len = 0
    worst, worst_job = 1.0, ""
    modes: dict[str, int] = {}
    for job in sim.jobs:
        sk = infer_job(job, seed, duration_s)
        truth = job.skeleton_pairs
        cov = pairs_coverage(truth, sk.pairs)
        used += truth.shape[0]
        covered += int(round(cov * truth.shape[0]))
        if cov < worst:
            worst, worst_job = cov, job.name
        modes[sk.mode] = modes.get(sk.mode, 0) + 1
        sk_len += sk.pairs.shape[0]
        sr_len += same_rail_pairs(job.ep_ids, job.rail, job.host).shape[0]
    return {
        "jobs": len(sim.jobs),
        "used_pairs": used,
        "coverage": round(covered / max(used, 1), 6),
        "coverage_min_job": round(worst, 6),
        "coverage_min_job_name": worst_job if worst < 1.0 else "",
        "modes": dict(sorted(modes.items())),
        "list_pairs": sk_len,
        "same_rail_pairs": sr_len,
        "list_ratio_vs_same_rail": round(sk_len / max(sr_len, 1), 4),
        "paper_list_ratio_example": round(9 / 64, 4),
        "traffic_s": duration_s,
        "counter_hz": COUNTER_HZ,
    }


# ----------------------------------------------------------------------------------- detection


def _reaffect(sim: Simulation, rec: Any) -> Any:
    """``rec`` with the ping pairs its fault touches (on a path id they probe) among every pair
    probed by the end of the run that was probing at some time while the fault was on: those of
    jobs that arrived after it began included, those of jobs that had ended before it began, or
    began after it ended, not (they were listed, and overstated what could be observed)."""
    from dataclasses import replace

    p, n = sim.pairs, sim.n_path_ids
    rows = RowSet.all_paths(sim.index, sim.eps, p, n)
    f = sim.faults[rec.fault_id]
    hit = sim.engine.affected(f, rows) & sim.rows_in_use()
    pairs = p[hit.reshape(n, -1).any(axis=0)].astype(np.int64)
    ready = np.maximum(sim.ep_ready_s[pairs[:, 0]], sim.ep_ready_s[pairs[:, 1]])
    end = np.minimum(sim.ep_end_s[pairs[:, 0]], sim.ep_end_s[pairs[:, 1]])
    during = (ready < f.end_s) & (end > f.start_s)
    return replace(rec, affected_pairs=pairs[during].astype(p.dtype))


def _eps_of(sim: Simulation, records) -> dict[int, set[int]]:
    out = {}
    for r in records:
        if r.target == "container":
            c = sim.eps.container_id(r.component)
            out[r.fault_id] = set(np.flatnonzero(sim.eps.container == c).tolist())
    return out


def random_sampling(sim: Simulation, records, seed: int) -> dict[str, Any]:
    """Faults a random pinglist with the skeleton's budget would probe across, next to the
    probed skeleton's (structural: does any live probed pair cross the faulty component while
    it is on), over the field run's faults — overlapping and gray ones included."""
    pairs = []
    for j in sim.jobs:
        if not j.skeleton_pairs.size:
            continue
        src = j.skeleton_pairs[:, 0].astype(np.int64) - int(j.ep_ids[0])
        deg = np.bincount(src, minlength=j.n_endpoints)
        pairs.append(random_sample_pairs(j.ep_ids, j.rail, j.host, deg, seed))
    rnd = np.concatenate(pairs) if pairs else np.zeros((0, 2), np.uint32)
    n_pid = sim.n_path_ids
    rows = RowSet.all_paths(sim.index, sim.eps, rnd, n_pid)
    per_type: dict[str, list[tuple[bool, bool]]] = {}
    for rec in records:
        t = rec.start_s + 1.0
        hit = sim.engine.affected(sim.faults[rec.fault_id], rows).reshape(n_pid, -1).any(axis=0)
        sk = live_pairs(sim, rec.affected_pairs, t).size > 0
        per_type.setdefault(rec.type.name, []).append((sk, live_pairs(sim, rnd[hit], t).size > 0))
    alls = [x for v in per_type.values() for x in v]
    return {
        "random_pairs": int(rnd.shape[0]),
        "skeleton_pairs": int(sim.pairs.shape[0]),
        # the pairs jobs really use that each list probes at all
        "used_pairs_probed": round(pairs_coverage(sim.skeleton_pairs(), rnd), 4),
        "used_pairs_probed_skeleton": round(pairs_coverage(sim.skeleton_pairs(), sim.pairs), 4),
        "faults": len(alls),
        "skeleton_visible": round(sum(s for s, _ in alls) / max(1, len(alls)), 4),
        "random_visible": round(sum(r for _, r in alls) / max(1, len(alls)), 4),
        "per_type": {
            k: {
                "n": len(v),
                "skeleton": round(sum(s for s, _ in v) / len(v), 3),
                "random": round(sum(r for _, r in v) / len(v), 3),
            }
            for k, v in sorted(per_type.items())
        },
    }


def _gray_curves(records, gray: dict, detected: dict) -> dict[str, Any]:
    """Detection rate of gray faults per kind, magnitude and flow share."""
    cells: dict[tuple[str, float, str], list[bool]] = {}
    for r in records:
        g = gray.get(r.fault_id)
        if g is None:
            continue
        kind, mag, paths = g
        scope = "one flow of four" if paths else "all flows"
        cells.setdefault((kind, mag, scope), []).append(bool(detected.get(r.fault_id)))
    out: dict[str, list] = {}
    for (kind, mag, scope), v in sorted(cells.items()):
        label = f"{mag * 100:g}% loss" if kind == "loss" else f"+{mag / 1e3:g} us"
        out.setdefault(kind, []).append(
            {"magnitude": label, "flows": scope, "faults": len(v), "detected": sum(v)}
        )
    return out


def _healthy_host_h(sim: Simulation, records, duration_s: float) -> float:
    """Host-hours of the run outside every fault's reach (hosts its pairs touch, while on)."""
    hosts = len(sim.index.host_names)
    busy = 0.0
    for r in records:
        eps = np.unique(np.asarray(r.affected_pairs, np.int64))
        n_h = np.unique(sim.eps.host[eps]).size if eps.size else 0
        busy += n_h * (min(r.end_s, duration_s) - r.start_s) / 3600.0
    return max(0.0, hosts * duration_s / 3600.0 - busy)


def _overlap(records) -> dict[str, Any]:
    ev = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    cur = peak = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    over = sum(
        any(o is not r and o.start_s < r.end_s and r.start_s < o.end_s for o in records)
        for r in records
    )
    return {"max_concurrent": peak, "overlapping_share": round(over / max(1, len(records)), 3)}


def seed_run(
    fabric: Fabric, profile: Profile, seed: int, regime: Any, *, first: bool = False
) -> dict[str, Any]:
    """One seed of the field scenario: the cluster with its noise, probed along the inferred
    skeleton, the fault plan, detection scored, end-to-end localization, the random list.
    Picklable (a worker process returns it): the simulation itself stays here. ``first``: also
    the sections read off the first seed's cluster as the run left it (``sim0``: skeleton
    coverage, agent rates, the probe plan)."""
    sim = Simulation.build(
        fabric,
        profile.jobs,
        seed=seed,
        arrivals_per_min=profile.arrivals_per_min,
        probe_interval_s=profile.probe_interval_s,
        probe_policy=ProbePolicy(interval_s=profile.probe_interval_s),
        noise=regime,
        ping=inferred_pairs(seed, profile.skeleton_s),
    )
    t0 = time.process_time()
    run = field_run(sim, profile, seed)
    cpu = time.process_time() - t0
    # jobs that arrived after a fault began probe across it too: its pairs, as of the end
    run["records"] = [_reaffect(sim, r) for r in run["records"]]
    window_ns = int(DetectorConfig().window_s * 1e9)
    eps_of = _eps_of(sim, run["records"])
    gray = set(run["gray"])
    masked = {r.fault_id for r in run["records"] if sim.engine.masked(r.fault_id)}
    run["masked"] = sorted(masked)
    det = detection_scores(
        run["records"],
        run["events"],
        window_ns,
        eps_of,
        ignore=gray,
        invisible_are_misses=True,
        masked=masked,
    )
    _, detected = match_events(run["records"], run["events"], window_ns, eps_of)
    e2e = e2e_localization(sim, run, detected, skip=gray | masked)
    non_gray = [r for r in run["records"] if r.fault_id not in gray]
    new = [r for r in non_gray if r.fault_id in run["new_job"] and FAULT_SPECS[r.type].in_paper]
    out = {
        "seed": seed,
        "eps_of": eps_of,
        # the rounds' inputs stay here: the merge reads records, events and the scores
        "run": {k: v for k, v in run.items() if k not in ("ticks", "views")},
        "detection": det,
        "e2e": e2e,
        "gray": _gray_curves(run["records"], run["gray"], detected),
        "new_job": {"faults": len(new), "detected": sum(bool(detected[r.fault_id]) for r in new)},
        "random": random_sampling(sim, run["records"], seed),
        "overlap": _overlap(non_gray),
        "healthy_host_h": _healthy_host_h(sim, non_gray, run["virtual_s"]),
        "host_h": len(sim.index.host_names) * run["virtual_s"] / 3600.0,
        "noise": sim.noise_measured(),
        # what the simulated agents' answers to localization had of noise
        "answers": answers_measured(sim),
        "cpu_s": round(cpu, 1),
    }
    out["first_ttd"] = [
        (rec.type.name, (ev.detected_ns - rec.start_ns) / 1e9) for rec, ev in _first_events(out)
    ]
    if first:
        out["sim0"] = {
            "skeleton": skeleton_section(sim, seed, profile.skeleton_s),
            "rates": _container_rates(sim),
            "plan": planned_probing(sim, fabric, seed=seed),
            "ping_pairs": int(sim.pairs.shape[0]),
            "probe_interval_s": sim.probe_interval_s,
        }
    return out


# -------------------------------------------------------------------------------- localization


def localization_section(fabric: Fabric, profile: Profile, seed: int) -> dict[str, Any]:
    sim = Simulation.build(
        fabric,
        profile.jobs,
        seed=seed,
        probe_interval_s=profile.probe_interval_s,
        probe_policy=ProbePolicy(interval_s=profile.probe_interval_s),
    )
    res = localization_suite(
        sim,
        trials=profile.loc_trials,
        types=profile.types,
        both_layers=profile.loc_both_layers,
        seed=seed,
    )
    scored = [r for r in res if not r["masked"]]

    def in_paper(label: str) -> bool:
        return all(FAULT_SPECS[FailureType[x]].in_paper for x in label.split("+"))

    per_type: dict[str, list[bool]] = {}
    per_layer: dict[str, list[bool]] = {}
    for r in scored:
        if "+" in r["label"]:
            continue
        per_type.setdefault(r["label"], []).append(r["ok"])
        per_layer.setdefault(FAULT_SPECS[FailureType[r["label"]]].layer, []).append(r["ok"])
    head = [r["ok"] for r in scored if in_paper(r["label"])]
    single = [r["ok"] for r in scored if "+" not in r["label"] and in_paper(r["label"])]
    both = [r["ok"] for r in scored if "+" in r["label"] and in_paper(r["label"])]

    def acc(v: list[bool]) -> float | None:
        return round(sum(v) / len(v), 4) if v else None

    return {
        "faults": len(res),
        "scored": len(scored),
        "masked": len(res) - len(scored),
        "accuracy": acc(head),
        "accuracy_single": acc(single),
        "accuracy_both_layers": acc(both),
        "both_layer_cases": len(both),
        "per_type": {
            k: {"n": len(v), "accuracy": acc(v)}
            for k, v in sorted(per_type.items(), key=lambda kv: FailureType[kv[0]])
        },
        "per_layer": {k: {"n": len(v), "accuracy": acc(v)} for k, v in sorted(per_layer.items())},
        "misses": [
            {"label": r["label"], "truth": r["truth"], "verdicts": r["verdicts"][:4]}
            for r in scored
            if not r["ok"]
        ][:12],
    }


# ---------------------------------------------------------------------------------------- run


def _container_rates(sim: Simulation) -> tuple[float, float]:
    """Probes per second of a container's agent under the skeleton: (median, max) over
    containers (every endpoint probes each destination once per probe interval)."""
    deg = np.bincount(sim.pairs[:, 0].astype(np.int64), minlength=len(sim.eps))
    per = np.bincount(sim.eps.container, weights=deg) / sim.probe_interval_s
    per = per[per > 0]
    return (float(np.median(per)), float(per.max())) if per.size else (0.0, 0.0)


def draw_seeds(n: int) -> list[int]:
    """``n`` evaluation seeds drawn at run time, none of them a training seed."""
    rng = np.random.default_rng()  # entropy from the OS: not chosen by anyone
    out: list[int] = []
    while len(out) < n:
        s = int(rng.integers(1_000, 2**31 - 1))
        if s not in TRAIN_SEEDS and s not in out:
            out.append(s)
    return out


def _pool(runs: list[dict]) -> dict[str, Any]:
    """Pool the seeds' detection counts: headline figures with 95 % Wilson intervals."""
    ev = sum(r["detection"]["events"] for r in runs)
    mt = sum(r["detection"]["matched_events"] for r in runs)
    fa = sum(r["detection"]["faults"] for r in runs)
    de = sum(r["detection"]["detected_faults"] for r in runs)
    fp = ev - mt
    p_lo, p_hi = wilson(mt, ev)
    r_lo, r_hi = wilson(de, fa)
    ttd = [ttd_s for r in runs for _, ttd_s in r["first_ttd"]]
    healthy = sum(r["healthy_host_h"] for r in runs)
    return {
        "events": ev,
        "matched_events": mt,
        "false_events": fp,
        "faults": fa,
        "detected": de,
        "precision": round(mt / ev, 4) if ev else 1.0,
        "precision_ci": [p_lo, p_hi],
        "recall": round(de / fa, 4) if fa else None,
        "recall_ci": [r_lo, r_hi],
        "ttd_s": summarize(ttd),
        "healthy_host_h": round(healthy, 1),
        "fp_per_1k_host_hours": round(1000 * fp / healthy, 3) if healthy else None,
    }


def _first_events(r: dict):
    """(record, its first matched event) of every detected, non-gray paper-type fault."""
    run = r["run"]
    window_ns = int(DetectorConfig().window_s * 1e9)
    _, detected = match_events(run["records"], run["events"], window_ns, r["eps_of"])
    for rec in run["records"]:
        evs = detected[rec.fault_id]
        if (
            evs
            and rec.fault_id not in run["gray"]
            and rec.fault_id not in run.get("masked", ())
            and FAULT_SPECS[rec.type].in_paper
        ):
            yield rec, min(evs, key=lambda e: e.detected_ns)


def _replayable(runs: list[dict]) -> dict[str, list[str]]:
    """The misses and false events of ``runs``, each named with its seed: CI prints them when
    the gate fails, and ``skh eval --seed N`` replays that seed's run exactly."""
    return {
        "missed": [f"{m} (seed {r['seed']})" for r in runs for m in r["detection"]["missed"]][:20],
        "false_events_sample": [
            f"seed {r['seed']}: {e}" for r in runs for e in r["detection"]["false_events"]
        ][:10],
    }


def _merge_per_type(runs: list[dict]) -> dict[str, Any]:
    out: dict[str, dict] = {}
    for r in runs:
        for name, v in r["detection"]["per_type"].items():
            o = out.setdefault(
                name,
                {k: v[k] for k in ("no", "name", "layer", "in_paper")}
                | {"faults": 0, "detected": 0, "events": 0, "_kind": 0, "_ttd": []},
            )
            o["faults"] += v["faults"]
            o["detected"] += v["detected"]
            o["events"] += v["events"]
            o["_kind"] += round((v["precision_kind"] or 0) * v["events"])
    for r in runs:
        for name, ttd_s in r["first_ttd"]:
            if name in out:
                out[name]["_ttd"].append(ttd_s)
    for o in out.values():
        o["recall"] = round(o["detected"] / o["faults"], 3) if o["faults"] else None
        o["precision_kind"] = round(o.pop("_kind") / o["events"], 3) if o["events"] else None
        o["ttd_s"] = summarize(o.pop("_ttd"))
    return dict(sorted(out.items(), key=lambda kv: kv[1]["no"]))


def _merge_e2e(runs: list[dict]) -> dict[str, Any]:
    """The seeds' end-to-end localization pooled (counts summed, intervals over the pool)."""
    es = [r["e2e"] for r in runs]

    def pool(blocks: list[dict]) -> dict[str, Any]:
        n = sum(b["n"] for b in blocks)
        kc = sum(round((b["accuracy"] or 0) * b["n"]) for b in blocks)
        kt = sum(round((b["type_accuracy"] or 0) * b["n"]) for b in blocks)
        return {
            "n": n,
            "accuracy": round(kc / n, 4) if n else None,
            "accuracy_ci": list(wilson(kc, n)),
            "type_accuracy": round(kt / n, 4) if n else None,
            "type_accuracy_ci": list(wilson(kt, n)),
        }

    per: dict[str, dict] = {}
    confusion: dict[str, dict[str, int]] = {}
    for e in es:
        for k, v in e["per_type"].items():
            o = per.setdefault(k, {"n": 0, "_c": 0, "_t": 0})
            o["n"] += v["n"]
            o["_c"] += round(v["component"] * v["n"])
            o["_t"] += round(v["type"] * v["n"])
        for k, row in e["type_confusion"].items():
            for got, c in row.items():
                confusion.setdefault(k, {})[got] = confusion.get(k, {}).get(got, 0) + c
    sp = [e["spurious_alerts_per_fault"] for e in es if e["spurious_alerts_per_fault"] is not None]
    return {
        "window_s": es[0]["window_s"],
        "reask_s": es[0]["reask_s"],
        "answers": es[0]["answers"],
        **pool(es),
        "all_types": pool([e["all_types"] for e in es]),
        "merged_types": es[0]["merged_types"],
        "per_type": {
            k: {
                "n": v["n"],
                "component": round(v["_c"] / v["n"], 3),
                "type": round(v["_t"] / v["n"], 3),
            }
            for k, v in sorted(per.items())
        },
        "type_confusion": confusion,
        "spurious_alerts_per_fault": round(float(np.mean(sp)), 3) if sp else None,
        "misses": [m for e in es for m in e["misses"]][:16],
        "detected_after_end": sum(e["detected_after_end"] for e in es),
        "detected_after_end_cases": [c for e in es for c in e["detected_after_end_cases"]][:16],
    }


def _merge_gray(runs: list[dict]) -> dict[str, Any]:
    cells: dict[tuple, list[int]] = {}
    for r in runs:
        for kind, rows in r["gray"].items():
            for row in rows:
                c = cells.setdefault((kind, row["magnitude"], row["flows"]), [0, 0])
                c[0] += row["faults"]
                c[1] += row["detected"]
    out: dict[str, list] = {}
    for (kind, mag, flows), (n, d) in sorted(cells.items()):
        out.setdefault(kind, []).append(
            {
                "magnitude": mag,
                "flows": flows,
                "faults": n,
                "detected": d,
                "rate": round(d / n, 3) if n else None,
            }
        )
    return out


def _merge_noise(runs: list[dict]) -> dict[str, Any]:
    ms = [r["noise"] for r in runs]
    probes = sum(m["probes"] for m in ms)
    return {
        "regime": ms[0]["regime"],
        "hours": round(sum(m["hours"] for m in ms), 2),
        "probes": probes,
        "benign_loss_per_probe": round(
            sum(m["request_lost"] + m["reply_lost"] for m in ms) / max(probes, 1), 7
        ),
        "rtt_over_base": ms[0]["rtt_over_base"],
        "cpu_stalls": sum(m["cpu_stalls"] for m in ms),
        "stall_timeouts": sum(m["stall_timeouts"] for m in ms),
        "local_errors": sum(m["local_errors"] for m in ms),
        "clock_steps": sum(m["clock_steps"] for m in ms),
        "congestion_episodes": sum(m["congestion_episodes"] for m in ms),
        "congestion_s": ms[0]["congestion_s"],
        "congestion_us": ms[0]["congestion_us"],
        "agent_restarts": sum(m["agent_restarts"] for m in ms),
        "answers": _merge_answers([r["answers"] for r in runs]),
        "per_seed": ms,
    }


#: counts of :func:`skh.sim.answers.answers_measured` that add up over seeds
_ANSWER_COUNTS = (
    "traces",
    "reports",
    "reports_missing",
    "flags",
    "flags_missing",
    "flags_stale",
    "flags_stale_wrong",
    "dumps",
    "dump_races",
    "idle_rules",
)


def _merge_answers(ans: list[dict]) -> dict[str, Any]:
    """The answer noise produced over the seeds: counts summed, the flag dropout shares, the
    first seed's traceroute shares (each seed's are in ``per_seed``)."""
    out: dict[str, Any] = {"answers": ans[0].get("answers")}
    out |= {k: sum(a.get(k, 0) for a in ans) for k in _ANSWER_COUNTS}
    flags = max(out["flags"], 1)
    out["flag_missing_share"] = round(out["flags_missing"] / flags, 4)
    out["flag_stale_share"] = round(out["flags_stale"] / flags, 4)
    out["report_missing_share"] = round(out["reports_missing"] / max(out["reports"], 1), 4)
    out |= {k: v for k, v in ans[0].items() if k.startswith(("hop_", "silent"))}
    out["per_seed"] = ans
    return out


# ----------------------------------------------------------------------------------- stages


@functools.lru_cache(maxsize=2)
def _fabric(hosts: int) -> Fabric:
    return Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=hosts)


def _seed_stage(profile: Profile, seed: int, regime_: Any, first: bool) -> dict[str, Any]:
    log.info("eval: seed %d (%s)", seed, getattr(regime_, "name", regime_))
    return seed_run(_fabric(profile.hosts), profile, seed, regime_, first=first)


def _localization_stage(profile: Profile, seed: int) -> dict[str, Any]:
    return localization_section(_fabric(profile.hosts), profile, seed)


def _probing_stage(profile: Profile, seed: int) -> dict[str, Any]:
    return sweep_table(profile.sweep_rnics, seed, duration_s=profile.skeleton_s)


def _timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    """``fn(*args)`` with the CPU and wall seconds it took (in the process that ran it)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args)
    return out, time.process_time() - c0, time.perf_counter() - t0


def run_stages(
    stages: list[tuple[str, Any, tuple]], workers: int, store: StageStore | None = None
) -> dict[str, tuple[Any, float, float]]:
    """Run the named stages (each a pure function of its arguments: the simulation and every
    draw are keyed by the seed) in ``workers`` processes, or here when ``workers`` is 1; the
    results come back by name, so what the evaluation reports does not depend on which
    finished first. Stages should come longest first (they are handed out in order). With a
    ``store``, stages it holds are not run again and each one that finishes is saved there."""
    done: dict[str, tuple[Any, float, float]] = {}
    if store is not None:
        for name, _, _ in stages:
            if (kept := store.load(name)) is not None:
                done[name] = kept
                log.info("eval: stage %s kept from %s", name, store.root)
    todo = [st for st in stages if st[0] not in done]

    failed: list[BaseException] = []

    def settle(name: str, result: Callable[[], tuple[Any, float, float]]) -> None:
        # a stage that fails does not cost the others: they finish (and are kept) first
        try:
            out = result()
        except Exception as exc:
            log.error("eval: stage %s failed: %r", name, exc)
            failed.append(exc)
            return
        done[name] = out
        if store is not None:
            store.save(name, out)
        log.info("eval: stage %s finished (%d of %d)", name, len(done), len(stages))

    if not (workers > 1 and len(todo) > 1):
        for name, fn, args in todo:
            settle(name, functools.partial(_timed, fn, *args))
    else:
        # fork where there is one: spawn would re-run the caller's main module in every worker
        # (a script without a ``__main__`` guard breaks) and re-import numpy and scipy there
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=ctx) as ex:
            futs = {ex.submit(_timed, fn, *args): name for name, fn, args in todo}
            # as each finishes: an hours-long full profile shows (and keeps) its progress
            for f in as_completed(futs):
                settle(futs[f], f.result)
    if failed:
        raise failed[0]
    return {name: done[name] for name, _, _ in stages}


def default_workers() -> int:
    """Worker processes for :func:`run_eval`: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_eval(
    profile: Profile,
    seed: int | None = None,
    *,
    seeds: list[int] | None = None,
    noise: str = "field",
    agent: bool = True,
    workers: int | None = None,
    store: StageStore | None = None,
) -> dict[str, Any]:
    """The whole evaluation; see the module doc. Headline keys at the top level. Seeds: the
    given ``seeds`` (or the one ``seed``), else ``profile.seeds`` drawn at run time. The
    seeds, the held-out seeds, the ramps, the oracle localization and the probing-cost sweep
    run as independent stages in ``workers`` processes (default: one per CPU); the result is
    the same for any number of workers. With a ``store``, a run that was stopped resumes: its
    seeds and finished stages come from there (same code, skh/ and csrc/ as committed, profile
    and regime only)."""
    timings: dict[str, float] = {}
    t_all, cpu_all = time.perf_counter(), time.process_time()
    rg = regime(noise)
    heavy = REGIMES["field-heavy"]

    def choose() -> dict[str, Any]:
        drawn = seed is None and seeds is None
        chosen = list(seeds) if seeds is not None else ([seed] if seed is not None else None)
        chosen = chosen or draw_seeds(profile.seeds)
        hs: list[int] = []
        if profile.heldout_seeds:
            hs = (
                draw_seeds(profile.heldout_seeds)
                if drawn
                else [s + 7919 for s in chosen][: profile.heldout_seeds]
            )
        return {"seeds": chosen, "heldout_seeds": hs, "drawn": drawn}

    if store is None:
        plan = choose()
    else:
        key: dict[str, Any] = {"code": code_id(), "profile": profile.name, "noise": noise}
        if seeds is not None or seed is not None:
            key["seeds"] = list(seeds) if seeds is not None else [seed]
        plan = store.manifest(key, lambda: {**choose(), "began_at_commit": commit_id()})
    seeds, hs, drawn = plan["seeds"], plan["heldout_seeds"], plan["drawn"]

    fabric = _fabric(profile.hosts)
    # longest first: a seed's field run is most of the CPU; the held-out seed's (field-heavy) is
    # as long as the longest field seed's (53 against 43-54 min of CPU at 4,096 hosts), so it goes
    # first rather than run alone after the field seeds
    stages: list[tuple[str, Any, tuple]] = [
        (f"heldout {s}", _seed_stage, (profile, s, heavy, False)) for s in hs
    ]
    stages += [(f"seed {s}", _seed_stage, (profile, s, rg, i == 0)) for i, s in enumerate(seeds)]
    stages += [
        ("ramps", ramp_scenario, (profile, seeds[0], rg)),
        ("localization", _localization_stage, (profile, seeds[0])),
        ("probing", _probing_stage, (profile, seeds[0])),
    ]
    workers = default_workers() if workers is None else workers
    kept = {name for name, _, _ in stages if store is not None and store.has(name)}
    pooled = workers > 1 and len(stages) - len(kept) > 1  # as run_stages decides
    done = run_stages(stages, workers, store)
    # the CPU of stages that ran elsewhere: in the workers, or in the stopped run that kept them
    cpu_children = 0.0
    for name, (_, cpu_s, wall_s) in done.items():
        timings[f"{name} cpu"] = round(cpu_s, 2)
        timings[f"{name} wall"] = round(wall_s, 2)
        if pooled or name in kept:
            cpu_children += cpu_s
        log.info("eval: %s done in %.1f s (%.1f s CPU)", name, wall_s, cpu_s)
    timings["stages"] = round(time.perf_counter() - t_all, 2)
    timings["workers"] = workers if pooled else 1
    if kept:
        timings["stages kept"] = len(kept)

    runs = [done[f"seed {s}"][0] for s in seeds]
    main = {"runs": runs, "head": _pool(runs)}
    sim0 = runs[0]["sim0"]
    skeleton = sim0["skeleton"]

    heldout = None
    if hs:
        hruns = [done[f"heldout {s}"][0] for s in hs]
        heldout = {
            "regime": "field-heavy",
            "seeds": hs,
            **_pool(hruns),
            "e2e": {k: v for k, v in _merge_e2e(hruns).items() if k != "misses"},
            "noise": _merge_noise(hruns),
        }

    ramps = done["ramps"][0]
    localization = done["localization"][0]
    e2e = _merge_e2e(runs)
    localization["end_to_end"] = e2e
    probing = done["probing"][0]

    head = main["head"]
    fp_total = head["false_events"] + ramps["false_events"]
    healthy_total = head["healthy_host_h"] + ramps["host_hours"]
    detection = {
        **head,
        "fp_per_1k_host_hours_with_ramps": round(1000 * fp_total / healthy_total, 3)
        if healthy_total
        else None,
        "virtual_h_per_seed": round(profile.duration_s / 3600, 2),
        "faults_planned": sum(r["run"]["planned"] for r in runs),
        "faults_not_placed": [x for r in runs for x in r["run"]["skipped"]],
        "invisible_faults": sum(r["detection"]["invisible_faults"] for r in runs),
        "masked_faults": sum(r["detection"]["masked_faults"] for r in runs),
        "masked": [x for r in runs for x in r["detection"]["masked"]],
        "per_type": _merge_per_type(runs),
        "per_kind": {
            k: {
                "events": sum(r["detection"]["per_kind"][k]["events"] for r in runs),
                "matched": sum(r["detection"]["per_kind"][k]["matched"] for r in runs),
            }
            for k in runs[0]["detection"]["per_kind"]
        },
        **_replayable(runs),
        "new_jobs": {
            "faults": sum(r["new_job"]["faults"] for r in runs),
            "detected": sum(r["new_job"]["detected"] for r in runs),
        },
        "overlap": {
            "max_concurrent": max(r["overlap"]["max_concurrent"] for r in runs),
            "overlapping_share": round(
                float(np.mean([r["overlap"]["overlapping_share"] for r in runs])), 3
            ),
        },
        "gray": _merge_gray(runs),
        "projection": projection(fp_total, healthy_total, head["recall"]),
        "records_ingested": int(sum(r["run"]["detector_stats"].records_in for r in runs)),
        "windows_scored": int(sum(r["run"]["detector_stats"].windows_scored for r in runs)),
        "cpu_s_per_seed": [r["cpu_s"] for r in runs],
    }
    sampling = {
        "per_seed": [{k: v for k, v in r["random"].items() if k != "per_type"} for r in runs],
        "skeleton_visible": round(
            float(np.mean([r["random"]["skeleton_visible"] for r in runs])), 4
        ),
        "random_visible": round(float(np.mean([r["random"]["random_visible"] for r in runs])), 4),
        "per_type": runs[0]["random"]["per_type"],
    }

    rate_p50, rate_max = sim0["rates"]
    # the busiest container as deployed: at the rate the controller's probe plan gives it
    plan = sim0["plan"]
    busiest = plan["busiest_container"]["planned_probes_per_s"]
    run_agent = agent and profile.agent_s > 0
    measured: dict[str, Any] = {
        "agent": {"skipped": True}
        if not run_agent
        else agent_cost(
            max(1.0, np.ceil(busiest)),
            profile.agent_s,
            paths=plan["busiest_paths"],
            endpoints=fabric.rails,
            answers_per_s=max(1.0, np.ceil(plan["busiest_container"]["planned_answers_per_s"])),
            runs=AGENT_RUNS,
        ),
        "agent_unplanned": {"skipped": True}
        if not run_agent
        else agent_cost(max(1.0, np.ceil(rate_max)), profile.agent_s, endpoints=fabric.rails),
        "paper_agent": {"cpu_pct": PAPER["agent_cpu_pct"], "rss_mb": PAPER["agent_rss_mb"]},
    }
    timings["total"] = round(time.perf_counter() - t_all, 2)
    # CPU seconds of this process and its stages' workers: on a shared machine the wall time
    # says little
    timings["total_cpu"] = round(time.process_time() - cpu_all + cpu_children, 2)

    scale = {
        "topology": "Alibaba Lingjun 2023 (847 hosts, 48 ToR groups, 3 PSW, 1 DSW), "
        "pods replicated",
        "hosts": len(fabric.hosts),
        "rnics_per_host": fabric.rails,
        "rnics": len(fabric.hosts) * fabric.rails,
        "switches": len(fabric.switches),
        "jobs_at_start": profile.jobs,
        "ping_pairs_at_start": sim0["ping_pairs"],
        "scaled_down": profile.scaled_down,
        "note": (
            f"scaled DOWN to {len(fabric.hosts)} hosts for the {profile.name} profile; "
            "the full profile runs 4,096 hosts x 8 RNICs"
            if profile.scaled_down
            else "paper scale: >= 4,096 hosts x 8 RNICs"
        ),
    }
    calibration = {
        "training": {
            "regime": "field",
            "seeds": list(TRAIN_SEEDS),
            "what": "the detector's thresholds (alpha, baseline prior, sustained spans) were "
            "chosen on these seeds only",
        },
        "evaluated": {"regime": rg.name, "seeds": seeds, "drawn_at_run_time": drawn},
        "held_out_regime": "field-heavy" if heldout else None,
    }
    table = {
        "skeleton": skeleton,
        "detection": detection,
        "heldout": heldout,
        "ramps": {k: v for k, v in ramps.items() if k != "noise"},
        "localization": localization,
        "random_sampling": sampling,
        "probing": probing,
        "agent_rate": {
            "probes_per_s_container_p50": round(rate_p50, 1),
            "probes_per_s_container_max": round(rate_max, 1),
            "probe_interval_s": sim0["probe_interval_s"],
        },
        "probe_plan": plan,
    }
    out = {
        "precision": head["precision"],
        "recall": head["recall"],
        "precision_ci_low": head["precision_ci"][0],
        "recall_ci_low": head["recall_ci"][0],
        "fp_per_1k_host_hours": head["fp_per_1k_host_hours"],
        "e2e_localization_accuracy": e2e["accuracy"],
        "e2e_type_accuracy": e2e["type_accuracy"],
        "localization_accuracy_oracle": localization["accuracy"],
        "skeleton_coverage": skeleton["coverage"],
        "ttd_mean_s": head["ttd_s"]["mean"],
        "ttd_p50_s": head["ttd_s"]["p50"],
        "ttd_p99_s": head["ttd_s"]["p99"],
        "seeds": seeds,
        "noise_regime": {"name": rg.name, "summary": rg.summary}
        | {k: v for k, v in rg.as_dict().items() if k not in ("name", "summary", "sources")},
        "noise_sources": dict(rg.sources),
        "noise_measured": _merge_noise(runs),
        "calibration": calibration,
    }
    ag = measured["agent"]
    # not gated (THRESHOLDS): wall-clock figures on a shared machine
    probing_head = {
        "agent_cpu_pct_busiest": ag.get("cpu_pct_one_core"),
        "agent_rss_mb_busiest": ag.get("rss_mb"),
        "agent_uss_mb_busiest": ag.get("uss_mb"),
        "ecmp_paths_covered_share": plan["ecmp_paths_covered_share"]["planned_mean"],
    }
    failures = [
        f"{k} {out[k]} < {v}" for k, v in THRESHOLDS.items() if out[k] is None or out[k] < v
    ]
    failures += [f"{k} {out[k]} > {v}" for k, v in MAXIMA.items() if out[k] is None or out[k] > v]
    return (
        out
        | probing_head
        | {
            "thresholds": THRESHOLDS,
            "maxima": MAXIMA,
            "meets_thresholds": not failures,
            "below_thresholds": failures,
            "paper": PAPER,
            "meta": {
                "seed": seeds[0],
                "seeds": seeds,
                "profile": profile.name,
                "commit": commit_id(),
                "code": code_id(),
                "scale": scale,
            },
            "table": table,
            "measured": measured,
            "timings": timings,
        }
    )
