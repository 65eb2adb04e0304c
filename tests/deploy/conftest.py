"""Deployment tests. ``systemd``-marked ones need a real systemd as PID 1 and run inside the
systemd VM (``make test-systemd``: tools/systemd-vm/run-in-systemd-vm.sh). Outside the VM they are
skipped with the reason; inside it (SYSVM=1) they must run. Unmarked tests (manifests, unit
files read as text) run everywhere."""

from __future__ import annotations

import os

import pytest

IN_VM = os.environ.get("SYSVM") == "1"


def pytest_collection_modifyitems(config, items):
    if IN_VM:
        return
    skip = pytest.mark.skip(reason="needs a real systemd as PID 1 (SYSVM=1): `make test-systemd`")
    for item in items:
        if "systemd" in item.keywords:
            item.add_marker(skip)
