"""Helpers shared by the demo tests (imported after tests/demo is put on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path

from skh.testbed.spec import owns


def leftovers(prefix: str, run_dir: Path) -> dict[str, list]:
    """The interfaces, namespaces and processes of testbed ``prefix`` or run ``run_dir`` that
    still exist (teardown must leave none)."""
    links = [n for n in os.listdir("/sys/class/net") if owns(prefix, n)]
    netns = [
        n
        for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
        if owns(prefix, n)
    ]
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        if int(pid) != os.getpid() and (str(run_dir) in cmd or f"/{prefix}/" in cmd):
            procs.append((int(pid), cmd))
    return {"links": links, "netns": netns, "processes": procs}
