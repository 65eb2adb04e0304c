"""``skh job``: submit a job to the controller (its endpoints enter the preload list before any
agent registers), remove one, list them, and show a job's ping list."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from skh.cli._admin_args import add_client_args, client_from, print_json

if TYPE_CHECKING:
    from skh.model import Job


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("job", help="submit, remove, list jobs; show a job's ping list")
    jsub = p.add_subparsers(dest="job_command", metavar="ACTION", required=True)

    s = jsub.add_parser(
        "submit",
        help="submit a job from a TOML file or from flags",
        description="Submit a job: FILE (TOML: name, shape = {tp, pp, dp, ep}, [[containers]] "
        "with name, host, rails) or --name with one --container per container.",
    )
    add_client_args(s)
    s.add_argument("file", nargs="?", help="TOML job file")
    s.add_argument("--name", help="job name (without FILE)")
    for degree in ("tp", "pp", "dp", "ep"):
        s.add_argument(f"--{degree}", type=int, default=1, help=f"{degree.upper()} degree")
    s.add_argument(
        "--container",
        action="append",
        default=[],
        metavar="NAME:HOST:RAILS",
        help="one container (repeatable), rails as 0-3 or 0,2; e.g. w0:host0:0-3",
    )
    s.add_argument("--json", action="store_true", help="print endpoint name -> id as JSON")
    s.set_defaults(func=run_submit)

    r = jsub.add_parser("rm", help="remove a job: its endpoints leave every ping list")
    add_client_args(r)
    r.add_argument("name")
    r.set_defaults(func=run_rm)

    ls = jsub.add_parser("list", help="jobs with their ping-list versions and sizes")
    add_client_args(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=run_list)

    pl = jsub.add_parser("pinglist", help="a job's ping list: the pairs its agents probe")
    add_client_args(pl)
    pl.add_argument("name")
    pl.add_argument("--json", action="store_true")
    pl.add_argument(
        "--limit",
        type=int,
        default=1000,
        help="show at most this many pairs (the first, by source; default 1000)",
    )
    pl.add_argument("--src", type=int, help="only the pairs of this source endpoint")
    pl.set_defaults(func=run_pinglist)


def _job_from_args(args: argparse.Namespace) -> Job:
    from skh.errors import ConfigError
    from skh.orchestrator.admin import job_from_mapping, load_job_file, parse_container

    if args.file:
        if args.name or args.container:
            raise ConfigError("give a job FILE or --name/--container, not both")
        return load_job_file(args.file)
    if not args.name or not args.container:
        raise ConfigError("give a job FILE, or --name and at least one --container")
    containers = [parse_container(c, args.name) for c in args.container]
    return job_from_mapping(
        {
            "name": args.name,
            "shape": {"tp": args.tp, "pp": args.pp, "dp": args.dp, "ep": args.ep},
            "containers": [
                {"name": c.name, "host": c.host, "rails": list(c.rails)} for c in containers
            ],
        },
        "command line",
    )


def run_submit(args: argparse.Namespace) -> int:
    job = _job_from_args(args)
    with client_from(args) as ctl:
        eps = ctl.submit_job(job)
        lists = ctl.ping_lists(job.name)
    if args.json:
        print_json({"job": job.name, "version": lists.version, "endpoints": eps})
        return 0
    print(
        f"job {job.name}: {len(eps)} endpoints, {lists.pair_counts()['preload']} preload pairs, "
        f"ping-list version {lists.version}"
    )
    return 0


def run_rm(args: argparse.Namespace) -> int:
    with client_from(args) as ctl:
        eps = ctl.remove_job(args.name)
    print(f"job {args.name} removed ({len(eps)} endpoints)")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from skh.orchestrator.admin import status_view

    with client_from(args) as ctl:
        view = status_view(ctl)
    jobs = {
        name: {k: v for k, v in j.items() if k != "members"} for name, j in view["jobs"].items()
    }
    if args.json:
        print_json(jobs)
        return 0
    from skh.cli.status import jobs_table, render

    render(jobs_table(jobs))
    return 0


def run_pinglist(args: argparse.Namespace) -> int:
    """A summary, counted; then at most ``--limit`` pairs (a big job's list is never listed
    whole: 13 M pairs for 1,280 hosts x 8 RNICs)."""
    import numpy as np

    from skh.orchestrator.admin import ping_list_summary

    with client_from(args) as ctl:
        lists = ctl.ping_lists(args.name)
    summary = ping_list_summary(lists)
    limit = max(0, args.limit)
    if args.src is not None:
        listed = lists.ping_list(args.src, ready_only=False)[:limit]
        active = lists.ping_list(args.src)[:limit]
        pairs = np.stack([np.full(listed.size, args.src, np.uint32), listed], axis=1)
        active_pairs = np.stack([np.full(active.size, args.src, np.uint32), active], axis=1)
    else:
        pairs = lists.first_pairs(limit, ready_only=False)
        active_pairs = lists.first_pairs(limit) if summary["active_pairs"] else pairs[:0]
    shown = len(pairs) if args.src is not None else summary["pairs"]
    if args.json:
        print_json(
            {
                "job": args.name,
                **summary,
                "endpoints": [lists.endpoints[ep].to_wire() for ep in sorted(lists.endpoints)],
                "pairs": pairs.tolist(),
                "active": active_pairs.tolist(),
                "truncated": shown > len(pairs) or summary["active_pairs"] > len(active_pairs),
            }
        )
        return 0
    print(
        f"job {args.name}: version {summary['version']}, {summary['mode']}"
        + (f" v{summary['skeleton_version']}" if summary["mode"] == "skeleton" else "")
        + f", {summary['ready']}/{summary['endpoints']} endpoints ready, "
        f"{summary['active_pairs']} of {summary['pairs']} pairs active"
    )
    names = {ep: info.name for ep, info in lists.endpoints.items()}
    for src, dst in active_pairs.tolist():
        print(f"{src:>6} {names[src]:<40} -> {dst:>6} {names[dst]}")
    if args.src is None and summary["active_pairs"] > len(active_pairs):
        print(f"... {summary['active_pairs'] - len(active_pairs)} more (--limit N, --src EP)")
    return 0
