"""The systemd units and the example config read as files: what must hold between them before
any systemd runs them (the VM test, test_systemd_vm.py, then runs them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from skh.orchestrator.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
EXAMPLE = ROOT / "deploy" / "skh.example.toml"


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values...]}}: keys may repeat, continuation lines join."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: cannot parse {line!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service(path: Path) -> dict[str, list[str]]:
    return read_unit(path)["Service"]


def one(svc: dict[str, list[str]], key: str) -> str:
    (value,) = svc[key]
    return value


def test_every_daemon_unit_notifies_and_is_watched():
    assert {u.name for u in UNITS} == {
        "skh-controller.service",
        "skh-analyzer.service",
        "skh-agent-underlay.service",
        "skh-agent-overlay@.service",
    }
    for unit in UNITS:
        svc = service(unit)
        assert one(svc, "Type") == "notify", unit.name
        assert one(svc, "NotifyAccess") == "main", unit.name
        assert one(svc, "WatchdogSec") == "30", unit.name
        assert one(svc, "Restart") in ("on-failure", "always"), unit.name
        assert one(svc, "ExecStart").startswith("/usr/bin/skh "), unit.name


def test_secret_keys_reach_the_daemons_as_credentials():
    """A unit never names a root-only key for the daemon to open itself: it loads the file as a
    credential and points the setting at the copy (%d/NAME), or, the overlay template, lets the
    agent make its own key in its private runtime directory (docs/trust.md)."""
    for unit in UNITS:
        svc = service(unit)
        creds = dict(c.split(":", 1) for c in svc.get("LoadCredential", []))
        for src in creds.values():
            assert src.startswith("/etc/skh/keys/") and src.endswith(".key_secret"), src
        cmd = one(svc, "ExecStart")
        used = re.findall(r"--set security\.\w+_secret_key=%d/(\S+)", cmd)
        assert set(used) == set(creds), (unit.name, used, creds)
        assert "/etc/skh/keys" not in cmd, unit.name
        if not creds:  # the key is made at start, where only this service can reach it
            (made,) = re.findall(r"--set security\.client_secret_key=(\S+)", cmd)
            rundir = one(svc, "RuntimeDirectory")
            assert made.startswith(f"/run/{rundir}/"), (unit.name, made)
            assert one(svc, "RuntimeDirectoryMode") == "0700", unit.name
        # the daemon runs unprivileged either way
        assert svc.get("DynamicUser") == ["yes"] or one(svc, "User") == "skh", unit.name


def test_dynamic_users_keep_their_state_apart_and_the_example_config_points_there():
    """Two DynamicUser= units sharing a StateDirectory would chown it back and forth: each has
    its own, and the example config keeps the controller's registry and the analyzer's alert
    log inside them."""
    state = {
        u.name: one(service(u), "StateDirectory")
        for u in UNITS
        if service(u).get("DynamicUser") == ["yes"]
    }
    assert len(set(state.values())) == len(state) == 2, state
    cfg = tomllib.loads(EXAMPLE.read_text())
    var = Path("/var/lib")
    assert Path(cfg["controller"]["db"]).parent == var / state["skh-controller.service"]
    assert Path(cfg["analyzer"]["alert_log"]).parent == var / state["skh-analyzer.service"]


def test_the_example_config_loads():
    cfg = load_config(str(EXAMPLE))
    assert cfg.analyzer.detector == "pipeline"
    # the controller plans link by link from the fabric the analyzer localizes on
    assert cfg.controller.fabric and cfg.controller.fabric == cfg.analyzer.fabric


def test_the_agents_user_and_the_key_directories_are_declared():
    users = {
        line.split()[1]
        for line in (SYSTEMD / "skh.sysusers.conf").read_text().splitlines()
        if line.startswith("u ")
    }
    static = {one(service(u), "User") for u in UNITS if "User" in service(u)}
    assert static == {"skh"} and static <= users
    # public keys must stay reachable for the unprivileged daemons (a keygen into a missing
    # directory would make it 0700)
    dirs = {
        line.split()[1]: line.split()[2]
        for line in (SYSTEMD / "skh.tmpfiles.conf").read_text().splitlines()
        if line.startswith("d ")
    }
    assert dirs == {"/etc/skh": "0755", "/etc/skh/keys": "0755", "/etc/skh/keys/trusted": "0755"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_sandbox_is_declared(unit):
    """The sandbox the VM test measures with systemd-analyze security (its exposure ceilings
    hold only while these stay): no unit may drop them silently."""
    svc = service(unit)
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "LockPersonality"):
        assert svc.get(key) == ["yes"], (unit.name, key)
    assert svc.get("ProtectSystem") == ["strict"], unit.name
    assert "CapabilityBoundingSet" in svc and "RestrictAddressFamilies" in svc, unit.name
