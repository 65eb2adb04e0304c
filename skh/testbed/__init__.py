"""The emulated cluster: hosts, RNICs, rail ToRs, spines, containers with per-rail VFs over a
VXLAN overlay, and a management network, all built from Linux network namespaces (root only);
plus reversible fault injection, a training-traffic generator and a fast counter reader.

Typical use (as root)::

    from skh.testbed import Testbed, TestbedSpec, JobSpec, Faults
    tb = Testbed(TestbedSpec(hosts=4, rnics_per_host=4, containers_per_host=2,
                             jobs=(JobSpec("job0", JobShape(tp=4, pp=2, dp=2)),)))
    tb.up()                                   # removes stale skht* leftovers first
    cluster = tb.cluster()                    # the skh.model view: fabric, jobs, endpoints
    tb.spawn(["python", "-m", "skh", "agent", ...], ns=tb.container_ns("c0x0"), role="agent")
    tb.start_traffic("job0")                  # DP/PP bursts in every container of the job
    counters = tb.counter_source("host0")     # .read() -> COUNTER_DTYPE rows per endpoint
    truth = Faults(tb).inject("link_down", link=("tor0r0", "host1:rnic0"))
    Faults(tb).clear(truth.id)
    tb.down()                                 # nothing left: namespaces, links, nft, processes

The same from a shell: ``skh testbed up|down|status|traffic|fault inject|fault clear|fault list``.

Names are imported lazily: the helpers started inside namespaces (``python -m
skh.testbed.traffic``, ``.relay``, ``.flap``) must start fast and must not pull in numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DEFAULT_PREFIX",
    "CounterEntry",
    "FaultTruth",
    "Faults",
    "JobSpec",
    "Layout",
    "NetnsCounters",
    "ProcRecord",
    "Testbed",
    "TestbedSpec",
    "TrafficConfig",
    "cleanup_stale",
]

_WHERE = {
    "DEFAULT_PREFIX": "spec",
    "JobSpec": "spec",
    "Layout": "spec",
    "TestbedSpec": "spec",
    "CounterEntry": "counters",
    "NetnsCounters": "counters",
    "FaultTruth": "faults",
    "Faults": "faults",
    "ProcRecord": "testbed",
    "Testbed": "testbed",
    "cleanup_stale": "testbed",
    "TrafficConfig": "traffic",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"skh.testbed.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'skh.testbed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
