"""The alert log as a bus contract: rotation at a size, retention by age and by bytes, sequence
numbers continuous across rotation and restarts, replay pages bounded by count and bytes, open
alerts known whatever retention deleted, oversized alerts cut to fit."""

import json

import pytest

from skh.errors import ConfigError
from skh.orchestrator import alerts as bus
from skh.orchestrator.alerts import MAX_RECORD_BYTES, AlertLog, Retention


def _fault(i, state="open", aid=None):
    return {
        "kind": "fault",
        "state": state,
        "alert_id": aid or f"underlay|l{i}|2",
        "pad": "x" * 200,
    }


def _seqs(recs):
    return [r["seq"] for r in recs]


def test_rotation_keeps_sequence_numbers_continuous_across_segments_and_restarts(tmp_path):
    path = tmp_path / "alerts.log"
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=0))
    for i in range(60):
        assert log.append(_fault(i))["seq"] == i + 1
    segments = sorted(p.name for p in tmp_path.glob("alerts.log.*"))
    assert len(segments) >= 2, segments
    assert all(p.stat().st_size <= 4096 for p in tmp_path.glob("alerts.log.*"))
    assert _seqs(log.since(0)) == list(range(1, 61))  # a replay crosses every segment
    assert _seqs(log.since(37, limit=5)) == [38, 39, 40, 41, 42]
    log.close()
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=0))
    assert (log.first_seq, log.last_seq) == (1, 60)
    assert log.append(_fault(60))["seq"] == 61
    # every record on disk, in file order of segments then the active file, is 1..61 once
    files = sorted(tmp_path.glob("alerts.log.0*")) + [path]
    on_disk = [json.loads(line)["seq"] for f in files for line in f.read_text().splitlines()]
    assert on_disk == list(range(1, 62))
    log.close()


def test_a_restart_right_after_rotation_continues_from_the_newest_segment(tmp_path):
    path = tmp_path / "alerts.log"
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=0))
    for i in range(30):
        log.append(_fault(i))
    log.close()
    # a crash between the rename and the first write leaves an empty active file
    first = sorted(tmp_path.glob("alerts.log.0*"))[-1]
    path.rename(
        tmp_path / f"alerts.log.{int(json.loads(path.read_text().splitlines()[0])['seq']):020d}"
    )
    path.touch()
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=0))
    assert log.last_seq == 30 and first.exists()
    assert log.append(_fault(99))["seq"] == 31
    log.close()


def test_retention_by_bytes_deletes_oldest_segments_and_replay_says_where_the_log_starts(
    tmp_path,
):
    path = tmp_path / "alerts.log"
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=3 * 4096))
    for i in range(200):
        log.append(_fault(i, aid="underlay|same|2" if i % 2 else None))
    total = sum(p.stat().st_size for p in tmp_path.glob("alerts.log*") if p.suffix != ".open")
    assert total <= 3 * 4096 + 4096
    assert log.first_seq > 1 and log.last_seq == 200
    page = log.replay(0)
    assert page["first_seq"] == log.first_seq == page["alerts"][0]["seq"]
    assert page["last_seq"] == 200 and _seqs(page["alerts"]) == list(range(log.first_seq, 201))
    log.close()
    log = AlertLog(path, Retention(segment_bytes=4096, retention_s=0, retention_bytes=3 * 4096))
    assert log.last_seq == 200 and log.append(_fault(1))["seq"] == 201
    log.close()


def test_retention_by_age_keeps_the_active_file_and_open_alerts_survive_their_segment(tmp_path):
    path = tmp_path / "alerts.log"
    ret = Retention(segment_bytes=4096, retention_s=3600, retention_bytes=0)
    log = AlertLog(path, ret)
    log.append(_fault(0, aid="rnic|h1:rnic0|7"))  # opened early, never resolved
    log.append(_fault(1, aid="rnic|h2:rnic0|7"))
    for i in range(40):
        log.append(_fault(i, state="event", aid=f"skeleton|j|{i}"))
    log.append(_fault(1, state="resolved", aid="rnic|h2:rnic0|7"))
    assert [r["alert"]["alert_id"] for r in log.open_alerts()] == ["rnic|h1:rnic0|7"]
    # an hour and a bit later: every rotated segment is past retention, the active one stays
    assert log.prune(log.since(log.last_seq - 1)[0]["ts_ns"] + int(3700e9)) >= 1
    assert log.first_seq > 2 and log.last_seq == 43
    assert [r["alert"]["alert_id"] for r in log.open_alerts()] == ["rnic|h1:rnic0|7"]
    log.close()
    log = AlertLog(path, ret)
    assert [r["seq"] for r in log.open_alerts()] == [1]  # carried in alerts.log.open
    assert log.append(_fault(0, state="resolved", aid="rnic|h1:rnic0|7"))["seq"] == 44
    assert log.open_alerts() == []
    log.close()


def test_replay_pages_are_bounded_in_bytes_but_never_empty(tmp_path, monkeypatch):
    log = AlertLog(tmp_path / "a.log")
    for i in range(20):
        log.append(_fault(i))
    one = len(json.dumps(log.since(0, limit=1)[0], separators=(",", ":"))) + 1
    assert _seqs(log.since(0, max_bytes=3 * one)) == [1, 2, 3]
    assert _seqs(log.since(4, max_bytes=1)) == [5]  # one record even when over the budget
    monkeypatch.setattr(bus, "MAX_REPLAY", 7)
    assert _seqs(log.replay(0, limit=100)["alerts"]) == list(range(1, 8))
    log.close()


def test_an_oversized_alert_has_its_longest_lists_cut_and_named(tmp_path):
    log = AlertLog(tmp_path / "a.log")
    big = {
        "kind": "skeleton",
        "pairs": [[i, i + 1] for i in range(200_000)],
        "ep_id": list(range(1000)),
    }
    rec = log.append(big)
    assert rec["alert"]["truncated"] == ["pairs"]
    assert 0 < len(rec["alert"]["pairs"]) < 200_000 and len(rec["alert"]["ep_id"]) == 1000
    line = (tmp_path / "a.log").read_bytes()
    assert len(line) <= MAX_RECORD_BYTES and json.loads(line)["alert"]["truncated"] == ["pairs"]
    log.close()


def test_retention_settings_are_checked():
    with pytest.raises(ConfigError, match="alert_log_segment_bytes"):
        Retention(segment_bytes=10)
    with pytest.raises(ConfigError, match="retention"):
        Retention(retention_s=-1)
