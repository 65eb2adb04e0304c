"""skh-agent --role underlay: the host agent.

It samples the byte counters of every configured source at 1 Hz (the input of skeleton
inference) and ships them to the analyzer, and it runs the localization commands the analyzer asks
for through the controller: a flow-pinned traceroute, flow-table dumps and the overlay state of a
namespace. Each command is a pluggable handler (``agent.handlers[name] = fn(args) -> result``);
the defaults use the collectors of :mod:`skh.collect` where present and return raw command output
otherwise.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import threading
import time
from dataclasses import asdict, is_dataclass
from typing import Any

import zmq

from skh.orchestrator.agent_base import AgentBase
from skh.orchestrator.config import AgentConfig
from skh.orchestrator.counters import CounterSampler, make_source
from skh.orchestrator.daemon import make_socket
from skh.orchestrator.metrics import CallbackCollector, CollectorRegistry
from skh.orchestrator.security import SecurityConfig
from skh.wire import Envelope, MsgType, counter_batch_body

__all__ = ["UnderlayAgent", "default_handlers"]

log = logging.getLogger(__name__)

_CMD_TIMEOUT_S = 20.0


def _plain(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return _plain(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _run(argv: list[str], netns: str = "") -> str:
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:500]}"
        )
    return done.stdout


def _collector(module: str, func: str) -> Any:
    try:
        return getattr(importlib.import_module(f"skh.collect.{module}"), func, None)
    except ImportError:
        return None


def traceroute(args: dict[str, Any]) -> Any:
    """Flow-pinned traceroute: ``{dst, src?, sport?, dport?, max_ttl?, netns?}``. Inside another
    namespace the collector runs as a subprocess under ``ip netns exec``."""
    dst = str(args["dst"])
    netns = str(args.get("netns", ""))
    opts = {k: args[k] for k in ("src", "sport", "dport", "max_ttl") if k in args}
    paris = _collector("trace", "paris_trace")
    if paris is None:  # no collector: the system traceroute, unpinned
        return {"raw": _run(["traceroute", "-n", "-U", dst], netns)}
    if not netns:
        return {"trace": _plain(paris(dst, **opts))}
    argv = [
        sys.executable,
        "-m",
        "skh.collect.trace",
        "--dst",
        dst,
        *(f"--{k.replace('_', '-')}={v}" for k, v in opts.items()),
    ]
    return {"raw": _run(argv, netns)}


def dump_flows(args: dict[str, Any]) -> Any:
    """OVS flow tables: ``{bridge, datapath?: bool, netns?}``. The datapath cache stands in for
    the RNIC's offloaded table (DESIGN §7)."""
    netns = str(args.get("netns", ""))
    if args.get("datapath"):
        raw = _run(["ovs-appctl", "dpctl/dump-flows"], netns)
        parse = _collector("ovs", "parse_dpctl_flows")
    else:
        raw = _run(["ovs-ofctl", "dump-flows", str(args["bridge"])], netns)
        parse = _collector("ovs", "parse_ofctl_flows")
    return {"raw": raw, "parsed": _plain(parse(raw))} if parse is not None else {"raw": raw}


def overlay_state(args: dict[str, Any]) -> Any:
    """FDB, routes and neighbours of a namespace: ``{netns?}``."""
    netns = str(args.get("netns", ""))
    reader = _collector("linux", "read_overlay_state")
    if reader is not None:
        return _plain(reader(netns) if netns else reader())
    return {
        "fdb": _run(["bridge", "-j", "fdb", "show"], netns),
        "routes": _run(["ip", "-j", "route", "show", "table", "all"], netns),
        "neigh": _run(["ip", "-j", "neigh", "show"], netns),
    }


def default_handlers() -> dict[str, Any]:
    return {"traceroute": traceroute, "dump_flows": dump_flows, "overlay_state": overlay_state}


class UnderlayAgent(AgentBase):
    role = "underlay"

    def __init__(
        self,
        cfg: AgentConfig,
        security: SecurityConfig,
        *,
        ctx: zmq.Context | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(cfg, security, ctx=ctx)
        self.sampler = CounterSampler(make_source(s) for s in cfg.sources)
        self.ep_ids: dict[str, int] = {}
        self.push = make_socket(self._ctx, zmq.PUSH, hwm=cfg.hwm)
        self.push.setsockopt(zmq.IMMEDIATE, 1)
        security.client(self.push)
        self.push.connect(cfg.analyzer)
        self.handlers.update(default_handlers())
        self._next_sample = time.monotonic()
        if metrics is not None:
            metrics.register(
                CallbackCollector(
                    counters={
                        "skh_agent_events": (
                            "Agent events by kind",
                            ("kind",),
                            lambda: {(k,): float(v) for k, v in self.counters.items()},
                        )
                    },
                    gauges={
                        "skh_agent_counter_sources": (
                            "Counter sources by state",
                            ("state",),
                            lambda: {
                                ("resolved",): float(len(self.ep_ids)),
                                ("unresolved",): float(len(self._unresolved())),
                            },
                        )
                    },
                )
            )

    def _unresolved(self) -> list[str]:
        return [s.endpoint for s in self.sampler.sources if s.endpoint not in self.ep_ids]

    def register_body(self) -> dict[str, Any]:
        return {
            "agent": self.name,
            "role": self.role,
            "host": self.cfg.host,
            "endpoints": [],
            "watch": [s.endpoint for s in self.sampler.sources],
        }

    def on_registered(self, env: Envelope) -> None:
        self._resolved(env.body.get("resolved", {}))

    def heartbeat_body(self) -> dict[str, Any]:
        return {
            "agent": self.name,
            "epoch": self.epoch,
            "jobs": {},
            "unresolved": self._unresolved(),
        }

    def on_heartbeat_ack(self, env: Envelope) -> None:
        self._resolved(env.body.get("resolved", {}))

    def _resolved(self, mapping: dict[str, Any]) -> None:
        for name, ep in mapping.items():
            if isinstance(ep, int):
                self.ep_ids[name] = ep

    def sample_and_ship(self) -> int:
        recs = self.sampler.sample(self.ep_ids)
        if recs.size == 0:
            return 0
        self._seq += 1
        frame = self.codec.encode(
            MsgType.COUNTER_BATCH, self.name, self._seq, counter_batch_body(self.name, recs)
        )
        try:
            self.push.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # counters are a 1 Hz stream: a lost second is counted, not buffered
            self.counters["counter_batches_dropped"] += 1
            return 0
        self.counters["counter_records_sent"] += recs.size
        return int(recs.size)

    def run(self, stop: threading.Event) -> None:
        self.notifier.ready(f"{len(self.sampler.sources)} counter sources")
        try:
            while not stop.is_set():
                if self.dealer.poll(100, zmq.POLLIN):
                    self.handle_dealer()
                now = time.monotonic()
                self.session_tick(now)
                if now >= self._next_sample:
                    # 1 Hz on a fixed grid: a slow tick does not shift every later sample
                    self._next_sample += max(1.0, self.cfg.batch_interval_s)
                    if self._next_sample < now:
                        self._next_sample = now + 1.0
                    self.sample_and_ship()
                self.notifier.watchdog()
        finally:
            self.notifier.stopping()
            self.sampler.close()
            self.push.close(0)
            self.close_base()
