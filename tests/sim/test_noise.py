"""Benign noise regimes: every source does what the regime says, is counted, and replays."""

from dataclasses import replace

import numpy as np
import pytest

from skh.errors import ConfigError
from skh.model import Cluster, Fabric, JobShape
from skh.records import ProbeStatus, is_loss
from skh.sim.answers import ANSWER_SOURCES, FIELD_ANSWERS, QUIET
from skh.sim.jobs import HostPool, make_job
from skh.sim.noise import FIELD, LAB, REGIMES, NoiseRegime, regime
from skh.sim.scenario import Simulation


def _sim(noise, *, seed: int = 7, interval: float = 0.1) -> Simulation:
    fabric = Fabric.from_params(hosts=32, hosts_per_segment=8, spines=2)
    cluster = Cluster(fabric)
    pool = HostPool(cluster)
    a = make_job(cluster, "a", JobShape(8, 2, 8), pool=pool, ready_delay_s=np.zeros(16), seed=1)
    b = make_job(cluster, "b", JobShape(8, 1, 8), pool=pool, ready_delay_s=np.zeros(8), seed=2)
    return Simulation(cluster, [a, b], seed=seed, probe_interval_s=interval, noise=noise)


def _run(sim: Simulation, seconds: int):
    steps = list(sim.run(seconds))
    return np.concatenate([s.probes for s in steps]), steps


def test_regimes_are_named_sourced_and_validated():
    assert {"lab", "field", "field-heavy"} <= set(REGIMES)
    assert regime(None) is LAB and regime("field") is FIELD
    assert LAB.quiet and not FIELD.quiet
    # every knob the field regime turns on says where its magnitude comes from
    for knob in (
        "link_loss_median",
        "spike_p",
        "stalls_per_host_h",
        "clock_steps_per_host_day",
        "congestion_per_switch_h",
        "agent_restarts_per_container_day",
    ):
        assert getattr(FIELD, knob) > 0 and FIELD.sources.get(knob), knob
    # what agents answer localization: its own noise, with its own sources, composed here
    assert FIELD.answers is FIELD_ANSWERS and LAB.answers is QUIET and FIELD.sources["answers"]
    for knob in ("trace_rate_limit_p", "report_flag_missing_p", "report_flag_stale_s"):
        assert getattr(FIELD.answers, knob) > 0 and ANSWER_SOURCES.get(knob), knob
    heavy = REGIMES["field-heavy"]
    assert heavy.link_loss_median == pytest.approx(3 * FIELD.link_loss_median)
    assert heavy.answers.report_flag_missing_p == pytest.approx(
        3 * FIELD_ANSWERS.report_flag_missing_p
    )
    assert heavy.congestion_max_ns == FIELD.congestion_max_ns  # stays benign by definition
    with pytest.raises(ConfigError):
        regime("nope")
    with pytest.raises(ConfigError):
        NoiseRegime("bad", link_loss_median=-1.0)
    with pytest.raises(ConfigError):
        NoiseRegime("bad", congestion_min_s=20.0, congestion_max_s=10.0)


def test_lab_regime_has_no_benign_loss():
    probes, _ = _run(_sim("lab"), 30)
    assert (probes["status"] == ProbeStatus.OK).all()


def test_field_loss_is_per_link_and_by_direction():
    sim = _sim("field")
    probes, _ = _run(sim, 120)
    m = sim.noise_measured()
    # the ledger counts what the probes show, and the rate is the regime's order of magnitude
    st = probes["status"]
    assert m["request_lost"] == (st == ProbeStatus.REQUEST_LOST).sum()
    assert m["reply_lost"] == (st == ProbeStatus.REPLY_LOST).sum()
    assert 3e-5 < m["benign_loss_per_probe"] < 2e-3
    # some flows lose far more than others (per-link rates, bad links)
    loss = sim._flow_loss
    assert loss.max() > 5 * np.median(loss) > 0
    # heavy tail: the p99.99 RTT is far above the body, the median is not
    assert m["rtt_over_base"]["p50"] < 1.05 and m["rtt_over_base"]["max"] > 1.5


def test_one_seed_one_noise():
    a, _ = _run(_sim("field", seed=3), 40)
    b, _ = _run(_sim("field", seed=3), 40)
    c, _ = _run(_sim("field", seed=4), 40)
    assert np.array_equal(a, b)
    assert not np.array_equal(a["rtt_ns"][:1000], c["rtt_ns"][:1000])


def test_cpu_stalls_skip_probes_delay_and_time_out_replies():
    # one stall per host every ~10 s, long enough to pass the 1 s timeout now and then
    r = replace(FIELD, name="stalls", stalls_per_host_h=360.0, stall_median_s=0.6, stall_sigma=0.5)
    sim = _sim(r)
    probes, _ = _run(sim, 60)
    m = sim.noise_measured()
    assert m["cpu_stalls"] > 50 and m["stall_skipped_probes"] > 0
    assert m["stall_timeouts"] > 0 and m["local_errors"] > 0
    st = probes["status"]
    assert (st == ProbeStatus.LOCAL_ERROR).sum() == m["local_errors"]
    # a late answer shows as responder delay; its network RTT (hardware stamps) stays healthy
    ok = st == ProbeStatus.OK
    slow = ok & (probes["responder_delay_ns"] > 50_000_000)
    assert slow.any() and (probes["rtt_ns"][slow] < 200_000).all()


def test_agent_restart_silences_the_agent_and_restarts_its_numbering():
    r = replace(
        LAB,
        name="restarts",
        agent_restarts_per_container_day=86400.0 / 20,  # one per container every ~20 s
        agent_restart_min_s=1.0,
        agent_restart_max_s=1.5,
    )
    sim = _sim(r)
    probes, steps = _run(sim, 40)
    m = sim.noise_measured()
    assert m["agent_restarts"] > 0 and m["agent_restart_lost_probes"] > 0
    assert (probes["status"] == ProbeStatus.LOST).sum() == m["agent_restart_lost_probes"]
    # some pair's seq went back down while its send times went on
    order = np.lexsort((probes["t_wall_ns"], probes["dst_ep"], probes["src_ep"]))
    p = probes[order]
    same = (p["src_ep"][1:] == p["src_ep"][:-1]) & (p["dst_ep"][1:] == p["dst_ep"][:-1])
    back = same & (p["seq"][1:].astype(np.int64) < p["seq"][:-1].astype(np.int64))
    assert back.any()
    # and its agent missed a heartbeat meanwhile
    live = np.unique(np.concatenate([s.heartbeats for s in steps]))
    assert any(len(s.heartbeats) < live.size for s in steps)


def test_congestion_episodes_are_short_small_and_on_busy_switches():
    r = replace(LAB, name="cong", congestion_per_switch_h=600.0)
    sim = _sim(r, interval=1.0)
    probes, _ = _run(sim, 300)
    m = sim.noise_measured()
    assert m["congestion_episodes"] > 0 and m["congestion_probes"] > 0
    assert m["congestion_s"]["p100"] <= 10.0 and m["congestion_us"]["p100"] <= 10.0
    base = sim.probe_model.base_rtt_ns(probes["src_ep"], probes["dst_ep"])
    extra = probes["rtt_ns"] - base
    # +10 us at most per switch (a path crosses up to three congested tiers at once)
    assert extra.max() < 3 * 10_000 + 0.3 * base.max()
    assert not is_loss(probes["status"]).any()  # a lossless fabric delays, it does not drop


def test_clock_steps_shift_a_hosts_send_times():
    r = replace(
        LAB,
        name="steps",
        clock_steps_per_host_day=86400.0 / 5,
        clock_step_min_s=0.5,
        clock_step_max_s=0.5,
    )
    sim = _sim(r)
    probes, _ = _run(sim, 20)
    m = sim.noise_measured()
    assert m["clock_steps"] > 0
    assert np.abs(sim.noise_model.clock_offset_s).max() >= 0.5
    # some pair's send times jump by about the step between consecutive probes
    order = np.lexsort((probes["seq"], probes["dst_ep"], probes["src_ep"]))
    p = probes[order]
    same = (p["src_ep"][1:] == p["src_ep"][:-1]) & (p["dst_ep"][1:] == p["dst_ep"][:-1])
    gap = np.diff(p["t_wall_ns"].astype(np.int64))[same]
    assert (np.abs(gap) > 300_000_000).any()


def test_the_engines_tick_moves_the_delays_not_the_rtts():
    from skh.policy import ENGINE_TICK_S

    ticking = _run(_sim("field", seed=5), 20)[0]
    plain_sim = _sim("field", seed=5)
    plain_sim.probe_model.tick_ns = 0.0
    plain = _run(plain_sim, 20)[0]
    # the same probes, the same outcomes and wire-stamped RTTs
    for f in ("src_ep", "dst_ep", "seq", "status", "rtt_ns"):
        assert np.array_equal(ticking[f], plain[f]), f
    ok = ticking["status"] == ProbeStatus.OK
    tick_ns = ENGINE_TICK_S * 1e9
    for f in ("responder_delay_ns", "prober_delay_ns"):
        extra = (ticking[f] - plain[f])[ok]
        assert extra.min() >= -1 and extra.max() <= tick_ns + 1  # float32 sums, rounded
        # spread over the whole tick, each side on its own
        assert np.allclose(
            np.quantile(extra, [0.1, 0.5, 0.9]) / tick_ns, [0.1, 0.5, 0.9], atol=0.03
        )
    r = ticking["responder_delay_ns"][ok] - plain["responder_delay_ns"][ok]
    p = ticking["prober_delay_ns"][ok] - plain["prober_delay_ns"][ok]
    assert abs(np.corrcoef(r, p)[0, 1]) < 0.05
