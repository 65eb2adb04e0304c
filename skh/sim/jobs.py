"""Simulated training jobs: parallel plans, placement on hosts, endpoints, readiness, lifetimes
and the ground-truth skeleton.

A job's GPUs are numbered Megatron's way: TP fastest, then context parallel (CP), then data
parallel (DP), then pipeline (PP): GPU ``g = t + TP·(c + CP·(d + DP·s))``. Containers hold
``rnics`` consecutive GPUs (8, or 4 for the half-host containers the paper counts at 8.9 %), and
GPU ``g`` uses the RNIC of its container's local rail ``g % rnics``. TP stays inside a container
(NVLink), so TP divides ``rnics``; it may be smaller (TP 2 or 4 in an 8-RNIC container), and then
one container holds several DP replicas or even several pipeline stages. Layouts are aligned:
``TP·CP·DP`` is a multiple of ``rnics`` (a stage fills whole containers) or divides it (a
container holds whole stages). Container ``c`` is the ``c``-th block of ranks: its *pod ordinal*
equals the training-rank order (what a rank hint would say when the launcher numbers pods by rank).

Ground truth (``SimJob.skeleton_pairs``): the ordered endpoint pairs the job's traffic crosses the
network on, all on one rail, both directions:

* **Collectives** (gradient all-reduce or reduce-scatter/all-gather of a stage, FSDP's per-layer
  all-gather/reduce-scatter, MoE all-to-all, CP's ring): all of them stay inside the GPUs of one
  stage with one TP rank, and NCCL keeps inter-node hops rail-aligned (ring/tree channels enter
  and leave a node through the NIC of one rail index), so every ordered pair of endpoints of one
  stage on one rail counts as used (NCCL runs several rings/trees over them).
* **Pipeline neighbours**: the GPU of stage ``s`` sends activations to the GPU of the same
  (TP, CP, DP) rank in stage ``s + 1`` and gradients back. Inside one container that is NVLink;
  across containers the pair of RNICs on the rail of each end is used (NCCL's PXN forwards a
  send through the NIC rail-aligned with the destination, so with several stages per container
  both rails appear). Interleaved 1F1B (``vpp > 1`` virtual stages per GPU) also links the last
  stage back to the first (model chunk ``PP − 1`` feeds chunk ``PP`` on stage 0).

So for 512 GPUs at TP = PP = DP = 8 (64 hosts, 64 endpoints per rail, 63 same-rail peers each) an
endpoint of an interior stage (1..6) has 7 + 2 = 9 skeleton peers and one of an edge stage (0 or
7) has 7 + 1 = 8; the paper's "9 of 63" is the interior count.

Kinds: ``train`` (Megatron-style TP×CP×PP×DP, 1F1B or interleaved), ``ep`` (MoE: expert-parallel
all-to-all inside groups of ``EP`` DP replicas of a stage; same skeleton), ``fsdp`` (ZeRO-3:
``pp = 1``, per-layer collectives over the whole DP group) and ``debug`` (a random subset of the
same-rail pairs with irregular traffic; ``pp_stage``/``dp_group`` are -1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from skh.errors import ConfigError, TopologyError
from skh.model import Cluster, Container, Job, JobShape
from skh.sim.topology import rng_for

__all__ = [
    "JobKind",
    "Parallel",
    "SimJob",
    "HostPool",
    "make_job",
    "generate_jobs",
    "overlay_ip",
    "skeleton_pairs",
]

JobKind = Literal["train", "ep", "fsdp", "debug"]

#: hosts per job and their weights for :func:`generate_jobs` (heavy tail of small jobs; the paper's
#: ~40K endpoints over ~2K jobs means ~2.5 hosts per job on average)
DEFAULT_SIZE_WEIGHTS: dict[int, float] = {
    1: 0.30,
    2: 0.34,
    4: 0.20,
    8: 0.10,
    16: 0.04,
    32: 0.015,
    64: 0.005,
}


def overlay_ip(ep_id: int) -> str:
    """The overlay (container VF) address the simulator gives an endpoint: ``10.x.y.z``."""
    return f"10.{(ep_id >> 16) & 255}.{(ep_id >> 8) & 255}.{ep_id & 255}"


@dataclass(frozen=True, slots=True)
class Parallel:
    """What a job's plan adds to its :class:`~skh.model.JobShape` (tp, pp, dp, ep).

    ``rnics``: RNICs (= GPUs) per container; ``cp``: context-parallel degree; ``vpp``: virtual
    pipeline stages per GPU (interleaved 1F1B; 1 = plain 1F1B); ``microbatches``: per replica and
    iteration (the pipeline's M, FSDP's gradient-accumulation steps).
    """

    rnics: int = 8
    cp: int = 1
    vpp: int = 1
    microbatches: int = 1


@dataclass(frozen=True, slots=True, eq=False)
class SimJob:
    """One simulated job; per-endpoint columns are aligned with ``ep_ids`` (rank order)."""

    name: str
    kind: JobKind
    shape: JobShape
    job: Job
    ep_ids: np.ndarray  # uint32 (n,)
    rail: np.ndarray  # int32 (n,)
    host: np.ndarray  # int32 (n,) host index in fabric.hosts order
    container: np.ndarray  # int32 (n,) index into job.containers (= pod ordinal = rank block)
    pp_stage: np.ndarray  # int32 (n,) pipeline stage of the endpoint's GPU, -1 for debug jobs
    dp_rank: np.ndarray  # int32 (n,), -1 for debug jobs
    dp_group: np.ndarray  # int32 (n,) job-local (stage, local rail) group id, -1 for debug
    ready_s: np.ndarray  # float64 (n,) virtual time the endpoint's container becomes ready
    start_s: float  # submission (containers created)
    end_s: float  # containers torn down
    iteration_s: float  # mean training-iteration period
    skeleton_pairs: np.ndarray  # (m, 2) uint32 ordered ep pairs really used, sorted
    plan: Parallel = Parallel()
    tp_rank: np.ndarray | None = None  # int32 (n,), -1 for debug jobs
    cp_rank: np.ndarray | None = None  # int32 (n,), -1 for debug jobs

    @property
    def n_endpoints(self) -> int:
        return int(self.ep_ids.size)

    @property
    def needs_safe_list(self) -> bool:
        """True when the traffic cannot yield a consistent skeleton (DESIGN §5): debug jobs keep
        a larger, safe ping list."""
        return self.kind == "debug"

    def dp_groups(self) -> list[np.ndarray]:
        """Endpoint ids of each DP group (same stage, same rail), ordered by group id."""
        if self.kind == "debug":
            return []
        order = np.argsort(self.dp_group, kind="stable")
        g = self.dp_group[order]
        cuts = np.flatnonzero(np.diff(g)) + 1
        return np.split(self.ep_ids[order], cuts)

    def alive(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s


def skeleton_pairs(
    ep_ids: np.ndarray,
    rail: np.ndarray,
    pp_stage: np.ndarray,
    dp_rank: np.ndarray,
    *,
    pp_links: np.ndarray | None = None,
) -> np.ndarray:
    """Ground-truth skeleton of a train/EP/FSDP job from its per-endpoint columns (module doc).

    Without ``pp_links``, pipeline neighbours are (stage ``s``, DP rank, rail) ↔ (``s + 1``, same
    DP rank, same rail) — the layout of one stage per container and TP = RNICs. ``pp_links``
    gives them instead as ``(k, 2)`` endpoint indices (into ``ep_ids``) of the network pairs the
    pipeline sends cross; both directions are added.
    """
    ep_ids = np.asarray(ep_ids, np.uint32)
    key_group = pp_stage.astype(np.int64) * 4096 + rail
    out = []
    # DP peers: full mesh inside each (stage, rail) group, all groups at once
    order = np.lexsort((ep_ids, key_group))
    g = key_group[order]
    starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    sizes = np.diff(np.r_[starts, g.size])
    size_of = np.repeat(sizes, sizes)  # group size of each sorted element
    start_of = np.repeat(starts, sizes)
    src = np.repeat(np.arange(g.size), size_of)
    first = np.repeat(np.cumsum(size_of) - size_of, size_of)
    dst = start_of[src] + (np.arange(src.size) - first)
    keep = src != dst
    out.append(np.stack([ep_ids[order[src[keep]]], ep_ids[order[dst[keep]]]], axis=1))
    if pp_links is None:
        # PP neighbours: (s, d, rail) ↔ (s + 1, d, rail): adjacent after sorting by (d, rail, s)
        order = np.lexsort((pp_stage, rail, dp_rank))
        st, rl, dr = pp_stage[order], rail[order], dp_rank[order]
        nb = (dr[1:] == dr[:-1]) & (rl[1:] == rl[:-1]) & (st[1:] == st[:-1] + 1)
        a, b = order[:-1][nb], order[1:][nb]
    else:
        a, b = pp_links[:, 0], pp_links[:, 1]
    if a.size:
        ea, eb = ep_ids[a], ep_ids[b]
        out.append(np.stack([np.concatenate([ea, eb]), np.concatenate([eb, ea])], axis=1))
    if not out:
        return np.zeros((0, 2), np.uint32)
    pairs = np.unique(np.concatenate(out).astype(np.uint32), axis=0)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


class HostPool:
    """Free GPU halves of every host. A container of 8 RNICs takes a whole host, one of 4 RNICs a
    half (rails 0–3 or 4–7). Hosts are handed out in (segment, fabric order), so a job's
    containers land close together as a scheduler would place them."""

    def __init__(self, cluster: Cluster) -> None:
        fabric = cluster.fabric
        self.host_names = list(fabric.hosts)
        self.host_index = {h: i for i, h in enumerate(self.host_names)}
        self.rails = fabric.rails
        seg = np.array([h.segment for h in fabric.hosts.values()], np.int64)
        self._order = np.lexsort((np.arange(seg.size), seg))  # placement order of host indices
        self.free = np.ones((seg.size, 2), bool)  # [host, half]

    def take(self, n: int, rnics: int) -> tuple[np.ndarray, int]:
        """Host indices for ``n`` containers of ``rnics`` RNICs, and the half they use (0 for whole
        hosts). The 4-RNIC containers of one job all take the same half, so their TP ranks meet
        on the same rails."""
        if rnics == 8 or self.rails < 8:
            ok = self.free[self._order].all(axis=1)
            pick = self._order[np.flatnonzero(ok)[:n]]
            if pick.size < n:
                raise TopologyError(f"host pool: {n} free hosts wanted, {pick.size} left")
            self.free[pick] = False
            return pick, 0
        for half in (0, 1):
            ok = self.free[self._order, half]
            pick = self._order[np.flatnonzero(ok)[:n]]
            if pick.size == n:
                self.free[pick, half] = False
                return pick, half
        raise TopologyError(f"host pool: {n} free half hosts wanted on one side, not enough left")

    def release(self, job: SimJob) -> None:
        hosts = np.unique(job.host)
        if job.plan.rnics >= 8 or self.rails < 8:
            self.free[hosts] = True
        else:
            half = int(job.rail.min()) // 4
            self.free[hosts, half] = True

    @property
    def free_hosts(self) -> int:
        return int(self.free.all(axis=1).sum())


def _check_int(name: str, v: object, lo: int) -> int:
    if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < lo:
        raise ConfigError(
            f"The '{name}' parameter of make_job must be an int >= {lo}. Got {v!r} instead."
        )
    return int(v)


def _check_plan(shape: JobShape, kind: str, plan: Parallel, rails: int) -> None:
    r, tp, pp = plan.rnics, shape.tp, shape.pp
    if r not in (4, 8) or r > rails:
        raise ConfigError(
            f"The 'rnics' parameter of make_job must be 8 or 4 and at most the fabric's rails "
            f"({rails}). Got {r} instead."
        )
    if r % tp:
        raise ConfigError(
            f"The 'shape.tp' parameter of make_job must divide the container's {r} RNICs "
            f"(TP stays inside a container). Got {tp} instead."
        )
    per_stage = tp * plan.cp * shape.dp
    if per_stage % r and (r % per_stage or (pp * per_stage) % r):
        raise ConfigError(
            f"make_job: a stage of {per_stage} GPUs (tp*cp*dp) neither fills whole containers of "
            f"{r} RNICs nor packs whole stages into them (pp={pp})."
        )
    if kind == "ep" and shape.dp % shape.ep:
        raise ConfigError(
            f"The 'shape.ep' parameter of make_job must divide dp={shape.dp}. "
            f"Got {shape.ep} instead."
        )
    if kind == "fsdp" and pp != 1:
        raise ConfigError(f"The 'shape.pp' parameter of an fsdp job must be 1. Got {pp} instead.")
    if plan.vpp > 1 and (pp < 2 or plan.microbatches % pp):
        raise ConfigError(
            "An interleaved pipeline (vpp > 1) needs pp >= 2 and microbatches a multiple of pp. "
            f"Got pp={pp}, microbatches={plan.microbatches} instead."
        )


def _gpu_columns(shape: JobShape, plan: Parallel, n: int) -> dict[str, np.ndarray]:
    """Per-endpoint (= GPU, in rank order) TP/CP/DP rank and stage, and the network links of
    its pipeline sends as endpoint index pairs."""
    g = np.arange(n)
    tp, cp, dp, pp, r = shape.tp, plan.cp, shape.dp, shape.pp, plan.rnics
    per_stage = tp * cp * dp
    cols = {
        "tp": (g % tp).astype(np.int32),
        "cp": ((g // tp) % cp).astype(np.int32),
        "dp": ((g // (tp * cp)) % dp).astype(np.int32),
        "stage": (g // per_stage).astype(np.int32),
    }
    # pipeline sends: stage s → s + 1, and with virtual stages the last stage → stage 0
    src = g[cols["stage"] < pp - 1]
    dst = src + per_stage
    if plan.vpp > 1 and pp > 2:
        last = g[cols["stage"] == pp - 1]
        src, dst = np.r_[src, last], np.r_[dst, last - (pp - 1) * per_stage]
    cont_s, cont_d = src // r, dst // r
    cross = cont_s != cont_d  # inside one container the send stays on NVLink
    src, dst, cont_s, cont_d = src[cross], dst[cross], cont_s[cross], cont_d[cross]
    # PXN: a send leaves through the NIC rail-aligned with the destination GPU, and the reply
    # direction through the sender's rail: both rails' pairs carry the link
    links = np.concatenate(
        [
            np.stack([src, cont_d * r + src % r], axis=1),
            np.stack([cont_s * r + dst % r, dst], axis=1),
        ]
    )
    cols["pp_links"] = links
    return cols


def make_job(
    cluster: Cluster,
    name: str,
    shape: JobShape,
    *,
    kind: JobKind = "train",
    hosts: Sequence[str] | None = None,
    pool: HostPool | None = None,
    start_s: float = 0.0,
    lifetime_s: float = float("inf"),
    ready_delay_s: Sequence[float] | np.ndarray | None = None,
    iteration_s: float = 15.0,
    seed: int = 0,
    rnics: int | None = None,
    cp: int = 1,
    vpp: int = 1,
    microbatches: int | None = None,
) -> SimJob:
    """Place one job, register its containers' endpoints in ``cluster`` and derive its ground truth.

    ``rnics`` is the RNICs per container (8 or 4; default ``shape.tp``, the layout of one TP
    group per container); ``shape.tp`` must divide it. ``cp``, ``vpp`` and ``microbatches``
    (default 4·PP for pipelines, 4 accumulation steps for FSDP, else 1) complete the plan
    (:class:`Parallel`). Hosts come from ``hosts`` (one per container, in container order; they
    are not marked taken in ``pool``) or else from ``pool`` (a fresh :class:`HostPool` of the
    cluster if None; pass one pool to place many jobs fast). ``ready_delay_s`` gives each
    container's readiness delay after ``start_s`` (default: drawn, minutes apart, at most
    10 min).
    """
    if kind not in ("train", "ep", "fsdp", "debug"):
        raise ConfigError(
            "The 'kind' parameter of make_job must be train, ep, fsdp or debug. "
            f"Got {kind!r} instead."
        )
    if microbatches is None:
        microbatches = 4 * shape.pp if shape.pp > 1 else (4 if kind == "fsdp" else 1)
    plan = Parallel(
        rnics=_check_int("rnics", shape.tp if rnics is None else rnics, 1),
        cp=_check_int("cp", cp, 1),
        vpp=_check_int("vpp", vpp, 1),
        microbatches=_check_int("microbatches", microbatches, 1),
    )
    pool = pool or HostPool(cluster)
    _check_plan(shape, kind, plan, pool.rails)
    if not iteration_s > 0 or not lifetime_s > 0:
        raise ConfigError("The 'iteration_s' and 'lifetime_s' parameters of make_job must be > 0.")
    rng = rng_for(seed, 0x5EED)
    r = plan.rnics
    n = shape.tp * plan.cp * shape.dp * shape.pp
    n_cont = n // r
    host_names = pool.host_names
    if hosts is not None:
        if len(hosts) != n_cont:
            raise ConfigError(
                f"The 'hosts' parameter of make_job must name {n_cont} hosts (one per "
                f"container). Got {len(hosts)} instead."
            )
        if len(set(hosts)) != len(hosts):
            raise ConfigError("The 'hosts' parameter of make_job must not repeat a host.")
        try:
            hidx = np.array([pool.host_index[h] for h in hosts], np.int64)
        except KeyError as exc:
            raise TopologyError(f"make_job {name}: unknown host {exc.args[0]!r}") from None
        half = np.zeros(n_cont, np.int64)
    else:
        hidx, h = pool.take(n_cont, r)
        half = np.full(n_cont, h, np.int64)
    if ready_delay_s is None:
        # one container is up quickly, the rest straggle in minutes apart (paper §2), <= 10 min
        ready = np.minimum(rng.exponential(90.0, n_cont), 600.0)
        ready[rng.integers(n_cont)] = rng.uniform(5.0, 30.0)
    else:
        ready = np.asarray(ready_delay_s, np.float64)
        if ready.shape != (n_cont,) or (ready < 0).any():
            raise ConfigError(
                f"The 'ready_delay_s' parameter of make_job must be {n_cont} values >= 0."
            )

    containers = []
    for c in range(n_cont):
        rails = tuple(range(half[c] * r, half[c] * r + r))
        containers.append(Container(f"{name}-c{c}", name, host_names[hidx[c]], rails))
    job = Job(name, shape, tuple(containers))
    if job.name in cluster.jobs:
        raise TopologyError(f"job {job.name!r} already exists")
    cluster.jobs[job.name] = job
    first = len(cluster.endpoints)
    for c in containers:
        for rail in c.rails:
            ep_id = len(cluster.endpoints)
            cluster.add_endpoint(
                job=name,
                container=c.name,
                host=c.host,
                rail=rail,
                ip=overlay_ip(ep_id),
                gid=f"::ffff:{overlay_ip(ep_id)}",
                qpn=1 + (ep_id & 0xFFFFFF),
                port=4791,
                netdev=f"eth{rail}",
            )
    ep_ids = np.arange(first, first + n, dtype=np.uint32)
    cont = np.repeat(np.arange(n_cont, dtype=np.int32), r)
    local = np.tile(np.arange(r), n_cont)
    rail = (np.repeat(half * r, r) + local).astype(np.int32)
    host = np.repeat(hidx, r).astype(np.int32)
    ready_s = start_s + np.repeat(ready, r)
    if kind == "debug":
        none = np.full(n, -1, np.int32)
        stage = dprank = group = tprank = cprank = none
        full = _same_rail_full(ep_ids, rail)
        keep = rng.random(full.shape[0]) < 0.5
        pairs = full[keep]
    else:
        cols = _gpu_columns(shape, plan, n)
        stage, dprank, tprank, cprank = cols["stage"], cols["dp"], cols["tp"], cols["cp"]
        group = (stage * r + local).astype(np.int32)
        pairs = skeleton_pairs(ep_ids, rail, stage, dprank, pp_links=cols["pp_links"])
    return SimJob(
        name=name,
        kind=kind,
        shape=shape,
        job=job,
        ep_ids=ep_ids,
        rail=rail,
        host=host,
        container=cont,
        pp_stage=stage,
        dp_rank=dprank,
        dp_group=group,
        ready_s=ready_s,
        start_s=float(start_s),
        end_s=float(start_s + lifetime_s),
        iteration_s=float(iteration_s),
        skeleton_pairs=pairs,
        plan=plan,
        tp_rank=tprank,
        cp_rank=cprank,
    )


def _same_rail_full(ep_ids: np.ndarray, rail: np.ndarray) -> np.ndarray:
    """Every ordered same-rail pair of distinct endpoints (a job's containers are on distinct
    hosts)."""
    a, b = np.meshgrid(np.arange(ep_ids.size), np.arange(ep_ids.size), indexing="ij")
    keep = (rail[a] == rail[b]) & (a != b)
    return np.stack([ep_ids[a[keep]], ep_ids[b[keep]]], axis=1).astype(np.uint32)


@dataclass(frozen=True, slots=True)
class _Drawn:
    shape: JobShape
    rnics: int
    cp: int = 1
    vpp: int = 1


def _plan_for(
    containers: int,
    rnics: int,
    rng: np.random.Generator,
    kind: JobKind,
    *,
    small_tp: bool,
    use_cp: bool,
    interleave: bool,
) -> _Drawn:
    """A plausible parallel plan for ``containers`` containers of ``rnics`` RNICs."""
    gpus = containers * rnics
    if kind == "fsdp":
        return _Drawn(JobShape(tp=1, pp=1, dp=gpus), rnics)
    tp = int(rng.choice([2, 4])) if small_tp and rnics == 8 else rnics
    pps = [p for p in (1, 2, 4, 8) if containers % p == 0 and p <= containers]
    pp = int(rng.choice(pps)) if containers > 1 else 1
    per_stage = gpus // pp
    cp = 2 if use_cp and kind == "train" and (per_stage // tp) % 2 == 0 else 1
    dp = per_stage // (tp * cp)
    ep = 1
    if kind == "ep":
        eps = [e for e in (2, 4, 8) if dp % e == 0] or [1]
        ep = int(rng.choice(eps))
    vpp = 2 if interleave and pp >= 2 else 1
    return _Drawn(JobShape(tp=tp, pp=pp, dp=dp, ep=ep), rnics, cp, vpp)


def generate_jobs(
    cluster: Cluster,
    n_jobs: int,
    *,
    seed: int = 0,
    pool: HostPool | None = None,
    size_weights: dict[int, float] | None = None,
    share_4rnic: float = 0.089,
    share_ep: float = 0.05,
    share_debug: float = 0.08,
    share_fsdp: float = 0.05,
    share_small_tp: float = 0.1,
    share_cp: float = 0.05,
    share_interleaved: float = 0.3,
    start_s: float | tuple[float, float] = 0.0,
    lifetime_median_s: float = 3000.0,
    lifetime_sigma: float = 1.0,
    name_prefix: str = "job",
) -> list[SimJob]:
    """Draw ``n_jobs`` jobs and place them on free hosts of ``pool``.

    Sizes (hosts, i.e. containers of 8 RNICs) follow ``size_weights``; if they do not fit, the
    largest jobs are halved until they do. Lifetimes are log-normal (median 50 min, σ = 1 gives
    ~57% under 60 min and ~75% under 100 min, the paper's "more than 50% / 70%"). ``start_s`` is a
    time or a (lo, hi) range to draw submission times from (negative: jobs already running).
    Iteration periods are log-normal around 15 s, within 5..40 s. ``share_4rnic`` is the share
    of *jobs* whose containers bind 4 RNICs (the paper counts 8.9% of containers; small jobs
    dominate, so the two shares are close); ``share_ep``, ``share_fsdp`` and ``share_debug`` pick
    MoE, ZeRO-3 and debug jobs (debug jobs have at most 2 containers). Of the other jobs,
    ``share_small_tp`` run TP 2 or 4 in 8-RNIC containers, ``share_cp`` add context parallelism
    and ``share_interleaved`` of the pipelines use interleaved 1F1B (2 virtual stages).
    """
    if not isinstance(n_jobs, int) or n_jobs < 0:
        raise ConfigError(
            f"The 'n_jobs' parameter of generate_jobs must be an int >= 0. Got {n_jobs!r} instead."
        )
    shares = {
        "share_4rnic": share_4rnic,
        "share_ep": share_ep,
        "share_debug": share_debug,
        "share_fsdp": share_fsdp,
        "share_small_tp": share_small_tp,
        "share_cp": share_cp,
        "share_interleaved": share_interleaved,
    }
    for nm, v in shares.items():
        if not 0.0 <= v <= 1.0:
            raise ConfigError(
                f"The '{nm}' parameter of generate_jobs must be in [0, 1]. Got {v!r} instead."
            )
    if share_ep + share_debug + share_fsdp > 1.0:
        raise ConfigError("generate_jobs: share_ep + share_debug + share_fsdp must be <= 1.")
    rng = rng_for(seed, 0x10B5)
    pool = pool or HostPool(cluster)
    weights = size_weights or DEFAULT_SIZE_WEIGHTS
    sizes_v = np.array(sorted(weights), np.int64)
    p = np.array([weights[k] for k in sizes_v], np.float64)
    sizes = rng.choice(sizes_v, n_jobs, p=p / p.sum())
    kinds = rng.choice(
        np.array(["train", "ep", "debug", "fsdp"]),
        n_jobs,
        p=[1 - share_ep - share_debug - share_fsdp, share_ep, share_debug, share_fsdp],
    )
    sizes[kinds == "debug"] = np.minimum(sizes[kinds == "debug"], 2)
    half = (rng.random(n_jobs) < share_4rnic) & (pool.rails >= 8)
    flags = rng.random((n_jobs, 3)) < [share_small_tp, share_cp, share_interleaved]
    # a 4-RNIC container counts as a whole host here: halves left over by one job cannot take an
    # 8-RNIC container, so this keeps the fit guaranteed
    capacity = pool.free_hosts
    while sizes.sum() > capacity:
        big = int(np.argmax(sizes))
        if sizes[big] == 1:
            raise TopologyError(f"generate_jobs: {n_jobs} jobs do not fit on {capacity} free hosts")
        sizes[big] //= 2
    if isinstance(start_s, tuple):
        starts = rng.uniform(start_s[0], start_s[1], n_jobs)
    else:
        starts = np.full(n_jobs, float(start_s))
    lifetimes = rng.lognormal(np.log(lifetime_median_s), lifetime_sigma, n_jobs)
    iters = np.clip(rng.lognormal(np.log(15.0), 0.4, n_jobs), 5.0, 40.0)
    seeds = rng.integers(0, 2**31, n_jobs)
    # whole-host jobs first, big ones first so they find contiguous hosts, then the half-host
    # jobs into what is left; the result keeps submission order
    jobs: list[SimJob | None] = [None] * n_jobs
    for i in np.lexsort((-sizes, half)):
        kind: JobKind = str(kinds[i])  # type: ignore[assignment]
        drawn = _plan_for(
            int(sizes[i]),
            4 if half[i] else 8,
            rng,
            kind,
            small_tp=bool(flags[i, 0]),
            use_cp=bool(flags[i, 1]),
            interleave=bool(flags[i, 2]),
        )
        jobs[i] = make_job(
            cluster,
            f"{name_prefix}{i:05d}",
            drawn.shape,
            kind=kind,
            pool=pool,
            start_s=float(starts[i]),
            lifetime_s=float(lifetimes[i]),
            iteration_s=float(iters[i]),
            seed=int(seeds[i]),
            rnics=drawn.rnics,
            cp=drawn.cp,
            vpp=drawn.vpp,
        )
    return [j for j in jobs if j is not None]
