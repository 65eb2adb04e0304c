"""The responder's receipts (csrc/receipts.c) against a Python model: which probes of a stream
arrived, as the ACK1 of each arrival reports them, under loss, reordering and many streams."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BITS = 128


@pytest.fixture(scope="module")
def rc(tmp_path_factory, c_builder):
    lib = ctypes.CDLL(str(c_builder(tmp_path_factory.mktemp("rc"), "rc", ["csrc/receipts.c"])))
    lib.skh_rcpt_create.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]
    lib.skh_rcpt_destroy.argtypes = [ctypes.c_void_p]
    lib.skh_rcpt_note.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_uint16),
        ctypes.c_uint64 * 2,
    ]
    return lib


class Table:
    def __init__(self, lib, cap=4096):
        self.lib = lib
        self.t = ctypes.c_void_p()
        assert lib.skh_rcpt_create(cap, ctypes.byref(self.t)) == 0
        self.now = 0

    def note(self, session, stream, tseq):
        span = ctypes.c_uint16()
        bits = (ctypes.c_uint64 * 2)()
        self.now += 1
        self.lib.skh_rcpt_note(self.t, session, stream, tseq, self.now, ctypes.byref(span), bits)
        return span.value, bits[0] | bits[1] << 64

    def close(self):
        self.lib.skh_rcpt_destroy(self.t)


def test_in_order_stream_with_losses(rc):
    t = Table(rc)
    try:
        got = [t.note(7, 1, q) for q in (0, 1, 3, 4, 7)]
    finally:
        t.close()
    assert got[0] == (0, 0)  # first probe: nothing known before it
    assert got[1] == (1, 0b1)
    assert got[2] == (3, 0b110)  # bit i is tseq 3-1-i: 2 missing, 1 and 0 arrived
    assert got[4] == (7, 0b1101100)  # 6, 5 missing; 4, 3 arrived; 2 missing; 1, 0 arrived


def test_late_arrival_is_noted_and_answered(rc):
    t = Table(rc)
    try:
        t.note(7, 1, 0)
        t.note(7, 1, 2)
        late = t.note(7, 1, 1)  # answered with what was known before it
        after = t.note(7, 1, 3)
    finally:
        t.close()
    assert late == (1, 0b1)
    assert after == (3, 0b111)


def test_streams_and_sessions_are_kept_apart(rc):
    t = Table(rc)
    try:
        t.note(7, 1, 0)
        t.note(8, 1, 0)
        t.note(7, 2, 5)
        assert t.note(7, 1, 1) == (1, 1)
        assert t.note(8, 1, 2) == (2, 0b10)
        assert t.note(7, 2, 6) == (1, 1)
    finally:
        t.close()


def test_window_is_128_back_and_wraps_with_the_sequence(rc):
    t = Table(rc)
    try:
        for q in range(2**32 - 200, 2**32):
            t.note(3, 9, q)
        span, bits = t.note(3, 9, 5)  # tseq wrapped past 2**32
    finally:
        t.close()
    assert span == 127 and bits == (2**127 - 1) ^ 0b11111  # 0..4 (after the wrap) never arrived


def test_a_full_table_forgets_the_least_recently_heard_stream(rc):
    t = Table(rc, cap=16)
    try:
        for stream in range(1, 200):  # far more streams than entries: old ones are replaced
            t.note(1, stream, 0)
        t.note(1, 199, 1)
        assert t.note(1, 199, 2) == (2, 0b11)  # the newest survived
        assert t.note(1, 1, 1) == (0, 0)  # the oldest was forgotten: nothing claimed about 0
    finally:
        t.close()


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(0, 300), min_size=1, max_size=200),
)
def test_matches_the_model(rc, start, offsets):
    # arrivals: a mostly increasing sequence with gaps (loss) and some late ones (reordering)
    arrivals = [(start + o) % 2**32 for o in offsets]
    base = arrivals[0]
    rel = [(a - base) % 2**32 for a in arrivals]
    rel = [r if r < 2**31 else r - 2**32 for r in rel]
    t = Table(rc)
    try:
        got = [t.note(11, 5, a) for a in arrivals]
    finally:
        t.close()
    want = model_with_late(rel)
    assert got == want


def model_with_late(rel: list[int]) -> list[tuple[int, int]]:
    """The model on relative tseqs, where an arrival older than the window is not remembered."""
    seen: set[int] = set()
    hi = rel[0]
    first = rel[0]
    out = []
    for q in rel:
        if q > hi:
            hi = q
        known_from = max(first, hi - BITS + 1)
        if q >= known_from:
            seen.add(q)
        back = hi - q
        span = max(0, min(BITS, q - known_from)) if back + 1 < hi - known_from + 1 else 0
        bits = sum(1 << i for i in range(span) if (q - 1 - i) in seen)
        out.append((span, bits))
    return out
