"""Metrics worth a dashboard: the latency histograms count what they should (time to detect from
the running analyzer's own alerts, round times, probe RTTs of OK probes only, per transport),
labels stay bounded, and every query of the Grafana dashboard names metrics the daemons export.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from skh.orchestrator.agent_overlay import OverlayAgent
from skh.orchestrator.analyzer import Analyzer
from skh.orchestrator.controller import Controller
from skh.orchestrator.metrics import CollectorRegistry, Histograms
from skh.records import ProbeStatus, empty_probes

ROOT = Path(__file__).resolve().parents[2]
BUS_SPEED = 1000.0  # these need the finished log, not a live one
DASHBOARD = ROOT / "deploy" / "grafana" / "skh.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


class _Engine:
    """Drains one batch: two OK probes (20 us, 3 ms) and a lost one."""

    def __init__(self):
        self.batch = empty_probes(3)
        self.batch["status"] = [ProbeStatus.OK, ProbeStatus.OK, ProbeStatus.LOST]
        self.batch["rtt_ns"] = [20_000, 3_000_000, -1]

    def local_address(self):
        return {"ip": "127.0.0.1", "port": 1}

    def start(self):
        pass

    def close(self):
        pass

    def add_target(self, *a, **kw):
        pass

    def remove_target(self, dst):
        pass

    def stats(self):
        return {}

    def drain_packed(self, max_records=None):
        out, self.batch = self.batch, empty_probes(0)
        return bytearray(out.tobytes())


@pytest.fixture
def daemons(local_config):
    """The analyzer, controller and an overlay agent, each with its registry (not running)."""
    cfg = local_config(
        agent__job="j", agent__container="c", agent__endpoints=[{"rail": 0, "ip": "127.0.0.1"}]
    )
    ctx = zmq.Context()
    regs = {k: CollectorRegistry() for k in ("analyzer", "controller", "agent")}
    an = Analyzer(cfg.analyzer, cfg.security, ctx=ctx, metrics=regs["analyzer"])
    an.bind()
    ctl = Controller(cfg.controller, cfg.security, ctx=ctx, metrics=regs["controller"])
    agent = OverlayAgent(
        cfg.agent,
        cfg.security,
        ctx=ctx,
        engine_factory=lambda s, c: _Engine(),
        metrics=regs["agent"],
    )
    yield {"analyzer": an, "controller": ctl, "agent": agent, "regs": regs}
    for d in (agent, an):
        d.close()
    ctl.close()
    ctx.destroy(linger=0)


def _samples(reg) -> dict[str, float]:
    text = generate_latest(reg).decode()
    return {
        f"{s.name}{json.dumps(s.labels, sort_keys=True)}": s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _exported(regs) -> set[str]:
    names = set()
    for reg in regs.values():
        for fam in text_string_to_metric_families(generate_latest(reg).decode()):
            names.add(fam.name)
            names.update(fam.name + s for s in _SUFFIXES.get(fam.type, ()))
    return names


def test_probe_rtt_counts_ok_probes_per_transport(daemons):
    agent = daemons["agent"]
    agent.ep_ids = [0]
    agent.flush()
    s = _samples(daemons["regs"]["agent"])
    key = "skh_agent_probe_rtt_seconds_"
    assert s[key + 'count{"transport": "udp"}'] == 2  # the lost probe has no RTT
    assert s[key + 'sum{"transport": "udp"}'] == pytest.approx(0.00302)
    assert s[key + 'bucket{"le": "2e-05", "transport": "udp"}'] == 1
    assert s[key + 'bucket{"le": "0.002", "transport": "udp"}'] == 1
    assert s[key + 'bucket{"le": "0.005", "transport": "udp"}'] == 2


def test_time_to_detect_and_localize_come_from_each_opened_fault(daemons):
    an = daemons["analyzer"]
    seen = 1_000_000_000_000
    fault = {"kind": "fault", "state": "open", "layer": "rnic", "first_seen_ns": seen}
    an.publish({**fault, "detected_at_ns": seen + 3_000_000_000})
    an.publish({**fault, "state": "resolved", "detected_at_ns": seen})  # not an opening
    an.publish({"kind": "skeleton", "state": "event"})
    s = _samples(daemons["regs"]["analyzer"])
    assert s['skh_time_to_detect_seconds_count{"layer": "rnic"}'] == 1
    assert s['skh_time_to_detect_seconds_sum{"layer": "rnic"}'] == pytest.approx(3.0)
    assert s['skh_time_to_detect_seconds_bucket{"layer": "rnic", "le": "2.0"}'] == 0
    assert s['skh_time_to_detect_seconds_bucket{"layer": "rnic", "le": "5.0"}'] == 1
    assert s['skh_time_to_localize_seconds_count{"layer": "rnic"}'] == 1


def test_a_histogram_refuses_unbounded_label_sets_and_drops_non_latencies():
    h = Histograms({"x_seconds": ("x", ("layer",), (1.0,))})
    with pytest.raises(ValueError):
        h.observe("x_seconds", ("rnic", "ep17"), 1.0)
    h.observe("x_seconds", ("rnic",), np.array([0.5, -1.0, np.nan, np.inf, 2.0]))
    assert h.count("x_seconds", ("rnic",)) == 2


def test_the_running_analyzer_exports_its_latencies(bus):
    bus.wait_done()
    with urllib.request.urlopen(f"http://127.0.0.1:{bus.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    s = {
        f"{x.name}{json.dumps(x.labels, sort_keys=True)}": x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }
    opened = [r for r in bus.records() if r["alert"].get("state") == "open"]
    for layer in {r["alert"]["layer"] for r in opened}:
        n = sum(r["alert"]["layer"] == layer for r in opened)
        assert s[f'skh_time_to_detect_seconds_count{{"layer": "{layer}"}}'] == n
    assert s["skh_analyzer_round_seconds_count{}"] >= 300  # one per virtual second played
    # the simulator's clock is not the wall clock: no time to localize from it
    assert not any(k.startswith("skh_time_to_localize_seconds_count") for k in s)


def test_every_dashboard_query_names_metrics_the_daemons_export(daemons):
    exported = _exported(daemons["regs"])
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    used = set()
    for e in exprs:
        names = set(re.findall(r"\bskh_[a-z0-9_]+", e))
        assert names, e
        assert names <= exported, (e, names - exported)
        used |= names
    # the four latencies an operator looks at are all on it
    for m in ("time_to_detect", "time_to_localize", "analyzer_round", "agent_probe_rtt"):
        assert f"skh_{m}_seconds_bucket" in used
