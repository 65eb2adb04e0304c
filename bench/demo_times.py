"""The live demo's times per fault kind over several runs: fault -> first detection event
(``detect_s``), fault -> the alert that places it (``alert_s``), repair -> resolution
(``resolve_s``), and how often each kind was caught, placed on its layer and component, and
resolved.

Either runs the demo itself (root; ``--runs N``, ``--all-faults``; each run writes its report under
``--out``) or summarises ``report.json`` files given as arguments (e.g. of ``make demo`` on fresh
clones). The machine's load average is read before and after each run it makes: the demo's times
move with it. Prints one JSON object: per kind n, ok, and mean / p50 / max with a 95 % t-interval
of the mean for each time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: two-sided 95 % Student t quantiles by degrees of freedom (1..30); beyond, the normal's
_T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13]
_T95 += [2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04]


def stats(xs: list[float]) -> dict[str, float | int | None]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    n = len(xs)
    mean = sum(xs) / n
    out: dict[str, float | int | None] = {
        "n": n,
        "mean": round(mean, 2),
        "p50": round(xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2, 2),
        "max": round(xs[-1], 2),
    }
    if n > 1:
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
        out["ci95"] = [round(mean - half, 2), round(mean + half, 2)]
    return out


def summarize(reports: list[dict]) -> dict:
    kinds: dict[str, dict[str, list]] = {}
    for rep in reports:
        for f in rep.get("faults", ()):
            k = kinds.setdefault(
                f["truth"]["kind"],
                {"ok": [], "detect_s": [], "alert_s": [], "resolve_s": [], "types": {}},
            )
            k["ok"].append(bool(f.get("ok")))
            # the verdict's type, and whether it is the injected one (by type class)
            if f.get("detected"):
                name = (
                    f"{f['detected'].get('failure_type')}"
                    + {
                        True: "",
                        False: " (not the injected type)",
                        None: "",
                    }[f.get("type_ok")]
                )
                k["types"][name] = k["types"].get(name, 0) + 1
            for key in ("detect_s", "alert_s", "resolve_s"):
                if f.get(key) is not None:
                    k[key].append(float(f[key]))
    return {
        "runs": len(reports),
        "runs_ok": sum(bool(r.get("ok")) for r in reports),
        "kinds": {
            kind: {
                "n": len(v["ok"]),
                "ok": sum(v["ok"]),
                "verdict_types": v["types"],
                **{key: stats(v[key]) for key in ("detect_s", "alert_s", "resolve_s")},
            }
            for kind, v in kinds.items()
        },
        "alert_s_max": max((x for v in kinds.values() for x in v["alert_s"]), default=None),
    }


def run_demos(n: int, out: Path, all_faults: bool) -> tuple[list[dict], list[dict]]:
    reports, runs = [], []
    for i in range(n):
        d = out / f"run-{i + 1}"
        load0 = os.getloadavg()
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "skh", "demo", "--out", str(d)]
        done = subprocess.run(
            argv + (["--all-faults"] if all_faults else []),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        runs.append(
            {
                "rc": done.returncode,
                "wall_s": round(time.monotonic() - t0, 1),
                "load_before": [round(x, 2) for x in load0],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
        try:
            reports.append(json.loads((d / "report.json").read_text()))
        except (OSError, ValueError):
            reports.append({"faults": [], "ok": False})
    return reports, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="*", help="report.json files to summarise")
    ap.add_argument("--runs", type=int, default=0, help="run the demo this many times first")
    ap.add_argument("--all-faults", action="store_true", help="the runs script every fault kind")
    ap.add_argument("--out", default="/tmp/skh-demo-times", help="where the runs' reports go")
    ap.add_argument("--quick", action="store_true", help="one run of the default demo")
    a = ap.parse_args(argv)
    runs: list[dict] = []
    reports = [json.loads(Path(p).read_text()) for p in a.reports]
    n = 1 if a.quick and not a.runs and not reports else a.runs
    if n:
        if os.geteuid() != 0:
            print(json.dumps({"skipped": "the live demo needs root (network namespaces)"}))
            return 0
        got, runs = run_demos(n, Path(a.out), a.all_faults)
        reports += got
    print(json.dumps({**summarize(reports), "demo_runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
