"""The probe policy every prober and the analyzer share, and what an overlay agent plans with it
on its own, without numpy (the agent must not load it: ~13 MB of each sidecar's memory).

:func:`skh.probeplan.plan_probes` plans a job for the controller and the simulator; an agent
plans only its own preload list, one source whose destinations share its budget alike, with no
fabric (:func:`source_plan`, the same numbers), and reads the rows of the skeleton's plan that
are its own (:func:`plan_rows`). tests/test_probeplan.py checks both against the numpy planner.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from skh.errors import ConfigError, ProtocolError

__all__ = [
    "ENGINE_TICK_S",
    "MAX_ENGINE_TICK_S",
    "MS_MAX",
    "ProbePolicy",
    "path_count",
    "plan_rows",
    "source_plan",
]

#: a pair's interval on the wire: whole milliseconds, uint16
MS_MAX = 65_535
#: the overlay agent's engine tick by default (``agent.engine_tick_s``): each engine thread wakes
#: up at most once per tick and answers what arrived meanwhile together. RTTs are wire-stamped
#: where it applies, so they do not move; responder and prober delays grow by up to a tick, and
#: the simulator (:class:`skh.sim.probes.ProbeModel`) adds the same (docs/engine.md, "Wake-ups")
ENGINE_TICK_S = 0.005
#: the longest tick the C engine takes (``SKH_MAX_TICK_NS``, :data:`skh.probe.MAX_TICK_S`), here
#: for the settings' check, which must not load the engine (the controller never does);
#: tests/engine/test_tick.py holds the two equal
MAX_ENGINE_TICK_S = 0.005
#: ``[controller]`` setting of each policy field whose name is not ``probe_<field>``
_CONFIG_KEYS = {"ok_sample_s": "ok_sample_s"}


@dataclass(frozen=True, slots=True)
class ProbePolicy:
    """The probing settings every prober and the analyzer share; the controller hands them out
    with each job's ping list (``[controller]`` settings of the same names, see
    :meth:`from_config`)."""

    #: a pair's interval when nothing asks for another: 10 probes/s, so a 2 % loss shows in a
    #: second (R-Pingmesh also asks >= 10 probes/s on every link)
    interval_s: float = 0.1
    #: the fastest a floor may probe a pair: 100/s, so that a pair alone on an access link can
    #: pay that link's floor by itself (within an endpoint's budget)
    min_interval_s: float = 0.01
    #: probes/s one endpoint (a VF's engine) sends at most
    budget_per_s: float = 100.0
    #: probes/s one endpoint is asked to answer at most (its peers' probes to it, the same
    #: datagram work as its own): without it an endpoint many peers probe answered 1,148/s
    #: (the full eval's plan, seed 1), and its container cost more than the busiest sender's
    answer_budget_per_s: float = 100.0
    #: probes/s every link of the job's skeleton should see
    link_min_per_s: float = 10.0
    #: probes/s every access link (RNIC to ToR) of the skeleton should see: the loss test's
    #: time to detect a lossy link falls with the probes crossing it (a CRC-style 2 % loss shows
    #: in 5-9 failures against a ~1e-4 baseline at alpha 1e-9: ~2 s at 160/s), and on a sparse
    #: skeleton an access link carries one pair both ways, 2 x 10/s; 8x that is paid only by
    #: endpoints with few peers (docs/probing.md, "Effect on time to detect")
    access_link_min_per_s: float = 160.0
    #: the chance a given ECMP path of a pair is among its path ids
    path_coverage: float = 0.995
    #: every path id of a pair is probed within this long
    coverage_s: float = 10.0
    #: path ids a pair rotates over at most (the UDP engine keeps 64 source ports)
    max_paths: int = 64
    #: ECMP paths assumed between two RNICs when no fabric says
    default_ecmp_paths: int = 4
    #: agents forward one OK per pair and this period: the analyzer's latency sample period
    #: (``detector.latency_sample_s``); 0 forwards every OK
    ok_sample_s: float = 1.0

    def __post_init__(self) -> None:
        def bad(name: str, must: str) -> ConfigError:
            return ConfigError(
                f"The '{name}' setting of the probe policy must be {must}. "
                f"Got {getattr(self, name)!r} instead."
            )

        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(f.name, "a finite number")
        for name in (
            "interval_s",
            "min_interval_s",
            "budget_per_s",
            "answer_budget_per_s",
            "coverage_s",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "> 0")
        for name in ("link_min_per_s", "access_link_min_per_s", "ok_sample_s"):
            if getattr(self, name) < 0:
                raise bad(name, ">= 0")
        if self.min_interval_s > self.interval_s:
            raise bad("min_interval_s", f"<= interval_s ({self.interval_s:g})")
        if self.interval_s * 1000 > MS_MAX:
            raise bad("interval_s", f"<= {MS_MAX / 1000:g} s")
        if not 0 < self.path_coverage < 1:
            raise bad("path_coverage", "in (0, 1)")
        if not isinstance(self.max_paths, int) or not 1 <= self.max_paths <= 64:
            raise bad("max_paths", "an int in [1, 64]")
        if not isinstance(self.default_ecmp_paths, int) or self.default_ecmp_paths < 1:
            raise bad("default_ecmp_paths", "an int >= 1")

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> ProbePolicy:
        """The policy a controller handed out; ProtocolError when it is malformed."""
        if not isinstance(d, Mapping):
            raise ProtocolError(f"a probe policy is a map, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in d.items() if k in names})
        except (ConfigError, TypeError) as exc:
            raise ProtocolError(f"bad probe policy: {exc}"[:300]) from None

    @classmethod
    def from_config(cls, section: Any) -> ProbePolicy:
        """From the ``[controller]`` settings (``probe_*`` and ``ok_sample_s``); ConfigError
        names the setting."""
        keys = {f.name: _CONFIG_KEYS.get(f.name, f"probe_{f.name}") for f in fields(cls)}
        try:
            return cls(**{name: getattr(section, key) for name, key in keys.items()})
        except ConfigError as exc:
            msg = str(exc)
            for name, key in keys.items():
                msg = msg.replace(
                    f"'{name}' setting of the probe policy", f"'controller.{key}' setting"
                )
            raise ConfigError(msg) from None

    def differences(self, **local: float) -> list[str]:
        """``name: local != handed-out`` for each given local setting that differs."""
        out = []
        for name, v in local.items():
            theirs = getattr(self, name)
            if not math.isclose(float(v), float(theirs), rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{name}: {v:g} here, {theirs:g} from the controller")
        return out


def path_count(ecmp_paths: int, coverage: float, max_paths: int) -> int:
    """One pair's :func:`skh.probeplan.paths_needed`."""
    m = max(float(ecmp_paths), 1.0)
    n = math.ceil(math.log1p(-coverage) / math.log1p(-1.0 / m) - 1e-9) if m > 1 else 1
    return int(min(max(n, 1), max_paths))


def _sum(x: float, k: int) -> float:
    # k equal terms added one by one, as numpy's bincount adds a source's pairs: k * x may
    # round the other way at a budget's edge
    total = 0.0
    for _ in range(k):
        total += x
    return total


def source_plan(k: int, policy: ProbePolicy) -> tuple[float, int]:
    """``(interval_s, paths)`` of each of one source's ``k`` pairs as
    :func:`skh.probeplan.plan_probes` plans them without a fabric: every pair alike, so the
    planner's vectors are one number here."""
    # a preload list is symmetric (each endpoint probes its k same-rail peers, and they it), so
    # an endpoint answers what it sends: the smaller budget binds
    p = replace(policy, budget_per_s=min(policy.budget_per_s, policy.answer_budget_per_s))
    paths = path_count(p.default_ecmp_paths, p.path_coverage, p.max_paths)
    max_rate = 1.0 / p.min_interval_s
    base = min(1.0 / p.interval_s, p.budget_per_s / k)
    sample_s = p.ok_sample_s if p.ok_sample_s > 0 else p.interval_s
    floor = min(max(paths / p.coverage_s, 1.0 / max(sample_s, p.interval_s)), max_rate)
    want = min(max(base, floor), max_rate)
    rate = want
    if _sum(want, k) > p.budget_per_s:  # skh.probeplan._fit_budget
        floor = floor * min(1.0, p.budget_per_s / max(_sum(floor, k), 1e-12))
        extra = want - floor
        left = max(p.budget_per_s - _sum(floor, k), 0.0)
        share = min(1.0, left / max(_sum(extra, k), 1e-12))
        rate = floor + extra * share
    lo = max(1, math.ceil(p.min_interval_s * 1000 - 1e-9))
    iv = min(max(math.floor(1000.0 / rate + 1e-9), lo), MS_MAX)
    if _sum(1000.0 / iv, k) > p.budget_per_s + 1e-9:
        iv = min(max(math.ceil(1000.0 / rate - 1e-9), lo), MS_MAX)
    return int(iv) / 1000.0, paths


def plan_rows(
    wire: Any, src: Sequence[int], dst: Sequence[int], ep: int
) -> dict[int, tuple[float, int]]:
    """``dst -> (interval_s, paths)`` of source ``ep``'s rows of a plan handed out
    (:meth:`skh.probeplan.ProbePlan.to_wire`) for the skeleton pairs ``(src[i], dst[i])``, sorted
    by source; ProtocolError when the plan does not fit them, as
    :meth:`~skh.probeplan.ProbePlan.from_wire` says."""
    if not isinstance(wire, Mapping):
        raise ProtocolError("a probe plan is a map")
    iv_raw, n_raw = wire.get("interval_ms"), wire.get("paths")
    if not isinstance(iv_raw, bytes) or not isinstance(n_raw, bytes):
        raise ProtocolError("bad probe plan: its columns are not bytes")
    if len(iv_raw) != 2 * len(src) or len(n_raw) != 2 * len(src):
        raise ProtocolError(
            f"a probe plan of {len(iv_raw) // 2}/{len(n_raw) // 2} rows for {len(src)} pairs"
        )
    m = len(src)
    iv, n = struct.unpack(f"<{m}H", iv_raw), struct.unpack(f"<{m}H", n_raw)
    if m and (min(iv) == 0 or min(n) == 0 or max(n) > 64):
        raise ProtocolError("a probe plan with a zero interval or path count out of 1..64")
    lo, hi = bisect_left(src, ep), bisect_right(src, ep)
    return {int(dst[i]): (iv[i] / 1000.0, n[i]) for i in range(lo, hi)}
