"""The underlay agent as the demo runs it: :class:`~skh.orchestrator.agent_underlay.UnderlayAgent`
(the real daemon, with its default handlers) plus the testbed's stand-in for an RNIC flow table.

``rnic_flows``: the testbed has no RNIC to dump. Every frame of rail *r* should leave through
``rnic<r>`` in the fast path; a tc egress filter that redirects frames to another device (the
slow-path relay) means flows the RNIC no longer carries: the offloaded table then lacks the rule.

Run as ``python -m skh.demo.agent`` with the options of ``skh agent``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
from typing import Any

__all__ = ["rnic_flows", "main"]


def rnic_flows(args: dict[str, Any]) -> dict[str, Any]:
    rail = int(args["rail"])
    dev = f"rnic{rail}"
    done = subprocess.run(
        ["tc", "filter", "show", "dev", dev, "egress"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    detours = re.findall(r"redirect to device (\S+)", done.stdout, re.IGNORECASE)
    fast = {"match": {"out_port": dev}, "actions": [f"output:{dev}"], "priority": 1}
    return {
        "expected": [fast],
        "offloaded": [] if detours else [fast],
        "detours": [d.rstrip(")") for d in detours],
    }


def main(argv: list[str] | None = None) -> int:
    from skh.cli import agent as cli_agent
    from skh.cli._daemon_args import config_from
    from skh.logs import configure_logging
    from skh.orchestrator.agent_underlay import UnderlayAgent
    from skh.orchestrator.daemon import install_stop_signals

    top = argparse.ArgumentParser(prog="python -m skh.demo.agent")
    top.add_argument("-v", "--verbose", action="count", default=0)
    sub = top.add_subparsers(dest="command", required=True)
    cli_agent.add_parser(sub)
    args = top.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    configure_logging(verbosity=args.verbose)
    cfg = config_from(
        args,
        {
            "agent.role": "underlay",
            "agent.name": args.name,
            "agent.host": args.host,
            "agent.controller": args.controller,
            "agent.controller_pub": args.controller_pub,
            "agent.analyzer": args.analyzer,
            "agent.sources": args.source or None,
        },
    )
    stop = threading.Event()
    install_stop_signals(stop)
    agent = UnderlayAgent(cfg.agent, cfg.security)
    agent.handlers["rnic_flows"] = rnic_flows
    print(json.dumps({"agent": agent.name, "ready": True}), flush=True)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
