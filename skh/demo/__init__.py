"""``skh demo``: the whole pipeline on an emulated cluster, with faults, live and in a report.

* :mod:`skh.demo.live` — as root: the namespace testbed, the real daemons as separate processes
  (controller and analyzer in the root namespace, an underlay agent per host namespace, an
  overlay sidecar per container namespace), training traffic, a scripted fault sequence scored
  against the testbed's ground truth.
* :mod:`skh.demo.simmode` — without root: the same :class:`skh.orchestrator.pipeline.Pipeline`
  over the simulator, in virtual time.
* :mod:`skh.demo.report` — the self-contained HTML report (inline SVG, no scripts).
* :mod:`skh.demo.agent` — the underlay agent with the testbed's stand-in for an RNIC flow
  table (the analyzer is the product's own ``skh analyzer``).
"""
