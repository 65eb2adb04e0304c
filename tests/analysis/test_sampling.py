"""What the agents forward (every failure, one OK per pair and second); the detector must decide
the same on that as on everything."""

from __future__ import annotations

import numpy as np

from skh.analysis.detect import Detector
from skh.analysis.sampling import ResultThinner
from skh.records import ProbeStatus, empty_probes

T0 = 1_700_000_000 * 10**9
S = 10**9
PER_S = 10


def second(sec: int, n_eps: int, rng: np.random.Generator, *, slow=None, lost=None) -> np.ndarray:
    """Ten probes per ordered pair in second ``sec``, rotating over four paths."""
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
        b["path_id"] = (sec * PER_S + j) % 4
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


def test_the_detector_decides_the_same_on_thinned_results():
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(2)
    full, thin = Detector(), Detector()
    th = ResultThinner()
    ev_full, ev_thin = [], []
    for sec in range(460):
        kw = {}
        if sec >= 400:
            kw = {"slow": lambda s, d: s == 1, "lost": lambda s, d: d == 3}
        a = second(sec, 5, rng_a, **kw)
        b = second(sec, 5, rng_b, **kw)
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
