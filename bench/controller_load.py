"""Controller load: sustained container registrations per minute and readiness fan-out latency.

A real ``skh controller`` process (SQLite registry, commit before every answer; CURVE with one
key per container, as docs/trust.md provisions sidecars statically, unless ``--insecure``)
serves load generator processes that play one DEALER per container (``--procs`` processes share
the containers, so 10,240 containers need no 10,240 sockets in one process) and do what a
sidecar does: register 8 endpoints (one per rail), read its job's snapshot (the pages a SYNC
returns, or the one a REGISTER_ACK carries), report ready, with ``--window`` containers in
flight in all. A container is done when its READY is acknowledged and its snapshot's last page
arrived; pages are received whole but their records are skipped, not decoded (an agent's
decode is its own CPU: ``bench/pinglist_costs.py``). A separate
subscriber process holds ``--subscribers`` SUB sockets spread over the jobs' topics, like the
agents of those jobs, and stamps every endpoint each readiness announcement names. Fan-out
latency = receive time at a subscriber - the time its container sent READY (same host clock).
Every reply a generator receives is measured (``max_reply_bytes``, ``snapshot_bytes``), and the
controller's resident memory at the end (``controller_rss_mb``). ``--controller-src DIR`` runs
the controller from another checkout (the same load against an older controller).

The paper's push design choked at about 2,000 container creations per minute; the goal is
>= 20,000 registrations/min with p99 fan-out <= 1 s; issue 19 asks it at 10,240 hosts x 8 RNICs
(81,920 endpoints) with replies <= 1 MiB and the controller <= 1 GiB.

    python bench/controller_load.py --quick      # one round of 81,920 endpoints
    python bench/controller_load.py              # three rounds of 4,096: the registry grows

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

import msgpack
import numpy as np
import psutil
import zmq
import zmq.auth

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.orchestrator.security import generate_keypair  # noqa: E402
from skh.wire import Codec, MsgType, job_topic  # noqa: E402

RAILS = 8


def _agent(round_no: int, job: str, c: int) -> str:
    return f"r{round_no}-{job}-c{c}"


def _make_keys(root: Path, jobs: list[str], containers_per_job: int, round_no: int) -> None:
    """One overlay key per container (trusted/NAME.key, the secret in clients/), plus the
    controller's. Written without fsync: a bench's keys live and die with its temp dir."""
    clients, trusted = root / "clients", root / "trusted"
    clients.mkdir(parents=True, exist_ok=True)
    trusted.mkdir(exist_ok=True)
    if not (root / "controller.key_secret").exists():
        generate_keypair(root, "controller", durable=False)
    for job in jobs:
        for c in range(containers_per_job):
            name = _agent(round_no, job, c)
            meta = {"role": "overlay", "host": f"h{c}", "job": job, "container": f"c{c}"}
            generate_keypair(clients, name, metadata=meta, durable=False)
            os.link(clients / f"{name}.key", trusted / f"{name}.key")


def _secure(sock: zmq.Socket, keys: str, name: str) -> None:
    """Make ``sock`` a CURVE client with the key of ``name`` (no-op without keys)."""
    if not keys:
        return
    server, _ = zmq.auth.load_certificate(f"{keys}/controller.key")
    public, secret = zmq.auth.load_certificate(f"{keys}/clients/{name}.key_secret")
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server, public, secret


def _page_header(raw: bytes) -> tuple[MsgType, dict]:
    """An envelope's type and body with its records skipped (not built): what the load
    generator reads of a snapshot page (``records``; ``endpoints``, one map per record, from a
    controller before the columnar pages)."""
    u = msgpack.Unpacker(raw=False, max_buffer_size=len(raw))
    u.feed(raw)
    env: dict = {}
    body: dict = {}
    for _ in range(u.read_map_header()):
        key = u.unpack()
        if key != "body":
            env[key] = u.unpack()
            continue
        for _ in range(u.read_map_header()):
            field = u.unpack()
            if field in ("records", "endpoints"):
                u.skip()
            else:
                body[field] = u.unpack()
    return MsgType(env["type"]), body


def _subscriber(args: argparse.Namespace) -> int:
    """Child process: SUB sockets over the jobs' topics; prints receive stamps as JSON."""
    ctx = zmq.Context()
    codec = Codec()
    jobs = args.jobs_list.split(",")
    socks = []
    for i in range(args.subscribers):
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 0)
        # an agent of that job: its key may subscribe to its own job's topic alone
        _secure(s, args.keys, _agent(args.round, jobs[i % len(jobs)], i // len(jobs)))
        s.setsockopt(zmq.SUBSCRIBE, job_topic(jobs[i % len(jobs)]))
        s.connect(args.pub)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)  # a line: the generators are done
    print("ready", flush=True)
    stamps: list[tuple[int, int]] = []
    generating = True
    idle_deadline = time.monotonic() + args.idle_s
    while generating or time.monotonic() < idle_deadline:
        events = poller.poll(100)
        now = time.time_ns()
        for s, _ in events:
            if not isinstance(s, zmq.Socket):  # stdin (the poller gives its descriptor)
                sys.stdin.readline()
                poller.unregister(sys.stdin)
                generating = False
                continue
            while True:
                try:
                    _topic, raw = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                env = codec.decode(raw)
                if env.type is MsgType.READY_ANNOUNCE:
                    stamps += [(int(e["ep"]), now) for e in env.body["endpoints"]]
        if events:
            idle_deadline = time.monotonic() + args.idle_s
    json.dump(stamps, sys.stdout)
    return 0


def _generator(args: argparse.Namespace) -> int:
    """Child process: one DEALER per container of its share; registers and readies them on
    "go" (a line on stdin); prints its stamps and the largest reply as JSON."""
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 65536)
    codec = Codec(max_frame_bytes=1 << 30)
    jobs = args.jobs_list.split(",")
    todo = [(job, c) for c in range(args.containers_per_job) for job in jobs]
    todo = todo[args.proc :: args.procs]
    socks: list[tuple[zmq.Socket, str, str, int]] = []
    for job, c in todo:
        name = _agent(args.round, job, c)
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, name.encode())
        _secure(s, args.keys, name)
        s.connect(args.router)
        socks.append((s, name, job, c))
    # every link is up (TCP, ZMTP and CURVE handshakes) once a heartbeat came back on it
    greeter = zmq.Poller()
    for s, name, _job, _c in socks:
        greeter.register(s, zmq.POLLIN)
        s.send(codec.encode(MsgType.HEARTBEAT, name, 0, {"agent": name, "epoch": "", "jobs": {}}))
    pending = len(socks)
    while pending:
        events = greeter.poll(300_000)
        if not events:
            raise RuntimeError(f"{pending} links not up after 300 s")
        for s, _ in events:
            s.recv()
            greeter.unregister(s)
            pending -= 1
    print("ready", flush=True)
    sys.stdin.readline()
    index = {s: i for i, (s, *_rest) in enumerate(socks)}
    poller = zmq.Poller()
    sent_ready: list[tuple[int, int]] = []
    errors = done = nxt = max_reply = snapshot_bytes = 0
    waiting: dict[zmq.Socket, int] = {}  # what a container still awaits: ready ACK, last page

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
    while nxt < len(socks) and nxt < args.window:
        start(nxt)
        nxt += 1
    while done < len(socks):
        events = poller.poll(30_000)
        if not events:
            raise RuntimeError(f"controller stopped answering after {done} containers")
        for s, _ in events:
            _s, name, job, _c = socks[index[s]]
            raw = s.recv()
            max_reply = max(max_reply, len(raw))
            if raw[:512].find(b"job_snapshot") >= 0:  # a page: its records are not decoded
                mtype, body = _page_header(raw)
                snapshot_bytes += len(raw)
                if body.get("next") is not None:
                    s.send(
                        codec.encode(
                            MsgType.SYNC, name, 3, {"job": job, "after": int(body["next"])}
                        )
                    )
                    continue
                waiting[s] -= 1
            else:
                env = codec.decode(raw)
                if env.type is MsgType.REGISTER_ACK:
                    eps = env.body["endpoints"]
                    inline = any(x.get("job") == job for x in env.body["snapshots"])
                    snapshot_bytes += len(raw) if inline else 0
                    waiting[s] = 1 if inline else 2
                    if not inline:  # as an agent does: SYNC, then READY at once
                        s.send(codec.encode(MsgType.SYNC, name, 3, {"job": job}))
                    now = time.time_ns()
                    sent_ready += [(ep, now) for ep in eps]
                    s.send(codec.encode(MsgType.READY, name, 2, {"agent": name, "endpoints": eps}))
                    continue
                if env.type is not MsgType.ACK:
                    continue
                errors += not env.body["ok"]
                waiting[s] -= 1
            if waiting[s] == 0:
                del waiting[s]
                done += 1
                poller.unregister(s)
                if nxt < len(socks):
                    start(nxt)
                    nxt += 1
    elapsed = time.perf_counter() - t0
    for s, *_rest in socks:
        s.close(0)
    json.dump(
        {
            "seconds": elapsed,
            "containers": len(socks),
            "sent_ready": sent_ready,
            "errors": errors,
            "max_reply_bytes": max_reply,
            "snapshot_bytes": snapshot_bytes,
        },
        sys.stdout,
    )
    return 0


def _child(env: dict[str, str], role: str, opts: dict[str, object]) -> subprocess.Popen:
    """This script as a ``role`` child process, talking over its stdin and stdout."""
    argv = [sys.executable, __file__, "--role", role]
    for k, v in opts.items():
        argv += [f"--{k}", str(v)]
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _generate(
    env: dict[str, str],
    router: str,
    jobs: list[str],
    containers_per_job: int,
    window: int,
    round_no: int,
    procs: int,
    keys: str,
    ctl: psutil.Process,
) -> tuple[float, float, dict[int, int], int, int, int]:
    """Register + ready every container with ``procs`` generator processes; returns (seconds,
    the controller's CPU seconds, {endpoint: ready_sent_ns}, errors, largest reply, snapshot
    bytes). Every container's DEALER connects (and completes its CURVE handshake) before the
    clock starts, as an agent is connected before it registers."""
    children = [
        _child(
            env,
            "generator",
            {
                "router": router,
                "jobs-list": ",".join(jobs),
                "containers-per-job": containers_per_job,
                "window": max(1, window // procs),
                "round": round_no,
                "procs": procs,
                "proc": k,
                "keys": keys,
            },
        )
        for k in range(procs)
    ]
    for c in children:
        if c.stdout.readline().strip() != "ready":
            raise RuntimeError("a load generator did not start")
    cpu0 = sum(ctl.cpu_times()[:2])
    t0 = time.perf_counter()
    for c in children:
        c.stdin.write("go\n")
        c.stdin.flush()
    outs = [json.loads(c.communicate(timeout=3600)[0]) for c in children]
    elapsed = time.perf_counter() - t0
    cpu_s = sum(ctl.cpu_times()[:2]) - cpu0
    sent = {int(ep): int(t) for o in outs for ep, t in o["sent_ready"]}
    return (
        elapsed,
        cpu_s,
        sent,
        sum(o["errors"] for o in outs),
        max(o["max_reply_bytes"] for o in outs),
        sum(o["snapshot_bytes"] for o in outs),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round of 81,920 endpoints")
    ap.add_argument(
        "--endpoints",
        type=int,
        help="endpoints per round, 8 per container (default: 81,920 with --quick, else 4,096)",
    )
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=128, help="containers registering at once")
    ap.add_argument("--subscribers", type=int, default=64)
    ap.add_argument("--procs", type=int, default=4, help="load generator processes")
    ap.add_argument("--insecure", action="store_true", help="no CURVE, no keys (authz off)")
    ap.add_argument(
        "--controller-src", type=Path, default=ROOT, help="run the controller from this checkout"
    )
    ap.add_argument(
        "--role",
        choices=("main", "subscriber", "generator"),
        default="main",
        help=argparse.SUPPRESS,
    )
    ap.add_argument("--pub", help=argparse.SUPPRESS)
    ap.add_argument("--router", help=argparse.SUPPRESS)
    ap.add_argument("--jobs-list", help=argparse.SUPPRESS)
    ap.add_argument("--containers-per-job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--proc", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--idle-s", type=float, default=3.0, help=argparse.SUPPRESS)
    ap.add_argument("--keys", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "subscriber":
        return _subscriber(args)
    if args.role == "generator":
        return _generator(args)
    if args.endpoints is None:
        args.endpoints = 81_920 if args.quick else 4096
    rounds = 1 if args.quick else args.rounds
    containers_per_job = max(1, args.endpoints // RAILS // args.jobs)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    ctl_env = {**env, "PYTHONPATH": str(args.controller_src.resolve())}
    round_jobs = [[f"bench{rnd}-j{j}" for j in range(args.jobs)] for rnd in range(rounds)]
    with tempfile.TemporaryDirectory(prefix="skh-bench-") as tmp:
        keys = "" if args.insecure else f"{tmp}/keys"
        t_keys = time.perf_counter()
        for rnd, jobs in enumerate(round_jobs):
            if keys:
                _make_keys(Path(keys), jobs, containers_per_job, rnd)
        keys_s = time.perf_counter() - t_keys
        security = (
            ["--insecure"]
            if not keys
            else [
                "--set",
                f"security.server_secret_key={keys}/controller.key_secret",
                "--set",
                f"security.authorized_keys_dir={keys}/trusted",
            ]
        )
        ctl = subprocess.Popen(
            [
                sys.executable,
                *os.environ.get("SKH_BENCH_CTL_PREFIX", "-m").split(),
                "skh",
                "controller",
                *security,
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
            cwd=args.controller_src,
            env=ctl_env,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("SKH_BENCH_DEBUG") else subprocess.DEVNULL,
            text=True,
        )
        try:
            addrs = json.loads(ctl.stdout.readline())
            ctl_proc = psutil.Process(ctl.pid)
            ctl_cpu_s = 0.0
            total_s, total_containers, errors, max_reply, snap_bytes = 0.0, 0, 0, 0, 0
            latencies: list[np.ndarray] = []
            delivered = 0
            load_start = os.getloadavg()[0]
            for rnd, jobs in enumerate(round_jobs):
                sub = _child(
                    env,
                    "subscriber",
                    {
                        "pub": addrs["pub"],
                        "jobs-list": ",".join(jobs),
                        "subscribers": args.subscribers,
                        "round": rnd,
                        "keys": keys,
                    },
                )
                assert sub.stdout.readline().strip() == "ready"
                time.sleep(0.5)  # subscriptions reach the PUB socket
                secs, cpu_s, sent, errs, biggest, pages = _generate(
                    env,
                    addrs["router"],
                    jobs,
                    containers_per_job,
                    args.window,
                    rnd,
                    args.procs,
                    keys,
                    ctl_proc,
                )
                ctl_cpu_s += cpu_s
                snap_bytes += pages
                out, _ = sub.communicate("done\n", timeout=600)
                stamps = json.loads(out)
                lat = [(t - sent[ep]) / 1e6 for ep, t in stamps if ep in sent]
                latencies.append(np.array(lat))
                delivered += len(lat)
                total_s += secs
                total_containers += len(sent) // RAILS
                errors += errs
                max_reply = max(max_reply, biggest)
            lat_all = np.concatenate(latencies) if latencies else np.zeros(0)
            # each endpoint's readiness reaches every subscriber of its job's topic
            expected = total_containers * RAILS * args.subscribers // args.jobs
            result = {
                "bench": "controller_load",
                "quick": args.quick,
                "rounds": rounds,
                "endpoints": total_containers * RAILS,
                "controller_rss_mb": round(ctl_proc.memory_info().rss / 2**20, 1),
                "max_reply_bytes": max_reply,
                "authentication": bool(keys),
                "controller_src": str(args.controller_src.resolve()),
                "keys_made_s": round(keys_s, 1),
                # what the containers read of their jobs' snapshots, in all
                "snapshot_mb_served": round(snap_bytes / 1e6, 1),
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
                # others' work on this machine at the start and the end (2 cores)
                "load_average_1m_start": round(load_start, 2),
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
                "goal": {
                    "registrations_per_min": 20000,
                    "fanout_p99_ms": 1000,
                    "controller_rss_mb": 1024,
                    "max_reply_bytes": 1 << 20,
                },
            }
        finally:
            ctl.terminate()
            ctl.wait(15)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
