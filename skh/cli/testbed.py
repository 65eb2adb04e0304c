"""``skh testbed up|down|status|fault|traffic``: the emulated cluster in network namespaces
(root)."""

from __future__ import annotations

import argparse
import json
import sys

from skh.errors import ConfigError
from skh.model import JobShape


def _job(text: str):
    """``NAME:PPxDP`` or ``NAME:PPxDP:TP`` → JobSpec."""
    from skh.testbed.spec import JobSpec

    try:
        name, shape, *rest = text.split(":")
        pp, dp = (int(x) for x in shape.lower().split("x"))
        tp = int(rest[0]) if rest else 1
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected NAME:PPxDP[:TP], got {text!r}") from exc
    return JobSpec(name, JobShape(tp=tp, pp=pp, dp=dp))


def _pair(text: str) -> tuple[str, str]:
    parts = tuple(p.strip() for p in text.split(","))
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"expected A,B, got {text!r}")
    return parts  # type: ignore[return-value]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "testbed", help="the namespace testbed: up, down, status, faults, traffic (root)"
    )
    p.add_argument(
        "--prefix", default="skht", help="name prefix of every namespace, link and nft table"
    )
    p.add_argument(
        "--state-dir", default=None, help="state directory (default /run/skh-testbed/PREFIX)"
    )
    tsub = p.add_subparsers(dest="testbed_cmd", metavar="ACTION", required=True)

    up = tsub.add_parser("up", help="build (after removing stale leftovers of the same prefix)")
    up.add_argument("--hosts", type=int, default=4)
    up.add_argument("--rnics", type=int, default=2, help="RNICs (rails) per host")
    up.add_argument("--hosts-per-segment", type=int, default=2)
    up.add_argument("--spines", type=int, default=2)
    up.add_argument("--containers-per-host", type=int, default=1)
    up.add_argument(
        "--job",
        type=_job,
        action="append",
        default=[],
        metavar="NAME:PPxDP[:TP]",
        help="a job (repeatable); default: one DP job over every container",
    )
    tsub.add_parser("down", help="stop every process and delete everything of the prefix")
    tsub.add_parser("status", help="what is up, as JSON")

    tr = tsub.add_parser(
        "traffic", help="start a job's training-traffic generator in its containers"
    )
    tr.add_argument("job")
    tr.add_argument("--period-s", type=float, default=4.0)
    tr.add_argument("--slot-s", type=float, default=1.0)
    tr.add_argument("--allreduce-bytes", type=int, default=2_000_000)
    tr.add_argument("--pp-bytes", type=int, default=600_000)
    tr.add_argument("--iterations", type=int, default=0, help="0: until down")

    f = tsub.add_parser("fault", help="inject, list and clear faults")
    fsub = f.add_subparsers(dest="fault_cmd", metavar="ACTION", required=True)
    inj = fsub.add_parser("inject", help="inject a fault; prints its ground truth as JSON")
    from skh.testbed.faults import KINDS

    inj.add_argument("kind", choices=[k.replace("_", "-") for k in KINDS])
    inj.add_argument(
        "--link", type=_pair, help="link_down/link_flap/loss: A,B (e.g. tor0r0,host1:rnic0)"
    )
    inj.add_argument("--at", help="which end of --link to act on (default the switch side)")
    inj.add_argument("--down-s", type=float, default=1.0)
    inj.add_argument("--up-s", type=float, default=1.0)
    inj.add_argument("--percent", type=float, default=10.0)
    inj.add_argument("--direction", choices=("in", "out", "both"), default="in")
    inj.add_argument(
        "--min-len", type=int, default=0, help="loss: only frames of at least this size (CRC-like)"
    )
    inj.add_argument("--host")
    inj.add_argument("--peer", help="fdb-blackhole: the host whose VTEP entry --host forgets")
    inj.add_argument("--hosts", type=_pair, help="overlay-loop: the two looping hosts A,B")
    inj.add_argument("--dst-host", help="overlay-loop: whose containers loop")
    inj.add_argument("--rail", type=int)
    inj.add_argument("--dst", help="slow-path: only VXLAN frames to this container")
    inj.add_argument("--src", help="slow-path: ... and from this container")
    inj.add_argument("--delay-ms", type=float, default=5.0)
    inj.add_argument("--jitter-ms", type=float, default=0.0)
    inj.add_argument("--pid", type=int, help="agent-crash/-hang: the process to kill or stop")
    inj.add_argument("--name", help="agent-crash/-hang: the agent's name in the ground truth")
    inj.add_argument("--container")
    inj.add_argument("--switch", help="switch-down: the ToR")
    clr = fsub.add_parser("clear", help="undo a fault (or all)")
    clr.add_argument("id", help="fault id or 'all'")
    fsub.add_parser("list", help="active faults as JSON")
    p.set_defaults(func=run)


_PARAMS = {
    "link_down": ("link", "at"),
    "link_flap": ("link", "at", "down_s", "up_s"),
    "loss": ("link", "at", "percent", "direction", "min_len"),
    "fdb_blackhole": ("host", "peer", "rail"),
    "overlay_loop": ("hosts", "dst_host", "rail"),
    "slow_path": ("host", "rail", "delay_ms", "jitter_ms", "dst", "src"),
    "switch_down": ("switch",),
    "agent_crash": ("pid", "name"),
    "agent_hang": ("pid", "name"),
    "container_crash": ("container",),
}
_OPTIONAL = {"at", "dst", "src", "name"}


def _print(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=1, default=list)
    sys.stdout.write("\n")


def run(args: argparse.Namespace) -> int:
    from skh.testbed.faults import Faults
    from skh.testbed.spec import TestbedSpec
    from skh.testbed.testbed import Testbed
    from skh.testbed.traffic import TrafficConfig

    if args.testbed_cmd == "up":
        spec = TestbedSpec(
            hosts=args.hosts,
            rnics_per_host=args.rnics,
            hosts_per_segment=args.hosts_per_segment,
            spines=args.spines,
            containers_per_host=args.containers_per_host,
            jobs=tuple(args.job),
        )
        tb = Testbed(spec, prefix=args.prefix, state_dir=args.state_dir)
        timings = tb.up()
        _print({"up": True, "prefix": args.prefix, "state": str(tb.state_path), **timings})
        return 0
    if args.testbed_cmd == "down":
        from skh.testbed.testbed import cleanup_stale

        _print({"down": True, "removed": cleanup_stale(args.prefix, args.state_dir)})
        return 0
    tb = Testbed.load(args.prefix, args.state_dir)
    if args.testbed_cmd == "status":
        _print(tb.status())
        return 0
    if args.testbed_cmd == "traffic":
        cfg = TrafficConfig(
            period_s=args.period_s,
            slot_s=args.slot_s,
            allreduce_bytes=args.allreduce_bytes,
            pp_bytes=args.pp_bytes,
        )
        recs = tb.start_traffic(args.job, cfg, iterations=args.iterations)
        _print({"job": args.job, "pids": [r.pid for r in recs]})
        return 0
    faults = Faults(tb)
    if args.fault_cmd == "list":
        _print([f.to_dict() for f in faults.list()])
        return 0
    if args.fault_cmd == "clear":
        if args.id == "all":
            _print([f.to_dict() for f in faults.clear_all()])
        else:
            if not args.id.isdigit():
                raise ConfigError(f"fault id must be a number or 'all', got {args.id!r}")
            _print(faults.clear(int(args.id)).to_dict())
        return 0
    kind = args.kind.replace("-", "_")
    params = {}
    for name in _PARAMS[kind]:
        value = getattr(args, name)
        if value is None:
            if name in _OPTIONAL:
                continue
            raise ConfigError(f"fault {args.kind} needs --{name.replace('_', '-')}")
        params[name] = value
    _print(faults.inject(kind, **params).to_dict())
    return 0
