"""Pure logic of the verbs transport (csrc/verbs_util.c) on crafted inputs, through ctypes on the
shipped C source: GRH parsing in both RoCEv2 layouts, HCA ticks -> ns across wrap-around, mlx5
real-time-format stamps, GID selection, flow label -> UDP source port, and the clock-domain path
from raw NIC ticks to valid RTTs (skh_proto_rtt of the engine)."""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import random
import struct

import pytest

u8x16 = ctypes.c_uint8 * 16


class GrhInfo(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_uint8),
        ("tclass", ctypes.c_uint8),
        ("hop_limit", ctypes.c_uint8),
        ("next_header", ctypes.c_uint8),
        ("flow_label", ctypes.c_uint32),
        ("sgid", u8x16),
        ("dgid", u8x16),
    ]


class TickClock(ctypes.Structure):
    _fields_ = [
        ("mask", ctypes.c_uint64),
        ("khz", ctypes.c_uint64),
        ("last_raw", ctypes.c_uint64),
        ("last_ext", ctypes.c_int64),
        ("primed", ctypes.c_int),
    ]


class GidCand(ctypes.Structure):
    _fields_ = [
        ("gid", u8x16),
        ("index", ctypes.c_uint32),
        ("gid_type", ctypes.c_uint32),
        ("ndev_ifindex", ctypes.c_uint32),
    ]


class GidWant(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_int),
        ("link_local", ctypes.c_int),
        ("ifindex", ctypes.c_uint32),
        ("has_addr", ctypes.c_int),
        ("addr", u8x16),
    ]


class Rtt(ctypes.Structure):
    _fields_ = [
        ("rtt_ns", ctypes.c_int64),
        ("responder_delay_ns", ctypes.c_int64),
        ("prober_delay_ns", ctypes.c_int64),
        ("ts_source", ctypes.c_uint8),
    ]


ROCE_V1, ROCE_V2 = 1, 2
TS_USER, TS_HW = 1, 3
ST_OK = 0


@pytest.fixture(scope="module")
def vu(verbs_util):
    lib = verbs_util
    lib.skh_grh_parse.argtypes = [ctypes.c_char_p, ctypes.POINTER(GrhInfo)]
    lib.skh_tick_clock_init.argtypes = [ctypes.POINTER(TickClock), ctypes.c_uint64, ctypes.c_uint64]
    lib.skh_tick_clock_ns.argtypes = [ctypes.POINTER(TickClock), ctypes.c_uint64]
    lib.skh_tick_clock_ns.restype = ctypes.c_int64
    lib.skh_ticks_delta_ns.argtypes = [ctypes.c_uint64] * 4
    lib.skh_ticks_delta_ns.restype = ctypes.c_int64
    lib.skh_rt_stamp_decode.argtypes = [ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)]
    lib.skh_rt_stamp_plausible.argtypes = [ctypes.c_uint64, ctypes.c_int64]
    lib.skh_gid_select.argtypes = [
        ctypes.POINTER(GidCand),
        ctypes.c_size_t,
        ctypes.POINTER(GidWant),
    ]
    lib.skh_gid_format.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.skh_gid_parse.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.skh_flow_label_to_udp_sport.argtypes = [ctypes.c_uint32]
    lib.skh_flow_label_to_udp_sport.restype = ctypes.c_uint16
    lib.skh_path_flow_label.argtypes = [ctypes.c_uint16]
    lib.skh_path_flow_label.restype = ctypes.c_uint32
    return lib


def gid(text: str) -> bytes:
    a = ipaddress.ip_address(text)
    return (ipaddress.IPv6Address(f"::ffff:{a}") if a.version == 4 else a).packed


def ipv4_header(
    src: str, dst: str, tos: int = 0, ttl: int = 64, good_checksum: bool = True
) -> bytes:
    h = bytearray(
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            tos,
            20 + 8 + 12 + 64,
            0x1234,
            0x4000,
            ttl,
            17,
            0,
            ipaddress.IPv4Address(src).packed,
            ipaddress.IPv4Address(dst).packed,
        )
    )
    s = sum(struct.unpack("!10H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    struct.pack_into("!H", h, 10, (~s & 0xFFFF) ^ (0 if good_checksum else 0x0101))
    return bytes(h)


def grh_v4(src: str, dst: str, *, head: bytes = bytes(20), **kw) -> bytes:
    return head + ipv4_header(src, dst, **kw)


def grh_v6(
    src: str, dst: str, *, tclass: int = 0, flow_label: int = 0, hop: int = 64, nh: int = 17
) -> bytes:
    w0 = 6 << 28 | tclass << 20 | flow_label
    return struct.pack("!IHBB16s16s", w0, 72, nh, hop, gid(src), gid(dst))


def parse(vu, raw: bytes) -> tuple[int, GrhInfo]:
    assert len(raw) == 40
    out = GrhInfo()
    return vu.skh_grh_parse(raw, ctypes.byref(out)), out


# --------------------------------------------------------------------------------------------- GRH


def test_grh_ipv4_layout_reads_bytes_20_to_39(vu):
    rc, g = parse(vu, grh_v4("192.0.2.1", "192.0.2.2", tos=0x68, ttl=63))
    assert rc == 0 and g.family == 4
    assert bytes(g.sgid) == gid("192.0.2.1") and bytes(g.dgid) == gid("192.0.2.2")
    assert (g.tclass, g.hop_limit, g.next_header, g.flow_label) == (0x68, 63, 17, 0)


def test_grh_ipv4_wins_over_garbage_that_looks_like_ipv6(vu):
    # bytes 0..19 are undefined for IPv4 (rpingmesh #5 read them as an IPv6 header)
    head = bytes([0x60, 0x0A, 0xBC, 0xDE]) + bytes(range(16))
    rc, g = parse(vu, grh_v4("10.1.2.3", "10.4.5.6", head=head))
    assert rc == 0 and g.family == 4
    assert bytes(g.sgid) == gid("10.1.2.3") and g.flow_label == 0


def test_grh_ipv6_layout(vu):
    rc, g = parse(
        vu, grh_v6("fe80::ff:fe00:1", "fe80::ff:fe00:2", tclass=0xB8, flow_label=0xABCDE, hop=1)
    )
    assert rc == 0 and g.family == 6
    assert bytes(g.sgid) == gid("fe80::ff:fe00:1") and bytes(g.dgid) == gid("fe80::ff:fe00:2")
    assert (g.tclass, g.flow_label, g.hop_limit, g.next_header) == (0xB8, 0xABCDE, 1, 17)


def test_grh_ipv6_with_a_bad_ipv4_lookalike_stays_ipv6(vu):
    # an IPv6 header whose bytes 20..39 start with 0x45 but fail the IPv4 checksum
    src = "2001:db8::45:0:1"
    raw = bytearray(grh_v6(src, "2001:db8::2", flow_label=7))
    raw[20] = 0x45
    rc, g = parse(vu, bytes(raw))
    assert rc == 0 and g.family == 6 and g.flow_label == 7
    assert bytes(g.sgid) == bytes(raw[8:24])


def test_grh_ipv4_without_checksum_from_rxe_loopback(vu):
    # rxe loops same-device packets back before the IP layer computes the header checksum
    rc, g = parse(vu, grh_v4("192.0.2.1", "192.0.2.1", good_checksum=False))
    assert rc == 0 and g.family == 4 and bytes(g.sgid) == gid("192.0.2.1")
    # ...but with an IPv6-looking first word, an unchecked IPv4 lookalike is not believed
    head = bytes([0x60, 0, 0, 0]) + bytes(16)
    rc, g = parse(vu, grh_v4("192.0.2.1", "192.0.2.1", head=head, good_checksum=False))
    assert rc == 0 and g.family == 6


def test_grh_neither_layout_is_rejected(vu):
    assert parse(vu, bytes(40))[0] == -errno.EPROTO
    assert parse(vu, bytes(20) + b"\x46" + bytes(19))[0] == -errno.EPROTO  # IPv4 with options


# ---------------------------------------------------------------------------------- ticks -> ns


def test_ticks_delta_wraps_around_the_mask(vu):
    mask, khz = 0xFFFF, 1000  # 1 tick = 1 us
    assert vu.skh_ticks_delta_ns(0x0010, 0xFFF0, mask, khz) == 0x20 * 1000
    assert vu.skh_ticks_delta_ns(0x0100, 0x0080, mask, khz) == 0x80 * 1000
    # 156.25 MHz (a ConnectX core clock): 6.4 ns per tick, exact in 128-bit arithmetic
    assert vu.skh_ticks_delta_ns(1000, 0, (1 << 63) - 1, 156250) == 6400
    big = 1 << 44  # ~31 h at 156.25 MHz: ticks * 1e6 overflows 64 bits
    assert vu.skh_ticks_delta_ns(big, 0, (1 << 63) - 1, 156250) == big * 10**6 // 156250


@pytest.mark.parametrize(("mask", "khz"), [(0, 1000), (0xFFF0, 1000), (0xFFFF, 0), (0x7F, 1000)])
def test_ticks_reject_unusable_clock_descriptions(vu, mask, khz):
    assert vu.skh_ticks_delta_ns(2, 1, mask, khz) == -errno.EINVAL
    assert vu.skh_tick_clock_init(ctypes.byref(TickClock()), mask, khz) == -errno.EINVAL


def test_tick_clock_extends_across_many_wraps(vu):
    c = TickClock()
    mask, khz = 0xFFFFF, 1_000_000  # 20-bit counter at 1 GHz: wraps every ~1 ms
    assert vu.skh_tick_clock_init(ctypes.byref(c), mask, khz) == 0
    true_ticks = 0xFFF00
    first = vu.skh_tick_clock_ns(ctypes.byref(c), true_ticks & mask)
    rng = random.Random(7)
    for _ in range(2000):
        true_ticks += rng.randrange(1, mask // 3)
        got = vu.skh_tick_clock_ns(ctypes.byref(c), true_ticks & mask)
        assert got - first == true_ticks - 0xFFF00
    assert true_ticks > 50 * (mask + 1)


MLX5_MASK = 0x7FFF_FFFF_FFFF_FFFF  # mlx5_ib_query_device: props->timestamp_mask
# device_frequency_khz of real devices: 156.25 MHz, 625 MHz, 1 GHz
REAL_KHZ = (156_250, 625_000, 1_000_000)


@pytest.mark.parametrize("khz", REAL_KHZ)
@pytest.mark.parametrize("start", [0, 1 << 40, MLX5_MASK - 10**9, MLX5_MASK])
def test_tick_clock_at_mlx5_mask_is_positive_and_exact(vu, khz, start):
    """The raw counter may sit anywhere in its 63 bits (near the top it is past INT64_MAX once in
    ns): only ticks since the first stamp are converted, so stamps stay positive and exact,
    across the wrap of the 63-bit counter too."""
    c = TickClock()
    assert vu.skh_tick_clock_init(ctypes.byref(c), MLX5_MASK, khz) == 0
    first = vu.skh_tick_clock_ns(ctypes.byref(c), start)
    assert first > 0
    ticks = 0
    rng = random.Random(khz ^ start)
    for _ in range(500):
        ticks += rng.randrange(1, 3 * 10**9)  # up to ~20 s at 156.25 MHz between stamps
        got = vu.skh_tick_clock_ns(ctypes.byref(c), (start + ticks) & MLX5_MASK)
        assert got > first
        assert got - first == ticks * 10**6 // khz


def test_tick_clock_places_a_slightly_older_stamp_behind(vu):
    c = TickClock()
    vu.skh_tick_clock_init(ctypes.byref(c), 0xFFFF, 1_000_000)
    base = vu.skh_tick_clock_ns(ctypes.byref(c), 0xFFF0)
    assert vu.skh_tick_clock_ns(ctypes.byref(c), 0x0010) - base == 0x20  # wrapped forward
    # a send CQE polled after a receive CQE that completed later: behind, not a new wrap
    assert vu.skh_tick_clock_ns(ctypes.byref(c), 0xFFF8) - base == 8
    assert vu.skh_tick_clock_ns(ctypes.byref(c), 0x0011) - base == 0x21


# ------------------------------------------------------------------------- mlx5 real-time format


def test_rt_stamp_is_seconds_high_nanoseconds_low(vu):
    out = ctypes.c_int64()
    sec, ns = 1_764_000_000, 999_999_999
    assert vu.skh_rt_stamp_decode(sec << 32 | ns, ctypes.byref(out)) == 0
    assert out.value == sec * 10**9 + ns
    # the low word wraps at 1e9: naive subtraction of two RT stamps across a second is wrong
    a, b = sec << 32 | 999_999_000, (sec + 1) << 32 | 500
    va, vb = ctypes.c_int64(), ctypes.c_int64()
    vu.skh_rt_stamp_decode(a, ctypes.byref(va)), vu.skh_rt_stamp_decode(b, ctypes.byref(vb))
    assert vb.value - va.value == 1500 and (b - a) != 1500
    assert vu.skh_rt_stamp_decode(sec << 32 | 10**9, ctypes.byref(out)) == -errno.EINVAL


def test_rt_stamp_plausibility_rejects_raw_ticks(vu):
    now = 1_764_000_000 * 10**9
    assert vu.skh_rt_stamp_plausible(1_764_000_100 << 32 | 5, now) == 1
    assert vu.skh_rt_stamp_plausible(1_764_200_000 << 32 | 5, now) == 0  # > 1 day away
    assert vu.skh_rt_stamp_plausible(123_456_789_012, now) == 0  # free-running ticks


# -------------------------------------------------------------------------------- GID selection


def table(*rows) -> tuple[ctypes.Array, int]:
    arr = (GidCand * len(rows))()
    for i, (idx, text, typ, ifx) in enumerate(rows):
        arr[i].gid = u8x16(*(gid(text) if text else bytes(16)))
        arr[i].index, arr[i].gid_type, arr[i].ndev_ifindex = idx, typ, ifx
    return arr, len(rows)


def select(vu, tbl, *, family, link_local=0, ifindex=0, addr=None) -> int:
    w = GidWant(family=family, link_local=link_local, ifindex=ifindex, has_addr=addr is not None)
    if addr:
        w.addr = u8x16(*gid(addr))
    arr, n = tbl
    pos = vu.skh_gid_select(arr, n, ctypes.byref(w))
    return pos if pos < 0 else arr[pos].index


MLX5 = table(
    (0, "fe80::1", ROCE_V1, 5),
    (1, "fe80::1", ROCE_V2, 5),
    (2, "10.0.0.1", ROCE_V1, 5),
    (3, "10.0.0.1", ROCE_V2, 5),
    (4, "10.0.1.1", ROCE_V1, 7),
    (5, "10.0.1.1", ROCE_V2, 7),
    (6, "2001:db8::1", ROCE_V2, 5),
    (7, None, ROCE_V2, 5),
)
RXE = table((0, "fe80::ff:fe00:1", ROCE_V2, 3), (1, "192.0.2.1", ROCE_V2, 3))


def test_gid_mlx5_layout_picks_roce_v2_of_the_family_never_index_0(vu):
    assert select(vu, MLX5, family=4) == 3
    assert select(vu, MLX5, family=4, ifindex=7) == 5  # the netdev (VLAN/macvlan) that owns the IP
    assert select(vu, MLX5, family=4, addr="10.0.1.1") == 5
    assert select(vu, MLX5, family=6) == 6  # global IPv6 beats link-local unless asked
    assert select(vu, MLX5, family=6, link_local=1) == 1
    assert select(vu, MLX5, family=4, ifindex=9) == -errno.ENOENT
    assert select(vu, MLX5, family=4, addr="10.9.9.9") == -errno.ENOENT


def test_gid_rxe_layout(vu):
    assert select(vu, RXE, family=4) == 1
    assert select(vu, RXE, family=6, link_local=1) == 0  # index 0 only because it is the match
    assert select(vu, RXE, family=6) == -errno.ENOENT  # no global IPv6 GID: say so, do not guess
    assert select(vu, RXE, family=4, ifindex=4) == -errno.ENOENT


def test_gid_text_round_trip(vu):
    buf = ctypes.create_string_buffer(64)
    for text in ("192.0.2.1", "fe80::ff:fe00:1", "2001:db8::1"):
        raw = ctypes.create_string_buffer(16)
        assert vu.skh_gid_parse(text.encode(), raw) == 0 and raw.raw == gid(text)
        assert vu.skh_gid_format(raw.raw, buf, 64) == 0 and buf.value.decode() == text
    assert vu.skh_gid_parse(b"rxe0", ctypes.create_string_buffer(16)) == -errno.EINVAL


# --------------------------------------------------------------------- flow label -> UDP sport


def test_flow_label_to_sport_matches_libibverbs(vu, tmp_path, c_builder):
    labels = [1, 2, 0x3FFF, 0x4000, 0x4001, 0xFFFFF, 0x12345, 0xABCDE]
    ours = [vu.skh_flow_label_to_udp_sport(fl) for fl in labels]
    assert ours[:3] == [0xC001, 0xC002, 0xFFFF]
    src = tmp_path / "ref.c"
    src.write_text(
        "#if __has_include(<infiniband/verbs.h>)\n#include <infiniband/verbs.h>\n"
        "unsigned short ref(unsigned fl) { return ibv_flow_label_to_udp_sport(fl); }\n"
        "int have_ref = 1;\n#else\nint have_ref = 0;\n#endif\n"
    )
    ref = ctypes.CDLL(str(c_builder(tmp_path, "ref", [str(src)])))
    if not ctypes.c_int.in_dll(ref, "have_ref").value:
        pytest.skip("no <infiniband/verbs.h> to compare with")
    ref.ref.restype = ctypes.c_uint16
    assert ours == [ref.ref(fl) for fl in labels]


def test_path_ids_map_to_distinct_nonzero_labels(vu):
    labels = [vu.skh_path_flow_label(p) for p in range(0x3FFF)]
    assert 0 not in labels and len(set(labels)) == 0x3FFF
    sports = {vu.skh_flow_label_to_udp_sport(fl) for fl in labels}
    assert len(sports) == 0x3FFF  # one pinned ECMP path per path id


# ---------------------------------------------------------------------- clock domains -> RTT


@pytest.fixture(scope="module")
def proto(tmp_path_factory, c_builder):
    lib = ctypes.CDLL(
        str(c_builder(tmp_path_factory.mktemp("pr"), "pr", ["csrc/verbs_util.c", "csrc/proto.c"]))
    )
    lib.skh_tick_clock_init.argtypes = [ctypes.POINTER(TickClock), ctypes.c_uint64, ctypes.c_uint64]
    lib.skh_tick_clock_ns.argtypes = [ctypes.POINTER(TickClock), ctypes.c_uint64]
    lib.skh_tick_clock_ns.restype = ctypes.c_int64
    lib.skh_proto_rtt.argtypes = [
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_uint8,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_uint8,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.POINTER(Rtt),
    ]
    return lib


NARROW = (1 << 24) - 1
RTT_CASES = {
    # 24-bit counters at unrelated random origins wrap many times (rpingmesh PR #27 got zero
    # valid RTTs from such counters)
    "24bit": (NARROW, 1_000_000, 156_250, 8_007_217, 3_402_871, 3000, 3_000_000),
    # mlx5's real mask at the frequencies real devices report, counters 0.5 s / 0.2 s below the
    # 63-bit wrap
    **{
        f"mlx5-{p // 1000}MHz": (
            MLX5_MASK,
            p,
            r,
            MLX5_MASK - p * 500,
            MLX5_MASK - r * 200,
            2000,
            10**6,
        )
        for p, r in zip(REAL_KHZ, REAL_KHZ[-1:] + REAL_KHZ[:-1], strict=True)
    },
}


@pytest.mark.parametrize("case", RTT_CASES.values(), ids=RTT_CASES.keys())
def test_nic_ticks_across_wraps_give_valid_rtts(proto, case):
    """Two NICs, different core clocks and origins, counters that wrap during the run: every probe
    is OK with the true RTT, within one tick of each side."""
    mask, p_khz, r_khz, p_off, r_off, n, max_gap = case
    rng = random.Random(p_khz ^ mask)
    pc, rc_ = TickClock(), TickClock()
    assert proto.skh_tick_clock_init(ctypes.byref(pc), mask, p_khz) == 0
    assert proto.skh_tick_clock_init(ctypes.byref(rc_), mask, r_khz) == 0
    tick_bound = -(-(10**6) // p_khz) + -(-(10**6) // r_khz)
    t_true = 0  # true time in ns

    def ns(c, off, khz, t):
        return proto.skh_tick_clock_ns(ctypes.byref(c), (off + t * khz // 10**6) & mask)

    for _ in range(n):
        t_true += rng.randrange(1_000, max_gap)
        one_way, resp = rng.randrange(2_000, 20_000), rng.randrange(500, 50_000)
        t3, t5 = t_true + one_way, t_true + 2 * one_way + resp
        s2, s3 = ns(pc, p_off, p_khz, t_true), ns(rc_, r_off, r_khz, t3)
        s4, s5 = ns(rc_, r_off, r_khz, t3 + resp), ns(pc, p_off, p_khz, t5)
        out = Rtt()
        st = proto.skh_proto_rtt(
            t_true - 100, s2, TS_HW, s3, s4, TS_HW, s5, t5 + 100, ctypes.byref(out)
        )
        assert st == ST_OK and out.ts_source == TS_HW
        assert abs(out.rtt_ns - 2 * one_way) <= tick_bound
    # both counters wrapped (the narrow ones many times)
    assert t_true * min(p_khz, r_khz) // 10**6 > (mask - max(p_off, r_off)) % (mask + 1)
    if mask == NARROW:
        assert t_true * p_khz // 10**6 > 20 * (mask + 1)


def test_raw_ticks_without_conversion_are_not_ns(proto):
    """The failure the tick clock prevents: subtracting raw masked ticks across a wrap."""
    mask = (1 << 16) - 1
    t2, t5 = 0xFFF0, (0xFFF0 + 0x40) & mask
    out = Rtt()
    st = proto.skh_proto_rtt(0, t2, TS_HW, 100, 110, TS_HW, t5, 1000, ctypes.byref(out))
    assert st != ST_OK
