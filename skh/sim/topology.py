"""A numeric view of a :class:`~skh.model.Fabric` for vectorised routing.

Every host, RNIC and switch gets a dense integer id; :meth:`FabricIndex.route` picks, for whole
arrays of (source RNIC, destination RNIC, path id), the ECMP path a flow-pinned probe takes, as
switch-id columns. The choice is a hash of the three values, so a path id always names the same
path, like a flow label or UDP source port pins one on a real fabric. The reply retraces the
request path (symmetric ECMP hashing), so one path serves both directions.

RNIC ids are ``host_index * rails + rail``; host indices follow ``fabric.hosts`` order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skh.errors import TopologyError
from skh.model import Fabric

__all__ = ["FabricIndex", "EndpointTable", "Route", "mix_hash", "rng_for"]

#: route columns, in path order (unused columns are -1)
ROUTE_COLUMNS = ("src_tor", "up_spine", "core", "down_spine", "dst_tor")
#: path_names() memo bound (entries of a few names each): cleared whole when full
_PATH_CACHE_MAX = 1 << 16


def mix_hash(*cols: np.ndarray) -> np.ndarray:
    """A deterministic 64-bit mix (splitmix64 finaliser) of integer columns, elementwise."""
    # the state after a column depends only on the columns so far: mix each on the broadcast
    # shape of those (a per-host key is mixed once per host, not once per host and sample)
    h = np.full((), 0x9E3779B97F4A7C15, np.uint64)
    with np.errstate(over="ignore"):
        for c in cols:
            h = h ^ np.asarray(c).astype(np.uint64)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
            h *= np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(29)
    return np.array(h, np.uint64, ndmin=0) if h.ndim == 0 else h


def rng_for(*key: float) -> np.random.Generator:
    """A generator keyed by integers (seed, stream tag, time...), negative values included, so a
    value drawn for a key never depends on what was drawn before it."""
    return np.random.default_rng([int(k) % 2**64 for k in key])


@dataclass(frozen=True, slots=True)
class Route:
    """Switch ids along a batch of paths, one row per path: see ``ROUTE_COLUMNS``."""

    nodes: np.ndarray  # (n, 5) int32, -1 where the path does not use that tier

    @property
    def hops(self) -> np.ndarray:
        """Physical links per one-way path: 2 under one ToR, 4 via a spine, 6 via a core."""
        return (2 + 2 * (self.nodes[:, 1] >= 0) + 2 * (self.nodes[:, 2] >= 0)).astype(np.int32)


class FabricIndex:
    """Dense ids and adjacency matrices of a fabric (built once; read-only afterwards but for
    the memo of :meth:`path_names`)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.host_names: list[str] = list(fabric.hosts)
        self.host_id = {h: i for i, h in enumerate(self.host_names)}
        self.rails = fabric.rails
        self.switch_names: list[str] = list(fabric.switches)
        self.switch_id = {s: i for i, s in enumerate(self.switch_names)}
        self._path_cache: dict[tuple[int, int, int], tuple[str, ...]] = {}
        tier = np.array([fabric.switches[s].tier for s in self.switch_names])
        self.tors = np.flatnonzero(tier == "tor").astype(np.int32)
        self.spines = np.flatnonzero(tier == "spine").astype(np.int32)
        self.cores = np.flatnonzero(tier == "core").astype(np.int32)
        n_sw = len(self.switch_names)
        # position of a switch inside its tier's column block of the adjacency matrices
        self._spine_pos = np.full(n_sw, -1, np.int32)
        self._spine_pos[self.spines] = np.arange(self.spines.size, dtype=np.int32)
        self._core_pos = np.full(n_sw, -1, np.int32)
        self._core_pos[self.cores] = np.arange(self.cores.size, dtype=np.int32)

        # tor → spine and spine → core adjacency, as boolean matrices over tier positions
        self.tor_spine = np.zeros((n_sw, self.spines.size), bool)
        self.spine_core = np.zeros((n_sw, self.cores.size), bool)
        for name, sw in fabric.switches.items():
            i = self.switch_id[name]
            for up in sw.uplinks:
                u = self.switch_id[up]
                if sw.tier == "tor" and self._spine_pos[u] >= 0:
                    self.tor_spine[i, self._spine_pos[u]] = True
                elif sw.tier == "spine" and self._core_pos[u] >= 0:
                    self.spine_core[i, self._core_pos[u]] = True
                else:
                    raise TopologyError(
                        f"switch {name}: uplink {up} is not one tier up; the simulator "
                        "routes tor→spine→core only"
                    )

        n_rnic = len(self.host_names) * self.rails
        self.rnic_tor = np.full(n_rnic, -1, np.int32)
        self.host_segment = np.zeros(len(self.host_names), np.int32)
        for h, host in enumerate(fabric.hosts.values()):
            self.host_segment[h] = host.segment
            for r in host.rnics:
                self.rnic_tor[h * self.rails + r.rail] = self.switch_id[r.tor]
        #: switch id -> its pod (ToRs only; -1 else)
        self.tor_pod = np.full(n_sw, -1, np.int64)
        for tor, pod in fabric.tor_pods().items():
            self.tor_pod[self.switch_id[tor]] = pod

    # -- ids ---------------------------------------------------------------------------------------
    @property
    def n_rnics(self) -> int:
        return self.rnic_tor.size

    def rnic_id(self, host: str, rail: int) -> int:
        return self.host_id[host] * self.rails + rail

    def rnic_key(self, rnic: int) -> str:
        """The model's name of an RNIC (``host:rnicN``), as used in ``Fabric.links``."""
        return f"{self.host_names[rnic // self.rails]}:rnic{rnic % self.rails}"

    # -- routing -----------------------------------------------------------------------------------
    @staticmethod
    def _pick(mask_u: np.ndarray, inv: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: column of the ``h mod count``-th True of its row ``inv`` of ``mask_u``, and
        that count (0: no column; the column is then meaningless). Masks are built per unique
        switch pair, so the work is per pair, not per flow."""
        cnt = mask_u.sum(axis=1)
        order = np.argsort(~mask_u, axis=1, kind="stable")  # True columns first, in order
        c = cnt[inv]
        k = (h % np.maximum(c, 1).astype(np.uint64)).astype(np.int64)
        return order[inv, k], c

    def route(self, src_rnic: np.ndarray, dst_rnic: np.ndarray, path_id: np.ndarray) -> Route:
        """The ECMP path each (src, dst, path_id) flow takes, vectorised."""
        src_rnic = np.asarray(src_rnic, np.int64)
        dst_rnic = np.asarray(dst_rnic, np.int64)
        src_rnic, dst_rnic, path_id = np.broadcast_arrays(
            src_rnic, dst_rnic, np.asarray(path_id, np.int64)
        )
        n = src_rnic.size
        nodes = np.full((n, 5), -1, np.int32)
        a = self.rnic_tor[src_rnic.ravel()]
        b = self.rnic_tor[dst_rnic.ravel()]
        if n and ((a < 0).any() or (b < 0).any()):
            raise TopologyError("route: an RNIC id is not cabled to a ToR")
        nodes[:, 0] = a
        nodes[:, 4] = b
        if n == 0:
            return Route(nodes)
        n_sw = np.int64(len(self.switch_names))
        # the unordered pair hashes alike both ways, so a reply retraces its request's path
        lo = np.minimum(src_rnic.ravel(), dst_rnic.ravel())
        hi = np.maximum(src_rnic.ravel(), dst_rnic.ravel())
        h = mix_hash(lo, hi, path_id.ravel())
        cross = a != b
        uk, inv = np.unique(a.astype(np.int64) * n_sw + b, return_inverse=True)
        common = self.tor_spine[uk // n_sw] & self.tor_spine[uk % n_sw]
        col, n_common = self._pick(common, inv.ravel(), h)
        via_spine = cross & (n_common > 0)
        if via_spine.any():
            sp = self.spines[col[via_spine]]
            nodes[via_spine, 1] = sp
            nodes[via_spine, 3] = sp
        via_core = cross & (n_common == 0)
        if via_core.any():
            ia = np.flatnonzero(via_core)
            hv = h[ia]
            ua, inv_a = np.unique(a[ia], return_inverse=True)
            up_col, _ = self._pick(self.tor_spine[ua], inv_a.ravel(), hv)
            up = self.spines[up_col]
            # down spines of the far ToR reachable from the chosen up spine through some core
            uk2, inv2 = np.unique(b[ia].astype(np.int64) * n_sw + up, return_inverse=True)
            reach = (
                self.spine_core[uk2 % n_sw].astype(np.int8)
                @ self.spine_core[self.spines].T.astype(np.int8)
            ) > 0
            downs = self.tor_spine[uk2 // n_sw] & reach
            dn_col, n_down = self._pick(downs, inv2.ravel(), mix_hash(hv, np.uint64(1)))
            if (n_down == 0).any():
                raise TopologyError("route: two ToRs share no spine and no core")
            dn = self.spines[dn_col]
            uk3, inv3 = np.unique(up.astype(np.int64) * n_sw + dn, return_inverse=True)
            cores = self.spine_core[uk3 // n_sw] & self.spine_core[uk3 % n_sw]
            c_col, _ = self._pick(cores, inv3.ravel(), mix_hash(hv, np.uint64(2)))
            c = self.cores[c_col]
            nodes[ia, 1] = up
            nodes[ia, 2] = c
            nodes[ia, 3] = dn
        return Route(nodes)

    def path_names(self, src_rnic: int, dst_rnic: int, path_id: int) -> tuple[str, ...]:
        """One path as model node names (RNIC key, switches, RNIC key), as
        ``Fabric.ecmp_paths`` lists them. Memoised: agents' traceroutes ask for the same few paths
        over and over, and one route() call costs far more than its single row."""
        key = (int(src_rnic), int(dst_rnic), int(path_id))
        got = self._path_cache.get(key)
        if got is None:
            if len(self._path_cache) >= _PATH_CACHE_MAX:
                self._path_cache.clear()
            got = self._path_cache[key] = self.paths_names(*(np.array([k]) for k in key))[0]
        return got

    def paths_names(
        self, src_rnic: np.ndarray, dst_rnic: np.ndarray, path_id: np.ndarray
    ) -> list[tuple[str, ...]]:
        """:meth:`path_names` of many flows, routed in one vectorised call."""
        src_rnic, dst_rnic, _ = np.broadcast_arrays(src_rnic, dst_rnic, path_id)
        nodes = self.route(src_rnic, dst_rnic, path_id).nodes.tolist()
        out = []
        for s, d, (tor_a, up, core, down, tor_b) in zip(
            src_rnic.ravel().tolist(), dst_rnic.ravel().tolist(), nodes, strict=True
        ):
            sw = [tor_a]
            if core >= 0:
                sw += [up, core, down]
            elif up >= 0:
                sw.append(up)
            if tor_b != tor_a:
                sw.append(tor_b)
            out.append((self.rnic_key(s), *(self.switch_names[x] for x in sw), self.rnic_key(d)))
        return out

    def uses_link(self, route: Route, a: str, b: str) -> np.ndarray:
        """Rows of ``route`` whose switch-to-switch part crosses link ``a``–``b`` (either way)."""
        ia, ib = self.switch_id.get(a, -2), self.switch_id.get(b, -2)
        if ia < 0 or ib < 0:
            raise TopologyError(f"uses_link: {a}–{b} is not a switch-to-switch link")
        nd = route.nodes
        # consecutive used tiers: tor→up, up→core, core→down, down→tor; a missing core joins up/down
        # through one spine, which is no link, so only the four tier-adjacent pairs are checked
        hit = np.zeros(nd.shape[0], bool)
        for x, y in ((0, 1), (1, 2), (2, 3), (3, 4)):
            u, v = nd[:, x], nd[:, y]
            hit |= ((u == ia) & (v == ib)) | ((u == ib) & (v == ia))
        return hit

    def uses_switch(self, route: Route, name: str) -> np.ndarray:
        i = self.switch_id.get(name)
        if i is None:
            raise TopologyError(f"uses_switch: unknown switch {name!r}")
        return (route.nodes == i).any(axis=1)


class EndpointTable:
    """Per-endpoint columns (indexed by ``ep_id``) of a cluster: RNIC, host, container and job
    ids. ``sync()`` appends what was registered since the last call, so it follows a growing
    cluster cheaply."""

    def __init__(self, index: FabricIndex, cluster) -> None:  # cluster: skh.model.Cluster
        self.index = index
        self.cluster = cluster
        self.rnic = np.zeros(0, np.int32)
        self.host = np.zeros(0, np.int32)
        self.rail = np.zeros(0, np.int32)
        self.container = np.zeros(0, np.int32)
        self.container_names: list[str] = []
        self._container_id: dict[str, int] = {}
        self.sync()

    def __len__(self) -> int:
        return int(self.rnic.size)

    def sync(self) -> None:
        eps = self.cluster.endpoints[self.rnic.size :]
        if not eps:
            return
        hid = self.index.host_id
        host = np.fromiter((hid[e.host] for e in eps), np.int32, len(eps))
        rail = np.fromiter((e.rail for e in eps), np.int32, len(eps))
        cont = np.empty(len(eps), np.int32)
        for i, e in enumerate(eps):
            c = self._container_id.get(e.container)
            if c is None:
                c = self._container_id[e.container] = len(self.container_names)
                self.container_names.append(e.container)
            cont[i] = c
        self.host = np.concatenate([self.host, host])
        self.rail = np.concatenate([self.rail, rail])
        self.rnic = np.concatenate([self.rnic, host * self.index.rails + rail])
        self.container = np.concatenate([self.container, cont])

    def container_id(self, name: str) -> int:
        try:
            return self._container_id[name]
        except KeyError:
            raise TopologyError(f"unknown container {name!r}") from None
