"""The overlay agent's thinner (``skh.analysis.rowthin.RowThinner``) on the busiest container's
records: CPU ms per one-second batch.

The busiest container's plan (``bench/agent_process.py --rate 800 --paths 19``): 8 endpoints, 42
peers each at 0.42 s, rotating over 19 path ids, every probe OK — ~816 records of 336 pairs a
second, of which the thinner keeps each pair's latency sample and each prober's newest. A
minute of batches, thinned by one thinner as the agent does; the CPU time (process time) of the
whole minute over its batches.

    python bench/rowthin.py [--against REV] [--reps 5]

Prints one JSON object. With ``--against REV`` the thinner of git revision ``REV`` (its
``skh/analysis/rowthin.py``) runs too, alternating with this tree's, and both must keep the
same records.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

T0 = 10**18
ENDPOINTS, PEERS, INTERVAL_NS, PATHS, SECONDS = 8, 42, 420_000_000, 19, 60


def batches(seed: int = 1) -> list[list[tuple]]:
    """A minute of one-second batches, records as the agent's ``flush`` hands them over."""
    rng = random.Random(seed)
    phase = [rng.randrange(INTERVAL_NS) for _ in range(ENDPOINTS)]  # each engine's own grid
    out: list[list[tuple]] = [[] for _ in range(SECONDS)]
    for e in range(ENDPOINTS):
        for d in range(PEERS):
            k = 0
            while (t := phase[e] + k * INTERVAL_NS + d * 2_000) < SECONDS * 10**9:
                rtt = 20_000 + rng.randrange(10_000)
                rec = (100 + e, 1000 + 100 * e + d, k, k % PATHS, 0, 1, T0 + t, rtt, 3000, 4000)
                out[t // 10**9].append(rec)
                k += 1
    return out


def thinner_at(rev: str) -> Any:
    """``RowThinner`` as git revision ``rev`` has it."""
    src = subprocess.run(
        ["git", "show", f"{rev}:skh/analysis/rowthin.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tmp = Path(tempfile.mkdtemp(prefix="skh-rowthin-")) / "rowthin_rev.py"
    tmp.write_text(src)
    spec = importlib.util.spec_from_file_location("rowthin_rev", tmp)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.RowThinner


def run(cls: Any, data: list[list[tuple]]) -> tuple[float, list[list[tuple]]]:
    """CPU ms per batch, and what was kept."""
    th = cls(1.0)
    t = time.process_time()
    kept = [th.thin(b) for b in data]
    return 1e3 * (time.process_time() - t) / len(data), kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", help="also time git revision REV's thinner")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    from skh.analysis.rowthin import RowThinner

    data = batches()
    sides = {"after": RowThinner} | ({"before": thinner_at(a.against)} if a.against else {})
    ms: dict[str, list[float]] = {k: [] for k in sides}
    kept: dict[str, list[list[tuple]]] = {}
    for _ in range(a.reps):
        for name, cls in sides.items():
            t, kept[name] = run(cls, data)
            ms[name].append(round(t, 3))
    n = sum(map(len, data))
    out: dict[str, Any] = {
        "records_per_batch": round(n / len(data), 1),
        "kept_per_batch": round(sum(map(len, kept["after"])) / len(data), 1),
        "ms_per_batch_median": {k: statistics.median(v) for k, v in ms.items()},
        "ms_per_batch": ms,
    }
    if a.against:
        out["revision"] = a.against
        out["same_records"] = kept["before"] == kept["after"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
