"""Ingest front-ends: the agents' batches decoded, authorized and routed by shard off the
coordinator (:class:`IngestRouter`, and :class:`IngestFrontEnd`, the Ray actor that feeds it
from its own PULL socket).

A front-end is a door into the analyzer like the analyzer's own PULL socket, and keeps its
rules (docs/trust.md): with CURVE on it admits the current identities only (the trusted
directory and the enrolled keys), and its :class:`~skh.orchestrator.authz.AnalyzerPolicy`
takes results only for the endpoints the sender's key owns, as read from the controller by its
own :class:`~skh.orchestrator.analyzer.KeyMirror`; each sender's records per round are capped
(:class:`~skh.orchestrator.analyzer.RoundQuota`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import ray

from skh.errors import ProtocolError, Unauthorized
from skh.orchestrator.analyzer import RoundQuota
from skh.orchestrator.authz import AllowAll, Policy
from skh.orchestrator.shard.placement import Placement
from skh.records import COUNTER_DTYPE, PROBE_DTYPE, empty_counters, empty_probes
from skh.wire import Codec, MsgType, decode_counters, decode_probes

__all__ = ["IngestRouter", "IngestFrontEnd"]

log = logging.getLogger(__name__)

_Buffer = list[tuple[list[np.ndarray], list[np.ndarray], list[tuple[np.ndarray, int]]]]


class IngestRouter:
    """Pushed frames in, per-shard records out. Each frame is identified, decoded and
    authorized as the analyzer does its own (:meth:`Analyzer._on_batch`); a probe batch's rows
    go to the shard of their prober, its ``eps`` (the heartbeat of the agent's endpoints) to
    their shards, a counter batch's rows to their jobs' home shards. Rows of endpoints no shard
    holds yet are dropped and counted; so are a sender's records past its ``quota`` between
    two flushes (one analyzer round)."""

    def __init__(
        self,
        shards: int,
        codec: Codec,
        policy: Policy | None = None,
        quota: RoundQuota | None = None,
    ) -> None:
        self.shards = shards
        self.codec = codec
        self.policy: Policy = policy if policy is not None else AllowAll()
        self.quota = quota if quota is not None else RoundQuota(4_000_000, 524_288)
        self.ep_shard = self.ep_home = np.full(0, -1, np.int16)
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._buf = self._empty()

    def _empty(self) -> _Buffer:
        return [([], [], []) for _ in range(self.shards)]

    def set_routes(self, ep_shard: np.ndarray, ep_home: np.ndarray) -> None:
        """:class:`Placement`'s tables: each endpoint's shard, and its job's home shard."""
        self.ep_shard, self.ep_home = np.asarray(ep_shard), np.asarray(ep_home)

    def on_frame(self, buf: Any, user_id: str = "", t_ns: int | None = None) -> None:
        try:
            who = self.policy.identify(b"", user_id)
            env = self.codec.decode(buf, max_elements=who.max_elements)
            if env.type not in (MsgType.PROBE_BATCH, MsgType.COUNTER_BATCH):
                self.codec.rejected["unexpected"] += 1
                return
            self.policy.authorize(who, env)
            admitted = self.quota.admit(who, int(env.body["n"]))
            if env.type is MsgType.PROBE_BATCH:
                eps = env.body.get("eps") or []
                if not all(isinstance(e, int) and 0 <= e < 2**32 for e in eps):
                    raise ProtocolError("batch: 'eps' must be endpoint ids")
                recs = decode_probes(env.body) if admitted else empty_probes()
                # a batch over the quota still says its agent is alive
                self._probes(recs, np.asarray(eps, np.int64), t_ns or time.time_ns())
            elif admitted:
                self._counters(decode_counters(env.body))
            self.counters["batches"] += 1
        except Unauthorized:
            self.counters["unauthorized"] += 1
        except ProtocolError:
            self.counters["bad_batches"] += 1

    def _probes(self, recs: np.ndarray, eps: np.ndarray, t_ns: int) -> None:
        recs = np.asarray(recs, PROBE_DTYPE)
        src = Placement.lookup(self.ep_shard, recs["src_ep"])
        dst = Placement.lookup(self.ep_shard, recs["dst_ep"])
        known = (src >= 0) & (dst >= 0)
        hb = Placement.lookup(self.ep_shard, eps)
        with self._lock:
            for s in np.unique(src[known]).tolist():
                self._buf[s][0].append(recs[known & (src == s)])
            for s in np.unique(hb[hb >= 0]).tolist():
                self._buf[s][2].append((eps[hb == s], t_ns))
        self.counters["probe_records"] += recs.size
        self.counters["unplaced_records"] += int((~known).sum())

    def _counters(self, recs: np.ndarray) -> None:
        recs = np.asarray(recs, COUNTER_DTYPE)
        sh = Placement.lookup(self.ep_home, recs["ep"])
        with self._lock:
            for s in np.unique(sh[sh >= 0]).tolist():
                self._buf[s][1].append(recs[sh == s])
        self.counters["counter_records"] += recs.size

    def flush(self) -> list[tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int]]]]:
        """Per shard ``(probes, counters, heartbeats)`` since the last flush."""
        with self._lock:
            buf, self._buf = self._buf, self._empty()
            self.quota.next_round()
        return [
            (
                np.concatenate(p) if p else empty_probes(),
                np.concatenate(c) if c else empty_counters(),
                h,
            )
            for p, c, h in buf
        ]


@ray.remote
class IngestFrontEnd:
    """A stateless ingest front-end: binds its own PULL socket (agents push to it as to the
    analyzer) and routes what it receives; the coordinator collects it every round
    (:meth:`flush`, one return value per shard, so the coordinator owns them and a front-end
    that dies loses at most the batches of the round in progress).

    With CURVE on (``security`` not insecure) it serves under the analyzer's key, knows the
    identities of ``security.authorized_keys_dir`` and those the controller at ``controller``
    binds (enrolled sidecars, revocations), and authorizes as the analyzer does
    (:class:`AnalyzerPolicy`); until its key mirror first read the controller, every batch is
    refused (a sender owns nothing yet)."""

    def __init__(
        self,
        bind: str,
        security: Any,
        shards: int,
        max_frame_bytes: int,
        *,
        controller: str = "",
        max_round_records: int = 4_000_000,
        max_sender_records: int = 524_288,
    ) -> None:
        import zmq

        from skh.orchestrator.analyzer import KeyMirror
        from skh.orchestrator.authz import AnalyzerPolicy, KeyBook
        from skh.orchestrator.daemon import bind as bind_socket
        from skh.orchestrator.daemon import make_socket
        from skh.orchestrator.security import ServerSecurity

        self._ctx = zmq.Context()
        self.keys: KeyBook | None = None
        self._mirror: KeyMirror | None = None
        policy: Policy = AllowAll()
        if not security.insecure:
            self.keys = KeyBook(security.authorized_keys_dir)
            policy = AnalyzerPolicy(self.keys)
            if security.client_secret_key and controller:
                self._mirror = KeyMirror(controller, security, self.keys, policy, self._ctx)
            else:
                log.warning(
                    "ingest front-end without a client key or controller: it cannot learn "
                    "which endpoints each key owns, and refuses every batch"
                )
        self._security = ServerSecurity(security, self._ctx, domain="analyzer", provider=self.keys)
        self._pull = make_socket(self._ctx, zmq.PULL, hwm=10_000, max_msg_bytes=max_frame_bytes)
        self._security.apply(self._pull)
        self.endpoint = bind_socket(self._pull, bind)
        self.router = IngestRouter(
            shards,
            Codec(max_frame_bytes=max_frame_bytes),
            policy,
            RoundQuota(max_round_records, max_sender_records),
        )
        self._stop = threading.Event()
        if self._mirror is not None:
            self._mirror.start()
        self._thread = threading.Thread(target=self._serve, name="skh-ingest", daemon=True)
        self._thread.start()

    def address(self) -> str:
        return self.endpoint

    def set_routes(self, ep_shard: np.ndarray, ep_home: np.ndarray) -> None:
        self.router.set_routes(ep_shard, ep_home)

    def _serve(self) -> None:
        import zmq

        from skh.orchestrator.authz import transport_user_id

        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            if self.keys is not None:
                self.keys.refresh()  # the trusted directory: added and removed certificates
            if not poller.poll(100):
                continue
            for _ in range(5000):
                try:
                    frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if len(frames) != 1:
                    self.router.codec.rejected["malformed"] += 1
                    continue
                self.router.on_frame(frames[0].buffer, transport_user_id(frames[0]))

    def flush(self) -> tuple[Any, ...]:
        """Per shard ``(probes, counters, heartbeats)`` since the last flush; then the counts."""
        r = self.router
        return (
            *r.flush(),
            {
                **r.counters,
                **{f"rejected_{k}": v for k, v in r.codec.rejected.items()},
                "records_dropped": r.quota.dropped,
            },
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._mirror is not None:
            self._mirror.stop()
        self._pull.close(0)
        self._security.close()
        self._ctx.term()
