"""``skh keys list`` shows the key bindings the controller holds (with the endpoints each key
owns); ``skh keys revoke NAME|--key KEY`` revokes one (docs/trust.md). Operator keys only."""

from __future__ import annotations

import argparse

from skh.cli._admin_args import add_client_args, client_from, print_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="list or revoke the controller's key bindings")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    ls = ksub.add_parser("list", help="every bound key: name, role, host, job, container")
    add_client_args(ls)
    ls.set_defaults(func=run_list)
    rv = ksub.add_parser("revoke", help="revoke a key by agent name (or --key)")
    add_client_args(rv)
    rv.add_argument("name", nargs="?", default="", help="the agent or tool name bound to it")
    rv.add_argument("--key", default="", help="the Z85 public key")
    rv.set_defaults(func=run_revoke)


def run_list(args: argparse.Namespace) -> int:
    with client_from(args) as ctl:
        keys = ctl.keys()
    print_json([{**k, "eps": len(k["eps"])} for k in keys])
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from skh.errors import ConfigError

    if not args.name and not args.key:
        raise ConfigError("name the agent (or give --key) to revoke")
    with client_from(args) as ctl:
        print_json(ctl.revoke(key=args.key, name=args.name))
    return 0
