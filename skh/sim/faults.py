"""The failure types of :mod:`skh.failures` the simulator injects — the paper's 19 (Table 1,
``shared/notes/paper.md`` §7), agent crash, late (slow) agent and an overlay (vswitch) forwarding
loop — as symptom models over probe batches.

Each :class:`FaultSpec` gives a type's symptom and default magnitudes; the component kind it sits
on (*target*) and its *layer* are the type's (:data:`skh.failures.FAILURES`):

==  ============================  =========  ========  ==========================================
#   type                          target     layer     symptom (defaults)
==  ============================  =========  ========  ==========================================
1   CRC error                     link       underlay  loss 2% on paths over the link
2   switch port down              link       underlay  unreachable on paths over the link
3   switch port flapping          link       underlay  unreachable 4 s of every 20 s
4   switch offline                switch     underlay  unreachable on paths through the switch
5   RNIC hardware failure         rnic       rnic      unreachable, both ways
6   RNIC firmware not responding  rnic       rnic      +40 µs on 30% of the RNIC's flows
7   RNIC port down                rnic       rnic      unreachable, both ways
8   RNIC port flapping            rnic       rnic      unreachable 5 s of every 30 s
9   offloading failure            rnic       rnic      +104 µs (16 → 120 µs: slow path)
10  bond error                    rnic       rnic      unreachable, both ways
11  RNIC GID change               rnic       rnic      unreachable as destination (stale GID)
12  PCIe–NIC error                host       host      +30 µs on every RNIC of the host
13  GPUDirect RDMA error          host       host      +10 µs on every RNIC of the host
14  not using RDMA                container  overlay   +60 µs (TCP/UDP fallback)
15  repetitive flow offloading    rnic       overlay   +104 µs 8 s of every 20 s (re-offload)
16  suboptimal flow offloading    rnic       overlay   +25 µs on 40% of the RNIC's flows
17  container crash               container  overlay   unreachable, both ways
18  hugepage misconfiguration     host       config    +20 µs on every RNIC of the host
19  congestion-control issue      switch     config    +30 µs on paths through the switch
20  agent crash                   container  agent     no probes from it; probes to it lost
21  late agent                    container  agent     +2 ms prober delay, 10% of probes to it lost
22  overlay (vswitch) loop        rnic       overlay   UNREACHABLE (TTL exceeded)
==  ============================  =========  ========  ==========================================

A component is named as the model names it: a link ``"a|b"`` (sorted node names, see
:func:`link_component`; an RNIC's access link has its ``host:rnicN`` key as one end), a switch
name, an RNIC key ``host:rnicN``, a host name, a container name.

Latency faults take ``profile="ramp"`` to grow linearly over ``ramp_s`` (the long-term drift).
A flapping fault with ``aperiodic=True`` draws each cycle's length (0.5-1.5 x the period) and
on-time (0.6-1.4 x, at most the cycle) from its fault id, as real ports flap. ``paths`` limits a
fault to some flows (path ids) of the pairs it touches — a gray fault on one ECMP path.
Randomness comes from the caller's generator, so a seeded simulation replays exactly.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from skh.errors import ConfigError, TopologyError
from skh.failures import FAILURES, ComponentKind, FailureLayer, FailureType
from skh.records import ProbeStatus
from skh.sim.probes import Effects
from skh.sim.topology import EndpointTable, FabricIndex, Route, mix_hash

__all__ = [
    "FaultSpec",
    "FAULT_SPECS",
    "SIMULATED_TYPES",
    "Fault",
    "FaultRecord",
    "FaultEngine",
    "RowSet",
    "link_component",
    "Symptom",
]

Symptom = Literal["unreachable", "loss", "flapping", "latency", "agent_down", "agent_slow"]


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """How the simulator models one failure type; what the type is (its name, Table 1
    component, layer, the component kind it sits on) is :data:`skh.failures.FAILURES`'."""

    type: FailureType
    symptom: Symptom
    loss_rate: float = 0.0
    extra_ns: float = 0.0
    flap_period_s: float = 0.0  # > 0: the symptom is on only ``flap_on_s`` of every period
    flap_on_s: float = 0.0
    flow_share: float = 1.0  # share of the component's flows (pairs) that suffer
    to_only: bool = False  # only probes towards the component suffer
    status: int = ProbeStatus.LOST  # status of an unreachable probe

    @property
    def name(self) -> str:
        return FAILURES[self.type].title

    @property
    def paper_component(self) -> str:
        return FAILURES[self.type].paper_component

    @property
    def target(self) -> ComponentKind:
        return FAILURES[self.type].component

    @property
    def layer(self) -> FailureLayer:
        return FAILURES[self.type].layer

    @property
    def in_paper(self) -> bool:
        return self.type.in_paper


_T = FailureType
#: every simulated fault type's model (see the module table)
FAULT_SPECS: dict[FailureType, FaultSpec] = {
    s.type: s
    for s in (
        FaultSpec(_T.CRC_ERROR, "loss", loss_rate=0.02),
        FaultSpec(_T.SWITCH_PORT_DOWN, "unreachable"),
        FaultSpec(_T.SWITCH_PORT_FLAPPING, "flapping", flap_period_s=20.0, flap_on_s=4.0),
        FaultSpec(_T.SWITCH_OFFLINE, "unreachable"),
        FaultSpec(_T.RNIC_HW_FAILURE, "unreachable"),
        FaultSpec(_T.RNIC_FIRMWARE_NOT_RESPONDING, "latency", extra_ns=40_000.0, flow_share=0.3),
        FaultSpec(_T.RNIC_PORT_DOWN, "unreachable"),
        FaultSpec(_T.RNIC_PORT_FLAPPING, "flapping", flap_period_s=30.0, flap_on_s=5.0),
        FaultSpec(_T.OFFLOADING_FAILURE, "latency", extra_ns=104_000.0),
        FaultSpec(_T.BOND_ERROR, "unreachable"),
        FaultSpec(_T.RNIC_GID_CHANGE, "unreachable", to_only=True),
        FaultSpec(_T.PCIE_NIC_ERROR, "latency", extra_ns=30_000.0),
        FaultSpec(_T.GPUDIRECT_RDMA_ERROR, "latency", extra_ns=10_000.0),
        FaultSpec(_T.NOT_USING_RDMA, "latency", extra_ns=60_000.0),
        FaultSpec(
            _T.REPETITIVE_FLOW_OFFLOADING,
            "latency",
            extra_ns=104_000.0,
            flap_period_s=20.0,
            flap_on_s=8.0,
        ),
        FaultSpec(_T.SUBOPTIMAL_FLOW_OFFLOADING, "latency", extra_ns=25_000.0, flow_share=0.4),
        FaultSpec(_T.CONTAINER_CRASH, "unreachable"),
        FaultSpec(_T.HUGEPAGE_MISCONFIG, "latency", extra_ns=20_000.0),
        FaultSpec(_T.CC_ISSUE, "latency", extra_ns=30_000.0),
        FaultSpec(_T.AGENT_CRASH, "agent_down"),
        FaultSpec(_T.LATE_AGENT, "agent_slow", loss_rate=0.1, extra_ns=2_000_000.0),
        FaultSpec(_T.OVERLAY_LOOP, "unreachable", status=ProbeStatus.UNREACHABLE),
    )
}
#: the types the simulator can inject, in type order (not UNKNOWN, not OVERLAY_BLACKHOLE yet)
SIMULATED_TYPES: tuple[FailureType, ...] = tuple(FAULT_SPECS)


def link_component(a: str, b: str) -> str:
    """The component name of the link between nodes ``a`` and ``b``: ``"lo|hi"``."""
    lo, hi = (a, b) if a <= b else (b, a)
    return f"{lo}|{hi}"


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. ``None`` magnitudes take the type's :data:`FAULT_SPECS` defaults."""

    type: FailureType
    component: str
    start_s: float
    end_s: float = math.inf
    loss_rate: float | None = None
    extra_ns: float | None = None
    flap_period_s: float | None = None
    flap_on_s: float | None = None
    flow_share: float | None = None
    profile: Literal["step", "ramp"] = "step"
    ramp_s: float = 3600.0
    aperiodic: bool = False
    #: only probes of these path ids suffer (None: all)
    paths: tuple[int, ...] | None = None
    fault_id: int = -1  # set by the simulation on injection
    group: int = -1  # faults injected together (e.g. both layers at once) share a group

    @property
    def spec(self) -> FaultSpec:
        return FAULT_SPECS[self.type]

    def eff(self, name: str) -> float:
        v = getattr(self, name)
        return getattr(self.spec, name) if v is None else v

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def with_id(self, fault_id: int, group: int | None = None) -> Fault:
        return replace(self, fault_id=fault_id, group=self.group if group is None else group)


@dataclass(frozen=True, slots=True, eq=False)
class FaultRecord:
    """Ground truth of one fault, as the evaluation harness scores against it."""

    fault_id: int
    type: FailureType
    name: str
    layer: FailureLayer
    target: ComponentKind
    component: str
    start_s: float
    end_s: float
    start_ns: int
    end_ns: int  # -1 while open-ended
    affected_pairs: np.ndarray  # (m, 2) uint32 ping pairs the fault touches (on any path id)
    jobs: tuple[str, ...]
    group: int = -1
    params: dict = field(default_factory=dict)


class RowSet:
    """The probes of one batch; per-row RNICs and the route are derived lazily."""

    def __init__(
        self,
        index: FabricIndex,
        eps: EndpointTable,
        src_ep: np.ndarray,
        dst_ep: np.ndarray,
        path_id: np.ndarray,
        t_s: np.ndarray,
    ) -> None:
        self.index, self.eps = index, eps
        self.src_ep = np.asarray(src_ep, np.int64)
        self.dst_ep = np.asarray(dst_ep, np.int64)
        self.path_id = np.asarray(path_id, np.int64)
        self.t_s = np.asarray(t_s, np.float64)
        self._route: Route | None = None

    def __len__(self) -> int:
        return self.src_ep.size

    @classmethod
    def all_paths(
        cls, index: FabricIndex, eps: EndpointTable, pairs: np.ndarray, n_path_ids: int
    ) -> RowSet:
        """One row per (path id, pair), path-major (row ``path_id * len(pairs) + pair``), at
        time 0: what a fault touches on any of the pairs' paths."""
        m = pairs.shape[0]
        return cls(
            index,
            eps,
            np.tile(pairs[:, 0], n_path_ids),
            np.tile(pairs[:, 1], n_path_ids),
            np.repeat(np.arange(n_path_ids), m),
            np.zeros(m * n_path_ids),
        )

    @property
    def src_rnic(self) -> np.ndarray:
        return self.eps.rnic[self.src_ep]

    @property
    def dst_rnic(self) -> np.ndarray:
        return self.eps.rnic[self.dst_ep]

    @property
    def route(self) -> Route:
        if self._route is None:
            self._route = self.index.route(self.src_rnic, self.dst_rnic, self.path_id)
        return self._route


class FaultEngine:
    """Resolves fault components to ids and turns active faults into per-row probe effects."""

    def __init__(self, index: FabricIndex, eps: EndpointTable) -> None:
        self.index = index
        self.eps = eps
        self._cycle_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        #: per fault id: probes it touched while on, and of those, probes another fault had
        #: already failed outright (down, unreachable, a dead agent): what no prober could see
        #: of it (:meth:`masked`)
        self.rows_on: dict[int, int] = {}
        self.rows_hidden: dict[int, int] = {}

    def masked(self, fault_id: int) -> bool:
        """Whether every probe fault ``fault_id`` touched while on was failed outright by
        another fault (a latency fault on an RNIC whose link is down): no probe could show it,
        so no monitor could have seen it. False for a fault that touched no probe at all (that
        is the probe list's doing, not another fault's)."""
        on = self.rows_on.get(fault_id, 0)
        return on > 0 and self.rows_hidden.get(fault_id, 0) == on

    # -- components --------------------------------------------------------------------------------
    def check(self, fault: Fault) -> None:
        """Raise ConfigError/TopologyError unless ``fault`` names a component of its kind."""
        if fault.type not in FAULT_SPECS:
            raise ConfigError(
                f"The 'type' of Fault must be a simulated FailureType "
                f"({', '.join(t.name for t in SIMULATED_TYPES)}). Got {fault.type!r} instead."
            )
        if not fault.end_s > fault.start_s:
            raise ConfigError(f"Fault {fault.type.name}: end_s must be after start_s.")
        for nm in ("loss_rate", "flow_share"):
            v = fault.eff(nm)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"The '{nm}' of Fault must be in [0, 1]. Got {v!r} instead.")
        self._resolve(fault)

    def _resolve(self, fault: Fault) -> tuple[str, int, int]:
        """(kind, id, other id): kind is ``access`` (RNIC id), ``link`` (switch ids), ``switch``,
        ``rnic``, ``host`` or ``container``."""
        t = fault.spec.target
        c = fault.component
        ix = self.index
        if t == "link":
            a, sep, b = c.partition("|")
            if not sep:
                raise TopologyError(
                    f"fault {fault.type.name}: link component must be 'a|b'. Got {c!r}."
                )
            for end, other in ((a, b), (b, a)):
                if ":rnic" in end:
                    r = self._rnic(end)
                    if ix.switch_names[ix.rnic_tor[r]] != other:
                        raise TopologyError(
                            f"fault {fault.type.name}: {end} is not cabled to {other}"
                        )
                    return "access", r, -1
            ia, ib = ix.switch_id.get(a), ix.switch_id.get(b)
            if ia is None or ib is None or (min(a, b), max(a, b)) not in ix.fabric.links:
                raise TopologyError(f"fault {fault.type.name}: no link {c!r} in the fabric")
            return "link", ia, ib
        if t == "switch":
            if c not in ix.switch_id:
                raise TopologyError(f"fault {fault.type.name}: unknown switch {c!r}")
            return "switch", ix.switch_id[c], -1
        if t == "rnic":
            return "rnic", self._rnic(c), -1
        if t == "host":
            if c not in ix.host_id:
                raise TopologyError(f"fault {fault.type.name}: unknown host {c!r}")
            return "host", ix.host_id[c], -1
        return "container", self.eps.container_id(c), -1

    def _rnic(self, key: str) -> int:
        host, _, rail = key.rpartition(":rnic")
        if host not in self.index.host_id or not rail.isdigit() or int(rail) >= self.index.rails:
            raise TopologyError(f"unknown RNIC {key!r} (expected host:rnicN)")
        return self.index.rnic_id(host, int(rail))

    # -- symptoms ----------------------------------------------------------------------------------
    def touches(self, fault: Fault, rows: RowSet) -> np.ndarray:
        """Rows the fault's component is on (before time windows and flow share)."""
        kind, i, j = self._resolve(fault)
        to_only = fault.spec.to_only
        if kind == "access" or kind == "rnic":
            m = rows.dst_rnic == i
            return m if to_only else m | (rows.src_rnic == i)
        if kind == "link":
            nd = rows.route.nodes
            m = np.zeros(len(rows), bool)
            for x, y in ((0, 1), (1, 2), (2, 3), (3, 4)):
                m |= ((nd[:, x] == i) & (nd[:, y] == j)) | ((nd[:, x] == j) & (nd[:, y] == i))
            return m
        if kind == "switch":
            return (rows.route.nodes == i).any(axis=1)
        if kind == "host":
            return (self.eps.host[rows.dst_ep] == i) | (self.eps.host[rows.src_ep] == i)
        cont = self.eps.container
        return (cont[rows.dst_ep] == i) | (cont[rows.src_ep] == i)

    def affected(self, fault: Fault, rows: RowSet) -> np.ndarray:
        """Rows whose probes suffer from the fault at some time (component, flow share and
        path ids)."""
        m = self.touches(fault, rows)
        if fault.paths is not None:
            m &= np.isin(rows.path_id, np.asarray(fault.paths, np.int64))
        share = fault.eff("flow_share")
        if share < 1.0 and m.any():
            lo = np.minimum(rows.src_ep, rows.dst_ep)
            hi = np.maximum(rows.src_ep, rows.dst_ep)
            u = mix_hash(
                lo, hi, np.uint64(fault.type), np.uint64(zlib.crc32(fault.component.encode()))
            )
            m &= u.astype(np.float64) / 2**64 < share
        return m

    def on_now(self, fault: Fault, t_s: np.ndarray) -> np.ndarray:
        """Per row: is the fault active, and inside the symptom's on-window when it flaps."""
        on = (t_s >= fault.start_s) & (t_s < fault.end_s)
        period = fault.eff("flap_period_s")
        if period > 0:
            if fault.aperiodic:
                starts, ons = self._cycles(fault)
                k = np.clip(np.searchsorted(starts, t_s, side="right") - 1, 0, starts.size - 1)
                on &= (t_s - starts[k]) < ons[k]
            else:
                on &= np.mod(t_s - fault.start_s, period) < fault.eff("flap_on_s")
        return on

    def windows_ended(self, fault: Fault, t_s: float) -> int:
        """How many of a flapping fault's on-windows ended by ``t_s`` (and before the fault
        did): each is one time its symptom went and came back (0 for a fault that does not
        flap)."""
        period = fault.eff("flap_period_s")
        t = min(float(t_s), fault.end_s)
        if period <= 0 or t < fault.start_s:
            return 0
        if fault.aperiodic:
            starts, ons = self._cycles(fault)
            return int(np.count_nonzero(starts + ons <= t))
        on = fault.eff("flap_on_s")
        return 0 if t < fault.start_s + on else int((t - fault.start_s - on) // period) + 1

    def _cycles(self, fault: Fault) -> tuple[np.ndarray, np.ndarray]:
        """Cycle start times and on-times of an aperiodic flap (cached per fault)."""
        key = (fault.fault_id, fault.component, fault.start_s)
        got = self._cycle_cache.get(key)
        if got is None:
            period, on = fault.eff("flap_period_s"), fault.eff("flap_on_s")
            span = min(fault.end_s, fault.start_s + 86400.0) - fault.start_s
            n = int(span / (0.5 * period)) + 2
            h = mix_hash(
                np.arange(n),
                np.uint64(zlib.crc32(fault.component.encode())),
                np.uint64(int(fault.start_s * 1000) % 2**63),
            )
            u1 = (h >> np.uint64(11)).astype(np.float64) / 2**53
            u2 = (mix_hash(h, np.uint64(3)) >> np.uint64(11)).astype(np.float64) / 2**53
            length = period * (0.5 + u1)
            ons = np.minimum(on * (0.6 + 0.8 * u2), length)
            starts = fault.start_s + np.r_[0.0, np.cumsum(length)[:-1]]
            got = self._cycle_cache[key] = (starts, ons)
        return got

    def scale(self, fault: Fault, t_s: np.ndarray) -> np.ndarray:
        """Magnitude factor over time: 1, or a linear ramp over ``ramp_s`` for drift."""
        if fault.profile == "ramp":
            return np.clip((t_s - fault.start_s) / max(fault.ramp_s, 1e-9), 0.0, 1.0)
        return np.ones_like(t_s)

    def effects(
        self,
        faults: list[Fault],
        rows: RowSet,
        rng: np.random.Generator,
        masks: list[np.ndarray] | None = None,
    ) -> Effects | None:
        """The combined effect of ``faults`` on a batch; None when no row is touched.
        ``masks`` may give each fault's :meth:`affected` rows when the caller caches them."""
        n = len(rows)
        eff: Effects | None = None
        # per row, how many faults fail it outright; per fault, its rows and its own share
        kills = np.zeros(n, np.int32)
        touched: list[tuple[int, np.ndarray, np.ndarray]] = []
        for i, f in enumerate(faults):
            idx = np.flatnonzero(self.affected(f, rows) if masks is None else masks[i])
            if idx.size == 0:
                continue
            idx = idx[self.on_now(f, rows.t_s[idx])]
            if idx.size == 0:
                continue
            eff = eff or Effects.none(n)
            spec = f.spec
            sym = spec.symptom
            own = np.zeros(idx.size, bool)
            if sym in ("unreachable", "flapping"):
                eff.status[idx] = spec.status
                own[:] = True
            elif sym == "loss":
                # corruption drops packets both ways: the request or, past the link, the reply
                p = 1.0 - math.sqrt(1.0 - f.eff("loss_rate"))
                eff.req_loss_p[idx] = 1.0 - (1.0 - eff.req_loss_p[idx]) * (1.0 - p)
                eff.rep_loss_p[idx] = 1.0 - (1.0 - eff.rep_loss_p[idx]) * (1.0 - p)
            elif sym == "latency":
                extra = f.eff("extra_ns") * self.scale(f, rows.t_s[idx])
                eff.extra_ns[idx] += extra * rng.lognormal(0.0, 0.15, idx.size)
            else:
                _, c, _ = self._resolve(f)
                dst = idx[self.eps.container[rows.dst_ep[idx]] == c]
                src = idx[self.eps.container[rows.src_ep[idx]] == c]
                if sym == "agent_down":
                    eff.status[dst] = ProbeStatus.LOST
                    eff.emit[src] = False
                    own[np.isin(idx, dst) | np.isin(idx, src)] = True
                else:  # agent_slow: its prober and responder lag; late replies time out
                    k = f.eff("extra_ns")
                    eff.prober_extra_ns[src] += k * self.scale(f, rows.t_s[src])
                    eff.responder_extra_ns[dst] += k * self.scale(f, rows.t_s[dst])
                    p = f.eff("loss_rate")  # the request arrived; the answer came too late
                    eff.rep_loss_p[dst] = 1.0 - (1.0 - eff.rep_loss_p[dst]) * (1.0 - p)
            kills[idx[own]] += 1
            touched.append((f.fault_id, idx, own))
        for fid, idx, own in touched:
            self.rows_on[fid] = self.rows_on.get(fid, 0) + idx.size
            hidden = int((kills[idx] - own > 0).sum())
            self.rows_hidden[fid] = self.rows_hidden.get(fid, 0) + hidden
        return eff
