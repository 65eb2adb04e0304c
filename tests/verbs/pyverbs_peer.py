"""An independent peer of the engine's wire protocol, on pyverbs (rdma-core's Python binding).

Runs under the system Python (/usr/bin/python3, where Debian's python3-pyverbs lives), not the
project's venv, and imports nothing of skh: the header layout, the receipts and the GRH are read
from csrc/proto.h's documentation and written here again, so tests/verbs/test_pyverbs_interop.py
checks the engine against code that does not share its bugs.

    python3 pyverbs_peer.py respond --device rxe1 --gid-index 1 --duration 30 \\
        [--skip-every K] [--mute-every M]
    python3 pyverbs_peer.py probe --device rxe0 --gid-index 1 --gid G --qpn Q -n N \\
        [--interval S] [--omit 3,4,9]

respond: answers PROBEs with ACK1 (+ receipts when asked) and ACK2 (user-clock t3/t4) until
SIGTERM or --duration; every K-th probe of a stream (tseq % K == K-1) is ignored as if it never
arrived, every M-th is taken but not answered (a lost reply). Prints its GID/QPN on stderr, then
at exit a JSON object (what it did with each probe) on stdout.
probe: sends n probes asking for receipts (leaving out the tseqs of --omit), takes the answers,
prints a JSON object (answers, RTTs from the peer's t3/t4, receipts seen).
A failure of pyverbs itself (no device, no provider) exits 3 with pyverbs' own message.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import struct
import sys
import time

HDR = struct.Struct(">IBBBBIIHHIQQQ")
RCPT = struct.Struct(">IIII")
MAGIC, VERSION, PROBE, ACK1, ACK2 = 0x534B4850, 1, 1, 2, 3
RCPT_MAGIC = 0x52435054
F_T34, F_RCPT = 0x01, 0x02
TS_USER = 1
QKEY = 0x11111111
GRH = 40
SLOT = GRH + 1536
N_RECV = 256
PORT = 1


def gid_of_grh(grh: bytes) -> str:
    """Source GID of a UD receive's 40-byte GRH area (RoCEv2 over IPv4: bytes 20..39 are the IPv4
    header, bytes 0..19 undefined; over IPv6: the IPv6 header)."""
    import ipaddress

    if grh[20] == 0x45:
        return str(ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + grh[32:36]))
    return str(ipaddress.IPv6Address(grh[8:24]))


class Port:
    """One UD QP with receive buffers posted, an AH cache and a send slot."""

    def __init__(self, device: str, gid_index: int):
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.e = e
        self.gid_index = gid_index
        self.ctx = Context(name=device)
        self.gid = str(self.ctx.query_gid(PORT, gid_index))
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 2 * N_RECV)
        self.mr = MR(self.pd, (N_RECV + 1) * SLOT, e.IBV_ACCESS_LOCAL_WRITE)
        cap = QPCap(max_send_wr=64, max_recv_wr=N_RECV, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap)
        attr = QPAttr(port_num=PORT)
        attr.qkey = QKEY
        attr.pkey_index = 0
        self.qp = QP(self.pd, init, attr)  # a UD QP is taken to RTS by pyverbs
        self.ahs: dict[str, object] = {}
        self.sends_in_flight = 0
        self.inbox: list[tuple[int, str, int, bytes]] = []
        for i in range(N_RECV):
            self.post_recv(i)

    def post_recv(self, i: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        self.qp.post_recv(
            RecvWR(wr_id=i, num_sge=1, sg=[SGE(self.mr.buf + i * SLOT, SLOT, self.mr.lkey)])
        )

    def ah(self, gid: str):
        import ipaddress

        from pyverbs.addr import AH, GID, AHAttr, GlobalRoute

        if gid not in self.ahs:
            # pyverbs' GID() takes the full eight-group notation only
            full = ipaddress.IPv6Address(gid).exploded
            gr = GlobalRoute(dgid=GID(full), sgid_index=self.gid_index, hop_limit=64)
            self.ahs[gid] = AH(self.pd, attr=AHAttr(port_num=PORT, is_global=1, gr=gr))
        return self.ahs[gid]

    def send(self, gid: str, qpn: int, payload: bytes) -> int:
        """Posts one datagram; returns the user-clock time read just before posting."""
        from pyverbs.wr import SGE, SendWR

        off = N_RECV * SLOT
        self.mr.write(payload, len(payload), off)
        wr = SendWR(
            wr_id=1 << 40,
            opcode=self.e.IBV_WR_SEND,
            num_sge=1,
            sg=[SGE(self.mr.buf + off, len(payload), self.mr.lkey)],
            send_flags=self.e.IBV_SEND_SIGNALED,
        )
        wr.set_wr_ud(self.ah(gid), qpn, QKEY)
        t = time.monotonic_ns()
        self.qp.post_send(wr)
        self.sends_in_flight += 1
        # one send slot: wait for this datagram to have left before the slot is reused
        while self.sends_in_flight:
            self._poll_cq()
        return t

    def _poll_cq(self) -> None:
        n, wcs = self.cq.poll(16)
        t = time.monotonic_ns()
        for wc in wcs[:n]:
            if wc.wr_id == 1 << 40:
                self.sends_in_flight -= 1
                continue
            if wc.status == self.e.IBV_WC_SUCCESS and wc.byte_len >= GRH:
                raw = self.mr.read(wc.byte_len, wc.wr_id * SLOT)
                self.inbox.append((t, gid_of_grh(raw[:GRH]), wc.src_qp, raw[GRH:]))
            self.post_recv(wc.wr_id)

    def poll(self, wait_s: float) -> list[tuple[int, str, int, bytes]]:
        """Received datagrams as (user-clock time, source GID, source QPN, payload)."""
        end = time.monotonic() + wait_s
        while True:
            self._poll_cq()
            if self.inbox or time.monotonic() >= end:
                out, self.inbox = self.inbox, []
                return out
            time.sleep(0.0002)


class Receipts:
    """Which probes of each (session, stream) arrived: the responder's side of csrc/proto.h."""

    def __init__(self):
        self.streams: dict[tuple[int, int], tuple[int, set[int]]] = {}

    def note(self, session: int, stream: int, tseq: int) -> tuple[int, int]:
        first, seen = self.streams.setdefault((session, stream), (tseq, set()))
        seen.add(tseq)
        hi = max(seen)
        known_from = max(first, hi - 127)
        span = max(0, tseq - known_from) if tseq >= known_from else 0
        bits = sum(1 << i for i in range(span) if tseq - 1 - i in seen)
        return span, bits


def respond(args) -> dict:
    port = Port(args.device, args.gid_index)
    print(f"pyverbs responder on {port.gid}/{port.qp.qp_num}", file=sys.stderr, flush=True)
    receipts = Receipts()
    session = random.getrandbits(32) or 1
    done = {"answered": [], "skipped": [], "muted": [], "plain": 0}
    stop = time.monotonic() + args.duration
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while time.monotonic() < stop:
            for t3, gid, qpn, data in port.poll(0.05):
                if len(data) < 96 or HDR.unpack_from(data)[:3] != (MAGIC, VERSION, PROBE):
                    continue
                _, _, _, flags, ts, psess, seq, path, res, _, t1, _, _ = HDR.unpack_from(data)
                magic, stream, tseq, _ = RCPT.unpack_from(data, 48)
                common = dict(psess=psess, seq=seq, path=path, t1=t1)
                if magic != RCPT_MAGIC:  # an older prober: plain answers
                    done["plain"] += 1
                    span = bits = None
                else:
                    if args.skip_every and tseq % args.skip_every == args.skip_every - 1:
                        done["skipped"].append(tseq)
                        continue  # as if it never arrived
                    span, bits = receipts.note(psess, stream, tseq)
                    if args.mute_every and tseq % args.mute_every == args.mute_every - 1:
                        done["muted"].append(tseq)
                        continue  # taken, but the answers are "lost"
                    done["answered"].append(tseq)
                ack1 = ack(ACK1, session, **common, rcpt=(span, bits))
                t4 = port.send(gid, qpn, ack1)
                port.send(gid, qpn, ack(ACK2, session, **common, t34=(t3, t4)))
    except SystemExit:
        pass
    return done


def ack(kind, session, *, psess, seq, path, t1, rcpt=(None, None), t34=None) -> bytes:
    flags = ts = 0
    reserved, w3, w4 = 0, 0, 0
    if kind == ACK1 and rcpt[0] is not None:
        flags, reserved = F_RCPT, rcpt[0]
        w3, w4 = rcpt[1] & (2**64 - 1), rcpt[1] >> 64
    if kind == ACK2 and t34:
        flags, ts, (w3, w4) = F_T34, TS_USER, t34
    return HDR.pack(
        MAGIC, VERSION, kind, flags, ts, psess, seq, path, reserved, session, t1, w3, w4
    )


def probe(args) -> dict:
    port = Port(args.device, args.gid_index)
    session = random.getrandbits(32) or 1
    stream = random.getrandbits(31) + 1
    omit = {int(x) for x in args.omit.split(",") if x}
    pending: dict[int, dict] = {}
    results = []
    for tseq in range(args.n):
        if tseq not in omit:
            pad = RCPT.pack(RCPT_MAGIC, stream, tseq, 0) + bytes(32)
            t1 = time.monotonic_ns()
            head = HDR.pack(MAGIC, VERSION, PROBE, 0, 0, session, tseq, 0, 0, 0, t1, 0, 0)
            t2 = port.send(args.gid, args.qpn, head + pad)
            pending[tseq] = {"tseq": tseq, "t2": t2}
        end = time.monotonic() + args.interval
        while time.monotonic() < end or (
            tseq == args.n - 1 and pending and time.monotonic() < end + 2
        ):
            for t5, _gid, _qpn, data in port.poll(0.002):
                if len(data) < 48:
                    continue
                magic, ver, kind, flags, ts, sess, seq, _p, res, rs, _t1, w3, w4 = HDR.unpack_from(
                    data
                )
                p = pending.get(seq)
                if (magic, ver, sess) != (MAGIC, VERSION, session) or p is None:
                    continue
                if kind == ACK1:
                    p["t5"], p["flags1"] = t5, flags
                    p["span"], p["bits"] = (res, w3 | w4 << 64) if flags & F_RCPT else (None, None)
                elif kind == ACK2:
                    p["t34"] = (w3, w4) if flags & F_T34 else None
                    p["ts"] = ts
                if "t5" in p and "t34" in p:
                    results.append(pending.pop(seq))
    out = {"answered": [], "rtt_ns": [], "receipts_wrong": [], "no_receipts": [], "ts_sources": []}
    for p in results:
        q = p["tseq"]
        out["answered"].append(q)
        if p["t34"]:
            out["rtt_ns"].append((p["t5"] - p["t2"]) - (p["t34"][1] - p["t34"][0]))
            out["ts_sources"].append(p["ts"])
        if p["span"] is None:
            out["no_receipts"].append(q)
            continue
        # what the responder must claim: every earlier tseq it can know of, except the omitted
        span = min(q, 127)  # the responder's window: the newest probe and the 127 before it
        want = sum(1 << i for i in range(span) if q - 1 - i not in omit)
        if (p["span"], p["bits"]) != (span, want):
            out["receipts_wrong"].append([q, p["span"], hex(p["bits"]), span, hex(want)])
    out["lost"] = sorted(pending)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("respond", "probe"))
    ap.add_argument("--device", required=True)
    ap.add_argument("--gid-index", type=int, default=1)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--skip-every", type=int, default=0)
    ap.add_argument("--mute-every", type=int, default=0)
    ap.add_argument("--gid")
    ap.add_argument("--qpn", type=int)
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--interval", type=float, default=0.01)
    ap.add_argument("--omit", default="")
    args = ap.parse_args()
    try:
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as exc:
        print(f"pyverbs: not importable ({exc}); install python3-pyverbs", file=sys.stderr)
        return 3
    try:
        result = respond(args) if args.mode == "respond" else probe(args)
    except PyverbsError as exc:  # pyverbs' own diagnosis of a missing or broken device/provider
        print(f"pyverbs: {exc}", file=sys.stderr, flush=True)
        return 3
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
