"""≥ 100k malformed datagrams thrown at a responder and at a prober: no crash, every one counted,
nothing answered but valid probes, no reply larger than what it answers."""

from __future__ import annotations

import socket
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from skh import _fastprobe as fp
from skh.probe import Engine
from skh.records import ProbeStatus

sys.path.insert(0, str(Path(__file__).parent))
from skhe_helpers import assert_accounted, quiesce, wait_for  # noqa: E402

N_PER_ENGINE = 60_000
CHUNK = 64  # datagrams in flight at once: well inside any receive buffer
DROP_NAMES = [
    "drop_truncated",
    "drop_bad_magic",
    "drop_bad_version",
    "drop_bad_type",
    "drop_malformed",
]


def malformed(rng: np.random.Generator, session: int, n: int) -> list[bytes]:
    """Random bytes, truncations, single-byte and bit mutations of valid messages, and valid ACKs
    for sessions/seqs nobody sent (seeded: a failure reproduces)."""
    out: list[bytes] = []
    for _ in range(n):
        kind = rng.integers(0, 5)
        type_ = int(rng.integers(1, 4))
        sess = session if rng.random() < 0.5 else int(rng.integers(0, 2**32))
        kw = dict(session=sess, seq=int(rng.integers(0, 2**32)), t1=int(rng.integers(0, 2**63)))
        if type_ == 3 and rng.random() < 0.5:
            kw.update(flags=1, ts_source=2, t3=5, t4=9)
        valid = fp.proto_encode(type_, **kw, probe_len=int(rng.integers(96, 300)))
        if kind == 0:
            out.append(rng.bytes(int(rng.integers(0, 1600))))
        elif kind == 1:
            out.append(valid[: int(rng.integers(0, len(valid)))])
        elif kind == 2:
            b = bytearray(valid)
            b[int(rng.integers(0, 48))] = int(rng.integers(0, 256))
            out.append(bytes(b))
        elif kind == 3:
            b = bytearray(valid)
            pos = int(rng.integers(0, 48 * 8))
            b[pos // 8] ^= 1 << (pos % 8)
            out.append(bytes(b))
        else:
            out.append(valid + rng.bytes(int(rng.integers(0, 2000))))  # oversized
    return out


def expected_class(data: bytes) -> str:
    """What the engine must count a datagram as (the decoder is unit-tested separately)."""
    if len(data) > fp.PROBE_MAX_LEN:
        return "drop_truncated"
    got = fp.proto_decode(data)
    if isinstance(got, int):
        return DROP_NAMES[-got - 1]
    return "probe" if got["type"] == 1 else "ack"


def blast(sock: socket.socket, port: int, packets: list[bytes], received) -> list[bytes]:
    """Sends in chunks and waits until the engine has read each chunk, so the kernel drops none;
    returns the replies that came back meanwhile."""
    base = received()
    replies: list[bytes] = []
    for i in range(0, len(packets), CHUNK):
        for p in packets[i : i + CHUNK]:
            sock.sendto(p, ("127.0.0.1", port))
        want = base + min(i + CHUNK, len(packets))
        ok = wait_for(lambda want=want: received() >= want, timeout_s=10, step_s=0.001)
        assert ok, (received(), want)
        replies += drain_socket(sock)
    return replies


def drain_socket(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(4096, socket.MSG_DONTWAIT))
        except BlockingIOError:
            return got


def fuzz(eng: Engine, fuzzer: socket.socket, packets: list[bytes]) -> tuple[Counter, list[bytes]]:
    """Throws packets at eng; checks each drop reason counted exactly; returns the expected classes
    and every reply that came back."""
    want = Counter(expected_class(p) for p in packets)
    before = eng.stats()
    replies = blast(fuzzer, eng.local_port, packets, lambda: eng.stats().received)

    def drops() -> dict[str, int]:
        now = eng.stats()
        return {n: getattr(now, n) - getattr(before, n) for n in DROP_NAMES}

    # the live probe stream also counts as received, so wait for the garbage itself
    wait_for(lambda: drops() == {n: want[n] for n in DROP_NAMES})
    assert drops() == {n: want[n] for n in DROP_NAMES}
    if want["probe"]:
        wait_for(lambda: replies.extend(drain_socket(fuzzer)) or len(replies) >= 2 * want["probe"])
    return want, replies


def test_fuzz_responder_and_prober(make_engine):
    rng = np.random.default_rng(20261129)
    responder = make_engine(endpoint_id=2)
    prober = make_engine(endpoint_id=1, timeout_s=0.2)
    responder.start(), prober.start()
    # a live probe stream keeps running through the storm
    prober.add_target(2, "127.0.0.1", responder.local_port, interval_s=0.005)
    fuzzer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fuzzer.bind(("127.0.0.1", 0))
    try:
        packets = malformed(rng, responder.session, N_PER_ENGINE)
        before = responder.stats()
        want, replies = fuzz(responder, fuzzer, packets)
        after = responder.stats()
        assert after.probes_received - before.probes_received >= want["probe"]
        assert after.acks_received == 0  # a pure responder matches no ACK
        # two ACKs per valid probe, nothing for garbage, and never more bytes than asked
        assert len(replies) == 2 * want["probe"], (len(replies), want, responder.stats())
        assert all(len(r) == fp.ACK_LEN for r in replies)
        valid_probe_bytes = sum(len(p) for p in packets if expected_class(p) == "probe")
        assert sum(map(len, replies)) <= valid_probe_bytes

        packets2 = malformed(rng, prober.session, N_PER_ENGINE)
        before = prober.stats()
        fuzz(prober, fuzzer, packets2)
        after = prober.stats()
        # the fuzzed ACKs never match a probe (random t1): only the live stream's replies are taken
        assert after.acks_received - before.acks_received <= 2 * (after.sent - before.sent) + 4
        assert len(packets) + len(packets2) >= 100_000
    finally:
        fuzzer.close()
    prober.remove_target(2)
    for eng in (prober, responder):
        assert_accounted(quiesce(eng))
    rows = prober.drain()
    # the real stream survived the storm
    assert (rows["status"] == ProbeStatus.OK).sum() > 0.9 * len(rows) > 0
