"""The demo's settings, checked before anything is built (no root needed): fault kinds, the
keyring and the identity each process gets from it, and a script for every kind."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from skh.demo.live import ALL_FAULTS, DemoSpec, LiveDemo
from skh.errors import ConfigError
from skh.testbed.faults import KINDS


def test_all_faults_is_every_kind_the_testbed_injects():
    assert ALL_FAULTS == KINDS
    assert set(DemoSpec().faults) < set(ALL_FAULTS)


def test_an_unknown_fault_kind_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="fault kind"):
        DemoSpec(faults=("link_down", "meteor_strike"))
    with pytest.raises(ConfigError, match="fault kind"):
        DemoSpec(faults=("",))
    # no scripted faults: a caller that injects its own (tests/demo/test_ecmp.py)
    assert DemoSpec(faults=()).faults == ()


def _settings(argv: list[str]) -> dict[str, str]:
    """The ``--set security.KEY=VALUE`` settings of a command line."""
    out = {}
    for flag, kv in zip(argv, argv[1:], strict=False):
        if flag == "--set" and kv.startswith("security."):
            k, _, v = kv.partition("=")
            out[k.removeprefix("security.")] = v
    return out


def _opt(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_secure_by_default_every_process_has_an_identity_of_its_own(tmp_path):
    # issue 18: the demo ran with --insecure; now the daemons, each host agent, each sidecar,
    # the demo's own client and the printed 'skh alerts tail' each hold a key of their own
    from skh.orchestrator.security import load_trusted, read_certificate

    demo = LiveDemo(DemoSpec(prefix="skhq"), tmp_path)
    demo.make_keys()
    L = demo.tb.layout
    keys = tmp_path.resolve() / "keys"
    assert demo.ring is not None and demo.ring.root == keys
    trusted = {i.name: i for i in load_trusted(keys / "trusted").values()}

    ctl, an = demo.controller_argv(), demo.analyzer_argv()
    uls = {L.host_name(g): demo.underlay_argv(g) for g in range(demo.spec.hosts)}
    sidecars = {c.name: (c, demo.sidecar_argv(c)) for c in L.placements}
    every = [ctl, an, *uls.values(), *(a for _, a in sidecars.values())]
    assert not any("--insecure" in argv for argv in every)

    c = _settings(ctl)
    assert c["server_secret_key"] == str(keys / "controller.key_secret")
    assert c["authorized_keys_dir"] == str(keys / "trusted")
    a = _settings(an)
    assert a["server_secret_key"] == a["client_secret_key"] == str(keys / "analyzer.key_secret")
    assert trusted["analyzer"].role == "analyzer"

    secrets = [c["server_secret_key"], a["server_secret_key"]]
    for host, argv in uls.items():
        s = _settings(argv)
        assert "server_secret_key" not in s
        key, meta = read_certificate(s["client_secret_key"])
        assert (meta["role"], meta["host"]) == ("underlay", host)
        assert trusted[f"ul-{host}"].key == key and trusted[f"ul-{host}"].host == host
        assert _opt(argv, "--enrol-socket") == str(demo.enrol_dir / f"{host}.sock")
        secrets.append(s["client_secret_key"])
    for c, argv in sidecars.values():
        s = _settings(argv)
        host = L.host_name(c.host)
        # made by the sidecar itself at start, in its container's own place; enrolled through
        # the agent of its own host, which vouches for it by its network namespace
        assert s["client_secret_key"] == str(keys / "sidecars" / c.job / f"{c.name}.key_secret")
        assert not Path(s["client_secret_key"]).exists()
        assert _opt(argv, "--enrol-socket") == _opt(uls[host], "--enrol-socket")
        assert f"job={c.job},container={c.name},netns={L.container_ns(c.host, c.slot)}" in uls[host]
        secrets.append(s["client_secret_key"])
    assert len(secrets) == len(set(secrets))
    for p in (keys / "controller.key_secret", keys / "clients" / "ul-host0.key_secret"):
        assert p.stat().st_mode & 0o777 == 0o600

    admin, sub = demo.admin_security(), demo.subscriber_security()
    assert read_certificate(admin.client_secret_key)[1]["role"] == "admin"
    # the printed tail command speaks to the analyzer as a subscriber, which may read alerts only
    tail = shlex.split(demo.tail_command())
    assert _opt(tail, "--server-key") == str(keys / "analyzer.key") == sub.server_public_key
    assert _opt(tail, "--client-key") == sub.client_secret_key
    assert read_certificate(sub.client_secret_key)[1]["role"] == "subscriber"
    assert sub.client_secret_key not in secrets + [admin.client_secret_key]


def test_the_keyring_is_completed_never_overwritten(tmp_path):
    ring = tmp_path / "ring"
    first = LiveDemo(DemoSpec(prefix="skhq", keys_dir=str(ring)), tmp_path / "a")
    first.make_keys()
    before = {p: p.read_bytes() for p in ring.rglob("*.key*")}
    again = LiveDemo(DemoSpec(prefix="skhq", keys_dir=str(ring)), tmp_path / "b")
    again.make_keys()
    assert {p: p.read_bytes() for p in ring.rglob("*.key*")} == before


def test_insecure_is_an_explicit_choice_and_says_so(tmp_path):
    demo = LiveDemo(DemoSpec(prefix="skhq", insecure=True), tmp_path)
    demo.make_keys()
    assert demo.ring is None and not (tmp_path / "keys").exists()
    for argv in (demo.controller_argv(), demo.analyzer_argv(), demo.underlay_argv(0)):
        assert "--insecure" in argv and "--enrol-socket" not in argv
    assert "--insecure" in demo.tail_command()
    assert demo.admin_security().insecure
    with pytest.raises(ConfigError, match="insecure"):
        DemoSpec(insecure=True, keys_dir=str(tmp_path))


def test_a_long_run_directory_gets_its_enrolment_sockets_elsewhere(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    demo = LiveDemo(DemoSpec(prefix="skhq"), deep)
    demo.make_keys()
    try:
        assert demo._own_enrol_dir
        assert len(_opt(demo.underlay_argv(0), "--enrol-socket")) <= 107
    finally:
        import shutil

        shutil.rmtree(demo.enrol_dir)


@pytest.mark.parametrize("kind", ALL_FAULTS)
def test_every_kind_has_a_script_the_testbed_accepts(kind, tmp_path):
    # the scripted parameters fit the injector's signature and name parts of the demo's testbed
    # (built only on paper here: no root)
    import inspect

    from skh.testbed.faults import Faults

    demo = LiveDemo(DemoSpec(prefix="skhq"), tmp_path)
    if kind in ("agent_crash", "agent_hang"):
        pytest.skip("needs a running agent's pid")
    params = demo.default_params(kind)
    inspect.signature(getattr(Faults, f"_inject_{kind}")).bind(None, 0, **params)
    fabric = demo.tb.fabric()
    nodes = {r.key for h in fabric.hosts.values() for r in h.rnics} | set(fabric.switches)
    for end in params.get("link", ()):
        assert end in nodes, (kind, end)
    for h in (
        params.get("host"),
        params.get("peer"),
        params.get("dst_host"),
        *params.get("hosts", ()),
    ):
        assert h is None or h in fabric.hosts
    if "container" in params:
        assert demo.tb.placement(params["container"])


@pytest.mark.root
@pytest.mark.netns
def test_the_demo_host_agent_reports_exited_containers_and_dead_or_hung_agents():
    import os
    import signal
    import subprocess
    import sys
    import time

    from skh.demo.agent import container_states

    if os.geteuid() != 0:
        pytest.skip("needs root")
    ns = f"{os.environ.get('SKH_TESTBED_PREFIX', 'skht')}-cs{os.getpid() % 1000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    agent = workload = None
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "vf0", "type", "veth", "peer", "name", "rep0"],
            check=True,
        )
        sleep = "import time; time.sleep(60)"
        # the container's workload and its agent (told apart by the agent's command line)
        workload = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", sleep])
        agent = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", sleep, "agent"])
        time.sleep(0.5)  # exec'd into python

        def state():
            got = container_states({"c": ns})
            return [k for k, v in got.items() if "c" in v]

        assert state() == []
        agent.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        assert state() == ["agents_late"]
        agent.kill()
        agent.wait()
        assert state() == ["agents_dead"]
        subprocess.run(["ip", "-n", ns, "link", "del", "vf0"], check=True)
        assert state() == ["containers_dead"]
    finally:
        for p in (agent, workload):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "del", ns], check=False)
