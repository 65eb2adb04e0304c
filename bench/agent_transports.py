"""The busiest container's engines on kernel UDP and on verbs, side by side in one run: what the
transport itself costs the agent's engine thread.

``bench/agent_process.py`` measures the real agent process, and on this machine only over
loopback UDP: there the kernel's own work for each datagram (its send, loopback delivering it
into the receiver's socket, the receive and the send stamps) is most of the agent's CPU, and
more than the 2 % of a core issue 17 allows on a slow day (``bare_floor_cpu_pct``). On RoCE the
engine posts to and polls a NIC's queues instead, with no system call per datagram. No RDMA NIC
is on the build machines, so the verbs side runs on the libibverbs stand-in of the hardware
tests (``tests/verbs/hwsim/ibverbs_standin.c``: ConnectX-like devices, UD sends delivered by a
thread of its own, named ``hwsim-nic``, with completion timestamps): everything from the
engine's ``dlopen`` down is the shipped code.

Both sides are one process built the same way: the agent's engines (eight endpoints, made by
the agent's own factory, :func:`skh.orchestrator.agent_overlay.default_engine_factory`, on one
shared thread with the agent's tick, its plan's interval, path rotation and latency sampling)
probing ``peers`` peers each at ``rate`` probes/s in all and answering as many, one engine per
endpoint here standing for its peers (their probes spread over the interval, as independent
peers' are), and the main thread draining and thinning the agent's records every second as
the agent's ``flush`` does (:class:`skh.analysis.rowthin.RowThinner`; no ZeroMQ). Each thread's
CPU comes from ``/proc/self/task``: the agent's engine thread, the peers', the stand-in's NIC
thread (the NIC's work on hardware: not the agent's) and the main thread's flush.

What the stand-in leaves in the agent's thread that a NIC would not: its ``post_send`` takes a
process-wide lock and signals the delivery thread (a futex call where a NIC takes a doorbell
write), and a send completion on an armed queue is a ``write`` to the completion channel's pipe
in the poster's thread (a NIC raises an interrupt). The verbs figure is therefore an upper
bound of the engine thread's cost on a NIC, and the same machine's, on the same run as UDP's.

    python bench/agent_transports.py --rate 800 --paths 45 --duration 20 [--runs 3]

Prints one JSON object: per transport the runs' figures and their median, and
``verbs_over_udp``, the ratio of the medians of the agent's engine thread.

Measured (session 37, ``--runs 3 --duration 30``, this 2-vCPU VM at load ~0.2, % of one core):
the agent's engine thread 2.43 (2.13-2.53) on UDP, 1.57 (1.37-1.83) on verbs (0.65x), the flush
0.24-0.25 on both, 189 and 195 wake-ups a second, the stand-in's NIC thread 2.03 (docs/engine.md,
"What the transport costs").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests/verbs/hwsim"
ENDPOINTS = 8
NIC_THREAD = "hwsim-nic"
#: ConnectX-like devices: mlx5's 63-bit completion-timestamp mask at a 1 GHz counter
MLX5_MASK = 0x7FFF_FFFF_FFFF_FFFF
ONE_WAY_NS = 9_984  # a few microseconds of fabric each way (a whole number of the 32 ns grid)


def build_standin(out_dir: Path) -> Path:
    """Compiles the stand-in libibverbs.so.1 into ``out_dir`` (as tests/verbs/test_hwsim.py)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("no C compiler")
    lib = out_dir / "libibverbs.so.1"
    cmd = [cc, "-std=gnu11", "-O2", "-fPIC", "-shared", "-D_GNU_SOURCE"]
    cmd += [f"-Wl,--version-script={STANDIN / 'libibverbs.map'}", "-Wl,-soname,libibverbs.so.1"]
    cmd += ["-o", str(lib), str(STANDIN / "ibverbs_standin.c"), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out_dir


def hwsim_config() -> str:
    devs = ";".join(
        f"dev=mlx5_{i},10.77.0.{i + 1},1000000,{MLX5_MASK:#x},{i * 7919:#x}"
        for i in range(ENDPOINTS)
    )
    return f"{devs};delay=*,*,{ONE_WAY_NS}"


# -- worker: one transport, in this process ------------------------------------------------------


def _tid_cpu_s() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _engine_tids() -> set[int]:
    return {t for t, (name, _) in _tid_cpu_s().items() if name == "skh-engine"}


def worker(transport: str, rate: float, peers: int, paths: int, duration_s: float) -> dict:
    from skh.analysis.rowthin import RowThinner, sample_phase_ns
    from skh.layout import PROBE_STRUCT
    from skh.orchestrator.agent_overlay import default_engine_factory
    from skh.orchestrator.config import AgentConfig, EndpointSpec
    from skh.probe import Engine, EngineThread

    verbs = transport == "verbs"
    specs = tuple(
        EndpointSpec(rail=i, ip=f"10.77.0.{i + 1}", device=f"mlx5_{i}")
        if verbs
        else EndpointSpec(rail=i, ip="127.0.0.1")
        for i in range(ENDPOINTS)
    )
    cfg = AgentConfig(transport=transport, endpoints=specs, max_probe_rate=rate)
    interval_s = peers * ENDPOINTS / rate
    period_ns = int(cfg.ok_sample_s * 1e9)

    def sampling(key: int) -> dict[str, Any]:
        return {
            "sample_period_s": period_ns / 1e9,
            "sample_phase_ns": sample_phase_ns(key, period_ns),
        }

    before = _engine_tids()
    agent_thread = EngineThread()
    agent = [default_engine_factory(s, cfg, thread=agent_thread) for s in specs]
    for e in agent:
        e.start()
    agent_tids = _engine_tids() - before
    # the peers: one engine per endpoint (on the endpoint's device), its targets the peers'
    # streams, spread over the interval as independent peers' phases are
    peer_thread = EngineThread()
    kw: dict[str, Any] = {"transport": transport, "batch_window_s": 0.0, "ring_records": 256}
    if verbs:
        kw["hw_timestamps"] = True
    peer = [Engine(bind=s.ip, device=s.device or None, thread=peer_thread, **kw) for s in specs]
    for e in peer:
        e.start()
    peer_tids = _engine_tids() - before - agent_tids

    def addr(e: Engine) -> dict[str, Any]:
        a = e.local_address()
        if verbs:
            return {"host": "", "port": 0, "gid": a["gid"], "qpn": a["qpn"]}
        return {"host": a["ip"], "port": a["port"]}

    n = ENDPOINTS * peers
    t0 = time.monotonic()
    for j in range(n):  # both ways: the agent's probes of its peers and theirs of it
        i, k = divmod(j, peers)
        time.sleep(max(0.0, t0 + j * interval_s / n - time.monotonic()))
        dst = 1000 + i * peers + k
        a, p = addr(peer[i]), addr(agent[i])
        agent[i].add_target(dst, interval_s=interval_s, paths=paths, **a, **sampling(i << 32 | dst))
        peer[i].add_target(
            i * peers + k, interval_s=interval_s, paths=paths, **p, **sampling(dst << 32 | i)
        )

    thinner = RowThinner(cfg.ok_sample_s)

    def flush() -> int:
        rows: list[tuple] = []
        for ep, e in enumerate(agent):
            rows += [(ep, *r[1:]) for r in PROBE_STRUCT.iter_unpack(e.drain_packed())]
        kept = thinner.thin(rows)
        return len(b"".join(PROBE_STRUCT.pack(*r) for r in kept))

    time.sleep(3.0)  # warm-up: every stream going, address handles resolved
    flush()
    s0 = [e.stats().as_dict() for e in agent]
    c0, w0, f0 = _tid_cpu_s(), time.monotonic(), 0.0
    while time.monotonic() - w0 < duration_s:
        time.sleep(max(0.0, cfg.batch_interval_s - (time.monotonic() - w0) % cfg.batch_interval_s))
        t = time.thread_time()
        flush()
        f0 += time.thread_time() - t
    wall = time.monotonic() - w0
    c1 = _tid_cpu_s()
    s1 = [e.stats().as_dict() for e in agent]
    for e in agent + peer:
        e.close()

    def pct(tids: set[int]) -> float:
        return round(
            100.0 * sum(c1[t][1] - c0[t][1] for t in tids if t in c0 and t in c1) / wall, 2
        )

    nic = {t for t, (name, _) in c1.items() if name == NIC_THREAD}
    if verbs and not nic:  # its CPU would go uncounted, or be counted as the agent's
        raise RuntimeError(f"no {NIC_THREAD} thread: is the stand-in the libibverbs loaded?")

    def per_s(key: str) -> float:
        return round(sum(b[key] - a[key] for a, b in zip(s0, s1, strict=True)) / wall, 1)

    return {
        "agent_engine_thread_cpu_pct": pct(agent_tids),
        "agent_flush_cpu_pct": round(100.0 * f0 / wall, 2),
        "peers_engine_thread_cpu_pct": pct(peer_tids),
        "nic_thread_cpu_pct": pct(nic) if verbs else None,
        "probes_per_s": per_s("sent"),
        "answered_per_s": per_s("probes_received"),
        "ok_per_s": per_s("ok"),
        "lost_per_s": per_s("lost"),
        "wakeups_per_s": round(per_s("wakeups") / ENDPOINTS, 1),
        "duration_s": round(wall, 1),
    }


# -- driver --------------------------------------------------------------------------------------


def run_one(transport: str, args: argparse.Namespace, standin: Path) -> dict:
    env = dict(os.environ)
    if transport == "verbs":
        env |= {"LD_LIBRARY_PATH": str(standin), "SKH_HWSIM": hwsim_config()}
    cmd = [sys.executable, __file__, "--worker", transport, "--rate", str(args.rate)]
    cmd += ["--peers", str(args.peers), "--paths", str(args.paths)]
    cmd += ["--duration", str(args.duration)]
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=args.duration + 120, cwd=ROOT
    )
    if out.returncode != 0:
        raise SystemExit(f"{transport} worker failed: {out.stderr.strip()[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=800.0, help="the agent's probes/s in all")
    ap.add_argument("--peers", type=int, default=18, help="peers per endpoint")
    ap.add_argument("--paths", type=int, default=45, help="path ids each pair rotates over")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds measured per run")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per transport")
    ap.add_argument("--worker", choices=("udp", "verbs"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(ROOT))
        got = worker(args.worker, args.rate, args.peers, args.paths, args.duration)
        print(json.dumps(got))
        return
    with tempfile.TemporaryDirectory(prefix="skh-standin-") as tmp:
        standin = build_standin(Path(tmp))
        runs: dict[str, list[dict]] = {"udp": [], "verbs": []}
        for _ in range(args.runs):  # interleaved: the machine's load moves between runs
            for transport in runs:
                runs[transport].append(run_one(transport, args, standin))
    out: dict[str, Any] = {
        "what": "the agent's 8 engines on one thread, in one process with their peers",
        "rate": args.rate,
        "peers_per_endpoint": args.peers,
        "paths": args.paths,
        "loadavg": os.getloadavg()[0],
    }
    for transport, rs in runs.items():
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in rs[0]
            if isinstance(rs[0][k], int | float)
        }
        out[transport] = {"median": med, "runs": rs}
    u = out["udp"]["median"]["agent_engine_thread_cpu_pct"]
    v = out["verbs"]["median"]["agent_engine_thread_cpu_pct"]
    out["verbs_over_udp"] = round(v / u, 2) if u else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
