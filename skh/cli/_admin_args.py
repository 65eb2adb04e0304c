"""Arguments the operator's commands (``skh job``, ``skh status``, ``skh relay``) share: where the
controller is, the timeout and retries, and the daemon config they read it (and the CURVE keys)
from."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from skh.cli._daemon_args import add_common, config_from

if TYPE_CHECKING:
    from skh.orchestrator.admin import ControllerClient


def add_client_args(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument(
        "--controller", help="controller ROUTER address (default: the config's agent.controller)"
    )
    p.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="seconds to wait for each answer"
    )
    p.add_argument(
        "--retries", type=int, default=1, metavar="N", help="resend an unanswered request N times"
    )


def client_from(args: argparse.Namespace) -> ControllerClient:
    from skh.orchestrator.admin import ControllerClient

    cfg = config_from(args, {})
    cfg.security.check(server=False, client=True)
    return ControllerClient(
        args.controller or cfg.agent.controller,
        cfg.security,
        timeout_s=args.timeout,
        retries=args.retries,
    )


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
