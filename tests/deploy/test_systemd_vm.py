"""The shipped systemd units under a real systemd (PID 1 of the systemd VM, ``make test-systemd``).

Installed the way an operator would: the skh wheel built from this tree (tools/systemd-vm/
stage-skh.sh) as the system Python's package with /usr/bin/skh, the units copied unmodified from
deploy/systemd/, the agents' system user from skh.sysusers.conf, root-owned 0600 secret keys in
/etc/skh/keys, one config per daemon. Then every unit is started with systemctl and judged by
what systemd says (ActiveState, StatusText, NRestarts, Result) and by what the daemons did (agents
registered over CURVE with the keys they were handed, the overlay agent inside its container's
namespace).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
pytestmark = [
    pytest.mark.systemd,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.system,
    pytest.mark.timeout(900),
]

STAGE = Path(os.environ.get("SKH_STAGE", ROOT / "build" / "systemd-vm"))
KEYS = Path("/etc/skh/keys")
CONTAINER = "c1"  # the overlay template's instance: the container's network namespace
HOST_IP, CONTAINER_IP = "192.0.2.1", "192.0.2.2"  # a veth pair inside the VM (no NIC there)
UNDERLAY = "skh-agent-underlay.service"
OVERLAY = f"skh-agent-overlay@{CONTAINER}.service"
CONTROLLER, ANALYZER = "skh-controller.service", "skh-analyzer.service"
ALL = (CONTROLLER, ANALYZER, UNDERLAY, OVERLAY)
HOST = "skhvm"  # the VM's host name (%H in the underlay unit)
#: each unit's secret key: its file under /etc/skh/keys and the credential name it is handed as
#: (the overlay agent has none: it makes its key at start and enrols it)
SECRET = {
    CONTROLLER: ("controller.key_secret", "controller.key_secret"),
    ANALYZER: ("analyzer.key_secret", "analyzer.key_secret"),
    UNDERLAY: (f"ul-{HOST}.key_secret", "ul.key_secret"),
}
SIDECAR_KEY = Path(f"/run/skh-overlay/{CONTAINER}/sidecar.key_secret")
CONTROLLER_METRICS, ANALYZER_METRICS = 9470, 9472
#: a daemon under TCG emulation takes ~30 s to import numpy, zmq and skh; four start together
START_TIMEOUT_S = 300.0


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def show(unit: str, *props: str) -> dict[str, str]:
    out = run("systemctl", "show", "-p", ",".join(props), unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(unit: str) -> str:
    return run("journalctl", "-b", "-u", unit, "--no-pager", "-o", "cat").stdout


def wait_until(what: str, pred, timeout_s: float, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def _install_package() -> None:
    """The staged wheel as the system Python's package; its third-party dependencies come from
    the project's venv (the VM has no network for pip), both mounted read-only under /usr."""
    site = STAGE / "site"
    if not (site / "skh").is_dir():
        pytest.fail(f"no staged package in {site}: run tools/systemd-vm/stage-skh.sh first")
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    sys_ver = run("/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
    if sys_ver.stdout.strip() != ver:
        pytest.fail(f"/usr/bin/python3 is {sys_ver.stdout.strip()}, the venv {ver}")
    dist = Path(f"/usr/local/lib/python{ver}/dist-packages")
    dist.mkdir(parents=True, exist_ok=True)
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(dist))  # nothing else of the host's
    for entry in site.iterdir():
        if entry.name != "bin":
            (dist / entry.name).mkdir()
            run("mount", "--bind", "-o", "ro", str(entry), str(dist / entry.name))
    deps = Path("/usr/lib/skh-deps")
    deps.mkdir(exist_ok=True)
    run("mount", "--bind", "-o", "ro", sysconfig.get_paths()["purelib"], str(deps))
    (dist / "skh-deps.pth").write_text(f"{deps}\n")
    script = (site / "bin" / "skh").read_text().split("\n", 1)[1]
    Path("/usr/bin/skh").write_text("#!/usr/bin/python3\n" + script)
    Path("/usr/bin/skh").chmod(0o755)


def _keys() -> None:
    """As the operator makes them (docs/trust.md; `skh config keygen` is this function): the
    controller's, the analyzer's and this host's underlay identity, the last two trusted."""
    from skh.orchestrator.security import generate_keypair

    generate_keypair(KEYS, "controller")
    for name, meta in (
        ("analyzer", {"role": "analyzer"}),
        (f"ul-{HOST}", {"role": "underlay", "host": HOST}),
    ):
        public, _secret = generate_keypair(KEYS, name, metadata=meta)
        shutil.copy(public, KEYS / "trusted" / public.name)


def _configs() -> None:
    # no secret key paths: the units pass them (credentials, or made at start)
    security = f"""
[security]
authorized_keys_dir = "{KEYS}/trusted"
server_public_key = "{KEYS}/controller.key"
analyzer_public_key = "{KEYS}/analyzer.key"
"""
    agent = f"""
[agent]
controller = "tcp://{HOST_IP}:5550"
controller_pub = "tcp://{HOST_IP}:5551"
analyzer = "tcp://{HOST_IP}:5560"
"""
    Path("/etc/skh/skh.toml").write_text(
        f"""
[controller]
bind = "tcp://0.0.0.0:5550"
pub_bind = "tcp://0.0.0.0:5551"
db = "/var/lib/skh-controller/registry.db"
metrics = "127.0.0.1:{CONTROLLER_METRICS}"
[analyzer]
bind = "tcp://0.0.0.0:5560"
alerts_bind = "tcp://127.0.0.1:5561"
replay_bind = "tcp://127.0.0.1:5562"
alert_log = "/var/lib/skh-analyzer/alerts.log"
detector = "detect"
controller = "tcp://127.0.0.1:5550"
metrics = "127.0.0.1:{ANALYZER_METRICS}"
{security}"""
    )
    Path("/etc/skh/agent.toml").write_text(
        f"""{agent}
sources = [{{endpoint = "train-1/{CONTAINER}/0", kind = "netdev", netdev = "vh-{CONTAINER}"}}]
containers = [{{job = "train-1", container = "{CONTAINER}", netns = "{CONTAINER}"}}]
{security}"""
    )
    Path("/etc/skh/overlay").mkdir(mode=0o755)
    Path(f"/etc/skh/overlay/{CONTAINER}.toml").write_text(
        f"""{agent}
job = "train-1"
container = "{CONTAINER}"
endpoints = [{{rail = 0, ip = "{CONTAINER_IP}", netdev = "vc-{CONTAINER}"}}]
{security}"""
    )


def _container_netns() -> None:
    c = CONTAINER
    run("ip", "netns", "add", c)
    run("ip", "link", "add", f"vh-{c}", "type", "veth", "peer", "name", f"vc-{c}")
    run("ip", "link", "set", f"vc-{c}", "netns", c)
    run("ip", "addr", "add", f"{HOST_IP}/24", "dev", f"vh-{c}")
    run("ip", "link", "set", f"vh-{c}", "up")
    run("ip", "-n", c, "addr", "add", f"{CONTAINER_IP}/24", "dev", f"vc-{c}")
    run("ip", "-n", c, "link", "set", f"vc-{c}", "up")
    run("ip", "-n", c, "link", "set", "lo", "up")


def _inside_the_vm() -> bool:
    """This module installs packages, users, keys and units system-wide: only ever inside the
    throw-away VM, whatever the markers say."""
    virt = subprocess.run(["systemd-detect-virt", "--vm"], capture_output=True, text=True)
    return (
        os.environ.get("SYSVM") == "1"
        and Path("/run/systemd/system").is_dir()  # systemd is PID 1
        and virt.stdout.strip() == "qemu"
    )


@pytest.fixture(scope="module")
def installed():
    if not _inside_the_vm():
        pytest.skip("changes the whole system: runs only inside the systemd VM")
    _install_package()
    sysusers = Path("/usr/lib/sysusers.d/skh.conf")
    shutil.copy(DEPLOY / "systemd" / "skh.sysusers.conf", sysusers)
    run("systemd-sysusers", str(sysusers))
    tmpfiles = Path("/usr/lib/tmpfiles.d/skh.conf")
    shutil.copy(DEPLOY / "systemd" / "skh.tmpfiles.conf", tmpfiles)
    run("systemd-tmpfiles", "--create", str(tmpfiles))
    _keys()
    _configs()
    _container_netns()
    for unit in (DEPLOY / "systemd").glob("*.service"):
        shutil.copy(unit, Path("/etc/systemd/system") / unit.name)
        # The one change: emulated (TCG) CPUs import Python 20-40x slower than a host, four
        # daemons at once; the default 90 s start timeout is a host's.
        dropin = Path("/etc/systemd/system") / f"{unit.name}.d"
        dropin.mkdir()
        (dropin / "vm.conf").write_text(f"[Service]\nTimeoutStartSec={START_TIMEOUT_S:.0f}\n")
    run("systemctl", "daemon-reload")


@pytest.fixture(scope="module")
def started(installed):
    """Every unit started at once; returns {unit: seconds from start to READY=1}."""
    t0 = time.monotonic()
    run("systemctl", "start", "--no-block", *ALL)
    took = {}

    def settled():
        for unit in ALL:
            if unit in took:
                continue
            st = show(unit, "ActiveState", "SubState", "NRestarts")
            if st["ActiveState"] == "active":
                took[unit] = time.monotonic() - t0
            elif st["ActiveState"] in ("failed", "deactivating") or st["NRestarts"] != "0":
                raise AssertionError(f"{unit} failed to start:\n{journal(unit)[-3000:]}")
        return len(took) == len(ALL)

    wait_until("every unit to report READY=1", settled, START_TIMEOUT_S)
    print(f"start to READY=1: { {u: round(s, 1) for u, s in took.items()} }")
    return took


def _main_pid(unit: str) -> int:
    return int(show(unit, "MainPID")["MainPID"])


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))


def test_every_unit_reaches_ready(started):
    expect = {
        CONTROLLER: r"^epoch \S+, \d+ endpoints$",
        ANALYZER: r"^alert log at seq \d+$",
        UNDERLAY: r"^1 counter sources$",
        OVERLAY: r"^1 endpoints$",
    }
    for unit in ALL:
        st = show(
            unit, "Type", "ActiveState", "SubState", "StatusText", "NRestarts", "WatchdogUSec"
        )
        assert st["Type"] == "notify", unit
        assert (st["ActiveState"], st["SubState"]) == ("active", "running"), (unit, st)
        assert re.match(expect[unit], st["StatusText"]), (unit, st["StatusText"])
        assert st["NRestarts"] == "0", (unit, st)
        assert st["WatchdogUSec"] == "30s", (unit, st)


def test_root_only_keys_reach_unprivileged_daemons_as_credentials(started):
    for unit, (path, cred) in SECRET.items():
        key = KEYS / path
        st = key.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600), (key, oct(st.st_mode))
        pid = _main_pid(unit)
        uid = _uid(pid)
        assert uid != 0, f"{unit} runs as root"
        env = dict(
            kv.split("=", 1)
            for kv in Path(f"/proc/{pid}/environ").read_text().split("\0")
            if "=" in kv
        )
        creds = Path(env["CREDENTIALS_DIRECTORY"])
        copy = (creds / cred).stat()
        assert copy.st_uid == uid and copy.st_mode & 0o077 == 0, (unit, oct(copy.st_mode))
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert any(a.endswith(f"={creds}/{cred}") for a in argv), argv
    # the overlay agent's own key, made at start where only its user can reach it
    uid = _uid(_main_pid(OVERLAY))
    assert uid != 0
    for path, mode in ((SIDECAR_KEY, 0o600), (SIDECAR_KEY.parent, 0o700)):
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (uid, mode), (path, oct(st.st_mode))


def test_a_dynamic_user_cannot_open_a_root_only_key(installed):
    """Why the units use LoadCredential=: the same transient user, handed the path only, fails."""
    done = run(
        "systemd-run", "--wait", "--pipe", "--quiet", "-p", "DynamicUser=yes",
        "/bin/cat", str(KEYS / "controller.key_secret"),
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Permission denied" in done.stderr


def scrape(port: int) -> dict[str, float]:
    """A daemon's Prometheus endpoint as {'name{labels}': value} (plain HTTP: the test process
    needs no numpy or zmq for it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_agents_register_and_report_with_the_keys_they_were_handed(started):
    """CURVE both ways, with each daemon's own identity: the overlay agent's key was enrolled
    through the underlay agent (READY=1 waits for that), the controller counts both agents
    alive, and the analyzer takes their batches (it learns what each key owns from the
    controller, under its own identity)."""
    assert "key enrolled through /run/skh/enrol.sock" in journal(OVERLAY)
    assert scrape(CONTROLLER_METRICS).get('skh_controller_events_total{kind="enrolled"}') == 1.0

    def agents_alive():
        m = scrape(CONTROLLER_METRICS)
        return all(
            m.get(f'skh_controller_agents{{role="{role}",state="alive"}}') == 1.0
            for role in ("underlay", "overlay")
        )

    wait_until("both agents registered and alive", agents_alive, 60)

    def batches():
        m = scrape(ANALYZER_METRICS)
        return m.get('skh_analyzer_events_total{kind="batches"}', 0) >= 2 and m

    wait_until("batches from the agents at the analyzer", batches, 60)
    assert "registered with controller epoch" in journal(UNDERLAY)
    assert "registered with controller epoch" in journal(OVERLAY)


def test_overlay_agent_runs_in_its_container_netns(started):
    pid = _main_pid(OVERLAY)
    inside = os.stat(f"/proc/{pid}/ns/net")
    container = os.stat(f"/run/netns/{CONTAINER}")
    host = os.stat("/proc/1/ns/net")
    assert (inside.st_dev, inside.st_ino) == (container.st_dev, container.st_ino)
    assert inside.st_ino != host.st_ino
    assert os.stat(f"/proc/{_main_pid(UNDERLAY)}/ns/net").st_ino == host.st_ino


def test_controller_and_analyzer_keep_their_state_apart(started):
    for unit, path in (
        (CONTROLLER, "/var/lib/skh-controller/registry.db"),
        (ANALYZER, "/var/lib/skh-analyzer/alerts.log"),
    ):
        uid = _uid(_main_pid(unit))
        f = Path(path)
        wait_until(f"{path} written", f.exists, 30)
        assert f.stat().st_uid == uid, (path, f.stat().st_uid, uid)
        assert f.parent.resolve().stat().st_uid == uid


def test_a_hung_daemon_is_restarted_by_its_watchdog(started):
    """SIGSTOP every daemon: its loop stops pinging, systemd kills it after WatchdogSec (30 s)
    and starts it again, and the new one reaches READY=1 on its own."""
    before = {unit: show(unit, "MainPID", "NRestarts") for unit in ALL}
    t0 = time.monotonic()
    for st in before.values():
        os.kill(int(st["MainPID"]), signal.SIGSTOP)
    took = {}

    def restarted():
        for unit in ALL:
            st = show(unit, "ActiveState", "MainPID", "NRestarts")
            again = int(st["NRestarts"]) == int(before[unit]["NRestarts"]) + 1
            if unit not in took and again and st["ActiveState"] == "active":
                assert st["MainPID"] != before[unit]["MainPID"]
                took[unit] = time.monotonic() - t0
        return len(took) == len(ALL)

    wait_until("every daemon restarted and READY again", restarted, 30 + START_TIMEOUT_S)
    print(f"SIGSTOP to READY=1 again: { {u: round(s, 1) for u, s in took.items()} }")
    for unit in ALL:
        assert "Watchdog timeout (limit 30s)!" in journal(unit), unit
    # systemd counts WatchdogSec (30 s) from the last ping, and a daemon pings every half period
    # (skh.orchestrator.sdnotify): the kill comes 15-30 s after SIGSTOP, never sooner
    # (a run of stop 25's CI dry run: the controller was READY again 29.2 s after SIGSTOP)
    assert min(took.values()) >= 30 / 2, took


def test_units_pass_systemd_analyze_verify(installed):
    units = [f"/etc/systemd/system/{u.name}" for u in (DEPLOY / "systemd").glob("*.service")]
    done = run("systemd-analyze", "verify", *units, check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


#: `systemd-analyze security` exposure (0 safest .. 10): what the units reach, as a ceiling
EXPOSURE_MAX = {CONTROLLER: 2.5, ANALYZER: 2.5, UNDERLAY: 6.0, OVERLAY: 5.0}


def test_units_exposure_stays_low(installed):
    for unit, ceiling in EXPOSURE_MAX.items():
        out = run("systemd-analyze", "security", "--no-pager", unit).stdout
        level = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
        print(f"{unit}: exposure {level}")
        assert level <= ceiling, (unit, level, out[-2000:])


def test_units_stop_cleanly(started):
    run("systemctl", "stop", *ALL)
    for unit in ALL:
        st = show(unit, "ActiveState", "Result", "ExecMainStatus")
        assert st["ActiveState"] == "inactive", (unit, st)
        assert st["Result"] == "success" and st["ExecMainStatus"] == "0", (unit, st)
