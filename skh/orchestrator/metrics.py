"""Prometheus metrics on an explicit :class:`prometheus_client.CollectorRegistry` per daemon (never
the global default, so tests and several daemons in one process stay apart). Labels are bounded:
reasons, roles, states, layers, transports and message types — never endpoint or pair ids.

Latency histograms (:class:`Histograms`) take a batch of values per observation (a list, or a
numpy array where the caller has one): the overlay agent counts its probe RTTs without numpy,
which it must not load (~13 MB of each sidecar's memory). ``deploy/grafana/`` builds its
dashboard on these names.

prometheus_client (and the http.server under it: ~9 MB of an agent's ~35) is imported only when
a registry is made or scraped: an agent without a metrics endpoint never loads it. The
collectors here are plain objects with ``collect()``, which is all a registry asks of one."""

from __future__ import annotations

import itertools
import logging
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "CollectorRegistry",
    "serve",
    "stop_servers",
    "CallbackCollector",
    "Histograms",
    "SECONDS_BUCKETS",
    "RTT_BUCKETS",
]

#: time to detect / localize, round time: 10 ms .. 10 min
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
#: probe RTT in seconds: 2 us .. 1 s (soft-RoCE and UDP in namespaces sit in the 10-100 us range)
RTT_BUCKETS = (2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 0.1, 1.0)

log = logging.getLogger(__name__)


def serve(registry: CollectorRegistry, address: str) -> int | None:
    """Expose ``registry`` over HTTP at ``host:port`` ("" = disabled); returns the bound port."""
    if not address:
        return None
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    _servers.append(server)
    bound = int(server.server_port)
    log.info("metrics on http://%s:%d/metrics", host or "127.0.0.1", bound)
    return bound


def stop_servers() -> None:
    """Shut every endpoint :func:`serve` started down (daemons exit instead; tests call this)."""
    while _servers:
        server = _servers.pop()
        server.shutdown()
        server.server_close()


_servers: list = []


def __getattr__(name: str) -> Any:
    # ``from skh.orchestrator.metrics import CollectorRegistry`` loads prometheus_client then
    if name == "CollectorRegistry":
        from prometheus_client import CollectorRegistry

        return CollectorRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CallbackCollector:
    """Reads live values from a daemon at scrape time, so the hot loop only bumps plain ints.

    ``counters``/``gauges`` map a metric name to ``(help, label_names, read)`` where ``read()``
    returns ``{label_values_tuple: value}``.
    """

    def __init__(
        self,
        counters: Mapping[
            str, tuple[str, tuple[str, ...], Callable[[], Mapping[tuple[str, ...], float]]]
        ],
        gauges: Mapping[
            str, tuple[str, tuple[str, ...], Callable[[], Mapping[tuple[str, ...], float]]]
        ],
    ) -> None:
        self._counters = dict(counters)
        self._gauges = dict(gauges)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, (doc, labels, read) in self._counters.items():
            fam = CounterMetricFamily(name, doc, labels=list(labels))
            for key, value in read().items():
                fam.add_metric(list(key), value)
            yield fam
        for name, (doc, labels, read) in self._gauges.items():
            gfam = GaugeMetricFamily(name, doc, labels=list(labels))
            for key, value in read().items():
                gfam.add_metric(list(key), value)
            yield gfam


class Histograms:
    """Histogram families with bounded label sets, fed a batch at a time.

    ``families`` maps a metric name (seconds, by Prometheus convention ``*_seconds``) to
    ``(help, label_names, buckets)``. :meth:`observe` adds every value of a batch under one
    label tuple; values that are not finite or are negative are dropped (counted nowhere: they
    are not latencies).
    """

    def __init__(
        self, families: Mapping[str, tuple[str, tuple[str, ...], tuple[float, ...]]]
    ) -> None:
        self._spec = dict(families)
        self._data: dict[str, dict[tuple[str, ...], list]] = {n: {} for n in self._spec}

    def observe(self, name: str, labels: tuple[str, ...], values: Iterable[float] | float) -> None:
        doc, names, bounds = self._spec[name]
        if len(labels) != len(names):
            raise ValueError(f"{name}: labels {names} expected, got {labels!r}")
        batch = [values] if isinstance(values, int | float) else values
        v = [float(x) for x in batch if math.isfinite(x) and x >= 0]
        if not v:
            return
        slot = self._data[name].get(labels)
        if slot is None:
            slot = self._data[name][labels] = [[0] * (len(bounds) + 1), 0.0]
        counts = slot[0]
        for x in v:  # bucket i counts values <= bounds[i]; the last one is +Inf
            counts[bisect_left(bounds, x)] += 1
        slot[1] += sum(v)

    def count(self, name: str, labels: tuple[str, ...]) -> int:
        slot = self._data[name].get(labels)
        return 0 if slot is None else sum(slot[0])

    def collect(self):
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        for name, (doc, names, bounds) in self._spec.items():
            fam = HistogramMetricFamily(name, doc, labels=list(names))
            for labels, (counts, total) in list(self._data[name].items()):
                cum = list(itertools.accumulate(counts))
                edges = [floatToGoString(b) for b in bounds] + ["+Inf"]
                fam.add_metric(list(labels), list(zip(edges, cum, strict=True)), total)
            yield fam
