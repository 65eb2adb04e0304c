"""The underlay agent as the demo runs it: :class:`~skh.orchestrator.agent_underlay.UnderlayAgent`
(the real daemon) plus the host-side command handlers localization asks for on the testbed.

* ``overlay_state``: the host namespace's routes, neighbours, bridge FDB, link kinds and
  oper-down links, read with pyroute2 (:func:`skh.collect.linux.read_linux_state`).
* ``host_report``: per rail, the RNIC's port state. An RNIC port that is administratively up but
  has no carrier sees no light from the switch: the switch end of its access link is down
  (``peer_down``); an RNIC port set down is the RNIC's own (``rnic_state = down``).
* ``rnic_flows``: the testbed's stand-in for the RNIC's offloaded table next to the vswitch's.
  Every frame of rail *r* should leave through ``rnic<r>`` in the fast path; a tc egress filter
  that redirects frames to another device (the slow-path relay) means flows the RNIC no longer
  carries: the offloaded table then lacks the rule.

Run as ``python -m skh.demo.agent`` with the options of ``skh agent``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

__all__ = ["overlay_state", "host_report", "rnic_flows", "main"]

_IFF_UP = 1


def overlay_state(_args: dict[str, Any]) -> dict[str, Any]:
    from skh.collect.linux import read_linux_state

    st = read_linux_state()
    return {
        "routes": [asdict(r) for r in st.routes],
        "neighs": [asdict(n) for n in st.neighs],
        "fdb": [asdict(e) for e in st.fdb],
        "links": dict(st.links),
        "down": sorted(st.down),
    }


def host_report(_args: dict[str, Any]) -> dict[str, Any]:
    from pyroute2 import IPRoute

    state: dict[str, str] = {}
    peer_down: list[int] = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            m = re.fullmatch(r"rnic(\d+)", link.get_attr("IFLA_IFNAME") or "")
            if not m:
                continue
            rail = int(m[1])
            if not link["flags"] & _IFF_UP:
                state[str(rail)] = "down"
            else:
                state[str(rail)] = "up"
                if link.get_attr("IFLA_OPERSTATE") not in ("UP", "UNKNOWN"):
                    peer_down.append(rail)
    return {"rnic_state": state, "peer_down": sorted(peer_down)}


def rnic_flows(args: dict[str, Any]) -> dict[str, Any]:
    rail = int(args["rail"])
    dev = f"rnic{rail}"
    done = subprocess.run(["tc", "filter", "show", "dev", dev, "egress"], capture_output=True, text=True,
                          timeout=10, check=False)
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
    cfg = config_from(args, {
        "agent.role": "underlay", "agent.name": args.name, "agent.host": args.host,
        "agent.controller": args.controller, "agent.controller_pub": args.controller_pub,
        "agent.analyzer": args.analyzer, "agent.sources": args.source or None,
    })
    stop = threading.Event()
    install_stop_signals(stop)
    agent = UnderlayAgent(cfg.agent, cfg.security)
    agent.handlers.update({"overlay_state": overlay_state, "host_report": host_report, "rnic_flows": rnic_flows})
    # sample at x.5 s of the wall clock: the training generator starts its bursts on whole
    # seconds, so a 1 Hz sample never splits one (a split burst lands a second apart on two
    # hosts and blurs the stage shifts skeleton inference reads)
    into = (0.5 - time.time() % 1.0) % 1.0
    agent._next_sample = time.monotonic() + into
    print(json.dumps({"agent": agent.name, "ready": True}), flush=True)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
