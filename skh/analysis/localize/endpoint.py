"""Endpoint evidence (Algorithm 1, step 4): what a host's report, an RNIC's flow tables and the
probes' own pattern say about one RNIC or host — read with its gaps.

A host report may lack a flag or carry an old reading (:meth:`HostReport.known`). A flag that
is set is evidence whatever its age; a flag that is clear says "not this" only when it was read
after the failure began. What no flag decides is decided by the probes where they can
(a failure in one direction only is a changed GID; delay on several RNICs of one host is the
host board), and otherwise reported as the types still open, each as likely as the others, so
the verdict says how sure it is and the next round can ask again.

Flow tables are read the same way: OVS keeps rules for idle peers whose offloaded flows it
evicted (``max-idle``), and a dump can race with the revalidator. So a missing rule counts only
when it carries a failing pair's traffic, and a missing or stale one only when a second dump
still shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from skh.analysis.localize.classify import (
    classify_flow_diff,
    classify_host_report,
    classify_rnic_report,
)
from skh.analysis.localize.data import REPORT_FLAGS, FlowDiff, HostReport, Layer, Pair
from skh.analysis.localize.underlay import link_name
from skh.failures import FailureType, type_class

__all__ = [
    "Finding",
    "spread",
    "report_finding",
    "dead_edge_finding",
    "host_board_finding",
    "host_board_state",
    "flow_finding",
    "relevant_diff",
    "persisting",
    "one_way_in",
]

F = FailureType

#: host-board faults: every RNIC of the host slows; the report's flag for each
_HOST_BOARD = {
    F.PCIE_NIC_ERROR: "pcie_errors",
    F.GPUDIRECT_RDMA_ERROR: "gpudirect_broken",
    F.HUGEPAGE_MISCONFIG: "hugepage_mismatch",
}
#: OVS actions of a flow the vswitch encapsulates in software: the container's traffic is not
#: RDMA (the simulator's vocabulary for a VF that fell back to TCP/UDP)
_SOFTWARE_ENCAP = "encap_sw"


@dataclass(frozen=True, slots=True)
class Finding:
    """What the endpoint side says: a culprit, its type and how sure the evidence is."""

    layer: Layer
    component: str
    kind: str
    type: FailureType
    evidence: Mapping[str, object] = field(default_factory=dict)
    #: the types still open, most likely first, with probabilities; empty: ``type``, certain
    types: tuple[tuple[FailureType, float], ...] = ()
    #: other components that fit as well: the finding is uncertain
    candidates: tuple[str, ...] = ()


def spread(types: Iterable[FailureType]) -> tuple[tuple[FailureType, float], ...]:
    """Each open type equally likely, the most likely class first (its members by number)."""
    ts = sorted(set(types))
    if len(ts) <= 1:
        return ()
    p = 1.0 / len(ts)
    mass: dict[str, float] = {}
    for t in ts:
        mass[type_class(t)] = mass.get(type_class(t), 0.0) + p
    ts.sort(key=lambda t: (-mass[type_class(t)], int(t)))
    return tuple((t, p) for t in ts)


def report_finding(
    rep: HostReport | None,
    host: str,
    rail: int,
    *,
    tor: str,
    containers: Mapping[str, str],
    flapping: bool,
    max_age_s: float | None = None,
) -> Finding | None:
    """What the report alone says is wrong with the RNIC on ``rail`` (flags that are set, read
    at most ``max_age_s`` ago: a fault a reading from before the failure began shows did not
    fail these pairs then, so it is not what fails them now). ``containers`` maps the failing
    pairs' local containers on this RNIC to ``job/container``."""
    if rep is None:
        return None
    if max_age_s is not None:
        rep = _fresh_only(rep, max_age_s)
    rnic = f"{host}:rnic{rail}"
    if rep.known("rdma_fallback"):
        for c, name in sorted(containers.items()):
            if c in rep.rdma_fallback:
                return Finding(
                    "overlay",
                    name,
                    "container",
                    F.NOT_USING_RDMA,
                    {"host_report": "rdma_fallback"},
                )
    if rep.known("peer_down") and rail in rep.peer_down:
        ft = F.SWITCH_PORT_FLAPPING if flapping else F.SWITCH_PORT_DOWN
        return Finding("underlay", link_name(rnic, tor), "link", ft, {"host_report": "peer_down"})
    ft = classify_rnic_report(rep, rail)
    if ft is not None:
        if ft == F.RNIC_PORT_DOWN and flapping:
            ft = F.RNIC_PORT_FLAPPING  # down now, up a moment ago: the loss comes and goes
        return Finding("rnic", rnic, "rnic", ft, {"host_report": rep.rnic_state.get(rail)})
    ft = classify_host_report(rep, rail)
    if ft is not None:
        if ft in _HOST_BOARD:
            # hugepages, PCIe and GPUDirect are the host board's: every RNIC of the host suffers
            return Finding("host", host, "host", ft, {"host_report": ft.name.lower()})
        return Finding("rnic", rnic, "rnic", ft, {"host_report": ft.name.lower()})
    if rep.known("offload_churn") and rail in rep.offload_churn:
        return Finding(
            "rnic", rnic, "rnic", F.REPETITIVE_FLOW_OFFLOADING, {"host_report": "offload_churn"}
        )
    return None


def _fresh_only(rep: HostReport, max_age_s: float) -> HostReport:
    """``rep`` with the flags read longer than ``max_age_s`` ago dropped (unknown)."""
    old = {f for f, a in rep.age_s.items() if a > max_age_s}
    if not old:
        return rep
    read = (set(REPORT_FLAGS) if rep.read is None else set(rep.read)) - old
    return replace(rep, read=frozenset(read))


def dead_edge_finding(
    rep: HostReport | None,
    host: str,
    rail: int,
    *,
    tor: str,
    flapping: bool,
    max_age_s: float,
    downs: frozenset[str] = frozenset(),
) -> Finding:
    """An RNIC or its access link no probe crosses any more, when the report names nothing
    wrong: what its fresh, clear flags rule out decides between the switch port (no light
    from the switch), the RNIC's own port and an RNIC that died with its port up (hardware,
    bond). A flapping port comes back, so it is neither dead RNIC, and a port read up now may
    be one between two downs: which end an earlier reading in the failure saw down
    (``downs``: "rnic", "peer") decides, else both ports stay open."""
    rnic, link = f"{host}:rnic{rail}", link_name(f"{host}:rnic{rail}", tor)
    fresh = rep is not None
    peer_clear = fresh and rep.known("peer_down", max_age_s=max_age_s)  # type: ignore[union-attr]
    port_clear = fresh and rep.known("rnic_state", max_age_s=max_age_s)  # type: ignore[union-attr]
    bond_clear = fresh and rep.known("bond_degraded", max_age_s=max_age_s)  # type: ignore[union-attr]
    open_: list[FailureType] = []
    if flapping:
        if "rnic" in downs or not downs:
            open_.append(F.RNIC_PORT_FLAPPING)
        if "peer" in downs or not downs:
            open_.append(F.SWITCH_PORT_FLAPPING)
        switch = F.SWITCH_PORT_FLAPPING in open_
    else:
        open_.append(F.RNIC_HW_FAILURE)
        if not bond_clear:
            open_.append(F.BOND_ERROR)
        if not port_clear:
            open_.append(F.RNIC_PORT_DOWN)
        switch = not peer_clear
        if switch:
            open_.append(F.SWITCH_PORT_DOWN)
    types = spread(open_)
    first = types[0][0] if types else open_[0]
    evidence = {
        "host_report": "nothing wrong" if rep is not None else "no report",
        "unknown_flags": [
            f for f, ok in (("peer_down", peer_clear), ("rnic_state", port_clear)) if not ok
        ],
    }
    on_link = first in (F.SWITCH_PORT_DOWN, F.SWITCH_PORT_FLAPPING)
    cands = ((rnic,) if on_link else (link,)) if switch else ()
    if on_link:
        return Finding("underlay", link, "link", first, evidence, types, cands)
    return Finding("rnic", rnic, "rnic", first, evidence, types, cands)


def host_board_state(rep: HostReport | None, *, max_age_s: float) -> str:
    """What a host's report says of its board: ``"set"`` (a board flag read set), ``"clear"``
    (every board flag read within ``max_age_s`` and clear: the board is ruled out) or
    ``"open"`` (some flag unknown or older)."""
    if rep is None:
        return "open"
    if rep.known("hugepage_mismatch") and rep.hugepage_mismatch:
        return "set"
    if any(rep.known(f) and getattr(rep, f) for f in ("pcie_errors", "gpudirect_broken")):
        return "set"
    fresh = all(rep.known(f, max_age_s=max_age_s) for f in _HOST_BOARD.values())
    return "clear" if fresh else "open"


def host_board_finding(rep: HostReport | None, host: str, *, max_age_s: float) -> Finding:
    """Delay on several RNICs of one host and no flag set: the host board, whichever of its
    faults the fresh clear flags leave open (all three are one type class)."""
    open_ = [
        t
        for t, flag in _HOST_BOARD.items()
        if rep is None or not rep.known(flag, max_age_s=max_age_s)
    ]
    types = spread(open_ or list(_HOST_BOARD))
    first = types[0][0] if types else (open_ or list(_HOST_BOARD))[0]
    return Finding("host", host, "host", first, {"pattern": "delay on several RNICs"}, types)


def relevant_diff(diff: FlowDiff, keys: set[str]) -> FlowDiff:
    """The diff with only the missing rules that carry the failing pairs' traffic (matching one
    of their destinations, ``keys``): OVS keeps rules for idle peers whose offloaded flows it
    evicted, so a missing rule of a pair that is not failing is normal. When no rule names a
    destination the source cannot tell, and every missing rule counts."""
    named = [r for r in diff.missing if r.match_dict.get("nw_dst")]
    if not named:
        return diff
    return replace(
        diff, missing=tuple(r for r in diff.missing if r.match_dict.get("nw_dst") in keys)
    )


def persisting(first: FlowDiff, second: FlowDiff | None) -> FlowDiff:
    """``first`` with only the missing and stale rules a second dump shows again (a dump that
    raced with the revalidator shows a rule changed or not yet installed once)."""
    if not (first.stale or first.missing):
        return first

    def again(rules: Iterable) -> set:
        return {(r.match, r.actions) for r in rules}

    st = again(second.stale) if second is not None else set()
    mi = again(second.missing) if second is not None else set()
    return replace(
        first,
        stale=tuple(r for r in first.stale if (r.match, r.actions) in st),
        missing=tuple(r for r in first.missing if (r.match, r.actions) in mi),
    )


def flow_finding(
    diff: FlowDiff,
    host: str,
    rail: int,
    *,
    churn: bool | None,
    software: Mapping[str, str],
) -> Finding | None:
    """A relevant, persisting diff of the RNIC's tables as a finding. ``churn`` is the report's
    offload-churn flag (None: unknown); ``software`` maps a representor (``in_port``) to the
    ``job/container`` it belongs to, for rules the vswitch encapsulates in software."""
    sw = [r for r in diff.missing if any(a.startswith(_SOFTWARE_ENCAP) for a in r.actions)]
    for r in sw:
        name = software.get(r.match_dict.get("in_port", ""))
        if name is not None:
            return Finding(
                "overlay",
                name,
                "container",
                F.NOT_USING_RDMA,
                {"flow_tables": "software encap", "rule": ",".join(r.actions)},
            )
    if not (diff or churn):
        return None
    rnic = f"{host}:rnic{rail}"
    ft = classify_flow_diff(diff, churn=bool(churn))
    types: tuple[tuple[FailureType, float], ...] = ()
    if churn is None and ft == F.OFFLOADING_FAILURE and not diff.not_in_hw:
        # the tables look the same while a repetitive offload has its flows evicted: only the
        # offload counters (the churn flag, unknown here) tell it from a failure to offload
        types = spread([F.OFFLOADING_FAILURE, F.REPETITIVE_FLOW_OFFLOADING])
    return Finding("rnic", rnic, "rnic", ft, {"churn": bool(churn)}, types)


def one_way_in(
    eps: set[int], failing: Iterable[Pair], sends_ok: bool, receives_ok: bool = False
) -> bool:
    """The endpoints ``eps`` fail only as destinations — every failing pair touching them ends
    at them — while pairs they send on are healthy (``sends_ok``) and none towards them is
    (``receives_ok`` false): a stale GID (peers address a gone one). A peer that still reaches
    them rules that out: every peer's traffic to a gone GID fails, while a path fault between
    two hosts (a blackhole whose other side has not reported yet) fails some peers only."""
    touching = [p for p in failing if p[0] in eps or p[1] in eps]
    return (
        bool(touching) and sends_ok and not receives_ok and not any(p[0] in eps for p in touching)
    )
