"""``skh probe``: probe responders like ping does, with network RTTs from kernel (or NIC) stamps."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError
from skh.probe import DEFAULT_PORT, DEFAULT_PROBE_BYTES, PROBE_MAX_BYTES, PROBE_MIN_BYTES, Engine
from skh.records import ProbeStatus, TsSource, is_loss

_STATUS_WORD = {s.value: s.name for s in ProbeStatus}
_CLOCK_WORD = {s.value: s.name.lower() for s in TsSource}


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    gid: str = ""
    qpn: int = 0

    @property
    def label(self) -> str:
        if self.gid:
            return f"{self.gid}/{self.qpn}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(spec: str, transport: str) -> Target:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` (udp) or ``GID/QPN`` (verbs)."""
    if transport == "verbs":
        gid, sep, qpn = spec.rpartition("/")
        if not sep or not gid or not qpn.isdigit():
            raise ConfigError(
                f"A verbs target must be GID/QPN (e.g. ::ffff:10.0.0.2/17). Got {spec!r} instead."
            )
        return Target(host="", port=0, gid=gid, qpn=int(qpn))
    host, port = spec, DEFAULT_PORT
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ConfigError(f"A target must be HOST[:PORT]. Got {spec!r} instead.")
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, _, p = spec.partition(":")
        if not p.isdigit():
            raise ConfigError(f"A target must be HOST[:PORT]. Got {spec!r} instead.")
        port = int(p)
    if not host or not 0 < port < 65536:
        raise ConfigError(
            f"A target must be HOST[:PORT] with a port in 1..65535. Got {spec!r} instead."
        )
    return Target(host=host, port=port)


def summarize(target: Target, rows: np.ndarray) -> dict:
    """The ping-style summary of one target's records."""
    counts = {
        name.lower(): int(np.count_nonzero(rows["status"] == s)) for s, name in _STATUS_WORD.items()
    }
    ok = rows[rows["status"] == ProbeStatus.OK]
    lost = int(is_loss(rows["status"]).sum())
    out: dict = {
        "target": target.label,
        "sent": int(len(rows)),
        **counts,
        # network loss of either direction (request_lost + reply_lost + lost, direction unknown)
        "loss_pct": round(100.0 * lost / len(rows), 3) if len(rows) else 0.0,
    }
    if len(ok):
        rtt = ok["rtt_ns"] / 1e3
        app = (ok["rtt_ns"] + ok["responder_delay_ns"] + np.maximum(ok["prober_delay_ns"], 0)) / 1e3
        out["rtt_us"] = {
            "min": round(float(rtt.min()), 3),
            "p50": round(float(np.percentile(rtt, 50)), 3),
            "p99": round(float(np.percentile(rtt, 99)), 3),
            "max": round(float(rtt.max()), 3),
            "mean": round(float(rtt.mean()), 3),
        }
        out["app_rtt_us"] = {
            "p50": round(float(np.percentile(app, 50)), 3),
            "p99": round(float(np.percentile(app, 99)), 3),
        }
        clocks = sorted({_CLOCK_WORD[int(c)] for c in ok["ts_source"]})
        out["clock"] = "+".join(clocks)
    return out


def _line(target: Target, row: np.void) -> str:
    status = int(row["status"])
    if status == ProbeStatus.OK:
        return (
            f"{target.label}: seq={int(row['seq'])} rtt={row['rtt_ns'] / 1e3:.3f} µs "
            f"responder={row['responder_delay_ns'] / 1e3:.1f} µs "
            f"prober={row['prober_delay_ns'] / 1e3:.1f} µs "
            f"clock={_CLOCK_WORD[int(row['ts_source'])]}"
        )
    return f"{target.label}: seq={int(row['seq'])} {_STATUS_WORD[status]}"


def _print_summary(s: dict) -> None:
    print(f"--- {s['target']} skh probe statistics ---")
    lost = s["request_lost"] + s["reply_lost"] + s["lost"]
    print(
        f"{s['sent']} probes, {s['ok']} answered, {lost} lost ({s['loss_pct']:.1f}% loss: "
        f"{s['request_lost']} requests, {s['reply_lost']} replies, {s['lost']} either), "
        f"{s['refused']} refused, {s['unreachable']} unreachable, {s['invalid']} invalid, "
        f"{s['local_error']} local errors"
    )
    if "rtt_us" in s:
        r = s["rtt_us"]
        print(
            f"network rtt min/p50/p99/max = {r['min']}/{r['p50']}/{r['p99']}/{r['max']} µs "
            f"(clock {s['clock']})"
        )
        print(f"app rtt p50/p99 = {s['app_rtt_us']['p50']}/{s['app_rtt_us']['p99']} µs")


def class_of_service(args: argparse.Namespace) -> dict[str, int]:
    """Engine keywords of --traffic-class / --dscp / --priority."""
    if args.dscp is not None and args.traffic_class is not None:
        raise ConfigError("Give --traffic-class or --dscp, not both.")
    if args.dscp is not None and not 0 <= args.dscp < 64:
        raise ConfigError(f"The '--dscp' option must be in 0..63. Got {args.dscp} instead.")
    tc = args.dscp << 2 if args.dscp is not None else args.traffic_class or 0
    return {"traffic_class": tc, "priority": args.priority}


def add_class_options(p: argparse.ArgumentParser) -> None:
    """--traffic-class / --dscp / --priority, shared by ``skh probe`` and ``skh respond``."""
    p.add_argument(
        "--traffic-class",
        type=int,
        default=None,
        help="IP TOS / IPv6 traffic class byte of probes (verbs: GRH traffic class); default 0",
    )
    p.add_argument(
        "--dscp",
        type=int,
        default=None,
        help="DSCP of probes (traffic class = DSCP << 2); RoCE fabrics commonly use 26",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="priority 0..7 (UDP: SO_PRIORITY; verbs: service level); RoCE commonly uses 3",
    )


def run(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise ConfigError(f"The '-c/--count' option must be >= 1. Got {args.count} instead.")
    targets = [parse_target(t, args.transport) for t in args.targets]
    batches: list[list[np.ndarray]] = [[] for _ in targets]
    with Engine(
        bind=args.bind,
        port=args.local_port,
        transport=args.transport,
        timeout_s=args.timeout,
        device=args.device,
        gid_index=args.gid_index,
        probe_bytes=args.size,
        # a person can wait for the next probe's answer to learn which way a lost one went
        direction_wait_s=min(args.interval + 0.1, 5.0),
        **class_of_service(args),
    ) as engine:
        for i, t in enumerate(targets):
            engine.add_target(
                i,
                t.host,
                t.port,
                interval_s=args.interval,
                gid=t.gid,
                qpn=t.qpn,
                count=args.count or 0,
            )
        tick = min(max(args.interval / 2, 0.005), 0.1)
        try:
            while True:
                rows = engine.drain()
                for i in range(len(targets)):
                    batches[i].append(rows[rows["dst_ep"] == i])
                if not args.json and not args.quiet:
                    for row in rows:
                        print(_line(targets[int(row["dst_ep"])], row), flush=True)
                if args.count and all(sum(map(len, b)) >= args.count for b in batches):
                    break
                time.sleep(tick)
        except KeyboardInterrupt:
            pass
        stats = engine.stats()
    summaries = [summarize(t, np.concatenate(b)) for t, b in zip(targets, batches, strict=True)]
    if args.json:
        print(json.dumps({"targets": summaries, "engine": stats.as_dict()}))
    else:
        for s in summaries:
            _print_summary(s)
    return 0 if any(s["ok"] for s in summaries) else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe",
        help="probe responders (like ping, with network RTTs)",
        description="Probe skh responders (`skh respond`) and print network RTTs "
        "(kernel-stamped two-reply scheme), then a summary with loss and p50/p99.",
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="HOST[:PORT]",
        help=f"responder (default port {DEFAULT_PORT}); GID/QPN for verbs",
    )
    p.add_argument(
        "-c", "--count", type=int, default=None, help="probes per target (default: until Ctrl-C)"
    )
    p.add_argument(
        "-i",
        "--interval",
        type=float,
        default=1.0,
        help="seconds between probes per target (default 1)",
    )
    p.add_argument(
        "-W",
        "--timeout",
        type=float,
        default=1.0,
        help="seconds before a probe counts as lost (default 1)",
    )
    p.add_argument(
        "-s",
        "--size",
        type=int,
        default=DEFAULT_PROBE_BYTES,
        help=f"probe datagram bytes, {PROBE_MIN_BYTES}..{PROBE_MAX_BYTES} "
        f"(default {DEFAULT_PROBE_BYTES}; replies stay 48 B each)",
    )
    p.add_argument("--transport", choices=("udp", "verbs"), default="udp")
    p.add_argument("--bind", default="0.0.0.0", help="local address (default 0.0.0.0)")
    p.add_argument("--local-port", type=int, default=0, help="local port (default: any)")
    p.add_argument("--device", default=None, help="RDMA device or its netdev (verbs)")
    p.add_argument(
        "--gid-index",
        type=int,
        default=None,
        help="GID table index (verbs; default: the RoCE v2 GID of the bind address family)",
    )
    add_class_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON summary instead of lines")
    p.add_argument("-q", "--quiet", action="store_true", help="only the summary")
    p.set_defaults(func=run)
