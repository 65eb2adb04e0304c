"""The simulator's answers to localization's commands: what :class:`skh.sim.scenario.Simulation`'s
agents answer (:mod:`skh.sim.state`), translated into the plain data
:class:`skh.analysis.localize.Localizer` takes — the same translation the real collectors of
:mod:`skh.collect` do for command output — with the noise real answers carry
(:class:`AnswerNoise`).

The simulator names overlay nodes ``<host>/vf<rail>-<ep>``, ``<host>/rep<rail>-<ep>``,
``<host>/ovs<rail>#<rule>`` and ``<host>/vtep<rail>``; :func:`sim_overlay_endpoint` and
:func:`sim_overlay_component` tell the localizer so (:func:`sim_localizer`).

**Noise in the answers** (:class:`AnswerNoise`; every knob says where its magnitude comes from in
:data:`ANSWER_SOURCES`; :data:`QUIET` is none, :data:`FIELD_ANSWERS` the field regime's):

- *traceroutes* send ``trace_queries`` probes per hop. A hop's answer is an ICMP error its
  control plane builds: switches that never answer (``trace_silent_switch_share``), a token
  bucket per (responder, asking host) as Linux keeps one per peer (``icmp_rate_per_s``,
  ``icmp_burst``; traces from one host run one after another, ``trace_s`` each, so a burst of
  traces empties the first hop's bucket), answers policed away at random
  (``trace_rate_limit_p``), answers lost on their way back when the reply's own ECMP path
  crosses a broken or lossy element (so a hop before a fault may look silent), and hop round
  trips that are mostly the switch CPU's time to answer (log-normal, milliseconds:
  ``hop_cpu_median_us``/``hop_cpu_sigma``), not forwarding delay;
- *host reports*: a report that does not come (``report_missing_p``), a flag missing from it
  (``report_flag_missing_p``), a flag from a collector that polls every
  ``report_flag_stale_s`` (at its own phase per host: the report carries the last poll and its
  age; the port flags a real agent reads when asked are fresh), and
  ``report_readers="real"``: only the flags a real collector reads (:data:`REAL_FLAGS`: port
  state, light from the switch, carrier-down count);
- *flow tables*: OVS holds rules for idle peers too (a full mesh of the job's endpoints on the
  rail, ``flow_idle_peers`` of them) that are not offloaded, as OVS evicts datapath flows idle
  for 10 s; a dump that races with revalidation (``flow_dump_race_p``) shows one offloaded rule
  stale or one not yet installed.

Concurrent faults need nothing here: every answer is derived from all faults active at the
asked time (:mod:`skh.sim.state`). :func:`answers_measured` says what noise was produced.
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np

from skh.analysis.localize import (
    REPORT_FLAGS,
    FlowRule,
    FlowTables,
    HostReport,
    Localizer,
    OverlayTables,
    Trace,
)
from skh.errors import ConfigError
from skh.failures import FailureType
from skh.model import Endpoint
from skh.sim.topology import mix_hash, rng_for

__all__ = [
    "AnswerNoise",
    "QUIET",
    "FIELD_ANSWERS",
    "ANSWER_SOURCES",
    "REAL_FLAGS",
    "answer_noise",
    "answers_measured",
    "SimSource",
    "sim_overlay_endpoint",
    "sim_overlay_component",
    "sim_flow_rule",
    "sim_localizer",
    "live_pairs",
]

_RNIC_STATE = {
    ("hw", "failed"): "hw_error",
    ("firmware", "not_responding"): "fw_unresponsive",
    ("port", "down"): "down",
}


def sim_overlay_endpoint(ep: Endpoint) -> tuple[str, str]:
    return f"{ep.host}/vf{ep.rail}-{ep.ep_id}", ep.ip


def sim_overlay_component(hop: str) -> str | None:
    """A vswitch hop of rail r (its representor, rule or VTEP) lives in RNIC r's eswitch."""
    host, _, local = hop.partition("/")
    for prefix in ("rep", "ovs", "vtep"):
        if local.startswith(prefix):
            rail = local[len(prefix) :].split("-", 1)[0].split("#", 1)[0]
            if rail.isdigit():
                return f"{host}:rnic{rail}"
    return None


def sim_flow_rule(f: Any) -> FlowRule:
    """One simulator ``FlowEntry`` as a :class:`FlowRule`."""
    match = () if f.in_port == "*" else (("in_port", f.in_port), ("nw_dst", f.match_dst))
    actions = (f"{f.action}:{f.out}",) + (("stale",) if f.state == "stale" else ())
    return FlowRule(match, actions, int(f.priority))


#: the flags a real host collector reads (skh/orchestrator/agent_underlay.py ``host_report``):
#: port state (up/down only), no light from the switch, the driver's carrier-down count, the
#: RNIC's RX error counters
REAL_FLAGS: frozenset[str] = frozenset({"rnic_state", "peer_down", "port_down_count", "rx_errors"})
#: frames an RNIC receives a second (assumed: probes plus a training job's collectives between
#: bursts, far below line rate); a CRC fault on its access link corrupts the fault's loss rate
#: of them, and the RNIC counts each (a switch drops what it receives corrupted: the RNIC at the
#: far end of the pair counts nothing)
RX_FRAMES_PER_S = 10_000.0
#: a healthy port's RX errors: a stray one in about one minute of a hundred (~14 a day; public
#: mlx5 field reports show healthy ports at a few symbol errors a day)
RX_BENIGN_BIN_S = 60.0
RX_BENIGN_P = 0.01
#: the flags the simulator's reports carry (agents' and containers' own health is detection's)
_SIM_FLAGS = tuple(
    f for f in REPORT_FLAGS if f not in ("agents_dead", "agents_late", "containers_dead")
)
_PORT_TYPES = {
    FailureType.RNIC_PORT_DOWN,
    FailureType.RNIC_PORT_FLAPPING,
    FailureType.SWITCH_PORT_DOWN,
    FailureType.SWITCH_PORT_FLAPPING,
}


@dataclass(frozen=True, slots=True)
class AnswerNoise:
    """The noise in what simulated agents answer localization (see the module doc); zeros (the
    defaults) answer exactly what the simulator knows, as before there was noise."""

    name: str = "quiet"
    # -- traceroutes
    #: share of switches that never answer a traceroute (ICMP TTL-exceeded disabled or policed)
    trace_silent_switch_share: float = 0.0
    #: probability that one hop answer is dropped by policing beyond the per-peer bucket
    trace_rate_limit_p: float = 0.0
    #: ICMP answers per second a responder sends one asking host (0: no limit), and its burst
    icmp_rate_per_s: float = 0.0
    icmp_burst: float = 6.0
    #: probes per hop (0: exact long-run loss shares, as an infinitely long mtr report)
    trace_queries: int = 0
    #: how long one trace takes: traces from one host run one after another
    trace_s: float = 1.0
    #: a switch's time to build an ICMP answer (log-normal median and sigma; 0: none)
    hop_cpu_median_us: float = 0.0
    hop_cpu_sigma: float = 0.0
    #: a host kernel's time to answer the trace's last probe (port unreachable)
    host_cpu_median_us: float = 0.0
    # -- host reports
    #: probability that a host's report does not come at all (agent restarting, timed out)
    report_missing_p: float = 0.0
    #: probability that one flag is missing from a report
    report_flag_missing_p: float = 0.0
    #: collectors of the flags beyond :data:`REAL_FLAGS` poll on this period (the report holds
    #: their last poll and its age)
    report_flag_stale_s: float = 0.0
    #: "all": every flag the simulator models; "real": only :data:`REAL_FLAGS`
    report_readers: Literal["all", "real"] = "all"
    # -- flow tables
    #: idle peers per endpoint whose OVS rules exist but are not offloaded (evicted)
    flow_idle_peers: int = 0
    #: probability that a dump races with revalidation (one rule stale or not yet installed)
    flow_dump_race_p: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if not math.isfinite(v) or v < 0:
                    raise ConfigError(
                        f"The '{f.name}' knob of AnswerNoise must be finite and >= 0. Got {v!r}."
                    )
        for nm in (
            "trace_silent_switch_share",
            "trace_rate_limit_p",
            "report_missing_p",
            "report_flag_missing_p",
            "flow_dump_race_p",
        ):
            if getattr(self, nm) > 1.0:
                raise ConfigError(f"The '{nm}' knob of AnswerNoise must be in [0, 1].")
        if self.report_readers not in ("all", "real"):
            raise ConfigError(
                "The 'report_readers' knob of AnswerNoise must be 'all' or 'real'. "
                f"Got {self.report_readers!r} instead."
            )
        if self.icmp_rate_per_s > 0 and self.icmp_burst < 1:
            raise ConfigError("AnswerNoise: icmp_burst must be >= 1 when answers are limited.")

    @property
    def quiet(self) -> bool:
        return self == replace(QUIET, name=self.name)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def scaled(self, name: str, factor: float) -> AnswerNoise:
        """Every rate of noise times ``factor`` (shares capped at 1); physical settings (the
        bucket's rate, the queries, the CPU times) stay."""
        f = float(factor)
        return replace(
            self,
            name=name,
            trace_silent_switch_share=min(1.0, self.trace_silent_switch_share * f),
            trace_rate_limit_p=min(1.0, self.trace_rate_limit_p * f),
            report_missing_p=min(1.0, self.report_missing_p * f),
            report_flag_missing_p=min(1.0, self.report_flag_missing_p * f),
            report_flag_stale_s=self.report_flag_stale_s * f,
            flow_idle_peers=int(round(self.flow_idle_peers * f)),
            flow_dump_race_p=min(1.0, self.flow_dump_race_p * f),
        )


#: knob -> where its magnitude in :data:`FIELD_ANSWERS` comes from
ANSWER_SOURCES: dict[str, str] = {
    "trace_silent_switch_share": "assumed: 2% of switches never answer TTL-exceeded "
    "(control-plane policing drops ICMP on some platforms)",
    "trace_rate_limit_p": "assumed: 5% of hop answers policed away (the switch CPU's trap queue "
    "is shared with routing and LLDP traffic)",
    "icmp_rate_per_s": "Linux: net.ipv4.icmp_ratelimit 1000 ms per peer, a token bucket of "
    "burst 6 (XRLIM_BURST_FACTOR, net/ipv4/icmp.c); SONiC switches answer TTL-exceeded from "
    "their Linux kernel",
    "icmp_burst": "Linux XRLIM_BURST_FACTOR = 6",
    "trace_queries": "mtr --report default: 10 cycles",
    "trace_s": "assumed: one trace of 10 cycles at 0.1 s (root mtr/paris-traceroute pacing)",
    "hop_cpu_median_us": "assumed: a switch answers from its CPU in about a millisecond, "
    "heavy-tailed (sigma 1: p99 ~10 ms); public traceroute studies warn hop RTTs reflect "
    "control-plane load, not forwarding",
    "host_cpu_median_us": "assumed: a host kernel answers port-unreachable in ~30 us",
    "report_missing_p": "assumed: 1% of host reports time out (agent restarting or busy)",
    "report_flag_missing_p": "assumed: 5% of host-report flags missing (a collector that timed "
    "out or a tool absent on the host)",
    "report_flag_stale_s": "assumed: host-side collectors (devlink health, GID tables, bonding, "
    "AER counters, offload counters) poll on a 30 s period; port state is read when asked",
    "flow_idle_peers": "OVS other_config:max-idle default 10000 ms: datapath (and offloaded) "
    "flows of peers idle for 10 s are evicted while their OpenFlow rules stay; 4 idle peers per "
    "endpoint assumed",
    "flow_dump_race_p": "assumed: 10% of dumps race with the revalidator (one rule changed or "
    "installed between the OVS and the RNIC read)",
}

#: no noise: the simulator's exact answers
QUIET = AnswerNoise()
#: the field regime's answer noise (sources in :data:`ANSWER_SOURCES`)
FIELD_ANSWERS = AnswerNoise(
    "field",
    trace_silent_switch_share=0.02,
    trace_rate_limit_p=0.05,
    icmp_rate_per_s=1.0,
    icmp_burst=6.0,
    trace_queries=10,
    trace_s=1.0,
    hop_cpu_median_us=1000.0,
    hop_cpu_sigma=1.0,
    host_cpu_median_us=30.0,
    report_missing_p=0.01,
    report_flag_missing_p=0.05,
    report_flag_stale_s=30.0,
    flow_idle_peers=4,
    flow_dump_race_p=0.1,
)


def answer_noise(sim: Any) -> AnswerNoise:
    """The answer noise of ``sim``'s regime (``sim.noise.answers``), or :data:`QUIET`."""
    got = getattr(getattr(sim, "noise", None), "answers", None)
    return got if isinstance(got, AnswerNoise) else QUIET


@dataclass(slots=True)
class _Ledger:
    traces: int = 0
    hop_queries: int = 0
    hop_answered: int = 0
    lost_silent: int = 0
    lost_bucket: int = 0
    lost_policed: int = 0
    lost_reply_path: int = 0
    reports: int = 0
    reports_missing: int = 0
    flags: int = 0
    flags_missing: int = 0
    flags_stale: int = 0
    flags_stale_wrong: int = 0
    dumps: int = 0
    dump_races: int = 0
    idle_rules: int = 0
    hop_cpu_us: list = field(default_factory=list)


@dataclass(slots=True)
class _State:
    """Per simulation, across rounds: the responders' token buckets, how often each question
    was asked at the current time, what was produced."""

    noise: AnswerNoise
    silent: frozenset[str]
    buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    host_clock: dict[str, float] = field(default_factory=dict)
    #: (hop, asker's RNIC, path ids) -> the path id its ICMP answer hashes onto
    back_pid: dict[tuple[str, int, int], int] = field(default_factory=dict)
    #: (tag, question) -> times asked at ``asked_ms``; reset when the time moves on
    asked: dict[tuple, int] = field(default_factory=dict)
    asked_ms: int = -1
    ledger: _Ledger = field(default_factory=_Ledger)


def _median(v: list[float]) -> float:
    """``np.median`` of a few floats (the same value: the middle one, or the two middle ones'
    sum halved), without its array machinery: a trace asks it once per hop."""
    s = sorted(v)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def _state(sim: Any, noise: AnswerNoise) -> _State:
    st = _STATES.get(sim)
    if st is None or st.noise != noise:
        names = sim.index.switch_names
        share = noise.trace_silent_switch_share
        u = mix_hash(np.arange(len(names)), np.uint64(sim.seed), np.uint64(0x511E))
        silent = frozenset(
            n
            for n, x in zip(names, (u.astype(np.float64) / 2**64).tolist(), strict=True)
            if x < share
        )
        st = _STATES[sim] = _State(noise, silent)
    return st


def answers_measured(sim: Any) -> dict[str, Any]:
    """The answer noise ``sim``'s :class:`SimSource` s produced so far (shares and counts)."""
    st = _STATES.get(sim)
    if st is None:
        return {"answers": QUIET.name, "traces": 0, "reports": 0, "dumps": 0}
    L = st.ledger
    q = max(L.hop_queries, 1)
    cpu = np.asarray(L.hop_cpu_us, float)
    return {
        "answers": st.noise.name,
        "traces": L.traces,
        "silent_switches": len(st.silent),
        "hop_answer_share": round(L.hop_answered / q, 4),
        "hop_lost_silent": round(L.lost_silent / q, 4),
        "hop_lost_rate_limit": round(L.lost_bucket / q, 4),
        "hop_lost_policed": round(L.lost_policed / q, 4),
        "hop_lost_reply_path": round(L.lost_reply_path / q, 4),
        "hop_cpu_us": {f"p{p}": round(float(np.percentile(cpu, p)), 1) for p in (50, 90, 99)}
        if cpu.size
        else None,
        "reports": L.reports,
        "reports_missing": L.reports_missing,
        "flags": L.flags,
        "flags_missing": L.flags_missing,
        "flags_stale": L.flags_stale,
        "flags_stale_wrong": L.flags_stale_wrong,
        "readers": st.noise.report_readers,
        "dumps": L.dumps,
        "dump_races": L.dump_races,
        "idle_rules": L.idle_rules,
    }


class SimSource:
    """Answers the localizer's questions from a simulation at virtual time ``t_s`` (default: the
    simulation's clock), with ``noise`` (default: :func:`answer_noise` of ``sim``). Counts the
    questions asked in ``calls``. One source serves one localization round; the responders'
    rate-limit buckets carry over between rounds of the same simulation."""

    def __init__(
        self, sim: Any, *, t_s: float | None = None, noise: AnswerNoise | None = None
    ) -> None:
        self.sim = sim
        self.t_s = sim.clock.now_s if t_s is None else float(t_s)
        self.noise = answer_noise(sim) if noise is None else noise
        self._quiet = self.noise.quiet
        self.calls: Counter[str] = Counter()
        self._dumps: dict[tuple[str, float], dict] = {}
        self._st = _state(sim, self.noise)

    def _rng(self, tag: int, *about: int | str) -> np.random.Generator:
        """The generator for one question (``about`` names it: a pair and flow, a host), keyed
        by the question and how often it was asked at this time, not by how many questions
        came before it: the answer to a question does not hinge on which others a round
        asked, so a change to detection that changes some questions leaves the answers to the
        others as they were (an A/B then compares the change, not two draws)."""
        st, ms = self._st, int(round(self.t_s * 1000))
        if st.asked_ms != ms:
            st.asked, st.asked_ms = {}, ms
        key = (tag, *about)
        n = st.asked[key] = st.asked.get(key, 0) + 1
        words = [zlib.crc32(a.encode()) if isinstance(a, str) else int(a) for a in about]
        return rng_for(self.sim.seed, 0xA45, tag, ms, *words, n)

    def _dump(self, host: str, t_s: float | None = None) -> dict:
        t = self.t_s if t_s is None else t_s
        d = self._dumps.get((host, t))
        if d is None:
            d = self._dumps[(host, t)] = self.sim.overlay_state(host, t)
        return d

    # -- traceroute -------------------------------------------------------------------------
    def traceroute(self, pair: tuple[int, int], path_id: int) -> Trace | None:
        self.calls["traceroute"] += 1
        src, dst = pair
        ix, eps = self.sim.index, self.sim.eps
        hops = self.sim.traceroute(src, dst, path_id, self.t_s)
        src_key = ix.rnic_key(int(eps.rnic[src]))
        dst_key = ix.rnic_key(int(eps.rnic[dst]))
        if self._quiet:
            nodes = [src_key, *(h.node for h in hops)]
            loss = [0.0, *(float(h.loss) for h in hops)]
            rtt = [0, *(int(h.rtt_ns) for h in hops)]
        else:
            nodes, loss, rtt = self._noisy_hops(src, dst, path_id, hops, src_key)
        while len(nodes) > 1 and nodes[-1] is None:
            nodes.pop()
        n = len(nodes)
        return Trace(pair, tuple(nodes), nodes[-1] == dst_key, tuple(loss[:n]), tuple(rtt[:n]))

    def _noisy_hops(self, src: int, dst: int, path_id: int, hops: list, src_key: str):
        """Each hop probed ``trace_queries`` times (once per hop when 0: no loss sampling)."""
        nz, st, L = self.noise, self._st, self._st.ledger
        L.traces += 1
        g = self._rng(0x7, src, dst, path_id)
        asker = src_key.rpartition(":rnic")[0]
        # this host's traces run one after another: this one starts when the last one ended
        t0 = max(self.t_s, st.host_clock.get(asker, -math.inf))
        st.host_clock[asker] = t0 + nz.trace_s
        q = max(1, nz.trace_queries)
        # the ICMP answer of hop k travels back on its own ECMP path (hash of responder and
        # asker): a broken or lossy element there loses it even when the probe got through
        n_pid = max(1, int(getattr(self.sim, "n_path_ids", 1)))
        nodes: list[str | None] = [src_key]
        loss: list[float] = [0.0]
        rtt: list[int] = [0]
        for k, h in enumerate(hops, start=1):
            if h.node is None:
                nodes.append(None)
                loss.append(1.0)
                rtt.append(-1)
                continue
            is_host = ":rnic" in h.node
            L.hop_queries += q
            if not is_host and h.node in st.silent:
                L.lost_silent += q
                nodes.append(None)
                loss.append(1.0)
                rtt.append(-1)
                continue
            bkey = (h.node, int(self.sim.eps.rnic[src]), n_pid)
            back_pid = st.back_pid.get(bkey)
            if back_pid is None:
                back_pid = st.back_pid[bkey] = int(
                    mix_hash(
                        np.uint64(zlib.crc32(h.node.encode())), np.uint64(bkey[1]), np.uint64(7)
                    )
                    % np.uint64(n_pid)
                )
            back_ok, back_loss = True, 0.0
            if back_pid != path_id:
                alt = self.sim.index.path_names(
                    int(self.sim.eps.rnic[src]), int(self.sim.eps.rnic[dst]), back_pid
                )
                if k < len(alt) and alt[k] == h.node:
                    alt_hops = self.sim.traceroute(src, dst, back_pid, self.t_s)
                    back_ok = alt_hops[k - 1].node is not None
                    back_loss = float(alt_hops[k - 1].loss)
            # each query: forward loss, the reply path, policing, then the responder's bucket
            times = t0 + (np.arange(q) + 0.5) * (nz.trace_s / q)
            fwd = g.random(q) >= float(h.loss)
            back = (g.random(q) >= back_loss) & back_ok
            pol = g.random(q) >= nz.trace_rate_limit_p
            ok = fwd & back & pol
            L.lost_reply_path += int((fwd & ~back).sum())
            L.lost_policed += int((fwd & back & ~pol).sum())
            if nz.icmp_rate_per_s > 0:
                tokens, last = st.buckets.get((h.node, asker), (nz.icmp_burst, -math.inf))
                for i in np.flatnonzero(fwd).tolist():
                    tokens = min(nz.icmp_burst, tokens + (times[i] - last) * nz.icmp_rate_per_s)
                    last = times[i]
                    if tokens >= 1.0:
                        tokens -= 1.0
                    else:
                        if ok[i]:
                            L.lost_bucket += 1
                        ok[i] = False
                st.buckets[(h.node, asker)] = (tokens, last)
            n_ok = int(ok.sum())
            L.hop_answered += n_ok
            if n_ok == 0:
                nodes.append(None)
                loss.append(1.0)
                rtt.append(-1)
                continue
            med = nz.host_cpu_median_us if is_host else nz.hop_cpu_median_us
            cpu_us = (
                med * np.exp(nz.hop_cpu_sigma * g.standard_normal(n_ok))
                if med > 0
                else np.zeros(n_ok)
            )
            if not is_host:
                L.hop_cpu_us.extend(cpu_us[:2].tolist())
            nodes.append(h.node)
            loss.append(1.0 - n_ok / q if nz.trace_queries else float(h.loss))
            rtt.append(int(h.rtt_ns + _median(cpu_us.tolist()) * 1e3))
        return nodes, loss, rtt

    # -- overlay ------------------------------------------------------------------------------
    def overlay_tables(self, host: str) -> OverlayTables | None:
        self.calls["overlay"] += 1
        d = self._dump(host)
        nh: dict[str, dict[str, str]] = {}
        down: set[str] = set()
        by_in: dict[str, dict[str, str]] = {}
        for r in d["rules"]:
            if r["in"] == "*":
                continue  # the catch-all upcall to ovs-vswitchd forwards nothing by itself
            rule = f"{host}/ovs{r['rail']}#{r['rule']}"
            by_in.setdefault(r["in"], {})[r["match_dst"]] = rule
            if r["action"] in ("encap", "encap_sw"):
                nxt = r["next"]
                nh[rule] = {"*": nxt}
                if nxt == f"{host}/vtep{r['rail']}":
                    nh.setdefault(nxt, {})[r["match_dst"]] = r["tunnel_dst"]
            else:
                nh[rule] = {"*": r["next"]}
        for node, entries in by_in.items():
            nh.setdefault(node, {}).update(entries)
        for v in d["vfs"]:
            vf, rep = v["vf"], v["representor"]
            if not v["vf_present"]:
                down.add(vf)
            if not v["representor_present"]:
                down.add(rep)
            nh.setdefault(vf, {})["*"] = rep
            nh.setdefault(rep, {})[v["ip"]] = vf
        return OverlayTables(host, nh, frozenset(down))

    # -- flow tables --------------------------------------------------------------------------
    def flow_tables(self, host: str, rail: int) -> FlowTables | None:
        self.calls["flow_tables"] += 1
        ovs, off = self.sim.flow_tables(host, rail, self.t_s)
        expected = [sim_flow_rule(f) for f in ovs]
        offloaded = [sim_flow_rule(f) for f in off]
        nz = self.noise
        if not self._quiet:
            L = self._st.ledger
            L.dumps += 1
            idle = self._idle_rules(host, rail, ovs)
            L.idle_rules += len(idle)
            # OVS keeps the idle peers' rules; their offloaded flows were evicted
            expected = expected[:-1] + idle + expected[-1:]
            g = self._rng(0xF1, host, rail)
            if nz.flow_dump_race_p > 0 and offloaded and g.random() < nz.flow_dump_race_p:
                L.dump_races += 1
                i = int(g.integers(len(offloaded)))
                r = offloaded[i]
                if g.random() < 0.5:
                    # the revalidator changed the rule between the two reads
                    offloaded[i] = replace(r, actions=(*r.actions, "revalidating"))
                else:
                    del offloaded[i]  # installed in OVS, not in the RNIC yet
        return FlowTables(tuple(expected), tuple(offloaded))

    def _idle_rules(self, host: str, rail: int, ovs: list) -> list[FlowRule]:
        """OpenFlow rules towards peers on the rail the endpoint does not probe (and that sent
        nothing for max-idle): OVS has them, the offloaded table does not."""
        k = self.noise.flow_idle_peers
        if k <= 0:
            return []
        reps = sorted({f.in_port for f in ovs if f.action in ("encap", "encap_sw")})
        known = {f.match_dst for f in ovs}
        eps = self.sim.cluster.endpoints
        same = [e for e in eps if e.rail == rail and e.host != host and e.ip not in known]
        if not reps or not same:
            return []
        out = []
        for rep in reps:
            h = int(mix_hash(np.uint64(zlib.crc32(rep.encode())), np.uint64(self.sim.seed)))
            for j in range(min(k, len(same))):
                peer = same[(h + j * 7919) % len(same)]
                match = (("in_port", rep), ("nw_dst", peer.ip))
                out.append(FlowRule(match, ("encap:" + f"{host}/vtep{rail}",), 100))
        return out

    # -- host report --------------------------------------------------------------------------
    def host_report(self, host: str) -> HostReport | None:
        self.calls["host_report"] += 1
        nz = self.noise
        if self._quiet:
            return HostReport(host, **self._flags(host, self.t_s))
        L = self._st.ledger
        L.reports += 1
        g = self._rng(0x4E, host)
        if g.random() < nz.report_missing_p:
            L.reports_missing += 1
            return None
        wanted = [f for f in _SIM_FLAGS if nz.report_readers == "all" or f in REAL_FLAGS]
        read: set[str] = set()
        ages: dict[str, float] = {}
        values: dict[str, Any] = {}
        now = self._flags(host, self.t_s)
        for flag in wanted:
            L.flags += 1
            if g.random() < nz.report_flag_missing_p:
                L.flags_missing += 1
                continue
            read.add(flag)
            v = now[flag]
            age = self._flag_age(host, flag)
            if age > 0:
                ages[flag] = age
                L.flags_stale += 1
                v = self._flags(host, max(0.0, self.t_s - age))[flag]
                L.flags_stale_wrong += v != now[flag]
            values[flag] = v
        if nz.report_readers == "real" and "rnic_state" in values:
            # a real reader sees the port's admin and carrier state only
            values["rnic_state"] = {
                r: ("down" if s == "down" else "up") for r, s in values["rnic_state"].items()
            }
        return HostReport(host, read=frozenset(read), age_s=ages, **values)

    def _flag_age(self, host: str, flag: str) -> float:
        """How old a flag's reading is: what the real agent reads (:data:`REAL_FLAGS`) it reads
        when asked; the other collectors poll every ``report_flag_stale_s`` at a phase of
        their own per host, and the report carries their last poll (whole seconds)."""
        period = self.noise.report_flag_stale_s
        if period <= 0 or flag in REAL_FLAGS:
            return 0.0
        u = int(
            mix_hash(np.uint64(zlib.crc32(f"{host}/{flag}".encode())), np.uint64(self.sim.seed))
        )
        phase = (u / 2**64) * period
        return float(np.floor((self.t_s - phase) % period))

    def _flags(self, host: str, t_s: float) -> dict[str, Any]:
        """Every flag the simulator models, as the host was at ``t_s``."""
        d = self._dump(host, t_s)
        state: dict[int, str] = {}
        gid, bond, churn, peer = set(), set(), set(), set()
        for rail, r in d["rnics"].items():
            rail = int(rail)
            state[rail] = "up"
            for (k, v), s in _RNIC_STATE.items():
                if r.get(k) == v and state[rail] == "up":
                    state[rail] = s
            if r.get("port") == "down" and r.get("phys_state") == "polling":
                state[rail] = "up"  # no light from the switch: its port is down, not ours
                peer.add(rail)
            if r.get("gid") != r.get("registered_gid"):
                gid.add(rail)
            if r.get("bond") == "degraded":
                bond.add(rail)
        for rail in {int(r) for r in d["rnics"]}:
            # the offload counters: flows evicted and re-installed, also while they are out
            if self.sim.view.offload_reinstalls(host, rail, t_s) > 0:
                churn.add(rail)
        cfg = d["config"]
        containers = {v["representor"]: v["container"] for v in d["vfs"]}
        fallback = {
            containers[r["in"]]
            for r in d["rules"]
            if r["action"] == "encap_sw" and r["in"] in containers
        }
        rails = frozenset(range(self.sim.index.rails))
        return {
            "rnic_state": state,
            "peer_down": frozenset(peer),
            "port_down_count": self._port_down_count(host, t_s),
            "rx_errors": self._rx_errors(host, t_s),
            "gid_changed": frozenset(gid),
            "bond_degraded": frozenset(bond),
            "pcie_errors": rails if cfg.get("pcie") == "error" else frozenset(),
            "gpudirect_broken": rails if cfg.get("gpudirect") == "error" else frozenset(),
            "rdma_fallback": frozenset(fallback),
            "hugepage_mismatch": cfg.get("hugepages") == "mismatch",
            "offload_churn": frozenset(churn),
        }

    def _port_down_count(self, host: str, t_s: float) -> dict[int, int]:
        """Carrier-down transitions per rail up to ``t_s``: a few since boot, plus one per
        down period of a port fault on the RNIC or its access link (each flap is one)."""
        sim = self.sim
        out: dict[int, int] = {}
        for rail in range(sim.index.rails):
            key = f"{host}:rnic{rail}"
            base = int(mix_hash(np.uint64(sim.index.host_id[host]), np.uint64(rail)) % 4)
            n = 0
            for f in sim.faults:
                if f.type not in _PORT_TYPES or f.start_s > t_s:
                    continue
                if f.component != key and key not in f.component.split("|"):
                    continue
                ts = np.arange(f.start_s, min(t_s, f.end_s) + 1e-9, 0.5)
                on = sim.engine.on_now(f, ts)
                n += int(on[0]) + int((on[1:] & ~on[:-1]).sum())
            out[rail] = base + n
        return out

    def _rx_errors(self, host: str, t_s: float) -> dict[int, int]:
        """RX errors per rail up to ``t_s``: some since boot, a stray one now and then
        (:data:`RX_BENIGN_P` per :data:`RX_BENIGN_BIN_S`), plus the frames a CRC fault on the
        RNIC's access link corrupted while it was on (:data:`RX_FRAMES_PER_S` times its loss
        rate and the share of flows it hits)."""
        sim = self.sim
        hid = sim.index.host_id[host]
        bins = np.arange(int(max(t_s, 0.0) // RX_BENIGN_BIN_S) + 1, dtype=np.uint64)
        out: dict[int, int] = {}
        for rail in range(sim.index.rails):
            key = f"{host}:rnic{rail}"
            tag = np.uint64(hid * 256 + rail)
            base = int(mix_hash(np.uint64(sim.seed), tag, np.uint64(0xE44)) % 64)
            u = mix_hash(np.uint64(sim.seed), tag, bins).astype(np.float64) / 2**64
            n = float(base + int((u < RX_BENIGN_P).sum()))
            for f in sim.faults:
                if f.type != FailureType.CRC_ERROR or f.start_s > t_s:
                    continue
                if key not in f.component.split("|"):
                    continue
                ts = np.arange(f.start_s, min(t_s, f.end_s), 0.5)
                on_s = 0.5 * float(sim.engine.on_now(f, ts).sum()) if ts.size else 0.0
                share = f.eff("flow_share") * (
                    1.0 if f.paths is None else len(f.paths) / max(1, sim.n_path_ids)
                )
                n += f.eff("loss_rate") * share * RX_FRAMES_PER_S * on_s
            out[rail] = int(n)
        return out


def live_pairs(sim: Any, pairs: Any, t_s: float) -> np.ndarray:
    """The pairs both of whose endpoints are ready and alive at ``t_s``: the pairs being probed."""
    p = np.asarray(pairs, np.int64).reshape(-1, 2)
    return p[sim.live_pairs(t_s, p)]


def sim_localizer(sim: Any, **kw: Any) -> Localizer:
    """A :class:`Localizer` that speaks the simulator's overlay names and traces every path id."""
    kw.setdefault("exoneration_path_ids", tuple(range(sim.n_path_ids)))
    return Localizer(
        sim.cluster,
        overlay_endpoint=sim_overlay_endpoint,
        overlay_component=sim_overlay_component,
        **kw,
    )
