"""``skh agent --role overlay|underlay``: run an agent in the foreground."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from skh.cli._daemon_args import add_common, config_from
from skh.errors import ConfigError

_INT_KEYS = frozenset({"rail", "port", "gid_index", "vf", "uid"})


def _kv(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep:
            raise argparse.ArgumentTypeError(f"expected key=value[,key=value...], got {text!r}")
        try:
            out[key] = int(value) if key in _INT_KEYS else value
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key} must be an int, got {value!r}") from None
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run skh-agent (overlay sidecar or underlay host agent)")
    add_common(p)
    p.add_argument("--role", choices=("overlay", "underlay"))
    p.add_argument("--name", help="agent name (default: role-host[-container])")
    p.add_argument("--host", help="host name (default: this machine's hostname)")
    p.add_argument("--job")
    p.add_argument("--container")
    p.add_argument("--controller", help="controller ROUTER address")
    p.add_argument("--controller-pub", help="controller PUB address")
    p.add_argument("--analyzer", help="analyzer PULL address")
    p.add_argument(
        "--endpoint",
        action="append",
        type=_kv,
        default=[],
        metavar="rail=N,ip=ADDR[,port=P,netdev=DEV]",
        help="an endpoint (VF) to probe from (overlay, repeatable)",
    )
    p.add_argument(
        "--source",
        action="append",
        type=_kv,
        default=[],
        metavar="endpoint=JOB/CONTAINER/RAIL,kind=netdev,netdev=DEV[,netns=NS]",
        help="a counter source (underlay, repeatable)",
    )
    p.add_argument(
        "--probe-interval",
        type=float,
        dest="probe_interval",
        help="seconds between probes per target (default 0.1)",
    )
    p.add_argument("--ready-file", help="report ready only once this file exists")
    p.add_argument(
        "--enrol-socket",
        help="overlay: make this sidecar's key and enrol it through this Unix socket; "
        "underlay: serve enrolment of this host's sidecars there (docs/trust.md)",
    )
    p.add_argument(
        "--host-container",
        action="append",
        type=_kv,
        default=[],
        metavar="job=JOB,container=NAME,netns=NS|uid=UID",
        help="underlay: a container on this host, for enrolment (repeatable)",
    )
    p.add_argument("--metrics", help="host:port of the Prometheus endpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from skh.orchestrator.config import default_host
    from skh.orchestrator.daemon import install_stop_signals
    from skh.orchestrator.metrics import serve

    extra: dict[str, Any] = {
        "agent.role": args.role,
        "agent.name": args.name,
        "agent.host": args.host,
        "agent.job": args.job,
        "agent.container": args.container,
        "agent.controller": args.controller,
        "agent.controller_pub": args.controller_pub,
        "agent.analyzer": args.analyzer,
        "agent.probe_interval_s": args.probe_interval,
        "agent.ready_file": args.ready_file,
        "agent.metrics": args.metrics,
        "agent.endpoints": args.endpoint or None,
        "agent.sources": args.source or None,
        "agent.enrol_socket": args.enrol_socket,
        "agent.containers": args.host_container or None,
    }
    cfg = config_from(args, extra)
    if not cfg.agent.host:
        cfg = config_from(args, {**extra, "agent.host": default_host()})
    if not (cfg.agent.role == "overlay" and cfg.agent.enrol_socket):
        cfg.security.check(server=False, client=True)  # an enrolling sidecar makes its key
    stop = threading.Event()
    install_stop_signals(stop)
    registry = None
    if cfg.agent.metrics:  # prometheus_client is loaded only for an endpoint (~9 MB)
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
    if cfg.agent.role == "overlay":
        from skh.orchestrator.agent_overlay import OverlayAgent, enrol_sidecar

        if cfg.agent.enrol_socket:
            enrol_sidecar(cfg.agent, cfg.security, stop=stop)
        agent: Any = OverlayAgent(cfg.agent, cfg.security, metrics=registry)
    elif cfg.agent.role == "underlay":
        from skh.orchestrator.agent_underlay import UnderlayAgent

        agent = UnderlayAgent(cfg.agent, cfg.security, metrics=registry)
    else:  # pragma: no cover - config validation refuses other roles
        raise ConfigError(f"unknown role {cfg.agent.role!r}")
    if registry is not None:
        serve(registry, cfg.agent.metrics)
    agent.run(stop)
    return 0
