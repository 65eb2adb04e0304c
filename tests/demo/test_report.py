"""The report renders from plain data (no root needed), and ``skh demo`` without root says so."""

from __future__ import annotations

import argparse

from skh.demo.report import render, rtt_summary, write_report
from skh.records import empty_probes


def _data(ok: bool = True) -> dict:
    t0 = 1_800_000_000_000_000_000
    eps = [
        {
            "ep_id": i,
            "name": f"job0/c{i // 2}x0/{i % 2}",
            "job": "job0",
            "host": f"host{i // 2}",
            "rail": i % 2,
        }
        for i in range(4)
    ]
    truth = {
        "id": 1,
        "kind": "link_down",
        "layer": "underlay",
        "component": ["host1:rnic0", "tor0r0"],
        "paper_type": 2,
        "detail": {},
        "t_inject_ns": t0 + 10**10,
    }
    det = {
        "kind": "fault",
        "state": "open",
        "alert_id": "underlay|host1:rnic0|tor0r0|2",
        "layer": "underlay",
        "component": "host1:rnic0|tor0r0",
        "failure_type": "switch_port_down",
        "n_pairs": 2,
        "seq": 2,
        "ts_ns": t0 + 12 * 10**9,
        "evidence": {"votes": 2, "cleared_by": 3, "path": ["host1:rnic0"]},
        "detection": {
            "kind": "unreachable",
            "explanation": "2 pairs stopped answering",
            "detected_ns": t0 + 11 * 10**9,
            "n_pairs": 2,
            "n_endpoints": 0,
        },
        "localization": {"took_s": 0.8, "reads": {"host_report": 2, "traceroute": 5}},
    }
    res = {**det, "state": "resolved", "seq": 3, "ts_ns": t0 + 30 * 10**9}
    other = {
        **det,
        "alert_id": "underlay|tor0r0|4",
        "component": "tor0r0",
        "seq": 4,
        "ts_ns": t0 + 13 * 10**9,
    }
    return {
        "title": "report <test>",
        "mode": "live",
        "started_ns": t0,
        "ended_ns": t0 + 40 * 10**9,
        "ok": ok,
        "endpoints": eps,
        "skeletons": {
            "job0": {
                "endpoints": [0, 1, 2, 3],
                "applied": [[0, 2], [2, 0], [0, 1]],
                "truth": [[0, 2], [2, 0], [1, 3]],
                "equal": False,
                "mode": "skeleton",
                "confidence": 0.9,
            }
        },
        "rtt": {
            "pairs": [[0, 2], [2, 0], [1, 3]],
            "p50_us": [40.0, 45.0, 5000.0],
            "n": [100, 100, 90],
        },
        "faults": [
            {
                "truth": truth,
                "injected_ns": t0 + 10**10,
                "cleared_ns": t0 + 20 * 10**9,
                "detected": det,
                "resolved": res,
                "others": [other],
                "caught": True,
                "ok": True,
                "detect_s": 1.0,
                "alert_s": 2.0,
                "resolve_s": 10.0,
            }
        ],
        "alerts": [det, other, res],
        "timeline": [[t0, "start"], [t0 + 10**10, "fault 1"]],
    }


def test_rtt_summary_takes_the_median_of_answered_probes():
    p = empty_probes(5)
    p["src_ep"], p["dst_ep"] = [0, 0, 0, 1, 1], [1, 1, 1, 0, 0]
    p["rtt_ns"] = [10_000, 30_000, 20_000, 7_000, -1]
    p["status"] = [0, 0, 0, 0, 1]
    s = rtt_summary(p)
    assert s == {"pairs": [[0, 1], [1, 0]], "p50_us": [20.0, 7.0], "n": [3, 1]}
    assert rtt_summary(empty_probes()) == {"pairs": [], "p50_us": [], "n": []}


def test_render_is_self_contained_and_escapes():
    page = render(_data())
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "report &lt;test&gt;" in page and "<test>" not in page
    assert page.count("<svg") == 3  # timeline, one skeleton matrix, the heat map
    assert "used but NOT inferred (missed)" in page and "inferred, not used" in page
    assert "1 of 1 faults detected" in page


def test_each_fault_is_told_step_by_step():
    from skh.demo.report import fault_steps

    steps = fault_steps(_data()["faults"][0])
    assert [s["step"] for s in steps] == [
        "fault",
        "detection",
        "evidence",
        "evidence",
        "verdict",
        "other alert",
        "repair",
        "resolved",
    ]
    assert [s["t_s"] for s in steps if s["t_s"] is not None] == [0.0, 1.0, 2.0, 3.0, 10.0, 20.0]
    text = "\n".join(s["text"] for s in steps)
    assert "unreachable event on 2 pair(s): 2 pairs stopped answering" in text
    assert "read 2 host_report, 5 traceroute in 0.8 s" in text
    assert "underlay vote: 2 failing trace(s) cross it, 3 healthy one(s) clear it" in text
    assert "underlay host1:rnic0|tor0r0: switch_port_down (2 pairs)" in text
    assert "alert resolved +10.0 s after the repair" in text
    # what was never seen says so
    missed = {**_data()["faults"][0], "detected": None, "resolved": None, "others": []}
    assert [s["text"] for s in fault_steps(missed) if s["step"] != "fault"][:2] == [
        "no alert opened",
        "NOT placed on its component",
    ]


def test_report_renders_in_chromium(tmp_path, chromium):
    page = write_report(tmp_path, _data())
    assert (tmp_path / "report.json").exists()
    dom = chromium(page, tmp_path / "shot.png")
    assert "1 of 1 faults detected, localized and resolved" in dom
    assert "host1:rnic0|tor0r0" in dom
    assert "What the system saw, step by step" in dom and "2 pairs stopped answering" in dom
    # a rendered page, not a blank one: the PNG holds the colours of the matrices
    assert (tmp_path / "shot.png").stat().st_size > 20_000


def test_demo_without_root_says_so_and_offers_the_simulator(monkeypatch, capsys):
    from skh.cli import demo

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    args = argparse.Namespace(
        sim=False,
        out="unused",
        prefix="skhd",
        port_base=7550,
        hosts=4,
        rnics=4,
        faults=None,
        seed=1,
    )
    assert demo.run(args) == 2
    out = capsys.readouterr().out
    assert "needs root" in out and "skh demo --sim" in out
