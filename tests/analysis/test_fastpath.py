"""The fast path on its own: probes in at ten a second over four flows, flags out each 100 ms."""

from __future__ import annotations

import numpy as np

from skh.analysis.fastpath import FastPathConfig, FastPathState

T0 = 1_700_000_000 * 10**9
MS = 10**6


class Pairs:
    """Pairs ``(src, dst)`` each probed every 100 ms at its own phase, path ids in turn."""

    def __init__(self, src, dst, groups=None) -> None:
        self.src = np.asarray(src, np.int64)
        self.dst = np.asarray(dst, np.int64)
        self.n = self.src.size
        self.fp = FastPathState(FastPathConfig(), self.n)
        self.groups = groups
        self.k = 0  # probes sent per pair so far

    def step(self, failed: np.ndarray | None = None):
        """One probe of every pair (``failed``: a mask of pairs whose probe fails), then the
        flags 100 ms later."""
        t = T0 + self.k * 100 * MS + np.arange(self.n) * (100 * MS // max(self.n, 1))
        f = np.zeros(self.n, bool) if failed is None else np.asarray(failed, bool)
        self.fp.update(np.arange(self.n), t, f, np.full(self.n, self.k % 4), np.full(self.n, 2000))
        self.k += 1
        now = T0 + self.k * 100 * MS
        eps = int(max(self.src.max(), self.dst.max())) + 1
        groups = [self.groups] if self.groups is not None else None
        flags = self.fp.evaluate(now, self.src, self.dst, eps, groups=groups)
        self.fp.learn(now, np.zeros(self.n, bool))
        return flags


def test_an_outage_that_ends_is_not_a_flap_but_one_that_comes_back_is():
    """A port down for 3 s: when it comes back, the first OK arrives on one flow while the other
    flows' last probes (sent before it) still failed; that is the outage ending, not a new one.
    An outage coming back 10 s later is a flap."""
    pr = Pairs([0], [1])
    for _ in range(600):
        assert not pr.step().unreachable.size
    down = np.ones(1, bool)
    flagged = [pr.step(down) for _ in range(30)]
    assert any(f.unreachable.size for f in flagged)
    assert not any(f.unreachable_flapping.any() for f in flagged)
    after = [pr.step() for _ in range(100)]  # back up: flows recover one by one
    assert not any(f.unreachable_flapping.any() for f in after)
    again = [pr.step(down) for _ in range(30)]
    assert any(f.unreachable_flapping.any() for f in again)


def _two_tors(n: int = 6):
    """Endpoints 0..n-1 under ToR 0, n..2n-1 under ToR 1; every endpoint of ToR 0 probes every
    endpoint of ToR 1 and back."""
    a, b = np.meshgrid(np.arange(n), np.arange(n, 2 * n), indexing="ij")
    src = np.r_[a.ravel(), b.ravel()]
    dst = np.r_[b.ravel(), a.ravel()]
    return src, dst, np.r_[np.zeros(n), np.ones(n)].astype(np.int64)


def test_a_lossy_access_link_does_not_corroborate_its_tors_other_pairs():
    """Endpoint 0's access link loses 10 % (its pairs are lossy, the endpoint test sees it); a
    pair of another endpoint under the same ToR loses one probe by chance at that time. The
    ToR's count is up only because of endpoint 0: that pair is not flagged."""
    src, dst, groups = _two_tors()
    pr = Pairs(src, dst, groups)
    rng = np.random.default_rng(1)
    for _ in range(900):
        assert not pr.step().loss.size
    x0 = (src == 0) | (dst == 0)
    bystander = int(np.flatnonzero((src == 1) & (dst == 7))[0])
    seen: set[int] = set()
    for i in range(100):
        f = x0 & (rng.random(src.size) < 0.1)
        f[bystander] = i == 50
        fl = pr.step(f)
        seen |= set(fl.loss.tolist())
    assert seen and seen <= set(np.flatnonzero(x0).tolist())
    assert bystander not in seen


def test_a_lossy_access_link_does_not_make_its_peers_corroborate_their_other_pairs():
    """Endpoint 0's access link loses 1.5 % over its eight peers' pairs (too few a pair for the
    pair's own test, many for endpoint 0's); peer 1's only other pair, to endpoint 9, loses
    three probes in a few seconds meanwhile. Endpoint 1's test rises by its pairs to 0, which
    endpoint 0's stronger test explains: retested without them it is clear, and 1 -> 9 is not
    flagged (held-out seed 1566380108: a CRC on one access link made a peer's bystander pair
    a false loss event)."""
    peers = np.arange(1, 9)
    src = np.r_[np.zeros(8, np.int64), peers, 1, 9]
    dst = np.r_[peers, np.zeros(8, np.int64), 9, 1]
    pr = Pairs(src, dst)
    rng = np.random.default_rng(3)
    for _ in range(900):
        assert not pr.step().loss.size
    crc = (src == 0) | (dst == 0)
    bystander = int(np.flatnonzero((src == 1) & (dst == 9))[0])
    seen: set[int] = set()
    for i in range(300):
        f = crc & (rng.random(src.size) < 0.015)
        f[bystander] = i in (200, 215, 230)
        seen |= set(pr.step(f).loss.tolist())
    assert seen and seen <= set(np.flatnonzero(crc).tolist())
    assert bystander not in seen


def test_an_endpoint_lossy_only_with_one_peer_corroborates_those_pairs_alone():
    """Endpoint 1's pairs to endpoint 0 cross a lossy link (2 % each way, one probe in 50);
    endpoint 0's other pairs, to 2, are clean, so 1's test is the stronger of the two and
    keeps those failures. Its pair from endpoint 3 loses two probes 15 s apart meanwhile:
    what endpoint 1 lost without its pairs to 0 is unremarkable, and 3 -> 1 is not flagged
    (held-out draw 2010081224: a young endpoint behind one peer's lossy access link called
    its pair from a third endpoint lossy)."""
    src, dst = np.array([1, 0, 0, 2, 3, 1]), np.array([0, 1, 2, 0, 1, 3])
    pr = Pairs(src, dst)
    for _ in range(900):
        assert not pr.step().loss.size
    seen: set[int] = set()
    for i in range(300):
        f = np.zeros(src.size, bool)
        f[0], f[1] = i % 50 == 0, i % 50 == 25
        f[4] = i in (100, 250)
        seen |= set(pr.step(f).loss.tolist())
    assert seen == {0, 1}


def test_loss_spread_over_a_tors_pairs_is_corroborated_by_the_tor():
    """An uplink of ToR 0 losing: two probes of one pair of each of its endpoints a few seconds
    apart, too few for any pair or endpoint alone, many for the ToR: those pairs are flagged.
    A pair of the ToR losing one probe meanwhile is not (a group's excess may be another
    story: see the flapping test below)."""
    src, dst, groups = _two_tors(12)
    pr = Pairs(src, dst, groups)
    for _ in range(900):
        assert not pr.step().loss.size
    # endpoint e of ToR 0 -> endpoint 12 + e of ToR 1
    hit = np.flatnonzero((src < 12) & (dst == src + 12))
    once = int(np.flatnonzero((src == 0) & (dst == 13))[0])
    seen: set[int] = set()
    for i in range(60):
        f = np.zeros(src.size, bool)
        f[hit[i % 10 :: 10]] = i < 10 or 30 <= i < 40
        f[once] = i == 35
        seen |= set(pr.step(f).loss.tolist())
    assert seen == set(hit.tolist())


def _one_pair(seconds: int, paths: int, failed) -> list:
    """One pair probed ten times a second over ``paths`` flows, shipped and evaluated once a
    second; ``failed(sec, seq, path)`` says which of the second's probes failed. The flags of
    every second."""
    fp = FastPathState(FastPathConfig(), 1)
    src, dst = np.array([0]), np.array([1])
    flags = []
    for sec in range(seconds):
        seq = sec * 10 + np.arange(10)
        t = T0 + seq * 100 * MS
        path = seq % paths
        fp.update(np.zeros(10, np.int64), t, failed(sec, seq, path), path, np.full(10, 2000))
        now = T0 + (sec + 1) * 10 * 100 * MS
        flags.append(fp.evaluate(now, src, dst, 2))
        fp.learn(now, np.zeros(1, bool))
    return flags


def test_a_dead_ecmp_path_is_an_outage_and_its_failures_are_not_loss_after():
    """One flow of four dead for 20 s (a switch on its path offline), ten probes a second
    shipped once a second: an outage of that flow; once the switch is back, its failures,
    still in the loss look-back, are not loss."""
    flags = _one_pair(120, 4, lambda sec, seq, path: (path == 2) & (60 <= sec < 80))
    assert any(f.unreachable.size for f in flags[60:80])
    assert not any(f.unreachable.size for f in flags[81:])
    assert not any(f.loss.size for f in flags)


def test_a_young_lossy_pair_does_not_make_its_tor_corroborate_bystanders():
    """A job just started on endpoints 0 and 6 (their pairs have 40 s of history), and the
    access link between them loses: nine failures a direction in 30 s, too few for a baseline
    that young to call alone, but many against the ToR's hour of history. Five pairs of other
    endpoints under the ToR each lose one probe meanwhile: the ToR's excess is the young pair's
    alone (it does not hold without endpoint 0), so they are not called lossy."""
    src, dst, groups = _two_tors()
    pr = Pairs(src, dst, groups)
    for _ in range(300):
        pr.step()
    st = pr.fp.state
    young = np.isin(src, (0, 6)) | np.isin(dst, (0, 6))
    st["base_n"] = np.where(young, 400.0, 36000.0)  # an hour at 10 Hz, or 40 s
    st["base_f"] = np.where(young, 1.0, 4.0)
    lossy = np.flatnonzero(((src == 0) & (dst == 6)) | ((src == 6) & (dst == 0)))
    bystanders = np.flatnonzero((src == dst - 6) & ~young)[:5]
    seen: set[int] = set()
    for i in range(300):
        f = np.zeros(src.size, bool)
        f[lossy] = i % 33 == 5
        f[bystanders[i // 60]] = i % 60 == 30
        seen |= set(pr.step(f).loss.tolist())
    assert not seen & set(bystanders.tolist()), seen


def _some_paths_dead(m: int, ids: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which (pair, path id) flows cross a broken element: a third of the ``m`` pairs, on one or
    two of their ``ids`` path ids each; and four pairs that cross nothing (bystanders)."""
    rng = np.random.default_rng(seed)
    dead = np.zeros((m, ids), bool)
    crossing = rng.permutation(m)[: m // 3]
    for pid in crossing:
        dead[pid, rng.choice(ids, size=1 + pid % 2, replace=False)] = True
    return dead, crossing, np.setdiff1d(np.arange(m), crossing)[::20][:4]


def test_a_switch_dead_on_some_rotated_paths_does_not_corroborate_bystanders():
    """Probes rotate over 16 path ids (issue 17's rotation). A spine goes offline: the ECMP
    paths through it fail, one or two path ids of each of a third of ToR 0's pairs, every time
    they come round. Those are outages of single flows, not random loss: they must not lift the
    ToR's loss test, so the ToR's other pairs, four of which lose one probe each meanwhile
    (benign loss), are not called lossy. The pairs with a dead path are found, as outages of
    that flow (with path ids folded into fewer flow slots, a slot mixed dead and working paths:
    no run, and their failures made the ToR corroborate a bystander)."""
    n, ids = 8, 16
    src, dst, groups = _two_tors(n)
    m = src.size
    fp = FastPathState(FastPathConfig(), m)
    dead, crossing, bystanders = _some_paths_dead(m, ids, seed=7)
    eps = 2 * n
    k = 0
    loss: set[int] = set()
    out: set[int] = set()
    for sec in range(150):
        t = T0 + (k + np.arange(10))[None, :] * 100 * MS + np.arange(m)[:, None] * MS
        path = np.broadcast_to((k + np.arange(10)) % ids, (m, 10))
        failed = np.zeros((m, 10), bool)
        if sec >= 120:
            failed = np.take_along_axis(dead, path, axis=1)
            # each bystander loses one probe, seconds apart (as benign loss has them)
            for j, b in enumerate(bystanders):
                failed[b, j] |= sec == 121 + 7 * j
        pids = np.repeat(np.arange(m), 10)
        fp.update(pids, t.ravel(), failed.ravel(), path.ravel(), np.full(pids.size, 2000))
        k += 10
        now = T0 + k * 100 * MS
        fl = fp.evaluate(now, src, dst, eps, groups=[groups])
        fp.learn(now, np.isin(np.arange(m), fl.unreachable))
        if sec >= 120:
            loss |= set(fl.loss.tolist())
            out |= set(fl.unreachable.tolist())
    assert not loss & set(bystanders.tolist()), sorted(loss & set(bystanders.tolist()))
    assert out == set(crossing.tolist())


def test_a_flapping_link_on_some_rotated_paths_does_not_corroborate_bystanders():
    """A ToR uplink flapping: down 3 s in every 20, on the path ids of a third of ToR 0's pairs
    that cross it (one or two of 16 each), too short for any of those flows to fail three times
    in a row. The ToR's count is up, for real; its pairs that lost one probe each meanwhile (a
    benign loss) are not called lossy with it, while the pairs across the link, losing again
    and again, are."""
    n, ids = 8, 16
    src, dst, groups = _two_tors(n)
    m = src.size
    fp = FastPathState(FastPathConfig(), m)
    dead, crossing, bystanders = _some_paths_dead(m, ids, seed=3)
    k = 0
    loss: set[int] = set()
    for sec in range(180):
        t = T0 + (k + np.arange(10))[None, :] * 100 * MS + np.arange(m)[:, None] * MS
        path = np.broadcast_to((k + np.arange(10)) % ids, (m, 10))
        failed = np.zeros((m, 10), bool)
        if sec >= 120:
            if (sec - 120) % 20 < 3:
                failed = np.take_along_axis(dead, path, axis=1)
            for j, b in enumerate(bystanders):
                failed[b, j] |= sec == 122 + 11 * j
        pids = np.repeat(np.arange(m), 10)
        fp.update(pids, t.ravel(), failed.ravel(), path.ravel(), np.full(pids.size, 2000))
        k += 10
        now = T0 + k * 100 * MS
        fl = fp.evaluate(now, src, dst, 2 * n, groups=[groups])
        fp.learn(now, np.zeros(m, bool))
        if sec >= 120:
            loss |= set(fl.loss.tolist())
    assert not loss & set(bystanders.tolist()), sorted(loss & set(bystanders.tolist()))
    assert loss & set(crossing.tolist())


def test_a_dead_paths_failures_leave_the_look_back_when_its_switch_returns():
    """A spine offline for 30 s on one or two of 16 rotated path ids of a third of ToR 0's
    pairs, the agents shipping every 2 s. A pair whose newest probe failed is held at a tick
    (its responder has reported nothing past that failure yet), so the last ticks before a dead
    flow's first OK need not see its outage; and the batch that brings the OK also brings the
    flow's last failures. Those failures were the outage: they must leave the look-back, not
    lift the ToR's test once the flows settle and corroborate the ToR's pairs that lose two
    probes right after (lossy neighbours; with the failures left in, those were called lossy)."""
    n, ids, per = 8, 16, 20
    src, dst, groups = _two_tors(n)
    m = src.size
    fp = FastPathState(FastPathConfig(), m)
    dead, crossing, bystanders = _some_paths_dead(m, ids, seed=11)
    k = 0
    loss: set[int] = set()
    out: set[int] = set()
    for _ in range(90):
        t = T0 + (k + np.arange(per))[None, :] * 100 * MS + np.arange(m)[:, None] * MS
        path = np.broadcast_to((k + np.arange(per)) % ids, (m, per))
        sec = (k + np.arange(per))[None, :] // 10
        failed = np.take_along_axis(dead, path, axis=1) & (sec >= 120) & (sec < 151)
        for j, b in enumerate(bystanders):
            failed[b] |= (sec[0] // 2 == 76 + j) & (np.arange(per) % 7 == 3)
        pids = np.repeat(np.arange(m), per)
        fp.update(pids, t.ravel(), failed.ravel(), path.ravel(), np.full(pids.size, 2000))
        k += per
        now = T0 + k * 100 * MS + 200 * MS
        # each endpoint's agent has reported up to its newest probe sent
        progress = np.zeros(2 * n, np.int64)
        np.maximum.at(progress, src, t.max(axis=1))
        fl = fp.evaluate(now, src, dst, 2 * n, progress_ns=progress, groups=[groups])
        fp.learn(now, np.isin(np.arange(m), fl.unreachable))
        if k >= 1200:
            loss |= set(fl.loss.tolist())
            out |= set(fl.unreachable.tolist())
    assert out == set(crossing.tolist())
    assert not loss, sorted(loss)


def test_a_crc_on_an_access_link_is_found_while_its_pairs_are_always_in_a_run():
    """A CRC on endpoint 0's access link, its one peer probed both ways at 40/s over 45 path ids
    (what the probe plan gives a sparse skeleton), shipped once a second: each pair loses one
    probe a second, and that probe's path id comes round again only after the tick (45 ids at
    40/s: every 1.125 s), so at every tick both pairs are in a flow's run. Their resolved
    failures are the loss: it is found within seconds (with the pairs set aside while any of
    their runs was open, it was not found while the fault lasted)."""
    src, dst = np.array([0, 1]), np.array([1, 0])
    fp = FastPathState(FastPathConfig(), 2)
    ids, per = 45, 40
    rng = np.random.default_rng(5)
    k = 0
    found = None
    for sec in range(630):
        t = T0 + (k + np.arange(per))[None, :] * 25 * MS + np.array([[0], [7 * MS]])
        path = np.broadcast_to((k + np.arange(per)) % ids, (2, per))
        failed = np.zeros((2, per), bool)
        if sec >= 600:
            failed[0, rng.integers(per)] = failed[1, rng.integers(per)] = True
        pids = np.repeat(np.arange(2), per)
        fp.update(pids, t.ravel(), failed.ravel(), path.ravel(), np.full(pids.size, 2000))
        k += per
        now = T0 + k * 25 * MS
        fl = fp.evaluate(now, src, dst, 2)
        fp.learn(now, np.zeros(2, bool))
        assert not fl.unreachable.size
        if sec < 600:
            assert not fl.loss.size
        elif fl.loss.size and found is None:
            found = sec - 600 + 1
    assert found is not None and found <= 6, found


def _job_on_rnics(fp, src, dst, seconds, loss, rng, t0_s=0, per=40, groups=None):
    """Pairs ``src[i] -> dst[i]`` probed at ``per`` a second each over 14 path ids for
    ``seconds``, each probe lost with probability ``loss`` (per pair: shape (n, 1), or per
    second: a callable of the second, which may give the failures as a bool (n, per)),
    shipped and evaluated once a second (``groups``: the endpoints' ToRs). Returns, per
    second, the pairs flagged lossy."""
    n, ids = src.size, 14
    out = []
    for sec in range(seconds):
        k = (t0_s + sec) * per
        gap_ns = 10**9 // per
        t = T0 + (k + np.arange(per))[None, :] * gap_ns + (np.arange(n) * 7 * MS)[:, None]
        path = np.broadcast_to((k + np.arange(per)) % ids, (n, per))
        p = loss(sec) if callable(loss) else loss
        # a bool array is the failures themselves
        failed = p if getattr(p, "dtype", None) is np.dtype(bool) else rng.random((n, per)) < p
        pids = np.repeat(np.arange(n), per)
        fp.update(pids, t.ravel(), failed.ravel(), path.ravel(), np.full(pids.size, 2000))
        now = T0 + (k + per) * gap_ns
        fl = fp.evaluate(now, src, dst, 4, groups=groups)
        fp.learn(now, np.zeros(n, bool), src, dst, groups)
        assert not fl.unreachable.size
        out.append(fl.loss)
    return out


def _new_job_after_an_hour(history_loss: float, new_loss: float, seconds: int, seed: int):
    """Endpoints 0 and 1 (RNICs 0 and 1) probe each other for an hour at ``history_loss``; that
    job ends and a new one starts on the same two RNICs (endpoints 2 and 3), its pairs losing
    ``new_loss`` from the start. The new job's flags per second."""
    rng = np.random.default_rng(seed)
    fp = FastPathState(FastPathConfig(), 2)
    fp.set_links(np.array([0, 1, 0, 1]))
    old = _job_on_rnics(fp, np.array([0, 1]), np.array([1, 0]), 3600, history_loss, rng)
    assert not any(f.size for f in old)
    fp.take(np.zeros(2, bool))  # the old job's pairs go; its RNICs stay
    fp.resize(2)
    return _job_on_rnics(fp, np.array([2, 3]), np.array([3, 2]), seconds, new_loss, rng, 3600)


def test_a_new_jobs_crc_is_judged_against_its_rnics_history():
    """A 2 % CRC on an access link starts with a new job (80 probes/s over the link): the new
    endpoints' pairs have no history, but their RNICs have an hour of clean history from the
    job before, so the endpoint test needs the few failures an established one needs (on the
    prior alone, wide on purpose, it needed 13-22: 12 s mean in bench/crc_ttd.py)."""
    found = []
    for seed in (1, 2, 3, 4):
        flags = _new_job_after_an_hour(1e-4, 0.02, 30, seed)
        found.append(next(i + 1 for i, f in enumerate(flags) if f.size))
    assert np.mean(found) <= 4.5, found


def test_a_new_job_on_an_rnic_lossy_all_along_is_not_called_lossy():
    """The RNICs lost 1e-3 for the hour before and go on doing so under the new job: the link's
    history says that is its normal, and no loss is called."""
    flags = _new_job_after_an_hour(1e-3, 1e-3, 600, 7)
    assert not any(f.size for f in flags)


def _new_pair_to_a_fresh_rnic(loss: float, seconds: int, seed: int) -> list[np.ndarray]:
    """RNIC 0 has an hour of clean history (its pair to RNIC 1, 40/s each way); then a new job's
    pair runs from RNIC 0 to RNIC 2, never used (the prior alone), at 83 probes/s each way (a
    pair alone on its access links at 160/s), losing ``loss``. The new pair's flags per second."""
    rng = np.random.default_rng(seed)
    fp = FastPathState(FastPathConfig(), 2)
    fp.set_links(np.array([0, 1, 0, 2]))
    old = _job_on_rnics(fp, np.array([0, 1]), np.array([1, 0]), 3600, 1e-4, rng)
    assert not any(f.size for f in old)
    fp.take(np.zeros(2, bool))
    fp.resize(2)
    src, dst = np.array([2, 3]), np.array([3, 2])
    return _job_on_rnics(fp, src, dst, seconds, loss, rng, 3600 * 40 // 83, per=83)


def test_a_new_jobs_pair_to_a_fresh_rnic_behind_a_bad_link_is_not_judged_by_the_near_history():
    """The new pair's path loses 2.4e-3 of its probes (the field regime's benign bad links):
    which end's link loses them nobody knows yet, so the near end's clean history cannot call
    it lossy (it did: 9 lost in 10 s against that history at 1e-22, a false loss event on quick
    draw 1560214748). A 2 % CRC on that path is still found within seconds."""
    for seed in (3, 4):
        flags = _new_pair_to_a_fresh_rnic(2.4e-3, 120, seed)
        assert not any(f.size for f in flags), (seed, [i for i, f in enumerate(flags) if f.size])
        flags = _new_pair_to_a_fresh_rnic(0.02, 30, seed)
        assert next(i + 1 for i, f in enumerate(flags) if f.size) <= 8, seed


def test_a_new_jobs_lossy_path_past_clean_rnics_is_its_own_normal_once_learned():
    """The new job's pair crosses bad spine links (1 % benign, all along) while its RNICs were
    clean for the hour before. Its first seconds look like a CRC on the access link and cannot
    be told from one; once its pair has learned its loss, the link's clean past no longer
    judges it (it did: flagged for most of ten minutes, a false loss event minutes into jobs
    of the CI draw 1635903697 + 1968304191)."""
    for seed in (7, 8):
        flags = _new_job_after_an_hour(1e-5, 0.01, 600, seed)
        late = [i for i, f in enumerate(flags) if f.size and i >= 120]
        assert not late, (seed, late[:10])


def _burst_beside_clean_pairs(seed: int, burst: float) -> list[np.ndarray]:
    """Endpoint 0 probes 16 peers at 10/s each. Its RNIC and theirs were clean for the hour
    before (another job); the new job's pair 0 crosses bad spine links (1.6e-3, the rest
    1.5e-4). After eight minutes pair 0 loses ``burst`` for half a minute. Flags per second
    from then on."""
    rng = np.random.default_rng(seed)
    n = 16
    fp = FastPathState(FastPathConfig(), n)
    fp.set_links(np.r_[np.arange(n + 1), np.arange(n + 1)])
    src, dst = np.zeros(n, np.int64), np.arange(1, n + 1)
    old = _job_on_rnics(fp, src + n + 1, dst + n + 1, 3600, 1.5e-4, rng, per=10)
    assert not any(f.size for f in old)
    fp.take(np.zeros(n, bool))
    fp.resize(n)
    loss = np.full((n, 1), 1.5e-4)
    loss[0] = 1.6e-3
    first = _job_on_rnics(fp, src, dst, 480, loss, rng, 3600, per=10)
    assert not any(f.size for f in first[120:])
    loss[0] = burst
    out = _job_on_rnics(fp, src, dst, 30, loss, rng, 4080, per=10)
    loss[0] = 1.6e-3
    return out + _job_on_rnics(fp, src, dst, 60, loss, rng, 4110, per=10)


def test_a_pair_on_a_lossy_path_is_held_to_its_own_rate_in_its_endpoints_test():
    """Pair 0's half-minute of 2 % (six lost where half of one is usual, a tail its own test
    does not call at 1e-9) is no access-link story: the endpoint expects each pair's own rate.
    With one rate for all its pairs (the link's clean 1.5e-4), the endpoint test fired and
    corroborated pair 0 (seeds 1 and 2 here; a false loss event on CI draw 1635903697)."""
    for seed in (1, 2, 3):
        flags = _burst_beside_clean_pairs(seed, 0.02)
        assert not any(f.size for f in flags), seed


def _new_job_behind_a_lossy_uplink(seed: int, loss, seconds: int = 120) -> list[np.ndarray]:
    """For an hour job X's pairs stay under ToR 0 (endpoints 0 and 1, RNICs 0 and 1: clean)
    while job Y's cross to ToR 1 through a bad uplink (endpoints 2 and 3, 1e-3 per probe). Both
    end; job Z starts on RNIC 0 (endpoint 4) with a peer under ToR 1 (endpoint 5, a fresh RNIC)
    and its pairs lose ``loss`` (per second, a callable). Z's flags per second."""
    rng = np.random.default_rng(seed)
    tor = np.array([0, 0, 0, 1, 0, 1])
    fp = FastPathState(FastPathConfig(), 4)
    fp.set_links(np.array([0, 1, 2, 3, 0, 4]))
    src, dst = np.array([0, 1, 2, 3]), np.array([1, 0, 3, 2])
    old_loss = np.array([[1e-5], [1e-5], [1e-3], [1e-3]])
    old = _job_on_rnics(fp, src, dst, 3600, old_loss, rng, groups=[tor])
    assert not any(f.size for f in old)
    fp.take(np.zeros(4, bool))
    fp.resize(2)
    z = (np.array([4, 5]), np.array([5, 4]))
    return _job_on_rnics(fp, *z, seconds, loss, rng, 3600, groups=[tor])


def test_a_new_jobs_pairs_through_a_lossy_uplink_expect_what_that_uplink_loses():
    """Job Z's endpoint sits on a clean RNIC, but its pairs cross a ToR uplink that other jobs'
    pairs found losing 1e-3. In its first minute six probes are lost in 15 s (a 1e-4 tail of
    that path, met somewhere in a fleet every hour): judged against the RNIC's clean history
    alone (0.01 expected), it was a CRC on the access link, a false loss event on CI draw
    1810287075. What pairs crossing the same uplink lost is the young pair's prior."""
    for seed in (1, 2, 3):
        flags = _new_job_behind_a_lossy_uplink(seed, lambda s: 0.005 if 20 <= s < 35 else 1e-3)
        assert not any(f.size for f in flags), seed


def test_a_new_jobs_crc_behind_a_lossy_uplink_is_still_found():
    """A 2 % CRC on job Z's access link from its first second stands far above the uplink's
    1e-3: found within seconds (6-10 s on these seeds, 7.5 mean; 10.5 with the clean link's
    few failures setting how well the expectation is known; behind a clean uplink the link's
    history alone judges it, about four: the test above). Two pairs each failing
    their latest probe at once were an endpoint outage under the clean link's rate (seed 4,
    an unreachable verdict for a CRC): an endpoint outage needs as many failures in all as a
    pair's does."""
    found = []
    for seed in (1, 2, 3, 4):
        flags = _new_job_behind_a_lossy_uplink(seed, lambda s: 0.02, 30)
        found.append(next(i + 1 for i, f in enumerate(flags) if f.size))
    assert np.mean(found) <= 9, found


def _new_pair_past_a_known_uplink_to_a_fresh_rnic(loss: float, seconds: int, seed: int):
    """For an hour job Y's pairs cross from ToR 0 to ToR 1 (endpoints 0 and 1, RNICs 0 and 1)
    losing 3.4e-4, so the pairs crossing that edge have a long, well-known history; job Y ends,
    and a new job's pair runs from RNIC 0 (clean, an hour of history) to RNIC 2 under ToR 1,
    never used, at 83 probes/s each way, losing ``loss``. The new pair's flags per second."""
    rng = np.random.default_rng(seed)
    tor = np.array([0, 1, 0, 1])
    fp = FastPathState(FastPathConfig(), 2)
    fp.set_links(np.array([0, 1, 0, 2]))
    old = _job_on_rnics(fp, np.array([0, 1]), np.array([1, 0]), 3600, 3.4e-4, rng, groups=[tor])
    assert not any(f.size for f in old)
    fp.take(np.zeros(2, bool))
    fp.resize(2)
    z = (np.array([2, 3]), np.array([3, 2]))
    return _job_on_rnics(fp, *z, seconds, loss, rng, 3600 * 40 // 83, per=83, groups=[tor])


def test_a_fresh_far_rnic_is_unknown_even_where_its_pairs_crossing_history_is_known():
    """The new pair loses 3.4e-3 (the fresh RNIC's link is one of the field regime's bad ones,
    at its cap): what pairs crossing the same ToR edge lost (3.4e-4, shape ~100) set the
    endpoints' expectation, and its certainty stood for the whole path, the fresh link's part
    too, which nothing has measured yet: 15 lost in 30 s at 1e-21, a false loss event on
    held-out quick draw 1616493882 (t = 1716 s, a new job's pair 3684 <-> 3692). A 2 % CRC on
    that path is still found within seconds."""
    for seed in (1, 2, 3):
        flags = _new_pair_past_a_known_uplink_to_a_fresh_rnic(3.4e-3, 120, seed)
        assert not any(f.size for f in flags), (seed, [i for i, f in enumerate(flags) if f.size])
        flags = _new_pair_past_a_known_uplink_to_a_fresh_rnic(0.02, 30, seed)
        assert next(i + 1 for i, f in enumerate(flags) if f.size) <= 8, seed


def test_a_clean_pair_is_not_expected_to_lose_less_than_its_endpoint():
    """Endpoint 0's one peer, probed both ways at 40/s for five minutes without a loss: the
    pairs' probes are the endpoint's whole history. Then five probes of one pair are lost in
    20 s (a Poisson tail a fleet meets a few times an hour, alpha 1e-9 is set for it). Taking
    the endpoint's rate as the pair's prior and the pair's own clean probes again, the endpoint
    test expected 4e-6 per probe, ten times under the endpoint's rate, and called it: a false
    loss event on held-out draw 305340123."""
    rng = np.random.default_rng(1)
    fp = FastPathState(FastPathConfig(), 2)
    fp.set_links(np.array([0, 1]))
    src, dst = np.array([0, 1]), np.array([1, 0])
    clean = _job_on_rnics(fp, src, dst, 300, 0.0, rng)
    assert not any(f.size for f in clean)

    def five_lost(sec):
        failed = np.zeros((2, 40), bool)
        failed[0, 17] = sec in (0, 4, 9, 14, 19)
        return failed

    assert not any(f.size for f in _job_on_rnics(fp, src, dst, 40, five_lost, rng, 300))


def test_three_in_a_row_on_one_flow_of_a_lossy_pair_is_benign_loss_not_an_outage():
    """Field CI draw 1556988735 + 1007480917: a pair losing ~9e-4 of its probes (five of its
    eight flows cross links losing 7.3e-4 each way) lost three in a row on one flow, and that
    was called an outage of the flow. Held to the pair's baseline as one test, such a run passes
    alpha; but every flow of every pair is tested, so a flow's run is held to alpha over the flow
    slots (four in a row here). A clean pair's flow still needs three."""
    for every, run, want in ((1064, 3, False), (1064, 4, True), (10**9, 3, True)):

        def failed(sec, seq, path, every=every, run=run):
            if sec < 1400:
                return seq % every == every - 1  # the pair's usual loss, spread over its flows
            # the next ``run`` probes of flow 2 fail, nothing else
            start = 1400 * 10 + (2 - 1400 * 10) % 8
            return (path == 2) & (seq >= start) & (seq < start + 8 * run)

        flags = _one_pair(1500, 8, failed)
        assert not any(f.unreachable.size for f in flags[:1400])
        assert any(f.unreachable.size for f in flags[1400:]) == want, (every, run)


def _new_job_across_pods(seed: int, loss: float, seconds: int) -> list[np.ndarray]:
    """Job X: endpoints 0-3 under ToR 0 probe endpoints 4-7 under ToR 1 (same pod, clean
    1e-4) for ten minutes, and go on. Then job Z starts: endpoints 8-11 under ToR 0 and two
    peers each under ToRs 2-5 (other pods), both ways, 10 probes a second a pair, every pair of
    Z losing ``loss``. The flags of Z's pairs per second."""
    rng = np.random.default_rng(seed)
    tor = np.r_[np.zeros(4), np.ones(4), np.zeros(4), np.repeat(np.arange(2, 6), 2)].astype(int)
    n_eps = tor.size
    x_src, x_dst = np.r_[0:4, 4:8], np.r_[4:8, 0:4]
    near = np.repeat(np.arange(8, 12), 8)
    far = np.tile(np.arange(12, 20), 4)
    z_src, z_dst = np.r_[near, far], np.r_[far, near]
    fp = FastPathState(FastPathConfig(), x_src.size)
    fp.set_links(np.arange(n_eps))
    old = _job_on_rnics(fp, x_src, x_dst, 600, 1e-4, rng, per=10, groups=[tor])
    assert not any(f.size for f in old)
    fp.resize(x_src.size + z_src.size)
    src, dst = np.r_[x_src, z_src], np.r_[x_dst, z_dst]
    p = np.r_[np.full(x_src.size, 1e-4), np.full(z_src.size, loss)][:, None]
    flags = _job_on_rnics(fp, src, dst, seconds, p, rng, 600, per=10, groups=[tor])
    return [f[f >= x_src.size] for f in flags]


def test_a_new_jobs_pairs_through_a_lossy_core_link_do_not_make_their_tor_lossy():
    """Full-profile seed 1268465575: a new job's 84 pairs from one ToR to four ToRs in other
    pods, all through a core link at 1.8e-3 (benign: the field regime's bad links), lost 30 in
    30 s against the ToR's clean history from its older pairs (1e-4 here); the ToR's test
    fired at 1e-23 and corroborated the pairs that had lost two (here on seeds 3, 4 and 6 of
    six). What the young pairs expect nobody knows yet: the ToR's excess must hold in its older
    pairs or in its young ones against their prior. A 2 % loss on all of the young pairs (a
    fault on the ToR's uplinks, for the new job's paths) is still found within seconds (4-8 s
    on these seeds, mean 6.0; 3-4 s judged by the older pairs' history). At 2.4e-3 (the regime's
    bad paths reach that) seed 1 still fired through the endpoint test, its young pairs taking
    the ToR uplinks' crossing history as how well their whole path was known (until session
    27: each part of a path is its own unknown there)."""
    found = []
    for seed in range(1, 7):
        for benign in (1.8e-3, 2.4e-3):
            flags = _new_job_across_pods(seed, benign, 120)
            fired = [i for i, f in enumerate(flags) if f.size]
            assert not fired, (seed, benign, fired)
        flags = _new_job_across_pods(seed, 0.02, 30)
        found.append(next(i + 1 for i, f in enumerate(flags) if f.size))
    assert np.mean(found) <= 7, found
