"""A small sd_notify(3) client: READY, STATUS, STOPPING and WATCHDOG without libsystemd.

systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace) and, with
``WatchdogSec=``, ``WATCHDOG_USEC``. Outside systemd every call is a no-op, so daemons call it
unconditionally.
"""

from __future__ import annotations

import logging
import os
import socket
import time

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """Sends state datagrams to systemd and paces watchdog pings at half the watchdog period."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr = ("\0" + addr[1:]) if addr.startswith("@") else addr
        self._sock: socket.socket | None = None
        if self._addr:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID, when set, names the process the watchdog is meant for
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval_s = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else 0.0
        )
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False (and a debug log) when it fails."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(fields).encode(), self._addr)
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *((f"STATUS={status}",) if status else ()))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog_due(self) -> float:
        """When :meth:`watchdog` next pings (monotonic s; infinity without a watchdog), for a
        loop that sleeps until its next timer."""
        if not self.watchdog_interval_s or self._sock is None:
            return float("inf")
        return self._last_ping + self.watchdog_interval_s

    def watchdog(self, *, now: float | None = None) -> bool:
        """Ping the watchdog if half its period passed since the last ping; call it every loop
        iteration (a hung loop then stops pinging and systemd restarts the daemon)."""
        if not self.watchdog_interval_s or self._sock is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_ping < self.watchdog_interval_s:
            return False
        self._last_ping = now
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
