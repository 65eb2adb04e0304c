"""``skh controller``: run the controller daemon in the foreground."""

from __future__ import annotations

import argparse
import threading

from skh.cli._daemon_args import add_common, config_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "controller", help="run skh-controller (registry, ping lists, command relay)"
    )
    add_common(p)
    p.add_argument("--bind", help="ROUTER address for agents, e.g. tcp://0.0.0.0:5550")
    p.add_argument("--pub-bind", help="PUB address for job topics")
    p.add_argument("--db", help="registry database (SQLite)")
    p.add_argument(
        "--heartbeat-interval", type=float, dest="hb", help="seconds between agent heartbeats"
    )
    p.add_argument("--metrics", help="host:port of the Prometheus endpoint")
    p.add_argument(
        "--print-endpoints", action="store_true", help="print the bound addresses as JSON on stdout"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from skh.orchestrator.controller import Controller
    from skh.orchestrator.daemon import install_stop_signals
    from skh.orchestrator.metrics import CollectorRegistry, serve

    cfg = config_from(
        args,
        {
            "controller.bind": args.bind,
            "controller.pub_bind": args.pub_bind,
            "controller.db": args.db,
            "controller.heartbeat_interval_s": args.hb,
            "controller.metrics": args.metrics,
        },
    )
    cfg.security.check(server=True, client=False)
    stop = threading.Event()
    install_stop_signals(stop)
    registry = CollectorRegistry()
    ctl = Controller(cfg.controller, cfg.security, metrics=registry)
    router, pub = ctl.bind()
    port = serve(registry, cfg.controller.metrics)
    if args.print_endpoints:
        print(json.dumps({"router": router, "pub": pub, "metrics_port": port}), flush=True)
    ctl.run(stop)
    return 0
