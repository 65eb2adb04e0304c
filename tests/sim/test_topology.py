import collections
import csv

import numpy as np
import pytest

from skh.errors import TopologyError
from skh.model import Fabric
from skh.sim import LINGJUN_TOPO
from skh.sim.topology import FabricIndex


def test_lingjun_loader_counts():
    f = Fabric.from_lingjun(LINGJUN_TOPO)
    tiers = collections.Counter(s.tier for s in f.switches.values())
    assert len(f.hosts) == 847
    assert tiers == {"tor": 48 * 8, "spine": 3, "core": 1}
    assert len({h.segment for h in f.hosts.values()}) == 48
    assert f.rails == 8
    # every host's RNIC r sits on rail ToR r of its own segment, and hosts per ASW are preserved
    with open(LINGJUN_TOPO, newline="") as fh:
        per_asw = collections.Counter(r["ASW"] for r in csv.DictReader(fh))
    per_seg = collections.Counter(h.segment for h in f.hosts.values())
    assert sorted(per_seg.values()) == sorted(per_asw.values())
    for h in f.hosts.values():
        tors = [f.switches[r.tor] for r in h.rnics]
        assert [t.rail for t in tors] == list(range(8))
        assert {t.segment for t in tors} == {h.segment}
    assert all(
        set(s.uplinks) <= {"P8", "P10", "P12"} for s in f.switches.values() if s.tier == "tor"
    )


def test_lingjun_scaled_by_replicated_pods():
    f = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=4096, rnics_per_host=4)
    tiers = collections.Counter(s.tier for s in f.switches.values())
    assert len(f.hosts) == 4096
    assert tiers["spine"] == 15 and tiers["core"] == 1
    assert f.rails == 4
    cores = {u for s in f.switches.values() if s.tier == "spine" for u in s.uplinks}
    assert cores == {"G6"}


@pytest.mark.parametrize("bad", [{"scale_to_hosts": 0}, {"rnics_per_host": 0}])
def test_lingjun_rejects_bad_arguments(bad):
    with pytest.raises(TopologyError):
        Fabric.from_lingjun(LINGJUN_TOPO, **bad)


def test_lingjun_missing_file(tmp_path):
    with pytest.raises(TopologyError):
        Fabric.from_lingjun(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    "fabric",
    [
        Fabric.from_params(hosts=24, hosts_per_segment=4, spines=3, cores=2),
        Fabric.from_lingjun(LINGJUN_TOPO),
    ],
    ids=["params", "lingjun"],
)
def test_route_is_one_of_the_ecmp_paths_and_covers_them(fabric):
    ix = FabricIndex(fabric)
    rng = np.random.default_rng(0)
    hosts = list(fabric.hosts.values())
    for _ in range(40):
        a, b = rng.choice(len(hosts), 2, replace=False)
        rail = int(rng.integers(fabric.rails))
        ra, rb = hosts[a].rnic(rail), hosts[b].rnic(rail)
        ecmp = set(fabric.ecmp_paths(ra, rb))
        ia, ib = ix.rnic_id(ra.host, rail), ix.rnic_id(rb.host, rail)
        got = set(ix.paths_names(ia, ib, np.arange(64)))
        assert got <= ecmp
        if len(ecmp) <= 4:
            assert got == ecmp  # 64 path ids hit every path of a small ECMP set
        # the reply retraces the request
        assert ix.path_names(ib, ia, 5) == tuple(reversed(ix.path_names(ia, ib, 5)))


def test_route_hops_and_links():
    fabric = Fabric.from_params(hosts=16, hosts_per_segment=4, spines=2)
    ix = FabricIndex(fabric)
    r = ix.route(np.array([0, 0]), np.array([8, 4 * 8]), np.array([0, 0]))  # same ToR, other ToR
    assert r.hops.tolist() == [2, 4]
    sp = fabric.switch_paths("tor0r0", "tor1r0")
    assert len(sp) == 2
    path = ix.path_names(0, 32, 0)
    assert ix.uses_link(r, path[1], path[2]).tolist() == [False, True]
    assert ix.uses_switch(r, "tor0r0").tolist() == [True, True]
