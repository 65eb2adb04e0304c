"""``skh analyzer``: run the analyzer daemon in the foreground.

By default (``detector = "pipeline"``) it runs the whole analysis: skeleton inference from the
agents' counters, detection, localization through commands the controller relays to the host
agents, and alerts. That needs the controller's address and the fabric (``--controller``,
``--fabric``, and optionally ``--pipeline`` for the rest of the pipeline's settings);
``--detector detect`` runs the streaming detector alone (suspect events, no localization).
``--ray ADDRESS`` runs the same pipeline sharded over a Ray cluster (:mod:`skh.orchestrator.shard`).
"""

from __future__ import annotations

import argparse
import threading

from skh.cli._daemon_args import add_common, config_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyzer", help="run skh-analyzer (ingest, analysis rounds, alert bus)")
    add_common(p)
    p.add_argument("--bind", help="PULL address for result and counter batches")
    p.add_argument("--alerts-bind", help="PUB address for alerts")
    p.add_argument("--replay-bind", help="REP address for alert replay")
    p.add_argument("--alert-log", help="durable alert log (JSON lines)")
    p.add_argument("--spool-dir", help="archive each round's raw records as .npy here")
    p.add_argument(
        "--detector",
        choices=("pipeline", "detect", "none"),
        help="pipeline: skeleton, detection, localization, alerts (default); "
        "detect: the detector alone; none: ingest only",
    )
    p.add_argument(
        "--controller",
        help="controller ROUTER address (registry, skeleton lists, relayed commands)",
    )
    p.add_argument("--fabric", help="fabric file (TOML: hosts, RNICs, switches)")
    p.add_argument(
        "--pipeline",
        help="pipeline settings (JSON or TOML: addr_owner, host_agents, vf_devices, tuning)",
    )
    p.add_argument(
        "--controller-pub", help="controller PUB address (endpoint names, stopped containers)"
    )
    p.add_argument("--metrics", help="host:port of the Prometheus endpoint")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="shard the pipeline over this Ray cluster ('local' starts one here, 'auto', "
        "'ray://HOST:PORT'); default: one process",
    )
    p.add_argument("--ray-shards", type=int, help="detection shards on the Ray cluster")
    p.add_argument(
        "--print-endpoints", action="store_true", help="print the bound addresses as JSON on stdout"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from skh.orchestrator.analyzer import Analyzer
    from skh.orchestrator.daemon import install_stop_signals
    from skh.orchestrator.metrics import CollectorRegistry, serve

    cfg = config_from(
        args,
        {
            "analyzer.bind": args.bind,
            "analyzer.alerts_bind": args.alerts_bind,
            "analyzer.replay_bind": args.replay_bind,
            "analyzer.alert_log": args.alert_log,
            "analyzer.spool_dir": args.spool_dir,
            "analyzer.detector": args.detector,
            "analyzer.controller": args.controller,
            "analyzer.fabric": args.fabric,
            "analyzer.pipeline": args.pipeline,
            "analyzer.metrics": args.metrics,
            "analyzer.controller_pub": args.controller_pub,
            "analyzer.ray": args.ray,
            "analyzer.ray_shards": args.ray_shards,
        },
    )
    full = cfg.analyzer.detector == "pipeline"
    if full:  # scipy and scikit-learn come with it: seconds of start-up the other modes skip
        from skh.orchestrator.pipeline import PipelineConfig, PipelineHook
    pcfg = PipelineConfig.from_analyzer(cfg.analyzer) if full else None
    # the pipeline is also the controller's client (registry, skeletons, relayed commands)
    cfg.security.check(server=True, client=full)
    if pcfg is not None and cfg.analyzer.ray:
        from skh.orchestrator.shard.daemon import sharded_hook

        hook = sharded_hook(cfg.analyzer, pcfg, cfg.security)
    else:
        hook = PipelineHook(pcfg, cfg.security) if pcfg is not None else None
    # after joining Ray, whose driver set-up installs its own SIGTERM handler
    stop = threading.Event()
    install_stop_signals(stop)
    registry = CollectorRegistry()
    try:
        an = Analyzer(cfg.analyzer, cfg.security, hook=hook, metrics=registry)
        pull, pub, rep = an.bind()
        port = serve(registry, cfg.analyzer.metrics)
        if args.print_endpoints:
            print(
                json.dumps({"pull": pull, "alerts": pub, "replay": rep, "metrics_port": port}),
                flush=True,
            )
        an.run(stop)
    finally:
        if hook is not None:
            hook.close()
        if cfg.analyzer.ray:
            import ray

            ray.shutdown()
    return 0
