"""Where a CRC-style link loss's time to detect goes (issue 17): the quick profile's field run
(:func:`skh.eval.field.field_run`, field regime, the inferred skeleton probed by the plan)
with CRC errors as its only fault type, and each fault's path from its first failed probe to
the first event that detects it. Prints one JSON object.

    python bench/crc_ttd.py [--seed N ...] [--duration S] [--faults-per-h F] [--access-floor R]
        [--min-interval S] [--link-floor R]

Per fault: the link (``access``: an RNIC's link to its ToR; ``fabric``: ToR–spine), the probes
per second crossing it and failing (what the agents sent, before thinning), the send times of
its 1st, 3rd, 5th and 8th failed probe, when the first event that names one of its pairs was
raised (the detector ticks once per simulated second, on what the agents shipped that second)
and which test raised it (``pair``, ``endpoint`` or ``group`` — the ToR — and the window);
``stat_crossed_all_s``: the first tick at which the test of the scope the link's failures all
meet (the endpoints on its RNIC for an access link, else the fault's pairs pooled) would have
fired counting every failure, and ``stat_crossed_settled_s`` counting only the pairs not in a
run (no failed last probe, of the pair or of a flow: the rule before a run's failures alone
waited).

Measured (``--seed 7301 --seed 8802``, 1,200 s each, 31 faults, 0 false events): on ae0b790
mean 6.74 s (established jobs' access links 4.65 s, new jobs' 11.84 s, ToR–spine links
19.05 s; the endpoint test first on 26 of 31); with a run's failures waiting instead of its
whole pair 6.67 s (4.57, 12.04, 18.55). Breakdown in docs/probing.md ("Effect on time to
detect"). Held-out ``--seed 909913711`` (13 faults, none on a new job): 4.83 -> 4.75 s.
With a loss history per access link (RNIC), kept across jobs: 5.87 s (4.48, 7.44, 18.55).
With each pair held to its own rate in its endpoint's test (9af7741): 5.71 s (4.24, 7.64, 18.55).
With what pairs crossing a ToR's uplinks lost as a young pair's prior (session 12): 5.55 s
(4.19, 7.24, 17.55); with no pair expecting less than its endpoint's rate too: 5.96 s (4.65,
7.64, 17.55).
Session 24, the plan's access floor (``--access-floor``, ``--min-interval``): 80/s 5.96 s,
160/s 4.38 (3.61, 4.84, 12.55), 240/s 4.03, 320/s 3.42 with 2 false events; 160/s with one pair
allowed 100/s (``min_interval_s`` 0.01) 3.32 s (2.19, 3.44, 16.55), 0 false here, but a false
loss event on a quick eval draw; with the far ends' rates in the endpoint test (the defaults
since): 3.42 s (2.19, 3.84, 17.05), 0 false (docs/probing.md).
Session 25 (with the engines' tick in the simulator: the same 3.42 s, fault for fault), the
fabric links' floor (``--link-floor``) 10 -> 40/s: 3.25 s (2.69, 4.04, 8.05), 0 false; not kept.
Session 26 (a restart's excuse ends its flows' runs; a ToR's excess must hold in its older or in
its young pairs): 3.42 s (2.19, 3.84, 17.05), 31 of 31, 0 false: unchanged.
Session 27 (each part of a path's own variance bounds the endpoint test: a fresh far RNIC stays
unknown where a crossing history sets the mean): 3.48 s (2.19, 4.04, 17.55), 31 of 31, 0 false.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from skh.analysis import detect as detect_mod
from skh.analysis import fastpath
from skh.analysis.detect import DetectorConfig
from skh.eval import field
from skh.eval.harness import _fabric
from skh.eval.profiles import QUICK
from skh.eval.scoring import match_events
from skh.failures import FailureType
from skh.probeplan import ProbePolicy
from skh.records import LOSS_STATUSES
from skh.sim.faults import Fault, RowSet
from skh.sim.noise import regime
from skh.sim.scenario import Simulation

#: failures of the link whose send times are reported (1-based)
KTH = (1, 3, 5, 8)


def _marks() -> list[tuple[int, str, float, set]]:
    """Record every loss verdict the fast path marks: (now, scope, window, pairs)."""
    got: list[tuple[int, str, float, set]] = []
    orig = fastpath.FastPathState._mark

    def mark(hit, cand, rc, in_w, F, ls, flagged, evidence, first_ns, fails):
        if hit.any():
            f = sys._getframe(1).f_locals
            scope = (
                "pair"
                if "ep_group" not in f
                else ("endpoint" if f["ep_group"] is None else "group")
            )
            rows = cand[hit]
            pairs = set(zip(f["src"][rows].tolist(), f["dst"][rows].tolist(), strict=True))
            got.append((int(f["now_ns"]), scope, float(f["w"]), pairs))
        orig(hit, cand, rc, in_w, F, ls, flagged, evidence, first_ns, fails)

    fastpath.FastPathState._mark = staticmethod(mark)
    return got


_MARKS = _marks()


def run(seed: int, duration_s: int, faults_per_h: float, policy: ProbePolicy) -> dict:
    prof = dataclasses.replace(
        QUICK,
        types=(FailureType.CRC_ERROR,),
        gray_per_h=0.0,
        duration_s=float(duration_s),
        faults_per_h=faults_per_h,
    )
    sim = Simulation.build(
        _fabric(prof.hosts),
        prof.jobs,
        seed=seed,
        arrivals_per_min=prof.arrivals_per_min,
        probe_interval_s=prof.probe_interval_s,
        probe_policy=policy,
        noise=regime("field"),
        ping=field.inferred_pairs(seed, prof.skeleton_s),
    )
    marks = _MARKS
    marks.clear()
    loss = np.array(LOSS_STATUSES, np.uint8)
    # per fault id: send time and failed flag of every raw probe crossing its link
    seen: dict[int, list[np.ndarray]] = {}
    ticks: dict[int, list[tuple[int, int, int]]] = {}
    holder: dict = {}
    # per access fault: the probes behind its endpoints' baseline at its first tick
    base_probes: dict[int, int] = {}

    class Thinner(field.ResultThinner):
        def thin(self, batch):
            for rec in sim.ground_truth:
                if rec.type != FailureType.CRC_ERROR:
                    continue
                t0, t1 = rec.start_ns, min(rec.start_ns + int(60e9), rec.end_ns)
                w = batch[(batch["t_wall_ns"] >= t0) & (batch["t_wall_ns"] < t1)]
                if w.size == 0:
                    continue
                rows = RowSet(
                    sim.index,
                    sim.eps,
                    w["src_ep"],
                    w["dst_ep"],
                    w["path_id"],
                    np.zeros(w.size),
                )
                f = Fault(rec.type, rec.component, rec.start_s, rec.end_s)
                on = sim.engine.touches(f, rows)
                if on.any():
                    x = w[on]
                    seen.setdefault(rec.fault_id, []).append(
                        np.c_[x["t_wall_ns"], np.isin(x["status"], loss)]
                    )
            return super().thin(batch)

    class Det(detect_mod.Detector):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            holder["det"] = self

        def tick(self, now_ns):
            evs = super().tick(now_ns)
            n = self._n
            if n == 0:
                return evs
            s = self.fast.state[:n]
            cfg = self.fast.config
            src = self.pairs["src"][:n].astype(np.int64)
            dst = self.pairs["dst"][:n].astype(np.int64)
            running = (s["consec"] > 0) | (s["flow_max"] > 0)
            rate = s["rate_hz"].astype(np.float64)
            m_ep = int(max(src.max(), dst.max(), len(sim.eps) - 1)) + 1
            for rec in sim.ground_truth:
                if rec.type != FailureType.CRC_ERROR or not (
                    rec.start_ns <= now_ns <= rec.start_ns + int(60e9)
                ):
                    continue
                # the scope the link's failures meet: the endpoints on its RNIC (access), else
                # the fault's pairs
                a, b = rec.component.split("|")
                rn = a if ":rnic" in a else b if ":rnic" in b else None
                if rn is not None:
                    host, rail = rn.split(":rnic")
                    eps = np.flatnonzero(sim.eps.rnic == sim.index.rnic_id(host, int(rail)))
                    # each endpoint's baseline as the detector has it (its pairs' or its link's)
                    A_e, B_e = self.fast._endpoint_pooled(src, dst, m_ep)
                    base_probes.setdefault(
                        rec.fault_id,
                        round(float(B_e[eps].max(initial=cfg.prior_probes)) - cfg.prior_probes),
                    )
                    scopes = [
                        (np.isin(src, e) | np.isin(dst, e), A_e[e], B_e[e]) for e in eps.tolist()
                    ]
                else:
                    ap = np.asarray(rec.affected_pairs, np.int64)
                    key = src * 2**32 + dst
                    m = np.isin(key, ap[:, 0] * 2**32 + ap[:, 1])
                    A = s["base_f"][m].sum() + cfg.prior_loss * cfg.prior_probes
                    B = s["base_n"][m].sum() + cfg.prior_probes
                    scopes = [(m, A, B)]
                best = {"all": 0.0, "settled": 0.0}
                F_best = {"all": 0, "settled": 0}
                for m, A, B in scopes:
                    if not m.any():
                        continue
                    ring = s["fail_ns"][m]
                    ring = np.where(ring > s["out_seen_ns"][m][:, None], ring, -1)
                    for name, use in (("all", np.ones(m.sum(), bool)), ("settled", ~running[m])):
                        for w in cfg.group_windows_s:
                            in_w = ring >= now_ns - int(w * 1e9)
                            F = int(in_w[use].sum())
                            nn = float((rate[m] * w)[use].sum())
                            if F < cfg.loss_count:
                                continue
                            ls = float(fastpath._nb_logsf(np.array([F]), np.array([nn]), A, B)[0])
                            if ls < best[name]:
                                best[name], F_best[name] = ls, F
                ticks.setdefault(rec.fault_id, []).append(
                    (now_ns, best["all"], best["settled"], F_best["all"], F_best["settled"])
                )
            return evs

    field.ResultThinner, field.Detector = Thinner, Det
    t_cpu = time.process_time()
    out = field.field_run(sim, prof, seed)
    cpu = time.process_time() - t_cpu
    recs = [r for r in out["records"] if r.fault_id not in out["gray"]]
    window_ns = int(DetectorConfig().window_s * 1e9)
    _, detected = match_events(recs, out["events"], window_ns, {})
    det = holder["det"]
    faults = []
    for r in recs:
        a, b = r.component.split("|")
        kind = "access" if ":rnic" in a or ":rnic" in b else "fabric"
        x = np.concatenate(seen.get(r.fault_id, [np.zeros((0, 2), np.int64)]))
        x = x[np.argsort(x[:, 0], kind="stable")]
        fail_t = (x[x[:, 1] == 1, 0] - r.start_ns) / 1e9
        span = min(60.0, r.end_s - r.start_s)
        evs = detected[r.fault_id]
        row: dict = {
            "fault": r.fault_id,
            "link": r.component,
            "kind": kind,
            "new_job": r.fault_id in out["new_job"],
            "pairs": int(len(r.affected_pairs)),
            "probes_per_s": round(x.shape[0] / span, 1),
            "fails_per_s": round(float(fail_t.size) / span, 2),
            "kth_fail_s": {k: round(float(fail_t[k - 1]), 2) for k in KTH if fail_t.size >= k},
            "ttd_s": None,
            "baseline_probes": base_probes.get(r.fault_id),
        }
        if evs:
            ev = evs[0]
            row["ttd_s"] = round((ev.detected_ns - r.start_ns) / 1e9, 2)
            row["event_kind"] = ev.kind
            row["fails_before_event"] = int(np.count_nonzero(fail_t <= row["ttd_s"]))
            pairs = set(ev.pairs)
            row["tests"] = sorted(
                {
                    f"{scope}@{w:g}s"
                    for now, scope, w, got in marks
                    if now == ev.detected_ns and pairs & got
                }
            )
        log_alpha = np.log(det.config.fast.alpha)
        tk = ticks.get(r.fault_id, [])
        for j, name in ((1, "all"), (2, "settled")):
            hit = [t for t in tk if t[j] <= log_alpha]
            row[f"stat_crossed_{name}_s"] = (
                round((hit[0][0] - r.start_ns) / 1e9, 2) if hit else None
            )
            row[f"stat_fails_{name}"] = hit[0][2 + j] if hit else None
        faults.append(row)
    ttd = [f["ttd_s"] for f in faults if f["ttd_s"] is not None]
    return {
        "seed": seed,
        "duration_s": duration_s,
        "cpu_s": round(cpu, 1),
        "faults": faults,
        "caught": len(ttd),
        "ttd_mean_s": round(float(np.mean(ttd)), 2) if ttd else None,
        "false_events": sum(
            1 for ev in out["events"] if not any(ev in detected[r.fault_id] for r in recs)
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, action="append")
    ap.add_argument("--duration", type=int, default=1200)
    ap.add_argument("--faults-per-h", type=float, default=60.0)
    ap.add_argument(
        "--access-floor", type=float, help="the plan's access_link_min_per_s (default: its own)"
    )
    ap.add_argument(
        "--min-interval", type=float, help="the plan's min_interval_s (default: its own)"
    )
    ap.add_argument("--link-floor", type=float, help="the plan's link_min_per_s (default: its own)")
    args = ap.parse_args()
    policy = ProbePolicy(interval_s=QUICK.probe_interval_s)
    if args.access_floor is not None:
        policy = dataclasses.replace(policy, access_link_min_per_s=args.access_floor)
    if args.min_interval is not None:
        policy = dataclasses.replace(policy, min_interval_s=args.min_interval)
    if args.link_floor is not None:
        policy = dataclasses.replace(policy, link_min_per_s=args.link_floor)
    runs = [run(s, args.duration, args.faults_per_h, policy) for s in args.seed or [7301]]
    ttd = [f["ttd_s"] for r in runs for f in r["faults"] if f["ttd_s"] is not None]
    by_class: dict[str, list[float]] = {}
    for f in (f for r in runs for f in r["faults"] if f["ttd_s"] is not None):
        c = "fabric" if f["kind"] == "fabric" else "new_job" if f["new_job"] else "established"
        by_class.setdefault(c, []).append(f["ttd_s"])
    print(
        json.dumps(
            {
                "runs": runs,
                "ttd_mean_s_by_class": {
                    c: {"n": len(v), "mean": round(float(np.mean(v)), 2)}
                    for c, v in sorted(by_class.items())
                },
                "false_events": sum(r["false_events"] for r in runs),
                "faults": sum(len(r["faults"]) for r in runs),
                "caught": len(ttd),
                "ttd_mean_s": round(float(np.mean(ttd)), 2) if ttd else None,
                "ttd_p50_s": round(float(np.median(ttd)), 2) if ttd else None,
                "access_link_min_per_s": policy.access_link_min_per_s,
                "min_interval_s": policy.min_interval_s,
                "link_min_per_s": policy.link_min_per_s,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
