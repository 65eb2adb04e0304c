"""The engine on loopback with real sockets: RTTs, clock labels, outcomes, counters, matching."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from skh import _fastprobe as fp
from skh.errors import CapabilityError, EngineError, InvalidProbeSpec
from skh.probe import Engine, EngineStats, capabilities
from skh.records import PROBE_DTYPE, ProbeStatus, TsSource

sys.path.insert(0, str(Path(__file__).parent))
from skhe_helpers import assert_accounted, quiesce, wait_for  # noqa: E402


def probe_for(
    prober: Engine, dst_ep: int, port: int, n: int, interval_s: float = 0.002, host="127.0.0.1"
):
    before = prober.stats().decided
    prober.add_target(dst_ep, host, port, interval_s=interval_s, count=n)
    assert wait_for(lambda: prober.stats().decided - before >= n, timeout_s=10)
    rows = prober.drain()
    assert len(rows) == n
    return rows


def test_capabilities_and_stats_names():
    caps = capabilities()
    assert {"udp", "kernel_timestamps"} <= caps
    assert [f for f in EngineStats.__dataclass_fields__] == list(fp.stat_names())


def test_network_rtt_is_positive_sane_and_kernel_stamped(make_engine):
    responder = make_engine(endpoint_id=2)
    prober = make_engine(endpoint_id=1)
    responder.start()
    prober.start()
    t_before = time.time_ns()
    rows = probe_for(prober, 7, responder.local_port, 200)
    assert rows.dtype == PROBE_DTYPE
    ok = rows[rows["status"] == ProbeStatus.OK]
    why = (
        f"status {np.unique(rows['status'], return_counts=True)} "
        f"clock {np.unique(ok['ts_source'], return_counts=True)}\n"
        f"prober {prober.stats()}\nresponder {responder.stats()}"
    )
    # the one test that must fail when the engine produces no valid RTT at all
    assert len(ok) >= 0.95 * len(rows) > 0, why
    assert (ok["ts_source"] == TsSource.KERNEL).all(), why
    assert (rows["src_ep"] == 1).all() and (rows["dst_ep"] == 7).all()
    assert np.array_equal(np.sort(rows["seq"]), np.arange(len(rows)))
    assert (ok["rtt_ns"] > 0).all() and np.median(ok["rtt_ns"]) < 200_000, why  # loopback: µs
    assert (ok["responder_delay_ns"] >= 0).all() and (ok["prober_delay_ns"] >= 0).all(), ok
    assert (rows["t_wall_ns"] >= t_before).all() and (rows["t_wall_ns"] <= time.time_ns()).all()
    # network RTT excludes both hosts' scheduling; the app-level RTT includes it
    app = ok["rtt_ns"] + ok["responder_delay_ns"] + ok["prober_delay_ns"]
    assert np.median(app) > np.median(ok["rtt_ns"])
    for eng in (prober, responder):
        assert_accounted(quiesce(eng))
    assert responder.stats().probes_received == prober.stats().sent
    assert responder.stats().replies_sent == 2 * responder.stats().probes_received


def test_ipv6_loopback(make_engine):
    responder = make_engine(bind="::1")
    prober = make_engine(bind="::")
    responder.start(), prober.start()
    rows = probe_for(prober, 1, responder.local_port, 20, host="::1")
    assert (rows["status"] == ProbeStatus.OK).sum() >= 19


@pytest.mark.parametrize(
    ("prober_kernel", "responder_kernel"), [(False, True), (True, False), (False, False)]
)
def test_user_clock_fallback_is_labelled_user(make_engine, prober_kernel, responder_kernel):
    responder = make_engine(kernel_timestamps=responder_kernel)
    prober = make_engine(kernel_timestamps=prober_kernel)
    assert prober.kernel_timestamps is prober_kernel
    responder.start(), prober.start()
    rows = probe_for(prober, 1, responder.local_port, 30)
    ok = rows[rows["status"] == ProbeStatus.OK]
    assert len(ok) >= 28
    assert (ok["ts_source"] == TsSource.USER).all()
    assert (ok["rtt_ns"] > 0).all()
    if not responder_kernel:
        assert responder.stats().replies_user_stamps == responder.stats().probes_received


def test_nothing_listening_is_refused_not_lost(make_engine):
    dead = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # now nothing listens there: the kernel answers ICMP port unreachable
    prober = make_engine()
    prober.start()
    rows = probe_for(prober, 3, port, 10, interval_s=0.01)
    assert len(rows) >= 10
    assert (rows["status"] == ProbeStatus.REFUSED).all()
    assert (rows["rtt_ns"] == -1).all()
    s = prober.stats()
    assert s.icmp_errors == s.refused == len(rows)
    assert_accounted(s)


def test_silent_target_is_all_lost(make_engine):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # receives, never answers
    sink.bind(("127.0.0.1", 0))
    try:
        prober = make_engine(timeout_s=0.1)
        prober.start()
        rows = probe_for(prober, 4, sink.getsockname()[1], 20, interval_s=0.005)
    finally:
        sink.close()
    assert len(rows) >= 20
    assert (rows["status"] == ProbeStatus.LOST).all()
    assert (rows["rtt_ns"] == -1).all() and (rows["ts_source"] == TsSource.NONE).all()
    assert_accounted(prober.stats())


def test_ring_overflow_is_counted(make_engine):
    responder = make_engine()
    prober = make_engine(ring_records=8)
    responder.start(), prober.start()
    prober.add_target(1, "127.0.0.1", responder.local_port, interval_s=0.001)
    assert wait_for(lambda: prober.stats().ring_overflow >= 20)
    prober.remove_target(1)
    s = quiesce(prober)
    assert s.records == 8 and len(prober.drain()) == 8
    assert_accounted(s)
    # once drained the ring takes records again
    prober.add_target(1, "127.0.0.1", responder.local_port, interval_s=0.001)
    assert wait_for(lambda: prober.pending_records() > 0)


def test_responder_restart_changes_session_and_probing_recovers(make_engine):
    first = make_engine()
    first.start()
    port = first.local_port
    session = first.session
    prober = make_engine(timeout_s=0.2)
    prober.start()
    prober.add_target(1, "127.0.0.1", port, interval_s=0.01)
    assert wait_for(lambda: prober.stats().ok >= 10)
    first.close()
    assert wait_for(lambda: prober.stats().refused >= 5)
    second = make_engine(port=port)
    assert second.session != session
    second.start()
    ok_before = prober.stats().ok
    assert wait_for(lambda: prober.stats().ok >= ok_before + 10)
    prober.remove_target(1)
    # a probe the closing responder took but never answered is still waiting for its timeout
    assert_accounted(quiesce(prober))
    rows = prober.drain()
    assert {ProbeStatus.OK, ProbeStatus.REFUSED} <= set(rows["status"].tolist())
    # one sequence across the restart, every probe decided
    assert np.array_equal(np.sort(rows["seq"]), np.arange(len(rows)))


class FakeResponder:
    """A scripted responder in Python that answers the engine's probes however a test wants."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(2)
        self.port = self.sock.getsockname()[1]
        self.probes_seen = 0

    def next_probe(self):
        data, addr = self.sock.recvfrom(2048)
        self.probes_seen += 1
        return fp.proto_decode(data), addr

    def answer(self, probe, addr, *kinds, resp_session=99, session=None, receipts=None):
        """Sends the ACKs of ``kinds`` (2: ACK1, 3: ACK2); ``receipts`` = the set of tseqs of
        the probe's stream to claim as received (ACK1 then carries them)."""
        for kind in kinds:
            kw = dict(
                session=probe["session"] if session is None else session,
                seq=probe["seq"],
                path_id=probe["path_id"],
                t1=probe["t1"],
                resp_session=resp_session,
            )
            if kind == 3:
                kw.update(flags=1, ts_source=TsSource.USER, t3=1000, t4=1500)
            if kind == 2 and receipts is not None:
                q = probe["tseq"]
                span = min(q, 128)
                bits = sum(1 << i for i in range(span) if q - 1 - i in receipts)
                kw.update(flags=2, rcpt_span=span, rcpt_bits=bits)
            self.sock.sendto(fp.proto_encode(kind, **kw), addr)

    def close(self):
        self.sock.close()


def test_prober_drops_replays_late_and_unsolicited_acks(make_engine):
    fake = FakeResponder()
    try:
        prober = make_engine(timeout_s=0.3)
        prober.start()
        prober.add_target(5, "127.0.0.1", fake.port, interval_s=0.5)
        probe, addr = fake.next_probe()
        fake.answer(probe, addr, 2, 2, 3, 3)  # ACK1 twice, ACK2 twice: the copies are replays
        fake.answer(probe, addr, 2, session=probe["session"] ^ 1)  # another prober's session
        assert wait_for(
            lambda: prober.stats().drop_replay == 2 and prober.stats().drop_unsolicited == 1
        )
        probe2, addr = fake.next_probe()
        time.sleep(0.45)  # past the timeout: the probe is decided LOST first
        fake.answer(probe2, addr, 2, 3)
        assert wait_for(lambda: prober.stats().drop_late == 2)
        probe3, addr = fake.next_probe()
        fake.answer(probe3, addr, 2, resp_session=1)
        fake.answer(probe3, addr, 3, resp_session=2)  # ACK2 from another responder life: not paired
        assert wait_for(lambda: prober.stats().drop_unsolicited == 2)
        prober.remove_target(5)
        s = quiesce(prober, sent=fake.probes_seen)
    finally:
        fake.close()
    rows = prober.drain()
    by_seq = dict(zip(rows["seq"].tolist(), rows["status"].tolist(), strict=True))
    # seq 1: no answer in time, from a responder without receipts: direction unknown
    assert by_seq[0] == ProbeStatus.OK and by_seq[1] == ProbeStatus.LOST
    # seq 2: ACK1 arrived, ACK2 never paired: the request got there, an answer did not come back
    assert by_seq[2] == ProbeStatus.REPLY_LOST
    assert rows[rows["seq"] == 0]["rtt_ns"][0] > 0
    assert s.acks_received == 3
    assert_accounted(s)


def test_receipts_tell_which_direction_lost_a_probe(make_engine):
    """A responder that acknowledges what it received (receipts in ACK1) lets the prober tell a
    lost request from a lost reply; a probe that got one answer only is reply loss."""
    fake = FakeResponder()
    received: set[int] = set()
    # tseq -> (claim it arrived, ACKs sent back)
    script = {1: (False, ()), 2: (True, ()), 3: (True, (3,)), 4: (True, (2,))}
    try:
        prober = make_engine(timeout_s=0.2)
        prober.start()
        prober.add_target(5, "127.0.0.1", fake.port, interval_s=0.05, count=8)
        streams = set()
        for tseq in range(8):
            probe, addr = fake.next_probe()
            assert probe["tseq"] == tseq  # the probe asks for receipts of its stream
            streams.add(probe["stream"])
            arrived, kinds = script.get(probe["tseq"], (True, (2, 3)))
            if arrived:
                received.add(probe["tseq"])
            fake.answer(probe, addr, *kinds, receipts=received - {probe["tseq"]})
        s = quiesce(prober, sent=fake.probes_seen)
    finally:
        fake.close()
    assert len(streams) == 1 and 0 not in streams
    rows = prober.drain()
    by_seq = dict(zip(rows["seq"].tolist(), rows["status"].tolist(), strict=True))
    assert by_seq == {
        0: ProbeStatus.OK,
        1: ProbeStatus.REQUEST_LOST,  # a later ACK1 said it never arrived
        2: ProbeStatus.REPLY_LOST,  # a later ACK1 said it arrived, no answer came back
        3: ProbeStatus.REPLY_LOST,  # ACK2 only
        4: ProbeStatus.REPLY_LOST,  # ACK1 only
        5: ProbeStatus.OK,
        6: ProbeStatus.OK,
        7: ProbeStatus.OK,
    }, by_seq
    assert (s.request_lost, s.reply_lost, s.lost) == (1, 3, 0)
    assert_accounted(s)


@pytest.mark.parametrize(
    ("wait_s", "status"), [(0.0, ProbeStatus.LOST), (0.5, ProbeStatus.REQUEST_LOST)]
)
def test_a_record_may_wait_for_the_next_answer_to_learn_its_direction(make_engine, wait_s, status):
    """Probing slower than the timeout, the receipts that tell come with the next probe's answer:
    with direction_wait_s the record waits for them, without it the direction is unknown."""
    fake = FakeResponder()
    try:
        prober = make_engine(timeout_s=0.2, direction_wait_s=wait_s)
        prober.start()
        prober.add_target(5, "127.0.0.1", fake.port, interval_s=0.5, count=3)
        for tseq in range(3):
            probe, addr = fake.next_probe()
            if tseq != 1:  # probe 1 "never arrives"
                fake.answer(probe, addr, 2, 3, receipts={0, 1, 2} - {1, tseq})
        s = quiesce(prober, sent=fake.probes_seen)
    finally:
        fake.close()
    rows = prober.drain()
    assert dict(zip(rows["seq"].tolist(), rows["status"].tolist(), strict=True)) == {
        0: ProbeStatus.OK,
        1: status,
        2: ProbeStatus.OK,
    }
    assert_accounted(s)


def test_direction_nobody_can_tell_stays_lost(make_engine):
    """Probes whose later probes also go unanswered (the responder vanished) are LOST, and wait
    no longer than direction_wait_s past their timeout for an answer that could tell."""
    fake = FakeResponder()
    try:
        prober = make_engine(timeout_s=0.1, direction_wait_s=0.25)
        prober.start()
        prober.add_target(5, "127.0.0.1", fake.port, interval_s=0.02, count=6)
        for _ in range(2):
            probe, addr = fake.next_probe()
            fake.answer(probe, addr, 2, 3, receipts={0})
        t0 = time.monotonic()
        assert wait_for(lambda: prober.stats().decided >= 6, timeout_s=5)
        waited = time.monotonic() - t0
        s = quiesce(prober)
    finally:
        fake.close()
    rows = prober.drain()
    assert sorted(rows["status"].tolist()) == [ProbeStatus.OK] * 2 + [ProbeStatus.LOST] * 4
    # the last probe (sent ~0.1 s in) waits its timeout and then at most direction_wait_s
    assert waited < 0.1 + 0.1 + 0.25 + 0.2, waited
    assert s.awaiting_direction == 0
    assert_accounted(s)


@pytest.mark.parametrize("window_s", [0.0, 0.001])
def test_batch_window_sends_every_probe_and_aligns_targets(make_engine, window_s):
    responder = make_engine(endpoint_id=2)
    prober = make_engine(endpoint_id=1, batch_window_s=window_s)
    responder.start()
    prober.start()
    n, interval_s = 8, 0.03
    for dst in range(4):  # phases 4 ms apart: more than the window, so only alignment joins them
        prober.add_target(dst, "127.0.0.1", responder.local_port, interval_s=interval_s, count=n)
        time.sleep(0.004)
    assert wait_for(lambda: prober.stats().decided >= 4 * n, timeout_s=10)
    rows = prober.drain()
    assert len(rows) == 4 * n
    ok = rows[rows["status"] == ProbeStatus.OK]
    assert len(ok) >= 0.9 * len(rows), prober.stats()
    assert (ok["ts_source"] == TsSource.KERNEL).all()
    assert (ok["rtt_ns"] > 0).all() and np.median(ok["rtt_ns"]) < 200_000
    for dst in range(4):
        assert np.array_equal(np.sort(rows[rows["dst_ep"] == dst]["seq"]), np.arange(n))
    # after each target's first probe: send batches, told apart by gaps of over 2 ms (a batch's
    # probes leave µs apart, the phases are 4 ms apart)
    t = np.sort(rows[rows["seq"] > 0]["t_wall_ns"])
    batches = 1 + int((np.diff(t) > 2_000_000).sum())
    if window_s:
        assert batches <= n + 2, batches  # one per round: the targets share the interval's grid
    else:
        assert batches >= 2 * (n - 1), batches  # exact schedule: each target keeps its own phase
    assert_accounted(quiesce(prober))


def test_batch_window_validation(make_engine):
    with pytest.raises(InvalidProbeSpec, match="'batch_window_s' parameter of Engine"):
        make_engine(batch_window_s=-1e-3)
    with pytest.raises(InvalidProbeSpec, match="shorter than timeout_s"):
        make_engine(batch_window_s=1.0, timeout_s=1.0)


def test_idle_engine_sleeps(make_engine):
    eng = make_engine()
    eng.start()
    time.sleep(0.5)
    assert eng.stats().wakeups <= 3
    fake_port = make_engine().local_port  # never started: probes to it are simply lost
    eng.add_target(1, "127.0.0.1", fake_port, interval_s=0.05)
    time.sleep(0.5)
    s = eng.stats()
    # one wake per probe sent, per stamp/timeout event, never a spin
    assert s.wakeups <= 4 * s.sent + 5, s


def test_validation_messages(make_engine):
    with pytest.raises(
        InvalidProbeSpec, match="The 'port' parameter of Engine must be an int in the range"
    ):
        Engine(port=70000)
    with pytest.raises(InvalidProbeSpec, match="'transport'"):
        Engine(transport="tcp")
    with pytest.raises(InvalidProbeSpec, match="'bind'"):
        Engine(bind="localhost")
    with pytest.raises(InvalidProbeSpec, match="'timeout_s'"):
        Engine(timeout_s=0)
    eng = make_engine()
    with pytest.raises(InvalidProbeSpec, match="'interval_s' parameter of Engine.add_target"):
        eng.add_target(1, "127.0.0.1", 1, interval_s=float("nan"))
    with pytest.raises(InvalidProbeSpec, match="'host'"):
        eng.add_target(1, "no-such-host.invalid", 1, interval_s=1)
    with pytest.raises(InvalidProbeSpec, match="no target 42"):
        eng.remove_target(42)
    with pytest.raises(ValueError):  # InvalidProbeSpec is also a ValueError
        eng.drain(-1)


def test_capability_errors():
    if "verbs" not in capabilities():
        with pytest.raises(CapabilityError):
            Engine(transport="verbs")
    with pytest.raises(CapabilityError):  # loopback has no NIC clock
        Engine(bind="127.0.0.1", hw_timestamps=True, device="lo")


def test_bind_conflict_and_close_are_clean(make_engine):
    a = make_engine()
    with pytest.raises(EngineError) as info:
        Engine(bind="127.0.0.1", port=a.local_port)
    assert info.value.errno == errno.EADDRINUSE
    a.start()
    a.stop()
    a.stop()
    a.start()
    a.close()
    a.close()
    assert a.closed
    with pytest.raises(EngineError):
        a.drain()
    with Engine(bind="127.0.0.1") as b:
        assert not b.closed
    assert b.closed


def test_in_flight_limit_holds_probes_back_without_spinning(make_engine):
    sink = socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM
    )  # never answers: every probe waits its timeout
    sink.bind(("127.0.0.1", 0))
    try:
        eng = make_engine(timeout_s=0.2, max_in_flight=4)
        eng.start()
        eng.add_target(1, "127.0.0.1", sink.getsockname()[1], interval_s=0.001)
        peak = 0
        deadline = time.monotonic() + 0.7
        while time.monotonic() < deadline:
            peak = max(peak, eng.stats().in_flight)
            time.sleep(0.005)
        eng.remove_target(1)
        s = quiesce(eng)
    finally:
        sink.close()
    assert 0 < peak <= 4
    assert s.sent <= 4 * (0.7 / 0.2 + 2) and s.inflight_full > 0
    assert s.wakeups < 100, s  # held-back probes wait for the timeout, they do not poll for it
    assert_accounted(s)
    with pytest.raises(InvalidProbeSpec, match="max_in_flight"):
        Engine(max_in_flight=0)


def test_a_small_answer_table_still_answers_every_probe_of_a_burst(make_engine):
    """A responder with 64 answer slots (the overlay agent sizes them to its share of the rate)
    gets bursts of 300 probes at once: each is answered twice, the oldest waiters giving up
    their send stamp, and every probe is decided OK."""
    b = make_engine(answer_slots=64, batch_window_s=0.0)
    a = make_engine(timeout_s=0.5, batch_window_s=0.01)
    b.start()
    a.start()
    for dst in range(300):
        a.add_target(dst, "127.0.0.1", b.local_port, interval_s=0.2, count=3)
    time.sleep(1.2)
    s = quiesce(a)
    assert s.sent == 900 and s.ok == 900, s
    assert b.stats().probes_received == 900
    assert_accounted(s)
    with pytest.raises(InvalidProbeSpec, match="answer_slots"):
        Engine(answer_slots=fp.MAX_ANSWER_SLOTS + 1)


def test_probe_size_is_configurable_and_replies_stay_small(make_engine):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2)
    try:
        prober = make_engine(probe_bytes=1000)
        prober.start()
        prober.add_target(1, "127.0.0.1", sink.getsockname()[1], interval_s=1, count=1)
        data, _ = sink.recvfrom(4096)
    finally:
        sink.close()
    assert len(data) == 1000 and fp.proto_decode(data)["type"] == 1
    responder = make_engine()
    responder.start()
    rows = probe_for(prober, 2, responder.local_port, 5)
    assert (rows["status"] == ProbeStatus.OK).all()
    s = responder.stats()
    assert s.probes_received == 5 and s.replies_sent == 10


def test_each_path_id_gets_its_own_stable_source_port(make_engine):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2)
    prober = make_engine()
    prober.start()
    try:
        for dst_ep, path_id in ((1, 0), (2, 5), (3, 9)):
            prober.add_target(
                dst_ep,
                "127.0.0.1",
                sink.getsockname()[1],
                interval_s=0.02,
                path_id=path_id,
                count=3,
            )
        ports: dict[int, set[int]] = {}
        for _ in range(9):
            data, (_, sport) = sink.recvfrom(4096)
            ports.setdefault(fp.proto_decode(data)["path_id"], set()).add(sport)
    finally:
        sink.close()
    # one source port per path (ECMP hashes the 5-tuple), the same for every probe of that path
    assert sorted(ports) == [0, 5, 9] and all(len(p) == 1 for p in ports.values())
    assert ports[0] == {prober.local_port}
    assert len(set().union(*ports.values())) == 3

    responder = make_engine()
    responder.start()
    for path_id in (0, 5, 9, 12):
        prober.add_target(
            10 + path_id,
            "127.0.0.1",
            responder.local_port,
            interval_s=0.005,
            path_id=path_id,
            count=10,
        )
    assert wait_for(lambda: prober.stats().ok >= 40)
    rows = prober.drain()
    rows = rows[rows["dst_ep"] >= 10]
    assert sorted(set(rows["path_id"].tolist())) == [0, 5, 9, 12]
    assert (rows["status"] == ProbeStatus.OK).all()
    assert (rows["ts_source"] == TsSource.KERNEL).all()  # send stamps matched on every path socket
    assert (rows["path_id"] == rows["dst_ep"] - 10).all()
    assert_accounted(quiesce(prober))


def test_path_sockets_are_bounded(make_engine):
    eng = make_engine()
    for path_id in range(1, 64):
        eng.add_target(path_id, "127.0.0.1", 9, interval_s=10, path_id=path_id)
    with pytest.raises(EngineError) as info:
        eng.add_target(64, "127.0.0.1", 9, interval_s=10, path_id=64)
    assert info.value.errno == errno.ENOSPC
    eng.add_target(65, "127.0.0.1", 9, interval_s=10, path_id=7)  # an existing path is reused


def test_a_target_rotates_over_its_paths_one_probe_each(make_engine):
    """``paths`` rotates a target's probes over consecutive path ids: probe k on
    path_id + k % paths, each path id on its own source port (its own ECMP path), echoed in the
    records; re-adding the target keeps its sequence, so the rotation goes on where it was."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2)
    prober = make_engine()
    prober.start()
    try:
        prober.add_target(
            1, "127.0.0.1", sink.getsockname()[1], interval_s=0.01, path_id=3, paths=4, count=8
        )
        seen = []
        for _ in range(8):
            data, (_, sport) = sink.recvfrom(4096)
            m = fp.proto_decode(data)
            seen.append((m["tseq"], m["path_id"], sport))
    finally:
        sink.close()
    seen.sort()
    assert [p for _, p, _ in seen] == [3, 4, 5, 6, 3, 4, 5, 6]
    by_path = {p: {s for _, q, s in seen if q == p} for p in (3, 4, 5, 6)}
    assert all(len(s) == 1 for s in by_path.values())
    assert len(set().union(*by_path.values())) == 4  # four source ports: four 5-tuples

    responder = make_engine()
    responder.start()
    prober.add_target(7, "127.0.0.1", responder.local_port, interval_s=0.004, paths=5)
    assert wait_for(lambda: prober.stats().ok >= 7)
    prober.add_target(7, "127.0.0.1", responder.local_port, interval_s=0.004, paths=5)
    assert wait_for(lambda: prober.stats().ok >= 15)
    prober.remove_target(7)
    quiesce(prober)
    rows = prober.drain()
    rows = np.sort(rows[rows["dst_ep"] == 7], order="seq")
    assert (rows["status"] == ProbeStatus.OK).all() and len(rows) >= 15
    assert rows["seq"].tolist() == list(range(len(rows)))  # one sequence, one receipt stream
    assert rows["path_id"].tolist() == [k % 5 for k in range(len(rows))]
    assert (rows["ts_source"] == TsSource.KERNEL).all()
    assert_accounted(quiesce(prober))


def test_path_rotation_validation_and_the_socket_bound(make_engine):
    eng = make_engine()
    with pytest.raises(InvalidProbeSpec, match="paths"):
        eng.add_target(1, "127.0.0.1", 9, interval_s=1, paths=0)
    with pytest.raises(InvalidProbeSpec, match="paths"):
        eng.add_target(1, "127.0.0.1", 9, interval_s=1, path_id=65530, paths=7)
    eng.add_target(1, "127.0.0.1", 9, interval_s=10, paths=64)  # path 0 + 63 path sockets
    with pytest.raises(EngineError) as info:  # a 65th path id: all or nothing
        eng.add_target(2, "127.0.0.1", 9, interval_s=10, path_id=60, paths=5)
    assert info.value.errno == errno.ENOSPC
    eng.add_target(2, "127.0.0.1", 9, interval_s=10, path_id=10, paths=20)  # reuses sockets


def _recv_tos(sock: socket.socket) -> tuple[bytes, int]:
    data, anc, _, _ = sock.recvmsg(2048, 64)
    tos = [d[0] for level, kind, d in anc if level == socket.IPPROTO_IP and kind == socket.IP_TOS]
    return data, tos[0] if tos else -1


def test_probes_carry_the_traffic_class_and_replies_keep_the_probes_dscp(make_engine):
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    sink.settimeout(2)
    try:
        # DSCP 26 (the usual RoCE class) with ECT(0), priority 3
        prober = make_engine(traffic_class=26 << 2 | 2, priority=3)
        prober.start()
        prober.add_target(1, "127.0.0.1", sink.getsockname()[1], interval_s=1, count=1, path_id=4)
        data, tos = _recv_tos(sink)
        assert fp.proto_decode(data)["path_id"] == 4 and tos == 106  # a path socket too
    finally:
        sink.close()

    responder = make_engine(traffic_class=1)  # its own ECN bits: ECT(1)
    responder.start()
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 46 << 2)  # EF
    peer.settimeout(2)
    try:
        peer.sendto(fp.proto_encode(1, session=5, seq=1, t1=9), ("127.0.0.1", responder.local_port))
        tos = {fp.proto_decode(d)["type"]: t for d, t in (_recv_tos(peer), _recv_tos(peer))}
    finally:
        peer.close()
    assert tos == {2: 46 << 2 | 1, 3: 46 << 2 | 1}  # both replies: the probe's DSCP, our ECN


def test_traffic_class_validation():
    with pytest.raises(InvalidProbeSpec, match="'traffic_class'"):
        Engine(traffic_class=256)
    with pytest.raises(InvalidProbeSpec, match="'priority'"):
        Engine(priority=8)


def test_agent_config_sets_the_engines_traffic_class():
    from skh.errors import ConfigError
    from skh.orchestrator.agent_overlay import default_engine_factory
    from skh.orchestrator.config import EndpointSpec, load_config

    cfg = load_config(None, {"agent.traffic_class": 104, "agent.priority": 3})
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    sink.settimeout(2)
    eng = default_engine_factory(EndpointSpec(rail=0, ip="127.0.0.1"), cfg.agent)
    try:
        assert (eng.traffic_class, eng.priority) == (104, 3)
        eng.start()
        eng.add_target(1, "127.0.0.1", sink.getsockname()[1], interval_s=1, count=1)
        assert _recv_tos(sink)[1] == 104
    finally:
        eng.close()
        sink.close()
    with pytest.raises(ConfigError, match="agent.traffic_class"):
        load_config(None, {"agent.traffic_class": 300})


def test_a_probe_that_asks_for_no_rtt_gets_one_answer_and_no_send_stamps(make_engine):
    """Sampling periods of 0.1 s over probes 10 ms apart on one path id: the first probe of
    each period is its latency sample and asks for an RTT as before (two answers, send stamps
    on both sides); the others carry SKH_POPT_NO_T34 and get ACK1 alone, neither side stamps
    their sends, and their records are OK without an RTT."""
    period_ns = 100_000_000
    phase = time.time_ns() % period_ns
    responder = make_engine(endpoint_id=2)
    prober = make_engine(endpoint_id=1)
    responder.start()
    prober.start()
    prober.add_target(
        7,
        "127.0.0.1",
        responder.local_port,
        interval_s=0.01,
        count=40,
        sample_period_s=period_ns / 1e9,
        sample_phase_ns=phase,
    )
    assert wait_for(lambda: prober.stats().decided >= 40, timeout_s=10)
    rows = np.sort(prober.drain(), order="seq")
    ps, rs = quiesce(prober), quiesce(responder)
    why = f"prober {ps}\nresponder {rs}"
    assert len(rows) == 40 and (rows["status"] == ProbeStatus.OK).all(), why
    slot = (rows["t_wall_ns"].astype(np.int64) - phase) // period_ns
    asked = np.r_[True, slot[1:] != slot[:-1]]  # each period's first probe
    assert (rows["rtt_ns"][asked] > 0).all(), rows[asked]
    assert (rows["ts_source"][asked] == TsSource.KERNEL).all(), rows[asked]
    for f in ("rtt_ns", "responder_delay_ns", "prober_delay_ns"):
        assert (rows[f][~asked] == -1).all(), rows[~asked]
    assert (rows["ts_source"][~asked] == TsSource.NONE).all()
    k = int(asked.sum())
    assert 4 <= k <= 6, rows  # 40 probes 10 ms apart span four or five periods
    assert ps.probes_no_rtt == 40 - k, why
    assert ps.acks_received == 40 + k, why  # ACK1 for each, ACK2 for those that asked
    assert ps.tx_stamps == k and rs.tx_stamps == k, why
    assert ps.drop_replay == ps.drop_unsolicited == ps.drop_late == 0, why
    assert_accounted(ps)


def test_the_no_rtt_option_is_on_the_wire_only_where_asked_and_old_answers_are_dropped(
    make_engine,
):
    """The option rides in the PROBE's padding (bytes 64..71), which responders before it never
    read; an older responder's ACK2 to a probe done at ACK1 is dropped as a replay, the record
    stays OK without an RTT."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(2)
    prober = make_engine(timeout_s=0.5)
    prober.start()
    try:
        # a period that began 50 ms ago: probe 0 is its sample and asks; once it is answered,
        # probes 1..3 (the same period, their predecessor answered) ask for no RTT
        prober.add_target(
            1,
            "127.0.0.1",
            sink.getsockname()[1],
            interval_s=0.02,
            count=4,
            sample_period_s=1.0,
            sample_phase_ns=(time.time_ns() - 50_000_000) % 1_000_000_000,
        )
        seen = []
        for _ in range(4):
            data, src = sink.recvfrom(4096)
            m = fp.proto_decode(data)
            seen.append((m["tseq"], m["popts"]))
            # an answer as a version-1 responder gives: ACK1, then ACK2 (user-clock stamps, 1 us
            # apart) whatever was asked
            for typ, kw in (
                (2, {}),
                (3, {"flags": 1, "ts_source": 1, "t3": 10**9, "t4": 10**9 + 1000}),
            ):
                sink.sendto(
                    fp.proto_encode(
                        typ,
                        session=m["session"],
                        seq=m["seq"],
                        path_id=m["path_id"],
                        resp_session=99,
                        t1=m["t1"],
                        **kw,
                    ),
                    src,
                )
    finally:
        sink.close()
    assert sorted(seen) == [(0, 0), (1, 1), (2, 1), (3, 1)]
    s = quiesce(prober)
    rows = np.sort(prober.drain(), order="seq")
    assert (rows["status"] == ProbeStatus.OK).all(), rows
    assert rows["rtt_ns"][0] > 0 and (rows["rtt_ns"][1:] == -1).all(), rows
    assert s.drop_replay == 3, s  # the ACK2s to the probes that asked for no RTT


def test_after_an_unanswered_probe_every_probe_asks_until_one_is_answered(make_engine):
    """A responder process stalls (SIGSTOP) after its period's sample was taken: probes time
    out, then the ones it answers when it wakes end the run. Those were sent while their
    predecessor had no answer, so they asked for an RTT although their period had its sample:
    the OK that ends the run carries the responder's delay, the fast path's evidence that the
    responder stalled, not the network (skh.analysis.fastpath, stall_evidence_ms)."""
    import signal

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "skh", "respond", "--bind", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        prober = make_engine(endpoint_id=1, timeout_s=0.4)
        prober.start()
        deadline = time.monotonic() + 20
        tries = 1
        while probe_for(prober, 4, port, 1)["status"][0] != ProbeStatus.OK:
            assert time.monotonic() < deadline, "the responder never came up"
            time.sleep(0.1)
            tries += 1
        period_ns = 2_000_000_000
        prober.add_target(
            5,
            "127.0.0.1",
            port,
            interval_s=0.05,
            count=30,
            sample_period_s=period_ns / 1e9,
            sample_phase_ns=time.time_ns() % period_ns,  # a period begins now
        )
        time.sleep(0.1)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.7)
        proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: prober.stats().decided >= 30 + tries, timeout_s=10)
    finally:
        proc.kill()
        proc.wait()
    rows = np.sort(prober.drain(), order="seq")
    rows = rows[rows["dst_ep"] == 5]
    st = rows["status"]
    lost = np.flatnonzero(st != ProbeStatus.OK)
    assert lost.size >= 2, rows  # the stall outlasted some probes' timeout
    ender = lost[-1] + 1
    assert st[ender] == ProbeStatus.OK, rows
    assert rows["responder_delay_ns"][ender] >= 100_000_000, rows[ender - 1 : ender + 2]
    # once answers flow again, the period (2 s: all 30 probes) had its sample: none asks
    assert (rows["rtt_ns"][-5:] == -1).all(), rows[-5:]


@pytest.mark.parametrize(("interval_s", "paths"), [(0.1, 8), (0.18, 45), (0.05, 19)])
def test_the_probes_that_ask_for_rtts_are_the_samples_the_thinner_takes(
    make_engine, interval_s, paths
):
    """The engine mirrors the latency-sample rule (skh.analysis.sampling.period_samples) to
    choose which probes ask for an RTT. Proof on real records: the agent's thinner keeps the
    same rows from them as from the same records with an RTT on every OK, so no sample it
    would take lacks an RTT, and it takes one per pair and period, walking the path ids."""
    from collections import Counter

    from skh.analysis.rowthin import RowThinner, sample_phase_ns
    from skh.layout import PROBE_STRUCT

    period_ns = 1_000_000_000
    responder = make_engine(endpoint_id=2)
    prober = make_engine(endpoint_id=1, tick_s=0.005)
    responder.start()
    prober.start()
    for d in range(10, 14):
        prober.add_target(
            d,
            "127.0.0.1",
            responder.local_port,
            interval_s=interval_s,
            paths=paths,
            sample_period_s=1.0,
            sample_phase_ns=sample_phase_ns(1 << 32 | d, period_ns),
        )
    time.sleep(5.0)
    for d in range(10, 14):  # no probe in flight while the counters and the records are read
        prober.remove_target(d)
    ps = quiesce(prober)
    rows = [(1, *r[1:]) for r in PROBE_STRUCT.iter_unpack(prober.drain_packed())]
    ok = [r for r in rows if r[4] == ProbeStatus.OK]
    assert len(ok) >= 0.9 * len(rows) > 0, ps
    every = [r[:7] + (1000,) + r[8:] if r[4] == ProbeStatus.OK else r for r in rows]
    kept = RowThinner(1.0).thin(rows)
    assert [(r[1], r[2]) for r in kept] == [(r[1], r[2]) for r in RowThinner(1.0).thin(every)]
    samples = [r for r in kept if r[4] == ProbeStatus.OK and r[7] > 0]
    per = Counter(
        (r[1], (r[6] - sample_phase_ns(1 << 32 | r[1], period_ns)) // period_ns) for r in samples
    )
    assert set(per.values()) == {1}
    assert len(per) >= 4 * 4  # four pairs, ~5 s
    # every sample asked (the thinner kept the same rows); a probe sent before its predecessor's
    # answer came (a loaded machine) asks too, so a few more may have
    asked = sum(r[7] > 0 for r in ok)
    assert len(samples) <= asked <= len(samples) + max(2, len(ok) // 20)
    assert ps.probes_no_rtt == len(rows) - asked
    assert len({r[3] for r in samples}) >= min(paths, len(samples) // 4)
