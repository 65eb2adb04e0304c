"""``skh alerts``: the analyzer's alert bus from the command line (docs/alerts.md).

* ``tail``: the reference subscriber — replay since a sequence number from the durable log, then
  follow live alerts, each printed once and in order.
* ``forward``: a bridge to a Prometheus Alertmanager (``--alertmanager URL``) or a JSON webhook
  (``--webhook URL``) that resumes from its last acknowledged sequence number (``--state``).
* ``schema``: print the alert schema (JSON Schema) this version ships.

A subscriber is a CURVE client: the analyzer's public certificate and its own key pair (from
the config's ``[security]``, or ``--server-key``/``--client-key``).
"""

from __future__ import annotations

import argparse
import json
import sys

from skh.cli._daemon_args import add_common, config_from


def _add_bus_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--replay", help="analyzer REP address (default: analyzer.replay_bind)")
    p.add_argument("--alerts", help="analyzer PUB address (default: analyzer.alerts_bind)")
    p.add_argument(
        "--server-key",
        help="the analyzer's public certificate (default: security.server_public_key)",
    )
    p.add_argument(
        "--client-key",
        help="this subscriber's secret certificate, its key pair "
        "(default: security.client_secret_key)",
    )
    p.add_argument(
        "--idle-exit", type=float, metavar="S", help="exit after S seconds without an alert"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="subscribe to the analyzer's alerts, forward them")
    asub = p.add_subparsers(dest="alerts_command", metavar="ACTION", required=True)
    t = asub.add_parser("tail", help="replay since --since, then follow")
    _add_bus_args(t)
    t.add_argument("--since", type=int, default=0, help="print alerts with sequence number > N")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.set_defaults(func=run)
    f = asub.add_parser(
        "forward", help="forward alerts to an Alertmanager or a webhook, resuming after restarts"
    )
    _add_bus_args(f)
    to = f.add_mutually_exclusive_group(required=True)
    to.add_argument("--alertmanager", metavar="URL", help="Alertmanager base URL (API v2)")
    to.add_argument("--webhook", metavar="URL", help="POST each alert as JSON to URL")
    f.add_argument(
        "--state",
        required=True,
        help="file holding the last acknowledged sequence number (created if missing)",
    )
    f.add_argument(
        "--resend-s",
        type=float,
        default=60.0,
        help="Alertmanager: re-post open alerts this often (default 60)",
    )
    f.add_argument("--count", type=int, help="exit after forwarding N alerts")
    f.set_defaults(func=run_forward)
    s = asub.add_parser("schema", help="print the alert schema (JSON Schema)")
    s.set_defaults(func=run_schema)


def _bus(args: argparse.Namespace):
    cfg = config_from(
        args,
        {
            "security.server_public_key": args.server_key,
            "security.client_secret_key": args.client_key,
        },
    )
    cfg.security.check(server=False, client=True)
    replay = args.replay or cfg.analyzer.replay_bind
    alerts = args.alerts or cfg.analyzer.alerts_bind
    return cfg, replay, alerts


def _plain_line(rec: dict) -> str:
    a = rec["alert"]
    keys = ("severity", "job", "layer", "component", "failure_type")
    head = " ".join(f"{k}={a[k]}" for k in keys if k in a)
    return f"#{rec['seq']} {head or json.dumps(a, sort_keys=True)}"


def run(args: argparse.Namespace) -> int:
    import zmq

    from skh.orchestrator.alerts import AlertFollower

    cfg, replay, alerts = _bus(args)
    follower = AlertFollower(
        zmq.Context.instance(), replay=replay, alerts=alerts, security=cfg.security
    )
    try:
        for rec in follower.follow(args.since, idle_timeout_s=args.idle_exit):
            print(json.dumps(rec, sort_keys=True) if args.json else _plain_line(rec), flush=True)
    except BrokenPipeError:
        sys.stderr.close()
    finally:
        follower.close()
    return 0


def run_forward(args: argparse.Namespace) -> int:
    import logging
    import threading

    import zmq

    from skh.errors import ConfigError
    from skh.orchestrator.alerts import AlertFollower
    from skh.orchestrator.bridges import (
        AlertmanagerReceiver,
        BridgeState,
        WebhookReceiver,
        forward,
    )
    from skh.orchestrator.daemon import install_stop_signals

    if args.resend_s <= 0:
        raise ConfigError(f"--resend-s must be > 0. Got {args.resend_s!r} instead.")
    cfg, replay, alerts = _bus(args)
    receiver = (
        AlertmanagerReceiver(args.alertmanager, resend_s=args.resend_s)
        if args.alertmanager
        else WebhookReceiver(args.webhook)
    )
    state = BridgeState(args.state)
    stop = threading.Event()
    install_stop_signals(stop)
    ctx = zmq.Context.instance()
    stats = forward(
        lambda: AlertFollower(ctx, replay=replay, alerts=alerts, security=cfg.security),
        receiver,
        state,
        stop=stop,
        resend_s=args.resend_s,
        count=args.count,
        idle_exit_s=args.idle_exit,
    )
    logging.getLogger("skh.alerts").info("forwarded up to seq %d: %s", state.last_seq, dict(stats))
    print(json.dumps({"last_seq": state.last_seq, **stats}), flush=True)
    return 0


def run_schema(args: argparse.Namespace) -> int:
    from skh.orchestrator.alerts import alert_schema

    print(json.dumps(alert_schema(), indent=2))
    return 0
