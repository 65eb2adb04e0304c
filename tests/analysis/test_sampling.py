"""What the agents forward (every failure, one OK per pair and second); the detector must decide
the same on that as on everything."""

from __future__ import annotations

import numpy as np
import pytest

from skh.analysis.detect import Detector
from skh.analysis.sampling import SAMPLE_STATE, ResultThinner, blank_sample_state, period_samples
from skh.records import ProbeStatus, empty_probes, pair_keys

T0 = 1_700_000_000 * 10**9
S = 10**9
PER_S = 10


def second(
    sec: int, n_eps: int, rng: np.random.Generator, *, slow=None, lost=None, paths: int = 4
) -> np.ndarray:
    """Ten probes per ordered pair in second ``sec``, rotating over ``paths`` path ids."""
    s, d = np.meshgrid(np.arange(n_eps), np.arange(n_eps), indexing="ij")
    off = s != d
    src, dst = s[off], d[off]
    n = src.size
    phase = (np.arange(n) * 0.37) % 0.1
    parts = []
    for j in range(PER_S):
        b = empty_probes(n)
        b["src_ep"], b["dst_ep"] = src, dst
        b["seq"] = sec * PER_S + j
        b["path_id"] = (sec * PER_S + j) % paths
        b["t_wall_ns"] = T0 + ((sec + j / PER_S + phase) * S).astype(np.int64)
        rtt = 13.0 * np.exp(0.05 * rng.standard_normal(n))
        if slow is not None:
            rtt = rtt + np.where(slow(src, dst), 15.0, 0.0)
        st = np.zeros(n, np.uint8)
        if lost is not None:
            st[lost(src, dst) & (rng.random(n) < 0.05)] = ProbeStatus.LOST
        b["status"] = st
        ok = st == ProbeStatus.OK
        b["rtt_ns"] = np.where(ok, rtt * 1e3, -1)
        b["prober_delay_ns"] = np.where(ok, 4000, -1)
        b["responder_delay_ns"] = np.where(ok, 2000, -1)
        parts.append(b)
    return np.concatenate(parts)


def test_failures_the_ok_after_them_one_ok_per_pair_and_second_and_progress_are_kept():
    rng = np.random.default_rng(1)
    th = ResultThinner()
    sent = kept = 0
    lost_kept = lost_sent = 0
    for sec in range(30):
        b = second(sec, 4, rng, lost=lambda s, d: d == 2)
        out = th.thin(b)
        sent, kept = sent + b.size, kept + out.size
        lost_sent += int((b["status"] != 0).sum())
        lost_kept += int((out["status"] != 0).sum())
        # every prober's newest result goes out: the analyzer's measure of its progress
        for src in range(4):
            newest = b["t_wall_ns"][b["src_ep"] == src].max()
            assert out["t_wall_ns"][out["src_ep"] == src].max() == newest
        # each failure run ends with an OK that is kept
        for key in set(zip(out["src_ep"].tolist(), out["dst_ep"].tolist(), strict=True)):
            m = (b["src_ep"] == key[0]) & (b["dst_ep"] == key[1])
            rows = b[m][np.argsort(b[m]["t_wall_ns"])]
            after = np.flatnonzero((rows["status"][:-1] != 0) & (rows["status"][1:] == 0)) + 1
            mine = (out["src_ep"] == key[0]) & (out["dst_ep"] == key[1])
            assert np.isin(rows["seq"][after], out["seq"][mine]).all()
    assert lost_kept == lost_sent > 0
    pairs_s = 12 * 30
    # one sample a pair and second, the OK after each failure on the pair and on its flow,
    # each prober's newest per batch
    assert pairs_s <= kept <= pairs_s + 3 * lost_sent + 4 * 30 + 12
    assert sent == PER_S * pairs_s


def test_a_batch_out_of_send_time_order_is_thinned_as_one_in_order():
    """The thinner sorts a batch by pair alone when each pair's rows come in send-time order (as
    agents drain them) and by pair and send time otherwise: both keep the same records."""
    rng_a, rng_b, mix = (np.random.default_rng(s) for s in (3, 3, 4))
    in_order, shuffled = ResultThinner(), ResultThinner()
    lost = 0
    for sec in range(20):
        a = second(sec, 4, rng_a, lost=lambda s, d: d == 1, paths=5)
        b = second(sec, 4, rng_b, lost=lambda s, d: d == 1, paths=5)
        out = in_order.thin(a)
        assert out.tobytes() == shuffled.thin(b[mix.permutation(b.size)]).tobytes()
        lost += int((out["status"] != 0).sum())
    assert lost > 0


def _faulty_second(sec: int, rng: np.random.Generator, paths: int) -> np.ndarray:
    """Second ``sec`` of five endpoints' probes; from 400 s on, endpoint 1's probes are slow
    and 5 % of those to endpoint 3 are lost."""
    kw = {}
    if sec >= 400:
        kw = {"slow": lambda s, d: s == 1, "lost": lambda s, d: d == 3}
    return second(sec, 5, rng, paths=paths, **kw)


@pytest.mark.parametrize("paths", [4, 19])
def test_the_detector_decides_the_same_on_thinned_results(paths):
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
    full, thin = Detector(), Detector()
    th = ResultThinner()
    ev_full, ev_thin = [], []
    for sec in range(460):
        a, b = _faulty_second(sec, rng_a, paths), _faulty_second(sec, rng_b, paths)
        full.ingest(a)
        thin.ingest(th.thin(b))
        for det, out in ((full, ev_full), (thin, ev_thin)):
            det.heartbeat(np.arange(5), T0 + sec * S)
            out += det.tick(T0 + (sec + 1) * S)
    assert {e.kind for e in ev_full} == {"latency-short", "loss"}
    assert [(e.kind, e.pairs, e.first_seen_ns, e.detected_ns) for e in ev_full] == [
        (e.kind, e.pairs, e.first_seen_ns, e.detected_ns) for e in ev_thin
    ]
    assert thin.stats.records_in * 5 < full.stats.records_in


def _sampled(batches: list[np.ndarray]) -> set[tuple[int, int, int]]:
    """(src, dst, send time) of the latency samples :func:`period_samples` takes, fed the
    batches in turn from a fresh state (as a detector starting on them)."""
    keys = np.unique(np.concatenate([pair_keys(b["src_ep"], b["dst_ep"]) for b in batches]))
    state = np.zeros(keys.size, SAMPLE_STATE)
    blank_sample_state(state, keys, S)
    out = set()
    for b in batches:
        b = b[b["status"] == ProbeStatus.OK]
        pid = np.searchsorted(keys, pair_keys(b["src_ep"], b["dst_ep"]))
        order = np.lexsort((b["t_wall_ns"], pid))
        b, pid = b[order], pid[order]
        k = period_samples(pid, b["t_wall_ns"], b["seq"], b["path_id"], state, period_ns=S)
        out |= set(
            zip(
                b["src_ep"][k].tolist(),
                b["dst_ep"][k].tolist(),
                b["t_wall_ns"][k].tolist(),
                strict=True,
            )
        )
    return out


def test_the_analyzer_samples_what_the_agent_forwarded_whatever_ok_each_saw_first():
    """CI draw 277862802 + 930980059: periods were phased from the first OK each party saw,
    and an agent whose first OK was not a sample forwarded its samples into the analyzer's
    periods off by a fraction: the analyzer waited for path ids the agent had sampled the
    period before, and kept 0.57 samples a second of a pair probed twenty times a second. The
    periods now come from the pair: the analyzer takes what the agent sampled, from the start
    (the agent's first OKs here are on path ids 2, 3, ... of 14) and after it restarts."""
    rng = np.random.default_rng(3)
    raw = [second(sec, 4, rng, paths=14) for sec in range(3, 123)]
    th = ResultThinner()
    shipped = [th.thin(b) for b in raw]
    want = _sampled(raw)  # what the agent takes, seeing every probe
    assert len(want) >= 12 * 119
    assert _sampled(shipped) == want
    # an analyzer that restarts a minute in takes a sample a period again within a few periods
    # (until its path-id walk meets the agent's, some are other OKs the agent forwarded)
    after = {x for x in want if x[2] >= T0 + 63 * S}
    again = _sampled(shipped[60:])
    assert len(again) >= len(after) - 12 * 3
    assert len(again & after) >= len(after) - 12 * 10


@pytest.mark.parametrize("interval_s", [0.02, 0.05, 0.1, 0.25, 0.63, 1.0])
@pytest.mark.parametrize("paths", [1, 4, 5, 8, 16, 19, 45, 64])
def test_the_latency_sample_walks_every_path_id_of_the_plans_rotation(paths, interval_s):
    """A pair probed every ``interval_s`` over ``paths`` path ids (probe k on k % paths, as the
    engine rotates them; the plan's lengths: 19 for 4 ECMP paths, 45 for 9): the ids its
    latency samples take (batches of a second, as an agent drains them) cover the rotation — so
    an ECMP path that only some ids hash onto is sampled too — and every period has its sample.
    Before, the id whose turn it was came from ``period % 4``: at 10 probes/s only 5 of 8 ids
    were ever sampled, 36 of 45."""
    rng = np.random.default_rng(paths * 1000 + int(interval_s * 100))
    per_period = max(1.0, 1.0 / interval_s)
    # each id recurs every `paths` probes; a wanted one is taken at its next turn at the latest
    horizon_s = int(paths * (paths / per_period + 2) + 30)
    k = np.arange(int(horizon_s / interval_s))
    b = empty_probes(k.size)
    b["src_ep"], b["dst_ep"] = 1, 2
    b["seq"] = k
    b["path_id"] = k % paths
    jitter = rng.uniform(-0.1, 0.1, k.size) * interval_s
    b["t_wall_ns"] = T0 + ((k * interval_s + jitter) * S).astype(np.int64)
    state = np.zeros(1, SAMPLE_STATE)
    blank_sample_state(state, pair_keys(np.array([1]), np.array([2])), S)
    taken = []
    for sec in range(horizon_s + 1):
        m = np.flatnonzero((b["t_wall_ns"] >= T0 + sec * S) & (b["t_wall_ns"] < T0 + (sec + 1) * S))
        keep = period_samples(
            np.zeros(m.size, np.int64),
            b["t_wall_ns"][m],
            b["seq"][m],
            b["path_id"][m],
            state,
            period_ns=S,
        )
        taken.append(b["path_id"][m][keep])
    ids = np.concatenate(taken)
    assert set(ids.tolist()) == set(range(paths))
    # one sample per period once probes come at least once a period
    assert ids.size >= horizon_s - 2


def _agent_stream(rng: np.random.Generator, secs: int) -> list[np.ndarray]:
    """An agent's drains, a second each: pairs of several probers at their own intervals and
    rotations, failures of every status in runs and alone (a lost probe's record is drained
    after later answers, as the engine decides it at its timeout), clock jitter, a prober
    restarting its sequence numbers, and pairs that come and go."""
    n_pairs = 12
    src = rng.integers(0, 4, n_pairs)
    dst = rng.integers(4, 40, n_pairs)
    iv = rng.choice([0.02, 0.05, 0.1, 0.25, 0.63, 1.3], n_pairs)
    paths = rng.choice([1, 3, 4, 19, 64], n_pairs)
    start = rng.uniform(0, 3, n_pairs)
    batches = []
    for sec in range(secs):
        rows = []
        for p in range(n_pairs):
            k0 = max(0, int(np.ceil((sec - start[p]) / iv[p])))
            k1 = int(np.ceil((sec + 1 - start[p]) / iv[p]))
            if sec > secs // 2 and p % 5 == 0:
                continue  # gone from the list
            seq0 = 7_000_000 if sec > secs // 3 and p % 4 == 1 else 2**32 - 40
            for k in range(k0, k1):
                t = start[p] + k * iv[p] + rng.uniform(-0.1, 0.1) * iv[p]
                rows.append((p, (seq0 + k) % 2**32, k % paths[p], t))
        b = empty_probes(len(rows))
        if rows:
            pid = np.array([r[0] for r in rows])
            b["src_ep"], b["dst_ep"] = src[pid], dst[pid]
            b["seq"] = [r[1] for r in rows]
            b["path_id"] = [r[2] for r in rows]
            b["t_wall_ns"] = T0 + (np.array([r[3] for r in rows]) * S).astype(np.int64)
            fail = (rng.random(b.size) < 0.08) | ((pid == 3) & (sec % 7 < 2))
            b["status"] = np.where(fail, rng.integers(1, 8, b.size), 0)
            b["rtt_ns"] = np.where(fail, -1, rng.integers(5_000, 50_000, b.size))
            # decision order: answers as they come, failures a timeout later
            b = b[np.argsort(b["t_wall_ns"] + np.where(fail, S // 2, 0), kind="stable")]
        batches.append(b)
    return batches


@pytest.mark.parametrize("seed", range(6))
def test_the_agents_row_thinner_keeps_what_the_result_thinner_keeps(seed):
    """The overlay agent thins record tuples in plain Python (it must not load numpy): the same
    records in the same order as the numpy thinner, batch after batch, and so the same latency
    samples as the detector's rule (which the numpy thinner runs)."""
    from skh.analysis.rowthin import RowThinner

    rng = np.random.default_rng(seed)
    ref, rows = ResultThinner(), RowThinner()
    kept = failed = 0
    for b in _agent_stream(rng, 40):
        want = ref.thin(b)
        got = rows.thin(b.tolist())
        assert got == want.tolist()
        kept += len(got)
        failed += int((want["status"] != 0).sum())
    assert 0 < failed < kept


@pytest.mark.parametrize("paths", [4, 19])
def test_oks_without_an_rtt_are_never_samples_and_the_detector_decides_the_same(paths):
    """A prober that asks for RTTs only on its latency samples (Engine.add_target
    ``sample_period_s``) sends OKs without an RTT for the rest: the thinners (numpy and
    per-record) keep the same rows from that stream, and a detector fed it decides as one fed
    every RTT."""
    from skh.analysis.rowthin import RowThinner

    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    full, thin = Detector(), Detector()
    th, rows = ResultThinner(), RowThinner()
    keys = np.unique(pair_keys(*np.nonzero(~np.eye(5, dtype=bool))))
    state = np.zeros(keys.size, SAMPLE_STATE)
    blank_sample_state(state, keys, S)
    ev_full, ev_thin = [], []
    stripped = 0
    for sec in range(460):
        a, b = _faulty_second(sec, rng_a, paths), _faulty_second(sec, rng_b, paths)
        # the prober's picks: the rule over every OK; the other OKs lose their RTT
        ok = np.flatnonzero(b["status"] == ProbeStatus.OK)
        pid = np.searchsorted(keys, pair_keys(b["src_ep"][ok], b["dst_ep"][ok]))
        order = np.lexsort((b["t_wall_ns"][ok], pid))
        ok, pid = ok[order], pid[order]
        picked = period_samples(
            pid, b["t_wall_ns"][ok], b["seq"][ok], b["path_id"][ok], state, period_ns=S
        )
        drop = np.setdiff1d(ok, ok[picked])
        for f in ("rtt_ns", "prober_delay_ns", "responder_delay_ns"):
            b[f][drop] = -1
        stripped += drop.size
        want = th.thin(b)
        assert rows.thin(b.tolist()) == want.tolist()
        full.ingest(a)
        thin.ingest(want)
        for det, out in ((full, ev_full), (thin, ev_thin)):
            det.heartbeat(np.arange(5), T0 + sec * S)
            out += det.tick(T0 + (sec + 1) * S)
    assert stripped > 0.8 * 460 * 20 * PER_S
    assert {e.kind for e in ev_full} == {"latency-short", "loss"}
    assert [(e.kind, e.pairs, e.first_seen_ns, e.detected_ns) for e in ev_full] == [
        (e.kind, e.pairs, e.first_seen_ns, e.detected_ns) for e in ev_thin
    ]


def test_an_ok_without_an_rtt_is_skipped_and_the_next_wanted_one_taken():
    """One pair, ten probes 0.1 s apart over path ids 0, 1: its first probe (the wanted id 0)
    came back OK without an RTT (its prober did not ask for one): the period's sample is the
    next OK on id 0 that has one, in both thinners and the detector's rule."""
    from skh.analysis.rowthin import RowThinner, sample_phase_ns

    key = int(pair_keys(np.array([1]), np.array([2]))[0])
    start = T0 - T0 % S + sample_phase_ns(key, S) + S  # a period's start
    b = empty_probes(10)
    b["src_ep"], b["dst_ep"] = 1, 2
    b["seq"] = np.arange(10)
    b["path_id"] = np.arange(10) % 2
    b["t_wall_ns"] = start + 1_000_000 + np.arange(10) * (S // 10)
    b["rtt_ns"] = 13_000
    b["rtt_ns"][[0, 1, 3]] = -1
    state = np.zeros(1, SAMPLE_STATE)
    blank_sample_state(state, np.array([key], np.uint64), S)
    k = period_samples(
        np.zeros(10, np.int64),
        b["t_wall_ns"],
        b["seq"],
        b["path_id"],
        state,
        period_ns=S,
        has_rtt=b["rtt_ns"] > 0,
    )
    assert k.tolist() == [2]
    kept = ResultThinner().thin(b)
    assert RowThinner().thin(b.tolist()) == kept.tolist()
    # 1: the first OK on the rotation's highest id (its length), 2: the sample, 9: the newest
    assert kept["seq"].tolist() == [1, 2, 9]
