"""The demo's HTML report: one self-contained file (inline CSS and SVG, no scripts, nothing
fetched), plus the same data as ``report.json``.

Sections: the verdict per injected fault against the truth, a timeline of faults and alerts,
the skeleton matrix per job (inferred vs the traffic generator's truth) and a heat map of the
median RTT per probed pair.

The input is a plain mapping (what :func:`build_data` assembles from a run), so the live and the
simulated demo share it::

    {"title", "mode", "started_ns", "ended_ns", "ok",
     "endpoints": [{"ep_id", "name", "job", "host", "rail"}],
     "skeletons": {job: {"endpoints": [id], "applied": [[a, b]], "truth": [[a, b]], "equal",
                         "covers", "mode", "confidence"}},
     "rtt": {"pairs": [[a, b]], "p50_us": [float], "n": [int]},
     "faults": [FaultOutcome.to_dict()], "alerts": [alert records], "timeline": [[ns, text]]}
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from skh.records import pair_keys

__all__ = ["fault_steps", "rtt_summary", "render", "write_report"]

_CSS = (
    "\n"
    "body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;"
    "color:#1d2330;background:#fafbfc}\n"
    "h1{font-size:22px;margin:0 0 4px}"
    "h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}\n"
    ".sub{color:#5b6475}.ok{color:#127a3a;font-weight:600}.bad{color:#b3261e;font-weight:600}\n"
    "table{border-collapse:collapse;background:#fff;margin:6px 0}"
    "td,th{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}\n"
    "th{background:#f0f3f7}code{font-size:12px}.grid{display:flex;flex-wrap:wrap;gap:24px}\n"
    ".card{background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:10px}\n"
    ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
    "vertical-align:middle;border:1px solid #999}\n"
)


def rtt_summary(probes: np.ndarray) -> dict[str, list]:
    """Median network RTT (µs) and probe count per pair from ``PROBE_DTYPE`` records (answered
    probes only)."""
    ok = probes[(probes["status"] == 0) & (probes["rtt_ns"] > 0)]
    if ok.size == 0:
        return {"pairs": [], "p50_us": [], "n": []}
    key = pair_keys(ok["src_ep"], ok["dst_ep"])
    order = np.argsort(key, kind="stable")
    key, rtt = key[order], ok["rtt_ns"][order] / 1e3
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    bounds = np.r_[starts, key.size]
    pairs, p50, n = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        k = int(key[a])
        pairs.append([k >> 32, k & 0xFFFFFFFF])
        p50.append(round(float(np.median(rtt[a:b])), 1))
        n.append(int(b - a))
    return {"pairs": pairs, "p50_us": p50, "n": n}


def _e(x: Any) -> str:
    return html.escape(str(x))


def _short(ep: Mapping[str, Any]) -> str:
    parts = str(ep["name"]).split("/")
    return f"{parts[1]}/{parts[2]}" if len(parts) == 3 else str(ep["name"])


def _matrix_svg(
    labels: Sequence[str], cell: Mapping[tuple[int, int], tuple[str, str]], *, size: int = 14
) -> str:
    """A square matrix: ``cell[(i, j)] = (fill, tooltip)``."""
    n = len(labels)
    pad = 90
    w = pad + n * size + 4
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{w}"'
        ' font-size="9" font-family="monospace">'
    ]
    for i, lab in enumerate(labels):
        y = pad + i * size + size * 0.75
        out.append(f'<text x="{pad - 4}" y="{y:.1f}" text-anchor="end">{_e(lab)}</text>')
        x = pad + i * size + size * 0.7
        out.append(
            f'<text x="{x:.1f}" y="{pad - 4}" transform="rotate(-90 {x:.1f} {pad - 4})">'
            f"{_e(lab)}</text>"
        )
    for i in range(n):
        for j in range(n):
            fill, tip = cell.get((i, j), ("#f4f5f7", ""))
            out.append(
                f'<rect x="{pad + j * size}" y="{pad + i * size}"'
                f' width="{size - 1}" height="{size - 1}" fill="{fill}">'
                + (f"<title>{_e(tip)}</title>" if tip else "")
                + "</rect>"
            )
    out.append("</svg>")
    return "".join(out)


def _skeleton_section(data: Mapping[str, Any]) -> str:
    eps = {e["ep_id"]: e for e in data.get("endpoints", ())}
    parts = []
    for job, sk in data.get("skeletons", {}).items():
        ids = list(sk["endpoints"])
        idx = {e: i for i, e in enumerate(ids)}
        applied = {tuple(p) for p in sk.get("applied", ())}
        truth = {tuple(p) for p in sk.get("truth", ())}
        cells = {}
        for a in ids:
            for b in ids:
                both, inf, tru = (
                    (a, b) in applied and (a, b) in truth,
                    (a, b) in applied,
                    (a, b) in truth,
                )
                if both:
                    cells[(idx[a], idx[b])] = ("#2e7d32", "inferred and used")
                elif inf:
                    cells[(idx[a], idx[b])] = ("#f9a825", "inferred, not used (extra probing)")
                elif tru:
                    cells[(idx[a], idx[b])] = ("#c62828", "used but NOT inferred (missed)")
        labels = [_short(eps[e]) if e in eps else str(e) for e in ids]
        if sk.get("equal"):
            verdict = '<span class="ok">equals the truth</span>'
        elif sk.get("covers"):
            verdict = '<span class="ok">covers the truth (probes wider)</span>'
        else:
            verdict = '<span class="bad">misses pairs of the truth</span>'

        parts.append(
            f'<div class="card"><b>{_e(job)}</b> — {_e(sk.get("mode", ""))}, confidence '
            f"{float(sk.get('confidence', 0)):.2f}, {len(applied)} pairs inferred, "
            f"{len(truth)} used: {verdict}<br>" + _matrix_svg(labels, cells) + "</div>"
        )
    legend = (
        '<div class="legend">rows probe columns:'
        '<span style="background:#2e7d32"></span>inferred and used'
        '<span style="background:#f9a825"></span>inferred only'
        '<span style="background:#c62828"></span>missed'
        '<span style="background:#f4f5f7"></span>not probed</div>'
    )
    return (
        "<h2>Traffic skeleton per job</h2>"
        + legend
        + '<div class="grid">'
        + "".join(parts)
        + "</div>"
    )


def _heat(v: float, lo: float, hi: float) -> str:
    t = (
        0.0
        if hi <= lo
        else min(1.0, max(0.0, (np.log(v) - np.log(lo)) / (np.log(hi) - np.log(lo))))
    )
    # light yellow → orange → dark red
    r = int(255 - 80 * t)
    g = int(240 - 200 * t)
    b = int(180 - 160 * t)
    return f"rgb({r},{g},{b})"


def _latency_section(data: Mapping[str, Any]) -> str:
    rtt = data.get("rtt") or {}
    pairs = rtt.get("pairs", [])
    if not pairs:
        return "<h2>Median RTT per pair</h2><p class=sub>no probe results recorded</p>"
    eps = sorted(data.get("endpoints", ()), key=lambda e: (e["job"], e["ep_id"]))
    idx = {e["ep_id"]: i for i, e in enumerate(eps)}
    vals = np.array(rtt["p50_us"], float)
    lo, hi = float(max(np.percentile(vals, 2), 1.0)), float(max(np.percentile(vals, 98), 2.0))
    cells = {}
    for (a, b), v, n in zip(pairs, rtt["p50_us"], rtt["n"], strict=False):
        if a in idx and b in idx:
            cells[(idx[a], idx[b])] = (
                _heat(max(v, lo), lo, hi),
                f"{a}->{b}: p50 {v:.0f} us over {n} probes",
            )
    legend = (
        '<div class="legend">p50 RTT, log scale:'
        f'<span style="background:{_heat(lo, lo, hi)}"></span>{lo:.0f} µs'
        f'<span style="background:{_heat(hi, lo, hi)}"></span>≥ {hi:.0f} µs'
        '<span style="background:#f4f5f7"></span>not probed</div>'
    )
    return (
        "<h2>Median RTT per pair (whole run)</h2>"
        + legend
        + f'<div class="card">{_matrix_svg([_short(e) for e in eps], cells)}</div>'
    )


def _timeline_section(data: Mapping[str, Any]) -> str:
    t0, t1 = int(data.get("started_ns", 0)), int(data.get("ended_ns", 0))
    faults = data.get("faults", [])
    alerts = [a for a in data.get("alerts", ()) if a.get("kind") == "fault"]
    if t1 <= t0:
        return ""
    width, left = 900, 230
    span = (t1 - t0) / 1e9

    def x(ns: int) -> float:
        return left + (min(max(ns, t0), t1) - t0) / 1e9 / span * (width - left - 10)

    # one row per fault, then one per alert id
    opened: dict[str, dict[str, Any]] = {}
    rows: list[tuple[str, int, int, str, str]] = []
    matched = {f["detected"]["alert_id"] for f in faults if f.get("detected")}
    for a in alerts:
        if a["state"] == "open":
            opened.setdefault(a["alert_id"], a)
    for f in faults:
        t = f["truth"]
        comp = "|".join(t["component"]) if isinstance(t["component"], list) else t["component"]
        rows.append(
            (
                f"fault {t['id']}: {t['kind']}",
                f["injected_ns"],
                f.get("cleared_ns") or t1,
                "#5c6bc0",
                f"{t['layer']} {comp}",
            )
        )
    for aid, a in opened.items():
        res = next(
            (
                r
                for r in alerts
                if r["alert_id"] == aid and r["state"] == "resolved" and r["seq"] > a["seq"]
            ),
            None,
        )
        color = "#2e7d32" if aid in matched else "#ef8c00"
        rows.append(
            (
                f"alert {a['layer']} {a['component']}"[:38],
                a["ts_ns"],
                res["ts_ns"] if res else t1,
                color,
                f"{a['failure_type']} ({a.get('n_pairs', 0)} pairs)",
            )
        )
    h = 30 + 18 * len(rows)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}"'
        ' font-size="11" font-family="system-ui,sans-serif">'
    ]
    for s in range(0, int(span) + 1, max(10, int(span / 10) // 10 * 10 or 10)):
        xx = x(t0 + s * 1_000_000_000)
        out.append(
            f'<line x1="{xx:.1f}" y1="14" x2="{xx:.1f}" y2="{h}" stroke="#e3e6eb"/>'
            f'<text x="{xx:.1f}" y="11" text-anchor="middle" fill="#5b6475">{s}s</text>'
        )
    for i, (label, a, b, color, tip) in enumerate(rows):
        y = 20 + 18 * i
        out.append(f'<text x="{left - 6}" y="{y + 11}" text-anchor="end">{_e(label)}</text>')
        out.append(
            f'<rect x="{x(a):.1f}" y="{y}" width="{max(2.0, x(b) - x(a)):.1f}"'
            f' height="13" rx="2" fill="{color}">'
            f"<title>{_e(label)}: {_e(tip)}</title></rect>"
        )
    out.append("</svg>")
    legend = (
        '<div class="legend"><span style="background:#5c6bc0"></span>fault injected → cleared'
        '<span style="background:#2e7d32"></span>alert matching a fault (open → resolved)'
        '<span style="background:#ef8c00"></span>other alert</div>'
    )
    return (
        "<h2>Timeline: faults vs alerts</h2>" + legend + f'<div class="card">{"".join(out)}</div>'
    )


def _comp(t: Mapping[str, Any]) -> str:
    c = t["component"]
    return " | ".join(c) if isinstance(c, list) else str(c)


def _evidence_text(ev: Mapping[str, Any]) -> list[str]:
    """What an alert's evidence says, in words."""
    out = []
    if "walk" in ev:
        chain = " → ".join(str(x) for x in ev.get("chain", ()))
        out.append(f"overlay walk: {ev['walk']} at {ev.get('hop')} ({chain})")
    if "votes" in ev:
        path = " → ".join("?" if x is None else str(x) for x in ev.get("path", ()))
        out.append(
            f"underlay vote: {ev['votes']} failing trace(s) cross it, {ev.get('cleared_by', 0)}"
            f" healthy one(s) clear it{', partial' if ev.get('partial') else ''}; e.g. {path}"
        )
    if "host_report" in ev:
        out.append(f"host report: {ev['host_report']}")
    if isinstance(ev.get("diff"), Mapping):
        d = ev["diff"]
        ex = "; ".join(str(x) for x in d.get("examples", ())[:2])
        out.append(
            f"RNIC flow table: {d.get('missing', 0)} rule(s) missing from the offloaded table"
            + (f" ({ex})" if ex else "")
        )
    if "health_bits" in ev:
        out.append(
            f"agent health: endpoints {ev.get('endpoints', [])} unhealthy"
            f" (reason bits {ev['health_bits']}), {ev.get('refused', 0)} refused probe(s)"
        )
    if "reason" in ev:
        out.append(str(ev["reason"]))
    return out


def _reads_text(loc: Mapping[str, Any]) -> str:
    reads = ", ".join(f"{n} {k}" for k, n in sorted(dict(loc.get("reads", {})).items()))
    return f"read {reads or 'nothing'} in {float(loc.get('took_s', 0)):.1f} s"


def fault_steps(f: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the system saw of one fault, step by step: ``{t_s, step, text}`` (seconds after
    the injection; ``None`` where there is no time), in the order it happened."""
    t = f["truth"]
    t0 = int(f["injected_ns"])
    late = float("inf")
    keyed: list[tuple[float, dict[str, Any]]] = []

    def add(t_s: float | None, step: str, text: str, at: float | None = None) -> None:
        key = at if at is not None else (late if t_s is None else t_s)
        keyed.append((key, {"t_s": t_s, "step": step, "text": text}))

    add(0.0, "fault", f"{t['kind']} injected on {t['layer']} {_comp(t)}")
    d = f.get("detected")
    seen = d or next(iter(f.get("others", ())), None)
    det = (seen or {}).get("detection") or {}
    detect_s = f.get("detect_s")
    if det:
        who = f"{det.get('n_pairs', 0)} pair(s)"
        if det.get("n_endpoints"):
            who += f", {det['n_endpoints']} endpoint(s)"
        add(detect_s, "detection", f"{det.get('kind')} event on {who}: {det.get('explanation')}")
    elif seen is None:
        add(None, "detection", "no alert opened", at=0.0)
    if seen is not None:
        texts = _evidence_text(seen.get("evidence", {}))
        if seen.get("localization"):
            texts.insert(0, _reads_text(seen["localization"]))
        # read between the detection and the verdict
        at = detect_s if detect_s is not None else (seen["ts_ns"] - t0) / 1e9
        for text in texts:
            add(None, "evidence", text, at=at)
    for a in f.get("others", ()):
        add(
            (a["ts_ns"] - t0) / 1e9,
            "other alert",
            f"{a['layer']} {a['component']} ({a['failure_type']}, {a.get('n_pairs', 0)} pairs)",
        )
    if d is not None:
        cands = d.get("candidates") or []
        add(
            f.get("alert_s"),
            "verdict",
            f"{d['layer']} {d['component']}: {d['failure_type']} ({d.get('n_pairs', 0)} pairs)"
            + (f"; also possible: {', '.join(cands)}" if cands else ""),
        )
    else:
        add(None, "verdict", "NOT placed on its component", at=0.0)
    if f.get("cleared_ns"):
        add((f["cleared_ns"] - t0) / 1e9, "repair", "fault cleared")
    r = f.get("resolved")
    if d is not None:
        if r and f.get("resolve_s") is not None:
            add(
                (r["ts_ns"] - t0) / 1e9,
                "resolved",
                f"alert resolved {f['resolve_s']:+.1f} s after the repair",
            )
        else:
            add(None, "resolved", "alert NOT resolved")
    keyed.sort(key=lambda kv: kv[0])  # stable: same-time steps keep their order
    return [step for _k, step in keyed]


def _at(t_s: float | None) -> str:
    return "" if t_s is None else f"{t_s:+.1f} s"


def _secs(x: Any) -> str:
    return f"{float(x):.1f} s" if x is not None else "—"


def _faults_section(data: Mapping[str, Any]) -> str:
    rows = []
    stories = []
    for f in data.get("faults", ()):
        t = f["truth"]
        d = f.get("detected")
        verdict = (
            f"{_e(d['layer'])} <code>{_e(d['component'])}</code><br>{_e(d['failure_type'])}, "
            f"{d.get('n_pairs', 0)} pairs"
            if d
            else '<span class="bad">not localized</span>'
        )
        res = (
            f"{f['resolve_s']:+.1f} s after repair"
            if f.get("resolve_s") is not None
            else ('<span class="bad">not resolved</span>' if d else "—")
        )
        status = '<span class="ok">✓</span>' if f.get("ok") else '<span class="bad">✗</span>'
        rows.append(
            f"<tr><td>{status}</td><td>{_e(t['kind'])}</td>"
            f"<td>{_e(t['layer'])} <code>{_e(_comp(t))}</code>"
            f"<br>paper type {_e(t.get('paper_type'))}</td>"
            f"<td>{verdict}</td><td>{_secs(f.get('detect_s'))}</td>"
            f"<td>{_secs(f.get('alert_s'))}</td><td>{res}</td>"
            f"<td>{len(f.get('others', ()))}</td></tr>"
        )
        items = "".join(
            f"<tr><td>{_at(s['t_s'])}</td><td>{_e(s['step'])}</td><td>{_e(s['text'])}</td></tr>"
            for s in f.get("steps") or fault_steps(f)
        )
        stories.append(
            f'<div class="card"><b>fault {_e(t["id"])}: {_e(t["kind"])}</b>'
            f"<table>{items}</table></div>"
        )
    return (
        "<h2>Injected faults and verdicts</h2>"
        "<table><tr><th></th><th>fault</th><th>truth</th><th>verdict</th>"
        "<th>detected after</th><th>alert after</th><th>resolved</th><th>other alerts</th></tr>"
        + "".join(rows)
        + "</table>"
        "<h2>What the system saw, step by step</h2>"
        '<p class="sub">times from the fault\'s injection: the detection event, what localization'
        " read and found, the verdict, and the repair</p>"
        '<div class="grid">' + "".join(stories) + "</div>"
    )


def _log_section(data: Mapping[str, Any]) -> str:
    t0 = int(data.get("started_ns", 0))
    items = "".join(
        f"<tr><td>{(ns - t0) / 1e9:7.1f} s</td><td>{_e(text)}</td></tr>"
        for ns, text in data.get("timeline", ())
    )
    return f"<h2>Run log</h2><table>{items}</table>" if items else ""


def render(data: Mapping[str, Any]) -> str:
    ok = bool(data.get("ok"))
    faults = data.get("faults", [])
    caught = sum(1 for f in faults if f.get("ok"))
    head = (
        f"<h1>{_e(data.get('title', 'skh demo'))}</h1>"
        f'<div class="sub">{_e(data.get("mode", ""))} run, '
        f"{(int(data.get('ended_ns', 0)) - int(data.get('started_ns', 0))) / 1e9:.0f} s, "
        f"{len(data.get('endpoints', ()))} endpoints, "
        f"{len(data.get('alerts', ()))} alerts on the bus</div>"
        f'<p class="{"ok" if ok else "bad"}">'
        f"{caught} of {len(faults)} faults detected, localized and resolved"
        f"{'' if ok else ' — see below'}</p>"
    )
    body = (
        head
        + _faults_section(data)
        + _timeline_section(data)
        + _skeleton_section(data)
        + _latency_section(data)
        + _log_section(data)
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(data.get('title', 'skh demo'))}</title>"
        f"<style>{_CSS}</style></head><body>{body}</body></html>"
    )


def write_report(out_dir: str | Path, data: Mapping[str, Any]) -> Path:
    """Write ``index.html`` and ``report.json`` into ``out_dir``; returns the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(data, default=str))
    path = out / "index.html"
    path.write_text(render(data))
    return path


def load_spool(spool: Path) -> np.ndarray:
    """Every probe record an analyzer spooled (``probes-*.npy``)."""
    from skh.records import empty_probes

    files = sorted(Path(spool).glob("probes-*.npy"))
    return np.concatenate([np.load(f) for f in files]) if files else empty_probes()


def endpoints_of(cluster: Any) -> list[dict[str, Any]]:
    return [
        {"ep_id": e.ep_id, "name": e.name, "job": e.job, "host": e.host, "rail": e.rail}
        for e in cluster.endpoints
    ]


def build_data(
    *,
    title: str,
    mode: str,
    cluster: Any,
    skeletons: Mapping[str, Any],
    probes: np.ndarray,
    faults: Iterable[Any],
    alerts: Sequence[Mapping[str, Any]],
    timeline: Sequence[tuple[int, str]],
    started_ns: int,
    ended_ns: int,
    skeleton_ok: bool,
) -> dict[str, Any]:
    fl = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in faults]
    for f in fl:
        f["steps"] = fault_steps(f)
    return {
        "title": title,
        "mode": mode,
        "started_ns": started_ns,
        "ended_ns": ended_ns,
        "ok": bool(fl) and all(f["ok"] for f in fl) and skeleton_ok,
        "endpoints": endpoints_of(cluster),
        "skeletons": {
            j: {k: v for k, v in s.items() if k != "alert"}
            | {
                "mode": s.get("alert", {}).get("mode", s.get("mode", "")),
                "confidence": s.get("alert", {}).get("confidence", s.get("confidence", 0.0)),
            }
            for j, s in skeletons.items()
        },
        "rtt": rtt_summary(probes),
        "faults": fl,
        "alerts": list(alerts),
        "timeline": [list(t) for t in timeline],
    }
