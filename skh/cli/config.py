"""``skh config check FILE`` validates a daemon config (and its CURVE key files) and prints the
effective settings; ``skh config keygen DIR NAME`` writes a CURVE key pair."""

from __future__ import annotations

import argparse
import json

from skh.cli._daemon_args import add_common, config_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check configuration, generate CURVE keys")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser(
        "check", help="validate a config file (with overrides) and print it as JSON"
    )
    add_common(c)
    c.add_argument("file", nargs="?", help="TOML config (same as --config)")
    c.add_argument(
        "--role",
        choices=("controller", "analyzer", "agent"),
        help="also check the CURVE keys this daemon needs",
    )
    c.set_defaults(func=run_check)
    k = csub.add_parser("keygen", help="write NAME.key and NAME.key_secret (CURVE) into DIR")
    k.add_argument("dir")
    k.add_argument("name")
    k.set_defaults(func=run_keygen)


def run_check(args: argparse.Namespace) -> int:
    if args.file:
        args.config = args.file
    cfg = config_from(args, {})
    if args.role:
        cfg.security.check(server=args.role != "agent", client=args.role == "agent")
    print(json.dumps(cfg.to_mapping(), indent=2, sort_keys=True))
    return 0


def run_keygen(args: argparse.Namespace) -> int:
    from skh.orchestrator.security import generate_keypair

    public, secret = generate_keypair(args.dir, args.name)
    print(json.dumps({"public": str(public), "secret": str(secret)}))
    return 0
