"""The underlay agent as the demo runs it: :class:`~skh.orchestrator.agent_underlay.UnderlayAgent`
(the real daemon, with its default handlers) plus the testbed's stand-ins for what a host asks
its RNIC and its container runtime.

``rnic_flows``: the testbed has no RNIC to dump. Every frame of rail *r* should leave through
``rnic<r>`` in the fast path; a tc egress filter that redirects frames to another device (the
slow-path relay) means flows the RNIC no longer carries: the offloaded table then lacks the rule.

``host_report`` adds what a container runtime tells a host agent about the containers on its host
(``agent.containers``, ``--host-container job=J,container=C,netns=NS``): a container whose
network namespace lost its VFs has exited, one with no live agent process has lost its agent,
and one whose agent is stopped has a hung agent (here: the testbed's container is a network
namespace and the processes in it). The same list is what it vouches for when a sidecar enrols
its key (``--enrol-socket``, docs/trust.md).

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

__all__ = ["rnic_flows", "container_states", "main"]


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


def _agent_state(pid: int) -> str | None:
    """The scheduler state (R, S, T, ...) of ``pid`` if it is a monitoring agent, else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    if b"agent" not in argv:
        return None  # the container's own workload
    # the command name may hold spaces and parentheses: the state follows the last ')'
    return stat[stat.rindex(")") + 2 :].split(maxsplit=1)[0]


def container_states(containers: dict[str, str]) -> dict[str, list[str]]:
    """``{containers_dead, agents_dead, agents_late}`` of ``containers`` (name → netns)."""
    from pyroute2 import IPRoute

    from skh.testbed.netns import netns_inode, pids_in_netns

    dead, agents_dead, agents_late = [], [], []
    for name, ns in sorted(containers.items()):
        inode = netns_inode(ns)
        vfs = []
        if inode is not None:
            with IPRoute(netns=ns) as ipr:
                vfs = [
                    link.get_attr("IFLA_IFNAME")
                    for link in ipr.get_links()
                    if str(link.get_attr("IFLA_IFNAME")).startswith("vf")
                ]
        if not vfs:
            dead.append(name)
            continue
        states = [_agent_state(pid) for pid in pids_in_netns({inode})]
        states = [st for st in states if st not in (None, "Z", "X")]
        if not states:
            agents_dead.append(name)
        elif all(st in ("T", "t") for st in states):
            agents_late.append(name)  # stopped: alive, but it answers nothing
    return {"containers_dead": dead, "agents_dead": agents_dead, "agents_late": agents_late}


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
            "agent.containers": args.host_container or None,
            "agent.enrol_socket": args.enrol_socket,
        },
    )
    containers = {c.container: c.netns for c in cfg.agent.containers if c.netns}
    stop = threading.Event()
    install_stop_signals(stop)
    agent = UnderlayAgent(cfg.agent, cfg.security)
    agent.handlers["rnic_flows"] = rnic_flows
    host_report = agent.handlers["host_report"]
    agent.handlers["host_report"] = lambda a: {
        **host_report(a),
        **container_states(containers),
    }
    print(json.dumps({"agent": agent.name, "ready": True}), flush=True)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
