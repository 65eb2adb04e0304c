"""``skh status``: the controller's view — jobs with their ping-list versions, sizes and skeleton
mode, agents with their heartbeat state, and (``--endpoints``) every endpoint's readiness."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from skh.cli._admin_args import add_client_args, client_from, print_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="the controller's view of jobs, agents and endpoints")
    add_client_args(p)
    p.add_argument("--endpoints", action="store_true", help="also list every endpoint")
    p.add_argument("--json", action="store_true", help="everything, as one JSON object")
    p.set_defaults(func=run)


def render(*tables: Table) -> None:
    console = Console()
    for t in tables:
        console.print(t)


def jobs_table(jobs: Mapping[str, Mapping[str, Any]]) -> Table:
    t = Table(title="jobs")
    for col in ("job", "version", "mode", "ready", "preload pairs", "pairs", "active pairs"):
        t.add_column(col, justify="left" if col in ("job", "mode") else "right")
    for name, j in sorted(jobs.items()):
        mode = j["mode"] + (f" v{j['skeleton_version']}" if j["mode"] == "skeleton" else "")
        t.add_row(
            name,
            str(j["version"]),
            mode,
            f"{j['ready']}/{j['endpoints']}",
            str(j["preload_pairs"]),
            str(j["pairs"]),
            str(j["active_pairs"]),
        )
    return t


def agents_table(agents: Mapping[str, Mapping[str, Any]]) -> Table:
    t = Table(title="agents")
    for col in ("agent", "role", "host", "state", "last heartbeat", "endpoints"):
        t.add_column(col, justify="right" if col in ("last heartbeat", "endpoints") else "left")
    for name, a in sorted(agents.items()):
        state = "[green]alive[/]" if a["alive"] else "[red]down[/]"
        t.add_row(
            name,
            a["role"],
            a["host"],
            state,
            f"{a['last_seen_s']:.1f} s ago",
            str(len(a["endpoints"])),
        )
    return t


def endpoints_table(jobs: Mapping[str, Mapping[str, Any]]) -> Table:
    t = Table(title="endpoints")
    for col in ("ep", "endpoint", "host", "ready", "agent", "heartbeat"):
        t.add_column(col, justify="right" if col == "ep" else "left")
    for _name, j in sorted(jobs.items()):
        for e in j["members"]:
            if not e["agent"]:
                beat = "no agent yet"
            elif e["agent_alive"]:
                beat = f"{e['last_heartbeat_s']:.1f} s ago"
            else:
                beat = "[red]agent down[/]"
            t.add_row(
                str(e["ep"]),
                e["name"],
                e["host"],
                "[green]yes[/]" if e["ready"] else "no",
                e["agent"],
                beat,
            )
    return t


def run(args: argparse.Namespace) -> int:
    from skh.orchestrator.admin import status_view

    with client_from(args) as ctl:
        view = status_view(ctl)
    if args.json:
        print_json(view)
        return 0
    Console().print(f"controller epoch {view['epoch']}")
    tables = [jobs_table(view["jobs"]), agents_table(view["agents"])]
    if args.endpoints:
        tables.append(endpoints_table(view["jobs"]))
    render(*tables)
    return 0
