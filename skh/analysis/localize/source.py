"""What the localizer asks, and of whom: a :class:`StateSource` answers on a real cluster (agents,
through the controller), the namespace testbed or the simulator (:mod:`skh.sim.answers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from skh.analysis.localize.data import FlowDiff, FlowRule, HostReport, OverlayTables, Pair, Trace
from skh.analysis.localize.rnic import diff_flow_tables, diff_megaflows

__all__ = ["FlowTables", "StateSource"]


@dataclass(frozen=True, slots=True)
class FlowTables:
    """One RNIC's flow tables: what OVS wants offloaded and what the RNIC holds.

    ``megaflow`` says ``offloaded`` is a datapath flow cache (OVS's own, the testbed's stand-in
    for the RNIC) rather than a rule-for-rule copy: it is then checked rule by rule against the
    OpenFlow rules it falls under (:func:`diff_megaflows`).
    """

    expected: tuple[FlowRule, ...]
    offloaded: tuple[FlowRule, ...]
    megaflow: bool = False

    def diff(self) -> FlowDiff:
        if self.megaflow:
            return diff_megaflows(self.expected, self.offloaded)
        return diff_flow_tables(self.expected, self.offloaded)


class StateSource(Protocol):
    """What the localizer asks agents (through the controller) or the simulator."""

    def traceroute(self, pair: Pair, path_id: int) -> Trace | None:
        """A flow-pinned trace of the pair's underlay path: the path the probes of ``path_id``
        (their flow label / outer UDP source port) take."""

    def overlay_tables(self, host: str) -> OverlayTables | None:
        """The host's overlay forwarding state (None: the host cannot tell)."""

    def flow_tables(self, host: str, rail: int) -> FlowTables | None:
        """The RNIC's offloaded table next to OVS's (costly: called last and rate-limited)."""

    def host_report(self, host: str) -> HostReport | None:
        """The host agent's view of its RNICs, containers and agents."""
