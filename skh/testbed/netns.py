"""Low-level network-namespace helpers: iproute2 batches, setns() from Python, sysctls, and the
processes living in a namespace.

Configuration goes through ``ip -b`` / ``ip -n NS -b`` / ``bridge -n NS -b`` batches (one
process per namespace, measured at about 1 s for 50 namespaces); reads and sockets go through
``setns()`` on the calling thread, which costs microseconds and needs no subprocess.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

from skh.collect.netdev import NETNS_DIR, in_netns
from skh.errors import TestbedError

__all__ = [
    "NETNS_DIR",
    "run",
    "ip_batch",
    "bridge_batch",
    "nft_apply",
    "list_netns",
    "in_netns",
    "socket_in",
    "write_sysctls",
    "netns_inode",
    "pids_in_netns",
    "proc_start_ticks",
    "terminate",
]

log = logging.getLogger(__name__)


def run(
    argv: Sequence[str], *, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """Run a command; on failure raise :class:`TestbedError` carrying its stderr."""
    try:
        res = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{' '.join(argv)}: {exc}") from exc
    if check and res.returncode != 0:
        first = (input or "").splitlines()[:3]
        raise TestbedError(
            f"{' '.join(argv)} failed (rc {res.returncode}): {res.stderr.strip()}"
            + (f" [batch starts {first}]" if first else "")
        )
    return res


def ip_batch(lines: Iterable[str], ns: str | None = None, *, check: bool = True) -> None:
    text = "\n".join(lines)
    if text:
        run(["ip", *(["-n", ns] if ns else []), "-b", "-"], input=text + "\n", check=check)


def bridge_batch(lines: Iterable[str], ns: str, *, check: bool = True) -> None:
    text = "\n".join(lines)
    if text:
        run(["bridge", "-n", ns, "-b", "-"], input=text + "\n", check=check)


def nft_apply(script: str, ns: str | None, *, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return run([*prefix, "nft", "-f", "-"], input=script, check=check)


def list_netns(prefix: str = "") -> list[str]:
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def socket_in(
    ns: str | None, family: int = socket.AF_INET, type: int = socket.SOCK_DGRAM, proto: int = 0
) -> socket.socket:
    """A socket that lives in namespace ``ns`` (usable from any thread afterwards)."""
    with in_netns(ns):
        return socket.socket(family, type, proto)


def write_sysctls(ns: str | None, values: Mapping[str, object]) -> None:
    """Write ``net.*`` sysctls (dotted names) inside namespace ``ns``; missing keys are skipped."""
    with in_netns(ns):
        for key, val in values.items():
            path = "/proc/sys/" + key.replace(".", "/")
            try:
                with open(path, "w") as f:
                    f.write(f"{val}\n")
            except FileNotFoundError:
                log.debug("sysctl %s absent", key)


def netns_inode(ns: str) -> int | None:
    try:
        return os.stat(f"{NETNS_DIR}/{ns}").st_ino
    except OSError:
        return None


def pids_in_netns(inodes: set[int]) -> list[int]:
    """Pids of every process whose network namespace is one of ``inodes``."""
    if not inodes:
        return []
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            link = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        # "net:[4026532281]"
        if int(link[5:-1]) in inodes:
            out.append(int(entry))
    return out


def proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (tells a pid apart from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: fields start after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    state = fields[0]
    if state in ("Z", "X"):
        return None
    return int(fields[19])


def terminate(pids: Iterable[int], *, grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; reaps our own children."""
    pids = [p for p in pids if p > 1 and p != os.getpid()]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
            os.kill(p, signal.SIGCONT)  # a stopped (hung) process handles SIGTERM only once resumed
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.02)
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    except OSError as exc:
        if exc.errno != errno.ECHILD:
            raise
    return proc_start_ticks(pid) is not None
