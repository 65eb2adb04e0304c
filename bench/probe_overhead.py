"""Probe overhead: the C engine vs the plain-Python prober (bench/pyprober.py) vs ping/sockperf,
side by side in one run, on loopback and across a veth pair between two network namespaces (root).

Every prober runs in its own process against a C responder (an engine) in another, so CPU is the
prober process's getrusage (user+sys) and RSS its VmRSS. Legs per path:
  - CPU µs per probe at the same fixed rate for both (2,000 probes/s over a list of 9 targets):
    ``c_cpu_us_per_probe`` / ``py_cpu_us_per_probe``, the Python prober doing the same kernel-stamp
    and network-RTT work as the engine (the engine with its defaults: batched, so each round of the
    list leaves in one send batch, like the Python prober's ``--burst``);
  - saturation: probes/s answered and CPU µs per answered probe (``*_saturated``), both keeping
    32 probes in flight; the Python prober once more without kernel stamps (``py_nostamps_*``);
  - like with like: the same in-flight window (32) for both, equal warm-ups, five or more runs
    interleaved C, Python, C, ...: the medians of CPU µs per answered probe
    (``c_cpu_us_per_probe_same_window`` / ``py_cpu_us_per_probe_same_window``), their ratio, and
    every run (``same_window_runs``);
  - the agent at 100 and 1,000 probes/s over a target list of 9: CPU % of one core and RSS MB;
  - 100 probes/s with and without a CPU hog on every core (`yes`, pinned): network RTT (kernel
    stamps) vs app-level RTT (user clock, T6 - T1) p50/p99;
  - ping (ICMP echo, 100 Hz, alongside the 100 probes/s runs) and sockperf ping-pong (1000 msg/s,
    alone) where installed, with and without the hog.

    python bench/probe_overhead.py [--quick]      # prints one JSON object; --quick ~1 min as root

Top-level keys come from the veth leg when it ran (root), else from loopback; "legs" holds both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/ is on sys.path when this runs as a script, not when skh.eval loads it from its path
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from _proc import _cpu_s, _rss_mb  # noqa: E402

# The agent worker's RSS is measured: modules only the orchestrator needs (subprocess, shutil, uuid:
# ~2 MB) are imported where they are used.

PY = sys.executable
N_TARGETS = 9


# -- worker: the C engine as an agent process ----------------------------------------------------


def respond_worker(args: argparse.Namespace) -> None:
    """A responder that imports nothing but the engine (`skh respond` loads every CLI module)."""
    import signal

    from skh.probe import Engine

    with Engine(bind=args.bind) as eng:
        print(f"answering on {args.bind}:{eng.local_port} ", file=sys.stderr, flush=True)
        signal.sigwait({signal.SIGTERM})


def c_worker(args: argparse.Namespace) -> None:
    import numpy as np

    from skh.probe import Engine
    from skh.records import ProbeStatus

    eng = Engine(
        bind=args.bind, timeout_s=args.timeout, ring_records=args.ring, max_in_flight=args.window
    )
    eng.start()
    for i in range(N_TARGETS):
        eng.add_target(i, args.host, args.port, interval_s=N_TARGETS / args.rate, paths=args.paths)
    time.sleep(args.warmup)
    eng.drain()
    s0, cpu0, t0 = eng.stats(), _cpu_s(), time.monotonic()
    batches = []
    end = t0 + args.duration
    while (now := time.monotonic()) < end:
        time.sleep(min(args.drain_every, end - now))
        batches.append(eng.drain())
    cpu, wall, s1 = _cpu_s() - cpu0, time.monotonic() - t0, eng.stats()
    rss = _rss_mb()
    eng.close()
    rows = np.concatenate(batches)
    ok = rows[rows["status"] == ProbeStatus.OK]
    net = ok["rtt_ns"] / 1e3
    app = (ok["rtt_ns"] + ok["responder_delay_ns"] + ok["prober_delay_ns"]) / 1e3

    def pct(a, q):
        return round(float(np.percentile(a, q)), 3) if len(a) else None

    print(
        json.dumps(
            {
                "probes": s1.sent - s0.sent,
                "answered": int(len(ok)),
                "records": int(len(rows)),
                "cpu_s": cpu,
                "wall_s": wall,
                "rss_mb": rss,
                "rss_anon_mb": _rss_mb("RssAnon"),
                "wakeups": s1.wakeups - s0.wakeups,
                "net_rtt_us": {"p50": pct(net, 50), "p99": pct(net, 99)},
                "app_rtt_us": {"p50": pct(app, 50), "p99": pct(app, 99)},
                "clock": sorted({int(x) for x in ok["ts_source"]}),
            }
        )
    )


# -- orchestration -------------------------------------------------------------------------------


def netns_prefix(ns: str | None) -> list[str]:
    return ["ip", "netns", "exec", ns] if ns else []


def run_json(cmd: list[str], timeout: float) -> dict:
    import subprocess

    # Probers load bytecode as an installed agent does: with PYTHONDONTWRITEBYTECODE set (as on the
    # build machines) every start would compile its sources again, ~1 MB of RSS that no deployed
    # agent carries. (__pycache__ is git-ignored.)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def responder(ns: str | None, bind: str) -> Iterator[tuple[int, int]]:
    """A C engine answering probes in a process of its own: (its port, its pid)."""
    import signal
    import subprocess

    proc = subprocess.Popen(
        [
            *netns_prefix(ns),
            PY,
            str(Path(__file__).resolve()),
            "--worker",
            "respond",
            "--bind",
            bind,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        m = re.search(r"answering on \S+:(\d+) ", line)
        if not m:
            raise RuntimeError(f"responder did not start: {line!r}")
        yield int(m.group(1)), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    import subprocess

    hogs = [
        subprocess.Popen(["taskset", "-c", str(cpu), "yes"], stdout=subprocess.DEVNULL)
        for cpu in sorted(os.sched_getaffinity(0))
    ]
    try:
        time.sleep(0.2)
        yield
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()


def c_agent(
    ns,
    host,
    port,
    rate,
    duration,
    *,
    warmup=0.5,
    timeout=1.0,
    drain_every=1.0,
    ring=None,
    window=2048,
    paths=1,
) -> dict:
    """The engine as an agent process. Its ring is sized as an agent sizes it, to four result
    batches at its rate (every ring slot gets touched as records cycle: 48 B of RSS each); each
    target's probes rotate over ``paths`` path ids (UDP: one source port each)."""
    if ring is None:
        ring = max(1024, 1 << int(4 * rate * drain_every - 1).bit_length())
    cmd = [
        *netns_prefix(ns),
        PY,
        str(Path(__file__).resolve()),
        "--worker",
        "c",
        "--host",
        host,
        "--port",
        str(port),
        "--rate",
        str(rate),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
        "--timeout",
        str(timeout),
        "--drain-every",
        str(drain_every),
        "--ring",
        str(ring),
        "--window",
        str(window),
        "--paths",
        str(paths),
        "--bind",
        "::" if ":" in host else "0.0.0.0",
    ]
    return run_json(cmd, timeout=duration + warmup + 30)


def py_prober(
    ns, host, port, mode, duration, rate=0.0, timestamps=True, burst=1, warmup=0.3, window=32
) -> dict:
    cmd = [
        *netns_prefix(ns),
        PY,
        str(HERE / "pyprober.py"),
        "--host",
        host,
        "--port",
        str(port),
        "--mode",
        mode,
        "--duration",
        str(duration),
        "--rate",
        str(rate),
        "--burst",
        str(burst),
        "--warmup",
        str(warmup),
        "--window",
        str(window),
        *([] if timestamps else ["--no-timestamps"]),
    ]
    return run_json(cmd, timeout=duration + 30)


def same_window(ns, host, port, quick: bool, window: int = 32) -> dict:
    """CPU per answered probe at saturation with the same in-flight window for both probers, equal
    warm-ups, runs interleaved (C, Python, C, ...) so the machine's other load hits both alike."""
    import statistics

    rounds = 5 if quick else 9
    d, warm = (0.6, 0.3) if quick else (2.0, 0.5)
    runs: dict[str, list[float]] = {"c": [], "py": []}
    for _ in range(rounds):
        c = c_agent(
            ns, host, port, 1_000_000, d, warmup=warm, drain_every=0.1, ring=1 << 20, window=window
        )
        py = py_prober(ns, host, port, "window", d, warmup=warm, window=window)
        runs["c"].append(round(c["cpu_s"] / max(1, c["answered"]) * 1e6, 3))
        runs["py"].append(round(py["cpu_s"] / max(1, py["answered"]) * 1e6, 3))
    c_med, py_med = statistics.median(runs["c"]), statistics.median(runs["py"])
    return {
        "c_cpu_us_per_probe_same_window": c_med,
        "py_cpu_us_per_probe_same_window": py_med,
        "c_to_py_cpu_same_window": round(c_med / py_med, 3),
        "same_window": window,
        "same_window_runs": runs,
    }


def ping_start(ns, host, count):
    """Starts ping (100 Hz) in the background, or returns None where it is not installed."""
    import shutil
    import subprocess

    if not shutil.which("ping"):
        return None
    return subprocess.Popen(
        [*netns_prefix(ns), "ping", "-n", "-i", "0.01", "-c", str(count), host],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def ping_result(proc) -> dict | None:
    if proc is None:
        return None
    out, _ = proc.communicate(timeout=60)
    times = sorted(float(x) * 1e3 for x in re.findall(r"time=([\d.]+) ms", out))
    if not times:
        return None
    return {
        "p50": round(times[len(times) // 2], 3),
        "p99": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3),
        "n": len(times),
    }


def sockperf(ns_client, ns_server, host, seconds) -> dict | None:
    import shutil
    import subprocess

    if not shutil.which("sockperf"):
        return None
    port = 20000 + (os.getpid() % 20000)
    server = subprocess.Popen(
        [*netns_prefix(ns_server), "sockperf", "server", "-i", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            [
                *netns_prefix(ns_client),
                "sockperf",
                "ping-pong",
                "-i",
                host,
                "-p",
                str(port),
                "-m",
                "64",
                "-t",
                str(seconds),
                "--mps",
                "1000",
                "--full-rtt",
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 20,
        )
    finally:
        server.kill()
        server.wait()
    pct = dict(re.findall(r"percentile (\d+\.\d+) =\s+([\d.]+)", out.stdout))
    if "50.000" not in pct:
        return None
    return {"p50": float(pct["50.000"]), "p99": float(pct["99.000"])}


def leg(
    ns_prober: str | None, ns_responder: str | None, host: str, quick: bool, with_sockperf: bool
) -> dict:
    d = 0.5 if quick else 3.0
    warm = 0.15 if quick else 0.5
    n_ping = 100 if quick else 1000
    out: dict = {}
    with responder(ns_responder, "::" if ":" in host else "0.0.0.0") as (port, _pid):
        # saturation: both keep 32 probes in flight and send the next as soon as replies come back
        c_sat = c_agent(
            ns_prober,
            host,
            port,
            1_000_000,
            d,
            warmup=warm,
            drain_every=0.1,
            ring=1 << 20,
            window=32,
        )
        py_sat = py_prober(ns_prober, host, port, "window", d, warmup=warm)
        py_bare = py_prober(ns_prober, host, port, "window", d, timestamps=False, warmup=warm)
        out["c_probes_per_s"] = round(c_sat["answered"] / c_sat["wall_s"])
        out["py_probes_per_s"] = round(py_sat["answered"] / py_sat["wall_s"])
        sat_c = c_sat["cpu_s"] / max(1, c_sat["answered"])
        out["c_cpu_us_per_probe_saturated"] = round(sat_c * 1e6, 3)
        sat_py = py_sat["cpu_s"] / max(1, py_sat["answered"])
        out["py_cpu_us_per_probe_saturated"] = round(sat_py * 1e6, 3)
        # the Python prober without kernel stamps (less work than the engine does: app RTT only)
        out["py_nostamps_probes_per_s"] = round(py_bare["answered"] / py_bare["wall_s"])
        out["py_nostamps_cpu_us_per_probe_saturated"] = round(
            py_bare["cpu_s"] / max(1, py_bare["answered"]) * 1e6, 3
        )
        out.update(same_window(ns_prober, host, port, quick))
        # CPU per probe in the agent's regime: the same fixed rate for both, over a list of 9
        # targets (C: 9 targets; Python: 9 probes per round). At saturation the kernel's per-packet
        # work (send, loopback/veth delivery, stamps) dominates both and the ratio narrows.
        rate = 2000
        dp = 1.0 if quick else 3.0  # getrusage ticks at 4 ms: a shorter run is mostly rounding
        c_p = c_agent(ns_prober, host, port, rate, dp, warmup=warm, drain_every=0.25)
        py_p = py_prober(ns_prober, host, port, "paced", dp, rate=rate, burst=N_TARGETS)
        out["cpu_per_probe_pps"] = rate
        out["c_cpu_us_per_probe"] = round(c_p["cpu_s"] / max(1, c_p["probes"]) * 1e6, 3)
        out["py_cpu_us_per_probe"] = round(py_p["cpu_s"] / max(1, py_p["probes"]) * 1e6, 3)
        # the agent at 100 and 1,000 probes/s over 9 targets (1 s result batches, as an agent ships
        # them); ping runs meanwhile (100 Hz ICMP, in the kernel of the responder's side)
        pinger = ping_start(ns_prober, host, n_ping)
        a100 = c_agent(ns_prober, host, port, 100, 2.0 if quick else 10.0, warmup=warm)
        out["ping_rtt_us"] = ping_result(pinger)
        a1000 = c_agent(ns_prober, host, port, 1000, d, warmup=warm)
        out["rss_mb_at_100pps"] = round(a100["rss_mb"], 2)
        out["cpu_pct_at_100pps"] = round(100 * a100["cpu_s"] / a100["wall_s"], 3)
        out["rss_mb_at_1000pps"] = round(a1000["rss_mb"], 2)
        out["cpu_pct_at_1000pps"] = round(100 * a1000["cpu_s"] / a1000["wall_s"], 3)
        out["wakeups_per_probe_at_100pps"] = round(a100["wakeups"] / max(1, a100["probes"]), 2)
        out["net_rtt_p50_us"] = a100["net_rtt_us"]["p50"]
        out["net_rtt_p99_us"] = a100["net_rtt_us"]["p99"]
        out["app_rtt_p50_us"] = a100["app_rtt_us"]["p50"]
        out["app_rtt_p99_us"] = a100["app_rtt_us"]["p99"]
        out["clock"] = a100["clock"]
        out["sockperf_rtt_us"] = (
            sockperf(ns_prober, ns_responder, host, 1 if quick else 5) if with_sockperf else None
        )
        with cpu_hog():
            pinger = ping_start(ns_prober, host, n_ping)
            loaded = c_agent(ns_prober, host, port, 100, 2.0 if quick else 10.0, warmup=warm)
            out["ping_rtt_us_loaded"] = ping_result(pinger)
            # --quick leaves sockperf under the hog out (its p99 is the scheduler tick: anchors.md)
            out["sockperf_rtt_us_loaded"] = (
                sockperf(ns_prober, ns_responder, host, 5) if with_sockperf and not quick else None
            )
        out["net_rtt_p50_us_loaded"] = loaded["net_rtt_us"]["p50"]
        out["net_rtt_p99_us_loaded"] = loaded["net_rtt_us"]["p99"]
        out["app_rtt_p50_us_loaded"] = loaded["app_rtt_us"]["p50"]
        out["app_rtt_p99_us_loaded"] = loaded["app_rtt_us"]["p99"]
    return out


@contextlib.contextmanager
def veth_pair() -> Iterator[tuple[str, str, str]]:
    import subprocess
    import uuid

    tag = uuid.uuid4().hex[:6]
    a, b = f"skhe-ba-{tag}", f"skhe-bb-{tag}"

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh(
            "ip",
            "link",
            "add",
            f"skhe-xa{tag}",
            "netns",
            a,
            "type",
            "veth",
            "peer",
            "name",
            f"skhe-xb{tag}",
            "netns",
            b,
        )
        for ns, dev, ip in (
            (a, f"skhe-xa{tag}", "198.18.78.1"),
            (b, f"skhe-xb{tag}", "198.18.78.2"),
        ):
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield a, b, "198.18.78.2"
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def signal_block_sigterm() -> None:
    """Blocks SIGTERM before any thread starts: threads inherit the mask, sigwait() takes it."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short legs (< 40 s in all)")
    ap.add_argument("--no-veth", action="store_true", help="loopback only")
    ap.add_argument("--worker", choices=("c", "respond"), help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bind", default="0.0.0.0", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=float, default=0.5, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--drain-every", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--ring", type=int, default=8192, help=argparse.SUPPRESS)
    ap.add_argument("--window", type=int, default=2048, help=argparse.SUPPRESS)
    ap.add_argument("--paths", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "respond":
        signal_block_sigterm()
        respond_worker(args)
        return
    if args.worker:
        c_worker(args)
        return

    t0 = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    import shutil

    can_veth = bool(os.geteuid() == 0 and shutil.which("ip") and not args.no_veth)
    # --quick runs sockperf (a busy-waiting 1000 msg/s client) on one leg only: veth when it runs
    legs: dict[str, dict] = {
        "loopback": leg(None, None, "127.0.0.1", args.quick, not (args.quick and can_veth))
    }
    if can_veth:
        with veth_pair() as (a, b, ip_b):
            legs["veth"] = leg(a, b, ip_b, args.quick, True)
    primary = "veth" if "veth" in legs else "loopback"
    result = {
        **legs[primary],
        "primary_leg": primary,
        "legs": legs,
        "cpus": len(os.sched_getaffinity(0)),
        "kernel": os.uname().release,
        "quick": args.quick,
        "elapsed_s": round(time.monotonic() - t0, 1),
        # 1/5/15-min load averages: other work on the machine shows in every CPU figure
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
