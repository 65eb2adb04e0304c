"""The real overlay agent process at a given probe rate: its CPU and memory as deployed.

``skh agent --role overlay`` runs as its own process with ``--endpoints`` endpoints (one probing
engine each, as a container's VFs), registered with a real ``skh controller`` (plain text on
loopback). Its peers are emulated here: ``peers`` containers, one DEALER each, that register one
endpoint per rail, report ready and heartbeat, all pointing at one C responder
(``bench/probe_overhead.py``'s). The controller's probe policy hands the agent its plan:
``interval_s`` per pair chosen so that the endpoints probe ``rate`` per second in all, rotating
over ``paths`` path ids (``probe_max_paths``). Its result batches go to a PULL socket here.
Its endpoints are probed as they are in a job (pairs are probed both ways): one engine here
probes each endpoint for its ``peers`` at the same interval and path rotation, so the agent's
responder work and tables are measured too (``--no-inbound``: the agent only probes). Those
streams' phases are spread over the interval, as independent peers' are, so the probes arrive one
by one (``--inbound burst``: all on one grid, one burst per interval, the way this bench sent
them before session 10: it hid the cost of waking up for each peer's probe; ``--inbound wall``:
in a burst on the wall clock's grid, as peers with ``agent.engine_wall_grid`` send). After a
warm-up the agent's CPU time is read over ``duration`` seconds, the probes it sent from
its ``stats`` command (through the controller) with what its engines handled per second
(``engine_per_s``: answers, peers' probes, send stamps, loop wake-ups), its CPU by thread, and
its memory from ``/proc``: VmRSS (what the
paper's "RSS" is), RssAnon, and USS/PSS (smaps_rollup: its own pages, and its share of pages
shared with other processes: numpy's and libzmq's code, which every sidecar on a host maps
once). Where the VmRSS is: ``rss_by_mapping_mb`` (numpy's libraries, libpython, libzmq...,
heap and anonymous memory) and ``rss_imports_mb``, what a fresh process holds after importing
the agent's modules layer by layer (``rss_running_mb``: the rest, the running agent's own).

    python bench/agent_process.py --rate 400 --duration 20 --paths 19 [--against REV]

Prints one JSON object. With ``--against REV`` the agent of git revision ``REV`` (exported to a
temporary folder, its extension built there: ~30 s) is measured first by this same script, and
both come out side by side (``before``, ``after`` and the headline figures of each).

Measured (``--rate 800 --paths 19 --duration 20 --against ae0b790``: the busiest container's
100 probes/s on each of 8 endpoints, answering as many; a 2-core machine shared with other
sessions, load ~5; 5 runs): VmRSS 46.5-47.1 -> 28.1 MB, CPU 2.58 -> 2.76 % of a core on average
(2.2-2.86, 2.6-2.99; docs/probing.md, "What it costs and covers", session 9). Session 10, peers
one by one (load 3-4): 7.36 % without the engine's tick, 5.92 % with ``--agent-set
engine_tick_s=0.005`` (six interleaved pairs); peers in bursts 3.85-4.05 % (docs/engine.md,
"Wake-ups"). Session 15 (``--rate 800 --paths 19 --duration 15``, peers spread, load ~2): the
agent 5.07 % (engines 4.6, Python 0.67), the bare responder 1.07 %, so the bare floor
(``bare_floor_cpu_pct``) 2.13 %: on this 2-vCPU VM the kernel's UDP work alone at the busiest
container's rate is above the issue's 2 %; the agent is 2.4x that floor (849 wake-ups/s against
the responder's batches). Session 25: the agent's engines tick (5 ms) by default
(``skh.policy.ENGINE_TICK_S``; ``--agent-set engine_tick_s=0`` measures without): 4.88 -> 3.75 %
on average over three interleaved pairs at load ~2.7 (docs/probing.md, session 25). Session 34
(``--rate 800 --paths 45 --against 05a9fe0``): the engines on one thread
(``agent.engine_shared_thread``) 2.10 -> 1.89, 2.15 -> 1.75, 2.05 -> 1.89, 2.19 -> 1.80 %; the
bare responder +0.15 points in the same pairs (docs/engine.md, "One thread for the agent's
engines", on what loopback cannot tell; ``machine_cpu_pct`` and ``peers_cpu_pct`` are there for
that).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.wire import Codec, MsgType  # noqa: E402

HB_S = 0.5


def _overhead() -> Any:
    spec = importlib.util.spec_from_file_location("skh_bench_po", ROOT / "bench/probe_overhead.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _proc_memory_kb(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0])
    return out


#: what ``skh agent --role overlay`` imports (skh/cli/agent.py ``run`` and the engine factory),
#: in layers: the interpreter and its logging, the messaging libraries, then skh's own (numpy
#: no more: tests/orchestrator/test_agent.py keeps it out)
IMPORT_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stdlib", ("logging", "threading", "argparse")),
    ("zmq_msgpack", ("zmq", "msgpack")),
    (
        "skh_modules",
        ("skh.cli.agent", "skh.orchestrator.agent_overlay", "skh.orchestrator.daemon")
        + ("skh.orchestrator.metrics", "skh.probe"),
    ),
)


def import_rss_mb(env: dict[str, str]) -> dict[str, Any]:
    """VmRSS of a fresh interpreter and what each import layer of the agent adds to it (MB), in
    a process of its own: the part of the agent's RSS that is there before it probes at all."""
    code = (
        "import importlib, json, sys\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS:'):\n"
        "            return int(line.split()[1]) / 1024\n"
        "out = {'interpreter': rss()}\n"
        "for name, mods in json.loads(sys.argv[1]):\n"
        "    before = rss()\n"
        "    for m in mods:\n"
        "        importlib.import_module(m)\n"
        "    out[name] = rss() - before\n"
        "out['modules'] = len(sys.modules)\n"
        "print(json.dumps(out))\n"
    )
    raw = subprocess.run(
        [sys.executable, "-c", code, json.dumps(IMPORT_LAYERS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    got = json.loads(raw)
    layers = {k: round(v, 1) for k, v in got.items() if k != "modules"}
    return layers | {"total": round(sum(layers.values()), 1), "modules": got["modules"]}


def _mapping_group(path: str) -> str:
    if "/numpy" in path:
        return "numpy_libs"
    if "libpython" in path or "/lib-dynload/" in path:
        return "python_libs"
    if "zmq" in path or "libsodium" in path or "msgpack" in path or "libstdc++" in path:
        return "zmq_msgpack_libs"  # libzmq is C++: libstdc++ comes with it
    if "_fastprobe" in path:
        return "engine_so"
    if path in ("[heap]", ""):
        return "heap_anon"
    return "other_libs" if path.startswith("/") else "heap_anon"


def smaps_rss_mb(pid: int) -> dict[str, float]:
    """The process's resident MB by what is mapped: numpy's libraries, libpython and its
    extension modules, libzmq/libsodium/msgpack (and libstdc++), the engine's extension, other
    libraries, and the heap and anonymous memory (Python objects, the engines' tables, thread
    stacks)."""
    out: dict[str, float] = {}
    group = "heap_anon"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            group = _mapping_group(head[5] if len(head) == 6 else "")
        elif head[0] == "Rss:":
            out[group] = out.get(group, 0.0) + int(head[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items())}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all CPUs; /proc/stat less idle and iowait)."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(vals[:8]) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (threads of one name summed: the engines' threads, ZeroMQ's,
    the interpreter's main thread and its command workers)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # the thread ended
            continue
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        out[name] = out.get(name, 0.0) + cpu
    return out


class Peers:
    """``n`` emulated peer containers: register, ready, heartbeat until stopped."""

    def __init__(self, ctx: zmq.Context, router: str, job: str, n: int, rails: int, port: int):
        self.codec = Codec()
        self.socks = []
        for i in range(n):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.ROUTING_ID, f"peer{i}".encode())
            s.connect(router)
            self.socks.append(s)
        self.job, self.rails, self.port = job, rails, port
        self.stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _send(self, s: zmq.Socket, mtype: MsgType, body: dict) -> None:
        s.send(self.codec.encode(mtype, s.getsockopt(zmq.ROUTING_ID).decode(), 1, body))

    def start(self) -> None:
        for i, s in enumerate(self.socks):
            eps = [
                {"job": self.job, "container": f"p{i}", "rail": r, "ip": "127.0.0.1"}
                | {"port": self.port}
                for r in range(self.rails)
            ]
            body = {"agent": f"peer{i}", "role": "overlay", "host": f"peerhost{i}"}
            self._send(s, MsgType.REGISTER, body | {"endpoints": eps})
        self.thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        epochs: dict[int, str] = {}
        next_hb = time.monotonic()
        while not self.stop.is_set():
            for s, _ in poller.poll(100):
                i = self.socks.index(s)
                env = self.codec.decode(s.recv())
                if env.type is MsgType.REGISTER_ACK:
                    epochs[i] = str(env.body.get("epoch", ""))
                    body = {"agent": f"peer{i}", "endpoints": env.body["endpoints"]}
                    self._send(s, MsgType.READY, body)
                elif env.type is MsgType.ACK and not env.body.get("ok", True):
                    self.error = str(env.body)
            if time.monotonic() >= next_hb:
                next_hb += HB_S
                for i, s in enumerate(self.socks):
                    body = {"agent": f"peer{i}", "epoch": epochs.get(i, ""), "jobs": {}}
                    self._send(s, MsgType.HEARTBEAT, body)


def _command(admin: zmq.Socket, codec: Codec, agent: str, name: str, n: int) -> dict | None:
    body = {"cmd_id": f"{name}-{n}", "agent": agent, "name": name, "args": {}}
    admin.send(codec.encode(MsgType.COMMAND, "admin", n, body | {"timeout_s": 3.0, "retries": 1}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if admin.poll(500):
            env = codec.decode(admin.recv())
            if env.type is MsgType.COMMAND_REPLY:
                return env.body["result"] if env.body.get("ok") else None
    return None


def _agent_ports(admin: zmq.Socket, codec: Codec, endpoints: int) -> list[int]:
    """The agent's endpoints' bound ports, once it has registered them."""
    deadline = time.monotonic() + 20
    n = 100
    while time.monotonic() < deadline:
        n += 1
        got = (_command(admin, codec, "measured", "pinglist", n) or {}).get("port", {})
        ports = [int(p) for p in got.values()]
        if len(ports) == endpoints and all(ports):
            return ports
        time.sleep(0.2)
    raise RuntimeError("the agent did not register its endpoints")


#: how the peers' probes reach the agent (``--inbound``)
INBOUND_PHASES = ("spread", "burst", "wall")


def _inbound(
    ports: list[int],
    peers: int,
    interval_s: float,
    paths: int,
    phases: str,
    sample_period_s: float = 0.0,
) -> Any:
    """The peers' probes of the agent: each of its endpoints answers ``peers`` probers at the
    pair interval, rotating over ``paths`` source ports, as its skeleton partners probe it (the
    pairs are probed both ways). One engine here stands for all of them; each target is a
    probe stream of its own, as each peer's is. ``phases``: ``spread``, the streams' phases
    spread evenly over the interval, as independent peers' are (each engine has its own grid
    origin), so the probes arrive one by one; ``burst``, they leave here on one grid and arrive
    in one burst per interval; ``wall``, on the wall clock's grid (``Engine`` ``wall_grid``:
    peers whose agents have ``engine_wall_grid`` on), in one burst at wall-clock multiples of
    the interval. ``sample_period_s`` > 0: the peers ask for RTTs only on their latency
    samples, as agents with ``engine_rtt_samples_only`` do (0: on every probe)."""
    from skh.analysis.rowthin import sample_phase_ns
    from skh.probe import Engine

    spread = phases == "spread"
    kw: dict[str, Any] = {"wall_grid": True} if phases == "wall" else {}
    eng = Engine(bind="127.0.0.1", ring_records=256, batch_window_s=0.0 if spread else 500e-6, **kw)
    eng.start()
    n = len(ports) * peers
    t0 = time.monotonic()
    for j in range(n):
        i, k = divmod(j, peers)
        if spread:  # a target's first probe leaves at once, the next ones an interval apart
            time.sleep(max(0.0, t0 + j * interval_s / n - time.monotonic()))
        sampling: dict[str, Any] = {}
        if sample_period_s > 0:
            period_ns = int(sample_period_s * 1e9)
            key = (1000 + i * peers + k) << 32 | i  # a peer's pair with the agent's endpoint i
            sampling = {
                "sample_period_s": period_ns / 1e9,
                "sample_phase_ns": sample_phase_ns(key, period_ns),
            }
        eng.add_target(
            i * peers + k, "127.0.0.1", ports[i], interval_s=interval_s, paths=paths, **sampling
        )
    return eng


def measure(
    rate: float,
    duration_s: float,
    *,
    paths: int = 1,
    endpoints: int = 8,
    warmup_s: float = 4.0,
    inbound: bool = True,
    inbound_rate: float | None = None,
    phases: str | None = None,
    agent_set: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The agent at ``rate`` probes/s over ``endpoints`` endpoints, ``paths`` path ids per pair;
    with ``inbound`` its endpoints also answer the peers' probes, ``inbound_rate`` of them a
    second in all (None: ``rate``; the same peers, each probing at ``inbound_rate / rate``
    times the agent's pair rate; its responder's
    tables are part of what it costs), arriving as ``phases`` says (``_inbound``; None: as
    peers with the agent's own settings send them, ``wall`` where its engines are on the wall
    clock's grid, else ``spread``). ``agent_set``: ``KEY=VALUE`` settings of the agent's
    ``[agent]`` section (``skh agent --set agent.KEY=VALUE``)."""
    from skh.orchestrator.config import load_config, parse_override

    sets = dict(parse_override(f"agent.{kv}") for kv in agent_set)
    agent_cfg = load_config(None, sets).agent
    # peers sample as the agent does (an agent older than the setting: RTTs from every probe)
    sample_period_s = (
        agent_cfg.ok_sample_s if getattr(agent_cfg, "engine_rtt_samples_only", False) else 0.0
    )
    if phases is None:
        # (an agent older than the setting: its engines' grids start at random points)
        phases = "wall" if getattr(agent_cfg, "engine_wall_grid", False) else "spread"
    per_ep = rate / endpoints
    per_pair = max(2.0, paths / 8.0)  # above the coverage floor (paths / probe_coverage_s)
    peers = max(1, round(per_ep / per_pair))
    interval_s = round(peers / per_ep, 3)
    overrides = {
        "controller.probe_interval_s": interval_s,
        "controller.probe_min_interval_s": min(0.02, interval_s),
        "controller.probe_budget_per_s": round(2 * per_ep, 1),
        "controller.probe_answer_budget_per_s": round(2 * per_ep, 1),
        "controller.probe_max_paths": paths,
        # more ECMP paths than max_paths, so every pair rotates over exactly ``paths`` ids
        "controller.probe_default_ecmp_paths": 64 if paths > 1 else 1,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    po = _overhead()
    ctx = zmq.Context()
    procs: list[subprocess.Popen] = []
    probers = None
    with (
        tempfile.TemporaryDirectory(prefix="skh-agentproc-") as tmp,
        po.responder(None, "127.0.0.1") as (port, responder_pid),
    ):
        try:
            ctl = subprocess.Popen(
                [sys.executable, "-m", "skh", "controller", "--insecure", "--db", f"{tmp}/r.db"]
                + [f"--set={k}={v}" for k, v in overrides.items()]
                + ["--heartbeat-interval", str(HB_S), "--print-endpoints"]
                + ["--bind", "tcp://127.0.0.1:0", "--pub-bind", "tcp://127.0.0.1:0"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=open(f"{tmp}/controller.log", "wb"),  # noqa: SIM115
                text=True,
            )
            procs.append(ctl)
            addrs = json.loads(ctl.stdout.readline())
            sink = ctx.socket(zmq.PULL)
            sink_port = sink.bind_to_random_port("tcp://127.0.0.1")
            received = [0]

            def drain() -> None:
                while not sink.closed:
                    try:
                        if sink.poll(200):
                            sink.recv(zmq.NOBLOCK)
                            received[0] += 1
                    except zmq.ZMQError:
                        return

            threading.Thread(target=drain, daemon=True).start()
            emu = Peers(ctx, addrs["router"], "train", peers, endpoints, port)
            emu.start()
            agent = subprocess.Popen(
                [sys.executable, "-m", "skh", "agent", "--insecure", "--role", "overlay"]
                + ["--name", "measured", "--host", "measuredhost", "--job", "train"]
                + ["--container", "measured", "--controller", addrs["router"]]
                + ["--controller-pub", addrs["pub"], "--analyzer", f"tcp://127.0.0.1:{sink_port}"]
                + [x for r in range(endpoints) for x in ("--endpoint", f"rail={r},ip=127.0.0.1")]
                + [f"--set=agent.{kv}" for kv in agent_set],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(f"{tmp}/agent.log", "wb"),  # noqa: SIM115
            )
            procs.append(agent)
            admin = ctx.socket(zmq.DEALER)
            admin.setsockopt(zmq.LINGER, 0)
            admin.setsockopt(zmq.ROUTING_ID, b"admin")
            admin.connect(addrs["router"])
            codec = Codec()
            if inbound:
                ports = _agent_ports(admin, codec, endpoints)
                in_iv = interval_s if inbound_rate is None else peers * endpoints / inbound_rate
                probers = _inbound(ports, peers, round(in_iv, 3), paths, phases, sample_period_s)
            time.sleep(warmup_s)

            def counters() -> dict[str, int]:
                st = _command(admin, codec, "measured", "stats", int(time.monotonic() * 1e3))
                if st is None:
                    raise RuntimeError(f"no stats from the agent: {Path(tmp, 'agent.log')}")
                keys = ("sent", "probes_received", "acks_received", "tx_stamps", "wakeups")
                keys += ("probes_no_rtt",) if "probes_no_rtt" in st["engines"][0] else ()
                out = {k: sum(int(e[k]) for e in st["engines"]) for k in keys}
                if getattr(agent_cfg, "engine_shared_thread", False):
                    # each engine counts the turns of the one thread they share
                    out["wakeups"] = max(int(e["wakeups"]) for e in st["engines"])
                return out

            plan = _command(admin, codec, "measured", "pinglist", 1) or {}
            r0, m0 = _cpu_s(responder_pid), _machine_busy_s()
            b0, k0 = _cpu_s(os.getpid()), _cpu_s(ctl.pid)
            n0, c0, t0 = counters(), _cpu_s(agent.pid), time.monotonic()
            threads0 = _thread_cpu_s(agent.pid)
            time.sleep(duration_s)
            n1, c1, t1 = counters(), _cpu_s(agent.pid), time.monotonic()
            r1, m1 = _cpu_s(responder_pid), _machine_busy_s()
            b1, k1 = _cpu_s(os.getpid()), _cpu_s(ctl.pid)
            threads1 = _thread_cpu_s(agent.pid)
            mem = _proc_memory_kb(agent.pid)
            mapped = smaps_rss_mb(agent.pid)
            if os.environ.get("SKH_AGENT_SMAPS"):  # where the memory is, for a diagnosis
                Path(os.environ["SKH_AGENT_SMAPS"]).write_text(
                    Path(f"/proc/{agent.pid}/smaps").read_text()
                )
            emu.stop.set()
            logs = Path(tmp, "agent.log").read_text()[-800:]
        finally:
            if probers is not None:
                probers.close()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            ctx.destroy(0)
    wall = t1 - t0
    imports = import_rss_mb(env)
    rss_mb = round(mem["VmRSS"] / 1024, 1)
    lists = plan.get("plan", {})
    targets = sum(len(v) for v in lists.values())
    return {
        "process": "skh agent --role overlay (real CLI, real controller)",
        "endpoints": endpoints,
        "peers_per_endpoint": peers,
        "targets": targets,
        "paths": paths,
        "planned_probes_per_s": round(rate, 1),
        "inbound_probes_per_s": round(rate if inbound_rate is None else inbound_rate, 1)
        if inbound
        else 0.0,
        "inbound_phases": phases if inbound else "",
        "agent_set": list(agent_set),
        "probes_per_s": round((n1["sent"] - n0["sent"]) / wall, 1),
        # what the engines handled per second, all endpoints together: answers to our probes,
        # peers' probes answered, send stamps, and the engine threads' wake-ups
        "engine_per_s": {k: round((n1[k] - n0[k]) / wall, 1) for k in n0 if k != "sent"},
        "cpu_pct_one_core": round(100.0 * (c1 - c0) / wall, 2),
        # the same kernel socket work done bare, for scale: one C engine in a process of its
        # own answering the agent's probes (one socket, batches as large as they come), and
        # twice that, the agent's datagrams (its probes and its answers) at that engine's
        # cost: a lower bound on this machine, whatever the agent's design (sockperf's client
        # and server each take ~21-22 us of CPU per UDP round trip on the 2-vCPU test VM)
        "responder_cpu_pct": round(100.0 * (r1 - r0) / wall, 2),
        "bare_floor_cpu_pct": round(200.0 * (r1 - r0) / wall, 2),
        # everything the machine did meanwhile (agent, responder, peers, controller, softirqs
        # wherever they ran): on loopback a sender does its receiver's kernel work, so a change
        # that moves work between the agent and its peers shows here as no change
        "machine_cpu_pct": round(100.0 * (m1 - m0) / wall, 2),
        # of which this process (the peers' engine that probes the agent, the emulated peers'
        # sessions) and the controller
        "peers_cpu_pct": round(100.0 * (b1 - b0) / wall, 2),
        "controller_cpu_pct": round(100.0 * (k1 - k0) / wall, 2),
        # by thread: the engines' C threads, ZeroMQ's I/O threads, the Python main thread
        "cpu_pct_by_thread": {
            k: round(100.0 * (v - threads0.get(k, 0.0)) / wall, 2)
            for k, v in sorted(threads1.items())
        },
        "rss_mb": rss_mb,
        # where the VmRSS is: by mapping in the running agent, and what a process that only
        # imports the agent's modules already holds (``after_imports``: the rest is running)
        "rss_by_mapping_mb": mapped,
        "rss_imports_mb": imports,
        "rss_running_mb": round(rss_mb - imports["total"], 1),
        "rss_anon_mb": round(mem["RssAnon"] / 1024, 1),
        "uss_mb": round((mem["Private_Clean"] + mem["Private_Dirty"]) / 1024, 1),
        "pss_mb": round(mem["Pss"] / 1024, 1),
        "batches_received": received[0],
        "duration_s": round(wall, 1),
        "agent_log_tail": logs if targets == 0 else "",
    }


def _at_revision(rev: str, args: list[str]) -> dict[str, Any]:
    """This bench, run on git revision ``rev``'s agent and engine (this file replaces that
    revision's copy, so both sides are measured and reported the same way)."""
    # imported here: skh/eval/agent_cost.py loads this file by path, without bench/ on sys.path
    from _revision import revision_tree

    with revision_tree(rev) as tree:
        shutil.copy(Path(__file__), tree / "bench" / "agent_process.py")
        out = subprocess.run(
            [sys.executable, str(tree / "bench" / "agent_process.py"), *args],
            cwd=tree,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    if out.returncode:
        raise SystemExit(f"{rev}: the bench failed\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=400.0, help="probes/s of the whole agent")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--paths", type=int, default=1)
    ap.add_argument("--endpoints", type=int, default=8)
    ap.add_argument(
        "--no-inbound", action="store_true", help="nobody probes the agent (it only probes)"
    )
    ap.add_argument(
        "--inbound-rate",
        type=float,
        help="probes/s the agent answers in all (default: --rate; a revision given by "
        "--against must know the option)",
    )
    ap.add_argument(
        "--inbound",
        choices=INBOUND_PHASES,
        help="the peers' probes arrive one by one (spread), in one burst per interval (burst), "
        "or in one burst on the wall clock's grid (wall); default: as peers with the agent's "
        "settings send them (wall with --agent-set engine_wall_grid=true, else spread)",
    )
    ap.add_argument(
        "--agent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an [agent] setting of this tree's agent (not --against's), e.g. engine_tick_s=0.002",
    )
    ap.add_argument("--against", metavar="REV", help="also measure git revision REV, first")
    a = ap.parse_args()
    before = None
    if a.against:
        args = ["--rate", str(a.rate), "--duration", str(a.duration), "--paths", str(a.paths)]
        args += ["--endpoints", str(a.endpoints)] + (["--no-inbound"] if a.no_inbound else [])
        args += ["--inbound", a.inbound] if a.inbound else []
        args += ["--inbound-rate", str(a.inbound_rate)] if a.inbound_rate is not None else []
        before = _at_revision(a.against, args) | {"revision": a.against}
    r = measure(
        a.rate,
        a.duration,
        paths=a.paths,
        endpoints=a.endpoints,
        inbound=not a.no_inbound,
        inbound_rate=a.inbound_rate,
        phases=a.inbound,
        agent_set=tuple(a.agent_set),
    )
    if before is not None:
        keys = ("rss_mb", "rss_anon_mb", "uss_mb", "cpu_pct_one_core", "probes_per_s")
        r = {k: {"before": before[k], "after": r[k]} for k in keys} | {
            "before": before,
            "after": r,
        }
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
