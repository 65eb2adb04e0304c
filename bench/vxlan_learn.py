"""What learning the probe flows' VXLAN outer ports all the time costs the host agent.

Two namespaces joined by a veth, each a kernel VXLAN VTEP (as the namespace testbed's hosts);
``flows`` overlay flows (one UDP socket per path id, as an engine keeps; ``flows / 64``
addresses of the second) send skh PROBE-shaped datagrams at ``rate`` frames/s in all for
``duration`` seconds, while an :class:`OuterPortLearner` started
there (:meth:`~skh.collect.vxlan.OuterPortLearner.start`, as the host agent runs it) watches.
Prints the capture thread's CPU time per second and per frame (its own ``/proc`` task stats:
the kernel-side filter of every frame runs in the senders' context and is not in it), frames
seen, frames parsed in full, and flows learned. Needs root (namespaces, ``CAP_NET_RAW``).

    python bench/vxlan_learn.py --rate 2000 --flows 320 --duration 20

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skh.collect.netdev import in_netns  # noqa: E402
from skh.collect.vxlan import OuterPortLearner  # noqa: E402


def _sh(script: str) -> None:
    subprocess.run(["bash", "-ec", script], check=True, capture_output=True, timeout=60)


def _probe(path_id: int) -> bytes:
    """An skh PROBE header (csrc/proto.h) padded to the minimum probe length."""
    hdr = struct.pack("!IBBBBIIHH", 0x534B4850, 1, 1, 0, 0, 7, 1, path_id, 0)
    return hdr + bytes(96 - len(hdr))


def _thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rate: float, flows: int, duration_s: float) -> dict[str, object]:
    paths = min(flows, 64)
    dsts = -(-flows // paths)
    targets = [(f"172.31.0.{2 + i // paths}", i % paths) for i in range(flows)]
    tag = os.environ.get("SKH_TESTBED_PREFIX", "skhb")[:6] + uuid.uuid4().hex[:4]
    a, b = f"{tag}va", f"{tag}vb"
    _sh(f"""
    ip netns add {a}; ip netns add {b}
    ip link add rnic0 netns {a} type veth peer name rnic0 netns {b}
    for n in {a} {b}; do ip -n $n link set lo up; ip -n $n link set rnic0 up; done
    ip -n {a} addr add 10.77.0.1/24 dev rnic0; ip -n {b} addr add 10.77.0.2/24 dev rnic0
    for p in "{a} 1 2" "{b} 2 1"; do set -- $p
      ip -n $1 link add vx0 type vxlan id 77 local 10.77.0.$2 dev rnic0 dstport 4789 nolearning
      ip -n $1 link set vx0 address 02:00:00:00:07:0$2; ip -n $1 link set vx0 up
      ip -n $1 addr add 172.31.0.$2/24 dev vx0
      ip -n $1 neigh add 172.31.0.$3 lladdr 02:00:00:00:07:0$3 dev vx0 nud permanent
      bridge -n $1 fdb append 02:00:00:00:07:0$3 dev vx0 dst 10.77.0.$3
    done
    for k in $(seq 3 {1 + dsts}); do
      ip -n {b} addr add 172.31.0.$k/24 dev vx0
      ip -n {a} neigh add 172.31.0.$k lladdr 02:00:00:00:07:02 dev vx0 nud permanent
    done
    """)
    try:
        with in_netns(a):
            socks = []
            for _ in range(paths):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind(("172.31.0.1", 0))
                socks.append(s)
            learner = OuterPortLearner()
            learner.start()
        time.sleep(0.3)
        thread = learner._thread
        if thread is None or thread.native_id is None:
            raise RuntimeError(f"no capture: {learner.error}")
        frames = [_probe(pid) for _dst, pid in targets]
        stop = threading.Event()
        sent = [0]

        def send() -> None:  # paced in 10 ms slices
            step = rate / 100
            due = 0.0
            next_t = time.monotonic()
            while not stop.is_set():
                due += step
                while due >= 1:
                    i = sent[0] % flows
                    dst, pid = targets[i]
                    socks[pid].sendto(frames[i], (dst, 7000))
                    sent[0] += 1
                    due -= 1
                next_t += 0.01
                time.sleep(max(0.0, next_t - time.monotonic()))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(2.0)  # every flow seen once: the steady state is what a host pays
        f0, c0, t0 = learner.frames, _thread_cpu_s(thread.native_id), time.monotonic()
        time.sleep(duration_s)
        f1, c1, t1 = learner.frames, _thread_cpu_s(thread.native_id), time.monotonic()
        stop.set()
        sender.join()
        learner.stop()
        wall = t1 - t0
        seen = max(1, f1 - f0)
        return {
            "frames_per_s": round((f1 - f0) / wall, 1),
            "planned_frames_per_s": rate,
            "flows": flows,
            "flows_learned": learner.flows(),
            "parsed_in_full": learner.recorded,
            "cpu_pct_one_core": round(100 * (c1 - c0) / wall, 2),
            "cpu_us_per_frame": round(1e6 * (c1 - c0) / seen, 2),
            "duration_s": round(wall, 1),
        }
    finally:
        for s in locals().get("socks", []):
            s.close()
        _sh(f"ip netns del {a}; ip netns del {b}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="probe frames/s leaving the host")
    ap.add_argument("--flows", type=int, default=320, help="inner flows (sockets x path ids)")
    ap.add_argument("--duration", type=float, default=20.0)
    a = ap.parse_args()
    print(json.dumps(measure(a.rate, a.flows, a.duration)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
