"""The demo's settings, checked before anything is built (no root needed): fault kinds, the
keys directory and what it turns into for each daemon, and a script for every kind."""

from __future__ import annotations

import pytest

from skh.demo.live import ALL_FAULTS, KEY_FILES, DemoSpec, LiveDemo
from skh.errors import ConfigError
from skh.testbed.faults import KINDS


def test_all_faults_is_every_kind_the_testbed_injects():
    assert ALL_FAULTS == KINDS
    assert set(DemoSpec().faults) < set(ALL_FAULTS)


def test_an_unknown_fault_kind_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="fault kind"):
        DemoSpec(faults=("link_down", "meteor_strike"))
    with pytest.raises(ConfigError, match="fault kind"):
        DemoSpec(faults=())


def test_without_keys_every_link_is_plain_text_and_says_so():
    spec = DemoSpec()
    assert spec.security().insecure
    assert spec.security_args(server=True, client=True) == ["--insecure"]


def test_a_keys_directory_gives_each_daemon_its_curve_keys(tmp_path):
    from skh.orchestrator.security import generate_keypair

    with pytest.raises(ConfigError, match="server.key"):
        DemoSpec(keys_dir=str(tmp_path))
    generate_keypair(tmp_path, "server")
    generate_keypair(tmp_path, "client")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(KEY_FILES)
    spec = DemoSpec(keys_dir=str(tmp_path))
    sec = spec.security()
    assert not sec.insecure
    sec.check(server=False, client=True)
    server = spec.security_args(server=True, client=False)
    agent = spec.security_args(server=False, client=True)
    assert "--insecure" not in server + agent
    assert f"security.server_secret_key={tmp_path / 'server.key_secret'}" in server
    assert f"security.authorized_keys_dir={tmp_path}" in server
    assert f"security.client_secret_key={tmp_path / 'client.key_secret'}" in agent
    assert not any("secret_key" in a and "server" in a for a in agent if "client" not in a)


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
