"""The wire protocol: every message type round-trips (hypothesis), batches stay columnar and
exact, and every kind of bad frame is refused and counted."""

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skh.errors import ProtocolError
from skh.records import COUNTER_DTYPE, PROBE_DTYPE
from skh.wire import (
    _ANY,
    _NUM,
    _SCHEMAS,
    ENDPOINT_DTYPE,
    ENDPOINT_TEXT,
    PAGE_MAX,
    WIRE_VERSION,
    Codec,
    MsgType,
    counter_batch_body,
    decode_counters,
    decode_probes,
    decode_records,
    encode_columns,
    encode_records,
    pack_pairs,
    probe_batch_body,
    unpack_pairs,
)

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_plain = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _field(types, max_len=0):
    if types is _ANY:
        return _plain
    if types is _NUM:
        return st.one_of(st.integers(0, 2**32), st.floats(allow_nan=False, allow_infinity=False))
    if isinstance(types, tuple):
        return st.one_of(*[_field(t, max_len) for t in types])
    n = min(30, max_len or 30)
    return {
        str: st.text(max_size=n),
        int: st.integers(0, 2**63),
        bool: st.booleans(),
        bytes: st.binary(max_size=64),
        list: st.lists(_plain, max_size=5),
        dict: st.dictionaries(st.text(max_size=8), _plain, max_size=min(5, max_len or 5)),
        type(None): st.none(),
    }[types]


def _body(mtype):
    schema = _SCHEMAS[mtype]
    required = {k: _field(t, n) for k, (t, req, n) in schema.items() if req}
    optional = {k: _field(t, n) for k, (t, req, n) in schema.items() if not req}
    return st.fixed_dictionaries(required, optional=optional)


@pytest.mark.parametrize("mtype", list(MsgType), ids=lambda t: t.value)
def test_every_message_type_round_trips(mtype):
    codec = Codec()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=_body(mtype), sender=st.text(max_size=20), seq=st.integers(0, 2**64 - 1))
    def check(body, sender, seq):
        env = codec.decode(codec.encode(mtype, sender, seq, body))
        assert (env.v, env.type, env.sender, env.seq) == (WIRE_VERSION, mtype, sender, seq)
        assert env.body == body

    check()
    assert not codec.rejected


def _records(dtype, n, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8).tobytes()
    arr = np.frombuffer(raw, dtype=dtype).copy()
    if "_pad" in dtype.names:
        arr["_pad"] = 0
    return arr


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_probe_and_counter_batches_round_trip_exactly(n, seed):
    codec = Codec()
    probes, counters = _records(PROBE_DTYPE, n, seed), _records(COUNTER_DTYPE, n, seed)
    env = codec.decode(codec.encode(MsgType.PROBE_BATCH, "a", 1, probe_batch_body("a", probes)))
    assert decode_probes(env.body).tobytes() == probes.tobytes()
    env = codec.decode(
        codec.encode(MsgType.COUNTER_BATCH, "a", 2, counter_batch_body("a", counters))
    )
    assert decode_counters(env.body).tobytes() == counters.tobytes()


def test_batch_columns_are_raw_little_endian_bytes():
    recs = _records(PROBE_DTYPE, 3, 1)
    body = encode_columns(recs, PROBE_DTYPE)
    assert body["n"] == 3
    assert body["cols"]["rtt_ns"] == recs["rtt_ns"].astype("<i8").tobytes()
    assert set(body["cols"]) == set(PROBE_DTYPE.names)


def test_batch_with_a_short_or_missing_column_is_refused():
    body = encode_columns(_records(PROBE_DTYPE, 4, 2), PROBE_DTYPE)
    body["cols"]["rtt_ns"] = body["cols"]["rtt_ns"][:-1]
    with pytest.raises(ProtocolError, match="rtt_ns"):
        decode_probes(body)
    del body["cols"]["seq"]
    with pytest.raises(ProtocolError):
        decode_probes(body)
    with pytest.raises(ProtocolError):
        encode_columns(np.zeros(2, COUNTER_DTYPE), PROBE_DTYPE)


@given(pairs=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=50))
def test_pairs_round_trip(pairs):
    arr = np.array(pairs, dtype=np.uint32).reshape(-1, 2)
    assert np.array_equal(unpack_pairs(pack_pairs(arr)), arr)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\xc1", "malformed"),  # a byte msgpack never uses
        (msgpack.packb([1, 2, 3]), "malformed"),
        (msgpack.packb({"v": 2, "type": "ready", "sender": "", "seq": 0, "body": {}}), "version"),
        (
            msgpack.packb({"v": True, "type": "ready", "sender": "", "seq": 0, "body": {}}),
            "version",
        ),
        (msgpack.packb({"v": 1, "type": "nope", "sender": "", "seq": 0, "body": {}}), "type"),
        (msgpack.packb({"v": 1, "type": "ready", "sender": 3, "seq": 0, "body": {}}), "malformed"),
        (
            msgpack.packb({"v": 1, "type": "ready", "sender": "", "seq": -1, "body": {}}),
            "malformed",
        ),
        (
            msgpack.packb(
                {"v": 1, "type": "ready", "sender": "", "seq": 0, "body": {"agent": "a"}}
            ),
            "schema",
        ),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "type": "ready",
                    "sender": "",
                    "seq": 0,
                    "body": {"agent": "a", "endpoints": "x"},
                }
            ),
            "schema",
        ),
        (
            msgpack.packb({"v": 1, "type": "sync", "sender": "", "seq": 0, "body": {"job": True}}),
            "schema",
        ),
        (
            msgpack.packb(
                {"v": 1, "type": "replay", "sender": "", "seq": 0, "body": {"since": True}}
            ),
            "schema",
        ),
        (
            msgpack.packb(
                {
                    "v": 1,
                    "type": "ack",
                    "sender": "",
                    "seq": 0,
                    "body": {"ok": True, "data": msgpack.ExtType(5, b"x")},
                }
            ),
            "malformed",
        ),
        (msgpack.packb({1: 1}), "malformed"),  # non-string map key
        (b"\xdd\xff\xff\xff\xff", "malformed"),  # an array claiming 4 G elements
        (b"\x00" * 5000, "oversized"),
    ],
)
def test_bad_frames_are_refused_and_counted(frame, reason):
    codec = Codec(max_frame_bytes=4096)
    with pytest.raises(ProtocolError):
        codec.decode(frame)
    assert codec.rejected == {reason: 1}


def test_encode_refuses_what_the_receiver_would_refuse():
    codec = Codec(max_frame_bytes=256)
    with pytest.raises(ProtocolError):
        codec.encode(MsgType.SYNC, "a", 1, {"job": 3})
    with pytest.raises(ProtocolError):
        codec.encode(MsgType.SYNC, "a", 1, {"job": "x" * 1000})
    with pytest.raises(ProtocolError):
        Codec(max_frame_bytes=10)


def _page(rows):
    """(fixed, text) of ``rows``: tuples (ep, rail, port, qpn, ready, job, container, host, ip,
    gid, netdev)."""
    fixed = np.array([r[:5] for r in rows], ENDPOINT_DTYPE)
    text = {}
    for k, f in enumerate(ENDPOINT_TEXT):
        values = sorted({r[5 + k] for r in rows})
        text[f] = (values, np.array([values.index(r[5 + k]) for r in rows], np.int64))
    return fixed, text


_row = st.tuples(
    st.integers(0, 2**32 - 1),
    st.integers(0, 255),
    st.integers(0, 65535),
    st.integers(0, 2**24 - 1),
    st.booleans(),
    *[st.sampled_from(["", "a", "j0", "c1", "10.0.0.1", "x" * 64]) for _ in ENDPOINT_TEXT],
)


@settings(max_examples=50, deadline=None)
@given(rows=st.lists(_row, max_size=40))
def test_a_page_of_endpoint_records_round_trips_through_a_frame(rows):
    codec = Codec()
    fixed, text = _page(rows)
    body = {"job": "j", "version": 3, "skeleton_version": 0, "skeleton": None}
    frame = codec.encode(
        MsgType.JOB_SNAPSHOT, "c", 9, body | {"records": encode_records(fixed, text)}
    )
    got_fixed, got_text = decode_records(codec.decode(frame).body["records"])
    assert got_fixed.tolist() == fixed.tolist()
    for k, f in enumerate(ENDPOINT_TEXT):
        assert got_text[f] == [r[5 + k] for r in rows]


def test_a_malformed_page_of_records_is_refused_before_anything_is_built():
    rows = [(1, 0, 10, 5, True, "j", "c0", "h0", "ip", "", "eth0")] * 3
    good = encode_records(*_page(rows))
    assert decode_records(good)[0].size == 3

    def bad(**change):
        rec = {
            **good,
            "cols": dict(good["cols"]),
            "text": {k: list(v) for k, v in good["text"].items()},
        }
        for path, v in change.items():
            if path in ("n", "text"):
                rec[path] = v
            elif path in ENDPOINT_TEXT:
                rec["text"][path] = v
            else:
                rec["cols"][path] = v
        return rec

    cases = [
        bad(n=4),  # columns of 3 rows
        bad(n=PAGE_MAX + 1),  # over a page, before any column is read
        bad(ep=b"\0" * 11),  # a column cut short
        bad(job=[["j"], b"\1\0" * 3]),  # an index past its values
        bad(host=[["h"] * 4, b"\0\0" * 3]),  # more values than rows
        bad(ip=[["x" * 65], b"\0\0" * 3]),  # a value over its cap
        bad(gid=[[7], b"\0\0" * 3]),  # a value that is not text
        bad(netdev=["eth0"]),  # not [values, index]
        bad(text={}),  # a text column missing
        [1, 2],  # not a map
    ]
    for rec in cases:
        with pytest.raises(ProtocolError):
            decode_records(rec)
    with pytest.raises(ProtocolError):
        encode_records(np.zeros(PAGE_MAX + 1, ENDPOINT_DTYPE), {})
