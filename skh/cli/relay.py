"""``skh relay AGENT COMMAND [key=value ...]``: have the controller relay a command to an agent
(``traceroute dst=10.0.1.7 sport=4791``, ``dump_flows bridge=br0``, ``overlay_state netns=c7``,
``stats``) and print its answer."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from skh.cli._admin_args import add_client_args, client_from, print_json
from skh.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("relay", help="relay a command to an agent and print its reply")
    add_client_args(p)
    p.add_argument("agent", help="agent name")
    p.add_argument(
        "name", metavar="COMMAND", help="traceroute, dump_flows, overlay_state, stats, pinglist"
    )
    p.add_argument(
        "args",
        nargs="*",
        metavar="KEY=VALUE",
        help="command arguments; a VALUE that parses as JSON (7, true, [1,2]) is taken as such",
    )
    p.add_argument("--json", action="store_true", help="print the whole reply as JSON")
    p.set_defaults(func=run)


def parse_args_kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"a command argument must be KEY=VALUE. Got {item!r} instead.")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare word: a string (an address, a bridge name)
    return out


def run(args: argparse.Namespace) -> int:
    cmd_args = parse_args_kv(args.args)
    with client_from(args) as ctl:
        reply = ctl.relay(args.agent, args.name, cmd_args)
    if args.json:
        print_json(
            {
                "agent": reply.agent,
                "command": reply.name,
                "ok": reply.ok,
                "result": reply.result,
                "error": reply.error,
            }
        )
    elif reply.ok:
        result = reply.result
        if isinstance(result, dict) and set(result) == {"raw"}:
            print(result["raw"], end="" if str(result["raw"]).endswith("\n") else "\n")
        else:
            print_json(result)
    else:
        print(f"skh: {args.agent} {args.name} failed: {reply.error}", file=sys.stderr)
    return 0 if reply.ok else 1
