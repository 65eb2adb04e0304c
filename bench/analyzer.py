"""Analyzer benchmark: ingest rate, one detection round at 360K pairs, batched LOF against
per-pair scikit-learn, peak RSS, and detection quality on the simulator's fault suite.

Prints one JSON object. ``--quick`` keeps it under a minute on one core.

Fault suite: a simulated cluster with job churn (jobs arriving and ending; ended containers are
retired as the controller would report), its skeleton pairs probed ten times a second
(``--probe-interval``) and the results thinned as the agents ship them (every failure, one OK
per pair and second: ``suite_records_forwarded_share``), runs healthy for a warm-up, then every
fault type of :mod:`skh.sim.faults` is injected in turn on a component used by live ping pairs,
one at a time with a gap, so each event is attributable. An event *matches* a fault when it
names one of the fault's affected pairs (for ``agent`` events: an endpoint of the faulty
container) and was detected between the fault's start and its end plus one window. Precision:
matched events / events; recall: faults with a matched event / observable faults. A loss or
outage is observable when at least one probe of its pairs failed (a 2 % loss on two pairs for a
minute often loses none; such faults are listed in ``faults_unobservable``), faults no ping
pair crosses are not. The ``_kind`` variants also require the event's kind to fit the fault's
symptom (an unreachable switch link under ECMP is pair-level loss for pairs whose other paths
still work, so link and switch outages accept both); ``wrong_kind_events`` lists the misfits.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings

import numpy as np

from skh.analysis.detect import Detector, DetectorConfig
from skh.analysis.features import window_features
from skh.analysis.lof import batched_lof, fit_lof, score_lof
from skh.analysis.longterm import LongTermConfig, LongTermState
from skh.analysis.sampling import ResultThinner
from skh.eval.scoring import accepted_kinds
from skh.records import PROBE_DTYPE, ProbeStatus, pair_keys

T0_NS = 1_700_000_000 * 10**9


def _synthetic_batch(rng: np.random.Generator, n_pairs: int, n_rows: int, t_ns: int) -> np.ndarray:
    b = np.zeros(n_rows, PROBE_DTYPE)
    pid = rng.permutation(n_pairs)[:n_rows]  # every pair once per second, in arrival order
    b["src_ep"] = pid // 9
    b["dst_ep"] = (pid % 9) + 1 + pid // 9
    b["seq"] = t_ns // 10**9
    b["t_wall_ns"] = t_ns + rng.integers(0, 10**9, n_rows)
    b["rtt_ns"] = (14_000 * np.exp(0.05 * rng.standard_normal(n_rows))).astype(np.int64)
    b["prober_delay_ns"] = 4_000
    b["responder_delay_ns"] = 2_000
    return b


def bench_ingest(n_pairs: int, n_batches: int) -> float:
    """Records per CPU second through Detector.ingest, 1 s batches of one probe per pair."""
    rng = np.random.default_rng(1)
    det = Detector()
    batches = [
        _synthetic_batch(rng, n_pairs, n_pairs, T0_NS + i * 10**9) for i in range(n_batches + 1)
    ]
    det.ingest(batches[0])  # first sight of every pair (index build) is not the steady state
    t = time.process_time()
    for b in batches[1:]:
        det.ingest(b)
    return n_pairs * n_batches / (time.process_time() - t)


def bench_round(n_pairs: int) -> dict:
    """One detection round at ``n_pairs``: LOF fit of the look-back + scoring of the new window
    for every pair, plus the long-term Z-test of a closed block."""
    cfg = DetectorConfig()
    rng = np.random.default_rng(2)
    base = rng.uniform(12.0, 16.0, n_pairs).astype(np.float32)
    noise = rng.normal(0, 0.15, (n_pairs, cfg.lookback_windows + 1, 7)).astype(np.float32)
    shape = np.array([0.97, 1.0, 1.03, 0.9, 1.0, 0.05, 1.15], np.float32)
    feats = base[:, None, None] * shape[None, None, :] + noise
    train, query = feats[:, :-1], feats[:, -1]
    lt = LongTermState(LongTermConfig(block_s=60.0, min_samples=30), n_pairs)
    pid = np.repeat(np.arange(n_pairs), 4)
    for blk in range(2):
        lt.add(
            pid,
            np.full(pid.size, blk * 60 * 10**9),
            np.repeat(base, 4) * rng.uniform(0.95, 1.05, pid.size),
            0,
        )
    samples = (
        base[:, None] * np.exp(0.05 * rng.standard_normal((n_pairs, cfg.samples_per_pair)))
    ).astype(np.float32)
    in_window = rng.random((n_pairs, cfg.samples_per_pair)) < 0.7
    clock = time.process_time  # CPU seconds of this process: the machine may be shared
    t = clock()
    fit = fit_lof(train, cfg.lof_k)
    t_fit = clock() - t
    t = clock()
    score_lof(train, fit, query)
    t_score = clock() - t
    t = clock()
    lt.test_block(1)
    t_z = clock() - t
    t = clock()
    window_features(samples, in_window)
    t_feat = clock() - t
    return {
        # a round whose look-back changed (every 30 s): refit + score + Z; other slides only score
        "round_s_360k_pairs": round(t_fit + t_score + t_z, 3),
        "round_fit_s": round(t_fit, 3),
        "round_score_s": round(t_score, 3),
        "round_z_s": round(t_z, 4),
        "window_features_s_360k_pairs": round(t_feat, 3),
        "round_pairs": n_pairs,
    }


def bench_tick(n_pairs: int, interval_s: int = 3, seconds: int = 240) -> dict:
    """Full Detector rounds at ``n_pairs`` pairs probed every ``interval_s`` (one batch per second):
    CPU seconds of ``tick`` once the look-back is full (every 5 s a slide is scored, every 30 s
    the look-back is refitted), and the detector's own state size."""
    rng = np.random.default_rng(4)
    det = Detector()
    pid_all = np.arange(n_pairs)
    ticks = []
    for sec in range(seconds):
        pid = pid_all[pid_all % interval_s == sec % interval_s]
        b = np.zeros(pid.size, PROBE_DTYPE)
        b["src_ep"] = pid // 9
        b["dst_ep"] = (pid % 9) + 1 + pid // 9
        b["seq"] = sec // interval_s
        b["t_wall_ns"] = T0_NS + sec * 10**9 + (pid * 7919) % 10**9
        b["rtt_ns"] = (14_000 * np.exp(0.05 * rng.standard_normal(pid.size))).astype(np.int64)
        b["prober_delay_ns"] = 4_000
        b["responder_delay_ns"] = 2_000
        det.ingest(b)
        t = time.process_time()
        det.tick(T0_NS + (sec + 1) * 10**9)
        if sec >= seconds - 60:
            ticks.append(time.process_time() - t)
    state = (
        det.pairs[: det._n].nbytes
        + det.fast.state[: det._n].nbytes
        + det.longterm.state[: det._n].nbytes
    )
    return {
        "tick_s_mean": round(float(np.mean(ticks)), 3),
        "tick_s_max": round(float(np.max(ticks)), 3),
        "tick_pairs": n_pairs,
        "tick_windows_scored": det.stats.windows_scored,
        "detector_state_bytes_per_pair": round(state / max(det._n, 1)),
    }


def bench_lof_vs_sklearn(n_pairs: int) -> dict:
    from sklearn.neighbors import LocalOutlierFactor

    cfg = DetectorConfig()
    rng = np.random.default_rng(3)
    # the batched side is timed per pair on 20K pairs, as it runs (a few hundred pairs time
    # mostly its fixed cost); scores are compared on the pairs scikit-learn also scored
    n_batched = max(n_pairs, 20_000)
    train = rng.normal(14, 0.5, (n_batched, cfg.lookback_windows, 7))
    query = rng.normal(14, 0.8, (n_batched, 7))
    t = time.perf_counter()
    ref = np.empty(n_pairs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(n_pairs):
            ref[i] = (
                LocalOutlierFactor(n_neighbors=cfg.lof_k, novelty=True)
                .fit(train[i])
                .score_samples(query[i : i + 1])[0]
            )
    t_sk = time.perf_counter() - t
    t = time.perf_counter()
    ours = batched_lof(train, query, cfg.lof_k)
    t_ours = time.perf_counter() - t
    per_sk, per_ours = t_sk / n_pairs, t_ours / n_batched
    return {
        "lof_speedup_vs_sklearn": round(per_sk / per_ours, 1),
        "lof_sklearn_s_per_pair": per_sk,
        "lof_batched_s_per_pair": per_ours,
        "lof_max_abs_diff": float(np.abs(ours[:n_pairs] - ref).max()),
        "lof_pairs_compared": n_pairs,
    }


# ------------------------------------------------------------------------------------ suite


def rec_symptom(rec) -> str:
    from skh.sim.faults import FAULT_SPECS

    return FAULT_SPECS[rec.type].symptom


def _component_for(sim, ftype, src: int, dst: int, rng) -> str:
    from skh.sim.faults import FAULT_SPECS, link_component

    e = sim.cluster.endpoints[src]
    target = FAULT_SPECS[ftype].target
    if target == "container":
        return e.container
    if target == "host":
        return e.host
    if target == "rnic":
        return f"{e.host}:rnic{e.rail}"
    path = sim.index.path_names(
        int(sim.eps.rnic[src]), int(sim.eps.rnic[dst]), int(rng.integers(sim.n_path_ids))
    )
    if target == "switch":
        return path[1 + int(rng.integers(len(path) - 2))]
    k = int(rng.integers(len(path) - 1))
    return link_component(path[k], path[k + 1])


def fault_suite(
    *,
    hosts: int,
    rounds: int,
    fault_s: float,
    gap_s: float,
    warmup_s: int,
    seed: int,
    probe_interval_s: float,
) -> dict:
    from skh.failures import FailureType
    from skh.model import Fabric
    from skh.sim.faults import SIMULATED_TYPES, Fault
    from skh.sim.scenario import Simulation

    sim = Simulation.build(
        Fabric.from_params(hosts=hosts),
        max(4, hosts // 6),
        seed=seed,
        arrivals_per_min=0.5,
        probe_interval_s=probe_interval_s,
    )
    det = Detector()
    rng = np.random.default_rng(seed)
    types = list(SIMULATED_TYPES) * rounds
    rng.shuffle(types)
    plan: list[tuple[float, FailureType]] = [
        (warmup_s + i * (fault_s + gap_s), ft) for i, ft in enumerate(types)
    ]
    duration = int(plan[-1][0] + fault_s + gap_s)
    window_ns = int(DetectorConfig().window_s * 1e9)
    records = []
    events = []
    next_fault = 0
    retired_jobs: set[str] = set()
    failures: list[np.ndarray] = []  # every non-OK probe, to tell which loss faults showed at all
    t_ingest = 0.0
    thinner = ResultThinner()
    n_probes = n_forwarded = 0
    for step in sim.run(duration):
        t = step.t_s
        # this step is already simulated: inject what starts during the next one
        while next_fault < len(plan) and plan[next_fault][0] < t + 2:
            start, ft = plan[next_fault]
            next_fault += 1
            # a pair whose job outlives the fault, so the fault is visible on live probes
            live = [
                j
                for j in sim.jobs
                if j.end_s > start + fault_s + 60
                and np.max(j.ready_s) < start - 120
                and j.skeleton_pairs.size
            ]
            if not live:
                continue
            j = live[int(rng.integers(len(live)))]
            s_ep, d_ep = j.skeleton_pairs[int(rng.integers(len(j.skeleton_pairs)))]
            comp = _component_for(sim, ft, int(s_ep), int(d_ep), rng)
            records.append(sim.inject(Fault(ft, comp, start, start + fault_s)))
        # the controller reports stopped containers; the daemon retires them before their batches
        for j in sim.jobs:
            if j.name not in retired_jobs and j.end_s <= t + 1:
                retired_jobs.add(j.name)
                det.retire(j.ep_ids)
        bad = step.probes["status"] != ProbeStatus.OK
        if bad.any():
            failures.append(step.probes[bad][["src_ep", "dst_ep", "t_wall_ns"]])
        forwarded = thinner.thin(step.probes)  # what the agents ship, as deployed
        n_probes += step.probes.size
        n_forwarded += forwarded.size
        c = time.perf_counter()
        det.heartbeat(step.heartbeats, int(sim.clock.wall_ns(t)))
        det.ingest(forwarded)
        for ev in det.tick(int(sim.clock.wall_ns(t + step.dt_s))):
            events.append(ev)
        t_ingest += time.perf_counter() - c
    fails = (
        np.concatenate(failures)
        if failures
        else np.zeros(0, PROBE_DTYPE)[["src_ep", "dst_ep", "t_wall_ns"]]
    )
    return _score(sim, records, events, window_ns, fails) | {
        "suite_probe_interval_s": probe_interval_s,
        "suite_records_forwarded_share": round(n_forwarded / max(n_probes, 1), 4),
        "suite_virtual_s": duration,
        "suite_detector_s": round(t_ingest, 2),
    }


def _observable(rec, fails: np.ndarray) -> bool:
    """Whether the probes could show the fault at all: a loss or outage must have failed at least
    one probe of its pairs (a 2 % loss on two pairs for a minute often loses none)."""
    if len(rec.affected_pairs) == 0:
        return False
    if rec_symptom(rec) not in ("unreachable", "loss", "flapping"):
        return True
    end = rec.end_ns if rec.end_ns >= 0 else 2**62
    f = fails[(fails["t_wall_ns"] >= rec.start_ns) & (fails["t_wall_ns"] < end)]
    keys = pair_keys(f["src_ep"], f["dst_ep"])
    aff = pair_keys(rec.affected_pairs[:, 0], rec.affected_pairs[:, 1])
    return bool(np.isin(keys, aff).any())


def _score(sim, records, events, window_ns: int, fails: np.ndarray) -> dict:
    eps_of = {}
    for rec in records:
        if rec.target == "container":
            cid = sim.eps.container_id(rec.component)
            eps_of[rec.fault_id] = set(np.flatnonzero(sim.eps.container == cid).tolist())
        else:
            eps_of[rec.fault_id] = set()
    pairsets = {rec.fault_id: set(map(tuple, rec.affected_pairs.tolist())) for rec in records}
    matched_ev = [None] * len(events)
    detected: dict[int, list] = {rec.fault_id: [] for rec in records}
    for i, ev in enumerate(events):
        for rec in records:
            end = rec.end_ns if rec.end_ns >= 0 else 2**62
            if not rec.start_ns <= ev.detected_ns <= end + window_ns:
                continue
            hit = any(p in pairsets[rec.fault_id] for p in ev.pairs) or any(
                e in eps_of[rec.fault_id] for e in ev.endpoints
            )
            if hit:
                matched_ev[i] = rec
                detected[rec.fault_id].append(ev)
                break
    visible = [r for r in records if _observable(r, fails)]
    unobservable = [
        f"{r.name}@{r.component}" for r in records if len(r.affected_pairs) and r not in visible
    ]
    n_ev = len(events)
    n_match = sum(m is not None for m in matched_ev)
    n_match_kind = sum(
        m is not None and ev.kind in accepted_kinds(m)
        for m, ev in zip(matched_ev, events, strict=True)
    )
    found = [r for r in visible if detected[r.fault_id]]
    found_kind = [
        r for r in visible if any(ev.kind in accepted_kinds(r) for ev in detected[r.fault_id])
    ]
    per_kind = {}
    for kind in ("unreachable", "loss", "latency-short", "latency-long", "agent"):
        evk = [(m, ev) for m, ev in zip(matched_ev, events, strict=True) if ev.kind == kind]
        per_kind[kind] = {
            "events": len(evk),
            "precision": round(
                sum(m is not None and kind in accepted_kinds(m) for m, _ in evk) / len(evk), 4
            )
            if evk
            else None,
        }
    per_symptom = {}
    for sym in ("unreachable", "loss", "flapping", "latency", "agent_down", "agent_slow"):
        fs = [r for r in visible if rec_symptom(r) == sym]
        if fs:
            per_symptom[sym] = {
                "faults": len(fs),
                "recall": round(sum(bool(detected[r.fault_id]) for r in fs) / len(fs), 4),
                "recall_kind": round(sum(r in found_kind for r in fs) / len(fs), 4),
            }
    ttd = {"unreachable": [], "loss": [], "latency": []}
    # a 2 % loss shows only when a probe happens to be lost: also time from that first lost probe
    loss_after_first_lost = []
    for r in found:
        first_ev = min(detected[r.fault_id], key=lambda ev: ev.detected_ns)
        first = first_ev.detected_ns
        sym = rec_symptom(r)
        key = (
            "latency"
            if sym == "latency"
            else (
                "loss"
                if sym in ("loss", "flapping")
                else ("unreachable" if sym == "unreachable" else None)
            )
        )
        if key:
            ttd[key].append((first - r.start_ns) / 1e9)
        if key == "loss":
            loss_after_first_lost.append((first - max(first_ev.first_seen_ns, r.start_ns)) / 1e9)
    missed = [f"{r.name}@{r.component}" for r in visible if not detected[r.fault_id]]
    false_ev = [
        f"{ev.kind}:{ev.explanation[:90]}"
        for m, ev in zip(matched_ev, events, strict=True)
        if m is None
    ]
    wrong_kind = [
        f"{ev.kind} for {m.name}@{m.component}"
        for m, ev in zip(matched_ev, events, strict=True)
        if m is not None and ev.kind not in accepted_kinds(m)
    ]
    return {
        "faults": len(visible),
        "faults_unobservable": unobservable,
        "events": n_ev,
        "precision": round(n_match / n_ev, 4) if n_ev else 1.0,
        "recall": round(len(found) / len(visible), 4) if visible else None,
        "precision_kind": round(n_match_kind / n_ev, 4) if n_ev else 1.0,
        "recall_kind": round(len(found_kind) / len(visible), 4) if visible else None,
        "per_kind": per_kind,
        "per_symptom": per_symptom,
        "ttd_unreachable_mean_s": round(float(np.mean(ttd["unreachable"])), 2)
        if ttd["unreachable"]
        else None,
        "ttd_loss_mean_s": round(float(np.mean(ttd["loss"])), 2) if ttd["loss"] else None,
        "ttd_loss_after_first_lost_probe_mean_s": round(float(np.mean(loss_after_first_lost)), 2)
        if loss_after_first_lost
        else None,
        "ttd_unreachable_and_loss_mean_s": round(
            float(np.mean(ttd["unreachable"] + ttd["loss"])), 2
        )
        if ttd["unreachable"] + ttd["loss"]
        else None,
        "ttd_latency_mean_s": round(float(np.mean(ttd["latency"])), 2) if ttd["latency"] else None,
        "ttd_latency_max_s": round(float(np.max(ttd["latency"])), 2) if ttd["latency"] else None,
        "missed": missed[:10],
        "false_events": false_ev[:10],
        "wrong_kind_events": wrong_kind[:10],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller profile, under a minute")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--probe-interval",
        type=float,
        default=0.1,
        help="seconds between two probes of one skeleton pair in the fault suite (default 0.1)",
    )
    args = ap.parse_args(argv)
    q = args.quick
    out: dict = {"profile": "quick" if q else "full"}
    out["ingest_records_per_s"] = round(bench_ingest(100_000 if q else 360_000, 3 if q else 10))
    out |= bench_round(360_000)
    out |= bench_lof_vs_sklearn(100 if q else 500)
    out |= bench_tick(20_000 if q else 360_000, seconds=260 if q else 300)
    out |= fault_suite(
        hosts=32 if q else 128,
        rounds=1 if q else 3,
        fault_s=45.0 if q else 60.0,
        gap_s=35.0 if q else 45.0,
        warmup_s=330,
        seed=args.seed,
        probe_interval_s=args.probe_interval,
    )
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
