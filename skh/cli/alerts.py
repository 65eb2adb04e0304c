"""``skh alerts tail``: the reference alert subscriber — replay since a sequence number from the
analyzer's durable log, then follow live alerts, each printed once and in order."""

from __future__ import annotations

import argparse
import json
import sys

from skh.cli._daemon_args import add_common, config_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="subscribe to the analyzer's alerts")
    asub = p.add_subparsers(dest="alerts_command", metavar="ACTION", required=True)
    t = asub.add_parser("tail", help="replay since --since, then follow")
    add_common(t)
    t.add_argument("--since", type=int, default=0, help="print alerts with sequence number > N")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.add_argument("--replay", help="analyzer REP address (default: analyzer.replay_bind)")
    t.add_argument("--alerts", help="analyzer PUB address (default: analyzer.alerts_bind)")
    t.add_argument(
        "--idle-exit", type=float, metavar="S", help="exit after S seconds without an alert"
    )
    t.set_defaults(func=run)


def _plain_line(rec: dict) -> str:
    a = rec["alert"]
    keys = ("severity", "job", "layer", "component", "failure_type")
    head = " ".join(f"{k}={a[k]}" for k in keys if k in a)
    return f"#{rec['seq']} {head or json.dumps(a, sort_keys=True)}"


def run(args: argparse.Namespace) -> int:
    import zmq

    from skh.orchestrator.alerts import AlertFollower

    cfg = config_from(args, {})
    cfg.security.check(server=False, client=True)
    replay = args.replay or cfg.analyzer.replay_bind
    alerts = args.alerts or cfg.analyzer.alerts_bind
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
