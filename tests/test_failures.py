"""The one failure-type enumeration: its table is complete and the simulator reads its types
from it; the merged type classes are well formed."""

import re

import skh.failures as failures
from skh.failures import FAILURES, TYPE_CLASSES, FailureType, type_class
from skh.sim.faults import FAULT_SPECS, SIMULATED_TYPES


def test_every_type_has_one_row_and_the_paper_is_1_to_19():
    assert set(FAILURES) == set(FailureType) - {FailureType.UNKNOWN}
    assert [t.value for t in FailureType if t.in_paper] == list(range(1, 20))
    # the module's documented table lists every type under its number
    doc = failures.__doc__ or ""
    for t in FAILURES:
        assert re.search(rf"^{t.value}\s+{t.name}\s", doc, re.M), t.name


def test_the_simulator_takes_what_a_type_is_from_the_table():
    assert set(SIMULATED_TYPES) == set(FAULT_SPECS) <= set(FAILURES)
    assert list(SIMULATED_TYPES) == sorted(SIMULATED_TYPES)
    for t, spec in FAULT_SPECS.items():
        row = FAILURES[t]
        assert (spec.name, spec.target, spec.layer, spec.in_paper) == (
            row.title,
            row.component,
            row.layer,
            t.in_paper,
        )


def test_type_classes_are_disjoint_merges_with_reasons():
    seen: set[FailureType] = set()
    for c in TYPE_CLASSES:
        assert len(c.members) >= 2 and not (c.members & seen) and len(c.reason) > 40
        assert c.name not in FailureType.__members__
        seen |= c.members
        assert {type_class(t) for t in c.members} == {c.name}
    lone = set(FailureType) - seen
    assert all(type_class(t) == t.name for t in lone)
    assert type_class(int(FailureType.CRC_ERROR)) == "CRC_ERROR"
