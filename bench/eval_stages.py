"""Where one quick-profile seed of ``skh eval`` spends its CPU, stage by stage: prints one JSON.

    python bench/eval_stages.py [--seed N] [--duration S] [--against REV]

Runs one seed of the quick profile's field scenario (:func:`skh.eval.harness.seed_run`: the
simulation built with its inferred skeleton, the field run feeding the detector through the
agents' thinner, scoring, end-to-end localization, the random-list baseline) and splits its CPU
seconds into stages, each exclusive of the others (a stage called inside another counts once):

- ``build``: the simulation and the first jobs' skeleton inference;
- ``sim_step``: the simulator's seconds (probes, noise, traffic, job arrivals and their
  skeleton inference);
- ``thin``: :meth:`skh.analysis.sampling.ResultThinner.thin` (what the agents forward);
- ``detector``: :class:`skh.analysis.detect.Detector` ingest, tick, heartbeats, retirements;
- ``e2e_localization``: the localizer's rounds over the simulated agents' answers;
- ``rest``: the remainder (fault placement, scoring, the random list, ...; and the digests
  below, hashed outside the stages).

CPU time, not wall time (``time.process_time``): the machine is shared, so wall time says
little. With ``--against REV`` the same seed also runs on git revision ``REV`` (exported to a
temporary folder, in a child process with this very script), side by side: each stage's seconds
before and after, their ratio, and whether the deterministic outputs are identical (a digest of
every figure the seed returns but its CPU and localization seconds, of every simulator step's
batches and of every thinned batch).

Measured (``--seed 925737379 --duration 1200 --against 242e479``, commit 43461c1, a 2-core machine
shared with three other engineers' jobs, load 7-10): total 135.8 -> 91.3 CPU s (0.67); thin 52.6
-> 18.2 (0.35), end-to-end localization 20.6 -> 10.9 (0.53), simulator steps 28.1 -> 28.1,
detector 26.4 -> 25.4, build 2.6 -> 3.1, rest 5.5 -> 5.5; identical outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("build", "sim_step", "thin", "detector", "e2e_localization", "rest")


class _Clock:
    """Exclusive CPU seconds per stage: a stage entered inside another is taken out of it."""

    def __init__(self) -> None:
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self._stack: list[list] = []  # [stage, start, nested seconds]

    def wrap(self, owner: type, name: str, stage: str) -> None:
        fn = getattr(owner, name)

        def timed(*a, **k):
            self._stack.append([stage, time.process_time(), 0.0])
            try:
                return fn(*a, **k)
            finally:
                st, t0, nested = self._stack.pop()
                took = time.process_time() - t0
                self.cpu[st] += took - nested
                if self._stack:
                    self._stack[-1][2] += took

        setattr(owner, name, timed)


def _canon(x):
    """A JSON-able, order-independent form of a seed's result (arrays in full)."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, set | frozenset):
        return sorted((_canon(v) for v in x), key=repr)
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, np.ndarray):
        return ["nd", x.dtype.str, list(x.shape), _canon(x.tolist())]
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, np.generic):
        return _canon(x.item())
    if isinstance(x, float):
        return repr(x)
    if dataclasses.is_dataclass(x):
        return {f.name: _canon(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if hasattr(x, "__slots__") and not hasattr(x, "__dict__"):
        return {s: _canon(getattr(x, s)) for s in x.__slots__}
    if hasattr(x, "__dict__"):
        return {type(x).__name__: _canon(vars(x))}
    return x


def measure(seed: int, duration_s: float | None) -> dict:
    """One seed in this process, on the ``skh`` first on ``sys.path``."""
    import numpy as np

    import skh.eval.harness as harness
    from skh.analysis.detect import Detector
    from skh.analysis.sampling import ResultThinner
    from skh.eval import profile
    from skh.sim.noise import regime
    from skh.sim.scenario import Simulation

    clock = _Clock()
    digests = {"steps": hashlib.sha256(), "thinned": hashlib.sha256()}
    clock.wrap(Simulation, "build", "build")
    clock.wrap(Simulation, "step", "sim_step")
    for name in ("ingest", "tick", "heartbeat", "retire", "set_endpoint_groups"):
        clock.wrap(Detector, name, "detector")
    clock.wrap(ResultThinner, "thin", "thin")
    # seed_run looks it up in its module when called
    clock.wrap(harness, "e2e_localization", "e2e_localization")
    step, thin = Simulation.step, ResultThinner.thin

    def step_digest(self, *a, **k):
        s = step(self, *a, **k)
        for arr in (s.probes, s.counters, s.heartbeats):
            digests["steps"].update(np.ascontiguousarray(arr).tobytes())
        return s

    def thin_digest(self, batch):
        out = thin(self, batch)
        digests["thinned"].update(np.ascontiguousarray(out).tobytes())
        return out

    Simulation.step, ResultThinner.thin = step_digest, thin_digest

    prof = profile("quick")
    if duration_s:
        prof = dataclasses.replace(prof, duration_s=float(duration_s))
    fabric = harness._fabric(prof.hosts)
    t0 = time.process_time()
    clock._stack.append(["rest", t0, 0.0])
    res = harness.seed_run(fabric, prof, seed, regime("field"))
    _, _, nested = clock._stack.pop()
    total = time.process_time() - t0
    clock.cpu["rest"] += total - nested
    # wall-clock and CPU seconds are the only figures that differ run to run
    res.pop("cpu_s")
    res["e2e"].pop("localize_s", None)
    body = json.dumps(_canon(res), sort_keys=True).encode()
    return {
        "seed": seed,
        "virtual_s": prof.duration_s,
        "cpu_s": {k: round(v, 2) for k, v in clock.cpu.items()} | {"total": round(total, 2)},
        "digest": {
            "result": hashlib.sha256(body).hexdigest(),
            **{k: h.hexdigest() for k, h in digests.items()},
        },
        "headline": {
            k: res["detection"].get(k) for k in ("precision", "recall", "false_events", "ttd_s")
        }
        | {"e2e_accuracy": res["e2e"].get("accuracy")},
    }


def _at_revision(rev: str, seed: int, duration_s: float | None) -> dict:
    """:func:`measure` on git revision ``rev``, exported to a temporary folder."""
    from _revision import revision_tree  # bench/ is on sys.path when this runs as a script

    with revision_tree(rev) as tree:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", str(tree)]
        cmd += ["--seed", str(seed)] + (["--duration", str(duration_s)] if duration_s else [])
        out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=os.environ.copy())
    if out.returncode:
        raise SystemExit(f"{rev}: the seed failed\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=925737379, help="the quick seed (default: CI's)")
    ap.add_argument(
        "--duration", type=float, help="virtual seconds of the field run (default: the profile's)"
    )
    ap.add_argument("--against", metavar="REV", help="also run git revision REV: before/after")
    ap.add_argument("--inner", metavar="TREE", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.duration is not None and a.duration < 600:
        ap.error("--duration: at least 600 virtual seconds (the fault plan starts after 360)")
    sys.path.insert(0, a.inner or str(ROOT))
    if a.inner:
        print(json.dumps(measure(a.seed, a.duration)))
        return 0
    before = _at_revision(a.against, a.seed, a.duration) if a.against else None
    after = measure(a.seed, a.duration)
    out: dict = {"clock": "CPU seconds (time.process_time), one process", "after": after}
    if before:
        out["before"] = before | {"revision": a.against}
        out["stages"] = {
            k: {
                "before": before["cpu_s"][k],
                "after": after["cpu_s"][k],
                "ratio": round(after["cpu_s"][k] / before["cpu_s"][k], 3)
                if before["cpu_s"][k]
                else None,
            }
            for k in (*STAGES, "total")
        }
        out["identical"] = before["digest"] == after["digest"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
