"""The analyzer's counter history at the agents' rate: 10 Hz TX/RX series for skeleton
inference, from cumulative counter batches as the underlay agents ship them."""

from __future__ import annotations

import numpy as np

from skh.analysis.skeleton import infer_skeleton, pairs_coverage
from skh.model import Cluster, Fabric, JobShape
from skh.orchestrator.pipeline import CounterHistory
from skh.records import empty_counters
from skh.sim.jobs import make_job
from skh.sim.traffic import TrafficModel, counter_batch


def _rows(ep: int, t_s, tx, rx=None) -> np.ndarray:
    r = empty_counters(len(t_s))
    r["ep"] = ep
    r["t_ns"] = [int(round(t * 1e9)) for t in t_s]
    r["tx_bytes"] = tx
    r["rx_bytes"] = rx if rx is not None else [0] * len(t_s)
    return r


def test_ten_hz_samples_bin_at_ten_hz_with_tx_apart():
    h = CounterHistory(300)
    t = 10.05 + 0.1 * np.arange(6)  # the agent's grid: (k + 0.5) / 10
    h.add(_rows(0, t, [0, 0, 500, 500, 500, 500], [0, 0, 0, 0, 300, 300]))
    h.add(_rows(1, t + 0.01, [0, 0, 0, 0, 0, 0], [0, 0, 500, 500, 500, 500]))
    x, tx, hz = h.series(np.array([0, 1]))
    assert hz == 10 and h.span_s(np.array([0, 1])) == 0.5
    # bin k holds the interval closing in it: the send in bin 102 on both ends
    assert x.tolist() == [[0, 500, 0, 300, 0], [0, 500, 0, 0, 0]]
    assert tx.tolist() == [[0, 500, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_a_job_with_a_one_hz_agent_is_binned_per_second():
    h = CounterHistory(300)
    h.add(_rows(0, 10.05 + 0.1 * np.arange(40), np.arange(40) * 10))
    h.add(_rows(1, 10.5 + np.arange(4), [0, 100, 200, 300]))
    x, _, hz = h.series(np.array([0, 1]))
    assert hz == 1 and x.shape == (2, 3)
    assert x[0].tolist() == [100.0, 100.0, 100.0] and x[1].tolist() == [100.0, 100.0, 100.0]


def _history_of(job, hz: int, seconds: int) -> tuple[CounterHistory, np.ndarray, np.ndarray]:
    """Cumulative counters of ``job`` sampled at ``hz`` on the agents' grid, batch by batch, and
    the model's own (tx, rx) per sample."""
    model = TrafficModel([job], seed=5, sample_hz=float(hz))
    t0 = float(np.ceil(model.train_start.max())) + 1.0
    tx, rx = model.window(t0, seconds * hz)
    ctx, crx = np.cumsum(tx, axis=1), np.cumsum(rx, axis=1)
    h = CounterHistory(seconds + 10)
    for k in range(seconds * hz):
        # the sample closing interval k, half an interval into the next bin (agents' phase 0.5)
        t_ns = int(round((t0 + (k + 1.5) / hz) * 1e9))
        h.add(counter_batch(model.ep_ids, t_ns, ctx[:, k].astype(np.uint64),
                            crx[:, k].astype(np.uint64)))  # fmt: skip
    return h, tx, rx


def test_pipeline_series_at_ten_hz_name_partners_one_hz_cannot():
    """What the pipeline reads (``CounterHistory.series``, then ``infer_skeleton`` with TX apart
    at the agents' rate and the pod-order hint): the simulator's per-sample bytes, unchanged; at
    10 Hz the hint's partners of a PP4 x DP8 job are confirmed by traffic and the list is near
    the truth; the same job through 1 Hz agents keeps whole adjacent groups."""
    cluster = Cluster(Fabric.from_params(hosts=32))
    job = make_job(cluster, "j", JobShape(8, 4, 8), iteration_s=13.0, seed=2)
    out = {}
    for hz in (10, 1):
        h, m_tx, m_rx = _history_of(job, hz, 240)
        x, tx, got_hz = h.series(job.ep_ids)
        assert got_hz == hz and x.shape[1] == 240 * hz - 1
        # cumulative counters are whole bytes: each bin within a byte or two of the model's
        assert np.allclose(x, (m_tx + m_rx)[:, 1:], atol=2.0)
        # (the model's sample-jitter shift can leave a TX bin a few kB below zero, which a
        # cumulative counter cannot show: those bins, and the next, differ)
        assert np.mean(np.abs(tx - m_tx[:, 1:]) <= 1.0) > 0.999
        sk = infer_skeleton(
            job.ep_ids,
            job.host,
            job.rail,
            x,
            tx_bytes=tx,
            sample_hz=got_hz,
            container=job.container,
        )
        assert pairs_coverage(job.skeleton_pairs, sk.pairs) == 1.0, sk.reason
        out[hz] = (sk.pairs.shape[0] / job.skeleton_pairs.shape[0], sk)
    assert out[10][0] <= 1.25 < out[1][0], (out[10][1].reason, out[1][1].reason)
    assert out[10][1].hint in ("confirmed", "partly confirmed"), out[10][1].reason
