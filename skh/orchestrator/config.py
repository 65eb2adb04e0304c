"""Daemon configuration: one TOML file with ``[controller]``, ``[analyzer]``, ``[agent]`` and
``[security]`` tables, plus command-line overrides as dotted keys (``agent.job=train-7``).

Every value is checked once, here, with a message naming the key; the daemons then read typed,
frozen dataclasses. ``skh config check FILE`` runs exactly this validation.

Example::

    [controller]
    bind = "tcp://0.0.0.0:5550"
    pub_bind = "tcp://0.0.0.0:5551"
    db = "/var/lib/skh/registry.db"

    [agent]
    role = "overlay"
    job = "train-7"
    container = "worker-3"
    endpoints = [{rail = 0, ip = "10.0.0.3"}, {rail = 1, ip = "10.0.1.3"}]

    [security]
    server_public_key = "/etc/skh/keys/server.key"
    client_secret_key = "/etc/skh/keys/agent.key_secret"
"""

from __future__ import annotations

import dataclasses
import socket
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from skh.errors import ConfigError
from skh.orchestrator.alerts import Retention
from skh.orchestrator.security import SecurityConfig, underlay_identity
from skh.policy import ENGINE_TICK_S, MAX_ENGINE_TICK_S, ProbePolicy
from skh.wire import DEFAULT_MAX_FRAME_BYTES

__all__ = [
    "EndpointSpec",
    "SourceSpec",
    "ContainerSpec",
    "ControllerConfig",
    "AnalyzerConfig",
    "AgentConfig",
    "Config",
    "load_config",
    "parse_override",
]

#: the probe policy's defaults (one place: :class:`skh.probeplan.ProbePolicy`)
_POLICY = ProbePolicy()


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One VF the overlay agent probes from (and answers on)."""

    rail: int
    ip: str = "0.0.0.0"
    port: int = 0  # 0: ephemeral
    netdev: str = ""
    device: str = ""  # verbs device
    gid_index: int = -1  # -1: the engine picks (never 0 by default)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One counter source of the underlay agent (see :mod:`skh.orchestrator.counters`)."""

    endpoint: str  # job/container/rail this source measures
    kind: str = "netdev"  # netdev | vf | rdma
    netdev: str = ""  # netdev: representor/veth name; vf: the PF
    netns: str = ""  # named network namespace ("" = the agent's own)
    vf: int = -1  # vf: VF index on the PF
    device: str = ""  # rdma: verbs device name
    port: int = 1  # rdma: port number
    root: str = "/"  # rdma: filesystem root holding sys/class/infiniband


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container on the underlay agent's host, for enrolment (:mod:`skh.orchestrator.enrol`):
    how to recognize its processes: its network namespace (a name under /run/netns, or a path
    such as /proc/PID/ns/net) or its host uid (user-namespaced containers)."""

    job: str
    container: str
    netns: str = ""
    uid: int = -1


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    bind: str = "tcp://127.0.0.1:5550"  # ROUTER: agents and admin requests
    pub_bind: str = "tcp://127.0.0.1:5551"  # PUB: per-job topics
    db: str = "/var/lib/skh/registry.db"
    heartbeat_interval_s: float = 2.0
    heartbeat_misses: int = 3
    command_timeout_s: float = 5.0
    command_retries: int = 2
    #: commands relayed and not answered yet; beyond it a command is refused and counted
    max_pending_commands: int = 4096
    hwm: int = 100_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    metrics: str = ""  # host:port, "" = off
    #: fabric file (:meth:`skh.model.Fabric.from_toml`): with it, probe plans hold every link of
    #: a skeleton to ``probe_link_min_per_s`` and size path rotation from the real ECMP width
    fabric: str = ""
    #: the probe policy handed out with every ping list (:class:`skh.probeplan.ProbePolicy`,
    #: docs/probing.md): a pair's interval, the fastest a floor may go, probes/s per endpoint
    #: sent and answered, probes/s per link, path coverage and its time, path ids per pair,
    #: ECMP width without a fabric, and the OK sampling agents and the analyzer share
    probe_interval_s: float = _POLICY.interval_s
    probe_min_interval_s: float = _POLICY.min_interval_s
    probe_budget_per_s: float = _POLICY.budget_per_s
    probe_answer_budget_per_s: float = _POLICY.answer_budget_per_s
    probe_link_min_per_s: float = _POLICY.link_min_per_s
    probe_access_link_min_per_s: float = _POLICY.access_link_min_per_s
    probe_path_coverage: float = _POLICY.path_coverage
    probe_coverage_s: float = _POLICY.coverage_s
    probe_max_paths: int = _POLICY.max_paths
    probe_default_ecmp_paths: int = _POLICY.default_ecmp_paths
    ok_sample_s: float = _POLICY.ok_sample_s


@dataclass(frozen=True, slots=True)
class AnalyzerConfig:
    bind: str = "tcp://127.0.0.1:5560"  # PULL: result and counter batches
    alerts_bind: str = "tcp://127.0.0.1:5561"  # PUB: alerts
    replay_bind: str = "tcp://127.0.0.1:5562"  # REP: replay since seq N
    alert_log: str = "/var/lib/skh/alerts.log"
    #: the alert log rotates at this size; rotated segments are deleted once their newest alert
    #: is older than the retention or all segments together exceed its size (0 = no such limit);
    #: sequence numbers continue across rotation (docs/alerts.md)
    alert_log_segment_bytes: int = 16 * 1024 * 1024
    alert_log_retention_s: float = 30 * 86400.0
    alert_log_retention_bytes: int = 1024 * 1024 * 1024
    round_s: float = 1.0
    spool_dir: str = ""  # write each round's raw batches as .npy ("" = off)
    spool_max_bytes: int = 1024**3  # the oldest spooled rounds go beyond this
    #: records one round holds, and one sender's share of them (the rest dropped, counted)
    max_round_records: int = 4_000_000
    max_sender_records: int = 524_288
    #: pipeline: skeleton inference, detection, localization and alerts (needs ``controller``
    #: and a fabric); detect: the streaming detector alone (network and agent suspects, no
    #: localization); none: ingest and spool only
    detector: str = "pipeline"
    #: the controller's ROUTER address: the pipeline reads the endpoint registry, installs
    #: skeleton lists and relays localization commands to the host agents through it
    controller: str = "tcp://127.0.0.1:5550"
    #: fabric file (:meth:`skh.model.Fabric.from_toml`): hosts, RNICs and switches by name
    fabric: str = ""
    #: pipeline settings file, JSON or TOML (:class:`skh.orchestrator.pipeline.PipelineConfig`
    #: less ``controller``: addr_owner, host_agents, vf_devices, detector and skeleton tuning)
    pipeline: str = ""
    #: the controller's PUB address: endpoint-to-job names and stopped containers for detection
    controller_pub: str = ""
    hwm: int = 10_000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    metrics: str = ""
    #: run the pipeline sharded over this Ray cluster (:mod:`skh.orchestrator.shard`): "local"
    #: starts one on this machine, "auto" joins the one it is part of, "ray://HOST:PORT" goes
    #: through Ray Client; "" (default) is the single process
    ray: str = ""
    ray_shards: int = 2
    #: PULL addresses of ingest front-ends on the Ray cluster, comma-separated (agents may push
    #: there instead of to ``bind``)
    ray_ingest: str = ""
    #: a shard's state is checkpointed every this many rounds
    ray_checkpoint_rounds: int = 30


#: underlay agents' counter samples per second (``agent.counter_hz``), also what the eval reads.
#: 10 Hz: pipeline partners show only in sub-second timing. On 13 quick-eval clusters skeleton
#: coverage is 1.0 at 10 Hz as at 1 Hz, and the ping list up to 41 % shorter (median 7 %; list
#: over used pairs 1.06-1.47 vs 1.18-2.24 at 1 Hz). (A pipeline without data parallelism read
#: as replicas at 10 Hz until groups had to burst in lockstep: skh/analysis/skeleton/stages.py.)
DEFAULT_COUNTER_HZ = 10


@dataclass(frozen=True, slots=True)
class AgentConfig:
    role: str = "overlay"  # overlay | underlay
    name: str = ""  # default: role-host-container
    host: str = ""  # default: this machine's hostname
    job: str = ""
    container: str = ""
    controller: str = "tcp://127.0.0.1:5550"
    controller_pub: str = "tcp://127.0.0.1:5551"
    analyzer: str = "tcp://127.0.0.1:5560"
    endpoints: tuple[EndpointSpec, ...] = ()
    sources: tuple[SourceSpec, ...] = ()
    #: underlay: a Unix socket path where this host's sidecars enrol their keys, and the
    #: containers on this host; overlay: the socket to enrol through ("" = no enrolment: the
    #: key is provisioned, docs/trust.md)
    enrol_socket: str = ""
    containers: tuple[ContainerSpec, ...] = ()
    transport: str = "udp"
    #: class of service of the probes: IP TOS / RoCE GRH traffic class byte (DSCP << 2) and
    #: priority (UDP SO_PRIORITY, verbs service level); set to the training traffic's class so
    #: probes share its queue (commonly DSCP 26, priority 3: 104 and 3; docs/engine.md)
    traffic_class: int = 0
    priority: int = 0
    #: per skeleton peer: a 2 % loss shows in a second only at this rate (R-Pingmesh also wants
    #: >= 10 probes/s on every link); the analyzer keeps one RTT per pair and second anyway
    probe_interval_s: float = 0.1
    probe_timeout_s: float = 1.0
    #: forward every failure but one OK per pair and this period: the analyzer's
    #: ``detector.latency_sample_s`` (it keeps no more); 0 forwards every OK
    ok_sample_s: float = 1.0
    batch_interval_s: float = 1.0
    #: overlay: each engine thread wakes up at most once per this many seconds (``Engine``
    #: ``tick_s``, at most 5 ms): the peers' probes that arrive within it are answered together,
    #: which at the busiest container's rate saves about a quarter of the agent's CPU. RTTs stay
    #: as they are (the tick applies only where the stamps are taken on the wire); responder and
    #: prober delays grow by up to a tick, so the analyzer's delay health check
    #: (skh.analysis.health: 3x its learnt baseline) misses host-side rises smaller than about a
    #: tick. 0 = a wake-up per event (docs/engine.md, "Wake-ups")
    engine_tick_s: float = ENGINE_TICK_S
    #: overlay: the engines' batching grids start at the wall clock's epoch (``Engine``
    #: ``wall_grid``), so every agent whose clock agrees probes at the same instants and an
    #: endpoint answers its peers' probes of an interval in one wake-up instead of one by one
    #: (docs/engine.md, "Wake-ups"); the network is then sampled in step everywhere
    engine_wall_grid: bool = False
    #: overlay: only the probes whose OK may be a pair's latency sample (one per pair and
    #: ``ok_sample_s``, the one the analyzer keeps) ask for an RTT; the others ask for one answer
    #: and take no send stamps (docs/engine.md, "One answer per probe"). False: every probe asks
    #: (two answers and two send stamps each), e.g. for the RTT histogram of every probe
    engine_rtt_samples_only: bool = True
    #: overlay: the agent's engines (one per endpoint) share one thread, which wakes up once for
    #: all of them (``skh.probe.EngineThread``): at the busiest container's rate the agent took
    #: 12-14 % less CPU, with 40 % fewer wake-ups, than with a thread each (docs/engine.md, "One
    #: thread for the agent's engines"). Nothing the thread calls blocks, so an endpoint in
    #: trouble does not hold the others up; False gives each engine a thread of its own
    engine_shared_thread: bool = True
    #: underlay: counters are sampled this far into each sampling interval (as a share of it:
    #: 0.5 s into each second at 1 Hz), on every host alike on the wall clock's grid (see
    #: :mod:`skh.orchestrator.agent_underlay` for why)
    sample_phase_s: float = 0.5
    #: underlay: counter samples per second (whole); skeleton inference tells pipeline partners
    #: apart by their sends' timing, which 1 Hz hides (bench/skeleton.py assumes 10 Hz); the
    #: samples still ship once per ``batch_interval_s``
    counter_hz: int = DEFAULT_COUNTER_HZ
    #: underlay: watch this host's VXLAN frames (to this UDP port) all the time, so a trace of a
    #: probe flow finds its outer port learned at once (:mod:`skh.collect.vxlan`); 0 = watch only
    #: while a trace waits for its flow
    learn_vxlan_port: int = 4789
    buffer_s: float = 300.0  # results kept while the analyzer is unreachable
    #: probes/s the agent sends at most: sizes the buffer (buffer_s x rate records) and each
    #: engine's result ring and in-flight table (its endpoint's share; agent_overlay)
    max_probe_rate: float = 1000.0
    ready_file: str = ""  # report ready only once this file exists ("" = at once)
    request_timeout_s: float = 2.0
    hwm: int = 1_000
    metrics: str = ""

    @property
    def agent_name(self) -> str:
        if self.name:
            return self.name
        if self.role == "underlay":
            return underlay_identity(self.host)
        return f"{self.role}-{self.host}" + (f"-{self.container}" if self.container else "")


@dataclass(frozen=True, slots=True)
class Config:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def to_mapping(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "controller": ControllerConfig,
    "analyzer": AnalyzerConfig,
    "agent": AgentConfig,
    "security": SecurityConfig,
}
_ITEM_TYPES = {"endpoints": EndpointSpec, "sources": SourceSpec, "containers": ContainerSpec}


def _coerce(where: str, tp: Any, value: Any) -> Any:
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"The '{where}' setting must be a number. Got {value!r} instead.")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"The '{where}' setting must be an int. Got {value!r} instead.")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(
                f"The '{where}' setting must be true or false. Got {value!r} instead."
            )
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"The '{where}' setting must be a string. Got {value!r} instead.")
        return value
    raise ConfigError(f"unsupported setting type for {where}")


def _build(cls: type, where: str, data: Mapping[str, Any]) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"The '{where}' setting must be a table. Got {data!r} instead.")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown setting(s) in [{where}]: {', '.join(unknown)}")
    kwargs = {}
    for key, value in data.items():
        if key in _ITEM_TYPES:
            if not isinstance(value, (list, tuple)):
                raise ConfigError(
                    f"The '{where}.{key}' setting must be a list of tables. Got {value!r} instead."
                )
            kwargs[key] = tuple(
                _build(_ITEM_TYPES[key], f"{where}.{key}[{i}]", v) for i, v in enumerate(value)
            )
        else:
            kwargs[key] = _coerce(f"{where}.{key}", hints[key], value)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` with the value parsed as TOML (so ``3``, ``true``, ``[..]`` work) or,
    failing that, taken as a plain string."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"an override must look like section.key=value. Got {text!r} instead.")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> Config:
    """Read ``path`` (optional), apply dotted ``overrides`` and validate everything."""
    data: dict[str, dict[str, Any]] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        unknown = sorted(set(raw) - set(_SECTIONS))
        if unknown:
            raise ConfigError(f"unknown config section(s): {', '.join(unknown)}")
        data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    for key, value in (overrides or {}).items():
        section, _, name = key.partition(".")
        if section not in _SECTIONS or not name:
            raise ConfigError(
                f"unknown override {key!r}: expected one of {', '.join(_SECTIONS)}.<key>"
            )
        data.setdefault(section, {})[name] = value
    built = {name: _build(cls, name, data.get(name, {})) for name, cls in _SECTIONS.items()}
    cfg = Config(**built)
    _validate(cfg)
    return cfg


def _validate(cfg: Config) -> None:
    def positive(where: str, v: float) -> None:
        if v <= 0:
            raise ConfigError(f"The '{where}' setting must be > 0. Got {v!r} instead.")

    c, a, g = cfg.controller, cfg.analyzer, cfg.agent
    ProbePolicy.from_config(c)
    for where, v in (
        ("controller.heartbeat_interval_s", c.heartbeat_interval_s),
        ("controller.command_timeout_s", c.command_timeout_s),
        ("controller.heartbeat_misses", c.heartbeat_misses),
        ("controller.max_pending_commands", c.max_pending_commands),
        ("controller.hwm", c.hwm),
        ("analyzer.round_s", a.round_s),
        ("analyzer.hwm", a.hwm),
        ("analyzer.ray_shards", a.ray_shards),
        ("analyzer.ray_checkpoint_rounds", a.ray_checkpoint_rounds),
        ("analyzer.spool_max_bytes", a.spool_max_bytes),
        ("analyzer.max_round_records", a.max_round_records),
        ("analyzer.max_sender_records", a.max_sender_records),
        ("agent.probe_interval_s", g.probe_interval_s),
        ("agent.probe_timeout_s", g.probe_timeout_s),
        ("agent.batch_interval_s", g.batch_interval_s),
        ("agent.buffer_s", g.buffer_s),
        ("agent.max_probe_rate", g.max_probe_rate),
        ("agent.request_timeout_s", g.request_timeout_s),
        ("agent.hwm", g.hwm),
    ):
        positive(where, v)
    if c.command_retries < 0:
        raise ConfigError(
            "The 'controller.command_retries' setting must be >= 0. "
            f"Got {c.command_retries} instead."
        )
    if not g.ok_sample_s >= 0:
        raise ConfigError(
            f"The 'agent.ok_sample_s' setting must be >= 0. Got {g.ok_sample_s!r} instead."
        )
    if not 0 <= g.engine_tick_s <= MAX_ENGINE_TICK_S:
        raise ConfigError(
            f"The 'agent.engine_tick_s' setting must be in [0, {MAX_ENGINE_TICK_S:g}]."
            f" Got {g.engine_tick_s!r} instead."
        )
    if not (isinstance(g.counter_hz, int) and 1 <= g.counter_hz <= 100):
        raise ConfigError(
            "The 'agent.counter_hz' setting must be a whole number of samples per second in "
            f"[1, 100]. Got {g.counter_hz!r} instead."
        )
    if not 0.0 <= g.sample_phase_s < 1.0:
        raise ConfigError(
            "The 'agent.sample_phase_s' setting must be in [0, 1)."
            f" Got {g.sample_phase_s!r} instead."
        )
    if not (isinstance(g.learn_vxlan_port, int) and 0 <= g.learn_vxlan_port <= 65535):
        raise ConfigError(
            "The 'agent.learn_vxlan_port' setting must be a UDP port, or 0 for none."
            f" Got {g.learn_vxlan_port!r} instead."
        )
    if g.role not in ("overlay", "underlay"):
        raise ConfigError(
            f"The 'agent.role' setting must be 'overlay' or 'underlay'. Got {g.role!r} instead."
        )
    if not 0 <= g.traffic_class <= 255 or not 0 <= g.priority <= 7:
        raise ConfigError(
            "The 'agent.traffic_class' setting must be in 0..255 and 'agent.priority' in 0..7."
            f" Got {g.traffic_class} and {g.priority} instead."
        )
    if g.transport not in ("udp", "verbs"):
        raise ConfigError(
            f"The 'agent.transport' setting must be 'udp' or 'verbs'. Got {g.transport!r} instead."
        )
    if a.detector not in ("pipeline", "detect", "none"):
        raise ConfigError(
            "The 'analyzer.detector' setting must be 'pipeline', 'detect' or 'none'. "
            f"Got {a.detector!r} instead."
        )
    if a.ray and a.detector != "pipeline":
        raise ConfigError(
            "The 'analyzer.ray' setting shards the pipeline: it needs analyzer.detector = "
            f"'pipeline'. Got {a.detector!r} instead."
        )
    Retention(a.alert_log_segment_bytes, a.alert_log_retention_s, a.alert_log_retention_bytes)
    rails = [e.rail for e in g.endpoints]
    if len(set(rails)) != len(rails):
        raise ConfigError(f"agent.endpoints: two endpoints on one rail ({rails})")
    for e in g.endpoints:
        if not 0 <= e.rail < 256 or not 0 <= e.port < 65536:
            raise ConfigError(f"agent.endpoints: rail {e.rail} / port {e.port} out of range")
    for spec in g.containers:
        if not spec.job or not spec.container or (not spec.netns and spec.uid < 0):
            raise ConfigError(
                "agent.containers: each needs job, container and a netns or a uid. "
                f"Got {spec!r} instead."
            )
    for s in g.sources:
        if s.kind not in ("netdev", "vf", "rdma"):
            raise ConfigError(
                f"agent.sources: kind must be netdev, vf or rdma. Got {s.kind!r} instead."
            )
        if s.endpoint.count("/") != 2:
            raise ConfigError(
                f"agent.sources: endpoint must be job/container/rail. Got {s.endpoint!r} instead."
            )


def default_host() -> str:
    return socket.gethostname()
