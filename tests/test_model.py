import numpy as np
import pytest

from skh.errors import TopologyError
from skh.model import (
    Cluster,
    Container,
    Fabric,
    Job,
    JobShape,
    same_rail_pair_count,
    same_rail_pairs,
)


def test_rail_optimized_clos_paths():
    f = Fabric.from_params(hosts=64, rnics_per_host=8, hosts_per_segment=16, spines=4)
    assert len(f.hosts) == 64 and f.rails == 8
    assert sum(s.tier == "tor" for s in f.switches.values()) == 4 * 8
    a, b, c = f.rnic("host0", 3), f.rnic("host1", 3), f.rnic("host40", 3)
    # same ToR: one path, no spine
    assert f.ecmp_paths(a, b) == [("host0:rnic3", "tor0r3", "host1:rnic3")]
    # across segments: one equal-cost path per spine
    paths = f.ecmp_paths(a, c)
    assert len(paths) == 4
    assert {p[2] for p in paths} == {f"spine{i}" for i in range(4)}
    for p in paths:
        assert all(link in f.links for link in Fabric.path_links(p))


def test_three_tier_paths_go_through_core():
    data = {
        "switch": [
            {"name": "core0", "tier": "core"},
            {"name": "s0", "tier": "spine", "uplinks": ["core0"]},
            {"name": "s1", "tier": "spine", "uplinks": ["core0"]},
            {"name": "t0", "tier": "tor", "rail": 0, "segment": 0, "uplinks": ["s0"]},
            {"name": "t1", "tier": "tor", "rail": 0, "segment": 1, "uplinks": ["s1"]},
        ],
        "host": [
            {"name": "a", "segment": 0, "rnics": [{"rail": 0, "tor": "t0"}]},
            {"name": "b", "segment": 1, "rnics": [{"rail": 0, "tor": "t1"}]},
        ],
    }
    f = Fabric.from_mapping(data)
    assert f.ecmp_paths(f.rnic("a", 0), f.rnic("b", 0)) == [
        ("a:rnic0", "t0", "s0", "core0", "s1", "t1", "b:rnic0")
    ]


def test_toml_round_trip(tmp_path):
    f = Fabric.from_params(hosts=5, rnics_per_host=2, hosts_per_segment=2, spines=2)
    lines = []
    for s in f.to_mapping()["switch"]:
        lines += [
            "[[switch]]",
            f'name = "{s["name"]}"',
            f'tier = "{s["tier"]}"',
            f"uplinks = {s['uplinks']!r}".replace("'", '"'),
            f"rail = {s['rail']}",
            f"segment = {s['segment']}",
        ]
    for h in f.to_mapping()["host"]:
        rn = ", ".join(f'{{rail = {r["rail"]}, tor = "{r["tor"]}"}}' for r in h["rnics"])
        lines += [
            "[[host]]",
            f'name = "{h["name"]}"',
            f"segment = {h['segment']}",
            f"rnics = [{rn}]",
        ]
    p = tmp_path / "fabric.toml"
    p.write_text("\n".join(lines) + "\n")
    g = Fabric.from_toml(p)
    assert g.links == f.links and set(g.hosts) == set(f.hosts)


@pytest.mark.parametrize(
    "data, msg",
    [
        ({"switch": [{"name": "t", "tier": "leaf"}]}, "unknown tier"),
        ({"switch": [{"name": "t", "tier": "tor", "uplinks": ["x"]}]}, "not a switch"),
        ({"host": [{"name": "a", "rnics": [{"rail": 0, "tor": "nope"}]}]}, "not a ToR"),
        ({"host": [{"name": "a", "rnics": [{"tor": "t"}]}]}, "malformed"),
    ],
)
def test_bad_fabric_is_a_clear_error(data, msg):
    with pytest.raises(TopologyError, match=msg):
        Fabric.from_mapping(data)


def test_bad_toml_file(tmp_path):
    p = tmp_path / "f.toml"
    p.write_text("[[host]\n")
    with pytest.raises(TopologyError, match="cannot read"):
        Fabric.from_toml(p)


def test_same_rail_pairs_never_same_host():
    f = Fabric.from_params(hosts=4, rnics_per_host=2, hosts_per_segment=4, spines=1)
    cl = Cluster(f)
    job = Job(
        "j",
        JobShape(tp=2, dp=4),
        tuple(Container(f"c{h}", "j", f"host{h}", (0, 1)) for h in range(4)),
    )
    eps = cl.add_job(job)
    cols = cl.endpoint_arrays(eps)
    pairs = same_rail_pairs(cols["ep_id"], cols["rail"], cols["host"])
    # 2 rails × 4 hosts × 3 peers
    assert pairs.shape == (24, 2)
    by_id = {e.ep_id: e for e in eps}
    for s, d in pairs:
        assert by_id[s].rail == by_id[d].rail and by_id[s].host != by_id[d].host
    assert np.all(np.diff(pairs[:, 0].astype(int)) >= 0)
    with pytest.raises(TopologyError):
        cl.add_job(job)


def test_an_endpoints_id_is_kept_while_it_lives_and_given_again_only_when_asked():
    f = Fabric.from_params(hosts=2, rnics_per_host=2, hosts_per_segment=2, spines=1)
    cl = Cluster(f)
    a = cl.add_endpoint(job="j", container="c", host="host0", rail=0)
    b = cl.add_endpoint(job="j", container="c", host="host0", rail=1)
    cl.release(a.ep_id)
    # its name is free again, under a new id; the old one stays gone
    again = cl.add_endpoint(job="j", container="c", host="host1", rail=0)
    assert (a.ep_id, b.ep_id, again.ep_id) == (0, 1, 2)
    assert cl.endpoint("j/c/0") is again and cl.gone == {0}
    assert [e.ep_id for e in cl.live_endpoints] == [1, 2]
    assert [e.ep_id for e in cl.job_endpoints("j")] == [1, 2]
    # another model's numbering: the ids it skipped are gone here too
    far = cl.add_endpoint(ep_id=5, job="k", container="c", host="host1", rail=1)
    assert far.ep_id == 5 and len(cl.endpoints) == 6 and cl.gone == {0, 3, 4}
    with pytest.raises(TopologyError, match="taken by j/c/1"):
        cl.add_endpoint(ep_id=1, job="k", container="d", host="host1", rail=1)
    # a gone id given again by its owner (who knows nothing names it any more)
    gen = cl.generation
    reused = cl.add_endpoint(ep_id=0, job="k", container="d", host="host1", rail=1)
    assert cl.endpoints[0] is reused and cl.gone == {3, 4} and cl.generation > gen


def test_job_shape_validation():
    assert JobShape(tp=8, pp=8, dp=8).gpus == 512
    with pytest.raises(TopologyError, match="'dp' parameter"):
        JobShape(dp=0)


def test_same_rail_pairs_are_counted_without_listing_them():
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 17, 300):
        rail = rng.integers(0, 4, n)
        host = rng.integers(0, 9, n)
        ok = rng.random(n) < 0.6
        ep = np.arange(n, dtype=np.uint32)
        pairs = same_rail_pairs(ep, rail, host)
        assert same_rail_pair_count(rail, host) == len(pairs)
        assert same_rail_pair_count(rail, host, ok) == int(np.isin(pairs[:, 1], ep[ok]).sum())
    # a job of 2,000 hosts x 8 RNICs: 32 M pairs, counted from 16,000 endpoints
    host = np.repeat(np.arange(2000), 8)
    rail = np.tile(np.arange(8), 2000)
    assert same_rail_pair_count(rail, host) == 8 * 2000 * 1999


def test_tor_pods_are_the_tors_joined_through_shared_spines():
    from skh.sim import LINGJUN_TOPO

    # every ToR up to every spine: one pod
    f = Fabric.from_params(hosts=64, rnics_per_host=8, hosts_per_segment=16, spines=4)
    assert set(f.tor_pods().values()) == {0} and len(f.tor_pods()) == 32
    # Lingjun replicated past its 847 hosts: each replica's ToRs share its PSWs only, and a
    # pair between replicas crosses the DSW (a core), two links more each way
    big = Fabric.from_lingjun(LINGJUN_TOPO, scale_to_hosts=2048)
    pods = big.tor_pods()
    assert len(set(pods.values())) > 1
    hosts = list(big.hosts)
    p0 = [h for h in hosts if h.startswith("p0-")]
    p1 = [h for h in hosts if h.startswith("p1-")]
    for a, b, same in ((p0[0], p0[-1], True), (p0[0], p1[-1], False)):
        ta, tb = big.hosts[a].rnic(0).tor, big.hosts[b].rnic(0).tor
        assert ta != tb and (pods[ta] == pods[tb]) == same
        assert {len(p) for p in big.switch_paths(ta, tb)} == {3 if same else 5}
