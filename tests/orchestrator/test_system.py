"""The whole orchestration as separate processes on loopback: a real controller, the analyzer's
real ingest path (spooling what it receives, running the real detector) and 16 overlay agents
with real probing engines, 4 endpoints each on 4 rails, 2 containers per host; every link
authenticated and encrypted with CURVE.

Checked, in order: every agent's ping list equals the same-rail, different-host list of ready
peers; a container that registers late is probed only after it is ready; an agent killed with
SIGKILL is noticed through missed heartbeats by the controller (and dropped from its peers'
lists) and by the analyzer's detector (an ``agent`` alert, not a network one); ``kill -9`` of the
controller and a restart on the same addresses lose no registration and the agents re-register;
every daemon exits 0 on SIGTERM.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from skh.orchestrator.keyring import make_keyring, security_args
from skh.wire import MsgType

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
N_AGENTS = 16
RAILS = (0, 1, 2, 3)
HB_S = 0.5


class Procs:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.env.pop("NOTIFY_SOCKET", None)

    def start(self, name: str, *args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
        err = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(
            [sys.executable, "-m", "skh", "-v", *args],
            cwd=ROOT,
            env=self.env,
            stdout=stdout,
            stderr=err,
        )
        err.close()
        self.procs[name] = p
        return p

    def endpoints(self, p: subprocess.Popen) -> dict:
        line = p.stdout.readline()
        assert line, "daemon died before printing its endpoints"
        return json.loads(line)

    def kill(self, name: str, sig=signal.SIGKILL) -> int:
        p = self.procs.pop(name)
        p.send_signal(sig)
        return p.wait(15)

    def stop_all(self) -> dict[str, int]:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait()
        self.procs.clear()
        return codes

    def logs(self) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(self.tmp.glob("*.log"))
        )


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    for proc in p.procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _status(admin):
    """The controller's status, each job with its endpoint records (read page by page).

    STATUS and the MEMBERS pages are separate requests: a container registering in between
    shows up in a page under a job the status did not have yet, so the read starts over.
    """
    while True:
        st = admin.request(MsgType.STATUS, {}, timeout_s=10, want={MsgType.ACK}).body["data"]
        if _read_members(admin, st["jobs"]):
            return st


def _read_members(admin, jobs) -> bool:
    for job in jobs.values():
        job["members"] = []
    after = -1
    while True:
        page = admin.request(
            MsgType.MEMBERS, {"after": after}, timeout_s=10, want={MsgType.ACK}
        ).body["data"]
        for m in page["members"]:
            if m["job"] not in jobs:
                return False
            jobs[m["job"]]["members"].append(m)
        if page["next"] is None:
            return True
        after = page["next"]


def _expected_lists(status, job="train"):
    members = status["jobs"][job]["members"]
    ready = [m for m in members if m["ready"]]
    return {
        m["ep"]: sorted(d["ep"] for d in ready if d["rail"] == m["rail"] and d["host"] != m["host"])
        for m in members
    }


def _agent_lists(admin, agent_names, attempt):
    out = {}
    for name in agent_names:
        cmd_id = f"pl-{name}-{attempt}"
        env = admin.request(
            MsgType.COMMAND,
            {
                "cmd_id": cmd_id,
                "agent": name,
                "name": "pinglist",
                "args": {},
                "timeout_s": 3.0,
                "retries": 1,
            },
            timeout_s=15,
            want={MsgType.COMMAND_REPLY},
        )
        if not env.body["ok"]:  # e.g. not reconnected yet since the controller restarted
            return None
        out.update({int(ep): dsts for ep, dsts in env.body["result"]["lists"].items()})
    return out


def _converged(admin, agent_names, wait, what, check=None):
    """Wait until every listed agent probes exactly the expected list."""
    attempt = [0]
    seen = {}

    def ok():
        attempt[0] += 1
        st = _status(admin)
        if "train" not in st["jobs"] or not all(
            st["agents"].get(n, {}).get("alive") for n in agent_names
        ):
            return False
        want = _expected_lists(st)
        got = _agent_lists(admin, agent_names, attempt[0])
        seen.update(want=want, got=got, status=st)
        if got is None:
            return False
        return all(got[ep] == want[ep] for ep in got) and (check is None or check(st, got))

    try:
        wait(ok, timeout_s=60, interval_s=0.5, what=what)
    except TimeoutError:
        raise AssertionError(f"{what}: lists differ: {seen}") from None
    return seen


def _spooled(spool: Path) -> np.ndarray:
    parts = [np.load(f) for f in sorted(spool.glob("probes-*.npy"))]
    return np.concatenate(parts) if parts else np.zeros(0)


def test_sixteen_agents_on_four_rails(procs, tmp_path, client, wait):
    db, spool = tmp_path / "registry.db", tmp_path / "spool"
    # CURVE on every link, a key per daemon and per agent, each bound to its identity
    ring = make_keyring(
        tmp_path / "keys",
        sidecars=[
            (f"agent{i:02d}", "train", f"c{i:02d}", f"host{i // 2}") for i in range(N_AGENTS)
        ],
    )
    sec = ring.admin()
    ctl_args = [
        "controller",
        *security_args(ring.controller()),
        "--db",
        str(db),
        "--heartbeat-interval",
        str(HB_S),
        "--print-endpoints",
    ]
    c = procs.start(
        "controller",
        *ctl_args,
        "--bind",
        "tcp://127.0.0.1:0",
        "--pub-bind",
        "tcp://127.0.0.1:0",
        stdout=subprocess.PIPE,
    )
    ctl = procs.endpoints(c)
    a = procs.start(
        "analyzer",
        "analyzer",
        *security_args(ring.analyzer()),
        "--controller",
        ctl["router"],
        "--bind",
        "tcp://127.0.0.1:0",
        "--alerts-bind",
        "tcp://127.0.0.1:0",
        "--replay-bind",
        "tcp://127.0.0.1:0",
        "--alert-log",
        str(tmp_path / "alerts.log"),
        "--spool-dir",
        str(spool),
        "--detector",
        "detect",
        "--controller-pub",
        ctl["pub"],
        "--print-endpoints",
        stdout=subprocess.PIPE,
    )
    an = procs.endpoints(a)
    ready_file = tmp_path / "late.ready"

    def agent(i, *extra):
        name = f"agent{i:02d}"
        args = [
            "agent",
            *security_args(ring.client(name)),
            "--role",
            "overlay",
            "--name",
            name,
            "--host",
            f"host{i // 2}",
            "--job",
            "train",
            "--container",
            f"c{i:02d}",
            "--controller",
            ctl["router"],
            "--controller-pub",
            ctl["pub"],
            "--analyzer",
            an["pull"],
            "--probe-interval",
            "1.0",
            *(x for r in RAILS for x in ("--endpoint", f"rail={r},ip=127.0.0.1")),
            *extra,
        ]
        procs.start(name, *args)
        return name

    names = [agent(i) for i in range(N_AGENTS - 1)]
    admin = client(ctl["router"], "admin", security=sec)
    try:
        _converged(
            admin,
            names,
            wait,
            "15 agents ready",
            check=lambda st, got: st["jobs"]["train"]["ready"] == 4 * (N_AGENTS - 1),
        )

        # -- a late container: registered, preloaded, but probed only once ready ----------------
        late = agent(N_AGENTS - 1, "--ready-file", str(ready_file))
        wait(lambda: late in _status(admin)["agents"], timeout_s=60, what="late agent registered")
        late_eps = set(_status(admin)["agents"][late]["endpoints"])
        assert len(late_eps) == 4
        time.sleep(3 * HB_S + 1.0)  # time enough for anyone to (wrongly) start probing it
        seen = _converged(admin, names + [late], wait, "late agent registered, not ready")
        assert not any(late_eps & set(d) for d in seen["got"].values())
        touched_ns = time.time_ns()
        ready_file.touch()
        seen = _converged(
            admin,
            names + [late],
            wait,
            "late agent ready",
            check=lambda st, got: st["jobs"]["train"]["ready"] == 4 * N_AGENTS,
        )
        # every endpoint but those on the late container's own host now probes it
        assert sum(bool(late_eps & set(d)) for d in seen["got"].values()) == 4 * (N_AGENTS - 2)
        time.sleep(2.5)  # a couple of result batches reach the analyzer

        def late_ingested():
            r = _spooled(spool)
            return r if r.size and np.isin(r["dst_ep"], list(late_eps)).any() else None

        recs = wait(late_ingested, timeout_s=30, what="probes to the late container ingested")
        to_late = recs[np.isin(recs["dst_ep"], list(late_eps))]
        assert to_late["t_wall_ns"].min() >= touched_ns, (
            "the late container was probed before it was ready"
        )
        ok = recs[recs["status"] == 0]
        # an OK carries its RTT, or asked for none (not its pair's latency sample: docs/engine.md,
        # "One answer per probe") and says so
        stamped = ok["rtt_ns"] > 0
        assert ok.size and stamped.any()
        assert ((ok["rtt_ns"][~stamped] == -1) & (ok["ts_source"][~stamped] == 0)).all()
        assert set(np.unique(recs["src_ep"]).tolist()) <= set(range(4 * N_AGENTS))

        # -- an agent killed: noticed by missed heartbeats, dropped from its peers' lists -------
        victim = names.pop(3)
        victim_eps = set(_status(admin)["agents"][victim]["endpoints"])
        killed_at = time.monotonic()
        procs.kill(victim)
        wait(
            lambda: not _status(admin)["agents"][victim]["alive"],
            timeout_s=30,
            what="victim noticed",
        )
        noticed_s = time.monotonic() - killed_at
        assert noticed_s >= 2 * HB_S  # missed heartbeats, not a shortcut
        # the analyzer's detector blames the dead agent itself, not the network (DESIGN §6)
        replay = client(an["replay"], "replay", kind=zmq.REQ, security=ring.subscriber())

        def agent_alert():
            env = replay.request(MsgType.REPLAY, {"since": 0}, timeout_s=10)
            hits = [
                r
                for r in env.body["alerts"]
                if r["alert"]["failure_type"] == "agent"
                and victim_eps & {int(c[2:]) for c in r["alert"]["component"].split(",") if c}
            ]
            return hits or None

        wait(agent_alert, timeout_s=30, interval_s=0.5, what="an agent alert for the killed agent")
        seen = _converged(admin, names + [late], wait, "victim dropped")
        assert not any(victim_eps & set(d) for d in seen["got"].values())

        # -- kill -9 of the controller, restart on the same addresses: nothing lost ---------------
        before = {m["ep"]: m for m in _status(admin)["jobs"]["train"]["members"]}
        procs.kill("controller")
        c = procs.start(
            "controller2",
            *ctl_args,
            "--bind",
            ctl["router"],
            "--pub-bind",
            ctl["pub"],
            stdout=subprocess.PIPE,
        )
        assert procs.endpoints(c)["router"] == ctl["router"]
        after = {m["ep"]: m for m in _status(admin)["jobs"]["train"]["members"]}
        assert after == before
        _converged(
            admin,
            names + [late],
            wait,
            "after controller restart",
            check=lambda st, got: all(st["agents"][n]["alive"] for n in names + [late]),
        )
    except BaseException:
        print(procs.logs())
        raise
    codes = procs.stop_all()
    assert codes == dict.fromkeys(codes, 0), codes
