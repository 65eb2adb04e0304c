"""The analyzer sharded on a local Ray cluster against the single process, side by side.

One seeded simulator stream (``--hosts`` x 8 RNICs, jobs of 16 hosts probing their same-rail
preload lists at 1 probe/s per pair, scripted faults of eight kinds) goes through the
single-process pipeline, then through the sharded one with 1, 2 and 4 shards. Per run:
probe records per second of pipeline time (the simulator's own time excluded) and CPU seconds
per million records over every process involved (the driver's CPU inside the pipeline's rounds,
plus every Ray process: shards, localizer, raylet, GCS). On 2 cores the throughput shows
contention, not scaling; the CPU per record shows what sharding costs. The events and alerts of
the 1-, 2- and 4-shard runs are compared with the single process's, round by round. Then a
2-shard run whose shard 0 is killed (SIGKILL) three times, twice between rounds and once as a
round is sent: alerts lost and repeated against the single process, and the recovery time (kill
to the answered round: Ray restarting the process dominates it). The single process runs again
last (the machine's other load moves every figure). Apart from the stream: one shard's steady
capacity in-process (records/s per core, resident bytes per pair) and one ingest front-end's
decode-and-route rate.

Prints one JSON object. Default: 128 hosts, 8 jobs, 400 s of virtual time; ``--quick``: 64
hosts, 4 jobs, 300 s.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import psutil  # noqa: E402

from skh.failures import FailureType  # noqa: E402
from skh.model import Fabric  # noqa: E402
from skh.orchestrator.pipeline import Pipeline, PipelineConfig  # noqa: E402
from skh.orchestrator.shard.merge import alert_key, event_key  # noqa: E402
from skh.sim.answers import SimSource, sim_overlay_component, sim_overlay_endpoint  # noqa: E402
from skh.sim.faults import Fault  # noqa: E402
from skh.sim.scenario import Simulation  # noqa: E402

#: (type, start s, end s): outages, loss, agents and containers, latency, overlay, flapping
SCRIPT = (
    ("SWITCH_PORT_DOWN", 60.0, 90.0),
    ("CRC_ERROR", 70.0, 120.0),
    ("RNIC_PORT_DOWN", 100.0, 130.0),
    ("AGENT_CRASH", 110.0, 140.0),
    ("CONTAINER_CRASH", 150.0, 180.0),
    ("SWITCH_OFFLINE", 190.0, 220.0),
    ("OVERLAY_LOOP", 230.0, 260.0),
    ("CC_ISSUE", 240.0, 290.0),
)


def _build(hosts: int, jobs: int, seed: int) -> tuple[Simulation, PipelineConfig]:
    fabric = Fabric.from_params(hosts=hosts, rnics_per_host=8, hosts_per_segment=16, spines=4)
    sim = Simulation.build(
        fabric,
        jobs,
        seed=seed,
        ping="same_rail",
        start_s=(-900.0, -600.0),
        job_kw={
            "size_weights": {16: 1.0},
            "share_4rnic": 0.0,
            "share_ep": 0.0,
            "share_debug": 0.0,
            "lifetime_median_s": 1e7,
            "lifetime_sigma": 0.01,
        },
    )
    for i, (name, start, end) in enumerate(SCRIPT):
        cands = sim.candidates(FailureType[name])
        if cands:
            sim.inject(Fault(FailureType[name], cands[(i * 7919) % len(cands)], start, end))
    return sim, PipelineConfig(fabric=fabric.to_mapping(), resolve_after_s=20.0)


def _cpu_s(procs) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _ingest_rate(n_batches: int = 200, rows: int = 1000) -> dict:
    """One ingest front-end's decode, authorize and route (:class:`IngestRouter`), in-process:
    probe batches of ``rows`` records as agents ship them, 4 shards."""
    import numpy as np

    from skh.orchestrator.shard.ingest import IngestRouter
    from skh.records import empty_probes
    from skh.wire import Codec, MsgType, probe_batch_body

    codec = Codec()
    rng = np.random.default_rng(0)
    frames = []
    for i in range(n_batches):
        r = empty_probes(rows)
        r["src_ep"] = rng.integers(0, 8192, rows)
        r["dst_ep"] = rng.integers(0, 8192, rows)
        r["t_wall_ns"] = 1_700_000_000_000_000_000 + i * 1_000_000
        r["rtt_ns"] = rng.integers(10_000, 20_000, rows)
        body = probe_batch_body("a", r, [int(r["src_ep"][0])])
        frames.append(codec.encode(MsgType.PROBE_BATCH, "a", i, body))
    router = IngestRouter(4, Codec())
    router.set_routes(np.arange(8192) % 4, np.arange(8192) % 4)
    t0, c0 = time.perf_counter(), time.process_time()
    for f in frames:
        router.on_frame(f)
    router.flush()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = n_batches * rows
    return {
        "records_per_cpu_s": round(n / cpu),
        "records_per_wall_s": round(n / wall),
        "cpu_s_per_million_records": round(cpu / (n / 1e6), 3),
        "batch_rows": rows,
    }


def _shard_capacity(pairs: int, seconds: int) -> dict:
    """One detection shard in this process (no Ray): ``pairs`` pairs (peers of 16 per endpoint,
    as a skeleton keeps) answered once a second each for ``seconds`` virtual seconds, past the
    look-back so windows are scored. CPU per record over the last 100 s (every pair's sliding
    window scored by LOF each 5 s), and resident memory per pair."""
    import numpy as np

    from skh.model import Fabric
    from skh.orchestrator.shard.actors import RoundInput, _Shard
    from skh.records import ProbeStatus, empty_probes

    peers = 16
    n_ep = pairs // peers
    src = np.repeat(np.arange(n_ep), peers)
    dst = (src + 1 + np.tile(np.arange(peers), n_ep) * 7) % n_ep
    cfg = PipelineConfig(fabric=Fabric.from_params(hosts=2, rnics_per_host=1).to_mapping())
    shard = _Shard(0, cfg)
    rng = np.random.default_rng(5)
    me = psutil.Process()
    rss0 = me.memory_info().rss
    t0_ns = 1_700_000_000 * 10**9
    cpu = []
    for t in range(seconds):
        r = empty_probes(src.size)
        r["src_ep"], r["dst_ep"], r["seq"] = src, dst, t * 10
        r["t_wall_ns"] = t0_ns + t * 10**9 + rng.integers(0, 10**9, src.size)
        r["rtt_ns"] = rng.normal(14_000, 700, src.size).astype(np.int64)
        r["status"] = ProbeStatus.OK
        c0 = time.process_time()
        shard.apply(
            RoundInput(t, t0_ns + (t + 1) * 10**9, (r,), (), (), ((np.arange(n_ep), t0_ns),))
        )
        cpu.append(time.process_time() - c0)
    late = cpu[-100:]
    return {
        "pairs": int(src.size),
        "virtual_s": seconds,
        "records_per_cpu_s": round(src.size * len(late) / sum(late)),
        "cpu_s_per_million_records": round(sum(late) / (src.size * len(late) / 1e6), 3),
        "rss_bytes_per_pair": round((me.memory_info().rss - rss0) / src.size),
        "pairs_live": shard.pipe.detector.stats.pairs_live,
        "windows_scored": shard.pipe.detector.stats.windows_scored,
    }


def run(args, shards: int, *, kill_at: tuple[int, ...] = (), kill_sent: tuple[int, ...] = ()):
    """One pass over the stream; ``shards`` 0 is the single process."""
    sim, cfg = _build(args.hosts, args.jobs, args.seed)
    kw = {
        "source_factory": lambda _cl: SimSource(sim),
        "apply_skeleton": lambda *_a: True,  # the load stays the preload lists'
        "overlay_endpoint": sim_overlay_endpoint,
        "overlay_component": sim_overlay_component,
    }
    if shards:
        from skh.orchestrator.shard import ShardedPipeline, ShardOptions

        opts = ShardOptions(shards=shards, actor_cpus=0.25, checkpoint_rounds=30)
        pipe: Pipeline = ShardedPipeline(cfg, options=opts, **kw)
    else:
        pipe = Pipeline(cfg, **kw)
    pipe.set_endpoints(
        {"ep": e.ep_id, "job": e.job, "container": e.container, "host": e.host}
        | {"rail": e.rail, "ip": e.ip}
        for e in sim.cluster.endpoints
    )
    events: list = []
    observe = pipe.observe

    def recording(*a, **k):
        al, ev = observe(*a, **k)
        events.append([event_key(e) for e in ev])
        return al, ev

    pipe.observe = recording  # type: ignore[method-assign]
    alerts = []
    records = 0
    busy_s = cpu_s = 0.0
    me = psutil.Process()
    kids = me.children(recursive=True)
    child0 = _cpu_s(kids)
    roles = {}
    if shards:
        roles = {
            "shards": [psutil.Process(p) for p in pipe.shard_pids()],
            "localizer": [psutil.Process(pipe.localizer_pid())],
        }
    role0 = {k: _cpu_s(v) for k, v in roles.items()}
    for i, step in enumerate(sim.run(args.duration)):
        if i in kill_sent:
            os.kill(pipe.shard_pids()[0], signal.SIGKILL)  # the round goes out as it dies
        t0, c0 = time.perf_counter(), time.process_time()
        found = pipe.process(step.probes, step.counters, sim.clock.now_ns, step.heartbeats)
        busy_s += time.perf_counter() - t0
        cpu_s += time.process_time() - c0
        cpu_s_driver = cpu_s
        records += int(step.probes.size)
        alerts.append([alert_key(a) for a in found])
        if i in kill_at:
            os.kill(pipe.shard_pids()[0], signal.SIGKILL)
    role_s = {k: _cpu_s(v) - role0[k] for k, v in roles.items()}
    if shards:
        # every Ray process, the ones started for this run and Ray's own daemons
        kids = {p.pid: p for p in [*kids, *me.children(recursive=True)]}.values()
        cpu_s += _cpu_s(kids) - child0
        rss = [p.memory_info().rss for p in roles["shards"] if p.is_running()]
    out = {
        "records": records,
        "records_per_s": round(records / busy_s),
        "cpu_s_per_million_records": round(cpu_s / (records / 1e6), 2),
        "events": events,
        "alerts": alerts,
        "stats": dict(pipe.stats),
    }
    if shards:
        out["recoveries_s"] = [round(t, 2) for t in pipe.recoveries]
        out["shard_records"] = [s.get("records_in", 0) for s in pipe.shard_stats]
        out["shard_pairs"] = [s.get("pairs_live", 0) for s in pipe.shard_stats]
        out["shard_cpu_s_per_million_records"] = round(role_s["shards"] / (records / 1e6), 2)
        out["driver_cpu_s_per_round"] = round(cpu_s_driver / args.duration, 4)
        out["shard_rss_mb"] = [round(r / 2**20) for r in rss]
        pipe.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 hosts, 4 jobs, 300 s")
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--duration", type=int, default=400, help="virtual seconds")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--capacity-pairs", type=int, default=200_000, help="pairs of the one-shard measure"
    )
    args = ap.parse_args()
    if args.quick:
        args.hosts, args.jobs, args.duration, args.capacity_pairs = 64, 4, 300, 20_000
    logging.basicConfig(level=logging.ERROR)
    import ray

    from skh.orchestrator.shard import connect

    load0 = os.getloadavg()[0]
    ingest = _ingest_rate()
    capacity = _shard_capacity(args.capacity_pairs, 330)
    single = run(args, 0)
    # Ray prints its workers' deaths (the killed shards') on stdout: this prints JSON there
    with contextlib.redirect_stdout(sys.stderr):
        connect("local", min_cpus=6)
        try:
            by = {n: run(args, n) for n in (1, 2, 4)}
            killed = run(args, 2, kill_at=(40, 150), kill_sent=(250,))
        finally:
            ray.shutdown()
    # again after the sharded runs: what else ran on the machine moves every figure
    again = run(args, 0)
    want = Counter(a for r in single["alerts"] for a in r)
    got = Counter(a for r in killed["alerts"] for a in r)
    print(
        json.dumps(
            {
                "hosts": args.hosts,
                "rnics_per_host": 8,
                "jobs": args.jobs,
                "virtual_s": args.duration,
                "records": single["records"],
                "pairs": sum(by[1]["shard_pairs"]),
                "cores": os.cpu_count(),
                "shards": [1, 2, 4],
                "events_single_process": sum(len(e) for e in single["events"]),
                "alerts_single_process": sum(len(a) for a in single["alerts"]),
                "events_equal_single_process": {
                    str(n): by[n]["events"] == single["events"]
                    and by[n]["alerts"] == single["alerts"]
                    for n in (1, 2, 4)
                },
                "load_average_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
                "records_per_s_single_process": [single["records_per_s"], again["records_per_s"]],
                "records_per_s_by_shards": {str(n): by[n]["records_per_s"] for n in by},
                "cpu_s_per_million_records_single_process": [
                    single["cpu_s_per_million_records"],
                    again["cpu_s_per_million_records"],
                ],
                "cpu_s_per_million_records_by_shards": {
                    str(n): by[n]["cpu_s_per_million_records"] for n in by
                },
                "shard_cpu_s_per_million_records": {
                    str(n): by[n]["shard_cpu_s_per_million_records"] for n in by
                },
                "coordinator_cpu_s_per_round": {
                    str(n): by[n]["driver_cpu_s_per_round"] for n in by
                },
                "shard_rss_mb": {str(n): by[n]["shard_rss_mb"] for n in by},
                "ingest_frontend": ingest,
                "shard_capacity": capacity,
                "records_per_shard": {str(n): by[n]["shard_records"] for n in by},
                "pairs_per_shard": {str(n): by[n]["shard_pairs"] for n in by},
                "actor_kills": 3,
                "actor_kill_restores": killed["stats"]["restores"],
                "actor_kill_lost_alerts": sum((want - got).values()),
                "actor_kill_duplicate_alerts": sum((got - want).values()),
                "actor_kill_events_equal": killed["events"] == single["events"],
                "recovery_s": max(killed["recoveries_s"], default=None),
                "recoveries_s": killed["recoveries_s"],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
