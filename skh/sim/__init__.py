"""The production-scale simulator: fabric, jobs, traffic, probe results and failures, with ground
truth, in virtual time.

It produces exactly what the real system consumes — a :class:`skh.model.Cluster` filled with
endpoints, ``PROBE_DTYPE`` result batches, ``COUNTER_DTYPE`` counter batches, traceroutes, overlay
state and flow-table dumps — so every algorithm runs unchanged on simulated and real data.
Everything is deterministic under a seed; all bulk data is numpy (no per-probe Python objects).

Typical use::

    from skh.model import Fabric
    from skh.sim import LINGJUN_TOPO
    from skh.failures import FailureType
    from skh.sim.faults import Fault
    from skh.sim.scenario import Simulation

    sim = Simulation.build(Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=4096), 2000, seed=1)
    sim.inject(Fault(FailureType.RNIC_PORT_DOWN, "p0-0c9d9de1b19e:rnic3", start_s=60, end_s=120))
    for step in sim.run(600):           # 10 min of virtual time, 1 s per step
        analyze(step.probes, step.counters, step.heartbeats)
    truth = sim.ground_truth            # what the evaluation scores against

Public API (stable; other modules code against it)
--------------------------------------------------

Fabric (``skh.model`` and :mod:`skh.sim.topology`)
    ``Fabric.from_params(hosts=, rnics_per_host=, hosts_per_segment=, spines=, cores=)``
    ``Fabric.from_lingjun(csv_path, scale_to_hosts=None, rnics_per_host=8)`` — the real Lingjun
    topology (847 hosts → 48 ASW segments × rails → 3 PSW → 1 DSW), pods replicated to scale.
    ``FabricIndex(fabric)`` — dense ids; ``.route(src_rnic, dst_rnic, path_id) -> Route`` (the
    ECMP path a path id pins, vectorised), ``.path_names(src_rnic, dst_rnic, path_id)``,
    ``.paths_names(src, dst, path_id)`` (many at once), ``.rnic_id(host, rail)``,
    ``.uses_link(route, a, b)``, ``.uses_switch(route, name)``.
    ``LINGJUN_TOPO`` — path of the Lingjun ``topo.csv`` shipped in ``skh/sim/data/``.

Jobs (:mod:`skh.sim.jobs`)
    ``make_job(cluster, name, JobShape(tp, pp, dp, ep), kind="train"|"ep"|"fsdp"|"debug",
    hosts=None, pool=None, start_s=, lifetime_s=, ready_delay_s=, iteration_s=, seed=,
    rnics=None, cp=1, vpp=1, microbatches=None) -> SimJob`` (``rnics``: RNICs per container,
    default ``tp``; TP may be smaller; ``cp`` context parallel; ``vpp`` interleaved 1F1B).
    ``generate_jobs(cluster, n_jobs, seed=, ...) -> list[SimJob]``; ``HostPool(cluster)``.
    ``SimJob``: ``ep_ids``, ``rail``, ``host``, ``container``, ``pp_stage``, ``dp_rank``,
    ``dp_group``, ``tp_rank``, ``cp_rank`` (per-endpoint arrays), ``plan`` (:class:`Parallel`),
    ``ready_s``, ``start_s``, ``end_s``, ``iteration_s``, ``skeleton_pairs`` ((m, 2) uint32
    ground truth), ``dp_groups()``, ``needs_safe_list``.
    ``skeleton_pairs(ep_ids, rail, pp_stage, dp_rank, pp_links=None)`` — the ground-truth rule.

Traffic (:mod:`skh.sim.traffic`)
    ``throughput(job, duration_s, seed, t0_s=None, **model_kw) -> (ep_ids uint32[n],
    bytes f64[n, T])`` (TX + RX per sample). ``TrafficModel(jobs, seed=, sample_hz=1.0, ...)``:
    ``.window(t0_s, n_samples) -> (tx, rx)``, ``.matrix(t0_s, n_samples)`` (TX + RX),
    ``.sample(t_s, dt_s) -> (tx, rx)``, ``.rates(t_s)`` (TX in ``[t, t + 1)``).
    ``pipeline_schedule(pp, vpp, microbatches) -> Schedule``.
    ``counter_batch(ep_ids, t_ns, tx_total, rx_total, ...) -> COUNTER_DTYPE batch``.

Probe results (:mod:`skh.sim.probes`)
    ``ProbeModel(index, endpoints, seed=, fixed_ns=, per_link_ns=, sigma=, loss_rate=, ...)``:
    ``.base_rtt_ns(src_ep, dst_ep)``, ``.sample(src_ep, dst_ep, seq, path_id, t_wall_ns, rng,
    base_ns=None, effects=None) -> PROBE_DTYPE batch``; ``Effects`` (per-row fault changes).
    ``EndpointTable(index, cluster)`` (:mod:`skh.sim.topology`): per-ep_id ``rnic``, ``host``,
    ``rail``, ``container`` columns.

Faults (:mod:`skh.sim.faults`)
    ``FAULT_SPECS[type] -> FaultSpec`` (symptom, default magnitudes; name, paper component,
    target kind and layer from :data:`skh.failures.FAILURES`) for every type of
    ``SIMULATED_TYPES`` (:class:`skh.failures.FailureType`: the paper's 19, numbered as Table 1,
    + ``AGENT_CRASH`` 20, ``LATE_AGENT`` 21, ``OVERLAY_LOOP`` 22), ``Fault(type, component,
    start_s, end_s, ..., profile="step"|"ramp")``, ``link_component(a, b) -> "a|b"``,
    ``FaultRecord`` (ground truth: fault_id, type, name, layer, target, component, start/end s
    and ns, affected_pairs, jobs, group). The module doc has the table of symptom models.

Agents' answers (:mod:`skh.sim.state`)
    ``TraceHop(ttl, node|None, rtt_ns, loss)``, ``FlowEntry``, ``OverlayWalk(hops, outcome
    "ok"|"missing"|"loop", at)``, ``walk_overlay(dumps, src_ep, dst_ep)``.

Scenario (:mod:`skh.sim.scenario`)
    ``Simulation.build(fabric, n_jobs, seed=, start_s=(-1800, 0), ping="skeleton"|"same_rail",
    probe_interval_s=1.0, n_path_ids=4, transport="verbs"|"udp", arrivals_per_min=0)`` or
    ``Simulation(cluster, jobs, ...)``. Attributes: ``clock`` (``VirtualClock``: ``now_s``,
    ``now_ns``, ``wall_ns(t_s)``), ``cluster``, ``jobs``, ``index``, ``eps``, ``pairs`` (the
    ping pairs), ``ground_truth`` (list of FaultRecord), ``ep_ready_s``/``ep_start_s``/
    ``ep_end_s`` (per ep_id), ``live_pairs(t_s, pairs=None)`` (mask over ``pairs``, default
    the ping pairs). Methods: ``set_ping_pairs(pairs)``, ``add_jobs(jobs)``, ``inject(Fault) ->
    FaultRecord``, ``inject_random(duration_s, rate_scale=)``, ``inject_both_layers(overlay_type,
    underlay_type, start_s, end_s)``, ``candidates(type)``, ``step(seconds=1) -> Step(t_s, dt_s,
    probes, counters, heartbeats, events)``, ``run(duration_s, step_s=1)`` (iterator of Step),
    ``skeleton_pairs()``, and the
    agents' answers at the current (or a given) virtual time: ``traceroute(src_ep, dst_ep,
    path_id) -> list[TraceHop]``, ``overlay_state(host) -> dict``, ``overlay_chain(src_ep,
    dst_ep) -> OverlayWalk``, ``flow_tables(host, rail) -> (ovs, offloaded)``.
"""

from __future__ import annotations

from pathlib import Path

#: the real Lingjun 2023 topology (Apache-2.0; see data/README.md), shipped with the package
LINGJUN_TOPO = Path(__file__).resolve().parent / "data" / "lingjun2023_topo.csv"

__all__ = ["LINGJUN_TOPO"]
