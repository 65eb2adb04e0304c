"""What localization starts from: detection's results as :class:`Suspect` (failing pairs, how they
fail, the failing path ids, unhealthy agents)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skh.analysis.localize.data import SYMPTOM_RANK, Pair, Symptom
from skh.errors import ConfigError
from skh.records import ProbeStatus, is_loss, pair_keys, split_pair_keys

__all__ = ["Suspect", "failing_path_ids", "probe_view", "DEAD_BITS"]

_DETECT_KINDS: dict[str, Symptom] = {
    "unreachable": "unreachable",
    "loss": "loss",
    "latency": "latency",
    "latency-short": "latency",
    "latency-long": "latency",
    "latency_short": "latency",
    "latency_long": "latency",
}
#: detection's endpoint-health reason bits (skh.analysis.health.HealthReason)
#: missed heartbeats, refused; the others (late results, delays) mean a late agent
DEAD_BITS = 1 | 4


@dataclass(frozen=True, slots=True)
class Suspect:
    """One detection result to localize: the pairs failing together and how they fail."""

    pairs: tuple[Pair, ...]
    symptom: Symptom
    first_seen_ns: int
    #: pairs whose probes were answered with ICMP port unreachable: the host is up, the agent is not
    refused: frozenset[Pair] = frozenset()
    #: the loss comes and goes (down/up periods): a flapping port
    flapping: bool = False
    #: the path ids (flow labels) whose probes failed, per pair; pairs left out use path id 0
    path_ids: Mapping[Pair, tuple[int, ...]] = field(default_factory=dict)
    #: endpoints whose agent detection found unhealthy: endpoint id → HealthReason bits
    agents: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.symptom not in SYMPTOM_RANK:
            raise ConfigError(
                f"The 'symptom' parameter of Suspect must be one of {sorted(SYMPTOM_RANK)}. "
                f"Got {self.symptom!r} instead."
            )

    @classmethod
    def from_event(
        cls, event: Any, *, path_ids: Mapping[Pair, tuple[int, ...]] | None = None
    ) -> Suspect:
        """Adopt detection's ``SuspectEvent`` (``kind``, ``pairs``, ``scores``, ``first_seen_ns``,
        ``endpoints``, ``flapping``). An ``agent`` event's scores are the endpoints'
        health-reason bits; ``flapping`` (an outage that came back after a recovery) makes a
        port flapping rather than down."""
        kind = str(getattr(event, "kind", "")).lower()
        pairs = tuple(
            (int(a), int(b))
            for a, b in np.asarray(getattr(event, "pairs", ()), np.int64).reshape(-1, 2)
        )
        first = int(getattr(event, "first_seen_ns", 0))
        if kind == "agent":
            eps = tuple(int(e) for e in getattr(event, "endpoints", ()))
            bits = tuple(int(b) for b in getattr(event, "scores", ())) or (1,) * len(eps)
            agents = dict(zip(eps, bits, strict=False))
            symptom: Symptom = "unreachable" if any(b & DEAD_BITS for b in bits) else "latency"
            return cls(pairs, symptom, first, agents=agents, path_ids=dict(path_ids or {}))
        symptom = _DETECT_KINDS.get(kind)  # type: ignore[assignment]
        if symptom is None:
            raise ConfigError(f"Suspect.from_event: unknown detection kind {kind!r}.")
        flapping = bool(getattr(event, "flapping", False))
        return cls(pairs, symptom, first, flapping=flapping, path_ids=dict(path_ids or {}))


def failing_path_ids(probes: np.ndarray, pairs: Iterable[Pair]) -> dict[Pair, tuple[int, ...]]:
    """The path ids (flow labels) whose probes failed, per pair, from ``PROBE_DTYPE`` records: the
    flows to trace. A pair whose probes all came back (a latency suspect) gets every path id it
    was probed on. Pairs without records are left out (the localizer then traces path id 0)."""
    want = np.asarray(list(pairs), np.int64).reshape(-1, 2)
    if want.size == 0 or probes.size == 0:
        return {}
    key = pair_keys(probes["src_ep"], probes["dst_ep"])
    wkey = pair_keys(want[:, 0], want[:, 1])
    sel = np.isin(key, wkey)
    st = probes["status"][sel]
    # failed on the path (as the detector counts it): a probe our own side failed to send
    # (LOCAL_ERROR) or a malformed answer (INVALID) names no flow worth tracing
    bad = is_loss(st) | (st == ProbeStatus.UNREACHABLE)
    key, pid = key[sel], probes["path_id"][sel].astype(np.int64)
    out: dict[Pair, tuple[int, ...]] = {}
    for k in np.unique(key).tolist():
        m = key == k
        ids = np.unique(pid[m & bad]) if (m & bad).any() else np.unique(pid[m])
        out[(k >> 32, k & 0xFFFFFFFF)] = tuple(int(i) for i in ids)
    return out


#: statuses that say nothing about the pair's path: a probe our side failed to send, an answer
#: that did not parse
_SAYS_NOTHING = np.array([ProbeStatus.OK, ProbeStatus.LOCAL_ERROR, ProbeStatus.INVALID], np.uint8)


def probe_view(probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What recent probe records (``PROBE_DTYPE``) tell localization besides suspects: the pairs
    answered with no failed probe (healthy: the localizer traces some to clear links) and the
    endpoints whose own probes came back (their agents are alive)."""
    if probes.size == 0:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    ok = probes["status"] == ProbeStatus.OK
    key = pair_keys(probes["src_ep"], probes["dst_ep"])
    failed = ~np.isin(probes["status"], _SAYS_NOTHING)
    good = np.setdiff1d(np.unique(key[ok]), np.unique(key[failed]))
    return split_pair_keys(good).astype(np.int64), np.unique(probes["src_ep"][ok]).astype(np.int64)
