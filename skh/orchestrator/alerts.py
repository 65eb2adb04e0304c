"""The alert bus: a durable append-only alert log, a PUB socket announcing each alert with its
sequence number, and replay of the log since a sequence number (served on the analyzer's REP
socket). ``docs/alerts.md`` is the contract for subscribers; this module is its implementation.

The log is JSON lines ``{"seq": n, "ts_ns": t, "schema": "1.0", "alert": {...}}``, fsynced per
alert before it is published (alerts are rare and must not be lost). A torn last line left by a
crash is cut off when the log is reopened.

Rotation and retention: the active file (``alert_log``) is renamed to ``<alert_log>.<first seq,
20 digits>`` once it holds ``segment_bytes``; rotated segments older than ``retention_s`` (by
their newest record) or beyond ``retention_bytes`` in total are deleted, oldest first. Sequence
numbers never restart: the new active file continues where the rotated one ended, and a restart
finds the last number in the active file or, if that is still empty, in the newest segment.
Alerts still open when their segment is deleted are carried in ``<alert_log>.open`` (written
before the delete), so :meth:`AlertLog.open_alerts` knows every open alert whatever retention
removed.

Subscribers replay ``since`` their last sequence number, then follow the PUB socket and replay
again whenever they see a gap (:class:`AlertFollower`). A replay answer is one page (at most
``MAX_REPLAY`` records and ``MAX_REPLAY_BYTES``); ``first_seq`` in it says where the retained log
starts, so a subscriber that was away longer than the retention knows what it lost.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from skh.errors import ConfigError, ProtocolError
from skh.orchestrator.daemon import poll_ms
from skh.wire import ALERTS_TOPIC, Codec, MsgType

__all__ = [
    "ALERT_SCHEMA_VERSION",
    "AlertLog",
    "AlertFollower",
    "MAX_RECORD_BYTES",
    "MAX_REPLAY",
    "MAX_REPLAY_BYTES",
    "Retention",
    "alert_schema",
    "idempotency_key",
]

log = logging.getLogger(__name__)

#: version of the alert schema (``alert.schema.json``), carried in every record. MINOR grows when
#: optional fields or enum values are added (subscribers ignore what they do not know); MAJOR
#: when a field changes meaning, type or is removed.
ALERT_SCHEMA_VERSION = "1.0"
MAX_REPLAY = 10_000  # alerts per replay page; the subscriber asks again from the last one
#: bytes of log records per replay page: a page stays far below the 16 MiB frame limit
MAX_REPLAY_BYTES = 4 * 1024 * 1024
#: one record in the log (as JSON); larger alerts have their longest lists cut (``truncated``)
MAX_RECORD_BYTES = 1024 * 1024

_SEGMENT_DIGITS = 20


def alert_schema() -> dict[str, Any]:
    """The JSON Schema of one log record (and of the ALERT body), shipped with the package."""
    from importlib.resources import files

    return json.loads(files("skh.orchestrator").joinpath("alert.schema.json").read_text())


def idempotency_key(rec: Mapping[str, Any]) -> str:
    """``alert_id|state|seq`` of a log record: what bridges hand receivers so that the
    duplicates at-least-once delivery allows can be dropped."""
    a = rec["alert"]
    return f"{a.get('alert_id', '')}|{a.get('state', '')}|{rec['seq']}"


@dataclass(frozen=True, slots=True)
class Retention:
    """How the alert log rotates and what it keeps (``0`` = no limit of that kind)."""

    segment_bytes: int = 16 * 1024 * 1024
    retention_s: float = 30 * 86400.0
    retention_bytes: int = 1024 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.segment_bytes < 4096:
            raise ConfigError(
                "The 'analyzer.alert_log_segment_bytes' setting must be >= 4096. "
                f"Got {self.segment_bytes!r} instead."
            )
        if self.retention_s < 0 or self.retention_bytes < 0:
            raise ConfigError(
                "The 'analyzer.alert_log_retention_s/_bytes' settings must be >= 0 (0 = no limit). "
                f"Got {self.retention_s!r} s, {self.retention_bytes!r} bytes instead."
            )


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int  # seq of its first record (of the next one, while empty)
    offsets: array  # byte offset of each record
    size: int
    last_ts_ns: int = 0

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.offsets) - 1


class AlertLog:
    """Append-only, fsynced JSON-lines log in rotating segments, with an in-memory offset index
    and the set of open alerts (``state`` "open" not yet followed by "resolved")."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self._open_path = self.path.with_name(self.path.name + ".open")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a+b")  # noqa: SIM115 - held for the daemon's life
        except OSError as exc:
            raise ConfigError(f"cannot open alert log {self.path}: {exc}") from exc
        self._open: dict[str, dict[str, Any]] = {}
        self._segments: list[_Segment] = []  # rotated, oldest first; the active one is last
        self._recover()

    # -- recovery --------------------------------------------------------------------------------
    def _rotated_paths(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.path.parent.glob(self.path.name + ".*"):
            suffix = p.name[len(self.path.name) + 1 :]
            if len(suffix) == _SEGMENT_DIGITS and suffix.isdigit():
                out.append((int(suffix), p))
        return sorted(out)

    def _scan(self, f: Any, seg: _Segment, *, active: bool) -> None:
        """Index ``f``'s records into ``seg``; a record out of sequence ends the segment (the
        active one is cut there: a torn write)."""
        f.seek(0)
        good = 0
        for line in iter(f.readline, b""):
            try:
                rec = json.loads(line)
                ok = line.endswith(b"\n") and isinstance(rec["seq"], int)
                if ok and not seg.offsets and active and rec["seq"] > seg.first_seq:
                    log.warning(
                        "alert log %s: starts at seq %d, %d expected: a segment is missing",
                        self.path,
                        rec["seq"],
                        seg.first_seq,
                    )
                    seg.first_seq = rec["seq"]
                ok = ok and rec["seq"] == seg.first_seq + len(seg.offsets)
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                log.warning(
                    "alert log %s: a torn or foreign record at byte %d%s",
                    seg.path,
                    good,
                    ", cut" if active else "; the rest of this segment is not served",
                )
                break
            seg.offsets.append(good)
            seg.last_ts_ns = int(rec.get("ts_ns", 0))
            self._track(rec)
            good += len(line)
        seg.size = good
        if active:
            f.truncate(good)
            f.seek(0, os.SEEK_END)

    def _recover(self) -> None:
        carried = self._load_open()
        for rec in carried.get("open", ()):
            self._track(rec)
        next_seq = int(carried.get("last_seq", 0)) + 1
        for first, p in self._rotated_paths():
            seg = _Segment(p, max(first, next_seq), array("q"), 0)
            if first < next_seq:
                log.warning("alert log segment %s overlaps its predecessor: skipped", p)
                continue
            with open(p, "rb") as f:
                self._scan(f, seg, active=False)
            if seg.offsets:
                self._segments.append(seg)
                next_seq = seg.last_seq + 1
        active = _Segment(self.path, next_seq, array("q"), 0)
        self._scan(self._f, active, active=True)
        self._segments.append(active)

    def _load_open(self) -> dict[str, Any]:
        try:
            data = json.loads(self._open_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning(
                "alert log: cannot read %s (%s): carried open alerts lost", self._open_path, exc
            )
            return {}
        return data if isinstance(data, dict) else {}

    def _track(self, rec: Mapping[str, Any]) -> None:
        a = rec.get("alert")
        if not isinstance(a, Mapping) or not isinstance(a.get("alert_id"), str):
            return
        if a.get("state") == "open":
            self._open[a["alert_id"]] = dict(rec)
        elif a.get("state") == "resolved":
            self._open.pop(a["alert_id"], None)

    # -- reading -----------------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        return self._segments[-1].last_seq

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still in the log (``last_seq + 1`` when it is empty)."""
        for seg in self._segments:
            if seg.offsets:
                return seg.first_seq
        return self.last_seq + 1

    def open_alerts(self) -> list[dict[str, Any]]:
        """The latest record of every alert opened and not resolved yet, oldest first."""
        return sorted(self._open.values(), key=lambda r: r["seq"])

    def since(
        self, seq: int, limit: int = MAX_REPLAY, max_bytes: int = MAX_REPLAY_BYTES
    ) -> list[dict[str, Any]]:
        """Records with sequence number > ``seq``, oldest first: at most ``limit`` of them and
        ``max_bytes`` of log (one record at least)."""
        out: list[dict[str, Any]] = []
        want = max(seq + 1, self.first_seq)
        used = 0
        i = max(0, bisect.bisect_right([s.first_seq for s in self._segments], want) - 1)
        for seg in self._segments[i:]:
            if len(out) >= limit or not seg.offsets or want > seg.last_seq:
                continue
            k = max(0, want - seg.first_seq)
            f = self._f if seg is self._segments[-1] else open(seg.path, "rb")  # noqa: SIM115
            try:
                f.seek(seg.offsets[k])
                while k < len(seg.offsets) and len(out) < limit:
                    line = f.readline()
                    used += len(line)
                    if out and used > max_bytes:
                        return out
                    out.append(json.loads(line))
                    k += 1
            finally:
                if f is self._f:
                    f.seek(0, os.SEEK_END)
                else:
                    f.close()
            want = seg.last_seq + 1
        return out

    def replay(self, since: int, limit: int = MAX_REPLAY) -> dict[str, Any]:
        """The REPLAY_REPLY body: one page of records after ``since``, the last sequence number
        and where the retained log starts."""
        return {
            "alerts": self.since(since, max(1, min(limit, MAX_REPLAY))),
            "last_seq": self.last_seq,
            "first_seq": self.first_seq,
        }

    # -- writing ------------------------------------------------------------------------------
    def append(self, alert: Mapping[str, Any]) -> dict[str, Any]:
        # through JSON once: numpy scalars and other objects become plain values for msgpack too
        plain = json.loads(json.dumps(dict(alert), default=str))
        rec = {
            "seq": self.last_seq + 1,
            "ts_ns": time.time_ns(),
            "schema": ALERT_SCHEMA_VERSION,
            "alert": plain,
        }
        line = _fit(rec)
        active = self._segments[-1]
        if active.offsets and active.size + len(line) > self.retention.segment_bytes:
            active = self._rotate()
        off = active.size
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())
        active.offsets.append(off)
        active.size += len(line)
        active.last_ts_ns = rec["ts_ns"]
        self._track(rec)
        self.prune(rec["ts_ns"])
        return rec

    def _rotate(self) -> _Segment:
        """Close the active file as a segment named by its first seq; start an empty one."""
        old = self._segments[-1]
        final = self.path.with_name(f"{self.path.name}.{old.first_seq:0{_SEGMENT_DIGITS}d}")
        self._f.close()
        os.replace(self.path, final)
        _fsync_dir(self.path.parent)
        old.path = final
        self._f = open(self.path, "a+b")  # noqa: SIM115 - held for the daemon's life
        new = _Segment(self.path, old.last_seq + 1, array("q"), 0)
        self._segments.append(new)
        log.info("alert log rotated at seq %d into %s", old.last_seq, final.name)
        return new

    def prune(self, now_ns: int | None = None) -> int:
        """Delete rotated segments past the retention (never the active one); returns how many."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        r = self.retention
        total = sum(s.size for s in self._segments)
        drop = 0
        for seg in self._segments[:-1]:
            old = r.retention_s > 0 and now_ns - seg.last_ts_ns > r.retention_s * 1e9
            big = r.retention_bytes > 0 and total > r.retention_bytes
            if not (old or big):
                break
            total -= seg.size
            drop += 1
        if not drop:
            return 0
        gone, self._segments = self._segments[:drop], self._segments[drop:]
        keep_from = gone[-1].last_seq + 1
        carried = [r for r in self.open_alerts() if r["seq"] < keep_from]
        _write_atomic(
            self._open_path,
            json.dumps({"last_seq": gone[-1].last_seq, "open": carried}).encode(),
        )
        for seg in gone:
            try:
                seg.path.unlink()
            except FileNotFoundError:
                pass
        log.info(
            "alert log: %d segment(s) past retention deleted (seqs < %d; %d open alert(s) kept)",
            drop,
            keep_from,
            len(carried),
        )
        return drop

    def close(self) -> None:
        self._f.close()


def _fit(rec: dict[str, Any]) -> bytes:
    """The record as one JSON line of at most ``MAX_RECORD_BYTES``: the alert's longest lists
    are halved (and named in ``truncated``) until it fits, then its evidence is dropped."""
    a = rec["alert"]
    while True:
        line = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
        if len(line) <= MAX_RECORD_BYTES:
            return line
        lists = [(len(json.dumps(v)), k) for k, v in a.items() if isinstance(v, list) and v]
        if lists:
            _, key = max(lists)
            a[key] = a[key][: len(a[key]) // 2]
        elif "evidence" in a and a["evidence"] != {}:
            key, a["evidence"] = "evidence", {}
        else:
            raise ProtocolError(f"alert of {len(line)} bytes cannot be cut below the record limit")
        if key not in a.setdefault("truncated", []):
            a["truncated"].append(key)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AlertFollower:
    """The reference subscriber: replay since N over REQ, then follow the PUB socket, replaying
    again on any sequence gap. Yields log records (``{"seq", "ts_ns", "schema", "alert"}``) in
    order, each once. ``lost`` counts records retention removed before they could be replayed.
    """

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
        self.lost = 0
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
                    raise ProtocolError(f"replay answered with {env.body.get('error', env.type)}")
                recs = [
                    r
                    for r in env.body["alerts"]
                    if isinstance(r, dict) and r.get("seq", 0) > self.last
                ]
                if recs and recs[0]["seq"] > self.last + 1:
                    missed = recs[0]["seq"] - self.last - 1
                    self.lost += missed
                    log.warning("%d alert(s) after seq %d are past retention", missed, self.last)
                out += recs
                if recs:
                    self.last = recs[-1]["seq"]
                if not recs or self.last >= env.body["last_seq"]:
                    return out
        finally:
            req.close(0)

    def follow(
        self,
        since: int = 0,
        *,
        idle_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Records after ``since``; ends after ``idle_timeout_s`` without one, or soon after
        ``stop`` is set (the socket is polled in short slices for it)."""
        self.last = since
        yield from self._replay()
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            left = (
                None if idle_timeout_s is None else idle_since + idle_timeout_s - time.monotonic()
            )
            if left is not None and left <= 0:
                return
            wait = left if stop is None else min(0.2, 1e9 if left is None else left)
            if not self.sub.poll(None if wait is None else poll_ms(wait)):
                continue
            idle_since = time.monotonic()
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
            yield {k: env.body[k] for k in ("seq", "ts_ns", "schema", "alert") if k in env.body}

    def close(self) -> None:
        self.sub.close(0)
