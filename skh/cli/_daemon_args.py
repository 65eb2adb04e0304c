"""Arguments every daemon subcommand shares: ``--config``, ``--set section.key=value`` overrides,
``--insecure`` and ``--metrics``; and the turn from them into a validated :class:`Config`."""

from __future__ import annotations

import argparse
from typing import Any

from skh.orchestrator.config import Config, load_config, parse_override


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="TOML config file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting (repeatable), e.g. --set agent.probe_interval_s=0.5",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="turn CURVE off (plain-text, unauthenticated links); never in production",
    )


def config_from(args: argparse.Namespace, extra: dict[str, Any]) -> Config:
    overrides = dict(parse_override(o) for o in args.overrides)
    overrides.update({k: v for k, v in extra.items() if v is not None})
    if args.insecure:
        overrides["security.insecure"] = True
    return load_config(args.config, overrides)
