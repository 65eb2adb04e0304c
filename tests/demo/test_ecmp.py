"""A spine-side link that silently drops on a fabric with two spines and ECMP: the routers keep
the link (its ports stay up, nothing reroutes), so only the flows hashed onto it fail. The real
agents rotate each pair's probes over its path ids (docs/probing.md), checked here through their
``pinglist`` command, and the analyzer must detect the drop and name the link.

On this small fabric (two spines, 16 cross-segment flows per rail) a link that drops everything
is also found with one path id per pair: some pair's one fixed 5-tuple always hashes onto it. So a
second spine-side link then drops only the flows a fixed path id never takes — the rotated ids'
(ephemeral source ports), not path id 0's (the engine's bound port) — standing in for an ECMP path
no fixed 5-tuple of the job hashes onto: rotation finds it, one path id per pair cannot
(``controller.probe_max_paths = 1``: not detected, tried). What rotation buys on a large fabric —
every (pair, ECMP path) probed within 10 s — is measured by ``bench/probe_plan.py``.

Both links are named because the localizer's traces follow the failing flows: pinned to the
VXLAN outer 5-tuple (and headers) the flows' frames leave with, both legs of the round trip
(docs/probing.md, "Traces that follow the probes").
"""

from __future__ import annotations

import os

import pytest

from skh.demo.live import DemoSpec, LiveDemo, matches

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.system,
    pytest.mark.slow,
    pytest.mark.timeout(420),
]

PREFIX = os.environ.get("SKH_TESTBED_PREFIX", "skhe")


def test_a_silent_spine_link_drop_is_found_through_path_rotation(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    spec = DemoSpec(
        rnics_per_host=2,
        spines=2,
        prefix=PREFIX,
        port_base=23000 + (os.getpid() % 400) * 20,
        faults=(),
        # the flows that fail cross the dropping link only on their own ECMP path: traces take
        # it, pinned to the flows' outer 5-tuples (the default; a trace of another 5-tuple
        # crosses either spine by chance), learned by the host agents ahead of the rounds
        hold_s=1.0,
        settle_s=1.0,
    )
    log: list[str] = []
    demo = LiveDemo(spec, tmp_path, say=log.append)
    try:
        demo.start()
        L = demo.tb.layout
        link = ("spine1", L.tor_name(0, 0))
        # what a real overlay agent probes, and how: each destination's [interval_s, paths]
        agents = [n.removeprefix("ov-") for n in demo.procs if n.startswith("ov-")]
        assert demo.client is not None
        lists = demo.client.commands([(f"ov-{a}", "pinglist", {}) for a in agents], timeout_s=10.0)
        # first (no earlier fault's alerts linger): only the rotated path ids' flows drop, the
        # flows between two engines' bound ports (path id 0) pass
        bound = sorted({p for r in lists if r.get("ok") for p in r["result"]["port"].values()})
        unseen = demo.fault(
            "loss",
            link=("spine0", L.tor_name(1, 0)),
            percent=100.0,
            direction="both",
            spare_ports=bound,
        )
        out = demo.fault("loss", link=link, percent=100.0, direction="both")
    finally:
        demo.stop()
    print("\n".join(log))  # shown on failure: what was raised and when
    plans = [r["result"]["plan"] for r in lists if r.get("ok")]
    assert plans, lists
    paths = {n for p in plans for per_dst in p.values() for _iv, n in per_dst.values()}
    # no fabric given to the controller: 4 ECMP paths assumed, 19 path ids per pair
    assert paths == {19}, paths
    assert out.detected is not None, (out.truth, out.others)
    assert out.detected["layer"] == "underlay", out.detected
    assert matches(out.truth, out.detected), (out.truth["component"], out.detected["component"])
    # The probes must see the drop that spares path id 0 (with one path id per pair,
    # controller.probe_max_paths = 1, no alert at all is raised), and the traces of the failing
    # flows cross the link as their frames do: the localizer names it
    raised = [a for a in [unseen.detected, *unseen.others] if a and a.get("kind") == "fault"]
    print("raised:", [(a["layer"], a["component"], a["failure_type"]) for a in raised])
    assert raised, (unseen.truth, demo.alerts(), log)
    assert unseen.detected is not None, (unseen.truth, raised)
    assert matches(unseen.truth, unseen.detected), unseen.detected["component"]
