"""Render an evaluation result (the dict :func:`skh.eval.harness.run_eval` returns) as Markdown and
HTML tables, ours beside the paper's. Every table's caption carries the seed, scale and commit."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Table",
    "tables",
    "differences",
    "to_markdown",
    "to_html",
    "results_page",
    "readme_section",
    "replace_readme_section",
]


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def _pct(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.1f}%"


def _num(v: Any, nd: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{float(v):,.{nd}f}"


def _ci(v: Any, ci: Any) -> str:
    if v is None:
        return "—"
    lo, hi = (ci or [None, None])[:2]
    return f"{_pct(v)} ({_pct(lo)}–{_pct(hi)})" if lo is not None else _pct(v)


def tables(r: dict[str, Any]) -> list[Table]:
    meta, t = r["meta"], r["table"]
    sc = meta["scale"]
    nm = r["noise_measured"]
    na = nm["answers"]
    cap = (
        f"seeds {', '.join(map(str, meta['seeds']))} · regime {r['noise_regime']['name']} · "
        f"{sc['hosts']:,} hosts × {sc['rnics_per_host']} RNICs ({sc['rnics']:,} RNICs, "
        f"{sc['jobs_at_start']:,} jobs at the start) · profile {meta['profile']} · "
        f"commit {meta['commit'][:12]}"
    )
    d, loc, pr = t["detection"], t["localization"], t["probing"]
    e2e = loc["end_to_end"]
    paper = r["paper"]
    th, mx = r["thresholds"], r["maxima"]
    proj = d["projection"]
    out = [
        Table(
            "Headline",
            cap,
            ("metric", "ours (95 % CI)", "paper (production)", "CI gate"),
            (
                (
                    "detection precision",
                    _ci(r["precision"], d["precision_ci"]),
                    _pct(paper["precision"]),
                    ">= " + _pct(th["precision"]),
                ),
                (
                    "detection recall",
                    _ci(r["recall"], d["recall_ci"]),
                    _pct(paper["recall"]),
                    ">= " + _pct(th["recall"]),
                ),
                (
                    "false positives per 1,000 host-hours",
                    _num(r["fp_per_1k_host_hours"], 3),
                    "—",
                    "<= " + _num(mx["fp_per_1k_host_hours"], 1),
                ),
                (
                    "localization, end to end: component",
                    _ci(e2e["accuracy"], e2e["accuracy_ci"]),
                    _pct(paper["localization_accuracy"]),
                    ">= " + _pct(th["e2e_localization_accuracy"]),
                ),
                (
                    "localization, end to end: failure type",
                    _ci(e2e["type_accuracy"], e2e["type_accuracy_ci"]),
                    "—",
                    ">= " + _pct(th["e2e_type_accuracy"]),
                ),
                (
                    "localization from oracle suspects (diagnostic)",
                    _pct(loc["accuracy"]),
                    "—",
                    "—",
                ),
                (
                    "skeleton coverage of used pairs",
                    _pct(r["skeleton_coverage"]),
                    "—",
                    ">= " + _pct(th["skeleton_coverage"]),
                ),
                (
                    "time to detect, mean / p50 / p99 (s)",
                    f"{_num(r['ttd_mean_s'])} / {_num(r['ttd_p50_s'])} / {_num(r['ttd_p99_s'])}",
                    _num(paper["ttd_mean_s"], 1),
                    "—",
                ),
                (
                    "precision projected to the paper's failure rate",
                    f"{_pct(proj['paper']['precision'])} "
                    f"(>= {_pct(proj['paper']['precision_low95'])})",
                    _pct(paper["precision"]),
                    "—",
                ),
                (
                    "precision projected to the InfiniteHBD trace's rate",
                    f"{_pct(proj['infinitehbd_trace']['precision'])} "
                    f"(>= {_pct(proj['infinitehbd_trace']['precision_low95'])})",
                    "—",
                    "—",
                ),
            ),
            sc["note"]
            + f"; {d['virtual_h_per_seed']} h of virtual time per seed; {d['faults']} faults of "
            f"the paper's 19 types (Poisson arrivals, up to {d['overlap']['max_concurrent']} at "
            f"once, {_pct(d['overlap']['overlapping_share'])} overlapping another; "
            f"{d['new_jobs']['faults']} on jobs ready < 1 min), {d['events']} detection events, "
            f"{d['false_events']} false, over {d['healthy_host_h']:,.0f} healthy host-hours. "
            "Intervals: Wilson 95 % over the pooled seeds.",
        ),
        Table(
            "Noise measured (what the regime really produced)",
            cap,
            ("source", "measured"),
            (
                ("benign loss per probe", f"{nm['benign_loss_per_probe']:.2e}"),
                (
                    "healthy RTT / pair base: p50, p99, p99.9, p99.99, max",
                    " / ".join(
                        _num((nm["rtt_over_base"] or {}).get(k), 3)
                        for k in ("p50", "p99", "p99.9", "p99.99", "max")
                    ),
                ),
                (
                    "CPU stalls (of which past the 1 s timeout)",
                    f"{nm['cpu_stalls']:,} "
                    f"({nm['stall_timeouts']:,} timed-out probes, {nm['local_errors']:,} "
                    "LOCAL_ERROR)",
                ),
                ("clock steps", f"{nm['clock_steps']:,}"),
                (
                    "congestion episodes (s p50/max, us p50/max)",
                    f"{nm['congestion_episodes']:,} ("
                    f"{_num((nm['congestion_s'] or {}).get('p50'), 1)}/"
                    f"{_num((nm['congestion_s'] or {}).get('p100'), 1)} s, "
                    f"{_num((nm['congestion_us'] or {}).get('p50'), 1)}/"
                    f"{_num((nm['congestion_us'] or {}).get('p100'), 1)} us)",
                ),
                ("agent restarts", f"{nm['agent_restarts']:,}"),
                (
                    "answers to localization: switches silent to traceroute, hop answers "
                    "(share), host reports missing, flags missing / stale",
                    f"{na.get('silent_switches', 0):,}, {_num(na.get('hop_answer_share'), 3)}, "
                    f"{na['reports_missing']:,} of {na['reports']:,}, "
                    f"{na['flags_missing']:,} / {na['flags_stale']:,} of {na['flags']:,}",
                ),
            ),
            f"{nm['hours']} h of simulated cluster time, {nm['probes']:,} probes. The regime's "
            "knobs and where each magnitude comes from: skh/sim/noise.py, and for the answers "
            "to localization (traceroutes, host reports, flow tables) skh/sim/answers.py.",
        ),
    ]
    cal = r["calibration"]
    ho = t.get("heldout")
    cal_rows = [
        (
            "training (thresholds chosen here)",
            cal["training"]["regime"],
            ", ".join(map(str, cal["training"]["seeds"])),
            "—",
            "—",
            "—",
        ),
        (
            "evaluated"
            + (" (seeds drawn at run time)" if cal["evaluated"]["drawn_at_run_time"] else ""),
            cal["evaluated"]["regime"],
            ", ".join(map(str, cal["evaluated"]["seeds"])),
            _ci(r["precision"], d["precision_ci"]),
            _ci(r["recall"], d["recall_ci"]),
            _num(r["fp_per_1k_host_hours"], 3),
        ),
    ]
    if ho:
        cal_rows.append(
            (
                "held-out regime",
                ho["regime"],
                ", ".join(map(str, ho["seeds"])),
                _ci(ho["precision"], ho["precision_ci"]),
                _ci(ho["recall"], ho["recall_ci"]),
                _num(ho["fp_per_1k_host_hours"], 3),
            )
        )
    out.append(
        Table(
            "Calibration held out",
            cap,
            ("set", "regime", "seeds", "precision", "recall", "FP / 1k host-h"),
            tuple(cal_rows),
            cal["training"]["what"] + ".",
        )
    )
    out.append(
        Table(
            "Detection per failure type",
            cap,
            (
                "#",
                "type",
                "layer",
                "faults",
                "detected",
                "recall",
                "events",
                "kind fits",
                "TTD mean / p50 / p99 (s)",
            ),
            tuple(
                (
                    str(v["no"]) + ("" if v["in_paper"] else "*"),
                    v["name"],
                    v["layer"],
                    str(v["faults"]),
                    str(v["detected"]),
                    _pct(v["recall"]),
                    str(v["events"]),
                    _pct(v["precision_kind"]),
                    f"{_num(v['ttd_s']['mean'], 1)} / {_num(v['ttd_s']['p50'], 1)} / "
                    f"{_num(v['ttd_s']['p99'], 1)}",
                )
                for v in d["per_type"].values()
            ),
            "(*) not one of the paper's 19 types (the simulator's extras: agent crash, late agent, "
            "vswitch loop); left out of the headline. 'kind fits': share of the events matched to "
            "the type's faults whose kind fits its symptom. A fault no probed pair crosses counts "
            f"as missed ({d['invisible_faults']} such). A fault every probe of which another "
            "fault had already failed outright (a latency fault on an RNIC whose link is down) "
            f"is left out, since no monitor could see it ({d.get('masked_faults', 0)} such"
            + (f": {', '.join(d['masked'][:8])}" if d.get("masked") else "")
            + ").",
        )
    )
    gray_rows = tuple(
        (
            kind,
            row["magnitude"],
            row["flows"],
            str(row["faults"]),
            str(row["detected"]),
            _pct(row["rate"]),
        )
        for kind, rows_ in d["gray"].items()
        for row in rows_
    )
    out.append(
        Table(
            "Gray faults (outside the precision/recall gate)",
            cap,
            ("kind", "magnitude", "flows", "faults", "detected", "rate"),
            gray_rows or (("none drawn", "", "", "", "", ""),),
            "Loss on a link, or added latency on a switch, on every flow of the pairs crossing it "
            "or on one flow label of four. Their events count neither as true nor as false "
            "positives.",
        )
    )
    rp = t["ramps"]
    out.append(
        Table(
            "Slow ramps (the long-term test)",
            cap,
            ("ramps", "caught", "by the long-term test", "mean time to catch (s)", "false events"),
            (
                (
                    str(rp["ramps"]),
                    str(rp["caught"]),
                    str(rp["caught_by_long_term"]),
                    _num(
                        sum(x["after_s"] for x in rp["per_ramp"] if x["caught"])
                        / max(1, rp["caught"]),
                        0,
                    ),
                    str(rp["false_events"]),
                ),
            ),
            f"{rp['hosts']} hosts, {rp['virtual_h']} h, probed once a second; each ramp grows "
            f"to +{rp['ramp_extra_us']:g} us over {rp['ramp_s']:g} s, too slowly for the "
            "5-minute look-back to see; 30-minute blocks.",
        )
    )
    out.append(
        Table(
            "Localization per failure type (end to end, and the oracle suite)",
            cap,
            ("type", "layer", "cases e2e", "component e2e", "type e2e", "suite"),
            tuple(
                (
                    k,
                    _layer(k, d),
                    str(v["n"]),
                    _pct(v["component"]),
                    _pct(v["type"]),
                    _pct((loc["per_type"].get(k) or {}).get("accuracy")),
                )
                for k, v in e2e["per_type"].items()
            ),
            f"End to end: rounds every {e2e['reask_s']:g} s over the {e2e['window_s']:g} s after "
            "a fault's first detection (or its flapping re-raise), each localizing every suspect "
            "the detector raised so far (false ones and other faults' included) through the "
            f"simulated agents' answers ({e2e['answers']} answer noise), with the open alerts as "
            "known culprits; scored on the alerts open at the last round: component right = a "
            "certain alert names it, type right = its type is in the fault's class (merged "
            f"classes: {e2e['merged_types']}). Spurious alerts per fault: "
            f"{_num(e2e['spurious_alerts_per_fault'], 2)}. "
            f"Not scored: {e2e.get('detected_after_end', 0)} fault(s) first detected after they "
            "ended (nothing left to localize; detection's lateness). "
            f"Suite: oracle suspects built from the fault's record ({loc['scored']} cases), a "
            "diagnostic only.",
        )
    )
    rows = []
    used = {"full_mesh": 1.0, "same_rail": 1.0}
    for n, row in pr["rows"].items():
        p = row.get("paper_sweep_s") or {}
        used["detector"] = row["detector"].get("overlay_pairs_covered")
        used["skeleton"] = row["skeleton"].get("coverage")
        for k, label in (
            ("full_mesh", "full mesh"),
            ("same_rail", "same rail (Basic)"),
            ("detector", "deTector greedy"),
            ("skeleton", "skeleton"),
        ):
            rows.append(
                (
                    f"{int(n):,}",
                    label,
                    _num(row[k]["sweep_s"], 0),
                    _num(p.get(k)),
                    f"{row[k]['probes_per_sweep']:,}",
                    _num(row[k]["mean_list"]),
                    _pct(used[k]),
                )
            )
    last = pr["rows"][max(pr["rows"], key=int)]["detector"]
    out.append(
        Table(
            "Probing cost",
            cap.split(" · ")[0]
            + (
                " · job TP8 PP8 DP{8,16,32} on the Lingjun topology"
                f" · commit {meta['commit'][:12]}"
            ),
            (
                "RNICs",
                "ping list",
                "sweep s (ours)",
                "sweep s (paper)",
                "probes per sweep",
                "mean list",
                "used pairs probed",
            ),
            tuple(rows),
            "Model: each RNIC probes its list serially at one destination per second, so a sweep "
            "lasts the longest list. At 2,048 RNICs full mesh / skeleton probes = "
            f"{pr.get('full_mesh_over_skeleton_2048')}x (the paper's probe counts 60,430 / 2,593 = "
            f"{pr.get('paper_full_mesh_over_skeleton_2048')}x). deTector greedy: every reachable "
            f"link probed >= {last['beta']} times ({last['links_covered_beta']:,} of "
            f"{last['links']:,} links), {last['links_identifiable']:,} links told apart "
            "(1-identifiability is not enforced by the greedy).",
        )
    )
    rs = t["random_sampling"]
    out.append(
        Table(
            "Skeleton vs a random probe list with the same budget",
            cap,
            ("type", "faults", "skeleton probes across", "random list probes across"),
            tuple(
                (k, str(v["n"]), _pct(v["skeleton"]), _pct(v["random"]))
                for k, v in rs["per_type"].items()
            )
            + (
                (
                    "all (mean over seeds)",
                    "",
                    _pct(rs["skeleton_visible"]),
                    _pct(rs["random_visible"]),
                ),
            ),
            "Structural: does any live probed pair cross the faulty component while it is on "
            "(overlapping and gray faults included; per type: first seed). The random list gives "
            "each endpoint as many same-rail peers of its job as its skeleton list, drawn at "
            "random; it probes "
            + ", ".join(_pct(x["used_pairs_probed"]) for x in rs["per_seed"])
            + " of the pairs jobs use, the probed skeleton "
            + ", ".join(_pct(x["used_pairs_probed_skeleton"]) for x in rs["per_seed"])
            + ".",
        )
    )
    sk = t["skeleton"]
    out.append(
        Table(
            "Skeleton inference",
            cap,
            (
                "jobs",
                "used pairs",
                "coverage",
                "worst job",
                "list / same-rail",
                "paper example (9/64)",
                "modes",
            ),
            (
                (
                    str(sk["jobs"]),
                    f"{sk['used_pairs']:,}",
                    _pct(sk["coverage"]),
                    _pct(sk["coverage_min_job"]),
                    _num(sk["list_ratio_vs_same_rail"], 3),
                    _num(sk["paper_list_ratio_example"], 3),
                    ", ".join(f"{k} {v}" for k, v in sk["modes"].items()),
                ),
            ),
        )
    )
    ag = r["measured"]["agent"]
    ar = t["agent_rate"]
    if "cpu_pct_one_core" in ag:
        ag_rows = (
            ("CPU, % of one core", _agent_cpu(ag), _num(paper["agent_cpu_pct"], 1)),
            ("RSS (MB)", _num(ag["rss_mb"], 1), _num(paper["agent_rss_mb"], 1)),
            ("own memory, USS (MB)", _num(ag.get("uss_mb"), 1), ""),
        )
        if "bare_floor_cpu_pct" in ag:
            ag_rows += (
                ("same datagrams at a bare C engine's cost, %", _num(ag["bare_floor_cpu_pct"]), ""),
            )
    else:
        ag_rows = (("not measured", ag.get("error", "skipped"), ""),)
    out.append(
        Table(
            "Agent cost (wall-clock measurement, not in the deterministic table)",
            f"commit {meta['commit'][:12]} · {ag.get('path', '')}",
            ("measure", "ours", "paper"),
            ag_rows,
            f"One real agent process (the C engine) probing at {ag.get('rate_per_s', '—')} "
            f"probes/s and answering {ag.get('inbound_probes_per_s', '—')} over "
            f"{ag.get('paths', 1)} path ids for {ag.get('duration_s', '—')} s"
            + (
                f" ({ag['runs']} fresh agents: the median run's figures, the runs' CPU range "
                "beside it)"
                if ag.get("runs", 1) > 1
                else ""
            )
            + ": "
            "the busiest container's rate under the controller's probe plan (docs/probing.md; "
            f"{ar['probes_per_s_container_max']} probes/s at the flat "
            f"{ar['probe_interval_s']} s interval; median container "
            f"{ar['probes_per_s_container_p50']} probes/s).",
        )
    )
    return out


def _layer(type_name: str, detection: dict[str, Any]) -> str:
    v = detection["per_type"].get(type_name)
    if v:
        return v["layer"]
    from skh.failures import FailureType
    from skh.sim.faults import FAULT_SPECS

    return FAULT_SPECS[FailureType[type_name]].layer


def differences(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(topic, paragraph) pairs: why each of our figures differs from the paper's."""
    t, meta = r["table"], r["meta"]
    d, loc, pr, sk = t["detection"], t["localization"], t["probing"], t["skeleton"]
    rs, e2e = t["random_sampling"], loc["end_to_end"]
    sc = meta["scale"]
    proj = d["projection"]
    lat = [
        v["ttd_s"]["mean"]
        for v in d["per_type"].values()
        if v["layer"] and v["ttd_s"]["mean"] and v["name"]
    ]
    out = [
        (
            "Setting",
            f"The paper reports six months of production on 4K+ hosts (4,816 real failures). These "
            f"figures come from the simulator in the '{r['noise_regime']['name']}' regime "
            f"({r['noise_regime']['summary']}): the real Lingjun topology replicated to "
            f"{sc['hosts']:,} hosts x {sc['rnics_per_host']} RNICs, job churn, probes along the "
            "skeleton the pipeline infers from traffic counters, faults arriving as a Poisson "
            "process at a rate raised far above production's (overlapping at times, some on jobs "
            "that just started), scored end to end. Our figures are a simulation's; where they "
            "exceed the paper's they say the pipeline copes with the noise modelled here, not "
            "that it beats the paper's system in production.",
        ),
        (
            "Precision and recall",
            "The paper does not define its units. Ours: precision = detection events matched to "
            "an injected fault (one of its pairs, between its start and its end plus one 30 s "
            "window) / all events (gray faults' events left out); recall = faults with a matched "
            "event / faults placed on pairs the jobs use (one that no probed pair crosses is a "
            f"miss). Precision {_pct(r['precision'])} (95 % CI from {_pct(r['precision_ci_low'])})"
            f", recall {_pct(r['recall'])} (from {_pct(r['recall_ci_low'])}); with the event kind "
            "required to fit the symptom too, see the per-type table. Missed: "
            f"{', '.join(d['missed'][:8]) or 'none'}.",
        ),
        (
            "Precision at production's failure rate",
            "Raised fault rates flatter precision: with rare faults, every false positive weighs "
            f"more. We measured {d['false_events']} false events in {d['healthy_host_h']:,.0f} "
            f"healthy host-hours (upper 95 % bound {proj['fp_per_host_h_upper95'] * 1000:.2f} "
            "per 1,000 host-hours). At the paper's rate (4,816 failures in six months on 4,096 "
            f"hosts, {proj['paper']['failures_per_host_h'] * 1000:.2f} per 1,000 host-hours) that "
            f"projects to a precision of {_pct(proj['paper']['precision'])} (at least "
            f"{_pct(proj['paper']['precision_low95'])}); at the InfiniteHBD trace's NIC and "
            f"link-down rate ({proj['infinitehbd_trace']['failures_per_host_h'] * 1000:.3f} per "
            f"1,000 host-hours) {_pct(proj['infinitehbd_trace']['precision'])} (at least "
            f"{_pct(proj['infinitehbd_trace']['precision_low95'])}). A run this short cannot bound "
            "the false-positive rate tightly enough to show production-grade precision: that "
            "takes tens of thousands of healthy host-hours.",
        ),
        (
            "Time to detect",
            f"Mean {_num(r['ttd_mean_s'])} s (p50 {_num(r['ttd_p50_s'])}, p99 "
            f"{_num(r['ttd_p99_s'])}) against the paper's ~8 s. Outages are called when a run of "
            "failures becomes improbable under the pair's own loss baseline (3 probes at 10 Hz, "
            "~0.3 s) or when most of an endpoint's pairs fail together; loss waits for enough "
            "failures to beat the baseline at 1e-9 (seconds, more for low rates); latency "
            "shifts must hold 20 s (8 s when over 30 us) so that benign congestion episodes "
            "(<= 10 s) are not faults, so latency types take 20-30 s. The mean weights every "
            "type alike; the paper's weights types by their production frequency, unpublished.",
        ),
        (
            "Localization",
            f"End to end (component {_pct(e2e['accuracy'])}, type "
            f"{_pct(e2e['type_accuracy'])}) localizes what the detector raised, false and "
            "overlapping faults' suspects included, through agents' answers with the regime's "
            "noise; the paper's 95.7 % is over its production alerts. The oracle suite "
            f"({_pct(loc['accuracy'])}) feeds suspects built from the fault's own record and is "
            "a diagnostic only. Misses (type: truth -> verdicts): "
            + (
                "; ".join(
                    f"{m['type']}: {m['component']} -> {m['verdicts']}" for m in e2e["misses"][:6]
                )
                or "none"
            )
            + ".",
        ),
        (
            "Gray faults",
            "Not in the paper. Losses of 0.05-0.5 % and shifts of +2-8 us sit near the benign "
            "noise; the detection-rate curve says where our detector stops seeing them "
            "(per magnitude, all flows or one flow of four).",
        ),
    ]
    del lat
    rows = pr["rows"]
    sk_s = {n: rows[n]["skeleton"]["sweep_s"] for n in rows}
    out.append(
        (
            "Sweep time",
            "Full mesh and same rail follow the paper's rows within ~10 %: the paper's numbers fit "
            "one destination per second per RNIC (paper.md section 6), the model used here. Our "
            "skeleton list is a DP group's other members plus up to two pipeline neighbours, so "
            "the TP8 x PP8 x DP{8,16,32} jobs give "
            + ", ".join(f"{v:g} s at {int(n):,}" for n, v in sk_s.items())
            + ". The paper's 8.23 and 16.91 s match DP 8 and 16; its 25.09 s at 2,048 RNICs is "
            "below the 33 destinations a DP-32 group has, so its 2,048-RNIC job was shaped "
            "differently (not stated; e.g. DP 24-25 with a larger PP), or its list keeps fewer DP "
            "peers than a full group.",
        )
    )
    out.append(
        (
            "Probes per round",
            "The paper's 60,430 (full mesh) vs 2,593 (skeleton) at 2,048 RNICs has no stated unit. "
            "We count probes per sweep (every list summed: one probe per destination and sweep). "
            "2,048 RNICs x ~29.5 probes in a 30 s round at one probe per second gives the "
            "full-mesh figure (rate-limited probing), but no reading of that kind gives 2,593 for "
            "a skeleton of ~25 destinations per RNIC, so only the ratio is compared: ours "
            f"{pr.get('full_mesh_over_skeleton_2048')}x, the paper's "
            f"{pr.get('paper_full_mesh_over_skeleton_2048')}x; ours is larger because a full mesh "
            "of N RNICs grows as N^2 while the skeleton grows as N.",
        )
    )
    det_row = rows[max(rows, key=int)]["detector"]
    out.append(
        (
            "deTector",
            "The paper names deTector as the topology-aware baseline (15K+ probes per round) "
            "without figures. Our greedy probe matrix over the job's fabric region needs the "
            f"fewest probes ({det_row['probes_per_sweep']:,} per sweep at the largest size) "
            "because it probes links, not pairs: it probes only "
            f"{_pct(det_row.get('overlay_pairs_covered'))} of the pairs the job uses, so overlay, "
            "vswitch and RNIC-offload faults on the other pairs (about half of Table 1) stay "
            "invisible to it.",
        )
    )
    out.append(
        (
            "Random sampling",
            "A Pingmesh-style pinglist with the skeleton's budget per endpoint probed across "
            f"{_pct(rs['random_visible'])} of the faults' components, the inferred skeleton "
            f"{_pct(rs['skeleton_visible'])} (structural). Most simulated faults sit on a "
            "component (link, switch, RNIC, host, container) that any list of the faulty "
            "endpoint crosses, so a random list sees nearly as many; what it misses is the pairs "
            "jobs use (it probes "
            + ", ".join(_pct(x["used_pairs_probed"]) for x in rs["per_seed"])
            + " of them): faults confined to the flows of a pair it does not probe go unseen. "
            "Running the detector itself on the random list is not done here (it would double "
            "the cost).",
        )
    )
    out.append(
        (
            "Skeleton",
            f"Coverage of used pairs {_pct(sk['coverage'])} over {sk['jobs']:,} jobs (worst job "
            f"{_pct(sk['coverage_min_job'])}); the paper reports no coverage, only 'more than "
            "95 %' pruning of the basic list and the 9-of-64 example (ours: 9 of 63 at 512 RNICs "
            "in the probing table). Over the whole mix the list is "
            f"{_num(sk['list_ratio_vs_same_rail'], 3)} of the same-rail list: most simulated jobs "
            "are small (1-4 hosts, where the same-rail list is already the skeleton), and EP, "
            "debug and 4-RNIC jobs keep the safe same-rail list by design "
            f"({', '.join(f'{k} {v}' for k, v in sk['modes'].items())}).",
        )
    )
    ag = r["measured"]["agent"]
    if "cpu_pct_one_core" in ag:
        out.append(
            (
                "Agent cost",
                f"{_agent_cpu(ag)} % of one core and {_num(ag['rss_mb'], 1)} MB RSS "
                f"({_num(ag.get('uss_mb'), 1)} MB of its own, USS) "
                f"at {ag['rate_per_s']:g} probes/s sent and "
                f"{ag.get('inbound_probes_per_s', ag['rate_per_s']):g} answered (the busiest "
                "container's planned rates: the container with the most of both) against "
                "the paper's ~1 % and ~35 MB. Ours is the real overlay agent process (the C "
                "engine under Python, one engine per endpoint, its ping list and plan from a real "
                "controller) on loopback UDP; its RSS is mostly the interpreter and libzmq (the "
                "agent loads no numpy), whose library pages every sidecar on a host shares; the "
                "paper's is a Go sidecar on RDMA. Most of its CPU is its engines' thread (one "
                "for all its endpoints, woken by their probes, answers and send stamps)"
                + (
                    ": above the 2 % a container may cost (issue 17)"
                    if ag["cpu_pct_one_core"] > 2.0
                    else ""
                )
                + (
                    f". The same datagrams at a bare C engine's cost, measured beside it (a "
                    f"lone engine answering the agent's probes, twice over for the agent's "
                    f"probing and answering): {_num(ag['bare_floor_cpu_pct'])} %, the kernel's "
                    "UDP work on this machine, below which no agent probing at this rate over "
                    "kernel UDP goes (RDMA verbs bypass it)"
                    if "bare_floor_cpu_pct" in ag
                    else ""
                )
                + ". A short run: the figure is steady-state probing cost only.",
            )
        )
    if r["below_thresholds"]:
        out.append(("Below the CI thresholds", "; ".join(r["below_thresholds"]) + "."))
    return out


def _agent_cpu(ag: dict) -> str:
    """The agent's CPU %: the median run's, with every run's range where there were several."""
    runs = ag.get("cpu_pct_runs") or []
    if len(runs) < 2:
        return _num(ag["cpu_pct_one_core"])
    return f"{_num(ag['cpu_pct_one_core'])} ({_num(min(runs))}–{_num(max(runs))}, {len(runs)} runs)"


def _md_table(tb: Table, level: str = "##") -> list[str]:
    lines = [f"{level} {tb.title}", "", f"*{tb.caption}*", ""]
    lines.append("| " + " | ".join(tb.header) + " |")
    lines.append("|" + "|".join("---" for _ in tb.header) + "|")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in tb.rows]
    if tb.note:
        lines += ["", tb.note]
    return lines + [""]


def to_markdown(r: dict[str, Any]) -> str:
    lines = [f"# skh evaluation ({r['meta']['profile']} profile)", ""]
    for tb in tables(r):
        lines += _md_table(tb)
    lines += ["## Differences from the paper, explained", ""]
    for topic, text in differences(r):
        lines += [f"**{topic}.** {text}", ""]
    return "\n".join(lines)


#: the README section :func:`readme_section` writes (up to the next ``## `` heading)
README_SECTION = "## Results beside the paper"
_GENERATED = (
    "<!-- generated by bench/results.py (make results) from the full profile's eval.json: "
    "edit the generator (skh/eval/report.py), not this text -->"
)


def _provenance(r: dict[str, Any]) -> str:
    meta, tm = r["meta"], r.get("timings", {})
    sc = meta["scale"]
    seeds = ", ".join(map(str, meta["seeds"]))
    ho = r["table"].get("heldout")
    held = (
        f"; held out: regime {ho['regime']}, seeds {', '.join(map(str, ho['seeds']))}" if ho else ""
    )
    drawn = "drawn at run time" if r["calibration"]["evaluated"]["drawn_at_run_time"] else "given"
    cost = ""
    if tm.get("total") is not None:
        n = tm.get("workers", 1)
        cost = (
            f" It took {tm['total'] / 60:.0f} min of wall time and "
            f"{tm.get('total_cpu', 0) / 60:.0f} min of CPU ({n} worker "
            f"process{'es' if n != 1 else ''})."
        )
        if tm.get("stages kept"):
            cost += (
                f" {tm['stages kept']} of its stages were kept from a run stopped earlier on the"
                " same code (skh/ and csrc/ as committed; their CPU is counted, the wall time is"
                " the last run's)."
            )
    return (
        f"Profile **{meta['profile']}** on commit `{meta['commit'][:12]}`: "
        f"{sc['hosts']:,} hosts × {sc['rnics_per_host']} RNICs ({sc['topology']}), regime "
        f"`{r['noise_regime']['name']}`, seeds {seeds} ({drawn}){held}.{cost}"
    )


def results_page(r: dict[str, Any]) -> str:
    """``docs/results.md``: the whole report of one run, with where it came from."""
    body = to_markdown(r).split("\n", 2)[2]  # below the report's own title
    return "\n".join(
        [
            "# Evaluation results: the paper's tables on the simulator",
            "",
            _GENERATED,
            "",
            _provenance(r)
            + " `make results` reruns it (`bench/results.py`: `skh eval --full`, then this page "
            "and the README's results section from its `eval.json`).",
            "",
            body,
        ]
    )


def readme_section(r: dict[str, Any]) -> str:
    """The README's results section: the headline table and where the run falls short."""
    lines = [README_SECTION, "", _GENERATED, "", _provenance(r), ""]
    lines += _md_table(tables(r)[0], "###")
    below = r["below_thresholds"]
    lines.append(
        "Short of the CI gate: " + "; ".join(below) + "."
        if below
        else "Every CI gate holds on this run's point estimates."
    )
    lines += [
        "",
        "Every table, the per-type breakdowns and why each figure differs from the paper's are "
        "in [`docs/results.md`](docs/results.md).",
        "",
    ]
    return "\n".join(lines)


def replace_readme_section(readme: str, section: str) -> str:
    """``readme`` with its results section (heading to the next ``## `` or the end) replaced."""
    start = readme.find("\n" + README_SECTION + "\n")
    if start < 0:
        return readme.rstrip("\n") + "\n\n" + section
    nxt = readme.find("\n## ", start + 1)
    tail = readme[nxt:] if nxt >= 0 else "\n"
    return readme[: start + 1] + section.rstrip("\n") + "\n" + tail


def to_html(r: dict[str, Any]) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>skh evaluation ({e(r['meta']['profile'])})</title>",
        "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #bbb;padding:.2em .6em;text-align:right}"
        "td:first-child,th:first-child{text-align:left}"
        "caption{font-style:italic;text-align:left}</style></head><body>",
        f"<h1>skh evaluation ({e(r['meta']['profile'])} profile)</h1>",
    ]
    for tb in tables(r):
        parts.append(f"<h2>{e(tb.title)}</h2><table><caption>{e(tb.caption)}</caption><tr>")
        parts += [f"<th>{e(h)}</th>" for h in tb.header]
        parts.append("</tr>")
        for row in tb.rows:
            parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
        if tb.note:
            parts.append(f"<p>{e(tb.note)}</p>")
    parts.append("<h2>Differences from the paper, explained</h2>")
    parts += [f"<p><b>{e(topic)}.</b> {e(text)}</p>" for topic, text in differences(r)]
    parts.append("</body></html>")
    return "\n".join(parts)
