"""Controller load: sustained container registrations per minute and readiness fan-out latency.

A real ``skh controller`` process (SQLite registry, commit before every answer) serves a load
generator that plays one DEALER per container: register 8 endpoints (one per rail), then report
ready, with ``--window`` containers in flight. A separate subscriber process holds
``--subscribers`` SUB sockets spread over the jobs' topics, like the agents of those jobs, and
stamps every readiness announcement it receives. Fan-out latency = receive time at a subscriber -
the time the container sent READY (same host clock).

The paper's push design choked at about 2,000 container creations per minute; the goal here is
>= 20,000 registrations/min with p99 fan-out <= 1 s at 4,096 endpoints.

    python bench/controller_load.py --quick      # one round of 4,096 endpoints (< 60 s)
    python bench/controller_load.py              # three rounds: the registry grows to 12,288

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.wire import Codec, MsgType, job_topic  # noqa: E402

RAILS = 8


def _subscriber(args: argparse.Namespace) -> int:
    """Child process: SUB sockets over the jobs' topics; prints receive stamps as JSON."""
    ctx = zmq.Context()
    codec = Codec()
    jobs = args.jobs_list.split(",")
    socks = []
    for i in range(args.subscribers):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.SUBSCRIBE, job_topic(jobs[i % len(jobs)]))
        s.connect(args.pub)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    print("ready", flush=True)
    stamps: list[tuple[str, int, int]] = []
    idle_deadline = time.monotonic() + args.idle_s * 4
    while time.monotonic() < idle_deadline:
        events = poller.poll(100)
        now = time.time_ns()
        for s, _ in events:
            while True:
                try:
                    _topic, raw = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                env = codec.decode(raw)
                if env.type is MsgType.READY_ANNOUNCE:
                    stamps.append(
                        (env.body["job"], min(e["ep"] for e in env.body["endpoints"]), now)
                    )
        if events:
            idle_deadline = time.monotonic() + args.idle_s
    json.dump(stamps, sys.stdout)
    return 0


def _generate(
    ctx: zmq.Context,
    router: str,
    jobs: list[str],
    containers_per_job: int,
    window: int,
    round_no: int,
) -> tuple[float, dict[tuple[str, int], int], int]:
    """Register + ready every container, ``window`` at a time; returns (seconds,
    {(job, first ep): ready_sent_ns}, errors). Every container's DEALER connects before the clock
    starts, as an agent is connected before it registers."""
    codec = Codec()
    todo = [(job, c) for c in range(containers_per_job) for job in jobs]
    socks: list[tuple[zmq.Socket, str, str, int]] = []
    for job, c in todo:
        name = f"r{round_no}-{job}-c{c}"
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, name.encode())
        s.connect(router)
        socks.append((s, name, job, c))
    time.sleep(1.0 + len(socks) / 500)  # the TCP and ZMTP handshakes complete
    index = {s: i for i, (s, *_rest) in enumerate(socks)}
    poller = zmq.Poller()
    sent_ready: dict[tuple[str, int], int] = {}
    errors = done = nxt = 0

    def start(i: int) -> None:
        s, name, job, c = socks[i]
        poller.register(s, zmq.POLLIN)
        eps = [
            {"job": job, "container": f"c{c}", "rail": r, "ip": "10.0.0.1", "port": 10000 + r}
            for r in range(RAILS)
        ]
        s.send(
            codec.encode(
                MsgType.REGISTER,
                name,
                1,
                {"agent": name, "role": "overlay", "host": f"h{c}", "endpoints": eps},
            )
        )

    t0 = time.perf_counter()
    while nxt < len(socks) and nxt < window:
        start(nxt)
        nxt += 1
    while done < len(socks):
        events = poller.poll(5000)
        if not events:
            raise RuntimeError(f"controller stopped answering after {done} containers")
        for s, _ in events:
            _s, name, job, _c = socks[index[s]]
            env = codec.decode(s.recv())
            if env.type is MsgType.REGISTER_ACK:
                eps = env.body["endpoints"]
                sent_ready[(job, min(eps))] = time.time_ns()
                s.send(codec.encode(MsgType.READY, name, 2, {"agent": name, "endpoints": eps}))
            elif env.type is MsgType.ACK:
                errors += not env.body["ok"]
                done += 1
                poller.unregister(s)
                if nxt < len(socks):
                    start(nxt)
                    nxt += 1
    elapsed = time.perf_counter() - t0
    for s, *_rest in socks:
        s.close(0)
    return elapsed, sent_ready, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round (< 60 s)")
    ap.add_argument(
        "--endpoints", type=int, default=4096, help="endpoints per round (8 per container)"
    )
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=128, help="containers registering at once")
    ap.add_argument("--subscribers", type=int, default=64)
    ap.add_argument(
        "--role", choices=("main", "subscriber"), default="main", help=argparse.SUPPRESS
    )
    ap.add_argument("--pub", help=argparse.SUPPRESS)
    ap.add_argument("--jobs-list", help=argparse.SUPPRESS)
    ap.add_argument("--idle-s", type=float, default=3.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "subscriber":
        return _subscriber(args)
    rounds = 1 if args.quick else args.rounds
    containers_per_job = max(1, args.endpoints // RAILS // args.jobs)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    with tempfile.TemporaryDirectory(prefix="skh-bench-") as tmp:
        ctl = subprocess.Popen(
            [
                sys.executable,
                *os.environ.get("SKH_BENCH_CTL_PREFIX", "-m").split(),
                "skh",
                "controller",
                "--insecure",
                "--db",
                f"{tmp}/registry.db",
                "--bind",
                "tcp://127.0.0.1:0",
                "--pub-bind",
                "tcp://127.0.0.1:0",
                "--heartbeat-interval",
                "30",
                "--print-endpoints",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        ctx = zmq.Context()
        try:
            addrs = json.loads(ctl.stdout.readline())
            ctl_proc = psutil.Process(ctl.pid)
            ctl_cpu_s = 0.0
            total_s, total_containers, errors = 0.0, 0, 0
            latencies: list[np.ndarray] = []
            delivered = 0
            for rnd in range(rounds):
                jobs = [f"bench{rnd}-j{j}" for j in range(args.jobs)]
                sub = subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--role",
                        "subscriber",
                        "--pub",
                        addrs["pub"],
                        "--jobs-list",
                        ",".join(jobs),
                        "--subscribers",
                        str(args.subscribers),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert sub.stdout.readline().strip() == "ready"
                time.sleep(0.5)  # subscriptions reach the PUB socket
                cpu0 = sum(ctl_proc.cpu_times()[:2])
                secs, sent, errs = _generate(
                    ctx, addrs["router"], jobs, containers_per_job, args.window, rnd
                )
                ctl_cpu_s += sum(ctl_proc.cpu_times()[:2]) - cpu0
                out, _ = sub.communicate(timeout=120)
                stamps = json.loads(out)
                lat = [(t - sent[(job, ep)]) / 1e6 for job, ep, t in stamps if (job, ep) in sent]
                latencies.append(np.array(lat))
                delivered += len(lat)
                total_s += secs
                total_containers += len(sent)
                errors += errs
            lat_all = np.concatenate(latencies) if latencies else np.zeros(0)
            expected = total_containers * args.subscribers // args.jobs
            result = {
                "bench": "controller_load",
                "quick": args.quick,
                "rounds": rounds,
                "endpoints_per_round": containers_per_job * args.jobs * RAILS,
                "registry_endpoints": total_containers * RAILS,
                "containers": total_containers,
                "window": args.window,
                "subscribers": args.subscribers,
                "seconds": round(total_s, 3),
                "registrations_per_min": round(total_containers / total_s * 60, 1),
                "endpoint_registrations_per_min": round(total_containers * RAILS / total_s * 60, 1),
                # the controller's own CPU per registration (register + ready + announce), and the
                # rate one core would sustain: independent of what else shares this machine
                "controller_cpu_ms_per_registration": round(ctl_cpu_s / total_containers * 1e3, 3),
                "controller_capacity_registrations_per_min": round(
                    total_containers / ctl_cpu_s * 60, 1
                ),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "fanout_p50_ms": round(float(np.percentile(lat_all, 50)), 3)
                if lat_all.size
                else None,
                "fanout_p99_ms": round(float(np.percentile(lat_all, 99)), 3)
                if lat_all.size
                else None,
                "fanout_max_ms": round(float(lat_all.max()), 3) if lat_all.size else None,
                "announcements_delivered": delivered,
                "announcements_expected": expected,
                "errors": errors,
                "goal": {"registrations_per_min": 20000, "fanout_p99_ms": 1000},
            }
        finally:
            ctl.terminate()
            ctl.wait(15)
            ctx.destroy(linger=0)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
