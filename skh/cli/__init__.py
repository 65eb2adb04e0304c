"""The ``skh`` command. Each subcommand lives in its own module of this package, which defines
``add_parser(subparsers)`` (registering its parser with ``set_defaults(func=run)``) and
``run(args)`` returning an exit code. Add a new subcommand by listing its module here."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from skh import __version__
from skh.errors import SkhError

#: subcommand modules, in the order ``skh --help`` lists them
SUBCOMMANDS: tuple[str, ...] = (
    "probe",
    "respond",
    "controller",
    "agent",
    "analyzer",
    "alerts",
    "config",
    "testbed",
    "eval",
    "demo",
    "job",
    "status",
    "relay",
    "keys",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skh",
        description="SkeletonHunter: find and localize network failures in containerized RDMA GPU "
        "training clusters by probing only each job's traffic skeleton.",
    )
    parser.add_argument("--version", action="version", version=f"skh {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (repeatable)"
    )
    parser.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"skh.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from skh.logs import configure_logging

    configure_logging(verbosity=args.verbose, json_lines=args.log_json)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SkhError as exc:
        logging.getLogger("skh").error("%s", exc)
        print(f"skh: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
