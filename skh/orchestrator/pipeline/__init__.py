"""The analyzer's brain: what runs once per analyzer round.

``counters → skeleton inference per job → apply_skeleton on the controller`` and
``probe batches → Detector → each SuspectEvent → localization → verdict → alert``.

* **Skeleton.** Per endpoint, the 1 Hz byte counters (tx + rx of its VF's host-side device) are
  kept for ``history_s``; every ``skeleton_every_s`` each job whose endpoints all have
  ``skeleton.min_duration_s`` of samples is inferred (:func:`skh.analysis.skeleton.infer_skeleton`)
  and, when the list changed (:meth:`Skeleton.replaces`), submitted to the controller with the next
  skeleton version; the controller replaces the preload list and agents add before they drop, so
  no pair kept across the change is left unprobed.
* **Detection** is the streaming :class:`~skh.analysis.detect.Detector`.
* **Localization** asks the controller to relay commands to the host (underlay) agents: a
  flow-pinned traceroute between the two RNICs of a pair, the host's overlay forwarding state,
  a host report (RNIC link states) and, last and rate-limited, the RNIC flow tables.
* **Alerts** are deduplicated by (layer, component, failure type) while the fault lasts (an open
  alert is re-confirmed every round while detection still holds one of its pairs or endpoints
  active; an event whose pairs an open alert already holds confirms it instead of being localized
  again), and resolved ``resolve_after_s`` after the last confirmation. Every alert on the bus
  carries ``kind`` (``fault`` or ``skeleton``) and, for faults, ``state`` (``open``/``resolved``).

:class:`Pipeline` is synchronous (the simulator drives it in virtual time); :class:`PipelineHook`
runs it on a worker thread behind the analyzer daemon's round hook, so traceroutes that take
seconds never stall ingest. ``skh analyzer`` runs the daemon with this hook (its default
``detector = "pipeline"``; see :meth:`PipelineConfig.from_analyzer` for its settings).

Modules, one job each:

* :mod:`.config` — :class:`PipelineConfig` and how it is read from the analyzer's settings;
* :mod:`.state_source` — :class:`AgentStateSource`, the localizer's questions answered by host
  agents through the controller's command relay, and the parsing of their answers;
* :mod:`.history` — :class:`CounterHistory`, the byte counters skeleton inference reads;
* :mod:`.alert_body` — the alert bodies published on the bus (fault verdicts and skeletons);
* :mod:`.rounds` — :class:`Pipeline`, one round: skeletons, detection, localization, tracking;
* :mod:`.hook` — :class:`PipelineHook`, the pipeline on a worker thread behind the analyzer.
"""

from skh.orchestrator.admin import unpack_skeleton
from skh.orchestrator.pipeline.alert_body import verdict_alert
from skh.orchestrator.pipeline.config import PipelineConfig, detector_config
from skh.orchestrator.pipeline.history import CounterHistory
from skh.orchestrator.pipeline.hook import PipelineHook
from skh.orchestrator.pipeline.rounds import Pipeline
from skh.orchestrator.pipeline.state_source import AgentStateSource

__all__ = [
    "PipelineConfig",
    "AgentStateSource",
    "CounterHistory",
    "Pipeline",
    "PipelineHook",
    "detector_config",
    "unpack_skeleton",
    "verdict_alert",
]
