"""Where registration and readiness cost goes as a job grows: one job's ping lists, in-process.

Per job size (hosts x 8 RNICs, every endpoint ready): the controller's memory per endpoint in
its ping lists; the job snapshot an agent reads, every page (bytes; time to encode it cold,
every page cut from the record columns, and warm, each page as cached until a record in it
changes: what SYNCs cost the controller since issue 19); what an agent pays to decode the
pages and build its lists, and per readiness change to recompute one endpoint's targets; and
the size of the preload list, counted (:func:`skh.model.same_rail_pair_count`) and, up to
``--list-max-hosts``, listed (:meth:`JobPingLists.active_pairs`, what ``skh job``/``skh status``
did).

Prints one JSON object. ``--quick``: 128 and 1,280 hosts; default adds 10,240 (one job of
81,920 endpoints).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skh.model import same_rail_pair_count  # noqa: E402
from skh.orchestrator.pinglist import (  # noqa: E402
    EndpointInfo,
    JobPingLists,
    merge_snapshot_pages,
)
from skh.wire import Codec, MsgType  # noqa: E402

RAILS = 8


def _job(hosts: int) -> tuple[JobPingLists, int]:
    gc.collect()
    tracemalloc.start()
    j = JobPingLists("job")
    for h in range(hosts):
        for r in range(RAILS):
            ip = f"10.{r}.{h // 256}.{h % 256}"
            j.store(
                EndpointInfo(
                    h * RAILS + r, "job", f"c{h}", f"host{h}", r, ip, 10000 + r, "", 0, f"eth{r}"
                ).with_ready(True)
            )
    mem, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return j, mem


def measure(hosts: int, list_max_hosts: int) -> dict:
    codec = Codec(max_frame_bytes=1 << 31)
    j, mem = _job(hosts)
    n = hosts * RAILS

    def pages() -> list[bytes]:
        # every page of the job, as agents read it with SYNC
        out, after = [], -1
        while after is not None:
            page = j.snapshot(after=after)
            out.append(codec.encode(MsgType.JOB_SNAPSHOT, "controller", 1, page))
            after = page["next"]
        return out

    t = time.perf_counter()
    frames = pages()  # cold: every record is encoded on the way
    encode_s = time.perf_counter() - t
    t = time.perf_counter()
    pages()  # warm: the pages cached
    serve_s = time.perf_counter() - t
    t = time.perf_counter()
    agent = JobPingLists.from_snapshot(merge_snapshot_pages([codec.decode(f).body for f in frames]))
    build_s = time.perf_counter() - t
    agent.ping_list(0)
    agent._arrays = None  # what a readiness change does to the agent's copy
    t = time.perf_counter()
    targets = agent.ping_list(0)
    recompute_s = time.perf_counter() - t
    ep, rail, host, ready = j._cols()
    t = time.perf_counter()
    counted = same_rail_pair_count(rail, host, ready)
    count_s = time.perf_counter() - t
    out = {
        "hosts": hosts,
        "endpoints": n,
        "controller_pinglist_bytes_per_endpoint": round(mem / n),
        "snapshot_bytes": sum(len(f) for f in frames),
        "snapshot_encode_ms": round(encode_s * 1e3, 1),
        "snapshot_pages": len(frames),
        "snapshot_serve_warm_ms": round(serve_s * 1e3, 2),
        "agent_snapshot_build_ms": round(build_s * 1e3, 1),
        "agent_recompute_per_change_ms": round(recompute_s * 1e3, 2),
        "targets_per_endpoint": int(targets.size),
        "preload_pairs": counted,
        "preload_pairs_count_ms": round(count_s * 1e3, 2),
    }
    if hosts <= list_max_hosts:
        t = time.perf_counter()
        listed = j.active_pairs()
        out["preload_pairs_list_s"] = round(time.perf_counter() - t, 3)
        out["preload_pairs_list_mb"] = round(listed.nbytes / 1e6, 1)
        assert listed.shape[0] == counted
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="128 and 1,280 hosts")
    ap.add_argument("--list-max-hosts", type=int, default=1280)
    args = ap.parse_args()
    sizes = (128, 1280) if args.quick else (128, 1280, 10240)
    print(json.dumps({"rails": RAILS, "jobs": [measure(h, args.list_max_hosts) for h in sizes]}))
    return 0


if __name__ == "__main__":
    np.seterr(all="raise")
    raise SystemExit(main())
