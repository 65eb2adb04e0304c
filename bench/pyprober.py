"""The plain-Python UDP prober: the baseline bench/probe_overhead.py puts next to the C engine.

It speaks the engine's wire format (csrc/proto.h) to a real ``skh respond``: one socket, one
``sendto`` per probe and one ``recvmsg`` per reply. By default it does the engine's work too: kernel
stamps (SO_TIMESTAMPING; T2 from the error queue, T5 from the receive cmsg) and the network RTT
(T5-T2)-(T4-T3) from ACK2's stamps; ``--no-timestamps`` leaves that out (app-level RTT only).
Two modes: ``window`` keeps N probes in flight (saturation), ``paced`` sends at a fixed rate
(``--burst`` probes together per round, as a ping list walked at once) and sleeps in ``poll`` in
between.

    python bench/pyprober.py --host 127.0.0.1 --port 7471 --mode window --duration 2
prints one JSON object (probes, answered, cpu_s, wall_s, rss_mb, app_rtt_us p50/p99).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import struct
import time

from _proc import _cpu_s, _rss_mb

SO_TIMESTAMPING = 37  # x86-64 / arm64 value; Python 3.11 has no constant (rdma-probing.md §3.3)
TS_FLAGS = (
    (1 << 1) | (1 << 3) | (1 << 4) | (1 << 7) | (1 << 11)
)  # TX_SW|RX_SW|SOFTWARE|OPT_ID|TSONLY
TIMESPEC3 = struct.Struct("qqqqqq")
EE = struct.Struct("IBBBBII")  # struct sock_extended_err
SO_EE_ORIGIN_TIMESTAMPING = 4

HDR = struct.Struct(">IBBBBIIHHIQQQ")
MAGIC, VERSION, PROBE, ACK1, ACK2 = 0x534B4850, 1, 1, 2, 3
PROBE_LEN = 96
PAD = bytes(PROBE_LEN - HDR.size)


def _stamp(ancdata) -> int:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= TIMESPEC3.size:
            sec, nsec = TIMESPEC3.unpack_from(data)[:2]
            return sec * 1_000_000_000 + nsec
    return 0


def run(
    host: str,
    port: int,
    mode: str,
    duration_s: float,
    warmup_s: float,
    window: int,
    rate_pps: float,
    timeout_s: float = 1.0,
    timestamps: bool = True,
    burst: int = 1,
) -> dict:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setblocking(False)
    if timestamps:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TS_FLAGS)
    tx_key = 0  # OPT_ID: the kernel numbers stamped datagrams from 0
    by_key: dict[int, int] = {}
    net_rtts: list[int] = []
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    dst = (host, port)
    session = random.getrandbits(32) or 1
    seq = 0
    inflight: dict[int, list] = {}  # seq -> [t1, acks seen, t2, t5, t3, t4]
    rtts: list[int] = []
    sent = answered = 0
    # paced: a list of `burst` targets walked once per round, as an agent probes its ping list
    interval = burst / rate_pps if rate_pps > 0 else 0.0
    start = time.monotonic()
    measure_from = start + warmup_s
    end = measure_from + duration_s
    cpu0 = None
    next_due = start

    def send_one() -> None:
        nonlocal seq, sent, tx_key
        t1 = time.monotonic_ns()
        sock.sendto(
            HDR.pack(MAGIC, VERSION, PROBE, 0, 0, session, seq, 0, 0, 0, t1, 0, 0) + PAD, dst
        )
        inflight[seq] = [t1, 0, 0, 0, 0, 0]
        if timestamps:
            by_key[tx_key] = seq
            tx_key += 1
        seq = (seq + 1) & 0xFFFFFFFF
        sent += 1

    def done(s: int, entry: list) -> None:
        nonlocal answered
        rtts.append(time.monotonic_ns() - entry[0])
        if entry[2] and entry[3] and entry[5]:
            net_rtts.append((entry[3] - entry[2]) - (entry[5] - entry[4]))
        answered += 1
        del inflight[s]

    while True:
        now = time.monotonic()
        if cpu0 is None and now >= measure_from:
            cpu0, sent, answered, rtts, net_rtts = _cpu_s(), 0, 0, [], []
            measure_from = now
        if now >= end:
            break
        if mode == "window":
            while len(inflight) < window:
                send_one()
            wait = 0.2
        else:
            while next_due <= now:
                for _ in range(burst):
                    send_one()
                next_due += interval
            wait = max(0.0, next_due - time.monotonic())
        events = poller.poll(wait * 1000)
        if events and events[0][1] & select.POLLERR:
            while True:  # send stamps (T2)
                try:
                    _, anc, _, _ = sock.recvmsg(64, 512, socket.MSG_ERRQUEUE)
                except BlockingIOError:
                    break
                for _level, kind, data in anc:
                    if kind != SO_TIMESTAMPING and len(data) >= EE.size:
                        _err, origin, _t, _c, _p, _info, key = EE.unpack_from(data)
                        s = by_key.pop(key, None) if origin == SO_EE_ORIGIN_TIMESTAMPING else None
                        entry = inflight.get(s) if s is not None else None
                        if entry is not None:
                            entry[2] = _stamp(anc)
                            if entry[1] == 2:
                                done(s, entry)
        if events:
            while True:
                try:
                    data, anc, _, _ = sock.recvmsg(2048, 512)
                except BlockingIOError:
                    break
                except ConnectionRefusedError:
                    continue
                if len(data) < HDR.size:
                    continue
                magic, ver, typ, _f, _ts, sess, s, _p, _r, _rs, _t1, t3, t4 = HDR.unpack_from(data)
                if magic != MAGIC or ver != VERSION or sess != session or typ not in (ACK1, ACK2):
                    continue
                entry = inflight.get(s)
                if entry is None:
                    continue
                entry[1] += 1
                if typ == ACK1:
                    entry[3] = _stamp(anc)
                else:
                    entry[4], entry[5] = t3, t4
                if entry[1] == 2 and (entry[2] or not timestamps):
                    done(s, entry)
        if len(inflight) > 4 * window + 1024 or mode == "window":
            horizon = time.monotonic_ns() - int(timeout_s * 1e9)
            for s in [s for s, e in inflight.items() if e[0] < horizon]:
                del inflight[s]
            if len(by_key) > 4 * window + 1024:
                by_key.clear()
    cpu = _cpu_s() - (cpu0 or 0.0)
    wall = time.monotonic() - measure_from
    rtts.sort()
    net_rtts.sort()

    def pct(a: list[int], q: float) -> float | None:
        return a[min(len(a) - 1, int(q * len(a)))] / 1e3 if a else None

    return {
        "probes": sent,
        "answered": answered,
        "cpu_s": cpu,
        "wall_s": wall,
        "rss_mb": _rss_mb(),
        "app_rtt_us": {"p50": pct(rtts, 0.5), "p99": pct(rtts, 0.99)},
        "net_rtt_us": {"p50": pct(net_rtts, 0.5), "p99": pct(net_rtts, 0.99)},
        "timestamps": timestamps,
        "pid": os.getpid(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=("window", "paced"), default="window")
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1000.0, help="probes/s in paced mode")
    ap.add_argument("--burst", type=int, default=1, help="paced: probes sent together per round")
    ap.add_argument(
        "--no-timestamps",
        action="store_true",
        help="user clock only: no kernel stamps, no network RTT",
    )
    args = ap.parse_args()
    print(
        json.dumps(
            run(
                args.host,
                args.port,
                args.mode,
                args.duration,
                args.warmup,
                args.window,
                args.rate,
                timestamps=not args.no_timestamps,
                burst=args.burst,
            )
        )
    )


if __name__ == "__main__":
    main()
