"""skh-agent --role underlay: the host agent.

It samples the byte counters of every configured source at ``counter_hz`` (10 Hz by default:
the input of skeleton inference, whose pipeline partners show only in sub-second timing) and
ships them to the analyzer once per ``batch_interval_s``, and it runs the localization commands
the analyzer asks for through the controller. Each command is a pluggable handler
(``agent.handlers[name] = fn(args) -> result``); the defaults (:func:`default_handlers`) read the
host with the collectors of :mod:`skh.collect`:

* ``traceroute``: a flow-pinned (Paris) traceroute between two RNICs;
* ``dump_flows``: the OVS flow tables (the datapath cache stands in for the RNIC's offloaded one);
* ``overlay_state``: routes, neighbours, bridge FDB, link kinds and oper-down links;
* ``host_report``: the port state and RX error counters of this host's RNICs.

Every command's arguments are checked before a handler sees them
(:mod:`skh.orchestrator.commands`); a ``netns`` must moreover be one of this host's containers
(``agent.containers``, the sources' namespaces). With ``agent.enrol_socket`` set, the agent
vouches for the keys of its host's sidecars (:mod:`skh.orchestrator.enrol`).

Counters are sampled on the wall clock's grid, ``sample_phase_s`` into each sampling interval
(``(k + sample_phase_s) / counter_hz`` past each whole second), so every host
samples at the same instants: training traffic comes in bursts that often start on whole seconds
(iteration boundaries of a job launched by one clock), and a 1 Hz sample at a random phase
splits such a burst over two one-second bins, by a different share on each host, which blurs the
stage shifts skeleton inference reads. The default 0.5 s keeps samples away from the seconds'
edges.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from skh.collect.linux import read_linux_state
from skh.collect.ovs import parse_dpctl_flows, parse_ofctl_flows
from skh.collect.trace import paris_trace, vxlan_trace
from skh.collect.vxlan import VXLAN_PORT, InnerFlow, OuterPortLearner
from skh.errors import CapabilityError, ProtocolError, RequestRefused, RequestTimeout
from skh.orchestrator.agent_base import AgentBase
from skh.orchestrator.config import AgentConfig
from skh.orchestrator.counters import CounterSampler, make_source
from skh.orchestrator.daemon import RetryRefused, make_socket, poll_ms
from skh.orchestrator.enrol import EnrolServer
from skh.orchestrator.metrics import CallbackCollector
from skh.orchestrator.security import SecurityConfig
from skh.wire import Envelope, MsgType, counter_batch_body

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["UnderlayAgent", "default_handlers", "next_sample_delay_s"]

log = logging.getLogger(__name__)

_CMD_TIMEOUT_S = 20.0
_IFF_UP = 0x1
_IFF_LOWER_UP = 0x10000  # carrier (the operstate follows it only after linkwatch's delay)


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


_learner: OuterPortLearner | None = None
_trace_locks: dict[tuple[str, int], threading.Lock] = {}
_state_lock = threading.Lock()


def _outer_ports(vxlan_port: int) -> OuterPortLearner:
    global _learner
    with _state_lock:
        if _learner is None or _learner.vxlan_port != vxlan_port:
            _learner = OuterPortLearner(vxlan_port=vxlan_port)
        return _learner


def _port_lock(src: str, sport: int) -> threading.Lock:
    """Two traces of one outer 5-tuple (two inner flows the VTEP hashed alike) cannot bind its
    source port at once: they take turns."""
    with _state_lock:
        return _trace_locks.setdefault((src, sport), threading.Lock())


def traceroute(args: dict[str, Any]) -> Any:
    """Flow-pinned traceroute: ``{dst, src?, sport?, dport?, max_ttl?, netns?}``. Inside another
    namespace the collector runs as a subprocess under ``ip netns exec``.

    With ``inner_src``, ``inner_dst`` and ``path_id`` (an overlay probe flow between two of the
    RNICs' VTEPs, ``src`` -> ``dst``; ``reply``: the answers' leg of the flow whose prober is
    ``inner_dst``) the trace takes the underlay path that flow's frames take:
    it is pinned to their VXLAN outer 5-tuple, whose source port is learned by watching them
    leave (for up to ``learn_ms``; :mod:`skh.collect.vxlan`). The answer says ``pinned``; a flow
    not seen in time is traced from ``sport`` like any other."""
    dst = str(args["dst"])
    netns = str(args.get("netns", ""))
    opts = {k: args[k] for k in ("src", "sport", "dport", "max_ttl") if k in args}
    unpinned = ""
    if "inner_src" in args and "src" in args and not netns:
        vport = int(args.get("vxlan_port", VXLAN_PORT))
        flow = InnerFlow(
            str(args["inner_src"]),
            str(args["inner_dst"]),
            int(args["path_id"]),
            reply=bool(args.get("reply", False)),
        )
        learner = _outer_ports(vport)
        seen = learner.lookup(dst, flow, int(args.get("learn_ms", 5000)) / 1000.0)
        if seen is not None:
            with _port_lock(str(args["src"]), seen.sport):
                res = vxlan_trace(
                    dst,
                    src=str(args["src"]),
                    outer_sport=seen.sport,
                    inner=seen.inner,
                    vxlan_port=vport,
                    max_ttl=int(args.get("max_ttl", 16)),
                )
            return {"trace": _plain(res), "pinned": True, "outer_sport": seen.sport}
        unpinned = learner.error or "flow not seen leaving this host"
    if not netns:
        out = {"trace": _plain(paris_trace(dst, **opts))}
        return {**out, "pinned": False, "why": unpinned} if unpinned else out
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
        return {"raw": raw, "parsed": _plain(parse_dpctl_flows(raw))}
    raw = _run(["ovs-ofctl", "dump-flows", str(args["bridge"])], netns)
    return {"raw": raw, "parsed": _plain(parse_ofctl_flows(raw))}


def overlay_state(args: dict[str, Any]) -> Any:
    """Routes, neighbours, bridge FDB, link kinds and oper-down links of a namespace
    (``{netns?}``), in the plain form of :class:`skh.collect.linux.LinuxState`."""
    st = read_linux_state(str(args.get("netns", "")) or None)
    return {
        "routes": _plain(st.routes),
        "neighs": _plain(st.neighs),
        "fdb": _plain(st.fdb),
        "links": dict(st.links),
        "down": sorted(st.down),
    }


def host_report(args: dict[str, Any]) -> Any:
    """Port state of this host's RNICs: ``{rnics: {rail: netdev}, netns?}`` (the analyzer passes
    the netdevs its fabric file names). A port set down is the RNIC's own failure
    (``rnic_state = down``); a port that is up without carrier sees no light from its switch, so
    the switch end of the access link is down (``peer_down``); ``port_down_count`` is the
    driver's carrier-down count (``IFLA_CARRIER_DOWN_COUNT``): two readings tell a port that went
    down once from one that flaps. ``rx_errors`` is the RNIC's count of frames it received
    corrupted (:mod:`skh.collect.rxerrors`): two readings tell which end of a lossy pair takes
    them; a rail without counters is left out and said why in ``unread``. ``read`` names the
    flags this reader provides: the localizer treats every other flag as unknown, never as
    healthy."""
    from pyroute2 import IPRoute

    from skh.collect.rxerrors import rx_errors

    rails = {str(dev): int(rail) for rail, dev in dict(args.get("rnics", {})).items()}
    netns = str(args.get("netns", ""))
    state: dict[str, str] = {}
    peer_down: list[int] = []
    downs: dict[str, int] = {}
    rx: dict[str, int] = {}
    unread: dict[str, str] = {}
    with IPRoute(**({"netns": netns} if netns else {})) as ipr:
        for link in ipr.get_links():
            dev = link.get_attr("IFLA_IFNAME") or ""
            rail = rails.get(dev)
            if rail is None:
                continue
            count = link.get_attr("IFLA_CARRIER_DOWN_COUNT")
            if count is not None:
                downs[str(rail)] = int(count)
            stats = link.get_attr("IFLA_STATS64")
            crc = stats.get("rx_crc_errors") if stats is not None else None
            try:
                rx[str(rail)] = rx_errors(dev, None if crc is None else int(crc))
            except CapabilityError as exc:
                unread[str(rail)] = str(exc)
            if not link["flags"] & _IFF_UP:
                state[str(rail)] = "down"
                continue
            state[str(rail)] = "up"
            if not link["flags"] & _IFF_LOWER_UP:
                peer_down.append(rail)
    return {
        "rnic_state": state,
        "peer_down": sorted(peer_down),
        "port_down_count": downs,
        "rx_errors": rx,
        "read": ["rnic_state", "peer_down", "port_down_count", *(["rx_errors"] if rx else [])],
        **({"unread": {"rx_errors": unread}} if unread else {}),
    }


def default_handlers() -> dict[str, Any]:
    return {
        "traceroute": traceroute,
        "dump_flows": dump_flows,
        "overlay_state": overlay_state,
        "host_report": host_report,
    }


def next_sample_delay_s(wall_s: float, phase_s: float, interval_s: float, hz: int = 1) -> float:
    """Seconds from wall-clock time ``wall_s`` to the next counter sample: on the grid
    ``(k + phase_s) / hz`` past each whole second, about ``interval_s`` after the last one (at
    most one sampling interval, ``1 / hz``, when ``hz`` > 1). A sample taken late (a slow tick)
    keeps the grid; one more than half an interval late skips a grid point rather than
    sampling twice within half an interval."""
    step = 1.0 / hz
    delay = ((phase_s - (wall_s * hz) % 1.0) % 1.0) * step
    if delay < 0.5 * step:
        delay += step
    return delay + (max(0, int(interval_s) - 1) if hz == 1 else 0.0)


class UnderlayAgent(AgentBase):
    role = "underlay"
    #: a localization round asks a host for a trace per failing RNIC pair at once; each mostly
    #: waits for silent hops
    command_workers = 8

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
        security.client(self.push, analyzer=True)
        self.push.connect(cfg.analyzer)
        self.push_retry = RetryRefused(self.push, cfg.analyzer)
        self.handlers.update(default_handlers())
        #: the namespaces a command may name: this host's containers' and the sources'
        self.known_netns = {c.netns for c in cfg.containers if c.netns} | {
            s.netns for s in cfg.sources if s.netns
        }
        self.enrol: EnrolServer | None = None
        self._enrol_client: Any = None  # the enrolment thread's own connection
        #: learns the probe flows' VXLAN outer ports ahead of any trace (a round never waits)
        self.outer_ports: OuterPortLearner | None = None
        if cfg.learn_vxlan_port:
            self.outer_ports = _outer_ports(cfg.learn_vxlan_port)
            self.outer_ports.start()
        if cfg.enrol_socket:
            self.enrol = EnrolServer(cfg.enrol_socket, cfg.containers, self._vouch)
        self._next_sample = time.monotonic() + next_sample_delay_s(
            time.time(), cfg.sample_phase_s, 1.0, cfg.counter_hz
        )
        self._next_ship = time.monotonic() + cfg.batch_interval_s
        self._unshipped: list[np.ndarray] = []  # samples since the last batch
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

    def check_args(self, name: str, args: Any) -> dict[str, Any]:
        out = super().check_args(name, args)
        if out.get("netns") and out["netns"] not in self.known_netns:
            raise ProtocolError(f"{name}: netns {out['netns']!r} is not a container of this host")
        return out

    def _vouch(self, req: dict[str, str]) -> dict[str, Any]:
        """Ask the controller to bind an attested sidecar's key (on the enrolment thread, with
        a connection of its own under this agent's key, kept for the next one)."""
        from skh.orchestrator.admin import ControllerClient

        if self._enrol_client is None:
            self._enrol_client = ControllerClient(
                self.cfg.controller,
                self.security,
                ctx=self._ctx,
                timeout_s=self.cfg.request_timeout_s,
                retries=1,
                name=self.name,
            )
        try:
            data = self._enrol_client.request(MsgType.ENROL, {"agent": self.name, **req})
        except RequestRefused as exc:
            return {"ok": False, "error": str(exc)}
        except RequestTimeout as exc:  # the sidecar asks again later
            return {"ok": False, "error": str(exc), "retry": True}
        self.counters["sidecars_vouched"] += 1
        return {"ok": True, "name": data["name"]}

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.outer_ports is not None:
            lp = self.outer_ports
            out["outer_ports"] = {
                "frames": lp.frames,
                "recorded": lp.recorded,
                "flows": lp.flows(),
                "error": lp.error or "",
            }
        return out

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

    def sample(self) -> int:
        """One sample of every source, kept for the next batch."""
        recs = self.sampler.sample(self.ep_ids)
        if recs.size:
            self._unshipped.append(recs)
        return int(recs.size)

    def sample_and_ship(self) -> int:
        self.sample()
        return self.ship()

    def ship(self) -> int:
        """The samples taken since the last batch, in one batch."""
        if not self._unshipped:
            return 0
        recs = np.concatenate(self._unshipped)
        self._unshipped = []
        self._seq += 1
        frame = self.codec.encode(
            MsgType.COUNTER_BATCH, self.name, self._seq, counter_batch_body(self.name, recs)
        )
        try:
            self.push.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # counters are a stream: a lost batch is counted, not buffered
            self.counters["counter_batches_dropped"] += 1
            return 0
        self.counters["counter_records_sent"] += recs.size
        return int(recs.size)

    def run(self, stop: threading.Event) -> None:
        self.notifier.ready(f"{len(self.sampler.sources)} counter sources")
        try:
            while not stop.is_set():
                # wake for the next counter sample, on its grid (10 Hz leaves no slack)
                wait_ms = poll_ms(min(0.1, self._next_sample - time.monotonic()))
                readable = bool(self.dealer.poll(wait_ms, zmq.POLLIN))
                self.tick(readable, time.monotonic())
                self.notifier.watchdog()
        finally:
            self.notifier.stopping()
            self.close()

    def tick(self, readable: bool, now: float) -> None:
        """One turn of the loop (``readable``: the DEALER has input); a process hosting many
        agents may poll all their sockets at once and tick each."""
        if readable:
            self.handle_dealer()
        self.session_tick(now)
        self.push_retry.tick(now)
        if now >= self._next_sample:
            # re-aimed at the wall clock's grid each time: a slow tick shifts no later sample,
            # and the monotonic clock drifting from the wall clock cannot either
            hz = self.cfg.counter_hz
            self._next_sample = now + next_sample_delay_s(
                time.time(), self.cfg.sample_phase_s, max(1.0, self.cfg.batch_interval_s), hz
            )
            self.sample()
        if now >= self._next_ship:
            self._next_ship = now + max(self.cfg.batch_interval_s, 1.0 / self.cfg.counter_hz)
            self.ship()

    def close(self) -> None:
        if self.outer_ports is not None:
            self.outer_ports.stop()
        if self.enrol is not None:
            self.enrol.close()
            if self._enrol_client is not None:
                self._enrol_client.close()
        self.sampler.close()
        self.push_retry.close()
        self.push.close(0)
        self.close_base()
