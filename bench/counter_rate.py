"""What sampling VF byte counters faster costs the underlay agent (root: builds a testbed).

Skeleton inference pairs pipeline partners from their timing, which 1 Hz counters barely show
(``bench/skeleton.py`` assumes 10 Hz). This reads one emulated host's 8 VF representors with the
underlay agent's own reader (:class:`skh.orchestrator.counters.CounterSampler`: per namespace a
setns, a read of ``/proc/thread-self/net/dev`` and a flags ioctl per device, with its records)
and with the testbed's reader (:class:`skh.testbed.counters.NetnsCounters`), at 1, 10 and
100 Hz, for ``--seconds`` each,
while a training-traffic generator runs, and prints one JSON object: per reader and rate, the
share of one core used (CPU seconds per wall second), the CPU per sample and per RNIC sample, and
what the agent would ship (records and bytes per second per host, at 40 B a record).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from skh.model import JobShape  # noqa: E402
from skh.orchestrator.config import SourceSpec  # noqa: E402
from skh.orchestrator.counters import CounterSampler, make_source  # noqa: E402
from skh.records import COUNTER_DTYPE  # noqa: E402
from skh.testbed import JobSpec, Testbed, TestbedSpec  # noqa: E402

RATES_HZ = (1.0, 10.0, 100.0)


def _measure(read, hz: float, seconds: float) -> dict:
    period = 1.0 / hz
    n = int(seconds * hz)
    c0, w0 = time.process_time(), time.perf_counter()
    t_next = time.perf_counter()
    late = 0
    for _ in range(n):
        read()
        t_next += period
        delay = t_next - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            late += 1
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {"core_share": round(cpu / wall, 5), "cpu_us_per_sample": round(cpu / n * 1e6, 1),
            "samples": n, "late": late}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="3 s per rate")
    ap.add_argument("--prefix", default=os.environ.get("SKH_TESTBED_PREFIX", "skhb"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "needs root (builds a namespace testbed)"}))
        return 0
    seconds = 3.0 if args.quick else args.seconds
    spec = TestbedSpec(hosts=2, rnics_per_host=8, hosts_per_segment=2, containers_per_host=1,
                       jobs=(JobSpec("job0", JobShape(tp=8, pp=1, dp=2)),))  # fmt: skip
    tb = Testbed(spec, prefix=args.prefix)
    out: dict = {"rnics_per_host": 8, "seconds_per_rate": seconds}
    try:
        tb.up()
        cluster = tb.cluster()
        eps = [e for e in cluster.endpoints if e.host == "host0"]
        specs = []
        for e in eps:
            ns, dev = tb.representor(e)
            specs.append(SourceSpec(endpoint=e.name, netdev=dev, netns=ns))
        ids = {e.name: e.ep_id for e in eps}
        sampler = CounterSampler(make_source(s) for s in specs)
        fast = tb.counter_source("host0", cluster=cluster)
        tb.start_traffic("job0")
        for name, read in (
            ("agent", lambda: sampler.sample(ids)),
            ("proc_net_dev", fast.read),
        ):
            out[name] = {}
            for hz in RATES_HZ:
                m = _measure(read, hz, seconds)
                m["cpu_us_per_rnic_sample"] = round(m["cpu_us_per_sample"] / len(eps), 1)
                m["records_per_s"] = int(hz * len(eps))
                m["wire_bytes_per_s"] = int(hz * len(eps) * COUNTER_DTYPE.itemsize)
                out[name][f"{hz:g}hz"] = m
        sampler.close()
    finally:
        tb.down()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
