"""Verbs leg of the probe benchmark: the engine over ibverbs UD (soft-RoCE, rxe0 -> rxe1) vs the
same engine over UDP (192.0.2.1 -> 192.0.2.2), side by side in one run inside the soft-RoCE VM.

Outside the VM the script re-runs itself inside one (tools/rxe-vm/run-in-rxe-vm.sh). There, a
responder process hosts a UDP and a verbs responder engine; this process probes each in turn, so
its getrusage CPU is the prober's (engine thread + an idle Python thread). Legs per transport:
  - saturation: 8 targets offered far more than the engine can send; probes/s answered and CPU µs
    per probe sent;
  - paced: 200 probes/s (below what TCG-emulated rxe can carry); CPU µs per probe and network
    RTT p50/p99 (clock: user for verbs on rxe, kernel for UDP).
All numbers are under TCG emulation (roughly 5-20x slower than the host): compare the two
transports with each other, not with bench/probe_overhead.py.

    python bench/probe_verbs.py [--quick]        # prints one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_TARGETS = 8


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def respond_worker() -> None:
    from skh.probe import Engine

    with Engine(bind="192.0.2.2") as udp, Engine(transport="verbs", device="rxe1") as verbs:
        v = verbs.local_address()
        print(f"udp {udp.local_port} verbs {v['gid']} {v['qpn']}", file=sys.stderr, flush=True)
        signal.sigwait({signal.SIGTERM})


def leg(transport: str, dst: dict, rate: float, duration: float, warmup: float) -> dict:
    import numpy as np

    from skh.probe import Engine
    from skh.records import ProbeStatus

    kw = {"transport": "verbs", "device": "rxe0"} if transport == "verbs" else {"bind": "192.0.2.1"}
    with Engine(timeout_s=1.0, **kw) as eng:
        for i in range(N_TARGETS):
            eng.add_target(
                i,
                dst.get("host", ""),
                dst.get("port", 0),
                gid=dst.get("gid", ""),
                qpn=dst.get("qpn", 0),
                interval_s=N_TARGETS / rate,
                path_id=i,
            )
        time.sleep(warmup)
        eng.drain()
        s0, cpu0, t0 = eng.stats(), _cpu_s(), time.monotonic()
        batches = []
        while time.monotonic() - t0 < duration:
            time.sleep(0.25)
            batches.append(eng.drain())
        cpu, wall, s1 = _cpu_s() - cpu0, time.monotonic() - t0, eng.stats()
    rows = np.concatenate(batches)
    ok = rows[rows["status"] == ProbeStatus.OK]
    sent = s1.sent - s0.sent
    net = ok["rtt_ns"] / 1e3

    def pct(q: float) -> float | None:
        return round(float(np.percentile(net, q)), 2) if len(net) else None

    return {
        "offered_per_s": rate,
        "sent_per_s": round(sent / wall, 1),
        "answered_per_s": round(len(ok) / wall, 1),
        "lost": int(np.count_nonzero(rows["status"] == ProbeStatus.LOST)),
        "cpu_us_per_probe": round(cpu / sent * 1e6, 2) if sent else None,
        "cpu_pct": round(100 * cpu / wall, 1),
        "net_rtt_us": {"p50": pct(50), "p99": pct(99)},
        "clock": sorted({int(c) for c in ok["ts_source"]}),
    }


def run_in_vm(args: argparse.Namespace) -> dict:
    resp = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = resp.stderr.readline()
        m = re.match(r"udp (\d+) verbs (\S+) (\d+)", line)
        if not m:
            raise RuntimeError(f"responder did not start: {line!r}")
        dsts = {
            "udp": {"host": "192.0.2.2", "port": int(m.group(1))},
            "verbs": {"gid": m.group(2), "qpn": int(m.group(3))},
        }
        out: dict = {}
        for transport, dst in dsts.items():
            out[transport] = {
                "saturation": leg(transport, dst, args.sat_rate, args.duration, args.warmup),
                "paced": leg(transport, dst, args.paced_rate, args.duration, args.warmup),
            }
        return out
    finally:
        resp.send_signal(signal.SIGTERM)
        resp.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="short legs (about a minute with the VM boot)"
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds per leg (default 8; 2 with --quick)"
    )
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument(
        "--sat-rate", type=float, default=200_000.0, help="offered probes/s, saturation legs"
    )
    ap.add_argument(
        "--paced-rate",
        type=float,
        default=200.0,
        help="probes/s, paced legs (low enough not to saturate the emulated NIC)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        respond_worker()
        return 0
    if args.duration is None:
        args.duration = 2.0 if args.quick else 8.0
    if os.environ.get("RXEVM") != "1":
        # -u: the JSON line comes back through the VM's serial console
        cmd = [str(ROOT / "tools/rxe-vm/run-in-rxe-vm.sh"), sys.executable, "-u", *sys.argv]
        return subprocess.run(
            cmd, env={**os.environ, "RXEVM_SHARE_CWD": "0"}, check=False
        ).returncode
    legs = run_in_vm(args)
    u, v = legs["udp"], legs["verbs"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    print(
        json.dumps(
            {
                "where": "soft-RoCE VM (qemu TCG, 2 vCPUs)",
                "duration_s": args.duration,
                "verbs_answered_per_s": v["saturation"]["answered_per_s"],
                "udp_answered_per_s": u["saturation"]["answered_per_s"],
                "verbs_cpu_us_per_probe_paced": v["paced"]["cpu_us_per_probe"],
                "udp_cpu_us_per_probe_paced": u["paced"]["cpu_us_per_probe"],
                "verbs_over_udp": {
                    "answered_per_s": ratio(
                        v["saturation"]["answered_per_s"], u["saturation"]["answered_per_s"]
                    ),
                    "cpu_us_per_probe_paced": ratio(
                        v["paced"]["cpu_us_per_probe"], u["paced"]["cpu_us_per_probe"]
                    ),
                },
                "legs": legs,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
