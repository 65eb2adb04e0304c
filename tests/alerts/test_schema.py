"""The alert schema is the contract: every alert the simulator-backed pipeline emits (every fault
type the simulator can place, through the real log) validates against it; its enumerations are
the code's; every field it names is documented in docs/alerts.md; and it refuses what breaks it.
The live demo's alerts are validated in tests/demo/test_demo_e2e.py, the detector's suspects in
tests/orchestrator/test_alerts.py."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest

from skh.analysis.localize import FailureType, Severity, Verdict
from skh.orchestrator.alerts import ALERT_SCHEMA_VERSION, AlertLog, alert_schema

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "alerts.md"


@pytest.fixture(scope="module")
def validator():
    schema = alert_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def sim_records(tmp_path_factory):
    """Every simulator fault type in turn under the pipeline, each alert through the log."""
    from skh.demo.simmode import SimRun
    from skh.sim.faults import SIMULATED_TYPES

    script = tuple((f.name, 130.0 + 40 * i, 155.0 + 40 * i) for i, f in enumerate(SIMULATED_TYPES))
    run = SimRun(script=script)
    log = AlertLog(tmp_path_factory.mktemp("schema") / "alerts.log")
    recs = [log.append(a) for _step, alerts in run.steps(160 + 40 * len(script)) for a in alerts]
    log.close()
    return recs


def test_every_alert_the_simulator_emits_validates(validator, sim_records):
    for rec in sim_records:
        errors = sorted(validator.iter_errors(rec), key=str)
        assert not errors, (rec, [e.message for e in errors[:3]])
    assert all(r["schema"] == ALERT_SCHEMA_VERSION for r in sim_records)
    # the run covers what the contract distinguishes: both kinds, both states, every layer a
    # simulated fault lands on, and the same id opening and resolving
    faults = [r["alert"] for r in sim_records if r["alert"]["kind"] == "fault"]
    assert {r["alert"]["kind"] for r in sim_records} == {"skeleton", "fault"}
    assert {a["layer"] for a in faults} >= {"underlay", "overlay", "rnic", "host", "agent"}
    assert len({a["failure_type"] for a in faults}) >= 12
    opened = {a["alert_id"] for a in faults if a["state"] == "open"}
    resolved = {a["alert_id"] for a in faults if a["state"] == "resolved"}
    assert resolved and resolved <= opened


def test_an_unexplained_verdict_validates_too(validator):
    from skh.orchestrator.pipeline import verdict_alert

    v = Verdict(
        job="j",
        pairs=((0, 1),),
        layer="unexplained",
        component="",
        component_kind="",
        failure_type=FailureType.UNKNOWN,
        symptom="loss",
        severity=Severity.MAJOR,
        first_seen_ns=1,
        detected_at_ns=2,
        evidence={"reason": "nothing found"},
    )
    log_rec = {"seq": 1, "ts_ns": 3, "schema": ALERT_SCHEMA_VERSION}
    validator.validate({**log_rec, "alert": verdict_alert(v, "open")})


def test_the_schemas_enumerations_are_the_codes():
    fault = alert_schema()["$defs"]["fault"]["properties"]
    assert fault["failure_type"]["enum"] == [f.name.lower() for f in FailureType]
    assert fault["failure_type_id"]["maximum"] == max(FailureType)
    import typing

    from skh.analysis.localize.data import Layer

    assert fault["layer"]["enum"] == list(typing.get_args(Layer))


def test_the_schema_refuses_what_breaks_the_contract(validator, sim_records):
    rec = next(r for r in sim_records if r["alert"]["kind"] == "fault")
    broken = [
        {k: v for k, v in rec.items() if k != "seq"},
        {**rec, "schema": "2.0"},
        {**rec, "alert": {**rec["alert"], "state": "closed"}},
        {**rec, "alert": {**rec["alert"], "failure_type": "gremlins"}},
        {**rec, "alert": {k: v for k, v in rec["alert"].items() if k != "alert_id"}},
        {**rec, "alert": {**rec["alert"], "kind": "weather"}},
    ]
    for b in broken:
        assert not validator.is_valid(b), b
    # and accepts what minor versions may add
    assert validator.is_valid({**rec, "schema": "1.7", "alert": {**rec["alert"], "new": 1}})


def _field_names(node, out):
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            out.add(name)
            _field_names(sub, out)
        for key in ("$defs", "items", "additionalProperties"):
            sub = node.get(key)
            if isinstance(sub, dict):
                for v in sub.values() if key == "$defs" else [sub]:
                    _field_names(v, out)
        for sub in node.get("oneOf", []) + node.get("prefixItems", []):
            _field_names(sub, out)
    return out


def test_every_schema_field_is_documented():
    names = _field_names(alert_schema(), set())
    assert {"seq", "alert_id", "evidence", "health_bits", "misordered", "stage"} <= names
    documented = set(re.findall(r"`([a-z_]+)`", DOC.read_text()))
    assert names - documented == set()
