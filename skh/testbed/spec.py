"""What a testbed is made of: the spec (sizes and jobs) and the naming/addressing plan derived
from it.

Everything the testbed creates is named from a prefix (``skht`` by default) so that stale
objects of a crashed run can be found and removed by name alone:

===============================  ==========================  =====================================
object                           namespace / device          model name
===============================  ==========================  =====================================
host *g* (segment *p*, slot *h*)  ``<P>h<g>``                 ``host<g>``
RNIC *r* of host *g*             ``rnic<r>`` in ``<P>h<g>``   ``host<g>:rnic<r>`` (10.r.p.h+1/24)
ToR of segment *p*, rail *r*     ``<P>t<p>r<r>``, bridge br0  ``tor<p>r<r>`` (gateway 10.r.p.254)
  its port to host *g*           ``h<g>``
  its uplink to spine *s*        ``sp<s>`` (/31)
spine *s*                        ``<P>s<s>``, port ``t<p>r<r>`` ``spine<s>``
VTEP of host *g* on rail *r*     ``vx<r>`` in ``<P>h<g>``     ``host<g>:vx<r>`` (172.16+r.g.0/32)
container *k* of host *g*        ``<P>c<g>x<k>``              ``c<g>x<k>``
  its VF on rail *r*             ``vf<r>`` (172.16+r.g.k+1)   endpoint ``job/c<g>x<k>/<r>``
  the VF's representor           ``c<k>v<r>`` in ``<P>h<g>``  ``host<g>:c<k>v<r>``
management bridge                ``<P>mgmt`` (ns), br0        root side ``<P>mgmt`` 10.M.0.1/16
===============================  ==========================  =====================================

Management addresses: host *g* 10.M.1.(g+1), container (g, k) 10.M.(2+g).(k+1), where M is
250 for the default prefix and 200-249 (a hash of the prefix) otherwise (:attr:`Layout.mgmt_octet`),
or, when another device of the root namespace already holds that /16 (a testbed whose prefix
hashes alike: ``skhe``, ``skhf``, ``skhl`` and ``skhm`` all give 209), the next free one
(:meth:`Testbed.up` chooses, the state file keeps it).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field

from skh.errors import ConfigError
from skh.model import JobShape

__all__ = ["JobSpec", "TestbedSpec", "Layout", "DEFAULT_PREFIX", "MTU", "OVERLAY_MTU", "owns"]

DEFAULT_PREFIX = "skht"
MTU = 9000
#: VXLAN adds 50 bytes of outer headers
OVERLAY_MTU = MTU - 50
MGMT_OCTET = 250
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,5}$")


#: what follows the prefix in the name of a namespace, root link or nft table a testbed makes
_OWNED_SUFFIX = r"(?:h\d+|c\d+x\d+|t\d+r\d+|s\d+|mgmt|_f\d+)"


def owns(prefix: str, name: str) -> bool:
    """Whether ``name`` is one of the objects a testbed of ``prefix`` makes (see the table
    above). Matching the whole name, not its start: prefix ``skhd``'s clean-up must leave a
    testbed of ``skhd2`` (or ``skhdbi``) running beside it alone."""
    return re.fullmatch(re.escape(prefix) + _OWNED_SUFFIX, name) is not None


def preferred_mgmt_octet(prefix: str) -> int:
    """The management /16 a prefix asks for first. The root namespace routes it, so two
    testbeds up at once (tests of two worktrees, say) need different ones: the default prefix
    keeps 10.250/16, any other one of 10.200-249 from a hash of its name (which collides: 50
    slots; :meth:`Testbed.up` moves on to a free one)."""
    if prefix == DEFAULT_PREFIX:
        return MGMT_OCTET
    return 200 + zlib.crc32(prefix.encode()) % 50


def _check_int(owner: str, name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(
            f"The '{name}' parameter of {owner} must be an int in the range [{lo}, {hi}]."
            f" Got {value!r} instead."
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job: ``pp * dp`` containers; container *i* is PP stage ``i // dp``, DP rank
    ``i % dp``. A container holds one TP group whose GPUs sit on all of its rails."""

    name: str
    shape: JobShape = field(default_factory=lambda: JobShape(tp=1, pp=1, dp=2))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", self.name):
            raise ConfigError(
                "The 'name' parameter of JobSpec must be 1-32 characters of [A-Za-z0-9_.-]."
                f" Got {self.name!r} instead."
            )

    @property
    def containers(self) -> int:
        return self.shape.pp * self.shape.dp

    def to_dict(self) -> dict:
        s = self.shape
        return {"name": self.name, "tp": s.tp, "pp": s.pp, "dp": s.dp, "ep": s.ep}

    @classmethod
    def from_dict(cls, d: dict) -> JobSpec:
        return cls(d["name"], JobShape(tp=d["tp"], pp=d["pp"], dp=d["dp"], ep=d.get("ep", 1)))


@dataclass(frozen=True, slots=True)
class TestbedSpec:
    """Sizes of the emulated cluster and the jobs placed on it.

    Containers are placed job by job, in slot order (slot *k* of host 0, 1, ..., then slot
    *k*+1), so a job with ``dp <= hosts`` never puts two members of one DP group on one host.
    Without jobs, one job ``job0`` with ``pp=1`` spans every container slot.
    """

    __test__ = False  # not a pytest test class despite the name

    hosts: int = 4
    rnics_per_host: int = 2
    hosts_per_segment: int = 2
    spines: int = 2
    containers_per_host: int = 1
    jobs: tuple[JobSpec, ...] = ()

    def __post_init__(self) -> None:
        _check_int("TestbedSpec", "hosts", self.hosts, 1, 200)
        _check_int("TestbedSpec", "rnics_per_host", self.rnics_per_host, 1, 16)
        _check_int("TestbedSpec", "hosts_per_segment", self.hosts_per_segment, 1, 253)
        _check_int("TestbedSpec", "spines", self.spines, 1, 40)
        _check_int("TestbedSpec", "containers_per_host", self.containers_per_host, 0, 250)
        if not isinstance(self.jobs, tuple) or not all(isinstance(j, JobSpec) for j in self.jobs):
            raise ConfigError(
                "The 'jobs' parameter of TestbedSpec must be a tuple of JobSpec."
                f" Got {self.jobs!r} instead."
            )
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ConfigError(
                f"The 'jobs' parameter of TestbedSpec has duplicate job names: {names}."
            )
        need = sum(j.containers for j in self.jobs)
        if need > self.slots:
            raise ConfigError(
                f"The 'jobs' parameter of TestbedSpec needs {need} containers but "
                f"hosts * containers_per_host is {self.slots}."
            )

    @property
    def slots(self) -> int:
        return self.hosts * self.containers_per_host

    @property
    def segments(self) -> int:
        return -(-self.hosts // self.hosts_per_segment)

    def effective_jobs(self) -> tuple[JobSpec, ...]:
        if self.jobs or self.slots == 0:
            return self.jobs
        return (JobSpec("job0", JobShape(tp=self.rnics_per_host, pp=1, dp=self.slots)),)

    def to_dict(self) -> dict:
        return {
            "hosts": self.hosts,
            "rnics_per_host": self.rnics_per_host,
            "hosts_per_segment": self.hosts_per_segment,
            "spines": self.spines,
            "containers_per_host": self.containers_per_host,
            "jobs": [j.to_dict() for j in self.jobs],
        }

    @classmethod
    def from_dict(cls, d: dict) -> TestbedSpec:
        return cls(
            hosts=d["hosts"],
            rnics_per_host=d["rnics_per_host"],
            hosts_per_segment=d["hosts_per_segment"],
            spines=d["spines"],
            containers_per_host=d["containers_per_host"],
            jobs=tuple(JobSpec.from_dict(j) for j in d.get("jobs", ())),
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """One container: where it runs and which job rank it is."""

    name: str  # model container name c<g>x<k>
    host: int
    slot: int
    job: str
    index: int  # rank within the job: stage = index // dp, dp rank = index % dp


class Layout:
    """Names and addresses of everything a spec builds, under one prefix."""

    def __init__(self, spec: TestbedSpec, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
            raise ConfigError(
                "The 'prefix' parameter of Layout must be 2-6 lowercase letters/digits starting "
                f"with a letter. Got {prefix!r} instead."
            )
        self.spec = spec
        self.prefix = prefix
        #: second octet of this testbed's management /16: the preferred one until
        #: :meth:`Testbed.up` chose a free one
        self.mgmt_octet = preferred_mgmt_octet(prefix)
        self.placements: tuple[Placement, ...] = self._place()
        self.by_container: dict[str, Placement] = {c.name: c for c in self.placements}

    def _place(self) -> tuple[Placement, ...]:
        s = self.spec
        slots = [(g, k) for k in range(s.containers_per_host) for g in range(s.hosts)]
        out = []
        it = iter(slots)
        for job in s.effective_jobs():
            for i in range(job.containers):
                g, k = next(it)
                out.append(Placement(f"c{g}x{k}", g, k, job.name, i))
        return tuple(out)

    # -- topology -----------------------------------------------------------------------------
    def segment(self, g: int) -> int:
        return g // self.spec.hosts_per_segment

    def hosts_in_segment(self, p: int) -> list[int]:
        hps = self.spec.hosts_per_segment
        return [g for g in range(p * hps, min((p + 1) * hps, self.spec.hosts))]

    def tors(self) -> list[tuple[int, int]]:
        return [(p, r) for p in range(self.spec.segments) for r in range(self.spec.rnics_per_host)]

    # -- namespaces ---------------------------------------------------------------------------
    def host_ns(self, g: int) -> str:
        return f"{self.prefix}h{g}"

    def tor_ns(self, p: int, r: int) -> str:
        return f"{self.prefix}t{p}r{r}"

    def spine_ns(self, s: int) -> str:
        return f"{self.prefix}s{s}"

    def container_ns(self, g: int, k: int) -> str:
        return f"{self.prefix}c{g}x{k}"

    @property
    def mgmt_ns(self) -> str:
        return f"{self.prefix}mgmt"

    @property
    def mgmt_root_dev(self) -> str:
        return f"{self.prefix}mgmt"

    def all_namespaces(self) -> list[str]:
        s = self.spec
        out = [self.mgmt_ns]
        out += [self.spine_ns(i) for i in range(s.spines)]
        out += [self.tor_ns(p, r) for p, r in self.tors()]
        out += [self.host_ns(g) for g in range(s.hosts)]
        out += [self.container_ns(c.host, c.slot) for c in self.placements]
        return out

    # -- model names --------------------------------------------------------------------------
    @staticmethod
    def host_name(g: int) -> str:
        return f"host{g}"

    @staticmethod
    def tor_name(p: int, r: int) -> str:
        return f"tor{p}r{r}"

    @staticmethod
    def spine_name(s: int) -> str:
        return f"spine{s}"

    @staticmethod
    def rnic_key(g: int, r: int) -> str:
        return f"host{g}:rnic{r}"

    @staticmethod
    def vtep_name(g: int, r: int) -> str:
        return f"host{g}:vx{r}"

    # -- addresses ----------------------------------------------------------------------------
    def rnic_ip(self, g: int, r: int) -> str:
        return f"10.{r}.{self.segment(g)}.{g % self.spec.hosts_per_segment + 1}"

    @staticmethod
    def tor_gw(p: int, r: int) -> str:
        return f"10.{r}.{p}.254"

    def uplink_ip(self, s: int, p: int, r: int, tor_side: bool) -> str:
        link = p * self.spec.rnics_per_host + r
        return f"10.{200 + s}.{link // 128}.{2 * (link % 128) + int(tor_side)}"

    @staticmethod
    def rnic_mac(g: int, r: int) -> str:
        return f"02:aa:{r:02x}:{g >> 8:02x}:{g & 255:02x}:01"

    @staticmethod
    def tor_mac(p: int, r: int) -> str:
        return f"02:bb:{r:02x}:{p >> 8:02x}:{p & 255:02x}:fe"

    def uplink_mac(self, s: int, p: int, r: int, tor_side: bool) -> str:
        link = p * self.spec.rnics_per_host + r
        return f"02:dd:{s:02x}:{link >> 8:02x}:{link & 255:02x}:{int(tor_side):02x}"

    @staticmethod
    def vtep_ip(g: int, r: int) -> str:
        return f"172.{16 + r}.{g}.0"

    @staticmethod
    def vtep_mac(g: int, r: int) -> str:
        return f"02:00:00:{r:02x}:{g >> 8:02x}:{g & 255:02x}"

    @staticmethod
    def vf_ip(g: int, k: int, r: int) -> str:
        return f"172.{16 + r}.{g}.{k + 1}"

    @staticmethod
    def vf_mac(g: int, k: int, r: int) -> str:
        return f"02:cc:{r:02x}:{g >> 8:02x}:{g & 255:02x}:{k:02x}"

    #: the host side of every VF answers as this MAC (a routed vSwitch, Calico style)
    GW_MAC = "ee:ee:ee:ee:ee:ee"
    GW_IP = "169.254.1.1"

    def mgmt_root_ip(self) -> str:
        return f"10.{self.mgmt_octet}.0.1"

    def mgmt_host_ip(self, g: int) -> str:
        return f"10.{self.mgmt_octet}.1.{g + 1}"

    def mgmt_container_ip(self, g: int, k: int) -> str:
        return f"10.{self.mgmt_octet}.{2 + g}.{k + 1}"

    def mgmt_net(self) -> str:
        return f"10.{self.mgmt_octet}.0.0/16"
