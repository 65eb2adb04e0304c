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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` one subcommand's: a daemon started as ``skh agent``
    then never imports the other subcommands' modules (the testbed, rich, the evaluation), which
    stay resident for its whole life (~5 MB of the overlay agent's RSS)."""
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
    for name in SUBCOMMANDS if only is None else (only,):
        importlib.import_module(f"skh.cli.{name}").add_parser(sub)
    return parser


def _command_word(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names, when it names a known one (the top-level options take no
    values, so it is the first word that is not an option); None when a help option comes
    first, which lists every subcommand."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_command_word(sys.argv[1:] if argv is None else argv))
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
