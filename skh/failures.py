"""The failure types: one enumeration for the simulator that injects them, the localizer that
names them and the evaluation that scores them.

Numbers 1-19 are the paper's Table 1 in its order (names, components and symptoms from
``shared/notes/paper.md`` §7); 20-23 are what Table 1 leaves out: the monitor's own endpoints and
overlay forwarding-state faults. 0 is what no evidence explains.

==  ============================  ===================  ========  =========  =======================
#   type                          Table 1 component    layer     component  verdict layer
==  ============================  ===================  ========  =========  =======================
1   CRC_ERROR                     inter-host network   underlay  link       underlay
2   SWITCH_PORT_DOWN              inter-host network   underlay  link       underlay
3   SWITCH_PORT_FLAPPING          inter-host network   underlay  link       underlay
4   SWITCH_OFFLINE                inter-host network   underlay  switch     underlay
5   RNIC_HW_FAILURE               RNIC                 rnic      rnic       rnic
6   RNIC_FIRMWARE_NOT_RESPONDING  RNIC                 rnic      rnic       rnic
7   RNIC_PORT_DOWN                RNIC                 rnic      rnic       rnic
8   RNIC_PORT_FLAPPING            RNIC                 rnic      rnic       rnic
9   OFFLOADING_FAILURE            RNIC                 rnic      rnic       rnic
10  BOND_ERROR                    kernel / RNIC        rnic      rnic       rnic
11  RNIC_GID_CHANGE               kernel               rnic      rnic       rnic
12  PCIE_NIC_ERROR                host board           host      host       host
13  GPUDIRECT_RDMA_ERROR          host board           host      host       host
14  NOT_USING_RDMA                virtual switch       overlay   container  overlay
15  REPETITIVE_FLOW_OFFLOADING    virtual switch       overlay   rnic       rnic (its eswitch)
16  SUBOPTIMAL_FLOW_OFFLOADING    virtual switch       overlay   rnic       rnic (its eswitch)
17  CONTAINER_CRASH               container runtime    overlay   container  overlay
18  HUGEPAGE_MISCONFIG            configuration        config    host       host
19  CC_ISSUE                      configuration        config    switch     underlay
20  AGENT_CRASH                   (ours) skh agent     agent     container  agent
21  LATE_AGENT                    (ours) skh agent     agent     container  agent
22  OVERLAY_LOOP                  (ours) vswitch/VTEP  overlay   rnic       overlay
23  OVERLAY_BLACKHOLE             (ours) vswitch/VTEP  overlay   rnic       overlay
==  ============================  ===================  ========  =========  =======================

*layer* is our mapping of Table 1 onto the monitor's layers (paper.md §7; ``config`` keeps the
paper's "configuration" rows apart); the evaluation reports per layer by it. *component* is the
kind of thing a right verdict names (a link ``a|b``, a switch, an RNIC ``host:rnicN``, a host, a
container); a vswitch hop resolves to the RNIC whose eswitch holds it where the state source can
say so. *verdict layer* is the :class:`~skh.analysis.localize.Verdict` ``layer`` the localizer
gives a right verdict (it names where the evidence was found, which is not always Table 1's
group: an offloading fault shows in the RNIC's tables, a switch without congestion control in
the fabric).

22 is a forwarding loop anywhere in the overlay: a vswitch rule that sends packets back to the
representor (the simulator's model) or two hosts' VTEP routes pointing at each other (the
namespace testbed's ``overlay_loop``). 23 is a next hop missing from the overlay (a route, a
neighbour or an FDB entry gone: the testbed's ``fdb_blackhole``); the simulator does not inject it
yet.

:data:`TYPE_CLASSES` groups the types that nothing the system reads can tell apart; the type score
counts a verdict right when it names a type of the true type's class (:func:`type_class`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

__all__ = [
    "FailureType",
    "FailureInfo",
    "FAILURES",
    "FailureLayer",
    "ComponentKind",
    "TypeClass",
    "TYPE_CLASSES",
    "type_class",
    "class_id",
    "class_members",
    "BECOMES",
]

#: Table 1's rows mapped onto the monitor's layers (plus ``config`` and the monitor's ``agent``)
FailureLayer = Literal["underlay", "rnic", "host", "overlay", "config", "agent"]
#: what a fault sits on, and what a right verdict names
ComponentKind = Literal["link", "switch", "rnic", "host", "container"]
_VerdictLayer = Literal["overlay", "underlay", "rnic", "host", "agent"]


class FailureType(IntEnum):
    """Table 1 of the paper (1-19, in its order), ours beyond it (20-23), and 0 for unexplained."""

    UNKNOWN = 0
    CRC_ERROR = 1
    SWITCH_PORT_DOWN = 2
    SWITCH_PORT_FLAPPING = 3
    SWITCH_OFFLINE = 4
    RNIC_HW_FAILURE = 5
    RNIC_FIRMWARE_NOT_RESPONDING = 6
    RNIC_PORT_DOWN = 7
    RNIC_PORT_FLAPPING = 8
    OFFLOADING_FAILURE = 9
    BOND_ERROR = 10
    RNIC_GID_CHANGE = 11
    PCIE_NIC_ERROR = 12
    GPUDIRECT_RDMA_ERROR = 13
    NOT_USING_RDMA = 14
    REPETITIVE_FLOW_OFFLOADING = 15
    SUBOPTIMAL_FLOW_OFFLOADING = 16
    CONTAINER_CRASH = 17
    HUGEPAGE_MISCONFIG = 18
    CC_ISSUE = 19
    AGENT_CRASH = 20
    LATE_AGENT = 21
    OVERLAY_LOOP = 22
    OVERLAY_BLACKHOLE = 23

    @property
    def in_paper(self) -> bool:
        """One of Table 1's 19."""
        return 1 <= self.value <= 19

    @property
    def info(self) -> FailureInfo:
        return FAILURES[self]


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """One row of the module's table."""

    type: FailureType
    title: str
    paper_component: str  # Table 1's component column ("" for ours)
    layer: FailureLayer
    component: ComponentKind
    verdict_layer: _VerdictLayer


def _rows() -> dict[FailureType, FailureInfo]:
    T = FailureType
    net, ul = "inter-host network", "underlay"
    # fmt: off
    rows = (
        # type                            title                           Table 1 component
        #                                 layer       component    verdict layer
        (T.CRC_ERROR,                     "CRC error",                    net,
                                          ul,         "link",      ul),
        (T.SWITCH_PORT_DOWN,              "switch port down",             net,
                                          ul,         "link",      ul),
        (T.SWITCH_PORT_FLAPPING,          "switch port flapping",         net,
                                          ul,         "link",      ul),
        (T.SWITCH_OFFLINE,                "switch offline",               net,
                                          ul,         "switch",    ul),
        (T.RNIC_HW_FAILURE,               "RNIC hardware failure",        "RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.RNIC_FIRMWARE_NOT_RESPONDING,  "RNIC firmware not responding", "RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.RNIC_PORT_DOWN,                "RNIC port down",               "RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.RNIC_PORT_FLAPPING,            "RNIC port flapping",           "RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.OFFLOADING_FAILURE,            "offloading failure",           "RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.BOND_ERROR,                    "bond error",                   "kernel / RNIC",
                                          "rnic",     "rnic",      "rnic"),
        (T.RNIC_GID_CHANGE,               "RNIC GID change",              "kernel",
                                          "rnic",     "rnic",      "rnic"),
        (T.PCIE_NIC_ERROR,                "PCIe-NIC error",               "host board",
                                          "host",     "host",      "host"),
        (T.GPUDIRECT_RDMA_ERROR,          "GPUDirect RDMA error",         "host board",
                                          "host",     "host",      "host"),
        (T.NOT_USING_RDMA,                "not using RDMA",               "virtual switch",
                                          "overlay",  "container", "overlay"),
        (T.REPETITIVE_FLOW_OFFLOADING,    "repetitive flow offloading",   "virtual switch",
                                          "overlay",  "rnic",      "rnic"),
        (T.SUBOPTIMAL_FLOW_OFFLOADING,    "suboptimal flow offloading",   "virtual switch",
                                          "overlay",  "rnic",      "rnic"),
        (T.CONTAINER_CRASH,               "container crash",              "container runtime",
                                          "overlay",  "container", "overlay"),
        (T.HUGEPAGE_MISCONFIG,            "hugepage misconfiguration",    "configuration",
                                          "config",   "host",      "host"),
        (T.CC_ISSUE,                      "congestion-control issue",     "configuration",
                                          "config",   "switch",    ul),
        (T.AGENT_CRASH,                   "agent crash",                  "",
                                          "agent",    "container", "agent"),
        (T.LATE_AGENT,                    "late agent",                   "",
                                          "agent",    "container", "agent"),
        (T.OVERLAY_LOOP,                  "overlay forwarding loop",      "",
                                          "overlay",  "rnic",      "overlay"),
        (T.OVERLAY_BLACKHOLE,             "overlay black hole",           "",
                                          "overlay",  "rnic",      "overlay"),
    )
    # fmt: on
    return {r[0]: FailureInfo(*r) for r in rows}


#: every type's row of the module table (all but UNKNOWN)
FAILURES: dict[FailureType, FailureInfo] = _rows()


@dataclass(frozen=True, slots=True)
class TypeClass:
    """Types that nothing the system reads can tell apart: one class for the type score."""

    name: str
    members: frozenset[FailureType]
    reason: str


#: The merged classes (every type not named here is a class of its own). A merge is justified
#: only by a missing signal: same footprint in probes, traces, overlay state and flow tables, and
#: the host-report flag that would split them has no collector (the real host agent,
#: ``skh/orchestrator/agent_underlay.py``, reads port state only: ``rnic_state`` up/down and
#: ``peer_down``). Each class names the reader that would split it again.
TYPE_CLASSES: tuple[TypeClass, ...] = (
    TypeClass(
        "HOST_BOARD_LATENCY",
        frozenset(
            {
                FailureType.PCIE_NIC_ERROR,
                FailureType.GPUDIRECT_RDMA_ERROR,
                FailureType.HUGEPAGE_MISCONFIG,
            }
        ),
        "Same footprint: extra latency on every RNIC of one host and nothing in traces, overlay "
        "state or flow tables; Table 1 gives all three the same symptom (high latency) and no "
        "magnitude, so the simulator's 30/10/20 us are no signal. Only host-side state splits "
        "them (PCIe AER counters and link width, the peer-memory module, the hugepage setting), "
        "which no collector reads.",
    ),
    TypeClass(
        "RNIC_DEAD_PORT_UP",
        frozenset({FailureType.RNIC_HW_FAILURE, FailureType.BOND_ERROR}),
        "Same footprint: every flow through the RNIC unreachable both ways, traces die at it, "
        "and (as modelled) its port still reads up, unlike RNIC_PORT_DOWN, whose port state the "
        "host agent reads. Only devlink health or the bonding driver's slave state splits them, "
        "which no collector reads.",
    ),
)

_CLASS_OF: dict[FailureType, str] = {t: c.name for c in TYPE_CLASSES for t in c.members}


def type_class(t: FailureType) -> str:
    """The class the type score compares: the merged class's name, or the type's own name."""
    return _CLASS_OF.get(FailureType(t), FailureType(t).name)


#: a type a fault first seen as the key may turn out to be, as it goes on: a port seen down
#: comes back and goes down again. An alert refined so keeps its id.
BECOMES: dict[FailureType, FailureType] = {
    FailureType.SWITCH_PORT_DOWN: FailureType.SWITCH_PORT_FLAPPING,
    FailureType.RNIC_PORT_DOWN: FailureType.RNIC_PORT_FLAPPING,
}

_MEMBERS: dict[FailureType, frozenset[FailureType]] = {
    t: c.members for c in TYPE_CLASSES for t in c.members
}


def class_members(t: FailureType) -> frozenset[FailureType]:
    """The types of ``t``'s class (``{t}`` for a type of its own)."""
    t = FailureType(t)
    return _MEMBERS.get(t, frozenset({t}))


def class_id(t: FailureType) -> int:
    """A stable number for ``t``'s class: its lowest member's number (the type's own number for
    a type of its own). Alert ids carry it, so an alert refined within its class keeps its id."""
    return min(int(m) for m in class_members(t))
