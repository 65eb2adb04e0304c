"""Prometheus metrics on an explicit :class:`prometheus_client.CollectorRegistry` per daemon (never
the global default, so tests and several daemons in one process stay apart). Labels are bounded:
reasons, roles, states and message types — never endpoint or pair ids."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CollectorRegistry", "serve", "stop_servers", "CallbackCollector"]

log = logging.getLogger(__name__)


def serve(registry: CollectorRegistry, address: str) -> int | None:
    """Expose ``registry`` over HTTP at ``host:port`` ("" = disabled); returns the bound port."""
    if not address:
        return None
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


class CallbackCollector(Collector):
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

    def collect(self):  # type: ignore[override]
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
