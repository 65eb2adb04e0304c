"""``skh demo --sim --serve``: the simulator-backed demo behind a real analyzer, so alert
subscribers and bridges can be tried (and tested) against the bus without a cluster or root.

The analyzer daemon (:class:`~skh.orchestrator.analyzer.Analyzer`: durable log, PUB, REP
replay, CURVE, metrics) runs with :class:`SimHook` as its round hook: each round advances the
scripted scenario of :mod:`skh.demo.simmode` by as many virtual seconds as ``speed`` allows and
publishes the alerts the pipeline made of them. Virtual time ends a minute before the run
starts, so every time in the alerts lies in the past (an Alertmanager resolves a resolved alert
at once). When the scenario is over the bus stays up, serving replays, until SIGTERM or
``linger_s``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np

from skh.demo.simmode import SimRun

__all__ = ["SimHook", "serve"]


class SimHook:
    """A round hook that ignores the analyzer's (empty) input and plays the simulated scenario
    at ``speed`` virtual seconds per wall-clock second."""

    #: the alerts' times are the simulator's: the analyzer computes no time-to-localize
    virtual_time = True

    def __init__(self, run: SimRun, duration_s: int, *, speed: float) -> None:
        self._steps = run.steps(duration_s)
        self.duration_s = duration_s
        self.speed = speed
        self.done = threading.Event()
        self.played_s = 0
        self._finished = False
        self._t0 = time.monotonic()
        self._round_s: list[float] = []

    def on_round(
        self, probes: np.ndarray, counters: np.ndarray, now_ns: int
    ) -> list[dict[str, Any]]:
        due = min(self.duration_s, int((time.monotonic() - self._t0) * self.speed))
        out: list[dict[str, Any]] = []
        while self.played_s < due:
            t = time.monotonic()
            try:
                _step, alerts = next(self._steps)
            except StopIteration:
                self.played_s = self.duration_s
                break
            self._round_s.append(time.monotonic() - t)
            self.played_s += 1
            out += alerts
        # the analyzer publishes what a round returns before it calls the next one: "done" is
        # true once every alert of the scenario is on the bus
        if self._finished:
            self.done.set()
        self._finished = self.played_s >= self.duration_s
        return out

    def drain_round_s(self) -> list[float]:
        out, self._round_s = self._round_s, []
        return out


def serve(
    cfg: Any,
    *,
    seed: int = 1,
    duration_s: int = 360,
    speed: float = 10.0,
    linger_s: float | None = None,
    stop: threading.Event,
    say=print,
) -> int:
    """Run the analyzer with the simulated scenario until ``stop`` (or ``linger_s`` after the
    scenario ended). Prints the bound addresses as one JSON line first and ``{"done": ...}``
    when the scenario is over."""
    from skh.orchestrator.analyzer import Analyzer
    from skh.orchestrator.metrics import CollectorRegistry
    from skh.orchestrator.metrics import serve as serve_metrics

    run = SimRun(seed=seed, t0_ns=time.time_ns() - (duration_s + 60) * 10**9)
    hook = SimHook(run, duration_s, speed=speed)
    registry = CollectorRegistry()
    an = Analyzer(cfg.analyzer, cfg.security, hook=hook, metrics=registry)
    pull, pub, rep = an.bind()
    port = serve_metrics(registry, cfg.analyzer.metrics)
    say(json.dumps({"pull": pull, "alerts": pub, "replay": rep, "metrics_port": port}))
    daemon = threading.Thread(target=an.run, args=(stop,), name="skh-analyzer")
    daemon.start()
    try:
        while not hook.done.wait(0.2):
            if stop.is_set():
                break
        if hook.done.is_set():
            say(json.dumps({"done": True, "last_seq": an.alerts.last_seq}))
        stop.wait(linger_s)
    finally:
        stop.set()
        daemon.join()
    return 0
