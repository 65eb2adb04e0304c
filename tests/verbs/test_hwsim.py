"""The engine's hardware path end to end, without hardware: the real extension dlopens a stand-in
libibverbs.so.1 (hwsim/ibverbs_standin.c, built here) whose ConnectX-like devices loop UD sends
back with a known one-way delay and stamp completions with free-running counters of mlx5's mask,
each device at its own frequency, start offset and wrap. Everything from the engine's dlopen down
is the shipped code; docs/engine.md says why the seam is there.

Each scenario runs in a subprocess (hwsim/driver.py), since the stand-in must be found by the
dynamic loader before anything loads libibverbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from skh.analysis.detect import Detector
from skh.records import PROBE_DTYPE, ProbeStatus, TsSource

HERE = Path(__file__).resolve().parent / "hwsim"
MLX5_MASK = 0x7FFF_FFFF_FFFF_FFFF  # mlx5_ib_query_device: props->timestamp_mask
FWD_NS, REV_NS = 25_600, 38_400  # one-way delays mlx5_0 -> mlx5_1 and back (32 ns grid)
PROBE, ACK1, ACK2 = 1, 2, 3


@pytest.fixture(scope="module")
def standin(tmp_path_factory, c_builder) -> Path:
    d = tmp_path_factory.mktemp("hwsim")
    lib = c_builder(
        d,
        "ibverbs",
        [str(HERE / "ibverbs_standin.c")],
        f"-Wl,--version-script={HERE / 'libibverbs.map'}",
        "-Wl,-soname,libibverbs.so.1",
        "-lpthread",
    )
    lib.rename(d / "libibverbs.so.1")
    return d


def devices(*specs: tuple[str, str, int, int, int]) -> str:
    return ";".join(f"dev={n},{ip},{khz},{mask:#x},{off:#x}" for n, ip, khz, mask, off in specs)


def two_devices(
    p_khz=156_250, r_khz=1_000_000, p_mask=MLX5_MASK, r_mask=MLX5_MASK, p_off=0, r_off=0
):
    return (
        devices(
            ("mlx5_0", "10.77.0.1", p_khz, p_mask, p_off),
            ("mlx5_1", "10.77.0.2", r_khz, r_mask, r_off),
            ("mlx5_2", "10.77.0.3", 625_000, MLX5_MASK, 77),
        )
        + f";delay=*,*,{FWD_NS};delay=mlx5_1,mlx5_0,{REV_NS}"
    )


def run(standin: Path, scenario: str, config: str, timeout: float = 120, **args) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(standin), "SKH_HWSIM": config}
    out = subprocess.run(
        [sys.executable, str(HERE / "driver.py"), scenario, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    return res


def rows_of(d: dict) -> np.ndarray:
    n = len(d["status"])
    rows = np.zeros(n, PROBE_DTYPE)
    for name in PROBE_DTYPE.names:
        rows[name] = d[name]
    return rows


def tick_ns(khz: int) -> float:
    return 1e6 / khz


CLOCKS = {
    # prober clock, responder clock: different frequencies and origins on each side
    "156.25MHz": dict(p_khz=156_250, r_khz=1_000_000, p_off=0x1234_5678, r_off=99),
    "625MHz": dict(p_khz=625_000, r_khz=156_250, p_off=5, r_off=0x3FFF_0000_0000),
    "1GHz": dict(p_khz=1_000_000, r_khz=625_000, p_off=0x7000_0000_0000_0000, r_off=1),
    # mlx5's 63-bit counters start 0.4 s / 0.7 s below their wrap: both wrap during the run
    "wrap-63bit": dict(
        p_khz=1_000_000, r_khz=156_250, p_off=MLX5_MASK - 400_000_000, r_off=MLX5_MASK - 109_375_000
    ),
    # narrow counters wrap every ~1.07 s / ~1.72 s, at least once during the run
    "wrap-narrow": dict(
        p_khz=1_000_000,
        r_khz=156_250,
        p_mask=(1 << 30) - 1,
        r_mask=(1 << 28) - 1,
        p_off=(1 << 30) - 300_000_000,
        r_off=(1 << 28) - 50_000_000,
    ),
}


def _exact_hw_rtts(res: dict, clocks: dict, n: int) -> np.ndarray:
    """The run's rows, checked: ``n`` probes all OK on NIC stamps, each RTT the injected delay
    (each difference, T5-T2 and T4-T3, on one device's clock: exact to a tick of either side)."""
    rows = rows_of(res["rows"])
    assert len(rows) == n
    counts = dict(zip(*np.unique(rows["status"], return_counts=True), strict=True))
    assert counts == {ProbeStatus.OK: n}, (counts, res["prober"], res["responder"])
    assert (rows["ts_source"] == TsSource.HW).all()
    tick = max(tick_ns(clocks["p_khz"]), tick_ns(clocks["r_khz"]))
    err = rows["rtt_ns"] - (FWD_NS + REV_NS)
    assert np.abs(err).max() <= tick, np.unique(err)
    return rows


@pytest.mark.parametrize("clocks", CLOCKS.values(), ids=CLOCKS.keys())
def test_hw_stamped_rtt_is_the_injected_delay(standin, clocks):
    res = run(standin, "rtt", two_devices(**clocks), n=300, interval_s=0.005)
    rows = _exact_hw_rtts(res, clocks, 300)
    assert (rows["responder_delay_ns"] > 0).all() and (rows["prober_delay_ns"] >= 0).all()
    assert res["responder"]["replies_user_stamps"] == 0
    if "wrap" in str(clocks) or clocks.get("p_mask"):
        # the raw counters ran past their mask during the run (at least once)
        for dev, side in (("mlx5_0", "p"), ("mlx5_1", "r")):
            ticks = res["elapsed_ns"] * clocks[f"{side}_khz"] // 10**6
            mask = clocks.get(f"{side}_mask", MLX5_MASK)
            assert res["counters_before"][dev] + ticks > mask, "the counters must wrap in the run"


def test_a_tick_moves_no_hw_stamped_rtt(standin):
    # both ends wake up at most every 5 ms: probes due every 1 ms leave five at a time, and
    # their answers and stamps wait for a tick too; the NIC's completion stamps are the same
    # whenever they are polled
    tick_s = 0.005
    clocks = CLOCKS["625MHz"]
    both = {"tick_s": tick_s}
    res = run(
        standin, "rtt", two_devices(**clocks), n=400, interval_s=0.001, prober=both, responder=both
    )
    assert res["tick_s"] == [tick_s, tick_s]
    _exact_hw_rtts(res, clocks, 400)
    assert res["responder"]["replies_user_stamps"] == 0  # each ACK1's stamp still awaited
    # one wake-up per tick at most, not one per probe (400 probes and their stamps in 0.4 s)
    for side in ("prober", "responder"):
        assert res[side]["wakeups"] <= res["elapsed_ns"] / (tick_s * 1e9) + 5, res[side]
    # without completion timestamps the stamps are read as completions are polled: no tick
    soft = run(
        standin,
        "rtt",
        two_devices(p_khz=0, r_khz=0),
        n=20,
        interval_s=0.005,
        prober={"tick_s": tick_s, "hw_timestamps": False},
        responder={"tick_s": tick_s, "hw_timestamps": False},
    )
    assert soft["tick_s"] == [0.0, 0.0]
    assert (rows_of(soft["rows"])["status"] == ProbeStatus.OK).sum() >= 19


def test_verbs_engines_on_one_thread_keep_nic_exact_rtts(standin):
    # prober and responder share a thread, as an agent's engines do: one wake-up per tick serves
    # both, and while a probe falls due every turn their completion queues are read each turn
    # unarmed (an armed queue costs a NIC interrupt, a read of the channel and a re-arm per turn)
    tick_s = 0.005
    clocks = CLOCKS["1GHz"]
    both = {"tick_s": tick_s}
    res = run(
        standin,
        "rtt",
        two_devices(**clocks),
        n=400,
        interval_s=0.001,
        prober=both,
        responder=both,
        shared_thread=True,
    )
    _exact_hw_rtts(res, clocks, 400)
    assert res["responder"]["replies_user_stamps"] == 0
    turns = [res[side]["wakeups"] for side in ("prober", "responder")]
    assert abs(turns[0] - turns[1]) <= 3, turns  # the same turns, counted by each
    assert max(turns) <= res["elapsed_ns"] / (tick_s * 1e9) + 5, turns
    # armed only to sleep: before the first probe, after the last, and between ticks where the
    # machine fell behind; the probes' 400 ms of turns (~80) go without
    assert res["notify_requests"] <= max(turns) / 4, (res["notify_requests"], turns)
    assert res["notify_events"] <= res["notify_requests"]


def truth_by_tseq(log: list[dict], session: int, timeout_ns: int) -> dict[int, str]:
    """What really happened to each probe, from the stand-in's own log: "request" or "reply" lost,
    "ok", or "late" when an answer reached the prober around or after the probe's timeout (the
    responder's first replies wait for its address handle to the prober; a busy machine delays
    the stand-in's delivery thread), where OK and REPLY_LOST are both true."""
    probes = {e["seq"]: e for e in log if e["type"] == PROBE and e["session"] == session}
    acks: dict[int, list[dict]] = {}
    for e in log:
        if e["type"] in (ACK1, ACK2) and e["session"] == session:
            acks.setdefault(e["seq"], []).append(e)
    out = {}
    for seq, p in probes.items():
        a = acks.get(seq, [])
        if p["fate"] != 1:
            out[p["tseq"]] = "request"
        elif len(a) < 2 or any(x["fate"] != 1 for x in a):
            out[p["tseq"]] = "reply"
        elif max(x["deliver_ns"] for x in a) > p["t_ns"] + timeout_ns - 2_000_000:
            out[p["tseq"]] = "late"
        else:
            out[p["tseq"]] = "ok"
    return out


def test_loss_by_direction_matches_what_the_fabric_dropped(standin):
    """10 % of the probes lost on the way out, 10 % of the answers on the way back: every record
    names the direction that really failed (the stand-in logs each datagram's fate)."""
    res = run(
        standin,
        "loss",
        two_devices(),
        n=1000,
        interval_s=0.002,
        timeout_s=0.05,
        # receipts that come late (a loaded machine) are still waited for
        direction_wait_s=0.5,
        seed=20250917,
        loss=[["mlx5_0", "mlx5_1", 0.1, PROBE], ["mlx5_1", "mlx5_0", 0.1, 0]],
    )
    rows = rows_of(res["rows"])
    truth = truth_by_tseq(res["log"], res["session"], 50_000_000)
    assert len(rows) == len(truth) == 1000
    assert sum(v == "late" for v in truth.values()) < 100, truth
    want = {
        "ok": {ProbeStatus.OK},
        "request": {ProbeStatus.REQUEST_LOST},
        "reply": {ProbeStatus.REPLY_LOST},
        "late": {ProbeStatus.OK, ProbeStatus.REPLY_LOST},
    }
    # a loss nobody can attribute stays LOST: before the responder first heard of the stream
    # (it cannot vouch for probes it never knew of) or after the last answer that came back
    heard = [t for t, v in sorted(truth.items()) if v != "request"]
    answered = [t for t, v in sorted(truth.items()) if v in ("ok", "late")]
    unknowable = {t for t in truth if t < heard[0] or t > answered[-1]}
    wrong = [
        (int(r["seq"]), truth[int(r["seq"])], ProbeStatus(int(r["status"])).name)
        for r in rows
        if r["status"] not in want[truth[int(r["seq"])]]
        and not (r["status"] == ProbeStatus.LOST and int(r["seq"]) in unknowable)
    ]
    assert not wrong, wrong[:20]
    lost = rows[rows["status"] == ProbeStatus.LOST]
    assert len(lost) <= 4, lost["seq"]
    n_req = sum(v == "request" for v in truth.values())
    n_rep = sum(v == "reply" for v in truth.values())
    # binomial: 10 % (mean 100, sd 9.5); 19 % of the rest (mean 171, sd 12)
    assert 60 <= n_req <= 140 and 120 <= n_rep <= 230, (n_req, n_rep)
    s = res["prober"]
    assert (s["request_lost"], s["reply_lost"]) == (
        int((rows["status"] == ProbeStatus.REQUEST_LOST).sum()),
        int((rows["status"] == ProbeStatus.REPLY_LOST).sum()),
    )

    # the detector counts the reverse path's loss as loss: the pair is flagged from these records
    det = Detector()
    rev = np.sort(rows[rows["status"] != ProbeStatus.REQUEST_LOST], order="t_wall_ns")
    # up to the last answered probe: the fast path decides a trailing failure by the probe after
    # it (OK: loss; failed: an outage)
    rev = rev[: np.flatnonzero(rev["status"] == ProbeStatus.OK)[-1] + 1]
    assert (rev["status"] == ProbeStatus.REPLY_LOST).sum() >= 100
    det.ingest(rev)
    events = []
    t0, t_end = int(rows["t_wall_ns"].min()), int(rows["t_wall_ns"].max())
    for t in range(t0, t_end + 10 * 10**9, 10**9):  # the agents' heartbeats, once a second
        det.heartbeat(np.array([1, 7], np.uint32), t)
        events += det.tick(t)
    assert [e.kind for e in events] == ["loss"], [e.explanation for e in events]
    assert events[0].pairs == ((1, 7),)


@pytest.mark.parametrize(
    ("who", "not_allowed"),
    [
        # nothing the fault did counts as network loss: the probes it caught are the prober's own
        ("prober", [ProbeStatus.LOST, ProbeStatus.REQUEST_LOST, ProbeStatus.REPLY_LOST]),
        # probes that reached the responder's dead QP never reached the responder, and answers
        # its dead QP flushed are reply loss to the prober (the responder counts reply_errors):
        # every loss has its direction
        ("responder", [ProbeStatus.LOST]),
    ],
)
def test_a_qp_in_error_state_is_recovered(standin, who, not_allowed):
    res = run(
        standin, "qp_error", two_devices(), interval_s=0.002, before_s=0.3, after_s=0.5, who=[who]
    )
    rows = rows_of(res["rows"])
    assert res[f"{who}_transport"]["qp_recoveries"] >= 1, res[f"{who}_transport"]
    st = rows["status"]
    assert not np.isin(st, not_allowed).any(), np.unique(st, return_counts=True)
    if who == "prober":
        assert (st == ProbeStatus.LOCAL_ERROR).sum() <= 3
    after = rows[rows["t_wall_ns"] > res["t_fault_ns"] + 20_000_000]
    # probing goes on (at most 240 probes in the 0.48 s; far fewer on a starved machine)
    assert len(after) >= 30 and (after["status"] == ProbeStatus.OK).all()
    assert (after["ts_source"] == TsSource.HW).all()


@pytest.mark.parametrize(
    ("n_fail", "expect"), [(5, ProbeStatus.OK), (10**6, ProbeStatus.LOCAL_ERROR)]
)
def test_a_full_send_queue_is_retried_never_recorded_as_loss(standin, n_fail, expect):
    res = run(standin, "fail_posts", two_devices(), n=20, n_fail=n_fail, timeout_s=0.1)
    rows = rows_of(res["rows"])
    rows = rows[rows["dst_ep"] == 8]
    assert len(rows) == 20
    assert (rows["status"] == expect).all(), np.unique(rows["status"], return_counts=True)
    s = res["prober"]
    assert s["send_deferred"] >= min(n_fail, 20)
    if expect == ProbeStatus.LOCAL_ERROR:
        assert s["send_errors"] == 20 and s["local_error"] == 20 and s["sent"] == 3


def test_address_handles_resolve_off_the_engine_thread(standin):
    """The responder meets a prober on a device it never talked to; resolving the reply's address
    handle takes 300 ms (ARP on a real NIC). Meanwhile it keeps answering the prober it knows at
    once, and the newcomer's first probe is answered when the handle is there."""
    config = two_devices() + ";ah_delay=300000000"
    res = run(standin, "ah_async", config, interval_s=0.005, warm_s=1.0, run_s=1.2, n_c=50)
    a, c = rows_of(res["a"]), rows_of(res["c"])
    assert (a["status"] == ProbeStatus.OK).all(), np.unique(a["status"], return_counts=True)
    during = a[(a["t_wall_ns"] > res["t_c_ns"]) & (a["t_wall_ns"] < res["t_c_ns"] + 700_000_000)]
    assert len(during) >= 60
    # a stalled engine thread would hold these for the whole 300 ms
    assert np.percentile(during["responder_delay_ns"], 99) < 50_000_000, during[
        "responder_delay_ns"
    ]
    assert (c["status"] == ProbeStatus.OK).all(), np.unique(c["status"], return_counts=True)
    assert c["responder_delay_ns"].max() >= 250_000_000  # the first reply waited for its handle
    assert (c["rtt_ns"] == 2 * FWD_NS).all()  # and its RTT is still the network's
    assert res["responder"]["send_deferred"] >= 1


def test_more_paths_than_address_handles_evicts_least_recently_used(standin):
    res = run(
        standin,
        "many_paths",
        two_devices(),
        n_paths=200,
        interval_s=0.25,
        count=3,
        address_handles=150,
        timeout=240,
    )
    rows = rows_of(res["rows"])
    assert len(rows) == 600
    assert (rows["status"] == ProbeStatus.OK).all(), np.unique(rows["status"], return_counts=True)
    assert sorted(set(rows["path_id"].tolist())) == list(range(200))
    for side in ("prober_transport", "responder_transport"):
        assert res[side]["ah_evicted"] > 0 and res[side]["ah_failures"] == 0, res[side]


def test_a_rotating_target_takes_one_flow_label_per_path_both_ways(standin):
    """A target rotating over 6 path ids: each probe and its answers carry the flow label of
    its path id (the RoCEv2 source port on mlx5), one address handle per label and side."""
    res = run(standin, "rtt", two_devices(), n=24, interval_s=0.005, path_id=2, paths=6)
    rows = np.sort(rows_of(res["rows"]), order="seq")
    assert (rows["status"] == ProbeStatus.OK).all()
    assert rows["path_id"].tolist() == [2 + k % 6 for k in range(24)]
    log = res["log"]
    probes = sorted((e["tseq"], e["flow_label"]) for e in log if e["type"] == PROBE)
    assert [fl for _, fl in probes] == [3 + k % 6 for k in range(24)]  # label = 1 + path id
    # each answer leaves on its probe's label
    assert {e["flow_label"] for e in log if e["type"] in (ACK1, ACK2)} == set(range(3, 9))
    assert res["prober_transport"]["ah_created"] == 6
    assert res["responder_transport"]["ah_created"] == 6


def test_probes_ride_the_configured_traffic_class(standin):
    res = run(
        standin,
        "rtt",
        two_devices(),
        n=20,
        interval_s=0.005,
        prober={"traffic_class": 106, "priority": 3},  # DSCP 26 with ECT(0), priority 3
        responder={"traffic_class": 1, "priority": 5},
        path_id=17,
    )
    log = res["log"]
    probes = [e for e in log if e["type"] == PROBE]
    acks = [e for e in log if e["type"] in (ACK1, ACK2)]
    assert len(probes) == 20 and len(acks) == 40
    assert {(e["tclass"], e["sl"]) for e in probes} == {(106, 3)}
    # replies keep the probe's DSCP, with the responder's own ECN bits and priority
    assert {(e["tclass"], e["sl"]) for e in acks} == {(104 | 1, 5)}
    # path 17 pins one flow label both ways
    assert {e["flow_label"] for e in log} == {18}


def test_probes_that_are_no_latency_sample_get_one_answer_on_the_nic_too(standin):
    """Sampling periods of 0.1 s over probes 5 ms apart on four flow labels: the probes that
    may be a period's sample ask for an RTT and get NIC-stamped, exact RTTs; the others ask for
    one answer (SKH_POPT_NO_T34): the responder posts ACK1 alone and neither side reads a
    send completion's stamp for them; their records are OK without an RTT."""
    clocks = CLOCKS["625MHz"]
    res = run(
        standin,
        "rtt",
        two_devices(**clocks),
        n=200,
        interval_s=0.005,
        paths=4,
        sample_period_s=0.1,
        sample_phase_ns=0,
    )
    rows = rows_of(res["rows"])
    assert len(rows) == 200 and (rows["status"] == ProbeStatus.OK).all(), res["prober"]
    asked = rows["rtt_ns"] > 0
    assert 8 <= asked.sum() <= 40, asked.sum()  # ~1 s of 0.1 s periods, a sample each
    assert (rows["ts_source"][asked] == TsSource.HW).all()
    err = rows["rtt_ns"][asked] - (FWD_NS + REV_NS)
    assert np.abs(err).max() <= max(tick_ns(clocks["p_khz"]), tick_ns(clocks["r_khz"]))
    assert (rows["rtt_ns"][~asked] == -1).all() and (rows["ts_source"][~asked] == 0).all()
    p, r = res["prober"], res["responder"]
    assert p["probes_no_rtt"] == 200 - asked.sum()
    assert p["acks_received"] == 200 + asked.sum()
    assert r["replies_sent"] == 200 + asked.sum()
