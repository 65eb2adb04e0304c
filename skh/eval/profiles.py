"""The evaluation's profiles: how big the simulated cluster is, how long it runs, how many faults.

``full`` is the paper's setting (the real Lingjun topology replicated to 4,096 hosts × 8 RNICs,
2,000 jobs, five seeds of the field regime and one of the held-out ``field-heavy``) over half an
hour of virtual time per seed: an hour was ~1.5 h of CPU per seed on a 2-core machine (a seed's
field run was halfway after 45 CPU-min), more than a working session gives one stage; half an
hour took 20-38 CPU-min per seed (session 14: the whole profile 158 CPU-min, 105 min on two
cores) and scored 132 faults over 10,230 healthy host-hours on the five seeds
(``bench/results.py`` keeps finished stages to resume across sessions);
``quick`` scales the cluster down so CI finishes in about sixteen minutes of CPU, which its stages
(two seeds, the ramps, localization, probing) spread over two cores (the output says so);
``tiny`` exists for the determinism test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from skh.errors import ConfigError
from skh.failures import FailureType

__all__ = ["Profile", "PROFILES", "profile"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    #: hosts of the Lingjun topology after scaling (8 RNICs each)
    hosts: int
    jobs: int
    #: job arrivals per minute of virtual time (container churn)
    arrivals_per_min: float
    #: virtual seconds of the field run per seed, and the healthy lead-in before faults arrive
    duration_s: float
    warmup_s: float
    #: median fault length; faults (and gray faults) arrive as Poisson processes at these rates
    fault_s: float
    faults_per_h: float
    gray_per_h: float
    #: share of faults placed on jobs whose containers became ready within the last minute
    new_job_share: float
    #: evaluation seeds of the default regime (drawn at run time), and of the held-out regime
    seeds: int
    heldout_seeds: int
    #: the slow-ramp scenario: ramps, its cluster's hosts, its length in 30-min blocks, the
    #: ramp's length and final magnitude
    ramps: int
    ramp_hosts: int
    ramp_blocks: int
    ramp_s: float
    ramp_extra_ns: float
    #: faults per type in the oracle localization suite (and whether to add both-layer pairs)
    loc_trials: int
    loc_both_layers: bool
    #: seconds of counters (TX and RX at ``field.COUNTER_HZ``) the skeleton is inferred from
    skeleton_s: int
    #: RNIC counts of the probing-cost table
    sweep_rnics: tuple[int, ...]
    #: seconds the real agent process probes at the skeleton's rate (0: skip)
    agent_s: float
    #: the fault types injected (None: every type the simulator models)
    types: tuple[FailureType, ...] | None = None
    #: seconds between two probes of one skeleton pair (the agent's default)
    probe_interval_s: float = 0.1

    @property
    def rnics(self) -> int:
        return self.hosts * 8

    @property
    def scaled_down(self) -> bool:
        return self.hosts < 4096


#: CI's profile; the others are named by what they change in it
QUICK = Profile(
    "quick",
    hosts=384,
    jobs=190,
    arrivals_per_min=1.5,
    duration_s=3600.0,
    warmup_s=360.0,
    fault_s=60.0,
    faults_per_h=60.0,
    gray_per_h=16.0,
    new_job_share=0.15,
    seeds=2,
    heldout_seeds=0,
    ramps=6,
    ramp_hosts=48,
    ramp_blocks=3,
    ramp_s=1800.0,
    ramp_extra_ns=8_000.0,
    loc_trials=1,
    loc_both_layers=False,
    skeleton_s=240,
    sweep_rnics=(512, 1024, 2048),
    agent_s=3.0,
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        # one fault type per symptom class: a smoke and determinism profile, not an evaluation
        replace(
            QUICK,
            name="tiny",
            hosts=64,
            jobs=10,
            arrivals_per_min=0.5,
            duration_s=900.0,
            warmup_s=330.0,
            fault_s=40.0,
            faults_per_h=40.0,
            gray_per_h=8.0,
            new_job_share=0.0,
            seeds=1,
            ramps=1,
            ramp_hosts=16,
            ramp_blocks=2,
            sweep_rnics=(512,),
            agent_s=0.0,
            types=(
                FailureType.CRC_ERROR,
                FailureType.RNIC_PORT_DOWN,
                FailureType.PCIE_NIC_ERROR,
                FailureType.CONTAINER_CRASH,
            ),
        ),
        QUICK,
        # the paper's scale, five seeds and one held-out seed of field-heavy
        replace(
            QUICK,
            name="full",
            hosts=4096,
            duration_s=1800.0,
            jobs=2000,
            arrivals_per_min=4.0,
            faults_per_h=90.0,
            gray_per_h=30.0,
            seeds=5,
            heldout_seeds=1,
            ramps=12,
            ramp_hosts=96,
            ramp_s=2700.0,
            loc_trials=3,
            loc_both_layers=True,
            agent_s=20.0,
        ),
    )
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"The 'profile' parameter must be one of {sorted(PROFILES)}. Got {name!r} instead."
        ) from None
