"""Prober side of tests/engine/test_clock_step.py (run under the LD_PRELOAD shim): the engine
probes a Python responder that answers 30 ms late with honest user-clock stamps; prints the
records' statuses and the engine's counters as JSON."""

import json
import socket
import threading
import time

from skh import _fastprobe as fp
from skh.probe import Engine

sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 0))
sock.settimeout(0.5)
stop = threading.Event()


def respond() -> None:
    while not stop.is_set():
        try:
            data, addr = sock.recvfrom(2048)
        except TimeoutError:
            continue
        t3 = time.monotonic_ns()
        p = fp.proto_decode(data)
        time.sleep(0.03)
        kw = dict(session=p["session"], seq=p["seq"], t1=p["t1"], resp_session=3)
        t4 = time.monotonic_ns()
        sock.sendto(fp.proto_encode(2, **kw), addr)
        sock.sendto(fp.proto_encode(3, flags=1, ts_source=1, t3=t3, t4=t4, **kw), addr)


th = threading.Thread(target=respond)
th.start()
with Engine(bind="127.0.0.1", timeout_s=0.5) as eng:
    eng.add_target(1, "127.0.0.1", sock.getsockname()[1], interval_s=0.04, count=100)
    deadline = time.monotonic() + 20
    while eng.stats().decided < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = eng.drain()
    stats = eng.stats().as_dict()
stop.set()
th.join()
print(json.dumps({"status": rows["status"].tolist(), "rtt": rows["rtt_ns"].tolist(), **stats}))
