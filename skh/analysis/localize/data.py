"""Plain data of localization: what it takes (traces, overlay chains, flow tables, host reports)
and what it gives (verdicts). No behaviour beyond validation lives here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from skh.failures import FailureType, class_id, type_class

__all__ = [
    "Pair",
    "Symptom",
    "Layer",
    "Severity",
    "SYMPTOM_RANK",
    "SEVERITY_OF",
    "Trace",
    "OverlayTables",
    "OverlayWalk",
    "FlowRule",
    "FlowDiff",
    "HostReport",
    "REPORT_FLAGS",
    "Verdict",
]

#: (source endpoint id, destination endpoint id), as in ``PROBE_DTYPE``
Pair = tuple[int, int]

#: what the failing pairs show; detection's kinds "latency-short"/"latency-long" are both latency
Symptom = Literal["unreachable", "loss", "latency"]

#: where a verdict puts the fault. "agent" is the monitor's own endpoint (dead or late agent),
#: "unexplained" is what no layer explains (reported with its evidence, never forced)
Layer = Literal["overlay", "underlay", "rnic", "host", "agent", "unexplained"]


class Severity(IntEnum):
    WARNING = 1  # latency: training slows
    MAJOR = 2  # loss: retransmissions, a collective may stall
    CRITICAL = 3  # unreachable: a collective times out after ~4 s and the job fails


#: how bad a symptom is: a pair's worst symptom wins, a verdict takes its pairs' worst
SYMPTOM_RANK: dict[str, int] = {"latency": 0, "loss": 1, "unreachable": 2}
SEVERITY_OF: dict[str, Severity] = {
    "latency": Severity.WARNING,
    "loss": Severity.MAJOR,
    "unreachable": Severity.CRITICAL,
}


@dataclass(frozen=True, slots=True)
class Trace:
    """One flow-pinned underlay trace of a pair, as fabric node names.

    ``nodes`` starts at the source RNIC (``host:rnicN``) and lists each answering hop; ``None``
    marks a hop that stayed silent. ``reached`` says the destination RNIC answered; a trace that
    did not reach it ends at its *frontier*, the last node that answered.
    """

    pair: Pair
    nodes: tuple[str | None, ...]
    reached: bool
    #: per node (the source's entry is 0): share of the hop's probes lost, as mtr reports it;
    #: empty when the tracer cannot tell
    hop_loss: tuple[float, ...] = ()
    #: per node: round-trip time to the hop in ns (-1 unknown); empty when not measured
    hop_rtt_ns: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes or self.nodes[0] is None:
            raise ValueError(
                f"The 'nodes' of Trace must start with the source node. Got {self.nodes!r} instead."
            )
        for name in ("hop_loss", "hop_rtt_ns"):
            v = getattr(self, name)
            if v and len(v) != len(self.nodes):
                raise ValueError(
                    f"The '{name}' of Trace must align with its nodes ({len(self.nodes)}). "
                    f"Got {len(v)} values."
                )


@dataclass(frozen=True, slots=True)
class OverlayTables:
    """The overlay forwarding state one host reports, as a graph.

    ``next_hop[node][key]`` is the node a packet for ``key`` (the destination endpoint's overlay
    address) goes to after ``node``; key ``"*"`` is a node's default. Node names are
    ``host/local`` (``h3/vf:c1.0``, ``h3/rep:c1.0``, ``h3/ovs``, ``h3/vtep0``), so a chain can
    cross hosts. ``down`` lists nodes that exist but do not forward (representor oper-down,
    container gone).
    """

    host: str
    next_hop: Mapping[str, Mapping[str, str]]
    down: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class OverlayWalk:
    pair: Pair
    status: Literal["ok", "break", "loop", "down"]
    chain: tuple[str, ...]
    #: the hop to blame: where the next hop is missing, the node that is down, or where the
    #: loop closes
    hop: str = ""


@dataclass(frozen=True, slots=True)
class FlowRule:
    """One flow-table entry, normalised so an OVS rule and an RNIC-offloaded one compare.

    ``match`` holds canonical field names (``in_port``, ``dl_src``, ``dl_dst``, ``dl_type``,
    ``nw_src``, ``nw_dst``, ``nw_proto``, ``tp_src``, ``tp_dst``, ``tun_id``, ``tun_src``,
    ``tun_dst``) with string values; ``actions`` is a canonical action tuple such as
    ``("output:vx0",)`` or ``("drop",)``.
    """

    match: tuple[tuple[str, str], ...]
    actions: tuple[str, ...]
    priority: int = 0
    table: int = 0
    packets: int = 0
    #: seconds since the entry was last used; -1 when never or unknown
    used_s: float = -1.0
    #: for offloaded tables: the hardware holds it (tc "in_hw"); None when the source cannot say
    in_hw: bool | None = None

    @property
    def match_dict(self) -> dict[str, str]:
        return dict(self.match)


@dataclass(frozen=True, slots=True)
class FlowDiff:
    """What disagrees between what OVS wants offloaded and what the RNIC holds."""

    missing: tuple[FlowRule, ...] = ()  # OVS has it, the RNIC does not (flows on the slow path)
    stale: tuple[FlowRule, ...] = ()  # the RNIC has it, OVS no longer does, or with other actions
    duplicated: tuple[FlowRule, ...] = ()  # the same match offloaded more than once
    misordered: tuple[tuple[FlowRule, FlowRule], ...] = ()  # (should win, wins on the RNIC)
    not_in_hw: tuple[FlowRule, ...] = ()  # the kernel says the rule never reached the hardware

    def __bool__(self) -> bool:
        return bool(
            self.missing or self.stale or self.duplicated or self.misordered or self.not_in_hw
        )

    def summary(self) -> dict[str, int]:
        return {
            "missing": len(self.missing),
            "stale": len(self.stale),
            "duplicated": len(self.duplicated),
            "misordered": len(self.misordered),
            "not_in_hw": len(self.not_in_hw),
        }


#: every flag a :class:`HostReport` can carry (its field names)
REPORT_FLAGS: tuple[str, ...] = (
    "rnic_state",
    "peer_down",
    "port_down_count",
    "rx_errors",
    "gid_changed",
    "bond_degraded",
    "pcie_errors",
    "gpudirect_broken",
    "rdma_fallback",
    "hugepage_mismatch",
    "offload_churn",
    "agents_dead",
    "agents_late",
    "containers_dead",
)


@dataclass(frozen=True, slots=True)
class HostReport:
    """What a host's underlay agent reports about its RNICs and the host itself.

    Keys of the per-rail maps are rails. A flag the source did not read is *unknown*, never
    "nothing wrong": ``read`` names the flags it read (None: every flag) and ``age_s`` how old
    each one's value is (a collector that polls on a period answers with its last reading;
    missing: read just now). Ask with :meth:`known`.
    """

    host: str
    #: rail → "up" | "down" | "flapping" | "hw_error" | "fw_unresponsive"
    rnic_state: Mapping[int, str] = field(default_factory=dict)
    #: rails whose NIC sees no light from the switch (physical state "polling"): the switch
    #: port at the other end of the access link is down, not the RNIC's
    peer_down: frozenset[int] = frozenset()
    #: rail → carrier-down transitions the NIC driver counted since boot (Linux
    #: ``IFLA_CARRIER_DOWN_COUNT``): two readings tell a port that went down once from one that
    #: flaps
    port_down_count: Mapping[int, int] = field(default_factory=dict)
    #: rail → frames the RNIC received corrupted since boot (symbol errors, receive errors, bad
    #: FCS as its driver counts them): a link that corrupts frames makes the *receiving* end's
    #: count grow, so two readings tell which end of a lossy pair takes the corrupted frames
    rx_errors: Mapping[int, int] = field(default_factory=dict)
    #: rails whose RoCE GID table changed since the endpoint registered
    gid_changed: frozenset[int] = frozenset()
    bond_degraded: frozenset[int] = frozenset()
    #: PCIe AER / link errors between RNIC and the host bridge
    pcie_errors: frozenset[int] = frozenset()
    gpudirect_broken: frozenset[int] = frozenset()
    #: containers whose VF traffic leaves as plain TCP/UDP instead of RDMA
    rdma_fallback: frozenset[str] = frozenset()
    hugepage_mismatch: bool = False
    #: rails whose offload counters show the same flows evicted and re-installed over and over
    offload_churn: frozenset[int] = frozenset()
    #: containers (names) whose agent misses heartbeats / whose prober delay grows
    agents_dead: frozenset[str] = frozenset()
    agents_late: frozenset[str] = frozenset()
    #: containers whose runtime reports them exited
    containers_dead: frozenset[str] = frozenset()
    #: the flags the source read (None: all of them)
    read: frozenset[str] | None = None
    #: flag → seconds since its value was read (flags left out: read just now)
    age_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = sorted(set(self.read or ()) - set(REPORT_FLAGS)) + sorted(
            set(self.age_s) - set(REPORT_FLAGS)
        )
        if bad:
            raise ValueError(
                f"HostReport of {self.host}: unknown flag(s) {bad}; flags are {REPORT_FLAGS}."
            )

    def known(self, flag: str, *, max_age_s: float | None = None) -> bool:
        """The source read ``flag`` (and, with ``max_age_s``, no longer than that ago: a
        reading older than a failure says nothing about whether the failure is there)."""
        if self.read is not None and flag not in self.read:
            return False
        return max_age_s is None or float(self.age_s.get(flag, 0.0)) <= max_age_s


#: the probability a verdict's type class must reach not to be asked again (``type_pending``)
TYPE_SURE = 0.75


@dataclass(frozen=True, slots=True)
class Verdict:
    """One localized fault: the alert body.

    ``component`` names the culprit in the model's words: a link ``a|b`` (sorted fabric names),
    a switch, an RNIC ``host:rnicN``, an overlay hop ``host/local``, a host, or an endpoint's
    container ``job/container``. ``evidence`` carries what convinced the localizer (the path,
    the votes, the chain, the flow-table diff), JSON-friendly.
    """

    job: str
    pairs: tuple[Pair, ...]
    layer: Layer
    component: str
    component_kind: str
    failure_type: FailureType
    symptom: Symptom
    severity: Severity
    first_seen_ns: int
    detected_at_ns: int
    evidence: Mapping[str, object] = field(default_factory=dict)
    #: other components that explain the pairs equally well (a tie, or an uncovered link)
    candidates: tuple[str, ...] = ()
    #: the failure types that fit the evidence, most likely first, each with its probability
    #: (``failure_type`` is the first); empty: ``failure_type`` alone, with certainty
    type_candidates: tuple[tuple[FailureType, float], ...] = ()
    #: the class the alert was opened with (:func:`skh.failures.class_id`), when an alert
    #: refined this verdict's type; -1: the failure type's own class
    alert_class: int = -1

    @property
    def type_confidence(self) -> float:
        """The probability of ``failure_type`` given the evidence (1 when it decides)."""
        return float(self.type_candidates[0][1]) if self.type_candidates else 1.0

    @property
    def type_pending(self) -> bool:
        """No class of type is likely enough (:data:`TYPE_SURE`): the type rests on a guess,
        ask again next round (a missing host-report flag may be there then)."""
        if not self.type_candidates:
            return False
        by_class: dict[str, float] = {}
        for t, p in self.type_candidates:
            by_class[type_class(t)] = by_class.get(type_class(t), 0.0) + float(p)
        return max(by_class.values()) < TYPE_SURE

    @property
    def key(self) -> tuple[str, str, int]:
        """Identity of the fault while it lasts: layer, component and the type's class, so a
        type refined within its class (or within the candidates it opened with, see
        :class:`~skh.analysis.localize.AlertTracker`) stays one alert."""
        cls = self.alert_class if self.alert_class >= 0 else class_id(self.failure_type)
        return (self.layer, self.component, cls)

    @property
    def certain(self) -> bool:
        return not self.candidates and self.layer != "unexplained"

    def as_dict(self) -> dict[str, object]:
        """Plain types only (lists, str, int), ready for msgpack or JSON on the alert bus."""
        return {
            "job": self.job,
            "pairs": [list(p) for p in self.pairs],
            "layer": self.layer,
            "component": self.component,
            "component_kind": self.component_kind,
            "failure_type": self.failure_type.name.lower(),
            "failure_type_id": int(self.failure_type),
            "symptom": self.symptom,
            "severity": self.severity.name.lower(),
            "first_seen_ns": self.first_seen_ns,
            "detected_at_ns": self.detected_at_ns,
            "evidence": _plain(self.evidence),
            "candidates": list(self.candidates),
            "type_class": type_class(self.failure_type).lower(),
            "type_confidence": round(self.type_confidence, 3),
            "type_candidates": [
                [t.name.lower(), round(float(p), 3)] for t, p in self.type_candidates
            ],
        }


def _plain(x: object) -> object:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_plain(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)
