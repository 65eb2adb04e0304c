"""Training-traffic generator: reproduces a job's inter-host communication with UDP bursts.

Container *i* of a job with shape TP × PP × DP is PP stage ``i // dp``, DP rank ``i % dp``. Every
iteration of ``period_s`` is cut into ``2 * pp`` slots of ``slot_s``:

* forward: stage *s* sends ``pp_bytes`` to stage *s+1* (same DP rank, same rail) at slot *s*;
* backward: stage *t* sends ``pp_bytes`` to stage *t-1* at slot ``2*pp-1-t``;
* gradient sync: stage *s*'s DP group runs a ring all-reduce at slot ``2*pp-1-s``: each member
  sends ``2*(dp-1)/dp * allreduce_bytes`` to the next member of the ring.

Every rail of a container carries its own copy (one TP group spans all the container's rails,
rail *r* only talks to rail *r*). So the DP groups are the (stage, rail) sets and their bursts are
shifted by stage, which is what skeleton inference recovers from 1 Hz counters.

Iteration *i* starts at ``t0 + i * period_s`` on every container (wall clock), so the bursts of
one DP group line up; a generator restarted mid-run joins at the next iteration.

Run inside a container's namespace: ``python -m skh.testbed.traffic PLAN.json``. Receivers are
UDP sockets that are bound but never read: the VF counters see every byte, the kernel drops the
datagrams at the full socket buffer, and no CPU is spent receiving.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from skh.errors import ConfigError

if TYPE_CHECKING:  # numpy-free at run time: this module starts once per container
    from skh.model import Cluster, Endpoint

__all__ = ["TrafficConfig", "Send", "plan_job", "job_skeleton", "run_plan", "main"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    period_s: float = 4.0
    #: ``2 * pp * slot_s`` must fit in ``period_s``
    slot_s: float = 1.0
    allreduce_bytes: int = 2_000_000
    pp_bytes: int = 600_000
    datagram_bytes: int = 8000
    port: int = 47000

    def __post_init__(self) -> None:
        for name, lo in (("period_s", 0.1), ("slot_s", 0.01)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise ConfigError(
                    f"The '{name}' parameter of TrafficConfig must be a number >= {lo}."
                    f" Got {v!r} instead."
                )
        for name, lo, hi in (
            ("allreduce_bytes", 0, 1 << 30),
            ("pp_bytes", 0, 1 << 30),
            ("datagram_bytes", 64, 8900),
            ("port", 1, 65535),
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(
                    f"The '{name}' parameter of TrafficConfig must be an int in [{lo}, {hi}]."
                    f" Got {v!r} instead."
                )


@dataclass(frozen=True, slots=True)
class Send:
    """One burst of one iteration."""

    offset_s: float
    src_ip: str
    dst_ip: str
    nbytes: int
    kind: str  # "dp" | "pp_fwd" | "pp_bwd"


def _ranks(cluster: Cluster, job: str) -> tuple[int, int, dict[tuple[int, int, int], Endpoint]]:
    """(pp, dp, {(stage, dp_rank, rail): endpoint})."""
    if job not in cluster.jobs:
        raise ConfigError(f"unknown job {job!r}; have {sorted(cluster.jobs)}")
    j = cluster.jobs[job]
    pp, dp = j.shape.pp, j.shape.dp
    if len(j.containers) != pp * dp:
        raise ConfigError(f"job {job}: {len(j.containers)} containers but pp*dp = {pp * dp}")
    index = {c.name: i for i, c in enumerate(j.containers)}
    out = {}
    for ep in cluster.job_endpoints(job):
        i = index[ep.container]
        out[(i // dp, i % dp, ep.rail)] = ep
    return pp, dp, out


def job_skeleton(cluster: Cluster, job: str) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]]:
    """The ground truth the generator produces: DP groups (endpoint ids of one stage and one
    rail, in ring order) and PP pairs (endpoint ids of adjacent stages, same DP rank and rail,
    lower stage first)."""
    pp, dp, eps = _ranks(cluster, job)
    rails = sorted({k[2] for k in eps})
    groups = [tuple(eps[(s, d, r)].ep_id for d in range(dp)) for s in range(pp) for r in rails]
    pairs = [
        (eps[(s, d, r)].ep_id, eps[(s + 1, d, r)].ep_id)
        for s in range(pp - 1)
        for d in range(dp)
        for r in rails
    ]
    return groups, pairs


def plan_job(cluster: Cluster, job: str, cfg: TrafficConfig) -> dict[str, list[Send]]:
    """Per container name, the bursts it sends every iteration."""
    pp, dp, eps = _ranks(cluster, job)
    if 2 * pp * cfg.slot_s > cfg.period_s + 1e-9:
        raise ConfigError(
            f"job {job}: 2*pp*slot_s = {2 * pp * cfg.slot_s}"
            f" s does not fit in period_s = {cfg.period_s} s"
        )
    rails = sorted({k[2] for k in eps})
    plan: dict[str, list[Send]] = {
        eps[(s, d, rails[0])].container: [] for s in range(pp) for d in range(dp)
    }
    ar_bytes = int(2 * (dp - 1) / dp * cfg.allreduce_bytes)
    for s in range(pp):
        for d in range(dp):
            for r in rails:
                me = eps[(s, d, r)]
                sends = plan[me.container]
                if s + 1 < pp and cfg.pp_bytes:
                    sends.append(
                        Send(s * cfg.slot_s, me.ip, eps[(s + 1, d, r)].ip, cfg.pp_bytes, "pp_fwd")
                    )
                if s > 0 and cfg.pp_bytes:
                    sends.append(
                        Send(
                            (2 * pp - 1 - s) * cfg.slot_s,
                            me.ip,
                            eps[(s - 1, d, r)].ip,
                            cfg.pp_bytes,
                            "pp_bwd",
                        )
                    )
                if dp > 1 and ar_bytes:
                    nxt = eps[(s, (d + 1) % dp, r)]
                    sends.append(Send((2 * pp - 1 - s) * cfg.slot_s, me.ip, nxt.ip, ar_bytes, "dp"))
    for sends in plan.values():
        sends.sort(key=lambda x: (x.offset_s, x.kind, x.src_ip))
    return plan


def plan_document(
    sends: list[Send], bind_ips: list[str], cfg: TrafficConfig, t0_ns: int, iterations: int
) -> dict:
    """What ``python -m skh.testbed.traffic`` reads."""
    return {
        "t0_ns": t0_ns,
        "iterations": iterations,
        "period_s": cfg.period_s,
        "port": cfg.port,
        "datagram_bytes": cfg.datagram_bytes,
        "bind": bind_ips,
        "sends": [asdict(s) for s in sends],
    }


def run_plan(doc: dict) -> None:
    port, size = int(doc["port"]), int(doc["datagram_bytes"])
    sinks = []
    for ip in doc["bind"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.bind((ip, port))
        sinks.append(s)
    senders: dict[str, socket.socket] = {}
    for x in doc["sends"]:
        if x["src_ip"] not in senders:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((x["src_ip"], 0))
            senders[x["src_ip"]] = s
    payload = bytes(size)
    print("ready", flush=True)
    t0 = doc["t0_ns"] / 1e9
    period = float(doc["period_s"])
    iterations = int(doc["iterations"])
    # a generator restarted mid-run (a crashed container came back) joins at the next iteration
    i = max(0, math.ceil((time.time() - t0) / period))
    while iterations <= 0 or i < iterations:
        base = t0 + i * period
        for x in doc["sends"]:
            delay = base + x["offset_s"] - time.time()
            if delay > 0:
                time.sleep(delay)
            sock, dst = senders[x["src_ip"]], (x["dst_ip"], port)
            for _ in range(-(-int(x["nbytes"]) // size)):
                try:
                    sock.sendto(payload, dst)
                except OSError:
                    # refused (no sink yet), no buffer space, unreachable during a fault: a real
                    # collective would stall; the generator just keeps its schedule
                    pass
        i += 1
    # peers may still be sending this iteration's bursts: a sink closed now would answer them
    # with port-unreachable errors
    time.sleep(max(0.0, t0 + i * period - time.time()))
    for s in sinks + list(senders.values()):
        s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m skh.testbed.traffic", description=__doc__.splitlines()[0]
    )
    ap.add_argument("plan", help="plan JSON file (see plan_document)")
    args = ap.parse_args(argv)
    with open(args.plan) as f:
        doc = json.load(f)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_plan(doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
