"""The live demo (root): the namespace testbed, the real daemons, traffic, scripted faults.

:class:`LiveDemo` is also what the end-to-end test drives: ``start()`` builds everything and
waits until every job runs on its inferred skeleton, :meth:`LiveDemo.fault` injects one fault
and follows the alert bus until it is localized and, once cleared, resolved, and ``stop()``
tears everything down and checks nothing is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from skh.errors import ConfigError, TestbedError
from skh.failures import FailureType, class_members
from skh.model import JobShape
from skh.orchestrator.admin import ControllerClient, unpack_skeleton
from skh.orchestrator.alerts import AlertFollower
from skh.orchestrator.keyring import Keyring, make_keyring, security_args
from skh.orchestrator.security import SecurityConfig
from skh.testbed.faults import KINDS

__all__ = ["ALL_FAULTS", "DemoSpec", "FaultOutcome", "LiveDemo", "truth_pairs", "matches"]

log = logging.getLogger(__name__)

#: ``skh demo --all-faults``: every kind the testbed injects, in its order
ALL_FAULTS: tuple[str, ...] = KINDS
#: the longest path a Unix socket may have (``sun_path`` holds 108 bytes with its NUL)
_SUN_PATH_MAX = 107


@dataclass(frozen=True, slots=True)
class DemoSpec:
    """The emulated cluster and the timing of the demo (defaults fit two cores)."""

    hosts: int = 4
    rnics_per_host: int = 4
    hosts_per_segment: int = 2
    spines: int = 2
    prefix: str = "skht"
    port_base: int = 7550
    probe_interval_s: float = 0.25
    period_s: float = 4.0
    skeleton_timeout_s: float = 120.0
    skeleton_upgrade_s: float = (
        90.0  # how long a provisional (fallback) skeleton may wait for the real one
    )
    detect_timeout_s: float = 45.0
    resolve_timeout_s: float = 45.0
    hold_s: float = 3.0
    settle_s: float = 4.0
    slow_path_delay_ms: float = 5.0
    faults: tuple[str, ...] = ("link_down", "fdb_blackhole", "slow_path", "agent_crash")
    #: the keyring's root (docs/trust.md layout: made there, or completed if some keys exist);
    #: empty: ``RUN_DIR/keys``, made afresh for each run
    keys_dir: str = ""
    #: plain-text links and no identities (``--insecure``): for comparison only, never the default
    insecure: bool = False
    #: the pipeline's ``trace_learn_s``: traces pinned to the probe flows' ECMP paths (0: off;
    #: see skh.orchestrator.pipeline.config)
    trace_learn_s: float = 5.0

    def __post_init__(self) -> None:
        # none: the caller injects its own (LiveDemo.fault)
        unknown = [repr(k) for k in self.faults if k not in KINDS]
        if unknown:
            raise ConfigError(
                f"unknown fault kind(s) {', '.join(unknown)}:"
                f" the testbed injects {', '.join(KINDS)}"
            )
        if self.insecure and self.keys_dir:
            raise ConfigError("a keys directory and --insecure exclude each other")
        if not isinstance(self.hosts, int) or self.hosts < 4 or self.hosts % 2:
            raise ConfigError(
                "The 'hosts' parameter of DemoSpec must be an even int >= 4."
                f" Got {self.hosts!r} instead."
            )
        if not isinstance(self.rnics_per_host, int) or not 1 <= self.rnics_per_host <= 8:
            raise ConfigError(
                "The 'rnics_per_host' parameter of DemoSpec must be an int in [1, 8]."
                f" Got {self.rnics_per_host!r} instead."
            )
        if not isinstance(self.port_base, int) or not 1024 <= self.port_base <= 65000:
            raise ConfigError(
                "The 'port_base' parameter of DemoSpec must be an int in [1024, 65000]."
                f" Got {self.port_base!r} instead."
            )

    def testbed_spec(self) -> Any:
        from skh.testbed import JobSpec, TestbedSpec

        r = self.rnics_per_host
        return TestbedSpec(
            hosts=self.hosts,
            rnics_per_host=r,
            hosts_per_segment=self.hosts_per_segment,
            spines=self.spines,
            containers_per_host=2,
            jobs=(
                JobSpec("job0", JobShape(tp=r, pp=2, dp=self.hosts // 2)),
                JobSpec("job1", JobShape(tp=r, pp=1, dp=self.hosts)),
            ),
        )

    def pipeline_settings(self) -> dict[str, Any]:
        """Detection and skeleton timing scaled to a demo of minutes (the defaults are the
        production ones: 30 s windows, 5 min look-back, 90 s of counters)."""
        return {
            "detector": {
                "window_s": 4.0,
                "hop_s": 2.0,
                "lookback_windows": 6,
                "min_lookback_windows": 4,
                "lof_k": 3,
                "min_window_samples": 6,
                "allowed_lateness_s": 2.0,
                "clear_after_s": 6.0,
                # a 4 s window keeps every probe (the agents forward every OK at this period)
                "latency_sample_s": self.probe_interval_s,
                # two shared cores jitter namespace RTTs by hundreds of µs: only a real detour
                # counts
                "min_shift_us": 1000.0,
                # a shift must hold as long as in production relative to the windows (20 s and
                # 8 s for a large one against 30 s windows), not the production seconds
                "min_sustained_s": 4.0,
                "large_sustained_s": 2.0,
                "fast": {"unreachable_after": 3, "loss_count": 3, "loss_window_s": 5.0},
                # user-space stamps on two busy cores swing by milliseconds: only a stall counts
                "health": {
                    "delay_factor": 10.0,
                    "delay_floor_us": 20000.0,
                    "heartbeat_overdue_s": 3.0,
                    "heartbeat_timeout_s": 6.0,
                },
            },
            "skeleton": {
                "window_s": 16,
                "hop_s": 4,
                "min_duration_s": 44,
                "min_period_s": 2.0,
                "max_period_s": 20.0,
                "idle_bytes_per_s": 1e5,
            },
            "skeleton_every_s": 5.0,
            # a minute of counters: a provisional (fallback) skeleton is re-inferred on fresh
            # bursts instead of the whole run's history
            "history_s": 60.0,
            "resolve_after_s": 8.0,
            "command_timeout_s": 8.0,
            "trace_max_ttl": 5,
            "trace_learn_s": self.trace_learn_s,
            "rnic_dump_interval_s": 5.0,
        }


@dataclass(slots=True)
class FaultOutcome:
    """One injected fault, scored against what the alert bus said."""

    truth: dict[str, Any]
    injected_ns: int
    cleared_ns: int = 0
    detected: dict[str, Any] | None = None  # the matching open alert
    resolved: dict[str, Any] | None = None  # its resolution
    others: list[dict[str, Any]] = field(default_factory=list)  # other alerts opened meanwhile

    @property
    def caught(self) -> bool:
        return self.detected is not None

    @property
    def ok(self) -> bool:
        return self.detected is not None and self.resolved is not None

    @property
    def type_ok(self) -> bool | None:
        """Whether the placing alert names the injected type (or one nothing the system reads
        tells apart from it, :func:`skh.failures.class_members`); None: no alert, or the
        testbed gives the fault no type."""
        want = self.truth.get("paper_type")
        if self.detected is None or want is None:
            return None
        got = self.detected.get("failure_type_id")
        return got is not None and int(got) in class_members(FailureType(int(want)))

    @property
    def alert_s(self) -> float | None:
        """Fault → the alert that places it (on the bus)."""
        if self.detected is None:
            return None
        return (self.detected["ts_ns"] - self.injected_ns) / 1e9

    @property
    def detect_s(self) -> float | None:
        """Fault → the first detection event: the one the placing alert answers, else the
        first other alert's (the system saw something, but placed it elsewhere)."""
        for a in ([self.detected] if self.detected else []) + self.others:
            ns = (a.get("detection") or {}).get("detected_ns")
            if ns:
                return (int(ns) - self.injected_ns) / 1e9
        return None

    @property
    def resolve_s(self) -> float | None:
        """Repair → the alert resolved."""
        if self.resolved is None or not self.cleared_ns:
            return None
        return (self.resolved["ts_ns"] - self.cleared_ns) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {
            "truth": self.truth,
            "injected_ns": self.injected_ns,
            "cleared_ns": self.cleared_ns,
            "detected": self.detected,
            "resolved": self.resolved,
            "others": self.others,
            "caught": self.caught,
            "ok": self.ok,
            "detect_s": self.detect_s,
            "alert_s": self.alert_s,
            "resolve_s": self.resolve_s,
            "type_ok": self.type_ok,
        }


def matches(truth: dict[str, Any], alert: dict[str, Any]) -> bool:
    """Whether an alert places the fault on the truth's layer and component.

    The testbed names a link ``(a, b)`` and an overlay FDB hop by its (VTEP, remote VTEP) pair;
    the localizer names a link ``a|b`` and an overlay hop ``host/vtep:<dev>`` (the source host's
    VTEP whose forwarding entry is missing); an agent is ``job/container`` on both sides.
    """
    comp, layer = truth["component"], truth["layer"]
    if alert.get("kind") != "fault":
        return False
    if truth["kind"] in ("link_down", "link_flap", "loss") and layer == "underlay":
        return alert["layer"] == "underlay" and alert["component"] == "|".join(sorted(comp))
    if layer == "rnic":
        return alert["layer"] == "rnic" and alert["component"] == comp
    if truth["kind"] == "fdb_blackhole":
        host, _, dev = comp[0].partition(":")
        return alert["layer"] == "overlay" and alert["component"] in (
            f"{host}/vtep:{dev}",
            f"{host}/route",
        )
    if truth["kind"] == "overlay_loop":
        # a loop has no first hop: the walk names where it re-enters, on either looping host
        names = set()
        for vtep in comp:
            host, _, dev = vtep.partition(":")
            names |= {f"{host}/vtep:{dev}", f"{host}/route", f"{host}/decap:{dev}"}
        return alert["layer"] == "overlay" and alert["component"] in names
    if truth["kind"] in ("agent_crash", "agent_hang"):
        return alert["layer"] == "agent" and alert["component"] == comp
    if truth["kind"] == "container_crash":
        return alert["component"].endswith("/" + comp)
    return alert["component"] == comp


def truth_pairs(cluster: Any, job: str) -> set[tuple[int, int]]:
    """The ordered pairs the traffic generator really uses: every pair of a DP group and both
    directions of each PP pair."""
    from skh.testbed.traffic import job_skeleton

    groups, pp = job_skeleton(cluster, job)
    out = {(a, b) for g in groups for a in g for b in g if a != b}
    out |= {(a, b) for a, b in pp} | {(b, a) for a, b in pp}
    return out


class _Bus:
    """Follows the alert bus on a thread; keeps every record."""

    def __init__(self, replay: str, alerts: str, security: SecurityConfig) -> None:
        self.records: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._follower = AlertFollower(
            zmq.Context.instance(), replay=replay, alerts=alerts, security=security
        )
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._thread = threading.Thread(target=self._run, name="skh-demo-bus", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for rec in self._follower.follow(
                    self.records[-1]["seq"] if self.records else 0, idle_timeout_s=0.5
                ):
                    flat = {**rec["alert"], "seq": rec["seq"], "ts_ns": rec["ts_ns"]}
                    with self.cond:
                        self.records.append(flat)
                        self.cond.notify_all()
                    for fn in self.listeners:
                        fn(flat)
                    if self._stop.is_set():
                        break
            except Exception as exc:  # the analyzer not up yet, a replay timeout: retry
                log.debug("alert bus: %s", exc)
                time.sleep(0.5)

    def wait(
        self, pred: Callable[[dict[str, Any]], bool], timeout_s: float, since: int = 0
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for r in self.records:
                    if r["seq"] > since and pred(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.5))

    @property
    def last_seq(self) -> int:
        with self.cond:
            return self.records[-1]["seq"] if self.records else 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)
        self._follower.close()


class LiveDemo:
    """The whole system on a namespace testbed. Root only.

    Secure unless the spec says ``insecure``: :meth:`make_keys` writes a keyring in the layout of
    docs/trust.md (a key pair for the controller, the analyzer, each host's underlay agent, the
    demo's own operator client and one alert subscriber); each sidecar makes its own key in its
    container and enrols it through its host's underlay agent, which vouches for it by the
    network namespace the kernel reports for the caller. No two processes share a secret.
    """

    def __init__(
        self, spec: DemoSpec, run_dir: Path, *, say: Callable[[str], None] = print
    ) -> None:
        from skh.testbed import Testbed

        self.spec = spec
        self.run_dir = Path(run_dir)
        self.say = say
        # every process's output stays in the run directory after teardown: a failed run is
        # diagnosed from it (the testbed's own log directory goes with the testbed)
        self.tb = Testbed(spec.testbed_spec(), prefix=spec.prefix, log_dir=self.run_dir / "logs")
        self.cluster = self.tb.cluster()
        self.addr = self._addresses()
        self.ring: Keyring | None = None
        self.enrol_dir = self.run_dir / "enrol"
        self._own_enrol_dir = False  # a temporary directory of ours (the run's path is too long)
        self.procs: dict[str, Any] = {}
        self.bus: _Bus | None = None
        self.client: ControllerClient | None = None
        self.outcomes: list[FaultOutcome] = []
        self.skeletons: dict[str, dict[str, Any]] = {}
        self.timeline: list[tuple[int, str]] = []
        self.t_start_ns = 0
        self.t_end_ns = 0

    def _addresses(self) -> dict[str, str]:
        """The daemons' sockets, on the management network's root address (which ``tb.up()``
        may move off the prefix's preferred subnet when another testbed holds it)."""
        ip, p = self.tb.layout.mgmt_root_ip(), self.spec.port_base
        return {
            "router": f"tcp://{ip}:{p}",
            "pub": f"tcp://{ip}:{p + 1}",
            "pull": f"tcp://{ip}:{p + 10}",
            "alerts": f"tcp://{ip}:{p + 11}",
            "replay": f"tcp://{ip}:{p + 12}",
        }

    # -- identities ---------------------------------------------------------------------------
    def make_keys(self) -> None:
        """The run's keyring (nothing when insecure) and the directory of the enrolment
        sockets."""
        if self.spec.insecure:
            return
        hosts = [self.tb.layout.host_name(g) for g in range(self.spec.hosts)]
        root = Path(self.spec.keys_dir) if self.spec.keys_dir else self.run_dir / "keys"
        self.ring = make_keyring(root.resolve(), hosts=hosts)
        self.enrol_dir = self.run_dir.resolve() / "enrol"
        longest = max(len(str(self.enrol_dir / f"{h}.sock")) for h in hosts)
        if longest > _SUN_PATH_MAX:
            self.enrol_dir = Path(tempfile.mkdtemp(prefix="skh-enrol-"))
            self._own_enrol_dir = True

    def _keys(self, who: Callable[[Keyring], SecurityConfig]) -> list[str]:
        return ["--insecure"] if self.ring is None else security_args(who(self.ring))

    def _enrol(self, host: str) -> list[str]:
        return [] if self.ring is None else ["--enrol-socket", str(self.enrol_dir / f"{host}.sock")]

    def admin_security(self) -> SecurityConfig:
        """The demo's own controller client: the operator."""
        return SecurityConfig(insecure=True) if self.ring is None else self.ring.admin()

    def subscriber_security(self) -> SecurityConfig:
        """The demo's alert follower, and the printed ``skh alerts tail``: a subscriber, which
        may read the alert log and topic and nothing else."""
        return SecurityConfig(insecure=True) if self.ring is None else self.ring.subscriber()

    def tail_command(self) -> str:
        """How to follow this run's alerts from another terminal, with a subscriber's keys."""
        sec = self.subscriber_security()
        keys = (
            "--insecure"
            if sec.insecure
            else f"--server-key {sec.server_public_key} --client-key {sec.client_secret_key}"
        )
        return (
            f"skh alerts tail {keys} --replay {self.addr['replay']} --alerts {self.addr['alerts']}"
        )

    # -- the daemons' command lines -----------------------------------------------------------
    def controller_argv(self) -> list[str]:
        return [
            "python",
            "-m",
            "skh",
            "controller",
            *self._keys(Keyring.controller),
            "--bind",
            self.addr["router"],
            "--pub-bind",
            self.addr["pub"],
            "--db",
            str(self.run_dir / "registry.db"),
            "--heartbeat-interval",
            "0.5",
            # the probing every agent and the analyzer share (docs/probing.md)
            "--set",
            f"controller.probe_interval_s={self.spec.probe_interval_s}",
            "--set",
            f"controller.ok_sample_s={self.spec.probe_interval_s}",
            "--print-endpoints",
        ]

    def analyzer_argv(self) -> list[str]:
        return [
            "python",
            "-m",
            "skh",
            "-v",
            "analyzer",
            *self._keys(Keyring.analyzer),
            "--pipeline",
            str(self.run_dir / "pipeline.json"),
            "--controller",
            self.addr["router"],
            "--print-endpoints",
            "--bind",
            self.addr["pull"],
            "--alerts-bind",
            self.addr["alerts"],
            "--replay-bind",
            self.addr["replay"],
            "--alert-log",
            str(self.run_dir / "alerts.log"),
            "--spool-dir",
            str(self.run_dir / "spool"),
        ]

    def _links(self) -> list[str]:
        return [
            "--controller",
            self.addr["router"],
            "--controller-pub",
            self.addr["pub"],
            "--analyzer",
            self.addr["pull"],
        ]

    def underlay_argv(self, g: int) -> list[str]:
        """Host ``g``'s agent: its counters' sources, and its containers by network namespace
        (what it vouches for at enrolment and reports in ``host_report``)."""
        L, host = self.tb.layout, self.tb.layout.host_name(g)
        argv = [
            "python",
            "-m",
            "skh.demo.agent",
            *self._keys(lambda ring: ring.underlay(host)),
            *self._enrol(host),
            "--name",
            f"ul-{host}",
            "--host",
            host,
            *self._links(),
        ]
        for e in self.cluster.endpoints:
            if e.host == host:
                argv += [
                    "--source",
                    f"endpoint={e.name},kind=netdev,netdev={self.tb.representor(e)[1]}",
                ]
        for c in L.placements:
            if c.host == g:
                argv += [
                    "--host-container",
                    f"job={c.job},container={c.name},netns={L.container_ns(c.host, c.slot)}",
                ]
        return argv

    def sidecar_argv(self, c: Any) -> list[str]:
        """The overlay agent of container ``c`` (a testbed placement), run in its namespace."""
        L, spec = self.tb.layout, self.spec
        host = L.host_name(c.host)
        argv = [
            "python",
            "-m",
            "skh",
            "agent",
            *self._keys(lambda ring: ring.sidecar(c.job, c.name)),
            *self._enrol(host),
            "--role",
            "overlay",
            "--name",
            f"ov-{c.name}",
            "--host",
            host,
            "--job",
            c.job,
            "--container",
            c.name,
            "--probe-interval",
            str(spec.probe_interval_s),
            "--set",
            f"agent.ok_sample_s={spec.probe_interval_s}",
            *self._links(),
        ]
        for r in range(spec.rnics_per_host):
            argv += ["--endpoint", f"rail={r},ip={L.vf_ip(c.host, c.slot, r)},netdev=vf{r}"]
        return argv

    # -- set-up -------------------------------------------------------------------------------
    def mark(self, what: str) -> None:
        self.timeline.append((time.time_ns(), what))
        self.say(what)

    def _wait_log(self, rec: Any, needle: bytes, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if needle in Path(rec.log).read_bytes():
                    return
            if not rec.alive():
                break
            time.sleep(0.05)
        tail = Path(rec.log).read_text(errors="replace")[-800:] if Path(rec.log).exists() else ""
        raise TestbedError(f"{rec.role} did not start: {tail}")

    def _pipeline_config(self) -> Path:
        tb, L = self.tb, self.tb.layout
        vf_devices = {e.name: tb.representor(e)[1] for e in self.cluster.endpoints}
        cfg = {
            "fabric": tb.fabric().to_mapping(),
            "addr_owner": tb.ip_owners(),
            "host_agents": {L.host_name(g): f"ul-{L.host_name(g)}" for g in range(self.spec.hosts)},
            "vf_devices": vf_devices,
            **self.spec.pipeline_settings(),
        }
        path = self.run_dir / "pipeline.json"
        path.write_text(json.dumps(cfg, indent=1))
        return path

    def start(self) -> None:
        """Everything up, every job on its inferred skeleton."""
        self.start_daemons()
        self.start_traffic()

    def start_daemons(self) -> None:
        """The testbed, the keys and every daemon, until each endpoint is ready and each host's
        underlay agent registered."""
        if os.geteuid() != 0:
            raise TestbedError("the live demo needs root (network namespaces); try --sim")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.t_start_ns = time.time_ns()
        tb, L, spec = self.tb, self.tb.layout, self.spec
        self.mark(
            f"building the testbed: {spec.hosts} hosts x {spec.rnics_per_host} RNICs, "
            f"{len(L.placements)} containers, {len(self.cluster.endpoints)} endpoints"
        )
        tb.up()
        self.addr = self._addresses()
        for name in ("registry.db", "alerts.log"):
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / name).unlink()
        spool = self.run_dir / "spool"
        spool.mkdir(exist_ok=True)
        for f in spool.glob("*.npy"):
            f.unlink()
        self.make_keys()
        if self.ring is not None:
            self.mark(
                f"CURVE on every link: a key per daemon and host agent in {self.ring.root}; "
                "each sidecar makes its own and enrols it through its host's agent"
            )
        ctl = tb.spawn(
            self.controller_argv(), role="controller", log_path=self.run_dir / "controller.log"
        )
        self._wait_log(ctl, b'"router"')
        self.procs["controller"] = ctl
        self.client = ControllerClient(self.addr["router"], self.admin_security())
        for job in self.tb.spec.effective_jobs():
            # submitted in the model's order, so the controller numbers endpoints as the model does
            got = self.client.submit_job(self.cluster.jobs[job.name])
            for e in self.cluster.job_endpoints(job.name):
                if got.get(e.name) != e.ep_id:
                    raise TestbedError(
                        f"controller numbered {e.name} {got.get(e.name)}, the model {e.ep_id}"
                    )
        self._pipeline_config()
        an = tb.spawn(self.analyzer_argv(), role="analyzer", log_path=self.run_dir / "analyzer.log")
        self._wait_log(an, b'"pull"')
        self.procs["analyzer"] = an
        self.bus = _Bus(self.addr["replay"], self.addr["alerts"], self.subscriber_security())
        self.mark(
            "controller and analyzer up; follow the alerts from another terminal: "
            f"{self.tail_command()}"
        )
        for g in range(spec.hosts):
            host = L.host_name(g)
            self.procs[f"ul-{host}"] = tb.spawn(
                self.underlay_argv(g), ns=L.host_ns(g), role=f"ul-{host}"
            )
        for c in L.placements:
            self.procs[f"ov-{c.name}"] = tb.spawn(
                self.sidecar_argv(c), ns=L.container_ns(c.host, c.slot), role=f"ov-{c.name}"
            )
        self._wait_ready()

    def start_traffic(self) -> None:
        """The jobs' training traffic, until the analyzer inferred each job's skeleton."""
        from skh.testbed.traffic import TrafficConfig

        tb, spec = self.tb, self.spec
        cfg = TrafficConfig(period_s=spec.period_s, slot_s=spec.period_s / 4)
        t0 = (time.time_ns() // 1_000_000_000 + 3) * 1_000_000_000
        for job in self.tb.spec.effective_jobs():
            tb.start_traffic(job.name, cfg, t0_ns=t0)
        self.mark(
            "training traffic started (DP all-reduce and PP bursts); "
            "inferring skeletons from counters"
        )
        self._wait_skeletons()

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        assert self.client is not None
        want = len(self.cluster.endpoints)
        deadline = time.monotonic() + timeout_s
        ready = ul = 0
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                st = self.client.status()
                ready = sum(j["ready"] for j in st["jobs"].values())
                agents = st["agents"]
                ul = sum(1 for a in agents.values() if a["role"] == "underlay" and a["alive"])
                if ready == want and ul == self.spec.hosts:
                    self.mark(
                        f"{len(agents)} agents registered, {ready} endpoints ready, "
                        "probing the preload lists"
                    )
                    return
            time.sleep(0.5)
        raise TestbedError(
            f"{ready} of {want} endpoints became ready and {ul} of {self.spec.hosts} host agents"
            f" registered within {timeout_s:g} s"
        )

    def _wait_skeletons(self) -> None:
        assert self.bus is not None and self.client is not None
        for job in self.tb.spec.effective_jobs():

            def of_job(r: dict[str, Any], j: str = job.name) -> bool:
                return r.get("kind") == "skeleton" and r.get("job") == j

            rec = self.bus.wait(of_job, self.spec.skeleton_timeout_s)
            if rec is None:
                raise TestbedError(
                    f"no skeleton for {job.name} within {self.spec.skeleton_timeout_s:g} s"
                )
            if rec["mode"] != "skeleton":
                # a fallback list is provisional: the analyzer re-infers every round until the
                # bursts fit (a loaded machine can blur the first minute of a job's traffic)
                self.mark(
                    f"skeleton of {job.name}: provisional {rec['mode']} "
                    f"({rec['reason'][:80]}); waiting"
                )
                better = self.bus.wait(
                    lambda r: of_job(r) and r["mode"] == "skeleton",
                    self.spec.skeleton_upgrade_s,
                    since=rec["seq"],
                )
                rec = better or rec
            snap = self.client.snapshot(job.name)
            pairs = unpack_skeleton(snap)
            applied = set() if pairs is None else {(int(a), int(b)) for a, b in pairs.tolist()}
            truth = truth_pairs(self.cluster, job.name)
            self.skeletons[job.name] = {
                "alert": rec,
                "applied": sorted(applied),
                "truth": sorted(truth),
                "equal": applied == truth,
                # probed wider than the traffic is fine (the inference says why it kept a
                # group); a pair the job uses and nobody probes is not
                "covers": truth <= applied,
                "endpoints": [e.ep_id for e in self.cluster.job_endpoints(job.name)],
            }
            if applied == truth:
                vs = "equal"
            elif truth <= applied:
                vs = f"covers it, {len(applied - truth)} pairs more"
            else:
                vs = f"MISSES {len(truth - applied)} pairs"
            self.mark(
                f"skeleton of {job.name}: {rec['mode']}, {len(applied)} pairs "
                f"(truth {len(truth)}: {vs}), confidence {rec['confidence']:.2f}"
            )

    # -- faults -------------------------------------------------------------------------------
    def default_params(self, kind: str) -> dict[str, Any]:
        L, r_last = self.tb.layout, self.spec.rnics_per_host - 1
        last = self.spec.hosts - 1
        if kind == "link_down":
            return {"link": (L.rnic_key(1, 0), L.tor_name(L.segment(1), 0))}
        if kind == "link_flap":
            return {
                "link": (L.rnic_key(2, r_last), L.tor_name(L.segment(2), r_last)),
                "down_s": 1.0,
                "up_s": 1.0,
            }
        if kind == "loss":
            r = min(1, r_last)
            return {"link": (L.rnic_key(last, r), L.tor_name(L.segment(last), r)), "percent": 30.0}
        if kind == "switch_down":
            return {"switch": L.tor_name(L.segment(last), r_last)}
        if kind == "fdb_blackhole":
            return {"host": L.host_name(0), "peer": L.host_name(last), "rail": r_last}
        if kind == "overlay_loop":
            return {
                "hosts": (L.host_name(0), L.host_name(1)),
                "dst_host": L.host_name(2),
                "rail": min(2, r_last),
            }
        if kind == "slow_path":
            return {"host": L.host_name(2), "rail": 0, "delay_ms": self.spec.slow_path_delay_ms}
        if kind in ("agent_crash", "agent_hang"):
            host = 1 if kind == "agent_crash" else 3
            c = next(c for c in L.placements if c.job == "job1" and c.host == host)
            rec = self.tb.find_process(self.procs[f"ov-{c.name}"].pid) or self.procs[f"ov-{c.name}"]
            return {"pid": rec.pid, "name": f"{c.job}/{c.name}"}
        if kind == "container_crash":
            c = next(c for c in L.placements if c.job == "job0" and c.host == 2)
            return {"container": c.name}
        raise TestbedError(f"the demo has no script for fault kind {kind!r}")

    def fault(self, kind: str, **params: Any) -> FaultOutcome:
        from skh.testbed import Faults

        assert self.bus is not None
        faults = Faults(self.tb)
        params = params or self.default_params(kind)
        since = self.bus.last_seq
        truth = faults.inject(kind, **params)
        t = truth.to_dict()
        out = FaultOutcome(t, truth.t_inject_ns)
        self.mark(f"fault {truth.id}: {kind} on {t['layer']} {t['component']}")
        det = self.bus.wait(
            lambda r: r.get("state") == "open" and matches(t, r), self.spec.detect_timeout_s, since
        )
        out.detected = det
        if det is not None:
            self.mark(
                f"  detected in {(det['ts_ns'] - out.injected_ns) / 1e9:.1f} s: {det['layer']} "
                f"{det['component']} ({det['failure_type']}, {det['n_pairs']} pairs)"
            )
            time.sleep(self.spec.hold_s)
        else:
            self.mark(f"  NOT localized within {self.spec.detect_timeout_s:g} s")
        cleared = faults.clear(truth.id)
        out.cleared_ns = time.time_ns()
        respawned = [cleared.detail.get("respawned_pid"), *cleared.detail.get("respawned_pids", ())]
        for pid in filter(None, respawned):
            rec = self.tb.find_process(pid)
            if rec is not None and rec.role:
                self.procs[rec.role] = rec
        if det is not None:
            res = self.bus.wait(
                lambda r: r.get("state") == "resolved" and r.get("alert_id") == det["alert_id"],
                self.spec.resolve_timeout_s,
                det["seq"],
            )
            out.resolved = res
            if res is not None:
                self.mark(
                    "  cleared; alert resolved "
                    f"{(res['ts_ns'] - out.cleared_ns) / 1e9:+.1f} s after the repair"
                )
            else:
                self.mark(f"  cleared; alert NOT resolved within {self.spec.resolve_timeout_s:g} s")
        with self.bus.cond:
            out.others = [
                r
                for r in self.bus.records
                if r["seq"] > since
                and r.get("state") == "open"
                and (det is None or r["seq"] != det["seq"])
            ]
        self.outcomes.append(out)
        time.sleep(self.spec.settle_s)
        return out

    def run_script(self) -> list[FaultOutcome]:
        for kind in self.spec.faults:
            self.fault(kind)
        return self.outcomes

    # -- teardown -----------------------------------------------------------------------------
    def dump_state(self) -> Path:
        """What the run looked like just before teardown, beside the daemons' logs: the
        testbed's processes (alive or not) and the controller's view (agents, readiness,
        counters, rejected connections). Best effort: a dead controller is noted, not raised."""
        state: dict[str, Any] = {"ts_ns": time.time_ns(), "timeline": self.timeline}
        try:
            state["testbed"] = self.tb.status()
        except Exception as exc:  # the testbed never came up
            state["testbed"] = {"error": repr(exc)}
        if self.client is not None:
            try:
                state["controller"] = self.client.status(timeout_s=3.0)
            except Exception as exc:
                state["controller"] = {"error": repr(exc)}
        path = self.run_dir / "state.json"
        with contextlib.suppress(OSError):
            path.write_text(json.dumps(state, indent=1, default=str))
        return path

    def stop(self) -> dict[str, Any]:
        self.t_end_ns = time.time_ns()
        if self.run_dir.exists():
            self.dump_state()
        if self.bus is not None:
            self.bus.close()
        if self.client is not None:
            self.client.close()
            self.client = None
        for name in ("analyzer", "controller"):
            rec = self.procs.get(name)
            if rec is not None:
                with contextlib.suppress(Exception):
                    self.tb.stop(rec, grace_s=5.0)
        counts = self.tb.down()
        if self._own_enrol_dir:
            shutil.rmtree(self.enrol_dir, ignore_errors=True)
        self.mark("testbed torn down")
        return counts

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.bus.records) if self.bus is not None else []
