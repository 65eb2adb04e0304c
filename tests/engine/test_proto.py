"""The wire format and the RTT arithmetic (csrc/proto.c), against a Python reference."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skh import _fastprobe as fp
from skh.records import ProbeStatus, TsSource

PROBE, ACK1, ACK2 = 1, 2, 3
TRUNCATED, BAD_MAGIC, BAD_VERSION, BAD_TYPE, MALFORMED = 1, 2, 3, 4, 5
HDR = struct.Struct(">IBBBBIIHHIQQQ")


def reference_encode(
    type_, flags=0, ts=0, session=0, seq=0, path=0, resp=0, t1=0, t3=0, t4=0, length=48
):
    raw = HDR.pack(0x534B4850, 1, type_, flags, ts, session, seq, path, 0, resp, t1, t3, t4)
    return raw + bytes(length - len(raw))


def test_layout_matches_the_documented_header():
    assert fp.HDR_LEN == HDR.size == 48
    assert fp.ACK_LEN == 48 and fp.PROBE_MIN_LEN == 96
    got = fp.proto_encode(PROBE, session=7, seq=9, path_id=3, t1=11)
    assert got == reference_encode(PROBE, session=7, seq=9, path=3, t1=11, length=96)
    ack = fp.proto_encode(
        ACK2, flags=1, ts_source=2, session=7, seq=9, resp_session=5, t1=11, t3=20, t4=30
    )
    assert ack == reference_encode(ACK2, 1, 2, 7, 9, 0, 5, 11, 20, 30)


def test_roundtrip_and_replies_never_exceed_the_probe():
    probe = fp.proto_encode(PROBE, session=1, seq=2, path_id=3, t1=4, probe_len=200)
    assert len(probe) == 200
    assert fp.proto_decode(probe) == dict(
        type=PROBE,
        flags=0,
        ts_source=0,
        session=1,
        seq=2,
        path_id=3,
        resp_session=0,
        t1=4,
        t3=0,
        t4=0,
        stream=0,
        tseq=0,
        popts=0,
        rcpt_span=0,
        rcpt_bits=0,
    )
    asks = fp.proto_encode(PROBE, session=1, seq=2, stream=5, tseq=6, popts=1)
    # beside the receipt request, in padding version-1 responders never read
    assert asks[64:72] == b"OPTS\x00\x00\x00\x01" and asks[60:64] == bytes(4)
    assert fp.proto_decode(asks)["popts"] == 1 and fp.proto_decode(asks)["stream"] == 5
    unknown = bytearray(asks)
    unknown[68:72] = b"\x00\x00\x00\x03"  # a bit from a newer prober: ignored, not garbage
    assert fp.proto_decode(bytes(unknown))["popts"] == 1
    with pytest.raises(OSError):
        fp.proto_encode(PROBE, session=1, seq=2, popts=2)
    ack1 = fp.proto_encode(ACK1, session=1, seq=2)
    ack2 = fp.proto_encode(ACK2, flags=1, ts_source=2, session=1, seq=2, t3=5, t4=6)
    assert len(ack1) + len(ack2) <= fp.PROBE_MIN_LEN


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", TRUNCATED),
        (b"SKHP\x01", TRUNCATED),
        (reference_encode(PROBE, length=95), TRUNCATED),  # a PROBE shorter than its two replies
        (reference_encode(ACK1)[:47], TRUNCATED),
        (b"XKHP" + reference_encode(PROBE, length=96)[4:], BAD_MAGIC),
        (reference_encode(PROBE, length=96)[:4] + b"\x02" + bytes(91), BAD_VERSION),
        (reference_encode(9, length=96), BAD_TYPE),
        (reference_encode(0, length=96), BAD_TYPE),
        (reference_encode(PROBE, length=fp.PROBE_MAX_LEN + 1), MALFORMED),
        (reference_encode(PROBE, flags=1, length=96), MALFORMED),
        (
            reference_encode(PROBE, t3=1, length=96),
            MALFORMED,
        ),  # a probe cannot carry responder stamps
        (reference_encode(ACK1, ts=2), MALFORMED),
        (reference_encode(ACK2, flags=1, ts=0, t3=1, t4=2), MALFORMED),  # stamps without a clock
        (reference_encode(ACK2, flags=1, ts=2, t3=5, t4=4), MALFORMED),  # T4 before T3
        (reference_encode(ACK2, flags=0, ts=0, t3=5, t4=6), MALFORMED),  # stamps not flagged valid
        (reference_encode(ACK2, flags=2), MALFORMED),  # unknown flag
        (reference_encode(ACK2, flags=1, ts=4, t3=1, t4=2), MALFORMED),  # unknown clock
        (
            reference_encode(ACK1)[:18] + b"\x00\x01" + reference_encode(ACK1)[20:],
            MALFORMED,
        ),  # reserved
    ],
)
def test_garbage_is_classified(data, reason):
    assert fp.proto_decode(data) == -reason


def test_encoder_refuses_what_the_decoder_would_drop():
    with pytest.raises(OSError):
        fp.proto_encode(PROBE, probe_len=95)
    with pytest.raises(OSError):
        fp.proto_encode(7)
    with pytest.raises(OSError):
        fp.proto_encode(ACK2, flags=4)


@settings(max_examples=1000, deadline=None)
@given(st.binary(min_size=0, max_size=1600))
def test_decoder_never_crashes_on_random_bytes(data):
    got = fp.proto_decode(data)
    assert isinstance(got, dict) or -MALFORMED <= got <= -TRUNCATED


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([PROBE, ACK1, ACK2]),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 95),
    st.integers(0, 255),
)
def test_any_single_byte_mutation_decodes_or_is_classified(type_, session, seq, path, t1, pos, val):
    data = bytearray(fp.proto_encode(type_, session=session, seq=seq, path_id=path, t1=t1))
    pos %= len(data)
    data[pos] = val
    got = fp.proto_decode(bytes(data))
    if isinstance(
        got, dict
    ):  # still valid: then its re-encoding is the packet's header (padding is opaque)
        assert fp.proto_encode(got.pop("type"), **got)[:48] == bytes(data[:48])


def reference_rtt(t1, t2, t3, t4, t5, t6):
    return (t5 - t2) - (t4 - t3), t4 - t3, (t6 - t1) - (t5 - t2)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 10**15),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(1, 10**6),
    st.integers(1, 10**15),
)
def test_rtt_arithmetic_matches_the_reference(t1, d12, d_net_half, d34, d56, t3):
    t2 = t1 + d12
    t5 = t2 + 2 * d_net_half + d34
    t4 = t3 + d34
    t6 = t5 + d56
    st_, rtt, resp, prober, src = fp.proto_rtt(
        t1, t2, TsSource.KERNEL, t3, t4, TsSource.KERNEL, t5, t6
    )
    assert st_ == ProbeStatus.OK and src == TsSource.KERNEL
    assert (rtt, resp, prober) == reference_rtt(t1, t2, t3, t4, t5, t6)


def test_rtt_labels_the_weaker_clock_and_rejects_broken_stamps():
    ok = fp.proto_rtt(100, 110, TsSource.KERNEL, 5000, 5020, TsSource.USER, 150, 160)
    assert ok == (ProbeStatus.OK, 20, 20, 20, TsSource.USER)
    # responder delay larger than the prober's round trip: a negative RTT is invalid, never recorded
    assert fp.proto_rtt(100, 110, 2, 5000, 5100, 2, 150, 160)[:2] == (ProbeStatus.INVALID, -1)
    # no responder stamps
    assert fp.proto_rtt(100, 110, 2, 0, 0, 0, 150, 160)[0] == ProbeStatus.INVALID
    # no prober pair
    assert fp.proto_rtt(100, 0, 0, 5000, 5020, 2, 0, 160)[0] == ProbeStatus.INVALID
    # absurd (> 60 s)
    assert (
        fp.proto_rtt(1, 2, 2, 10, 11, 2, 2 + 61 * 10**9, 3 + 61 * 10**9)[0] == ProbeStatus.INVALID
    )


# ------------------------------------------------------------------------------------ receipts
RCPT = 0x02
RCPT_EXT = struct.Struct(">IIII")  # magic, stream, tseq, reserved: bytes 48..63 of a PROBE


def test_receipt_request_rides_in_the_probe_padding_old_responders_never_read():
    plain = fp.proto_encode(PROBE, session=7, seq=9, path_id=3, t1=11)
    asking = fp.proto_encode(PROBE, session=7, seq=9, path_id=3, t1=11, stream=0xABC, tseq=41)
    # the 48-byte header is byte for byte a version-1 probe's: a responder that ignores the
    # padding (every version-1 one) answers it as before
    assert asking[:48] == plain[:48] and len(asking) == len(plain) == 96
    assert asking[48:64] == RCPT_EXT.pack(0x52435054, 0xABC, 41, 0)
    assert asking[64:] == bytes(32)
    got = fp.proto_decode(asking)
    assert (got["stream"], got["tseq"]) == (0xABC, 41)
    assert fp.proto_decode(plain)["stream"] == 0
    # padding that does not start with the marker stays opaque
    other = plain[:48] + b"\xff" * 48
    assert fp.proto_decode(other)["stream"] == 0


def test_ack1_receipts_layout():
    bits = (1 << 127) | (1 << 64) | 0b101
    ack = fp.proto_encode(
        ACK1, flags=RCPT, session=7, seq=9, resp_session=5, t1=11, rcpt_span=128, rcpt_bits=bits
    )
    assert len(ack) == 48
    raw = HDR.unpack(ack)
    assert raw[3] == RCPT and raw[8] == 128  # flags, span in the reserved field
    assert (raw[11], raw[12]) == (bits & (2**64 - 1), bits >> 64)
    got = fp.proto_decode(ack)
    assert (got["rcpt_span"], got["rcpt_bits"], got["t3"], got["t4"]) == (128, bits, 0, 0)
    # the ACK1 of a probe that did not ask is the plain one
    assert fp.proto_decode(fp.proto_encode(ACK1, session=7, seq=9))["flags"] == 0


@pytest.mark.parametrize(
    "data",
    [
        # receipts only in ACK1
        reference_encode(ACK2, flags=RCPT),
        reference_encode(PROBE, flags=RCPT, length=96),
        # span beyond the 128 bits, bits beyond the span, a clock on an ACK1
        reference_encode(ACK1, flags=RCPT)[:18] + struct.pack(">H", 129) + bytes(28),
        reference_encode(ACK1, flags=RCPT)[:18] + struct.pack(">H12xQQ", 3, 0b1000, 0),
        reference_encode(ACK1, flags=RCPT, ts=1),
        # a receipt request without a stream, or with its reserved word set
        reference_encode(PROBE, length=96)[:48] + RCPT_EXT.pack(0x52435054, 0, 1, 0) + bytes(32),
        reference_encode(PROBE, length=96)[:48] + RCPT_EXT.pack(0x52435054, 1, 1, 9) + bytes(32),
    ],
)
def test_malformed_receipts_are_dropped(data):
    assert fp.proto_decode(data) == -MALFORMED


def test_encoder_refuses_inconsistent_receipts():
    for kw in (
        dict(rcpt_span=2, rcpt_bits=0b100),
        dict(rcpt_span=129),
    ):
        with pytest.raises(OSError):
            fp.proto_encode(ACK1, flags=RCPT, **kw)
    with pytest.raises(OSError):
        fp.proto_encode(ACK2, flags=RCPT)
