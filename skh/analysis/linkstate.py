"""Link state: an endpoint whose VF link is down while its container lives.

Probes cannot tell a link down when an agent on the pair is dead: the pair's verdicts are
withheld (its failures are the agent's story, :mod:`skh.analysis.health`), and an access link
that goes down under a crashed agent, or under a crashed peer, is never raised (field seeds
920230969 and 89733880: a switch port down for 40 s under an agent crash, missed). The host
sees it without probes: the underlay agent ships each VF's oper state with its counters
(``COUNTER_DTYPE.oper_up``). This module keeps that state per endpoint and names the endpoints
whose link is down now.

A VF also reads down when its container is gone (the device vanished with its namespace), so
a down VF counts only while another VF of the same container reads up: one link down, the
container alive. A container with one VF, or all of whose VFs are down, says nothing here
(its agent's health and the probes speak for it). A reading older than ``stale_s`` says
nothing either: an underlay agent that stopped shipping must not keep a link down.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import ConfigError

__all__ = ["LinkStateConfig", "LinkState"]

_NEVER = np.iinfo(np.int64).min


@dataclass(frozen=True, slots=True)
class LinkStateConfig:
    #: down this long before it counts: one reading taken as a port renegotiates is not an
    #: outage (the underlay agent reads oper state once per counter interval, 0.1-1 s)
    down_after_s: float = 1.0
    #: a reading older than this says nothing (three counter intervals at the slowest rate)
    stale_s: float = 3.0

    def __post_init__(self) -> None:
        for name in ("down_after_s", "stale_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"The '{name}' parameter of LinkStateConfig must be > 0. "
                    f"Got {getattr(self, name)!r} instead."
                )


class LinkState:
    """Oper state per endpoint id, from counter rows, and which container each endpoint is in."""

    def __init__(self, config: LinkStateConfig | None = None) -> None:
        self.config = config or LinkStateConfig()
        self._dtype = np.dtype([("seen_ns", "<i8"), ("down_since_ns", "<i8"), ("up", "?")])
        self._blank = np.zeros(1, self._dtype)
        self._blank["seen_ns"] = _NEVER
        self._blank["down_since_ns"] = _NEVER
        self._blank["up"] = True
        self.state = np.repeat(self._blank, 0)
        self._containers = np.zeros(0, np.int64)

    def set_containers(self, containers: np.ndarray) -> None:
        """Endpoint id -> container id (-1: unknown); replaces the earlier mapping."""
        a = np.asarray(containers)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ConfigError(
                "LinkState.set_containers takes a 1-D integer array (endpoint id -> container "
                f"id). Got {a.dtype} of shape {a.shape} instead."
            )
        self._containers = a.astype(np.int64)

    def forget(self, eps: np.ndarray) -> None:
        """Endpoints gone or their ids given to new ones: nothing known of them any more."""
        eps = np.asarray(eps, np.int64)
        eps = eps[eps < len(self.state)]
        self.state[eps] = self._blank

    def observe(self, ep: np.ndarray, oper_up: np.ndarray, t_ns: np.ndarray) -> None:
        """Fold counter readings in: endpoint ids, oper state, the reading's time (ns)."""
        ep = np.asarray(ep, np.int64)
        if ep.size == 0:
            return
        if ep.max() >= len(self.state):
            grown = np.repeat(self._blank, max(int(ep.max()) + 1, 2 * len(self.state)))
            grown[: len(self.state)] = self.state
            self.state = grown
        # the newest reading per endpoint decides (a batch may hold several intervals)
        order = np.lexsort((np.asarray(t_ns, np.int64), ep))
        ep, up, t = ep[order], np.asarray(oper_up, bool)[order], np.asarray(t_ns, np.int64)[order]
        last = np.r_[ep[1:] != ep[:-1], True]
        s = self.state
        newer = t[last] >= s["seen_ns"][ep[last]]
        e, u, tt = ep[last][newer], up[last][newer], t[last][newer]
        went_down = ~u & s["up"][e]
        # the first reading down: since the earliest down reading of this batch that follows
        # the last up one would be finer, but one counter interval does not matter here
        s["down_since_ns"][e[went_down]] = tt[went_down]
        s["down_since_ns"][e[u]] = _NEVER
        s["up"][e] = u
        s["seen_ns"][e] = tt

    def down(self, now_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """(endpoint ids whose link is down now while their container lives, since when, ns)."""
        cfg = self.config
        s = self.state
        n = min(len(s), len(self._containers))
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        s = s[:n]
        cont = self._containers[:n]
        fresh = s["seen_ns"] >= now_ns - int(cfg.stale_s * 1e9)
        known = fresh & (cont >= 0)
        dn = known & ~s["up"] & (s["down_since_ns"] <= now_ns - int(cfg.down_after_s * 1e9))
        if not dn.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        live = np.unique(cont[known & s["up"]])
        eps = np.flatnonzero(dn & np.isin(cont, live))
        return eps, s["down_since_ns"][eps]
