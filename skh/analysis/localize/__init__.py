"""Localization: put each detected failure in the overlay, the underlay, the RNIC, the host or the
monitor's own agent (DESIGN §7; the paper's Algorithm 1, extended).

One round takes the suspects detection raised (failing pairs with the path ids that failed,
symptom, first-seen, unhealthy agents) and a :class:`StateSource` that answers what agents
answer on a real cluster (a flow-pinned traceroute, a host's overlay forwarding state, an
RNIC's offloaded vs OVS flow tables, a host's report). It asks only what it needs, in order:

1. **Overlay walk** of every failing pair (VF → representor → vswitch → VTEP → … → VF), and of
   the way back: a missing next hop is a break, a revisited hop a loop, a node that is down (a
   crashed container's VF) is named. The pairs a broken hop explains are done.
2. **Agents apart**: endpoints detection found unhealthy (missed heartbeats, refused probes,
   growing prober delay) and pairs whose probes were refused are the monitor's problem, not
   the network's; a dead agent whose VF is gone is a crashed container.
3. **Underlay vote** over the rest: flow-pinned traces of the failing paths and of healthy pairs
   near them (exoneration); culprits are taken greedily, each removing what it explains, so
   several faults (and, with step 1, both layers) come out one by one. A culprit at the edge
   (an RNIC or its access link) is resolved with the host's report, then the RNIC check,
   then the far endpoints, before a switch port is blamed; a tie is reported with candidates.
4. **Host and RNIC check** for pairs both layers leave unexplained, busiest endpoint first: the
   host reports, then the RNIC flow-table dump (rate-limited: it is costly on a real RNIC).
5. **Residual vote** for what is still left (a lossy or slow link that some flows cross
   unharmed, or pairs a delay-only culprit cannot explain), then **independent evidence**:
   an endpoint report naming a fault no verdict names yet (two faults on the same pairs).
   Outage pairs whose traces all get through an open outage again are that outage come back
   (the vote clears an element while it forwards). The rest is reported as unexplained with
   its evidence, never forced.

Answers are noisy, and each step reads them so (details in :mod:`.underlay` and
:mod:`.endpoint`): a silent traceroute hop is unknown, loss counts where it persists and only in
rounds without rate-limit signatures, hop round trips only when they behave like forwarding
delay; a host-report flag missing or read before the failure began is unknown, never healthy;
a flow-table rule counts when it carries a failing pair's traffic and a second dump agrees.
Open alerts come in as known culprits and are checked first; an outage whose traces cross the
culprit again has come back (a flapping port).

Verdicts carry the failure type (:class:`skh.failures.FailureType`: the paper's 19, plus overlay
black hole/loop and agent crash/late) with the types the evidence leaves open and their
probabilities (``type_candidates``, ``type_confidence``; ``type_pending`` asks for another
round), the evidence and the component candidates; :class:`AlertTracker` keeps one alert per
fault (keyed by its type class, so a refined type keeps its alert) and resolves it when it
clears.

Everything here is pure data in, data out: no sockets, no engine, no orchestrator.

The package, one job per module:

- :mod:`.localizer`: :class:`Localizer` and its steps
- :mod:`.suspects`: :class:`Suspect` (what detection raised) and :func:`failing_path_ids`
- :mod:`.source`: :class:`StateSource` (what the localizer asks) and :class:`FlowTables`
- :mod:`.overlay`: the overlay walk; :mod:`.underlay`: the trace vote; :mod:`.rnic`: flow-table
  diffs; :mod:`.endpoint`: what reports, tables and probe patterns say about an RNIC or host;
  :mod:`.classify`: evidence + symptom → failure type
- :mod:`.data`: the plain data in and out (traces, tables, host reports, verdicts)
- :mod:`.alerts`: verdicts merged per culprit and tracked as alerts while a fault lasts

Failure types are :class:`skh.failures.FailureType` (re-exported here).
"""

from skh.analysis.localize.alerts import AlertTracker, AlertUpdate
from skh.analysis.localize.data import (
    REPORT_FLAGS,
    FlowDiff,
    FlowRule,
    HostReport,
    Layer,
    OverlayTables,
    OverlayWalk,
    Pair,
    Severity,
    Symptom,
    Trace,
    Verdict,
)
from skh.analysis.localize.localizer import Localizer
from skh.analysis.localize.overlay import walk_overlay
from skh.analysis.localize.rnic import covers, diff_flow_tables, diff_megaflows
from skh.analysis.localize.source import FlowTables, StateSource
from skh.analysis.localize.suspects import Suspect, failing_path_ids, probe_view
from skh.analysis.localize.underlay import link_name, vote
from skh.failures import FailureType

__all__ = [
    "AlertTracker",
    "AlertUpdate",
    "FailureType",
    "FlowDiff",
    "FlowRule",
    "FlowTables",
    "HostReport",
    "Layer",
    "Localizer",
    "OverlayTables",
    "OverlayWalk",
    "Pair",
    "REPORT_FLAGS",
    "Severity",
    "StateSource",
    "Suspect",
    "Symptom",
    "Trace",
    "Verdict",
    "covers",
    "diff_flow_tables",
    "diff_megaflows",
    "failing_path_ids",
    "link_name",
    "probe_view",
    "vote",
    "walk_overlay",
]
