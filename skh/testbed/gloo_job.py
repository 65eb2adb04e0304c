"""A real training framework's communication on the testbed: PyTorch's gloo backend running a
data + pipeline parallel job, one process per container.

Each container is one pipeline stage of one data-parallel replica and holds one GPU per rail
(TP spans its rails, as in a real container): on every rail the process has its own gloo process
group bound to that rail's VF (``ProcessGroupGloo`` with a device on ``vf<r>``) — the DP group of
its stage, and a two-member group with each adjacent stage's partner for point-to-point sends.
Per iteration it runs a pipeline of ``microbatches`` forward passes (receive the activation from
the previous stage, compute, send to the next) then the backward passes in reverse (receive the
gradient, compute, send it back), then all-reduces its gradient over its DP group, then steps
the optimizer. Compute is emulated by sleeping (there is no GPU) for a per-operation time with a
few per cent of jitter; every byte on the wire is gloo's own (its ring all-reduce, its TCP pairs).
Rendezvous goes through a ``TCPStore`` on the management network, so it never touches a VF.

Training ranks need not follow pod order: ``ranks`` maps each container to its rank (rank order
is Megatron's: stage = rank // DP, replica = rank % DP), which is how a job whose launcher
numbers ranks by rendezvous order, not by pod ordinal, looks to the monitor.

The workers run under the system python (``/usr/bin/python3``: Debian's ``python3-torch``, CPU
only), started by :func:`run_gloo_job`; this module's top level imports nothing beyond the
standard library, so a worker does not load the project's own dependencies.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the driver's imports; a worker never needs them
    import numpy as np

    from skh.testbed.testbed import Testbed

__all__ = ["GlooJob", "GlooRun", "plan_gloo_job", "run_gloo_job", "SYSTEM_PYTHON"]

#: the interpreter that has Debian's python3-torch
SYSTEM_PYTHON = "/usr/bin/python3"
_PORT = 29511


@dataclass(frozen=True, slots=True)
class GlooJob:
    """Sizes of the emulated training step (bytes per rail)."""

    microbatches: int = 4
    act_bytes: int = 1 << 20
    grad_bytes: int = 8 << 20
    forward_s: float = 0.08  # one microbatch's forward on one stage; a backward is twice that
    optimizer_s: float = 0.4
    jitter: float = 0.05  # per-operation compute-time noise (share)


def plan_gloo_job(
    tb: Testbed, job: str, ranks: dict[str, int] | None = None, cfg: GlooJob | None = None
) -> dict[str, dict[str, Any]]:
    """Per container name, the worker's plan document. ``ranks``: container → training rank
    (default: pod order, container index in the job)."""
    from skh.errors import ConfigError

    cfg = cfg or GlooJob()
    cluster = tb.cluster()
    spec = cluster.jobs[job]
    pp, dp = spec.shape.pp, spec.shape.dp
    names = [c.name for c in spec.containers]
    ranks = ranks or {n: i for i, n in enumerate(names)}
    if sorted(ranks.values()) != list(range(len(names))) or set(ranks) != set(names):
        raise ConfigError(
            f"The 'ranks' parameter of plan_gloo_job must rank every container of {job}."
        )
    by_rank = {r: n for n, r in ranks.items()}
    layout = tb.layout
    master = by_rank[0]
    m = layout.by_container[master]
    rails = sorted({ep.rail for ep in cluster.job_endpoints(job)})
    out = {}
    for name in names:
        r = ranks[name]
        stage = r // dp
        out[name] = {
            "rank": r,
            "world": pp * dp,
            "stage": stage,
            "stages": pp,
            "dp_ranks": [stage * dp + d for d in range(dp)],
            "prev": r - dp if stage > 0 else None,
            "next": r + dp if stage < pp - 1 else None,
            "master": layout.mgmt_container_ip(m.host, m.slot),
            "port": _PORT,
            "devices": [f"vf{i}" for i in range(len(rails))],
            "microbatches": cfg.microbatches,
            "act_bytes": cfg.act_bytes,
            "grad_bytes": cfg.grad_bytes,
            "forward_s": cfg.forward_s,
            "optimizer_s": cfg.optimizer_s,
            "jitter": cfg.jitter,
        }
    return out


@dataclass(frozen=True, slots=True)
class GlooRun:
    """What the monitor saw of the job, and what the job really was."""

    ep_id: np.ndarray
    host: np.ndarray
    rail: np.ndarray
    pod: np.ndarray  # per endpoint: its container's pod ordinal (index in the job)
    rank: np.ndarray  # per endpoint: its container's training rank
    tx_bytes: np.ndarray  # (n, T) per sample
    rx_bytes: np.ndarray  # (n, T)
    sample_hz: float
    used_pairs: np.ndarray  # (m, 2) endpoint id pairs the job's groups communicate on
    iterations: int  # fewest iterations a worker completed


def run_gloo_job(
    tb: Testbed,
    job: str,
    *,
    duration_s: float,
    ranks: dict[str, int] | None = None,
    cfg: GlooJob | None = None,
    sample_hz: float = 10.0,
    start_timeout_s: float = 120.0,
) -> GlooRun:
    """Run ``job`` with gloo for ``duration_s`` of training and sample its VF counters at
    ``sample_hz`` meanwhile (from the host side, as the underlay agent does)."""
    import numpy as np

    from skh.errors import TestbedError
    from skh.records import pair_keys, split_pair_keys

    plans = plan_gloo_job(tb, job, ranks, cfg)
    cluster = tb.cluster()
    eps = cluster.job_endpoints(job)
    names = [c.name for c in cluster.jobs[job].containers]
    pdir = tb.state_dir / "gloo"
    pdir.mkdir(parents=True, exist_ok=True)
    stop_at = time.time() + start_timeout_s + duration_s + 30.0
    recs = []
    for name, plan in plans.items():
        path = pdir / f"{job}-{name}.json"
        path.write_text(json.dumps({**plan, "stop_at": stop_at}))
        recs.append(
            tb.spawn(
                [SYSTEM_PYTHON, "-m", "skh.testbed.gloo_job", str(path)],
                ns=tb.container_ns(name),
                role=f"gloo-{name}",
            )
        )
    logs = [Path(r.log) for r in recs]
    try:
        deadline = time.monotonic() + start_timeout_s
        while not all(b"training" in p.read_bytes() for p in logs if p.exists()) or not all(
            p.exists() for p in logs
        ):
            if time.monotonic() > deadline or not all(r.alive() for r in recs):
                tails = {p.name: p.read_text(errors="replace")[-400:] for p in logs if p.exists()}
                raise TestbedError(f"gloo job {job} did not start: {tails}")
            time.sleep(0.2)
        source = tb.counter_source(cluster=cluster)
        rows = {e.ep: i for i, e in enumerate(source.entries)}
        idx = np.array([rows[e.ep_id] for e in eps])
        period = 1.0 / sample_hz
        n = int(round(duration_s * sample_hz)) + 1
        tx = np.zeros((len(eps), n))
        rx = np.zeros((len(eps), n))
        t_next = (time.time() // period + 1) * period
        for i in range(n):
            time.sleep(max(0.0, t_next - time.time()))
            snap = source.read()[idx]
            tx[:, i], rx[:, i] = snap["tx_bytes"], snap["rx_bytes"]
            t_next += period
        if not all(r.alive() for r in recs):
            raise TestbedError(f"a gloo worker of {job} exited during the run")
    finally:
        for r in recs:
            tb.stop(r)
    iters = min(_iterations(p) for p in logs)
    pod = {name: i for i, name in enumerate(names)}
    rank_of = {name: plans[name]["rank"] for name in names}
    # what the job's groups use: every ordered pair of a stage's DP group on each rail, and
    # each pipeline partner pair both ways
    by = {(rank_of[e.container], e.rail): e.ep_id for e in eps}
    dp = cluster.jobs[job].shape.dp
    used = []
    for (r, rail), e in by.items():
        st = r // dp
        for d in range(dp):
            o = st * dp + d
            if o != r:
                used.append((e, by[(o, rail)]))
        for o in (r - dp, r + dp):
            if (o, rail) in by:
                used.append((e, by[(o, rail)]))
    u = np.array(used, np.uint64)
    return GlooRun(
        ep_id=np.array([e.ep_id for e in eps], np.uint32),
        host=np.array([tb.host_index(e.host) for e in eps], np.int64),
        rail=np.array([e.rail for e in eps], np.int64),
        pod=np.array([pod[e.container] for e in eps], np.int64),
        rank=np.array([rank_of[e.container] for e in eps], np.int64),
        tx_bytes=np.diff(tx, axis=1),
        rx_bytes=np.diff(rx, axis=1),
        sample_hz=sample_hz,
        used_pairs=split_pair_keys(np.unique(pair_keys(u[:, 0], u[:, 1]))),
        iterations=iters,
    )


def _iterations(log: Path) -> int:
    done = 0
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("iteration "):
            done = max(done, int(line.split()[1]) + 1)
    return done


# ---------------------------------------------------------------------------------------------
# the worker (system python with torch)


def _groups(plan: dict, store: Any, dist: Any) -> tuple[list, dict[int, list]]:
    """Per rail: the DP group, and per adjacent-stage partner a two-member group."""
    pgg = dist.ProcessGroupGloo
    rank = plan["rank"]

    def group(name: str, members: list[int], dev: str) -> Any:
        opts = pgg._Options()
        opts._devices = [pgg.create_device(interface=dev)]
        opts._timeout = timedelta(seconds=300)
        return pgg(dist.PrefixStore(name, store), members.index(rank), len(members), opts)

    dp, pp = [], {}
    for r, dev in enumerate(plan["devices"]):
        members = plan["dp_ranks"]
        dp.append(group(f"dp{plan['stage']}r{r}", members, dev) if len(members) > 1 else None)
        for other in (plan["prev"], plan["next"]):
            if other is not None:
                lo, hi = sorted((rank, other))
                pp.setdefault(other, []).append(group(f"pp{lo}-{hi}r{r}", [lo, hi], dev))
    return dp, pp


def worker(plan: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = plan["rank"]
    store = dist.TCPStore(
        plan["master"], plan["port"], plan["world"], rank == 0, timedelta(seconds=300)
    )
    dp, pp = _groups(plan, store, dist)
    n_rails = len(plan["devices"])
    act = [torch.zeros(plan["act_bytes"] // 4) for _ in range(n_rails)]
    grad = [torch.ones(plan["grad_bytes"] // 4) for _ in range(n_rails)]
    rng = random.Random(rank)
    tf = plan["forward_s"]

    def compute(t: float) -> None:
        time.sleep(t * (1.0 + plan["jitter"] * rng.gauss(0.0, 1.0)))

    def exchange(peer: int | None, send: bool, tag: int) -> None:
        if peer is None:
            return
        # a pair group holds the lower rank as 0: the peer's rank in it
        other = 0 if peer < rank else 1
        works = [
            (g.send([t], other, tag) if send else g.recv([t], other, tag))
            for g, t in zip(pp[peer], act, strict=True)
        ]
        for w in works:
            w.wait()

    print("training", flush=True)
    it = 0
    while time.time() < plan["stop_at"]:
        m = plan["microbatches"]
        for k in range(m):
            exchange(plan["prev"], False, k)
            compute(tf)
            exchange(plan["next"], True, k)
        for k in reversed(range(m)):
            exchange(plan["next"], False, 1000 + k)
            compute(2 * tf)
            exchange(plan["prev"], True, 1000 + k)
        works = [g.allreduce([t]) for g, t in zip(dp, grad, strict=True) if g is not None]
        for w in works:
            w.wait()
        compute(plan["optimizer_s"])
        print(f"iteration {it}", flush=True)
        it += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m skh.testbed.gloo_job", description=__doc__.splitlines()[0]
    )
    ap.add_argument("plan", help="the worker's plan (JSON, see plan_gloo_job)")
    args = ap.parse_args(argv)
    worker(json.loads(Path(args.plan).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
