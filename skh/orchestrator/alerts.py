"""The alert bus: a durable append-only alert log, a PUB socket announcing each alert with its
sequence number, and replay of the log since a sequence number (served on the analyzer's REP
socket).

The log is JSON lines ``{"seq": n, "ts_ns": t, "alert": {...}}``, fsynced per alert before it is
published (alerts are rare and must not be lost). A torn last line left by a crash is cut off when
the log is reopened. Subscribers replay ``since`` their last sequence number, then follow the PUB
socket and replay again whenever they see a gap (:class:`AlertFollower`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import zmq

from skh.errors import ConfigError, ProtocolError
from skh.wire import ALERTS_TOPIC, Codec, MsgType

__all__ = ["AlertLog", "AlertFollower", "MAX_REPLAY"]

log = logging.getLogger(__name__)

MAX_REPLAY = 10_000  # alerts per replay reply; the subscriber asks again from the last one


class AlertLog:
    """Append-only, fsynced JSON-lines log with an in-memory offset index."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a+b")  # noqa: SIM115 - held for the daemon's life
        except OSError as exc:
            raise ConfigError(f"cannot open alert log {self.path}: {exc}") from exc
        self._offsets: list[int] = []  # offset of seq i+1
        self._open: dict[str, dict[str, Any]] = {}  # alert id -> its latest record, while open
        self._recover()

    def _recover(self) -> None:
        self._f.seek(0)
        good = 0
        for line in iter(self._f.readline, b""):
            try:
                rec = json.loads(line)
                ok = line.endswith(b"\n") and rec["seq"] == len(self._offsets) + 1
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                log.warning(
                    "alert log %s: cutting a torn or foreign record at byte %d", self.path, good
                )
                break
            self._offsets.append(good)
            self._track(rec)
            good += len(line)
        self._f.truncate(good)
        self._f.seek(0, os.SEEK_END)

    def _track(self, rec: Mapping[str, Any]) -> None:
        a = rec.get("alert")
        if not isinstance(a, Mapping) or not isinstance(a.get("alert_id"), str):
            return
        if a.get("state") == "open":
            self._open[a["alert_id"]] = dict(rec)
        elif a.get("state") == "resolved":
            self._open.pop(a["alert_id"], None)

    def open_alerts(self) -> list[dict[str, Any]]:
        """The latest record of every alert opened and not resolved yet, oldest first."""
        return sorted(self._open.values(), key=lambda r: r["seq"])

    @property
    def last_seq(self) -> int:
        return len(self._offsets)

    def append(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        # through JSON once: numpy scalars and other objects become plain values for msgpack too
        plain = json.loads(json.dumps(dict(alert), default=str))
        rec = {"seq": self.last_seq + 1, "ts_ns": time.time_ns(), "alert": plain}
        line = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
        self._f.seek(0, os.SEEK_END)
        off = self._f.tell()
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._offsets.append(off)
        self._track(rec)
        return rec

    def since(self, seq: int, limit: int = MAX_REPLAY) -> list[dict[str, Any]]:
        """Records with sequence number > ``seq``, oldest first, at most ``limit``."""
        start = max(0, seq)
        if start >= self.last_seq:
            return []
        self._f.seek(self._offsets[start])
        out = []
        for _ in range(min(limit, self.last_seq - start)):
            out.append(json.loads(self._f.readline()))
        self._f.seek(0, os.SEEK_END)
        return out

    def close(self) -> None:
        self._f.close()


class AlertFollower:
    """The reference subscriber: replay since N over REQ, then follow the PUB socket, replaying
    again on any sequence gap. Yields log records (``{"seq", "ts_ns", "alert"}``) in order,
    each once."""

    def __init__(
        self, ctx: zmq.Context, *, replay: str, alerts: str, security: Any, timeout_s: float = 5.0
    ) -> None:
        self._ctx = ctx
        self._replay_addr = replay
        self._security = security
        self._timeout_ms = int(timeout_s * 1000)
        self.codec = Codec()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        security.client(self.sub)
        self.sub.setsockopt(zmq.SUBSCRIBE, ALERTS_TOPIC)
        self.sub.connect(alerts)
        self.last = 0
        self._seq = 0

    def _replay(self) -> list[dict[str, Any]]:
        req = self._ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        self._security.client(req)
        req.connect(self._replay_addr)
        try:
            out = []
            while True:
                self._seq += 1
                req.send(
                    self.codec.encode(
                        MsgType.REPLAY, "alerts-tail", self._seq, {"since": self.last}
                    )
                )
                if not req.poll(self._timeout_ms):
                    raise ProtocolError(f"no replay answer from {self._replay_addr}")
                env = self.codec.decode(req.recv())
                if env.type is not MsgType.REPLAY_REPLY:
                    raise ProtocolError(f"replay answered with {env.type.value}")
                recs = [
                    r
                    for r in env.body["alerts"]
                    if isinstance(r, dict) and r.get("seq", 0) > self.last
                ]
                out += recs
                if recs:
                    self.last = recs[-1]["seq"]
                if not recs or self.last >= env.body["last_seq"]:
                    return out
        finally:
            req.close(0)

    def follow(
        self, since: int = 0, *, idle_timeout_s: float | None = None
    ) -> Iterator[dict[str, Any]]:
        self.last = since
        yield from self._replay()
        idle_ms = None if idle_timeout_s is None else int(idle_timeout_s * 1000)
        while True:
            if not self.sub.poll(idle_ms):
                return
            try:
                _topic, raw = self.sub.recv_multipart()
                env = self.codec.decode(raw)
            except (ValueError, ProtocolError):
                continue
            if env.type is not MsgType.ALERT:
                continue
            seq = env.body["seq"]
            if seq <= self.last:
                continue
            if seq > self.last + 1:
                yield from self._replay()  # a gap (slow joiner, HWM drop): the log has it all
                continue
            self.last = seq
            yield {"seq": seq, "ts_ns": env.body.get("ts_ns", 0), "alert": env.body["alert"]}

    def close(self) -> None:
        self.sub.close(0)
