"""Port flapping: take a device down and up in a loop (run inside its namespace).

``python -m skh.testbed.flap --dev DEV --down-s D --up-s U [--restore LINE]...``: every cycle
sets DEV admin-down for D seconds, then up for U seconds. Routes through an admin-down device are
flushed by the kernel, so each ``--restore`` line (an ``ip -b`` line such as ``route replace ...``)
is re-applied after every up. On SIGTERM the device is left up and restored.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time


def _set(dev: str, up: bool, restore: list[str]) -> None:
    subprocess.run(["ip", "link", "set", dev, "up" if up else "down"], check=False)
    if up and restore:
        subprocess.run(
            ["ip", "-force", "-b", "-"],
            input="\n".join(restore) + "\n",
            text=True,
            check=False,
            capture_output=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m skh.testbed.flap", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--dev", required=True)
    ap.add_argument("--down-s", type=float, required=True)
    ap.add_argument("--up-s", type=float, required=True)
    ap.add_argument("--restore", action="append", default=[])
    a = ap.parse_args(argv)
    if a.down_s <= 0 or a.up_s <= 0:
        ap.error("need positive --down-s and --up-s")

    def stop(*_: object) -> None:
        _set(a.dev, True, a.restore)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    while True:
        _set(a.dev, False, a.restore)
        time.sleep(a.down_s)
        _set(a.dev, True, a.restore)
        time.sleep(a.up_s)


if __name__ == "__main__":
    raise SystemExit(main())
