"""Chaos: the real controller, analyzer (with its pipeline) and agents of 4,096 endpoints on
loopback, under kill -9 while alerts are open, a rogue tenant, forged results and a flood of
malformed frames. Judged by state, never by reply codes.

Cluster: 64 hosts x 8 RNICs; 64 jobs of 8 containers (8 rails each) on 8 hosts; 512 sidecars
(real :class:`OverlayAgent` code, their probing engine synthetic: one probe per target and
second, OK unless a fault file says the endpoint is down) in ``--fleets`` processes; 64
underlay agents (real :class:`UnderlayAgent`, traceroute stubbed: no packet leaves the host) in
one process. Every sidecar makes its key and enrols it through its host's underlay agent from a
child process running as the container's uid (the agent attests the uid; needs root, else the
sidecars' keys are provisioned and ``enrolment`` says so).

Phases:

1. **Rogue tenant** — a sidecar's key (``tenant``: job00/c000 on host0) tries every forbidden
   operation; each counts as accepted if what it asked for changed (registry, bindings,
   delivered commands, heard announcements, read details, spooled records). The legitimate
   operation of the same kind, by the identity allowed to do it, must succeed.
2. **Kill -9** of the analyzer, the controller, the underlay agents' process and a sidecars'
   process, each while a fault's alert is open (``--rounds`` times each); the analyzer's fault
   clears while it is down. Recovery = restart to the daemon serving again (analyzer: answering
   and ingesting; controller and agents: every agent re-registered). Afterwards every alert the
   log ever held must still be there in sequence (``lost_alerts``) and every fault's alert must
   resolve (``unresolved_after_restart``).
3. **Flood** — the tenant's key sends malformed frames (random, truncated, flipped, mistyped,
   lying headers), blow-up frames (15 MiB of empty maps) and oversized frames (over the 16 MiB
   cap) to the controller's ROUTER and the analyzer's PULL and REP, while the cluster runs; the
   daemons' RSS is sampled every 50 ms.

    python bench/chaos.py --quick        # one kill of each daemon, 100,000 frames (~2 min)
    python bench/chaos.py                # three kills of each, 300,000 frames

Prints one JSON object. Sub-commands ``fleet-overlay`` / ``fleet-underlay`` are its own agent
processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.errors import RequestRefused, RequestTimeout, SkhError  # noqa: E402
from skh.orchestrator.admin import ControllerClient  # noqa: E402
from skh.orchestrator.keyring import make_keyring, security_args  # noqa: E402
from skh.orchestrator.security import ensure_keypair  # noqa: E402
from skh.records import PROBE_DTYPE, ProbeStatus, empty_probes  # noqa: E402
from skh.wire import (  # noqa: E402
    ALERTS_TOPIC,
    Codec,
    MsgType,
    job_topic,
    pack_pairs,
    probe_batch_body,
)

HOSTS, RAILS, JOBS, PER_JOB = 64, 8, 64, 8
TENANT, VICTIM, NEIGHBOUR = 0, 9, 64  # container indexes (NEIGHBOUR shares the tenant's host)
SCRATCH_UID = 29_999
FORGED_SEQ, OWN_SEQ = 0xF0F0F0F0, 0xA0A0A0A0  # markers in the spooled records


# ---------------------------------------------------------------------------------------------
# the cluster's layout


def containers() -> list[dict[str, Any]]:
    out = []
    for i in range(JOBS * PER_JOB):
        job, k = divmod(i, PER_JOB)
        host = (job % (HOSTS // PER_JOB)) * PER_JOB + k
        out.append(
            {
                "i": i,
                "job": f"job{job:02d}",
                "container": f"c{i:03d}",
                "host": f"host{host}",
                "uid": 20_000 + i,
                "name": f"overlay-host{host}-c{i:03d}",
            }
        )
    return out


def pipeline_settings() -> dict[str, Any]:
    from skh.model import Fabric

    fab = Fabric.from_params(hosts=HOSTS, rnics_per_host=RAILS, hosts_per_segment=16).to_mapping()
    for h in fab["host"]:
        for r in h["rnics"]:
            r["netdev"] = f"chaos{r['rail']}"  # host reports read nothing of this machine
    return {
        "fabric": fab,
        "host_agents": {f"host{h}": f"ul-host{h}" for h in range(HOSTS)},
        "resolve_after_s": 8.0,
        "command_timeout_s": 2.0,
        "skeleton_every_s": 3600.0,
        # a sidecar process hosts 128 agents on a shared 2-core machine: allow it a few
        # seconds' stall before its agents count as dead (the daemon default is 3.5 s)
        "detector": {"health": {"heartbeat_overdue_s": 5.0, "heartbeat_timeout_s": 10.0}},
    }


# ---------------------------------------------------------------------------------------------
# agent fleets (child processes)


class SynthEngine:
    """The engine's interface over no network: one record per target and second, OK with a
    ~20 us RTT unless the source or the destination is in the fault set."""

    def __init__(self, faults: set[int], rng: np.random.Generator) -> None:
        self.faults, self.rng = faults, rng
        self.targets: list[int] = []
        self.ep = -1
        self.last_ns = time.time_ns()

    def local_address(self) -> dict[str, Any]:
        return {"ip": "127.0.0.1", "port": 7471, "gid": "", "qpn": 0}

    def add_target(self, dst_ep: int, host: str, port: int, **_kw: Any) -> None:
        self.targets.append(dst_ep)

    def remove_target(self, dst_ep: int) -> None:
        self.targets.remove(dst_ep)

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def drain_packed(self, max_records: int | None = None) -> bytearray:
        now = time.time_ns()
        k = int((now - self.last_ns) // 1_000_000_000)
        if k <= 0 or not self.targets:
            return bytearray()
        t0 = self.last_ns
        self.last_ns += k * 1_000_000_000
        dst = np.repeat(np.asarray(self.targets, np.uint32), k)
        recs = np.zeros(dst.size, PROBE_DTYPE)
        recs["dst_ep"] = dst
        recs["seq"] = np.tile(np.arange(k, dtype=np.uint32), len(self.targets))
        recs["t_wall_ns"] = t0 + recs["seq"].astype(np.int64) * 1_000_000_000
        down = np.isin(dst, list(self.faults)) | (self.ep in self.faults)
        recs["status"] = np.where(down, int(ProbeStatus.REPLY_LOST), int(ProbeStatus.OK))
        rtt = 20_000 + self.rng.normal(0, 1_000, dst.size).astype(np.int64)
        recs["rtt_ns"] = np.where(down, -1, rtt)
        recs["responder_delay_ns"] = np.where(down, -1, 2_000)
        recs["prober_delay_ns"] = np.where(down, -1, 3_000)
        return bytearray(recs.tobytes())


def _faults(path: Path, cur: set[int], mtime: list[float]) -> None:
    try:
        m = path.stat().st_mtime
        if m != mtime[0]:
            mtime[0] = m
            cur.clear()
            cur.update(json.loads(path.read_text())["eps"])
    except (OSError, ValueError, KeyError):
        pass


def fleet_overlay(spec: dict[str, Any], part: int) -> int:
    from skh.orchestrator.agent_overlay import OverlayAgent
    from skh.orchestrator.config import AgentConfig, EndpointSpec
    from skh.orchestrator.keyring import Keyring

    ring = Keyring(Path(spec["keys"]))
    while not Path(spec["go"]).exists():  # imported; the keys are bound once this appears
        time.sleep(0.1)
    ctx = zmq.Context()
    faults: set[int] = set()
    mtime = [0.0]
    rng = np.random.default_rng(part)
    agents = []
    for c in spec["containers"]:
        if c["i"] % spec["fleets"] != part:
            continue
        cfg = AgentConfig(
            role="overlay",
            name=c["name"],
            host=c["host"],
            job=c["job"],
            container=c["container"],
            controller=spec["router"],
            controller_pub=spec["pub"],
            analyzer=spec["pull"],
            endpoints=tuple(EndpointSpec(rail=r, ip="127.0.0.1") for r in range(RAILS)),
            probe_interval_s=1.0,
            batch_interval_s=2.0,
            request_timeout_s=2.0,
        )
        sec = ring.sidecar(c["job"], c["container"]) if spec["rooted"] else ring.client(c["name"])
        agents.append(
            OverlayAgent(cfg, sec, ctx=ctx, engine_factory=lambda *_a: SynthEngine(faults, rng))
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    poller = zmq.Poller()
    for a in agents:
        poller.register(a.dealer, zmq.POLLIN)
        poller.register(a.sub, zmq.POLLIN)
    print(json.dumps({"fleet": part, "agents": len(agents)}), flush=True)
    next_check = 0.0
    while not stop.is_set():
        events = dict(poller.poll(50))
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            _faults(Path(spec["faults"]), faults, mtime)
        for a in agents:
            a.tick(events, now)
            for (_s, eng), ep in zip(a.engines, a.ep_ids, strict=False):
                eng.ep = ep
    for a in agents:
        a.close()
    ctx.term()
    return 0


def fleet_underlay(spec: dict[str, Any]) -> int:
    from skh.orchestrator.agent_underlay import UnderlayAgent
    from skh.orchestrator.config import AgentConfig, ContainerSpec
    from skh.orchestrator.keyring import Keyring

    ring = Keyring(Path(spec["keys"]))
    ctx = zmq.Context()
    agents = []
    for h in range(HOSTS):
        host = f"host{h}"
        specs = [
            ContainerSpec(c["job"], c["container"], uid=c["uid"])
            for c in spec["containers"]
            if c["host"] == host
        ]
        if h == 0:  # a container outside the jobs, for the legitimate enrolment
            specs.append(ContainerSpec("scratch", "s0", uid=SCRATCH_UID))
        cfg = AgentConfig(
            role="underlay",
            name=f"ul-{host}",
            host=host,
            controller=spec["router"],
            analyzer=spec["pull"],
            enrol_socket=str(Path(spec["enrol_dir"]) / f"{host}.sock"),
            containers=tuple(specs),
            request_timeout_s=2.0,
        )
        agent = UnderlayAgent(cfg, ring.underlay(host), ctx=ctx)
        # no traceroute leaves this machine: the bench's fabric is not wired
        agent.handlers["traceroute"] = lambda _args: {"raw": ""}
        agents.append(agent)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    poller = zmq.Poller()
    for a in agents:
        poller.register(a.dealer, zmq.POLLIN)
    print(json.dumps({"fleet": "underlay", "agents": len(agents)}), flush=True)
    while not stop.is_set():
        events = dict(poller.poll(50))
        now = time.monotonic()
        for a in agents:
            a.tick(a.dealer in events, now)
    for a in agents:
        a.close()
    ctx.term()
    return 0


# ---------------------------------------------------------------------------------------------
# the orchestrating process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.p: subprocess.Popen | None = None
        self.expected_down = False
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("NOTIFY_SOCKET", None)
        with open(self.log, "ab") as err:
            self.p = subprocess.Popen(
                self.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err
            )
        self.starts += 1
        self.expected_down = False

    def first_line(self, timeout_s: float = 60.0) -> dict[str, Any]:
        assert self.p is not None and self.p.stdout is not None
        t = threading.Timer(timeout_s, self.p.kill)
        t.start()
        try:
            line = self.p.stdout.readline()
        finally:
            t.cancel()
        if not line:
            raise RuntimeError(f"{self.name} died: {self.log.read_text()[-3000:]}")
        return json.loads(line)

    def kill9(self) -> None:
        assert self.p is not None
        self.expected_down = True
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def stop(self) -> int | None:
        if self.p is None or self.p.poll() is not None:
            return self.p.returncode if self.p else None
        self.expected_down = True
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()

    @property
    def pid(self) -> int:
        assert self.p is not None
        return self.p.pid


class Watch(threading.Thread):
    """Counts daemons that exit without being asked to (crashes), and samples RSS."""

    def __init__(self, procs: list[Proc]) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.crashes: list[dict[str, Any]] = []
        self.sampling: dict[str, float] | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        seen: set[tuple[str, int]] = set()
        while not self._halt.wait(0.05):
            for p in self.procs:
                if p.p is None:
                    continue
                rc = p.p.poll()
                if rc is not None and not p.expected_down and (p.name, p.starts) not in seen:
                    seen.add((p.name, p.starts))
                    self.crashes.append(
                        {"daemon": p.name, "rc": rc, "log": p.log.read_text()[-1500:]}
                    )
                if (
                    self.sampling is not None
                    and rc is None
                    and p.name in ("controller", "analyzer")
                ):
                    with contextlib.suppress(psutil.Error):
                        mb = psutil.Process(p.pid).memory_info().rss / 2**20
                        self.sampling[p.name] = max(self.sampling.get(p.name, 0.0), mb)

    def stop(self) -> None:
        self._halt.set()


class Bus:
    """The alert log as a subscriber reads it (REPLAY pages; a fresh REQ after a timeout)."""

    def __init__(self, ctx: zmq.Context, addr: str, sec: Any) -> None:
        self.ctx, self.addr, self.sec = ctx, addr, sec
        self.codec = Codec()
        self.seen: dict[int, dict[str, Any]] = {}
        self.sock: zmq.Socket | None = None
        self.n = 0

    def _req(self, body: dict[str, Any], timeout_s: float = 10.0) -> Any:
        if self.sock is None:
            self.sock = self.ctx.socket(zmq.REQ)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sec.client(self.sock)
            self.sock.connect(self.addr)
        self.n += 1
        self.sock.send(self.codec.encode(MsgType.REPLAY, "chaos", self.n, body))
        if not self.sock.poll(int(timeout_s * 1000)):
            self.sock.close(0)
            self.sock = None
            raise RequestTimeout("no replay answer")
        return self.codec.decode(self.sock.recv())

    def replay(self, since: int = 0) -> list[dict[str, Any]]:
        out = []
        while True:
            env = self._req({"since": since})
            if env.type is not MsgType.REPLAY_REPLY:
                raise RequestRefused(str(env.body))
            recs = env.body["alerts"]
            out += recs
            if not recs or recs[-1]["seq"] >= env.body["last_seq"]:
                return out
            since = recs[-1]["seq"]

    def poll(self) -> None:
        last = max(self.seen, default=0)
        with contextlib.suppress(RequestTimeout, RequestRefused):
            for r in self.replay(last):
                self.seen[r["seq"]] = r

    def open_faults(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for seq in sorted(self.seen):
            a = self.seen[seq]["alert"]
            if a.get("kind") != "fault":
                continue
            if a.get("state") == "open":
                out[a["alert_id"]] = a
            elif a.get("state") == "resolved":
                out.pop(a["alert_id"], None)
        return out

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)


def _wait(pred: Any, timeout_s: float, interval_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(SkhError, zmq.ZMQError, KeyError):
            v = pred()
            if v:
                return v
        time.sleep(interval_s)
    return None


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Path(args.run_dir or tempfile.mkdtemp(prefix="skh-chaos-"))
        self.run.mkdir(parents=True, exist_ok=True)
        # sidecars (other uids) must reach their host's socket: a directory every user can
        # search, whatever the run directory's parents allow
        self.enrol_dir = Path(tempfile.mkdtemp(prefix="skh-chaos-enrol-"))
        self.enrol_dir.chmod(0o755)
        self.cs = containers()
        self.by_i = {c["i"]: c for c in self.cs}
        self.rooted = os.geteuid() == 0
        provisioned = (
            []
            if self.rooted
            else [(c["name"], c["job"], c["container"], c["host"]) for c in self.cs]
        )
        self.ring = make_keyring(
            self.run / "keys", hosts=[f"host{h}" for h in range(HOSTS)], sidecars=provisioned
        )
        self.ctx = zmq.Context()
        self.addr = {
            "router": f"tcp://127.0.0.1:{_free_port()}",
            "pub": f"tcp://127.0.0.1:{_free_port()}",
            "pull": f"tcp://127.0.0.1:{_free_port()}",
            "alerts": f"tcp://127.0.0.1:{_free_port()}",
            "replay": f"tcp://127.0.0.1:{_free_port()}",
        }
        self.faults_path = self.run / "faults.json"
        self.go = self.run / "go"
        self.go.unlink(missing_ok=True)
        self._set_faults([])
        self.procs: dict[str, Proc] = {}
        self.out: dict[str, Any] = {
            "profile": "quick" if args.quick else "full",
            "regime": "loopback, 64 hosts x 8 RNICs, 64 jobs x 8 containers x 8 rails, "
            "synthetic probe engines at 1 probe/s per target, real daemons and agent code",
        }
        self.rogue: dict[str, dict[str, Any]] = {}
        self.legit: dict[str, bool] = {}

    # -- processes ------------------------------------------------------------------------------
    def _py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    def _spec(self) -> Path:
        path = self.run / "spec.json"
        path.write_text(
            json.dumps(
                {
                    **self.addr,
                    "keys": str(self.ring.root),
                    "containers": self.cs,
                    "fleets": self.args.fleets,
                    "faults": str(self.faults_path),
                    "enrol_dir": str(self.enrol_dir),
                    "rooted": self.rooted,
                    "go": str(self.go),
                }
            )
        )
        return path

    def start(self) -> None:
        t0 = time.monotonic()
        sa = security_args
        self.procs["controller"] = Proc(
            "controller",
            self._py(
                "-m",
                "skh",
                "controller",
                *sa(self.ring.controller()),
                "--bind",
                self.addr["router"],
                "--pub-bind",
                self.addr["pub"],
                "--db",
                str(self.run / "registry.db"),
                # 2 s heartbeats; an agent process stalled 10 s on a busy machine is not lost
                "--set",
                "controller.heartbeat_misses=5",
                "--print-endpoints",
            ),
            self.run / "controller.log",
        )
        (self.run / "pipeline.json").write_text(json.dumps(pipeline_settings()))
        self.procs["analyzer"] = Proc(
            "analyzer",
            self._py(
                "-m",
                "skh",
                "analyzer",
                *sa(self.ring.analyzer()),
                "--pipeline",
                str(self.run / "pipeline.json"),
                "--controller",
                self.addr["router"],
                "--bind",
                self.addr["pull"],
                "--alerts-bind",
                self.addr["alerts"],
                "--replay-bind",
                self.addr["replay"],
                "--alert-log",
                str(self.run / "alerts.log"),
                "--spool-dir",
                str(self.run / "spool"),
                "--print-endpoints",
            ),
            self.run / "analyzer.log",
        )
        spec = self._spec()
        self.procs["underlay"] = Proc(
            "underlay",
            self._py(__file__, "fleet-underlay", "--spec", str(spec)),
            self.run / "underlay.log",
        )
        for k in range(self.args.fleets):
            self.procs[f"overlay{k}"] = Proc(
                f"overlay{k}",
                self._py(__file__, "fleet-overlay", "--spec", str(spec), "--part", str(k)),
                self.run / f"overlay{k}.log",
            )
        self.watch = Watch(list(self.procs.values()))
        self.watch.start()
        self.t0 = t0
        mark = self._mark
        # everything that only imports starts at once; the sidecar processes wait for the go
        # file (their keys are bound) before they build their agents
        for name in ("controller", "analyzer", "underlay"):
            self.procs[name].start()
        for k in range(self.args.fleets):
            self.procs[f"overlay{k}"].start()
        self.procs["controller"].first_line()
        mark("controller_up")
        self.admin = ControllerClient(
            self.addr["router"], self.ring.admin(), ctx=self.ctx, timeout_s=5.0, retries=2
        )
        for j in range(JOBS):
            job = f"job{j:02d}"
            self.admin.submit_job(
                job,
                [
                    {"name": c["container"], "host": c["host"], "rails": list(range(RAILS))}
                    for c in self.cs
                    if c["job"] == job
                ],
            )
        mark("jobs_submitted")
        self.procs["underlay"].first_line(120)
        mark("underlay_up")
        self.out["enrolment"] = self._enrol_all() if self.rooted else "provisioned (not root)"
        mark("enrolled")
        self.go.write_text("go")
        for k in range(self.args.fleets):
            self.procs[f"overlay{k}"].first_line(180)
        mark("sidecars_built")
        self.procs["analyzer"].first_line()
        self.bus = Bus(self.ctx, self.addr["replay"], self.ring.subscriber())
        ok = _wait(self._all_ready, 180, 1.0)
        if not ok:
            raise RuntimeError(f"the cluster did not come up: {self._status_summary()}")
        mark("all_ready")
        self.out["startup_s"] = round(time.monotonic() - t0, 1)
        self.out["endpoints"] = len(self.cs) * RAILS

    def _mark(self, name: str) -> None:
        """Seconds since the start at the end of a phase (``phases_s``)."""
        self.out.setdefault("phases_s", {})[name] = round(time.monotonic() - self.t0, 1)

    def _status_summary(self) -> dict[str, Any]:
        with contextlib.suppress(SkhError):
            st = self.admin.status()
            return {
                "agents_alive": sum(a["alive"] for a in st["agents"].values()),
                "ready": sum(j["ready"] for j in st["jobs"].values()),
            }
        return {}

    def _all_ready(self) -> bool:
        st = self.admin.status()
        ready = sum(j["ready"] for j in st["jobs"].values())
        alive = sum(a["alive"] for a in st["agents"].values())
        return ready >= len(self.cs) * RAILS and alive >= len(self.cs) + HOSTS

    def _enrol_one(self, c: dict[str, Any], key: str, uid: int) -> int:
        """Fork a child running as ``uid`` (the container's) that enrols ``key`` for ``c``
        through its host's underlay agent; returns its pid (exit 0: bound)."""
        from skh.orchestrator.enrol import enrol

        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                ans = enrol(
                    str(self.enrol_dir / f"{c['host']}.sock"),
                    job=c["job"],
                    container=c["container"],
                    name=c["name"],
                    key=key,
                )
                code = 0 if ans.get("ok") else 3
            finally:
                os._exit(code)
        return pid

    def _enrol_all(self) -> str:
        pending = []
        for c in self.cs:
            sec = self.ring.sidecar(c["job"], c["container"])
            key = ensure_keypair(sec.client_secret_key)
            pending.append((c, key))
        failed = 0
        for wave in range(0, len(pending), HOSTS):
            pids = [self._enrol_one(c, key, c["uid"]) for c, key in pending[wave : wave + HOSTS]]
            for pid in pids:
                _, status = os.waitpid(pid, 0)
                failed += os.waitstatus_to_exitcode(status) != 0
        if failed:
            raise RuntimeError(f"{failed} sidecars could not enrol")
        return "uid attestation through each host's underlay agent"

    def _set_faults(self, eps: list[int]) -> None:
        tmp = self.faults_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"eps": eps}))
        os.replace(tmp, self.faults_path)

    # -- the rogue tenant ------------------------------------------------------------------------
    def _tenant(self) -> dict[str, Any]:
        return self.by_i[TENANT]

    def _tenant_sec(self, analyzer: bool = False) -> Any:
        import dataclasses

        c = self._tenant()
        sec = self.ring.sidecar(c["job"], c["container"])
        if not self.rooted:
            sec = self.ring.client(c["name"])
        if analyzer:
            sec = dataclasses.replace(sec, server_public_key=str(self.ring.root / "analyzer.key"))
        return sec

    def _dealer(self, sec: Any, routing_id: bytes | None = None) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if routing_id:
            s.setsockopt(zmq.ROUTING_ID, routing_id)
        sec.client(s)
        s.connect(self.addr["router"])
        return s

    def _ask(self, s: zmq.Socket, mtype: MsgType, body: dict[str, Any], wait_s: float = 5.0) -> Any:
        """Send one request and read its answer (every request the controller refuses is
        answered); late answers to earlier requests are read and kept too."""
        codec = Codec()
        s.send(codec.encode(mtype, "rogue", 1, body))
        got = []
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and s.poll(int(left * 1000)):
            got.append(codec.decode(s.recv()))
            if not s.poll(50):
                break
        return got

    def _members(self, job: str) -> list[dict[str, Any]]:
        return self.admin.members(job=job)[0]

    def _agent_stats(self, agent: str) -> dict[str, Any]:
        r = self.admin.relay(agent, "stats", timeout_s=3.0)
        return r.result if r.ok else {}

    def rogue_phase(self) -> None:
        t, v, nb = self._tenant(), self.by_i[VICTIM], self.by_i[NEIGHBOUR]
        sec = self._tenant_sec()
        rogue = self._dealer(sec)
        tried: dict[str, bool] = {}

        # 1. relay a command to another host's agent
        target = f"ul-{v['host']}"
        before = self._agent_stats(target).get("counters", {}).get("commands", 0)
        self._ask(
            rogue,
            MsgType.COMMAND,
            {"cmd_id": "r1", "agent": target, "name": "overlay_state", "args": {}},
        )
        after = self._agent_stats(target).get("counters", {}).get("commands", 0)
        tried["relay_command_to_another_host"] = after - before > 1  # +1: our own stats
        self.legit["relay_command_to_another_host"] = self.admin.relay(
            target, "overlay_state", timeout_s=5.0
        ).ok

        # 2-3. register endpoints into another job, or its own container on another host
        before = {
            (m["container"], m["rail"]): (m["ip"], m["host"]) for m in self._members(v["job"])
        }
        own_before = {(m["container"], m["rail"]): m["host"] for m in self._members(t["job"])}
        self._ask(
            rogue,
            MsgType.REGISTER,
            {
                "agent": t["name"],
                "role": "overlay",
                "host": t["host"],
                "endpoints": [
                    {"job": v["job"], "container": v["container"], "rail": 0, "ip": "6.6.6.6"},
                    {"job": v["job"], "container": "ghost", "rail": 0, "ip": "6.6.6.6"},
                ],
            },
        )
        self._ask(
            rogue,
            MsgType.REGISTER,
            {
                "agent": t["name"],
                "role": "overlay",
                "host": v["host"],
                "endpoints": [
                    {"job": t["job"], "container": t["container"], "rail": 0, "ip": "127.0.0.1"}
                ],
            },
        )
        after = {(m["container"], m["rail"]): (m["ip"], m["host"]) for m in self._members(v["job"])}
        own_after = {(m["container"], m["rail"]): m["host"] for m in self._members(t["job"])}
        tried["register_into_another_job"] = after != before
        tried["register_on_another_host"] = own_after != own_before
        got = self._ask(
            self._dealer(sec),
            MsgType.REGISTER,
            {
                "agent": t["name"],
                "role": "overlay",
                "host": t["host"],
                "endpoints": [
                    {
                        "job": t["job"],
                        "container": t["container"],
                        "rail": r,
                        "ip": "127.0.0.1",
                        "port": 7471,
                    }
                    for r in range(RAILS)
                ],
            },
        )
        self.legit["register_own_endpoints"] = any(e.type is MsgType.REGISTER_ACK for e in got)

        # 4. a skeleton for another job (empty: it would stop all probing)
        st = self.admin.status()
        sv = st["jobs"][v["job"]]["skeleton_version"]
        self._ask(
            rogue,
            MsgType.APPLY_SKELETON,
            {"job": v["job"], "skeleton_version": sv + 50, "pairs": b""},
        )
        tried["apply_skeleton"] = self.admin.status()["jobs"][v["job"]]["skeleton_version"] != sv

        # 5. submit and remove jobs
        self._ask(
            rogue,
            MsgType.SUBMIT_JOB,
            {"job": "rogue", "containers": [{"name": "x", "host": "host0", "rails": [0]}]},
        )
        self._ask(rogue, MsgType.REMOVE_JOB, {"job": v["job"]})
        st = self.admin.status()["jobs"]
        tried["submit_job"] = "rogue" in st
        tried["remove_job"] = v["job"] not in st
        self.admin.submit_job("scratch", [{"name": "s0", "host": "host0", "rails": [0]}])
        self.legit["submit_job"] = "scratch" in self.admin.status()["jobs"]

        # 6. read other tenants' details (registry, snapshots, key bindings)
        leaked = False
        for mtype, body in (
            (MsgType.STATUS, {"detail": True}),
            (MsgType.MEMBERS, {}),
            (MsgType.SYNC, {"job": v["job"]}),
            (MsgType.KEYS, {}),
        ):
            for env in self._ask(rogue, mtype, body):
                leaked |= env.type is MsgType.JOB_SNAPSHOT or bool(env.body.get("ok"))
        tried["read_other_tenants_details"] = leaked
        self.legit["read_details"] = len(self._members(v["job"])) == PER_JOB * RAILS

        # 7. take over the victim's routing id and speak as it
        thief = self._dealer(sec, routing_id=v["name"].encode())
        self._ask(thief, MsgType.HEARTBEAT, {"agent": v["name"], "epoch": "", "jobs": {}})
        r = self.admin.relay(v["name"], "pinglist", timeout_s=3.0)
        stolen = bool(thief.poll(500))
        tried["take_over_routing_id"] = stolen
        self.legit["victim_still_answers"] = r.ok and len(r.result["lists"]) == RAILS
        thief.close(0)

        # 8. deregister the victim
        self._ask(rogue, MsgType.DEREGISTER, {"agent": v["name"]})
        tried["deregister_another_agent"] = not self.admin.status()["agents"][v["name"]]["alive"]

        # 9. hear another job's topic (and everything)
        spy = self.ctx.socket(zmq.SUB)
        spy.setsockopt(zmq.LINGER, 0)
        sec.client(spy)
        spy.setsockopt(zmq.SUBSCRIBE, job_topic(v["job"]))
        spy.setsockopt(zmq.SUBSCRIBE, b"")
        spy.connect(self.addr["pub"])
        ops = self.ctx.socket(zmq.SUB)
        ops.setsockopt(zmq.LINGER, 0)
        self.ring.admin().client(ops)
        ops.setsockopt(zmq.SUBSCRIBE, job_topic(v["job"]))
        ops.connect(self.addr["pub"])
        time.sleep(1.0)
        # the operator applies a skeleton to the victim's job (every same-rail pair: nothing
        # stops being probed), which its topic announces
        members = self._members(v["job"])
        full = np.array(
            [
                [a["ep"], b["ep"]]
                for a in members
                for b in members
                if a["rail"] == b["rail"] and a["host"] != b["host"]
            ],
            np.uint32,
        )
        sv = self.admin.status()["jobs"][v["job"]]["skeleton_version"]
        self.admin.apply_skeleton(v["job"], full, sv + 1)
        self.legit["apply_skeleton"] = (
            self.admin.status()["jobs"][v["job"]]["skeleton_version"] == sv + 1
        )
        heard_spy = spy.poll(2000)
        self.legit["hear_own_topic"] = bool(ops.poll(2000))
        tried["subscribe_to_another_job"] = bool(heard_spy)
        spy.close(0)
        ops.close(0)

        # 10-11. enrol a key for another container: through the host's agent, and directly
        if self.rooted:
            k_other = ensure_keypair(self.run / "rogue" / "other.key_secret")
            pid = self._enrol_one({**nb, "name": nb["name"]}, k_other, t["uid"])
            os.waitpid(pid, 0)
            k_direct = ensure_keypair(self.run / "rogue" / "direct.key_secret")
            self._ask(
                rogue,
                MsgType.ENROL,
                {
                    "agent": t["name"],
                    "job": nb["job"],
                    "container": nb["container"],
                    "name": "x",
                    "key": k_direct,
                },
            )
            bound = {k["key"] for k in self.admin.keys()}
            tried["enrol_as_another_container"] = k_other in bound
            tried["enrol_directly"] = k_direct in bound
            k_scratch = ensure_keypair(self.run / "scratch" / "s0.key_secret")
            pid = self._enrol_one(
                {"job": "scratch", "container": "s0", "host": "host0", "name": "overlay-host0-s0"},
                k_scratch,
                SCRATCH_UID,
            )
            _, status = os.waitpid(pid, 0)
            self.legit["enrol_own_container"] = k_scratch in {k["key"] for k in self.admin.keys()}
        # 12. revoke someone else's key
        self._ask(rogue, MsgType.REVOKE, {"name": v["name"]})
        tried["revoke_another_key"] = v["name"] not in {k["name"] for k in self.admin.keys()}
        if self.rooted:
            self.admin.revoke(name="overlay-host0-s0")
            self.legit["revoke"] = "overlay-host0-s0" not in {k["name"] for k in self.admin.keys()}
        self.admin.remove_job("scratch")
        self.legit["remove_job"] = "scratch" not in self.admin.status()["jobs"]

        # 13. read the alert log, 14. follow the alerts (judged after the kills)
        req = self.ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        self._tenant_sec(analyzer=True).client(req)
        req.connect(self.addr["replay"])
        codec = Codec()
        req.send(codec.encode(MsgType.REPLAY, "rogue", 1, {"since": 0}))
        read = req.poll(3000) and codec.decode(req.recv()).type is MsgType.REPLAY_REPLY
        tried["replay_the_alert_log"] = bool(read)
        req.close(0)
        self.legit["replay"] = isinstance(self.bus.replay(0), list)
        self.alert_spy = self.ctx.socket(zmq.SUB)
        self.alert_spy.setsockopt(zmq.LINGER, 0)
        self._tenant_sec(analyzer=True).client(self.alert_spy)
        self.alert_spy.setsockopt(zmq.SUBSCRIBE, ALERTS_TOPIC)
        self.alert_spy.connect(self.addr["alerts"])
        self.alert_follower = self.ctx.socket(zmq.SUB)
        self.alert_follower.setsockopt(zmq.LINGER, 0)
        self.ring.subscriber().client(self.alert_follower)
        self.alert_follower.setsockopt(zmq.SUBSCRIBE, ALERTS_TOPIC)
        self.alert_follower.connect(self.addr["alerts"])

        # 15. forged results and heartbeats for another tenant's endpoints
        self.out["forged_records_sent"] = self._forge(v, t)
        rogue.close(0)
        self.rogue = {k: {"accepted": bool(a)} for k, a in tried.items()}

    def _forge(self, v: dict[str, Any], t: dict[str, Any]) -> int:
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        self._tenant_sec(analyzer=True).client(push)
        push.connect(self.addr["pull"])
        codec = Codec()
        veps = sorted(m["ep"] for m in self._members(v["job"]))
        teps = sorted(m["ep"] for m in self._members(t["job"]) if m["container"] == t["container"])
        sent = 0

        def batch(src: list[int], dst: list[int], seq: int, eps: list[int], n: int = 5000) -> bytes:
            r = np.zeros(n, PROBE_DTYPE)
            r["src_ep"] = np.resize(np.asarray(src, np.uint32), n)
            r["dst_ep"] = np.resize(np.asarray(dst, np.uint32), n)
            r["seq"] = seq
            r["status"] = int(ProbeStatus.REPLY_LOST)
            r["t_wall_ns"] = time.time_ns()
            r["rtt_ns"] = -1
            return codec.encode(
                MsgType.PROBE_BATCH, t["name"], 1, probe_batch_body(t["name"], r, eps)
            )

        time.sleep(0.5)
        for _ in range(20):
            push.send(batch(veps, veps[::-1], FORGED_SEQ, veps))  # as the victim
            push.send(batch(teps, veps, FORGED_SEQ, teps))  # to another job
            sent += 10_000
        push.send(batch(teps[:1], [teps[1]], OWN_SEQ, teps, n=1))  # its own, legitimate
        push.close()
        return sent

    def _spooled(self, seq: int) -> int:
        n = 0
        for f in sorted((self.run / "spool").glob("probes-*.npy")):
            with contextlib.suppress(OSError, ValueError):
                n += int((np.load(f)["seq"] == seq).sum())
        return n

    # -- kills ----------------------------------------------------------------------------------
    def _fault_alert(self, ep: int) -> dict[str, Any] | None:
        self.bus.poll()
        for a in self.bus.open_faults().values():
            if any(ep in p for p in a.get("pairs", ())):
                return a
        return None

    def _resolved(self, alert_id: str) -> bool:
        self.bus.poll()
        return alert_id not in self.bus.open_faults()

    def kill_round(self, target: str, n: int) -> dict[str, Any]:
        pick = self.cs[(37 * (n + 1) + 11) % len(self.cs)]
        ep = next(
            m["ep"]
            for m in self._members(pick["job"])
            if m["container"] == pick["container"] and m["rail"] == n % RAILS
        )
        self.bus.poll()
        before = set(self.bus.open_faults())
        self._set_faults([ep])
        # the fault's alert: one naming the endpoint, else any alert it opened (a verdict may
        # blame a neighbour, or join the pairs to an alert already open)
        alert = _wait(lambda: self._fault_alert(ep), 60, 0.5) or _wait(
            lambda: next((a for i, a in self.bus.open_faults().items() if i not in before), None),
            30,
            0.5,
        )
        rec: dict[str, Any] = {"daemon": target, "fault_ep": ep, "alert": bool(alert)}
        self.bus.poll()
        rec["open_ids"] = sorted(self.bus.open_faults())
        rec["alerts_open"] = len(rec["open_ids"])
        p = self.procs[target]
        p.kill9()
        t_kill = time.monotonic()
        if target == "analyzer":  # the fault clears while the analyzer is down
            time.sleep(1.0)
            self._set_faults([])
            time.sleep(2.0)
        else:
            time.sleep(1.0)
        t_start = time.monotonic()
        p.start()
        if target in ("controller", "analyzer"):
            p.first_line()
        else:
            p.first_line(120)
        if target == "analyzer":
            before = self._analyzer_records()
            ok = _wait(lambda: self._analyzer_records() > before, 60, 0.25)
        elif target == "controller":
            ok = _wait(self._reconnected, 120, 0.5)
        elif target == "underlay":
            names = [f"ul-host{h}" for h in range(HOSTS)]
            ok = _wait(lambda: self._reregistered(t_start, names), 120, 0.5)
        else:
            k = int(target.removeprefix("overlay"))
            names = [c["name"] for c in self.cs if c["i"] % self.args.fleets == k]
            ok = _wait(lambda: self._reregistered(t_start, names), 120, 0.5)
        rec["recovered"] = bool(ok)
        rec["recovery_s"] = round(time.monotonic() - t_start, 2)
        rec["down_s"] = round(t_start - t_kill, 2)
        self._set_faults([])
        rec["alert_id"] = alert["alert_id"] if alert else None
        return rec

    def _reregistered(self, t_start: float, names: list[str] | None = None) -> bool:
        """Every agent (of ``names``) has spoken to the controller since ``t_start``."""
        st = self.admin.status()
        now = time.monotonic()
        agents = st["agents"]
        names = names or list(agents)
        return all(
            n in agents and agents[n]["alive"] and agents[n]["last_seen_s"] < now - t_start
            for n in names
        )

    def _reconnected(self) -> bool:
        """Every agent has spoken to the restarted controller."""
        agents = self.admin.status()["agents"]
        return len(agents) >= len(self.cs) + HOSTS and all(
            a["alive"] and a["connected"] for a in agents.values()
        )

    def _analyzer_status(self) -> dict[str, Any]:
        req = self.ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        self.ring.subscriber().client(req)
        req.connect(self.addr["replay"])
        codec = Codec()
        try:
            req.send(codec.encode(MsgType.STATUS, "chaos", 1, {}))
            if not req.poll(2000):
                return {}
            return dict(codec.decode(req.recv()).body.get("data") or {})
        finally:
            req.close(0)

    def _analyzer_records(self) -> int:
        return int(self._analyzer_status().get("counters", {}).get("probe_records", -1))

    # -- flood ----------------------------------------------------------------------------------
    def _pool(self, rng: np.random.Generator, size: int = 2000) -> list[tuple[bytes, bool]]:
        """Frames and whether each is malformed (else well-formed and refused)."""
        c = Codec()
        valid = [
            c.encode(
                MsgType.REGISTER,
                "x",
                1,
                {
                    "agent": "x",
                    "role": "overlay",
                    "host": "h",
                    "endpoints": [{"job": "j", "container": "c", "rail": 0}],
                },
            ),
            c.encode(MsgType.HEARTBEAT, "x", 1, {"agent": "x", "epoch": "e", "jobs": {}}),
            c.encode(MsgType.STATUS, "x", 1, {}),
            c.encode(MsgType.PROBE_BATCH, "x", 1, probe_batch_body("x", empty_probes(8))),
            c.encode(MsgType.REPLAY, "x", 1, {"since": 0}),
            c.encode(
                MsgType.APPLY_SKELETON,
                "x",
                1,
                {"job": "j", "skeleton_version": 1, "pairs": pack_pairs(np.zeros((4, 2)))},
            ),
        ]
        pool = []
        for i in range(size):
            base = valid[int(rng.integers(len(valid)))]
            kind = i % 6
            if kind == 0:
                frame = rng.integers(0, 256, int(rng.integers(1, 300)), np.uint8).tobytes()
            elif kind == 1:
                frame = base[: int(rng.integers(0, len(base)))]
            elif kind == 2:
                b = bytearray(base)
                for _ in range(3):
                    b[int(rng.integers(len(b)))] = int(rng.integers(256))
                frame = bytes(b)
            elif kind == 3:
                frame = b"\xdd\x7f\xff\xff\xff" + base  # an array claiming 2 G elements
            elif kind == 4:
                frame = b"\xdf\xff\xff\xff\xff" + base  # a map claiming 4 G entries
            else:
                frame = base  # well-formed, refused by the policy
            pool.append((frame, kind != 5))
        return pool

    def flood(self, n: int) -> dict[str, Any]:
        rng = np.random.default_rng(7)
        pool = self._pool(rng)
        blowup = b"\xdd" + (15 * 2**20).to_bytes(4, "big") + b"\x80" * (15 * 2**20)
        oversized = b"\x00" * (17 * 2**20)
        sec = self._tenant_sec()
        asec = self._tenant_sec(analyzer=True)
        counts = {"malformed": 0, "well_formed_refused": 0, "blowup": 0, "oversized": 0}
        self.watch.sampling = {}
        t0 = time.monotonic()

        def blast(kind: int, addr: str, s: Any, m: int, prefix: tuple[bytes, ...] = ()) -> None:
            sock = self.ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            s.client(sock)
            sock.connect(addr)
            for j in range(m):
                frame, bad = pool[j % len(pool)]
                counts["malformed" if bad else "well_formed_refused"] += 1
                while True:
                    try:
                        sock.send_multipart([*prefix, frame], zmq.NOBLOCK)
                        break
                    except zmq.Again:
                        while sock.poll(0):
                            sock.recv_multipart()
                        time.sleep(0.001)
                if kind == zmq.DEALER and j % 200 == 0:
                    while sock.poll(0):
                        sock.recv_multipart()
            for _ in range(4):
                sock.send_multipart([*prefix, blowup])
                counts["blowup"] += 1
            time.sleep(1.0)
            sock.close(0)
            for _ in range(2):  # each on a connection of its own: the transport cuts it
                o = self.ctx.socket(kind)
                o.setsockopt(zmq.LINGER, 0)
                s.client(o)
                o.connect(addr)
                o.send_multipart([*prefix, oversized])
                time.sleep(0.5)
                o.close(0)
                counts["oversized"] += 1

        # 5 of 6 pool frames are malformed: send enough that the malformed ones reach ``n``
        m = -(-n * 6 // 5)
        share = m // 5
        blast(zmq.DEALER, self.addr["router"], sec, 2 * share)
        blast(zmq.PUSH, self.addr["pull"], asec, 2 * share)
        blast(zmq.DEALER, self.addr["replay"], asec, m - 4 * share, prefix=(b"",))
        time.sleep(2.0)
        peak = dict(self.watch.sampling)
        self.watch.sampling = None
        # still serving: the operator's status and a subscriber's replay answer
        alive = bool(_wait(lambda: self.admin.status() and self.bus.replay(0) is not None, 60))
        return {
            "sent": counts,
            "total": counts["malformed"] + counts["blowup"] + counts["oversized"],
            "seconds": round(time.monotonic() - t0, 1),
            "peak_rss_mb": {k: round(v, 1) for k, v in peak.items()},
            "serving_after": alive,
        }

    # -- the whole run --------------------------------------------------------------------------
    def main(self) -> dict[str, Any]:
        try:
            self.start()
            time.sleep(5.0)  # the pipeline reads the registry and sees a few rounds first
            self.rogue_phase()
            self._mark("rogue_done")
            kills = []
            targets = ["analyzer", "controller", "underlay", "overlay0"]
            for _ in range(self.args.rounds):
                for tgt in targets:
                    kills.append(self.kill_round(tgt, len(kills)))
            self._mark("kills_done")
            # every fault cleared, every daemon back: each alert open at a kill must resolve
            ids = {i for k in kills for i in k["open_ids"]}
            _wait(lambda: all(self._resolved(i) for i in ids), 120, 1.0)
            for k in kills:
                k["unresolved"] = [i for i in k["open_ids"] if not self._resolved(i)]
                k["resolved"] = bool(k["alert_id"]) and self._resolved(k["alert_id"])
            self._mark("alerts_resolved")
            flood = self.flood(self.args.frames)
            self._mark("flood_done")
            self.out["counters"] = {
                "controller": self.admin.status()["counters"],
                "analyzer": self._analyzer_status().get("counters", {}),
            }
            # the alerts the tenant heard (none) and a subscriber heard (some)
            heard_spy = self.alert_spy.poll(0)
            self.legit["follow_alerts"] = bool(self.alert_follower.poll(0))
            self.rogue["follow_the_alerts"] = {"accepted": bool(heard_spy)}
            forged = self._spooled(FORGED_SEQ)
            own = self._spooled(OWN_SEQ)
            self.legit["own_results_accepted"] = own > 0
            lost = self._lost_alerts()
        finally:
            self.shutdown()
        rec = [k["recovery_s"] for k in kills]
        self.out.update(
            {
                "rogue_ops_tried": len(self.rogue),
                "rogue_ops_accepted": sum(v["accepted"] for v in self.rogue.values()),
                "rogue_ops": self.rogue,
                "legit_ops_tried": len(self.legit),
                "legit_ops_failed": sum(not v for v in self.legit.values()),
                "legit_ops": self.legit,
                "forged_records_accepted": forged,
                "daemon_crashes": len(self.watch.crashes),
                "crashes": self.watch.crashes,
                "kills": kills,
                "alerts_open_at_kills": [k["alerts_open"] for k in kills],
                "faults_not_alerted": sum(not k["alert"] for k in kills),
                "lost_alerts": lost,
                "unresolved_after_restart": len(
                    {i for k in kills for i in k.get("unresolved", k["open_ids"])}
                ),
                "not_recovered": sum(not k["recovered"] for k in kills),
                "recovery_s_p99": round(float(np.percentile(rec, 99)), 2) if rec else None,
                "malformed_frames_sent": flood["total"],
                "flood": flood,
                "peak_rss_mb_under_flood": max(flood["peak_rss_mb"].values(), default=None),
            }
        )
        return self.out

    def _lost_alerts(self) -> int:
        """Alerts seen during the run that the log no longer serves, or serves changed, plus
        holes in its sequence."""
        log = {r["seq"]: r for r in self.bus.replay(0)}
        lost = sum(
            1
            for seq, r in self.bus.seen.items()
            if seq not in log or log[seq]["alert"] != r["alert"]
        )
        seqs = sorted(log)
        holes = (seqs[-1] - len(seqs)) if seqs else 0
        self.out["alerts_logged"] = len(seqs)
        return lost + holes

    def shutdown(self) -> None:
        for name in (
            "overlay0",
            *[f"overlay{k}" for k in range(1, self.args.fleets)],
            "underlay",
            "analyzer",
            "controller",
        ):
            p = self.procs.get(name)
            if p is not None and p.p is not None:
                p.stop()
        if hasattr(self, "watch"):
            self.watch.stop()
        for obj in ("bus", "admin"):
            with contextlib.suppress(Exception):
                getattr(self, obj).close()
        for s in ("alert_spy", "alert_follower"):
            with contextlib.suppress(Exception):
                getattr(self, s).close(0)
        self.ctx.destroy(0)
        shutil.rmtree(self.enrol_dir, ignore_errors=True)
        if not self.args.keep and not self.args.run_dir:
            shutil.rmtree(self.run, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "mode", nargs="?", default="run", choices=("run", "fleet-overlay", "fleet-underlay")
    )
    p.add_argument("--quick", action="store_true", help="one kill of each, 100,000 frames")
    p.add_argument("--fleets", type=int, default=4, help="sidecar processes")
    p.add_argument("--run-dir", help="keep keys, logs and the registry here")
    p.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    p.add_argument("--spec")
    p.add_argument("--part", type=int, default=0)
    args = p.parse_args(argv)
    if args.mode == "fleet-overlay":
        return fleet_overlay(json.loads(Path(args.spec).read_text()), args.part)
    if args.mode == "fleet-underlay":
        return fleet_underlay(json.loads(Path(args.spec).read_text()))
    args.rounds = 1 if args.quick else 3
    args.frames = 100_000 if args.quick else 300_000
    out = Chaos(args).main()
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
