"""``skh demo --sim``: the same :class:`~skh.orchestrator.pipeline.Pipeline` over the simulator,
in virtual time (no root, no daemons): the simulator's counters feed skeleton inference, whose
skeletons become the simulator's ping lists; its probe results feed detection; its agents'
answers (:class:`skh.sim.answers.SimSource`) feed localization; the alerts are scored against
its ground truth and written to the same HTML report as the live demo.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skh.demo.live import FaultOutcome
from skh.model import Fabric, same_rail_pairs

__all__ = ["SCRIPT", "SimRun", "run_sim", "simulate"]

#: (fault type name, start s, end s) in virtual time; skeletons are in place after ~95 s
SCRIPT: tuple[tuple[str, float, float], ...] = (
    ("SWITCH_PORT_DOWN", 130.0, 160.0),
    ("RNIC_PORT_DOWN", 200.0, 230.0),
    ("AGENT_CRASH", 270.0, 300.0),
)


def _same(component: str, truth: str) -> bool:
    from skh.eval.localization import same_component as same

    return same(component, truth)


class SimRun:
    """The simulated cluster with the scripted faults and the pipeline over it, a virtual second
    at a time. ``t0_ns``: the wall-clock time of virtual t = 0 (default: the simulator's fixed
    epoch, so runs are reproducible); ``pipeline``: :class:`PipelineConfig` settings to change."""

    def __init__(
        self,
        *,
        seed: int = 1,
        script: tuple[tuple[str, float, float], ...] = SCRIPT,
        t0_ns: int | None = None,
        pipeline: Mapping[str, Any] | None = None,
    ) -> None:
        from skh.analysis.skeleton import Skeleton
        from skh.failures import FailureType
        from skh.orchestrator.config import DEFAULT_COUNTER_HZ
        from skh.orchestrator.pipeline import Pipeline, PipelineConfig
        from skh.sim.answers import SimSource, sim_overlay_component, sim_overlay_endpoint
        from skh.sim.faults import Fault
        from skh.sim.scenario import Simulation, VirtualClock

        fabric = Fabric.from_params(hosts=16, rnics_per_host=8, hosts_per_segment=8, spines=2)
        clock = {} if t0_ns is None else {"clock": VirtualClock(t0_ns)}
        # counters at the rate the deployed underlay agent samples them (skeleton inference
        # tells partners apart by that rate)
        sim = Simulation.build(
            fabric,
            4,
            seed=seed,
            ping="same_rail",
            start_s=(-900.0, -600.0),
            counter_hz=DEFAULT_COUNTER_HZ,
            **clock,
        )
        self.sim = sim
        preload = {j.name: same_rail_pairs(j.ep_ids, j.rail, j.host) for j in sim.jobs}
        applied: dict[str, np.ndarray] = {}
        self.preload, self.applied = preload, applied

        def apply(job: str, sk: Skeleton, version: int) -> bool:
            applied[job] = sk.pairs
            sim.set_ping_pairs(np.concatenate([applied.get(j, p) for j, p in preload.items()]))
            return True

        cfg = PipelineConfig(
            **{"fabric": fabric.to_mapping(), "resolve_after_s": 20.0, **(pipeline or {})}
        )
        self.pipe = Pipeline(
            cfg,
            source_factory=lambda _cl: SimSource(sim),
            apply_skeleton=apply,
            overlay_endpoint=sim_overlay_endpoint,
            overlay_component=sim_overlay_component,
        )
        self.pipe.set_cluster(sim.cluster)
        self.truths = []
        for i, (name, start, end) in enumerate(script):
            ftype = FailureType[name]
            cands = sim.candidates(ftype)
            if cands:
                # spread over the cluster: faults on one RNIC would share their pairs
                pick = cands[(i * len(cands)) // len(script)]
                self.truths.append(sim.inject(Fault(ftype, pick, start_s=start, end_s=end)))

    def steps(self, duration_s: int) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
        """Each virtual second's simulator step and the alerts the pipeline made of it."""
        for step in self.sim.run(duration_s):
            now_ns = self.sim.clock.now_ns
            yield step, self.pipe.process(step.probes, step.counters, now_ns, step.heartbeats)


def simulate(*, seed: int = 1, duration_s: int = 360, say=print) -> dict[str, Any]:
    """Run the scripted scenario; returns what the report needs."""
    run = SimRun(seed=seed)
    sim, pipe, truths = run.sim, run.pipe, run.truths
    cluster, preload, applied = sim.cluster, run.preload, run.applied
    alerts: list[dict[str, Any]] = []
    probes: list[np.ndarray] = []
    timeline: list[tuple[int, str]] = []
    seq = 0
    t0_ns = sim.clock.now_ns
    for step, found in run.steps(duration_s):
        now_ns = sim.clock.now_ns
        probes.append(step.probes)
        for a in found:
            seq += 1
            rec = {**a, "seq": seq, "ts_ns": now_ns}
            alerts.append(rec)
            if a["kind"] == "skeleton":
                msg = f"skeleton of {a['job']}: {a['mode']}, {a['n_pairs']} pairs"
            else:
                msg = f"alert {a['state']}: {a['layer']} {a['component']} ({a['failure_type']})"
            timeline.append((now_ns, msg))
            say(f"t={step.t_s:5.0f}s  {msg}")
    outcomes = []
    for rec in truths:
        truth = {
            "id": rec.fault_id,
            "kind": rec.name,
            "layer": rec.layer,
            "component": rec.component,
            "paper_type": int(rec.type),
        }
        out = FaultOutcome(truth, int(rec.start_ns), int(rec.end_ns))
        out.detected = next(
            (
                a
                for a in alerts
                if a.get("state") == "open"
                and a["ts_ns"] >= rec.start_ns
                and _same(a["component"], rec.component)
            ),
            None,
        )
        if out.detected is not None:
            out.resolved = next(
                (
                    a
                    for a in alerts
                    if a.get("state") == "resolved"
                    and a["alert_id"] == out.detected["alert_id"]
                    and a["seq"] > out.detected["seq"]
                ),
                None,
            )
        out.others = [
            a
            for a in alerts
            if a.get("state") == "open"
            and rec.start_ns <= a["ts_ns"] <= rec.end_ns
            and a is not out.detected
        ]
        outcomes.append(out)
    skeletons = {}
    for job in sim.jobs:
        truth = {tuple(p) for p in job.skeleton_pairs.tolist()}
        got = {tuple(p) for p in applied.get(job.name, preload[job.name]).tolist()}
        st = pipe.jobs.get(job.name)
        skeletons[job.name] = {
            "endpoints": job.ep_ids.tolist(),
            "applied": sorted(got),
            "truth": sorted(truth),
            "equal": got == truth,
            "covers": truth <= got,
            "mode": st.skeleton.mode if st and st.skeleton else "preload",
            "confidence": float(st.skeleton.confidence) if st and st.skeleton else 0.0,
        }
    return {
        "cluster": cluster,
        "outcomes": outcomes,
        "alerts": alerts,
        "probes": np.concatenate(probes),
        "skeletons": skeletons,
        "timeline": timeline,
        "started_ns": t0_ns,
        "ended_ns": sim.clock.now_ns,
    }


def run_sim(out: Path, *, console: Any, seed: int = 1) -> int:
    from rich.table import Table

    from skh.demo.report import build_data, write_report

    console.print(
        "[bold]simulator-backed demo[/]: 16 hosts x 8 RNICs, 4 jobs, 6 min of virtual time"
    )
    t = time.monotonic()
    res = simulate(
        seed=seed, say=lambda m: console.print(f"[dim]{time.monotonic() - t:5.1f}s[/] {m}")
    )
    table = Table(title="Faults vs verdicts (simulated)")
    for col in ("fault", "truth", "verdict", "detect", "alert", "resolved"):
        table.add_column(col)
    for o in res["outcomes"]:
        d = o.detected
        table.add_row(
            o.truth["kind"],
            f"{o.truth['layer']} {o.truth['component']}",
            f"{d['layer']} {d['component']}" if d else "[red]—[/]",
            f"{o.detect_s:.0f} s" if o.detect_s is not None else "—",
            f"{o.alert_s:.0f} s" if o.alert_s is not None else "—",
            "yes" if o.resolved else "[red]no[/]",
        )
    console.print(table)
    # a job whose traffic fits no skeleton keeps its safe list: that is right, not a miss
    data = build_data(
        title="skh demo: SkeletonHunter on the simulator",
        mode="simulated",
        cluster=res["cluster"],
        skeletons=res["skeletons"],
        probes=res["probes"],
        faults=res["outcomes"],
        alerts=res["alerts"],
        timeline=res["timeline"],
        started_ns=res["started_ns"],
        ended_ns=res["ended_ns"],
        skeleton_ok=True,
    )
    path = write_report(out, data)
    console.print(f"report: [bold]{path.resolve()}[/]")
    return 0 if data["ok"] else 1
