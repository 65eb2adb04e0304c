"""Per-RNIC training traffic as the underlay agent's VF/representor counters see it: transmitted
and received bytes apart, at any sampling rate.

Every byte is a *pulse* (endpoint, start, duration, bytes, direction), and a pulse between two
endpoints lands on the sender's TX and the receiver's RX at the same moment: the receiver's burst
*is* the sender's burst. Counters are then the pulses binned on each host's sampling grid (hosts'
clocks are off by ``clock_sigma_s`` and every sample is taken ``sample_jitter_s`` early or late:
an agent's timer). Model per job (virtual seconds):

* **Iterations.** Training starts once every container is ready (NCCL needs all ranks), at
  ``train_start_s``. Iteration *k* starts at ``train_start + k·P + j_k`` with ``j_k`` uniform in
  ±``jitter``·P/2, so iteration lengths vary by up to ``jitter``·P; the work of an iteration is
  stretched to fill its length (data-dependent compute).
* **Pipeline schedule.** Each GPU runs Megatron's 1F1B order (interleaved with ``vpp`` model chunks
  when the job has virtual stages), list-scheduled with a backward pass twice as long as a forward
  one. Every forward sends the activation to the next (virtual) stage, every backward sends the
  gradient back: one message of the job's activation size each. The DP replicas of a job run
  the same schedule but not in lockstep: each replica's compute speed differs by
  ``replica_sigma`` per iteration, every operation by ``op_jitter`` of its length, and with
  probability ``straggler_p`` one replica of the iteration is slower by ``straggler_slowdown``
  (a slow GPU throttles its whole pipeline); synchronous training waits for it at the gradient
  sync. TP and CP ranks of a replica move together (their collectives tie them), and so do the
  replicas of one MoE expert-parallel group (their all-to-all does).
* **Gradient sync.** Each stage's DP group reduces its gradients once its last backward is done
  on every replica (so the stages' bursts are shifted by one backward each, the last stage first),
  at up to ``burst_bytes_per_s`` (paper: ~15 Gbps per RNIC) for the job's burst length (drawn in
  ``burst_s``); half the jobs use a distributed optimizer, which splits it into a reduce-scatter
  there and a parameter all-gather as the stage starts its next forward. Ring collectives send and
  receive the same bytes on every member.
* **Pipeline volume.** Per iteration an interior stage sends ``pp_share`` (drawn per job) of its
  gradient-sync bytes as pipeline messages; a message takes its size over ``nic_bytes_per_s``.
* **Other collectives.** ZeRO-3/FSDP jobs all-gather every layer group's parameters before its
  forward and backward and reduce-scatter its gradients after the backward, job-wide, per
  microbatch. MoE jobs add an all-to-all per layer to every forward and backward, inside each
  expert-parallel group, with uneven per-member bytes (routing imbalance). Context-parallel jobs
  pass KV blocks around the CP ring per layer.
* **Not training:** every container loads its next batch once per iteration (one RX pulse of
  ``loader_bytes`` on one rail); jobs write a checkpoint every ``checkpoint_every_s`` for
  ``checkpoint_s`` from every RNIC (storage traffic on the same RNICs); co-tenant background of
  ``background_bytes_per_s`` on average per RNIC and direction (exponential per sample), plus
  bursty flows averaging ``contention_bytes_per_s`` (storage, other tenants). Debug jobs send
  irregular, uncorrelated bursts.

Randomness is drawn per (seed, job, iteration), per (seed, job, checkpoint) and per
(seed, block of ``block_s``): the value at a time does not depend on how the caller steps
through time.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError
from skh.records import empty_counters
from skh.sim.jobs import SimJob
from skh.sim.topology import mix_hash, rng_for

__all__ = ["TrafficModel", "throughput", "counter_series", "counter_batch", "pipeline_schedule"]

_U = 1.0 / 2**64
_KIND = {"train": 0, "ep": 1, "debug": 2, "fsdp": 3}


def _unit(h: np.ndarray) -> np.ndarray:
    """uint64 hash → uniform float in [0, 1)."""
    return h.astype(np.float64) * _U


def _normal(h: np.ndarray) -> np.ndarray:
    """uint64 hash → standard normal (Box–Muller on two halves of the hash)."""
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 0.5) / 2**32
    u2 = ((h & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) / 2**32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# ---------------------------------------------------------------------------------------------
# the pipeline schedule


@dataclass(frozen=True, slots=True)
class Schedule:
    """One replica's pipeline iteration in units of a forward pass of one stage (a backward is 2).

    ``msg_t``/``msg_src``/``msg_dst``: each point-to-point message's send time and its source and
    destination stage; ``op_dev``/``op_t0``/``op_t1``: every forward/backward operation;
    ``first``/``last``: per stage, the start of its first and end of its last operation;
    ``span``: the end of the last operation.
    """

    msg_t: np.ndarray
    msg_src: np.ndarray
    msg_dst: np.ndarray
    op_dev: np.ndarray
    op_t0: np.ndarray
    op_t1: np.ndarray
    first: np.ndarray
    last: np.ndarray
    span: float


def _order(pp: int, vpp: int, m: int, s: int) -> list[tuple[bool, int, int]]:
    """Megatron's operation order on stage ``s``: (forward?, microbatch, virtual stage)."""
    total = m * vpp
    group = pp * vpp

    def item(k: int, forward: bool) -> tuple[bool, int, int]:
        chunk = (k % group) // pp
        if not forward:
            chunk = vpp - 1 - chunk
        mb = (k // group) * pp + k % pp if vpp > 1 else k
        return forward, mb, chunk * pp + s

    if vpp == 1:
        warm = min(pp - s - 1, m)
    elif m == pp:
        warm = total
    else:
        warm = min((pp - s - 1) * 2 + (vpp - 1) * pp, total)
    out = [item(k, True) for k in range(warm)]
    for i in range(total - warm):
        out += [item(warm + i, True), item(i, False)]
    out += [item(k, False) for k in range(total - warm, total)]
    return out


@functools.lru_cache(maxsize=512)
def pipeline_schedule(pp: int, vpp: int, microbatches: int) -> Schedule:
    """List-schedule 1F1B (interleaved when ``vpp > 1``) of ``pp`` stages and ``microbatches``."""
    n_virt = pp * vpp
    tf, tb = 1.0 / vpp, 2.0 / vpp
    ops = [_order(pp, vpp, microbatches, s) for s in range(pp)]
    ptr = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[bool, int, int], float] = {}
    msgs: list[tuple[float, int, int]] = []
    rec: list[tuple[int, float, float]] = []
    left = sum(len(o) for o in ops)
    while left:
        progressed = False
        for s in range(pp):
            while ptr[s] < len(ops[s]):
                fwd, mb, v = ops[s][ptr[s]]
                if fwd:
                    dep = (True, mb, v - 1) if v > 0 else None
                else:
                    dep = (False, mb, v + 1) if v < n_virt - 1 else (True, mb, v)
                if dep is not None and dep not in done:
                    break
                t0 = max(free[s], done[dep] if dep is not None else 0.0)
                t1 = t0 + (tf if fwd else tb)
                done[(fwd, mb, v)] = free[s] = t1
                rec.append((s, t0, t1))
                if fwd and v < n_virt - 1:
                    msgs.append((t1, s, (v + 1) % pp))
                elif not fwd and v > 0:
                    msgs.append((t1, s, (v - 1) % pp))
                ptr[s] += 1
                left -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B orders cannot deadlock
            raise RuntimeError(f"pipeline schedule deadlocked (pp={pp}, vpp={vpp})")
    op = np.array(rec, np.float64).reshape(-1, 3)
    msg = np.array(msgs, np.float64).reshape(-1, 3)
    first = np.array([op[op[:, 0] == s, 1].min() for s in range(pp)])
    last = np.array([op[op[:, 0] == s, 2].max() for s in range(pp)])
    return Schedule(
        msg[:, 0],
        msg[:, 1].astype(np.int64),
        msg[:, 2].astype(np.int64),
        op[:, 0].astype(np.int64),
        op[:, 1],
        op[:, 2],
        first,
        last,
        float(last.max()),
    )


# ---------------------------------------------------------------------------------------------
# pulses


@dataclass(slots=True)
class _Pulses:
    """Accumulates pulses as (endpoint index, start s, duration s, bytes, rx?) columns."""

    ep: list[np.ndarray]
    t: list[np.ndarray]
    dur: list[np.ndarray]
    nbytes: list[np.ndarray]
    rx: list[np.ndarray]

    @classmethod
    def empty(cls) -> _Pulses:
        return cls([], [], [], [], [])

    def add(self, ep, t, dur, nbytes, *, tx: bool = True, rx: bool = True) -> None:
        ep, t, dur, nbytes = np.broadcast_arrays(
            np.asarray(ep, np.int64), np.asarray(t, np.float64), dur, nbytes
        )
        if ep.size == 0:
            return
        ep, t = ep.ravel(), t.ravel()
        dur = np.maximum(np.asarray(dur, np.float64).ravel(), 1e-6)
        nbytes = np.asarray(nbytes, np.float64).ravel()
        for flag, on in ((False, tx), (True, rx)):
            if on:
                self.ep.append(ep)
                self.t.append(t)
                self.dur.append(dur)
                self.nbytes.append(nbytes)
                self.rx.append(np.full(ep.size, flag))

    def extend(self, other: _Pulses, *, before: float) -> None:
        """Take ``other``'s pulses that start before ``before``."""
        for i in range(len(other.ep)):
            keep = other.t[i] < before
            self.ep.append(other.ep[i][keep])
            self.t.append(other.t[i][keep])
            self.dur.append(other.dur[i][keep])
            self.nbytes.append(other.nbytes[i][keep])
            self.rx.append(other.rx[i][keep])


def _bin_pulses(p: _Pulses, n_ep: int, shift: np.ndarray, t0: float, hz: float, n_bins: int):
    """(tx, rx) bytes per (endpoint, bin) of the pulses; ``shift`` (per endpoint) is how late its
    host's sampling clock runs."""
    if not p.ep:
        return np.zeros((n_ep, n_bins)), np.zeros((n_ep, n_bins))
    ep = np.concatenate(p.ep)
    a = (np.concatenate(p.t) - shift[ep] - t0) * hz
    b = a + np.concatenate(p.dur) * hz
    w = np.concatenate(p.nbytes)
    is_rx = np.concatenate(p.rx)
    keep = (b > 0) & (a < n_bins) & (w > 0)
    ep, a, b, w, is_rx = ep[keep], a[keep], b[keep], w[keep], is_rx[keep]
    i0 = np.floor(a).astype(np.int64)
    i1 = np.floor(b).astype(np.int64)
    one = (i0 == i1) & (i0 >= 0)  # most pulses (messages) fall inside one sample
    i1 = np.minimum(i1, n_bins - 1)  # a pulse running past the block keeps only its overlap
    flat = [ep[one] * n_bins + i0[one]]
    val = [w[one]]
    side = [is_rx[one]]
    m = ~one
    if m.any():
        ep, a, b, w, is_rx, i0, i1 = ep[m], a[m], b[m], w[m], is_rx[m], i0[m], i1[m]
        i0 = np.maximum(i0, 0)
        cnt = i1 - i0 + 1
        rows = np.repeat(np.arange(ep.size), cnt)
        first = np.repeat(np.cumsum(cnt) - cnt, cnt)
        bins = i0[rows] + (np.arange(rows.size) - first)
        share = (np.minimum(b[rows], bins + 1) - np.maximum(a[rows], bins)) / (b[rows] - a[rows])
        flat.append(ep[rows] * n_bins + bins)
        val.append(w[rows] * share)
        side.append(is_rx[rows])
    # one pass: RX bins after the TX ones (each bin still sums its pulses in their order)
    f = np.concatenate(flat) + np.concatenate(side) * (n_ep * n_bins)
    # (float even when no pulse falls in the block: bincount gives ints for no input)
    both = np.bincount(f, np.concatenate(val), minlength=2 * n_ep * n_bins).astype(np.float64)
    return both[: n_ep * n_bins].reshape(n_ep, n_bins), both[n_ep * n_bins :].reshape(n_ep, n_bins)


# ---------------------------------------------------------------------------------------------
# per-job plan


@dataclass(slots=True)
class _JobTraffic:
    """What one job's traffic needs, precomputed once (endpoint indices are model-wide)."""

    idx: int
    kind: int
    key: np.uint64
    period: float
    start: float
    end: float
    eps: np.ndarray  # model-wide endpoint indices of the job
    burst_s: float
    amp: float  # gradient-sync bytes/s
    pp_share: float
    microbatches: int
    vpp: int
    dist_opt: bool
    sched: Schedule | None
    unit_of_chain: np.ndarray  # timing unit (replica or EP group) per (tp, cp, dp) chain
    n_units: int
    # p2p per (chain, message stage pair): TX/RX endpoints, -1 where NVLink
    p2p_tx: np.ndarray
    p2p_rx: np.ndarray
    pair_of_msg: np.ndarray  # message → stage-pair column
    stage_eps: list[np.ndarray]  # endpoints in each stage's networked DP groups
    groups: list[tuple[int, int, np.ndarray]]  # (stage, unit, endpoints) of MoE all-to-all
    cp_ring: list[tuple[int, int, np.ndarray, np.ndarray]]  # (stage, unit, tx eps, rx eps)
    side_share: float  # MoE all-to-all or CP ring bytes / gradient-sync bytes
    cont_eps: np.ndarray  # (containers, rnics) endpoint indices
    ckpt_every: float
    ckpt_phase: float
    ckpt_len: float


def _chain_layout(job: SimJob) -> np.ndarray:
    """``(chains, pp)``: the GPU (= endpoint offset in the job, rank order) of each stage of each
    (tp, cp, dp) chain; chain ``t + TP·(c + CP·d)``."""
    s = job.shape
    chain = np.arange(s.tp * job.plan.cp * s.dp)
    return chain[:, None] + chain.size * np.arange(s.pp)[None, :]


class TrafficModel:
    """TX and RX bytes of every endpoint of some jobs, per sample of ``1 / sample_hz`` s.

    ``window(t0_s, n)`` gives ``(tx, rx)`` for the ``n`` samples from ``t0_s`` (on the sampling
    grid ``k / sample_hz``), ``matrix`` their sum, ``sample(t_s, dt_s)`` one interval of any
    length and ``rates(t_s)`` the bytes sent in ``[t_s, t_s + 1)``; ``ep_ids`` says which
    endpoints, in order.
    """

    def __init__(
        self,
        jobs: Sequence[SimJob],
        *,
        seed: int = 0,
        sample_hz: float = 1.0,
        burst_bytes_per_s: float = 15e9 / 8,
        burst_s: tuple[float, float] = (1.0, 3.0),
        jitter: float = 0.03,
        straggler_p: float = 0.05,
        straggler_slowdown: tuple[float, float] = (0.05, 0.3),
        replica_sigma: float = 0.01,
        op_jitter: float = 0.05,
        pp_share: tuple[float, float] = (0.05, 0.5),
        side_share: tuple[float, float] = (0.3, 1.5),
        nic_bytes_per_s: float = 25e9,
        noise_sigma: float = 0.1,
        background_bytes_per_s: float = 2e6,
        contention_bytes_per_s: float = 0.0,
        loader_bytes: tuple[float, float] = (1e7, 1e8),
        checkpoint_every_s: tuple[float, float] = (600.0, 1800.0),
        checkpoint_s: tuple[float, float] = (10.0, 40.0),
        clock_sigma_s: float = 0.002,
        sample_jitter_s: float = 0.003,
        layers: int = 4,
        block_s: float = 60.0,
    ) -> None:
        if not burst_bytes_per_s > 0 or not 0 < burst_s[0] <= burst_s[1]:
            raise ConfigError(
                "The 'burst_bytes_per_s' and 'burst_s' parameters of TrafficModel must be > 0."
            )
        for nm, v in (("jitter", jitter), ("straggler_p", straggler_p)):
            if not 0.0 <= v <= 1.0:
                raise ConfigError(
                    f"The '{nm}' parameter of TrafficModel must be in [0, 1]. Got {v!r} instead."
                )
        if not sample_hz > 0 or not (block_s * sample_hz) >= 1:
            raise ConfigError(
                "The 'sample_hz' parameter of TrafficModel must be > 0 with at least one sample "
                f"per block. Got {sample_hz!r} instead."
            )
        self.seed = int(seed)
        self.sample_hz = float(sample_hz)
        self.jobs = list(jobs)
        self.jitter = float(jitter)
        self.straggler_p = float(straggler_p)
        self.slowdown = (float(straggler_slowdown[0]), float(straggler_slowdown[1]))
        self.replica_sigma = float(replica_sigma)
        self.op_jitter = float(op_jitter)
        self.nic = float(nic_bytes_per_s)
        #: an endpoint's rate during a burst (the noise model starts congestion where jobs burst)
        self.burst = float(burst_bytes_per_s)
        self.noise_sigma = float(noise_sigma)
        self.background = float(background_bytes_per_s)
        self.contention = float(contention_bytes_per_s)
        self.loader = (float(loader_bytes[0]), float(loader_bytes[1]))
        self.layers = int(layers)
        self.block_bins = int(round(block_s * self.sample_hz))
        self.block_s = self.block_bins / self.sample_hz
        sizes = [j.n_endpoints for j in self.jobs]
        self.ep_ids = (
            np.concatenate([j.ep_ids for j in self.jobs]) if self.jobs else np.zeros(0, np.uint32)
        ).astype(np.uint32)
        firsts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64) if self.jobs else []
        nj = len(self.jobs)
        self.period = np.array([j.iteration_s for j in self.jobs], np.float64)
        self.train_start = np.array(
            [float(j.ready_s.max()) if j.n_endpoints else 0.0 for j in self.jobs]
        )
        self.end = np.array([j.end_s for j in self.jobs], np.float64)
        rng = rng_for(self.seed, 0x7AFF1C)
        draws = rng.random((max(nj, 1), 8))
        hosts = np.concatenate([j.host for j in self.jobs]) if self.jobs else np.zeros(0, int)
        self.sample_jitter = float(sample_jitter_s)
        # the hosts once each, and each endpoint's: a sample's timing is its host's
        self._hosts, self._host_of = np.unique(hosts.astype(np.uint64), return_inverse=True)
        self._shift = clock_sigma_s * _normal(
            mix_hash(hosts.astype(np.uint64), np.uint64(self.seed), np.uint64(0xC10C))
        )
        self._plans = [
            self._plan(
                i,
                j,
                int(firsts[i]),
                draws[i],
                burst_bytes_per_s,
                burst_s,
                pp_share,
                side_share,
                checkpoint_every_s,
                checkpoint_s,
            )
            for i, j in enumerate(self.jobs)
        ]
        self._blocks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    @property
    def n(self) -> int:
        return int(self.ep_ids.size)

    # -- per-job preparation ------------------------------------------------------------------
    def _plan(self, i, job, first, u, burst_rate, burst_s, pp_share, side_share, ck_every, ck_s):
        kind = _KIND[job.kind]
        shape, plan = job.shape, job.plan
        eps = first + np.arange(job.n_endpoints)
        r = plan.rnics
        cont_eps = eps.reshape(-1, r)
        sched = None
        chains = np.zeros((0, 1), np.int64)
        unit = np.zeros(0, np.int64)
        n_units = 1
        p2p_tx = p2p_rx = np.zeros((0, 0), np.int64)
        pair_of_msg = np.zeros(0, np.int64)
        stage_eps: list[np.ndarray] = []
        groups: list[tuple[int, int, np.ndarray]] = []
        ring: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        if kind in (0, 1):
            sched = pipeline_schedule(shape.pp, plan.vpp, plan.microbatches)
            chains = _chain_layout(job)  # (chains, pp) GPU = endpoint offset in the job
            tp, cp, dp = shape.tp, plan.cp, shape.dp
            d_of_chain = np.arange(chains.shape[0]) // (tp * cp)
            # MoE: the replicas of an expert-parallel group move together (their all-to-all)
            ep_sync = shape.ep if kind == 1 else 1
            unit = d_of_chain // ep_sync
            n_units = dp // ep_sync
            pairs, pair_of_msg = np.unique(
                np.stack([sched.msg_src, sched.msg_dst], axis=1), axis=0, return_inverse=True
            )
            pair_of_msg = pair_of_msg.ravel()
            src = chains[:, pairs[:, 0]]
            dst = chains[:, pairs[:, 1]]
            cs, cd = src // r, dst // r
            # PXN: the send leaves through the NIC rail-aligned with the destination GPU
            p2p_tx = np.where(cs != cd, first + cs * r + dst % r, -1)
            p2p_rx = np.where(cs != cd, first + dst, -1)
            stage = job.pp_stage
            for s in range(shape.pp):
                members = np.flatnonzero(stage == s)
                grp = job.dp_group[members]
                _, inv, cnt = np.unique(grp, return_inverse=True, return_counts=True)
                stage_eps.append(first + members[cnt[inv] > 1])
            if kind == 1:
                for s in range(shape.pp):
                    for un in range(n_units):
                        mine = chains[unit == un, s]
                        if np.unique(mine // r).size > 1:
                            groups.append((s, un, first + mine))
            if cp > 1:
                # ring per (t, d): c → c + 1
                c_of_chain = (np.arange(chains.shape[0]) // tp) % cp
                for s in range(shape.pp):
                    g = chains[:, s]
                    nxt = chains[
                        np.arange(chains.shape[0]) - c_of_chain * tp + ((c_of_chain + 1) % cp) * tp,
                        s,
                    ]
                    cross = g // r != nxt // r
                    for un in range(n_units):
                        sel = cross & (unit == un)
                        if sel.any():
                            tx = first + (g[sel] // r) * r + nxt[sel] % r
                            ring.append((s, un, tx, first + nxt[sel]))
        elif kind == 3:
            stage_eps.append(eps[job.dp_group >= 0])
        lo, hi = burst_s
        blen = min(lo + (hi - lo) * u[0], 0.25 * job.iteration_s)
        every = ck_every[0] + (ck_every[1] - ck_every[0]) * u[5]
        return _JobTraffic(
            idx=i,
            kind=kind,
            key=mix_hash(np.uint64(i), np.uint64(self.seed), np.uint64(0x70B)),
            period=float(job.iteration_s),
            start=float(self.train_start[i]),
            end=float(job.end_s),
            eps=eps,
            burst_s=float(blen),
            amp=float(burst_rate * (0.7 + 0.3 * u[1])),
            pp_share=float(pp_share[0] + (pp_share[1] - pp_share[0]) * u[2]),
            microbatches=plan.microbatches,
            vpp=plan.vpp,
            dist_opt=bool(u[3] < 0.5),
            sched=sched,
            unit_of_chain=unit,
            n_units=n_units,
            p2p_tx=p2p_tx,
            p2p_rx=p2p_rx,
            pair_of_msg=pair_of_msg,
            stage_eps=stage_eps,
            groups=groups,
            cp_ring=ring,
            side_share=float(side_share[0] + (side_share[1] - side_share[0]) * u[4]),
            cont_eps=cont_eps,
            ckpt_every=float(every),
            ckpt_phase=float(every * u[6]),
            ckpt_len=float(ck_s[0] + (ck_s[1] - ck_s[0]) * u[7]),
        )

    # -- iterations -----------------------------------------------------------------------------
    def _starts(self, jp: _JobTraffic, k: np.ndarray) -> np.ndarray:
        j = _unit(mix_hash(jp.key, k.astype(np.uint64), np.uint64(1))) - 0.5
        return jp.start + k * jp.period + self.jitter * jp.period * j

    def _job_pulses(self, jp: _JobTraffic, b: int, out: _Pulses) -> None:
        """The job's pulses that may reach into block ``b``."""
        t1 = (b + 1) * self.block_s
        t0 = b * self.block_s - 5.0  # pulses starting shortly before the block may reach into it
        if jp.end <= t0 or jp.start >= t1:
            return
        if jp.kind == 2:
            self._debug_pulses(jp, b, out)
            return
        k_lo = max(0, int(np.floor((t0 - jp.start) / jp.period)) - 1)
        k_hi = int(np.ceil((t1 - jp.start) / jp.period)) + 1
        k = np.arange(k_lo, k_hi + 1)
        s_k = self._starts(jp, k)
        length = self._starts(jp, k + 1) - s_k
        keep = s_k < min(t1, jp.end)
        k, s_k, length = k[keep], s_k[keep], length[keep]
        if k.size:
            mine = _Pulses.empty()
            if jp.kind == 3:
                self._fsdp(jp, k, s_k, length, mine)
            else:
                self._pipeline(jp, k, s_k, length, mine)
            self._loader(jp, k, s_k, length, mine)
            out.extend(mine, before=jp.end)  # nothing after the containers are gone
        self._checkpoints(jp, t0, t1, out)

    def _pipeline(self, jp, k, s_k, length, out: _Pulses) -> None:
        sched = jp.sched
        kk = k.astype(np.uint64)[:, None]
        units = np.arange(jp.n_units, dtype=np.uint64)[None, :]
        speed = 1.0 + self.replica_sigma * _normal(mix_hash(jp.key, kk, units, np.uint64(2)))
        strag = _unit(mix_hash(jp.key, k.astype(np.uint64), np.uint64(3))) < self.straggler_p
        who = (mix_hash(jp.key, k.astype(np.uint64), np.uint64(4)) % np.uint64(jp.n_units)).astype(
            np.int64
        )
        lo, hi = self.slowdown
        slow = lo + (hi - lo) * _unit(mix_hash(jp.key, k.astype(np.uint64), np.uint64(5)))
        speed[np.flatnonzero(strag), who[strag]] += slow[strag]
        umax = speed.max(axis=1)
        head = 0.02 * length
        # the slowest replica's pipeline ends in time for the gradient sync to fit the iteration
        busy = np.maximum(0.9 * length - head - jp.burst_s, 0.2 * length)
        tau = busy / (sched.span * umax)  # seconds per forward of one stage
        base = s_k + head
        # gradient sync (and the distributed optimizer's parameter all-gather)
        ar_bytes = jp.amp * jp.burst_s
        for s, members in enumerate(jp.stage_eps):
            if members.size == 0:
                continue
            noise = np.exp(
                self.noise_sigma * _normal(mix_hash(jp.key, kk[:, 0], np.uint64(6 + 8 * s)))
            )
            at = base + tau * umax * sched.last[s]
            if jp.dist_opt:
                out.add(
                    members[None, :], at[:, None], jp.burst_s / 2, (ar_bytes / 2 * noise)[:, None]
                )
                ag = s_k + tau * speed.min(axis=1) * sched.first[s]
                out.add(
                    members[None, :], ag[:, None], jp.burst_s / 2, (ar_bytes / 2 * noise)[:, None]
                )
            else:
                out.add(members[None, :], at[:, None], jp.burst_s, (ar_bytes * noise)[:, None])
        n_msg = sched.msg_t.size
        if n_msg and jp.p2p_tx.size:
            # an interior stage sends one message per forward and backward of every chunk
            msg_bytes = jp.pp_share * ar_bytes / (2 * jp.microbatches * jp.vpp)
            h = mix_hash(
                jp.key,
                kk[:, :, None],
                units[:, :, None],
                np.arange(n_msg, dtype=np.uint64)[None, None, :],
            )
            t_msg = (
                base[:, None, None]
                + tau[:, None, None] * speed[:, :, None] * sched.msg_t[None, None, :]
                + self.op_jitter * tau[:, None, None] * _normal(h)
            )  # (K, units, msgs)
            tx = jp.p2p_tx[:, jp.pair_of_msg]  # (chains, msgs)
            rx = jp.p2p_rx[:, jp.pair_of_msg]
            t_ch = t_msg[:, jp.unit_of_chain, :]  # (K, chains, msgs)
            net = tx >= 0
            tt = t_ch[:, net]
            dur = msg_bytes / self.nic
            out.add(np.broadcast_to(tx[net], tt.shape), tt, dur, msg_bytes, tx=True, rx=False)
            out.add(np.broadcast_to(rx[net], tt.shape), tt, dur, msg_bytes, tx=False, rx=True)
        if jp.groups or jp.cp_ring:
            self._side(jp, kk, base, tau, speed, ar_bytes, out)

    def _side(self, jp, kk, base, tau, speed, ar_bytes, out: _Pulses) -> None:
        """MoE all-to-all / CP ring: ``layers`` events inside every operation of a stage."""
        sched = jp.sched
        n_ops = sched.op_dev.size
        frac = (np.arange(self.layers) + 0.5) / self.layers
        ev_t = sched.op_t0[:, None] + (sched.op_t1 - sched.op_t0)[:, None] * frac[None, :]
        ev_dev = np.repeat(sched.op_dev, self.layers)
        ev_t = ev_t.ravel()
        per_stage_events = max(n_ops * self.layers / max(len(jp.stage_eps), 1), 1.0)
        ev_bytes = jp.side_share * ar_bytes / per_stage_events
        # an all-to-all runs at the collective rate of the gradient sync, a ring step is a send
        a2a_s, ring_s = ev_bytes / jp.amp, ev_bytes / self.nic
        for s, un, members in jp.groups:
            sel = ev_dev == s
            t = base[:, None] + tau[:, None] * speed[:, un][:, None] * ev_t[sel][None, :]
            h = mix_hash(
                jp.key,
                kk,
                np.uint64(un),
                np.uint64(1000 + s),
                np.arange(t.shape[1], dtype=np.uint64)[None, :],
            )
            tt = np.broadcast_to(t[:, :, None], t.shape + (members.size,))
            # routing imbalance: every member its own share of each all-to-all
            imb = np.exp(0.3 * _normal(mix_hash(h[:, :, None], members.astype(np.uint64))))
            out.add(np.broadcast_to(members, tt.shape), tt, a2a_s, ev_bytes * imb)
        for s, un, tx, rx in jp.cp_ring:
            sel = ev_dev == s
            t = base[:, None] + tau[:, None] * speed[:, un][:, None] * ev_t[sel][None, :]
            tt = np.broadcast_to(t[:, :, None], t.shape + (tx.size,))
            out.add(np.broadcast_to(tx, tt.shape), tt, ring_s, ev_bytes, tx=True, rx=False)
            out.add(np.broadcast_to(rx, tt.shape), tt, ring_s, ev_bytes, tx=False, rx=True)

    def _fsdp(self, jp, k, s_k, length, out: _Pulses) -> None:
        """ZeRO-3: per microbatch, an all-gather per layer group before its forward, and an
        all-gather and a reduce-scatter per layer group in its backward, job-wide."""
        job = self.jobs[jp.idx]
        g, lyr = job.plan.microbatches, self.layers
        fwd = np.arange(lyr) * 1.0
        bwd = lyr + np.arange(lyr) * 2.0
        one = np.r_[fwd, bwd, bwd + 1.0]
        t_unit = (np.arange(g)[:, None] * 3 * lyr + one[None, :]).ravel()
        span = g * 3 * lyr
        head = 0.02 * length
        tau = np.maximum(0.9 * length - head, 0.2 * length) / span
        t = s_k[:, None] + head[:, None] + tau[:, None] * t_unit[None, :]
        total = 1.5 * jp.amp * jp.burst_s
        ev = total / t_unit.size
        members = jp.stage_eps[0]
        tt = np.broadcast_to(t[:, :, None], t.shape + (members.size,))
        out.add(np.broadcast_to(members, tt.shape), tt, ev / jp.amp, ev)

    def _loader(self, jp, k, s_k, length, out: _Pulses) -> None:
        """One batch per container and iteration, on one of its rails, at a random time."""
        kk = k.astype(np.uint64)[:, None]
        n_c, r = jp.cont_eps.shape
        cc = np.arange(n_c, dtype=np.uint64)[None, :]
        h = mix_hash(jp.key, kk, cc, np.uint64(7))
        rail = (h % np.uint64(r)).astype(np.int64)
        ep = jp.cont_eps[np.arange(n_c)[None, :], rail]
        t = s_k[:, None] + length[:, None] * _unit(mix_hash(h, np.uint64(1)))
        lo, hi = self.loader
        nbytes = lo + (hi - lo) * _unit(mix_hash(h, np.uint64(2)))
        out.add(ep, t, nbytes / self.nic, nbytes, tx=False, rx=True)

    def _checkpoints(self, jp, t0, t1, out: _Pulses) -> None:
        first = jp.start + jp.ckpt_phase
        i_lo = max(0, int(np.floor((t0 - first - jp.ckpt_len) / jp.ckpt_every)))
        i_hi = int(np.floor((t1 - first) / jp.ckpt_every))
        for i in range(i_lo, i_hi + 1):
            at = first + i * jp.ckpt_every
            if at >= jp.end or at + jp.ckpt_len <= t0:
                continue
            u = _unit(mix_hash(jp.key, np.uint64(i), jp.eps.astype(np.uint64), np.uint64(8)))
            # storage writes: each RNIC its shard, at an uneven share of a storage link
            rate = 0.1 * jp.amp * (0.5 + u)
            out.add(jp.eps, at + 0.2 * u, jp.ckpt_len, rate * jp.ckpt_len, tx=True, rx=False)

    def _debug_pulses(self, jp, b: int, out: _Pulses) -> None:
        """Irregular bursts, uncorrelated across endpoints (drawn per block)."""
        for blk in (b - 1, b):  # bursts of the previous block may reach into this one
            rng = rng_for(self.seed, 0xDEB, jp.idx, blk)
            cnt = rng.poisson(0.1 * self.block_s, jp.eps.size)
            ep = np.repeat(jp.eps, cnt)
            t = blk * self.block_s + rng.random(ep.size) * self.block_s
            nbytes = 0.2 * jp.amp * rng.random(ep.size)
            lag = rng.random(ep.size) * 0.5
            keep = (t >= jp.start) & (t < jp.end)
            out.add(ep[keep], t[keep], 1.0, nbytes[keep], rx=False)
            out.add(ep[keep], t[keep] + lag[keep], 1.0, nbytes[keep] * 1.1, tx=False)

    # -- blocks ---------------------------------------------------------------------------------
    def _contention(self, b: int, out: _Pulses) -> None:
        """Bursty co-tenant/storage flows averaging ``contention_bytes_per_s`` per direction."""
        if self.contention <= 0 or self.n == 0:
            return
        flow_s, rate = 2.0, 4.0 * self.contention
        per_s = self.contention / (rate * flow_s)
        for back in (0, 1):  # flows started in the previous block may still run
            rng = rng_for(self.seed, 0xC0DE, b - back)
            cnt = rng.poisson(per_s * self.block_s, (2, self.n))
            for d in (0, 1):
                ep = np.repeat(np.arange(self.n), cnt[d])
                t = (b - back) * self.block_s + rng.random(ep.size) * self.block_s
                dur = rng.exponential(flow_s, ep.size)
                out.add(
                    ep, t, dur, dur * rate * rng.uniform(0.5, 1.5, ep.size), tx=d == 0, rx=d == 1
                )

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        hit = self._blocks.get(b)
        if hit is not None:
            self._blocks.move_to_end(b)
            return hit
        t0 = b * self.block_s
        out = _Pulses.empty()
        for jp in self._plans:
            self._job_pulses(jp, b, out)
        self._contention(b, out)
        tx, rx = _bin_pulses(out, self.n, self._shift, t0, self.sample_hz, self.block_bins)
        if self.sample_jitter > 0 and self.n:
            # a sample taken ε late moves the bytes of those ε (at the rate around that edge)
            # from the next interval into this one; the host's samples cover all its RNICs
            edges = np.arange(b * self.block_bins + 1, (b + 1) * self.block_bins).astype(np.uint64)
            h = mix_hash(np.uint64(self.seed), self._hosts[:, None], edges[None, :], np.uint64(9))
            eps = self.sample_jitter * _normal(h)[self._host_of]
            for a in (tx, rx):
                moved = (a[:, :-1] + a[:, 1:]) * 0.5 * self.sample_hz * eps
                moved = np.clip(moved, -a[:, :-1], a[:, 1:])
                a[:, :-1] += moved
                a[:, 1:] -= moved
        if self.background > 0 and self.n:
            dt = 1.0 / self.sample_hz
            bins = np.arange(b * self.block_bins, (b + 1) * self.block_bins, dtype=np.int64)
            h = mix_hash(
                np.uint64(self.seed),
                np.arange(self.n, dtype=np.uint64)[:, None],
                bins.astype(np.uint64)[None, :],
            )
            tx += -np.log1p(-_unit(h)) * self.background * dt
            rx += -np.log1p(-_unit(mix_hash(h, np.uint64(1)))) * self.background * dt
        self._blocks[b] = (tx, rx)
        while len(self._blocks) > 3:
            self._blocks.popitem(last=False)
        return tx, rx

    def window(self, t0_s: float, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tx, rx)`` bytes of every endpoint in the ``n_samples`` sampling intervals from
        ``t0_s`` (rounded down to the sampling grid): two ``(n, n_samples)`` float64 arrays."""
        if not isinstance(n_samples, int | np.integer) or n_samples < 1:
            raise ConfigError(
                f"The 'n_samples' parameter of TrafficModel.window must be an int >= 1. "
                f"Got {n_samples!r} instead."
            )
        i0 = int(np.floor(t0_s * self.sample_hz + 1e-9))
        i1 = i0 + int(n_samples)
        tx = np.empty((self.n, int(n_samples)))
        rx = np.empty_like(tx)
        for b in range(i0 // self.block_bins, (i1 - 1) // self.block_bins + 1):
            btx, brx = self._block(b)
            lo, hi = max(i0, b * self.block_bins), min(i1, (b + 1) * self.block_bins)
            tx[:, lo - i0 : hi - i0] = btx[:, lo - b * self.block_bins : hi - b * self.block_bins]
            rx[:, lo - i0 : hi - i0] = brx[:, lo - b * self.block_bins : hi - b * self.block_bins]
        return tx, rx

    def matrix(self, t0_s: float, n_samples: int) -> np.ndarray:
        """Bytes through each endpoint (TX + RX) per sample: ``(n, n_samples)`` float64."""
        tx, rx = self.window(t0_s, n_samples)
        return tx + rx

    def sample(self, t_s: float, dt_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """``(tx, rx)`` bytes of every endpoint in ``[t_s, t_s + dt_s)`` (on the sampling grid)."""
        n = max(1, int(round(dt_s * self.sample_hz)))
        tx, rx = self.window(t_s, n)
        return tx.sum(axis=1), rx.sum(axis=1)

    def rates(self, t_s: float) -> np.ndarray:
        """Bytes each endpoint (``ep_ids`` order) sends in ``[t_s, t_s + 1)``; float64."""
        return self.sample(t_s, 1.0)[0]


def throughput(
    job: SimJob | Sequence[SimJob],
    duration_s: int,
    seed: int = 0,
    *,
    t0_s: float | None = None,
    **model_kw: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-endpoint bytes through each endpoint (TX + RX) per sample of one job (or several).

    Returns ``(ep_ids uint32[n], bytes float64[n, duration_s · sample_hz])``. ``t0_s`` defaults
    to the moment the (first) job starts training (all its containers ready). Extra keywords go
    to :class:`TrafficModel`.
    """
    jobs = [job] if isinstance(job, SimJob) else list(job)
    model = TrafficModel(jobs, seed=seed, **model_kw)  # type: ignore[arg-type]
    if t0_s is None:
        t0_s = float(model.train_start.min()) if jobs else 0.0
    n = int(round(duration_s * model.sample_hz))
    return model.ep_ids, model.matrix(float(np.floor(t0_s)), n)


def counter_series(
    job: SimJob | Sequence[SimJob],
    duration_s: int,
    seed: int = 0,
    *,
    sample_hz: float = 10.0,
    t0_s: float | None = None,
    **model_kw: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(tx, rx)`` bytes per sample at ``sample_hz`` of one job's (or several jobs')
    endpoints, as the underlay agents' counters see them, from the moment the (first) job starts
    training (or ``t0_s``) for ``duration_s``; two ``(n, duration_s · sample_hz)`` arrays in
    ``ep_ids`` order. Extra keywords go to :class:`TrafficModel`."""
    jobs = [job] if isinstance(job, SimJob) else list(job)
    model = TrafficModel(jobs, seed=seed, sample_hz=sample_hz, **model_kw)  # type: ignore[arg-type]
    if t0_s is None:
        t0_s = float(model.train_start.min()) if jobs else 0.0
    return model.window(float(np.floor(t0_s)), int(round(duration_s * sample_hz)))


def counter_batch(
    ep_ids: np.ndarray,
    t_ns: int,
    tx_total: np.ndarray,
    rx_total: np.ndarray,
    *,
    oper_up: np.ndarray | None = None,
    tx_dropped: np.ndarray | None = None,
    rx_dropped: np.ndarray | None = None,
) -> np.ndarray:
    """One ``COUNTER_DTYPE`` batch of cumulative counters sampled at ``t_ns``."""
    out = empty_counters(len(ep_ids))
    out["ep"] = ep_ids
    out["t_ns"] = t_ns
    out["oper_up"] = 1 if oper_up is None else oper_up
    out["tx_bytes"] = tx_total
    out["rx_bytes"] = rx_total
    if tx_dropped is not None:
        out["tx_dropped"] = tx_dropped
    if rx_dropped is not None:
        out["rx_dropped"] = rx_dropped
    return out
