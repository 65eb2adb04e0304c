"""The evaluation harness: CI's quality gate on the quick profile, determinism, and its parts."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from skh.eval import MAXIMA, THRESHOLDS, profile, run_eval
from skh.eval.harness import _replayable
from skh.eval.probing import greedy_probe_matrix, path_links, random_sample_pairs
from skh.eval.report import (
    README_SECTION,
    readme_section,
    replace_readme_section,
    results_page,
    to_html,
    to_markdown,
)
from skh.eval.scoring import detection_scores, match_events, wilson
from skh.failures import FailureType
from skh.model import Fabric
from skh.sim.noise import TRAIN_SEEDS
from skh.sim.topology import FabricIndex

ROOT = Path(__file__).resolve().parents[2]


MUST_SHOW = (
    "precision",
    "recall",
    "precision_ci_low",
    "recall_ci_low",
    "fp_per_1k_host_hours",
    "e2e_localization_accuracy",
    "e2e_type_accuracy",
    "ttd_mean_s",
    "skeleton_coverage",
    "seeds",
    "noise_regime",
    "noise_measured",
)


#: the issue's gates the quick profile does not reach yet (empty: CI fails below every one). The
#: draws behind each decision are in the closing notes (`issues stops`). A gate comes out of this
#: set once two whole held-out draws on the current code hold it: precision and false positives
#: came out in session 7; end-to-end component and type accuracy in session 9 (ae0b790's code:
#: 1019689777+185620168 1.0 / 1.0, 348500024+1278792899 0.979 / 0.959, 871780879+1736298781
#: 0.989 / 0.989); recall in session 9 after young pairs were held against their ToR peers
#: (5e31b2a: 800889650+1063991037 77 of 77, 1928992977+1029668329 80 of 80, 0 false events;
#: it was 0.970-0.989 before, every miss a latency fault on a job ready for under a minute).
#: NOTE: one false event in a quick run (~750 healthy host-h) is 1.3 per 1k, over the 0.5
#: gate, and one miss in ~80 faults is 0.9875: both gates are one event wide at quick scale.
#: The test asserts every gate not listed on the point estimate, and that a gate below is said
#: so in the printed result; take a name out when it holds, never put one in to make a run pass.
SHORT_OF_GATE: frozenset[str] = frozenset()


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_quick_profile_against_the_gate(tmp_path):
    """What CI gates on: ``skh eval --quick --json`` in the default field regime, on seeds drawn
    at run time. The issue's gates: precision 0.98, recall 0.98, end-to-end component accuracy
    0.95, type accuracy 0.90, skeleton coverage 0.999 (at least) and 0.5 false positives per
    1,000 host-hours (at most), on the point estimates; those in :data:`SHORT_OF_GATE` are not
    met yet and are checked to be reported as such."""
    out = subprocess.run(
        [sys.executable, "-m", "skh", "eval", "--quick", "--json", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    for key in MUST_SHOW:
        assert key in res and res[key] is not None, key
    assert res["noise_regime"]["name"] == "field"
    # the regime really produced its noise: it cannot quietly shrink
    nm = res["noise_measured"]
    assert nm["benign_loss_per_probe"] >= 1e-4
    assert nm["rtt_over_base"]["max"] > 2.0 and nm["cpu_stalls"] > 0
    assert nm["congestion_episodes"] > 0 and nm["agent_restarts"] > 0
    na = nm["answers"]
    assert na["answers"] == "field" and na["flags_missing"] > 0 and na["flags_stale"] > 0
    assert res["table"]["detection"]["overlap"]["max_concurrent"] >= 2
    assert len(res["seeds"]) >= 2 and not set(res["seeds"]) & set(TRAIN_SEEDS)
    assert res["meta"]["scale"]["scaled_down"] and "scaled DOWN" in res["meta"]["scale"]["note"]
    for name in ("eval.json", "eval.md", "eval.html"):
        assert (tmp_path / name).is_file(), name
    det = res["table"]["detection"]
    e2e = res["table"]["localization"]["end_to_end"]
    # the precise report the lead routes: which types fell short, which events were false
    why = {
        "seeds": res["seeds"],
        "below": res["below_thresholds"],
        "missed": det["missed"],
        "false_events": det["false_events_sample"][:5],
        "detection_per_type": {
            k: v["recall"] for k, v in det["per_type"].items() if v["recall"] != 1.0
        },
        "e2e_per_type": {
            k: v for k, v in e2e["per_type"].items() if v["component"] < 1 or v["type"] < 1
        },
        "e2e_misses": e2e["misses"][:5],
    }
    failed = [k for k, floor in THRESHOLDS.items() if k not in SHORT_OF_GATE and res[k] < floor]
    failed += [k for k, cap in MAXIMA.items() if k not in SHORT_OF_GATE and res[k] > cap]
    if failed:
        # in full and seeds first: pytest cuts a long assertion's repr, and CI's log keeps only
        # its tail, so the draw must be readable there to be replayed
        pytest.fail(f"gate failed: {failed}\n{json.dumps(why, indent=1, default=str)}")
    # a gate not met is printed as such, and the result never claims to meet them all
    below = {f.split()[0] for f in res["below_thresholds"]}
    assert below <= SHORT_OF_GATE, why
    assert res["meets_thresholds"] == (not below)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_seed_gives_one_table():
    """Two runs with one seed agree on every deterministic figure (wall-clock ones live apart):
    one runs its stages here, one in two worker processes, so the stages' merge cannot depend
    on which finished first or in which process. About 40 s of CPU each (end-to-end
    localization runs rounds through noisy answers), so minutes of wall time on a loaded
    machine."""
    a = run_eval(profile("tiny"), 3, agent=False, workers=1)
    b = run_eval(profile("tiny"), 3, agent=False, workers=2)
    assert a["timings"]["workers"] == 1 and b["timings"]["workers"] == 2
    det_a, det_b = a["table"]["detection"], b["table"]["detection"]
    det_a.pop("cpu_s_per_seed"), det_b.pop("cpu_s_per_seed")
    assert a["table"] == b["table"]
    assert a["noise_measured"] == b["noise_measured"]
    assert to_markdown(a) == to_markdown(b)
    assert a["meta"]["seeds"] == [3] and a["meta"]["commit"]
    assert not a["calibration"]["evaluated"]["drawn_at_run_time"]
    assert a["meta"]["scale"]["hosts"] == 64 and a["meta"]["scale"]["rnics"] == 512
    det = det_a
    # faults arrive as a Poisson process: some of every symptom class the tiny profile draws
    assert det["faults"] >= 4 and det["faults_planned"] >= det["faults"]
    assert set(det["per_type"]) <= {t.name for t in profile("tiny").types}
    assert a["noise_measured"]["benign_loss_per_probe"] > 0
    md, page = to_markdown(a), to_html(a)
    assert "seeds 3" in md and a["meta"]["commit"][:12] in md
    assert page.startswith("<!doctype html>") and "Probing cost" in page
    assert "Noise measured" in md and "Calibration held out" in md and "Gray faults" in md
    # the generated pages (make results): every figure from the result, the README's other
    # sections kept, regenerating twice changes nothing
    page, section = results_page(a), readme_section(a)
    assert page.startswith("# Evaluation results") and "Headline" in page and "seeds 3" in page
    assert section.startswith(README_SECTION) and a["meta"]["commit"][:12] in section
    assert f"{100 * a['precision']:.1f}%" in section and "docs/results.md" in section
    readme = (ROOT / "README.md").read_text()
    once = replace_readme_section(readme, section)
    assert replace_readme_section(once, section) == once
    assert once.split(README_SECTION)[0] == readme.split(README_SECTION)[0]


# ------------------------------------------------------------------------------------- parts


@dataclass
class _Rec:
    fault_id: int
    type: FailureType
    start_ns: int
    end_ns: int
    affected_pairs: np.ndarray
    component: str = "x"


@dataclass
class _Ev:
    kind: str
    pairs: tuple
    detected_ns: int
    endpoints: tuple = ()
    explanation: str = ""
    first_seen_ns: int = 0


def test_scoring_counts_matches_misses_and_false_events():
    s = 10**9
    recs = [
        _Rec(0, FailureType.RNIC_PORT_DOWN, 100 * s, 160 * s, np.array([[1, 2], [2, 1]])),
        _Rec(1, FailureType.PCIE_NIC_ERROR, 300 * s, 360 * s, np.array([[5, 6]])),
        _Rec(2, FailureType.CRC_ERROR, 500 * s, 560 * s, np.array([[7, 8]])),
    ]
    evs = [
        _Ev("unreachable", ((1, 2),), 102 * s),
        _Ev("loss", ((2, 1),), 103 * s),  # matched, but not the symptom of a port down
        _Ev("latency-short", ((5, 6),), 320 * s),
        _Ev("latency-short", ((9, 9),), 330 * s),  # false
        _Ev("loss", ((7, 8),), 700 * s, explanation="x" * 150 + " worst 7->8: 6 lost"),  # late
    ]
    r = detection_scores(recs, evs, 30 * s, {})
    assert r["faults"] == 3 and r["events"] == 5
    assert r["precision"] == 0.6 and r["recall"] == round(2 / 3, 4)
    assert r["precision_kind"] == 0.4
    assert r["ttd_s"]["mean"] == 11.0 and r["ttd_s"]["p50"] == 11.0
    assert r["missed"] == ["CRC_ERROR@x"]
    # a false event keeps its whole explanation: the worst pair, what a replay starts from
    assert r["false_events"][1] == f"loss@{700 * s}: " + "x" * 150 + " worst 7->8: 6 lost"
    assert r["per_type"]["RNIC_PORT_DOWN"]["precision_kind"] == 0.5
    assert r["per_type"]["PCIE_NIC_ERROR"]["ttd_s"]["mean"] == 20.0
    # a gray fault's events are neither true nor false; a fault no probe crosses is a miss
    recs.append(_Rec(3, FailureType.CRC_ERROR, 600 * s, 660 * s, np.array([[3, 4]])))
    recs.append(_Rec(4, FailureType.SWITCH_PORT_DOWN, 600 * s, 660 * s, np.zeros((0, 2))))
    evs.append(_Ev("loss", ((3, 4),), 610 * s))
    g = detection_scores(recs, evs, 30 * s, {}, ignore={3}, invisible_are_misses=True)
    assert g["events"] == 5 and g["faults"] == 4 and g["invisible_faults"] == 1
    assert g["recall"] == 0.5 and g["precision"] == 0.6
    # a fault no probe could show (another fault failed every probe it touched) is neither
    # missed nor found: counted and listed apart
    m = detection_scores(recs, evs, 30 * s, {}, ignore={3}, invisible_are_misses=True, masked={2})
    assert m["faults"] == 3 and m["missed"] == ["SWITCH_PORT_DOWN@x"]
    assert m["masked_faults"] == 1 and m["masked"] == ["CRC_ERROR@x"]
    assert m["recall"] == round(2 / 3, 4) and m["precision"] == 0.6
    # what the gate prints of several seeds names the seed that replays each
    runs = [{"seed": 11, "detection": r}, {"seed": 12, "detection": m}]
    named = _replayable(runs)
    assert named["missed"] == ["CRC_ERROR@x (seed 11)", "SWITCH_PORT_DOWN@x (seed 12)"]
    assert named["false_events_sample"][0] == f"seed 11: latency-short@{330 * s}: "
    assert named["false_events_sample"][-1].startswith(f"seed 12: loss@{700 * s}: xxx")
    lo, hi = wilson(3, 5)
    assert 0.2 < lo < 0.6 < hi < 0.95 and wilson(0, 0) == (None, None)


def test_an_event_on_overlapping_faults_detects_each_of_them():
    """A port goes down on pairs a gray loss (scored apart) and an earlier port fault already
    touch: its event names their shared pair. It detects the new fault too, whatever the
    records' order; an event that fits only the gray fault stays neither true nor false."""
    s = 10**9
    both = np.array([[1, 2], [2, 1]])
    recs = [
        _Rec(0, FailureType.CRC_ERROR, 100 * s, 220 * s, both),  # gray
        _Rec(1, FailureType.SWITCH_PORT_DOWN, 110 * s, 170 * s, np.array([[1, 2], [3, 4]])),
        _Rec(2, FailureType.RNIC_PORT_DOWN, 150 * s, 210 * s, both),
    ]
    evs = [
        _Ev("unreachable", ((1, 2),), 112 * s),
        _Ev("unreachable", ((2, 1),), 151 * s),
        _Ev("loss", ((2, 1),), 105 * s),  # the gray fault's own
    ]
    r = detection_scores(recs, evs, 30 * s, {}, ignore={0})
    assert r["faults"] == 2 and r["recall"] == 1.0 and r["missed"] == []
    assert r["events"] == 2 and r["precision"] == 1.0
    assert r["per_type"]["RNIC_PORT_DOWN"]["ttd_s"]["mean"] == 1.0


def test_a_faults_affected_pairs_are_those_probing_while_it_was_on():
    """A fault's pairs (what an event must name to detect it) were every pair probed at any
    time of the run that crosses it: a job that had ended before the fault began was listed."""
    from skh.eval.harness import _reaffect
    from skh.sim.faults import Fault
    from skh.sim.scenario import Simulation

    fab = Fabric.from_params(hosts=32, rnics_per_host=8, hosts_per_segment=16, spines=2)
    sim = Simulation.build(fab, 12, seed=5, arrivals_per_min=2.0)
    job = next(j for j in sim.jobs if j.end_s < 1000 and len(set(j.host.tolist())) > 1)
    first = sim.cluster.endpoints[int(job.ep_ids[0])]
    tor = fab.rnic(first.host, first.rail).tor  # a ToR the job probed through
    t0 = job.end_s + 100.0
    rec = sim.inject(Fault(FailureType.SWITCH_OFFLINE, tor, start_s=t0, end_s=t0 + 100.0))
    mine = set(job.ep_ids.tolist())
    assert any(set(p) & mine for p in rec.affected_pairs.tolist())  # listed as of the start
    pairs = _reaffect(sim, rec).affected_pairs.astype(np.int64)
    assert pairs.size and not set(pairs.ravel().tolist()) & mine
    assert (np.maximum(sim.ep_ready_s[pairs[:, 0]], sim.ep_ready_s[pairs[:, 1]]) < t0 + 100).all()
    assert (np.minimum(sim.ep_end_s[pairs[:, 0]], sim.ep_end_s[pairs[:, 1]]) > t0).all()


def test_greedy_probe_matrix_covers_every_link_beta_times():
    fab = Fabric.from_params(hosts=16, hosts_per_segment=4, spines=2)
    ix = FabricIndex(fab)
    rng = np.random.default_rng(0)
    src = rng.choice(np.arange(0, ix.n_rnics, ix.rails), 200)
    dst = rng.choice(np.arange(0, ix.n_rnics, ix.rails), 200)
    keep = src // ix.rails != dst // ix.rails
    src, dst = src[keep], dst[keep]
    pid = rng.integers(0, 4, src.size)
    links = path_links(ix, src, dst, pid)
    sel, facts = greedy_probe_matrix(links, beta=2)
    assert facts["links"] == np.unique(links[links >= 0]).size
    reach = {int(k) for k in np.unique(links[links >= 0])}
    counts: dict[int, int] = {}
    for row in links[sel]:
        for k in row[row >= 0].tolist():
            counts[k] = counts.get(k, 0) + 1
    # every link is covered min(beta, its candidates) times, with fewer probes than candidates
    for k in reach:
        assert counts.get(k, 0) >= min(2, int((links == k).any(axis=1).sum()))
    assert sel.size < src.size


def test_random_sample_keeps_the_budget_on_the_rail():
    ep = np.arange(32, dtype=np.uint32)
    rail = np.tile(np.arange(8), 4)
    host = np.repeat(np.arange(4), 8)
    deg = np.full(32, 2)
    p = random_sample_pairs(ep, rail, host, deg, seed=5)
    assert p.shape == (64, 2)
    assert (rail[p[:, 0]] == rail[p[:, 1]]).all() and (host[p[:, 0]] != host[p[:, 1]]).all()
    assert (np.bincount(p[:, 0], minlength=32) == 2).all()
    assert np.array_equal(p, random_sample_pairs(ep, rail, host, deg, seed=5))


def test_stages_come_back_by_name_whichever_finishes_first():
    """The stages' merge: results by name in the order given, the slow first stage's included,
    the same in worker processes as here, each with its own CPU and wall seconds."""
    import time

    from skh.eval.harness import run_stages

    stages = [("slow", time.sleep, (0.5,)), ("fast", abs, (-2,)), ("sum", sum, ((1, 2, 3),))]
    here, pooled = run_stages(stages, 1), run_stages(stages, 2)
    for done in (here, pooled):
        assert list(done) == ["slow", "fast", "sum"]
        assert [v[0] for v in done.values()] == [None, 2, 6]
        assert done["slow"][2] >= 0.5 and all(v[1] >= 0 for v in done.values())


def _fails_unless(flag: str) -> str:
    if not Path(flag).exists():
        raise RuntimeError("stopped")
    return "late"


def _must_not_run() -> None:
    raise AssertionError("a kept stage ran again")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stopped_run_keeps_its_finished_stages(tmp_path, monkeypatch, workers):
    """The full profile takes hours: a run stopped after some stages resumes from its store
    without running them again; a failing stage does not cost the ones that finished."""
    from skh.eval import harness, stagestore

    monkeypatch.setattr(stagestore, "_code_is_clean", lambda: True)
    store = stagestore.StageStore(tmp_path / "stages")
    flag = tmp_path / "flag"
    first = [("late", _fails_unless, (str(flag),)), ("early", abs, (-2,)), ("sum", sum, ((1, 2),))]
    with pytest.raises(RuntimeError, match="stopped"):
        harness.run_stages(first, workers, store)
    assert store.has("early") and store.has("sum") and not store.has("late")
    flag.touch()
    again = [first[0], ("early", _must_not_run, ()), ("sum", _must_not_run, ())]
    done = harness.run_stages(again, workers, store)
    assert list(done) == ["late", "early", "sum"]
    assert [v[0] for v in done.values()] == ["late", 2, 3]


def test_the_code_a_run_is_keyed_by_outlives_commits_of_anything_else(tmp_path):
    """A full run spans days of commits: the key is the committed trees of skh/ and csrc/, the
    same across a commit of docs, another after a change to either (a real git repository)."""
    from skh.eval.stagestore import _code_is_clean, code_id

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for d, f in (("skh", "a.py"), ("csrc", "e.c"), ("docs", "d.md")):
        (tmp_path / d).mkdir()
        (tmp_path / d / f).write_text("1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = code_id(tmp_path)
    assert first != "unknown" and _code_is_clean(tmp_path)
    (tmp_path / "docs" / "d.md").write_text("2\n")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "docs")
    assert code_id(tmp_path) == first
    for d, f in (("csrc", "e.c"), ("skh", "a.py")):
        (tmp_path / d / f).write_text("3\n")
        assert not _code_is_clean(tmp_path)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", d)
        assert code_id(tmp_path) != first and _code_is_clean(tmp_path)
        first = code_id(tmp_path)
    assert code_id(tmp_path / "docs" / "nowhere") == "unknown"


def test_stored_stages_belong_to_one_code_profile_and_seed_set(tmp_path, monkeypatch):
    """A resumed run takes the seeds drawn when it began; other code, profile or regime, or
    other given seeds, is refused with the reason, as is a tree whose code no commit names."""
    from skh.errors import ConfigError
    from skh.eval import stagestore

    monkeypatch.setattr(stagestore, "_code_is_clean", lambda: True)
    store = stagestore.StageStore(tmp_path / "stages")
    key = {"code": "a" * 40, "profile": "full", "noise": "field"}
    draws = iter([{"seeds": [11, 12]}, {"seeds": [21, 22]}])
    assert store.manifest(key, lambda: next(draws))["seeds"] == [11, 12]
    assert store.manifest(key, lambda: next(draws))["seeds"] == [11, 12]
    for k, v in (("code", "b" * 40), ("profile", "quick"), ("noise", "lab"), ("seeds", [5])):
        with pytest.raises(ConfigError, match=k):
            store.manifest({**key, k: v}, lambda: next(draws))
    with pytest.raises(ConfigError, match="keyed by the committed code"):
        stagestore.StageStore(tmp_path / "other").manifest({**key, "code": "unknown"}, dict)
    monkeypatch.setattr(stagestore, "_code_is_clean", lambda: False)
    with pytest.raises(ConfigError, match="keyed by the committed code"):
        stagestore.StageStore(tmp_path / "other").manifest(key, dict)


def test_a_long_term_event_is_explained_by_a_fault_within_the_block_it_tested():
    """Field draw 982641095 + 1893097845: a gray fault (+6 us on one flow of four, 1600-1800 s)
    lifted its pair's 30-min block 5 %, and the long-term test flagged the block when it closed
    at 2800 s: true, but matched at the close alone it counted as false. A latency-long event
    speaks for its block; one on a block without a fault, or a short-term event that late,
    stays false."""
    s = 10**9
    recs = [
        _Rec(0, FailureType.PCIE_NIC_ERROR, 1600 * s, 1800 * s, np.array([[571, 555]])),
        _Rec(1, FailureType.CRC_ERROR, 100 * s, 160 * s, np.array([[7, 8]])),
    ]
    evs = [
        _Ev("latency-long", ((571, 555),), 2800 * s, first_seen_ns=1000 * s),
        _Ev("latency-long", ((571, 555),), 4600 * s, first_seen_ns=2800 * s),  # next block: false
        _Ev("latency-short", ((571, 555),), 2800 * s, first_seen_ns=2770 * s),  # false
        _Ev("loss", ((7, 8),), 101 * s),
    ]
    r = detection_scores(recs, evs, 30 * s, {}, ignore={0})
    assert r["faults"] == 1 and r["recall"] == 1.0
    assert r["events"] == 3 and r["precision"] == round(1 / 3, 4)
    _, detected = match_events(recs, evs, 30 * s, {})
    assert [e.kind for e in detected[0]] == ["latency-long"]
