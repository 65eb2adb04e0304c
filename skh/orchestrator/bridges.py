"""Bridges from the alert bus to what operators run: a Prometheus Alertmanager (API v2) and
generic JSON webhooks (``skh alerts forward``).

A bridge follows the bus (:class:`~skh.orchestrator.alerts.AlertFollower`), delivers each
record, and only then acknowledges its sequence number in a state file (written atomically).
After a crash or restart it resumes from the last acknowledged number: nothing is lost, and a
record delivered just before a crash may be delivered again. Every delivery carries the
record's idempotency key ``alert_id|state|seq`` so a receiver can drop such duplicates.

Delivery is retried with backoff while the receiver is unreachable or answers 5xx, 408 or 429;
any other 4xx is a permanent refusal of that record: it is logged, counted and acknowledged
(retrying cannot change the answer, and it would hold back every later alert).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from skh.errors import ConfigError, ProtocolError, SkhError
from skh.orchestrator.alerts import AlertFollower, idempotency_key

__all__ = [
    "AlertmanagerReceiver",
    "BridgeState",
    "DeliveryError",
    "Receiver",
    "WebhookReceiver",
    "forward",
]

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 429}
_MAX_ANNOTATION = 4096


class DeliveryError(SkhError):
    """A receiver did not take a record. ``retry``: whether trying again may help."""

    def __init__(self, msg: str, *, retry: bool) -> None:
        super().__init__(msg)
        self.retry = retry


class BridgeState:
    """The last acknowledged sequence number and what the receiver needs to remember (the
    Alertmanager labels of open alerts), in one JSON file replaced atomically on every ack."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.last_seq = 0
        self.data: dict[str, Any] = {}
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"bridge state {self.path} is unreadable: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("last_seq"), int):
            raise ConfigError(f"bridge state {self.path} is not a bridge state file")
        self.last_seq = raw["last_seq"]
        self.data = raw.get("data") or {}

    def ack(self, seq: int) -> None:
        self.last_seq = seq
        tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"last_seq": seq, "data": self.data}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Receiver(Protocol):
    def deliver(self, rec: Mapping[str, Any], state: BridgeState) -> bool:
        """Deliver one record (False: not for this receiver, nothing sent); raise
        :class:`DeliveryError` when it was not taken."""

    def tick(self, state: BridgeState) -> None:
        """Called every ``resend_s`` or so between records."""


def _post_json(url: str, payload: Any, headers: Mapping[str, str], timeout_s: float) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        retry = exc.code >= 500 or exc.code in _RETRY_STATUS
        body = exc.read()[:200].decode(errors="replace")
        raise DeliveryError(f"{url} answered {exc.code}: {body}", retry=retry) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"{url} unreachable: {exc}", retry=True) from None


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat().replace("+00:00", "Z")


class WebhookReceiver:
    """POSTs every record as JSON: ``{"idempotency_key", "seq", "ts_ns", "schema", "alert"}``,
    the key also in the ``Idempotency-Key`` header."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--webhook needs an http(s) URL. Got {url!r} instead.")
        self.url = url
        self.timeout_s = timeout_s

    def deliver(self, rec: Mapping[str, Any], state: BridgeState) -> bool:
        key = idempotency_key(rec)
        _post_json(
            self.url, {"idempotency_key": key, **rec}, {"Idempotency-Key": key}, self.timeout_s
        )
        return True

    def tick(self, state: BridgeState) -> None:
        pass


class AlertmanagerReceiver:
    """Faults as Alertmanager alerts (API v2). Labels: ``alertname="SkhFault"``, ``layer``,
    ``component``, ``failure_type``, ``job``, ``severity`` — fixed when the alert opens (an open
    alert's job list may grow and a resolved record's severity is "info"; Alertmanager matches
    the resolve by labels). While open, ``endsAt`` is ``resend_s`` x 4 ahead and the alert is
    re-posted every ``resend_s`` (as Prometheus does); on resolve ``endsAt`` is the resolution
    time. Skeleton and suspect events are not sent."""

    def __init__(self, url: str, *, resend_s: float = 60.0, timeout_s: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--alertmanager needs an http(s) URL. Got {url!r} instead.")
        url = url.rstrip("/")
        self.url = url if url.endswith("/api/v2/alerts") else url + "/api/v2/alerts"
        self.resend_s = resend_s
        self.timeout_s = timeout_s

    def _post(self, alerts: list[dict[str, Any]]) -> None:
        _post_json(self.url, alerts, {}, self.timeout_s)

    def deliver(self, rec: Mapping[str, Any], state: BridgeState) -> bool:
        a = rec["alert"]
        if a.get("kind") != "fault":
            return False
        opened: dict[str, Any] = state.data.setdefault("open", {})
        aid = str(a["alert_id"])
        if a["state"] == "open":
            am = self._alert(rec)
            self._post([{**am, "endsAt": self._horizon()}])
            opened[aid] = am
        else:
            am = opened.get(aid) or self._alert(rec)
            ends = int(a.get("evidence", {}).get("resolved_at_ns") or rec["ts_ns"])
            resolved = {
                **am,
                "annotations": {**am["annotations"], **self._alert(rec)["annotations"]},
                "endsAt": _rfc3339(ends),
            }
            self._post([resolved])
            opened.pop(aid, None)
        return True

    def tick(self, state: BridgeState) -> None:
        opened = state.data.get("open") or {}
        if opened:
            self._post([{**am, "endsAt": self._horizon()} for am in opened.values()])

    def _horizon(self) -> str:
        return _rfc3339(time.time_ns() + int(4 * self.resend_s * 1e9))

    @staticmethod
    def _alert(rec: Mapping[str, Any]) -> dict[str, Any]:
        a = rec["alert"]
        detection = a.get("detection") or {}
        evidence = json.dumps(a.get("evidence", {}), sort_keys=True)
        return {
            "labels": {
                "alertname": "SkhFault",
                "layer": str(a["layer"]),
                "component": str(a["component"]),
                "failure_type": str(a["failure_type"]),
                "job": str(a["job"]),
                "severity": str(a["severity"]),
            },
            "annotations": {
                "summary": f"{a['failure_type']} at {a['layer']} {a['component']}",
                "description": str(detection.get("explanation", "")),
                "alert_id": str(a["alert_id"]),
                "idempotency_key": idempotency_key(rec),
                "seq": str(rec["seq"]),
                "symptom": str(a.get("symptom", "")),
                "candidates": ",".join(a.get("candidates", ())),
                "evidence": evidence[:_MAX_ANNOTATION],
            },
            "startsAt": _rfc3339(int(a["first_seen_ns"])),
        }


def forward(
    make_follower: Callable[[], AlertFollower],
    receiver: Receiver,
    state: BridgeState,
    *,
    stop: threading.Event,
    resend_s: float = 60.0,
    count: int | None = None,
    idle_exit_s: float | None = None,
    backoff_max_s: float = 30.0,
) -> Counter[str]:
    """Deliver every record after ``state.last_seq``, in order, acknowledging each once the
    receiver took it. Returns counts (delivered, skipped, refused, retries, lost to retention).
    Ends on ``stop``, after ``count`` records, or ``idle_exit_s`` without one."""
    stats: Counter[str] = Counter()
    handled = 0
    next_tick = time.monotonic() + resend_s
    follower: AlertFollower | None = None
    wait = 0.5
    last_rec = time.monotonic()
    try:
        while not stop.is_set():
            if follower is None:
                follower = make_follower()
            try:
                poll_s = resend_s if idle_exit_s is None else min(resend_s, idle_exit_s)
                for rec in follower.follow(state.last_seq, idle_timeout_s=poll_s, stop=stop):
                    _deliver(receiver, rec, state, stats, stop, backoff_max_s)
                    if stop.is_set():
                        return stats
                    state.ack(rec["seq"])
                    handled += 1
                    if count is not None and handled >= count:
                        return stats
                    last_rec = time.monotonic()
                    if last_rec >= next_tick:
                        break
                wait = 0.5
            except ProtocolError as exc:  # the analyzer is away: its log keeps everything
                stats["bus_errors"] += 1
                log.warning("alert bus: %s; retrying in %.1f s", exc, wait)
                stats["lost_to_retention"] += follower.lost
                follower.close()
                follower = None
                stop.wait(wait)
                wait = min(backoff_max_s, wait * 2)
                continue
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + resend_s
                _deliver(receiver, None, state, stats, stop, backoff_max_s)
            if idle_exit_s is not None and time.monotonic() - last_rec >= idle_exit_s:
                return stats
    finally:
        if follower is not None:
            stats["lost_to_retention"] += follower.lost
            follower.close()
    return stats


def _deliver(
    receiver: Receiver,
    rec: Mapping[str, Any] | None,
    state: BridgeState,
    stats: Counter[str],
    stop: threading.Event,
    backoff_max_s: float,
) -> None:
    """One record (``None``: the receiver's periodic tick), retried until it is taken,
    refused for good, or ``stop``."""
    wait = 0.5
    while not stop.is_set():
        try:
            if rec is None:
                receiver.tick(state)
            elif receiver.deliver(rec, state):
                stats["delivered"] += 1
            else:
                stats["skipped"] += 1
            return
        except DeliveryError as exc:
            if not exc.retry:
                stats["refused"] += 1
                log.error("record %s refused for good: %s", rec and rec.get("seq"), exc)
                return
            stats["retries"] += 1
            log.warning("%s; retrying in %.1f s", exc, wait)
            stop.wait(wait)
            wait = min(backoff_max_s, wait * 2)
