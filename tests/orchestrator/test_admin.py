"""The operator's admin client and CLI (``skh job``, ``skh status``, ``skh relay``) against a real
controller process with CURVE on, and a real underlay agent process for relayed commands.

Checked: a submitted job's preload list is exactly :func:`skh.model.same_rail_pairs` of its
endpoints (from the client and from ``skh job pinglist --json``); resubmitting keeps the endpoint
ids; status shows jobs, ping-list sizes, agents and endpoint readiness; a relayed command reaches
the agent and failures come back as the command's answer; a removed job is gone from the lists
and, after a restart, from the registry; a dead controller, a wrong CURVE key, an unknown job and
bad job files fail with clear errors from :mod:`skh.errors`.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from skh.cli import main
from skh.errors import ConfigError, RequestRefused, RequestTimeout, SkhError
from skh.model import same_rail_pairs
from skh.orchestrator.admin import (
    ControllerClient,
    job_from_mapping,
    load_job_file,
    parse_container,
    ping_list_summary,
)
from skh.orchestrator.security import SecurityConfig, generate_keypair

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

JOB_TOML = """
name = "train-7"
shape = {tp = 8, pp = 2, dp = 2}

[[containers]]
name = "w0"
host = "host0"
rails = [0, 1, 2, 3]

[[containers]]
name = "w1"
host = "host0"
rails = [0, 1]

[[containers]]
name = "w2"
host = "host1"
rails = [0, 1, 2, 3]

[[containers]]
name = "w3"
host = "host2"
rails = [1, 3]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemons:
    """Daemon processes of one test module, each stopped (and killed if need be) at the end."""

    def __init__(self, tmp: Path, curve: list[str]):
        self.tmp = tmp
        self.curve = curve
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.env.pop("NOTIFY_SOCKET", None)
        self.procs: list[subprocess.Popen] = []

    def start(
        self, name: str, *args: str, stdout=subprocess.DEVNULL, key: str = ""
    ) -> subprocess.Popen:
        """Start a daemon; ``key``: its own secret certificate (each has its own identity)."""
        own = ["--set", f"security.client_secret_key={key}"] if key else []
        with open(self.tmp / f"{name}.log", "ab") as err:
            p = subprocess.Popen(
                [sys.executable, "-m", "skh", *args, *self.curve, *own],
                cwd=ROOT,
                env=self.env,
                stdout=stdout,
                stderr=err,
            )
        self.procs.append(p)
        return p

    def controller(self, db: Path, bind: str = "tcp://127.0.0.1:0") -> tuple[subprocess.Popen, str]:
        p = self.start(
            "controller",
            "controller",
            "--db",
            str(db),
            "--bind",
            bind,
            "--pub-bind",
            "tcp://127.0.0.1:0",
            "--heartbeat-interval",
            "0.3",
            "--print-endpoints",
            stdout=subprocess.PIPE,
        )
        line = p.stdout.readline()
        assert line, f"controller died: {(self.tmp / 'controller.log').read_text()[-2000:]}"
        return p, json.loads(line)["router"]

    @staticmethod
    def stop(p: subprocess.Popen) -> int:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def stop_all(self) -> None:
        for p in self.procs:
            self.stop(p)
            if p.stdout:
                p.stdout.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d, "server")
    generate_keypair(d / "clients", "admin", metadata={"role": "admin"})
    generate_keypair(d / "clients", "u0", metadata={"role": "underlay", "host": "host0"})
    generate_keypair(d / "other", "server")  # a server key the controller does not hold
    sec = SecurityConfig(
        server_secret_key=str(d / "server.key_secret"),
        server_public_key=str(d / "server.key"),
        client_secret_key=str(d / "clients" / "admin.key_secret"),
        authorized_keys_dir=str(d / "clients"),
    )
    return d, sec


def _curve_args(sec: SecurityConfig) -> list[str]:
    keys = ("server_secret_key", "server_public_key", "client_secret_key", "authorized_keys_dir")
    return [x for k in keys for x in ("--set", f"security.{k}={getattr(sec, k)}")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, keys):
    """One controller and one underlay agent (``u0``), CURVE on every link."""
    _, sec = keys
    tmp = tmp_path_factory.mktemp("admin")
    d = Daemons(tmp, _curve_args(sec))
    try:
        _, router = d.controller(tmp / "registry.db")
        d.start(
            "agent",
            "agent",
            "--role",
            "underlay",
            "--name",
            "u0",
            "--host",
            "host0",
            "--controller",
            router,
            "--analyzer",
            "tcp://127.0.0.1:9",
            key=str(Path(sec.authorized_keys_dir) / "u0.key_secret"),
        )
        with ControllerClient(router, sec, timeout_s=5) as ctl:
            deadline = time.monotonic() + 20
            while not ctl.status()["agents"].get("u0", {}).get("alive"):
                assert time.monotonic() < deadline, (tmp / "agent.log").read_text()[-2000:]
                time.sleep(0.1)
        yield router, sec, tmp
    finally:
        d.stop_all()


def _cli(capsys, router, sec, *argv):
    capsys.readouterr()
    rc = main([*argv, "--controller", router, *_curve_args(sec)])
    out, err = capsys.readouterr()
    return rc, out, err


def _expected_preload(job, ids):
    eps = [(ids[f"{job.name}/{c.name}/{r}"], r, c.host) for c in job.containers for r in c.rails]
    ep, rail, host = zip(*eps, strict=True)
    return same_rail_pairs(np.array(ep), np.array(rail), np.array(host))


def test_submitted_job_preloads_same_rail_pairs(cluster, capsys, tmp_path):
    router, sec, _ = cluster
    path = tmp_path / "job.toml"
    path.write_text(JOB_TOML)
    rc, out, err = _cli(capsys, router, sec, "job", "submit", str(path), "--json")
    assert rc == 0, err
    ids = json.loads(out)["endpoints"]
    job = load_job_file(path)
    assert len(ids) == sum(len(c.rails) for c in job.containers) == 12
    want = _expected_preload(job, ids)
    assert want.shape[0] > 0

    with ControllerClient(router, sec) as ctl:
        lists = ctl.ping_lists("train-7")
        np.testing.assert_array_equal(lists.preload_pairs(), want)
        assert ping_list_summary(lists) == {
            "version": 0,
            "mode": "preload",
            "skeleton_version": 0,
            "endpoints": 12,
            "ready": 0,
            "preload_pairs": want.shape[0],
            "pairs": want.shape[0],
            "active_pairs": 0,  # nobody is ready yet: incremental activation
        }
        # resubmitting is idempotent: same ids, same list
        assert ctl.submit_job(job) == ids

    rc, out, err = _cli(capsys, router, sec, "job", "pinglist", "train-7", "--json")
    assert rc == 0, err
    shown = json.loads(out)
    assert shown["mode"] == "preload" and shown["active"] == []
    np.testing.assert_array_equal(np.array(shown["pairs"], np.uint32).reshape(-1, 2), want)
    assert {e["ep"] for e in shown["endpoints"]} == set(ids.values())
    assert not shown["truncated"]
    # a big job's list is shown in part: the first pairs by source, or one source's
    rc, out, err = _cli(capsys, router, sec, "job", "pinglist", "train-7", "--json", "--limit", "3")
    part = json.loads(out)
    assert rc == 0 and part["truncated"] and part["pairs"] == want[:3].tolist()
    assert part["preload_pairs"] == want.shape[0]  # counted all the same
    src = int(want[-1, 0])
    rc, out, err = _cli(
        capsys, router, sec, "job", "pinglist", "train-7", "--json", "--src", str(src)
    )
    assert json.loads(out)["pairs"] == want[want[:, 0] == src].tolist()


def test_submit_from_flags_and_status(cluster, capsys):
    router, sec, _ = cluster
    rc, out, err = _cli(
        capsys,
        router,
        sec,
        "job",
        "submit",
        "--name",
        "flags-job",
        "--tp",
        "4",
        "--container",
        "a:hostA:0-1",
        "--container",
        "b:hostB:0,1",
    )
    assert rc == 0, err
    assert "flags-job: 4 endpoints, 4 preload pairs" in out

    rc, out, err = _cli(capsys, router, sec, "status", "--json")
    assert rc == 0, err
    view = json.loads(out)
    j = view["jobs"]["flags-job"]
    assert (j["endpoints"], j["ready"], j["preload_pairs"], j["mode"]) == (4, 0, 4, "preload")
    assert {m["name"] for m in j["members"]} == {
        "flags-job/a/0",
        "flags-job/a/1",
        "flags-job/b/0",
        "flags-job/b/1",
    }
    assert all(m["agent"] == "" and not m["ready"] for m in j["members"])
    u0 = view["agents"]["u0"]
    assert u0["alive"] and u0["role"] == "underlay" and u0["last_seen_s"] < 5

    rc, out, err = _cli(capsys, router, sec, "status", "--endpoints")
    assert rc == 0, err
    for text in ("flags-job", "u0", "underlay", "alive", "flags-job/b/1", "no agent yet"):
        assert text in out

    rc, out, err = _cli(capsys, router, sec, "job", "list", "--json")
    assert rc == 0, err
    assert json.loads(out)["flags-job"]["pairs"] == 4


def test_relay_reaches_the_agent_and_reports_failures(cluster, capsys):
    router, sec, _ = cluster
    rc, out, err = _cli(capsys, router, sec, "relay", "u0", "stats", "--json")
    assert rc == 0, err
    reply = json.loads(out)
    assert reply["ok"] and reply["result"]["agent"] == "u0"
    assert reply["result"]["counters"]["registered"] >= 1

    rc, out, err = _cli(capsys, router, sec, "relay", "u0", "no_such_command")
    assert rc == 1 and "unknown command 'no_such_command'" in err

    with ControllerClient(router, sec, timeout_s=2) as ctl:
        r = ctl.relay("ghost", "stats")
        assert not r.ok and "'ghost' is not alive" in r.error
        # arguments are checked before anything is relayed
        r = ctl.relay("u0", "traceroute", {})
        assert not r.ok and "missing argument 'dst'" in r.error
        r = ctl.relay("u0", "stats", {"verbose": True})
        assert not r.ok and "unknown argument" in r.error
        # a handler's failure is the command's answer, not a transport error
        r = ctl.relay("u0", "host_report", {"netns": "absent"})
        assert not r.ok and "not a container of this host" in r.error


def test_remove_job_and_unknown_job(cluster, capsys):
    router, sec, _ = cluster
    with ControllerClient(router, sec) as ctl:
        ids = ctl.submit_job(
            "doomed",
            [{"name": "c", "host": "h1", "rails": [0]}, {"name": "d", "host": "h2", "rails": [0]}],
        )
        assert ctl.ping_lists("doomed").preload_pairs().shape == (2, 2)
    rc, out, err = _cli(capsys, router, sec, "job", "rm", "doomed")
    assert rc == 0 and "doomed removed (2 endpoints)" in out, err

    with ControllerClient(router, sec) as ctl:
        assert "doomed" not in ctl.status()["jobs"]
        with pytest.raises(RequestRefused, match="unknown job 'doomed'"):
            ctl.ping_lists("doomed")
        # the names are free again: a new submission gets new endpoint ids
        again = ctl.submit_job("doomed", [{"name": "c", "host": "h1", "rails": [0]}])
        assert set(again.values()).isdisjoint(ids.values())
        assert ctl.remove_job("doomed") == list(again.values())

    for argv in (("job", "rm", "doomed"), ("job", "pinglist", "doomed")):
        rc, out, err = _cli(capsys, router, sec, *argv)
        assert rc == 2 and "unknown job 'doomed'" in err, (argv, err)


def test_removal_is_durable_across_a_restart(keys, tmp_path):
    _, sec = keys
    d = Daemons(tmp_path, _curve_args(sec))
    db = tmp_path / "registry.db"
    try:
        p, router = d.controller(db)
        with ControllerClient(router, sec) as ctl:
            ctl.submit_job("keep", [{"name": "c", "host": "h", "rails": [0]}])
            ctl.submit_job("drop", [{"name": "c", "host": "h", "rails": [0]}])
            ctl.remove_job("drop")
        assert d.stop(p) == 0
        _, router = d.controller(db)
        with ControllerClient(router, sec) as ctl:
            assert set(ctl.status()["jobs"]) == {"keep"}
    finally:
        d.stop_all()


def test_controller_down_is_a_timeout(capsys, keys):
    addr = f"tcp://127.0.0.1:{_free_port()}"
    with ControllerClient(addr, None, timeout_s=0.2, retries=1) as ctl:
        t0 = time.monotonic()
        with pytest.raises(
            RequestTimeout,
            match=r"no answer from the controller at .* to status "
            r"within 0.2 s \(2 attempt\(s\)\)",
        ) as exc:
            ctl.status()
        assert isinstance(exc.value, TimeoutError)
        assert 0.35 < time.monotonic() - t0 < 3
        with pytest.raises(RequestTimeout, match="command 'stats' for agent 'u0'"):
            ctl.relay("u0", "stats", timeout_s=0.1, retries=0)
    capsys.readouterr()
    rc = main(["status", "--insecure", "--controller", addr, "--timeout", "0.2", "--retries", "0"])
    assert rc == 2 and "no answer from the controller" in capsys.readouterr().err


def test_wrong_server_key_is_a_timeout(cluster, keys):
    router, sec, _ = cluster
    d, _ = keys
    wrong = SecurityConfig(
        server_public_key=str(d / "other" / "server.key"),
        client_secret_key=sec.client_secret_key,
    )
    with ControllerClient(router, wrong, timeout_s=0.3, retries=0) as ctl:
        with pytest.raises(RequestTimeout, match="CURVE key"):
            ctl.status()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = ", "cannot read job file"),
        ('name = "j"', "'containers' must be a non-empty list"),
        ('name = "j"\ncontainers = [{name = "a", host = "h", rails = [0, 0]}]', "distinct ints"),
        ('name = "j"\ncontainers = [{name = "a", host = "", rails = [0]}]', "'host' must be"),
        (
            'name = "j"\ncontainers = [{name = "a", host = "h", rails = [0]},'
            ' {name = "a", host = "g", rails = [1]}]',
            "repeated: ['a']",
        ),
        (
            'name = "j"\nshape = {tp = 0}\ncontainers = [{name = "a", host = "h", rails = [0]}]',
            "'tp' parameter of JobShape must be an int >= 1",
        ),
        (
            'name = "j"\nshape = {mp = 2}\ncontainers = [{name = "a", host = "h", rails = [0]}]',
            "'shape' must be a table of tp, pp, dp, ep",
        ),
        ('name = "j"\nnodes = 3\ncontainers = []', "unknown key(s) ['nodes']"),
    ],
)
def test_bad_job_file(tmp_path, capsys, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_job_file(path)
    assert message in str(exc.value) and "bad.toml" in str(exc.value)
    # the CLI refuses before connecting anywhere (port 9: nothing listens, nothing is waited for)
    capsys.readouterr()
    rc = main(["job", "submit", str(path), "--insecure", "--controller", "tcp://127.0.0.1:9"])
    assert rc == 2 and message in capsys.readouterr().err


def test_missing_job_file_and_container_specs(tmp_path):
    with pytest.raises(ConfigError, match="cannot read job file"):
        load_job_file(tmp_path / "absent.toml")
    c = parse_container("w0:host0:0-2,5", "j")
    assert (c.name, c.host, c.rails, c.job) == ("w0", "host0", (0, 1, 2, 5), "j")
    for spec in ("w0:host0", "w0:host0:a", "w0::0", "w0:host0:300"):
        with pytest.raises(ConfigError):
            parse_container(spec, "j")
    with pytest.raises(SkhError, match="'name' must be a string"):
        job_from_mapping({"name": "", "containers": []})


def test_skeleton_mode_and_batched_commands(cluster, capsys):
    """What the analyzer's pipeline does through the same client: replace a job's list by a
    skeleton (once: a stale version is refused), and relay several commands in one go."""
    router, sec, _ = cluster
    with ControllerClient(router, sec) as ctl:
        ids = ctl.submit_job(
            "sk", [{"name": f"c{i}", "host": f"h{i}", "rails": [0, 1]} for i in range(3)]
        )
        # every endpoint named (one no pair names keeps its preload pairs: a newcomer)
        pairs = np.array(
            [
                [ids["sk/c0/0"], ids["sk/c1/0"]],
                [ids["sk/c1/1"], ids["sk/c2/1"]],
                [ids["sk/c2/0"], ids["sk/c0/0"]],
                [ids["sk/c0/1"], ids["sk/c1/1"]],
            ]
        )
        version = ctl.apply_skeleton("sk", pairs, 1)
        with pytest.raises(RequestRefused, match="not newer"):
            ctl.apply_skeleton("sk", pairs[:1], 1)
        summary = ping_list_summary(ctl.ping_lists("sk"))
        assert (summary["version"], summary["mode"], summary["skeleton_version"]) == (
            version,
            "skeleton",
            1,
        )
        assert (summary["preload_pairs"], summary["pairs"], summary["active_pairs"]) == (12, 4, 0)
        replies = ctl.commands([("ghost", "stats", {}), ("u0", "stats", {})], timeout_s=1.0)
        assert [r["ok"] for r in replies] == [False, True]
        assert replies[1]["result"]["agent"] == "u0"
    rc, out, err = _cli(capsys, router, sec, "job", "pinglist", "sk")
    assert rc == 0 and "skeleton v1" in out and "0 of 4 pairs active" in out, err


def test_removing_a_running_job_announces_its_endpoints_down(cfg, ctx, client, run_daemon):
    """A job with a registered, ready agent: removal is announced once on the job topic (agents
    drop the endpoints from their lists) and the agent no longer answers for them."""
    from skh.orchestrator.controller import Controller
    from skh.wire import MsgType, job_topic

    ctl = Controller(cfg.controller, cfg.security, ctx=ctx)
    router, pub = ctl.bind()
    with run_daemon(ctl):
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, job_topic("run"))
        sub.connect(pub)
        agent = client(router, "a0")
        eps = [{"job": "run", "container": "c0", "rail": r, "ip": "127.0.0.1"} for r in (0, 1)]
        ack = agent.request(
            MsgType.REGISTER,
            {"agent": "a0", "role": "overlay", "host": "h0", "endpoints": eps},
            want={MsgType.REGISTER_ACK},
        ).body
        time.sleep(0.3)  # the subscription must reach the PUB socket first (slow joiner)
        agent.request(
            MsgType.READY, {"agent": "a0", "endpoints": ack["endpoints"]}, want={MsgType.ACK}
        )
        assert sub.poll(5000) and agent.codec.decode(sub.recv_multipart()[1]).type is (
            MsgType.READY_ANNOUNCE
        )
        with ControllerClient(router, None, ctx=ctx) as admin:
            assert admin.remove_job("run") == ack["endpoints"]
            assert sub.poll(5000)
            env = agent.codec.decode(sub.recv_multipart()[1])
            assert env.type is MsgType.ENDPOINTS_DOWN
            assert (env.body["endpoints"], env.body["reason"]) == (ack["endpoints"], "job removed")
            st = admin.status()
            assert "run" not in st["jobs"] and st["agents"]["a0"]["endpoints"] == []
        beat = agent.request(
            MsgType.HEARTBEAT,
            {"agent": "a0", "epoch": ack["epoch"], "jobs": {"run": 1}},
            want={MsgType.HEARTBEAT_ACK},
        ).body
        assert beat["known"] and beat["jobs"] == {}
        sub.close(0)


def test_bad_client_settings(tmp_path):
    with pytest.raises(ConfigError, match="cannot connect to the controller at 'ctl:5550'"):
        ControllerClient("ctl:5550")
    with pytest.raises(ConfigError, match="cannot read CURVE certificate"):
        ControllerClient(
            "tcp://127.0.0.1:9",
            SecurityConfig(server_public_key=str(tmp_path / "no.key"), client_secret_key="x"),
        )
    for kwargs in ({"timeout_s": 0}, {"retries": -1}):
        with pytest.raises(ConfigError, match="parameter of ControllerClient"):
            ControllerClient("tcp://127.0.0.1:9", **kwargs)


def test_the_operator_lists_the_key_bindings(cluster, capsys):
    router, sec, _ = cluster
    rc, out, err = _cli(capsys, router, sec, "keys", "list")
    assert rc == 0, err
    keys = {k["name"]: k for k in json.loads(out)}
    assert keys["u0"]["role"] == "underlay" and keys["u0"]["host"] == "host0"
    assert keys["admin"]["role"] == "admin"
    rc, out, err = _cli(capsys, router, sec, "keys", "revoke", "nobody")
    assert rc == 2 and "no such key" in err
