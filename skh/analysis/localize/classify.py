"""Failure-type classifier: evidence + symptom → one of the paper's 19 types (or ours beyond them).

A table of rules, first match wins. The evidence a localization step found decides first
(a flow-table diff, a host report, an overlay break); the symptom refines what is left
(unreachable / loss / latency). Each rule is one line so the mapping can be read and audited.
"""

from __future__ import annotations

from skh.analysis.localize.data import FlowDiff, HostReport, Symptom
from skh.failures import FailureType as F

__all__ = [
    "classify_underlay",
    "classify_rnic_report",
    "classify_host_report",
    "classify_flow_diff",
]

#: host-report RNIC states → type (the RNIC layer of Table 1)
_RNIC_STATE = {
    "down": F.RNIC_PORT_DOWN,
    "flapping": F.RNIC_PORT_FLAPPING,
    "hw_error": F.RNIC_HW_FAILURE,
    "fw_unresponsive": F.RNIC_FIRMWARE_NOT_RESPONDING,
}


def classify_underlay(
    kind: str, symptom: Symptom, *, flapping: bool = False, partial: bool = False
) -> F:
    """A link or switch of the fabric: ``kind`` is "link" or "node" (a switch)."""
    if symptom == "latency":
        # a queue without congestion control (ECN/PFC) on some switch port: only latency grows
        return F.CC_ISSUE
    if kind == "node":
        return (
            F.SWITCH_OFFLINE
            if symptom == "unreachable"
            else (F.SWITCH_PORT_FLAPPING if flapping else F.CRC_ERROR)
        )
    if flapping:
        return F.SWITCH_PORT_FLAPPING
    if symptom == "unreachable" and not partial:
        return F.SWITCH_PORT_DOWN
    return F.CRC_ERROR


def classify_rnic_report(report: HostReport | None, rail: int) -> F | None:
    """What the host says about its RNIC on ``rail`` (None: nothing wrong reported)."""
    if report is None or not report.known("rnic_state"):
        return None
    state = report.rnic_state.get(rail, "up")
    return _RNIC_STATE.get(state)


def classify_host_report(report: HostReport | None, rail: int) -> F | None:
    """Host- and kernel-side faults of Table 1 that no trace or flow table shows (flags that are
    set; a flag the report lacks names nothing)."""
    if report is None:
        return None
    for flag, ftype in (
        ("gid_changed", F.RNIC_GID_CHANGE),
        ("bond_degraded", F.BOND_ERROR),
        ("pcie_errors", F.PCIE_NIC_ERROR),
        ("gpudirect_broken", F.GPUDIRECT_RDMA_ERROR),
    ):
        if report.known(flag) and rail in getattr(report, flag):
            return ftype
    if report.known("hugepage_mismatch") and report.hugepage_mismatch:
        return F.HUGEPAGE_MISCONFIG
    return None


_TUNNEL_ACTIONS = ("tnl_push", "tnl_pop", "set_tunnel", "vxlan", "encap", "decap")


def classify_flow_diff(diff: FlowDiff, *, churn: bool = False) -> F:
    """A diff of offloaded vs OVS flow tables (empty only when ``churn`` is seen): rules out of
    order are suboptimal offloading; churn is repetitive offloading; only stale rules are
    firmware that stopped applying updates; tunnel rules missing are an offloading failure;
    other rules missing are offloaded flows invalidated (repetitive offloading)."""
    if diff.misordered or (diff.duplicated and not (diff.missing or diff.stale)):
        return F.SUBOPTIMAL_FLOW_OFFLOADING
    if churn:
        # the same rules evicted and re-installed over and over: between two evictions the
        # tables may even agree
        return F.REPETITIVE_FLOW_OFFLOADING
    if diff.stale and not (diff.missing or diff.not_in_hw):
        # the RNIC holds rules OVS replaced or removed and nothing is missing: its firmware no
        # longer applies updates (Table 1: firmware not responding), not an eviction
        return F.RNIC_FIRMWARE_NOT_RESPONDING
    tunnel = [
        r
        for r in (*diff.missing, *diff.not_in_hw)
        if any(a.startswith(_TUNNEL_ACTIONS) for a in r.actions)
    ]
    if diff.not_in_hw or (tunnel and len(tunnel) == len(diff.missing)):
        # encap/decap rules that never made it into the eswitch
        return F.OFFLOADING_FAILURE
    # offloaded flows invalidated (counters not refreshed, judged idle, evicted): the Fig. 18 case
    return F.REPETITIVE_FLOW_OFFLOADING
