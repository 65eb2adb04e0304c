"""The evaluation's profiles: how big the simulated cluster is, how long it runs, how many faults.

``full`` is the paper's setting (the real Lingjun topology replicated to 4,096 hosts × 8 RNICs,
2,000 jobs, hours of virtual time, every fault type several times); ``quick`` scales the cluster
down so CI finishes in minutes on two cores (the output says so); ``tiny`` exists for the
determinism test.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    #: every fault type is injected this many times, one fault at a time
    rounds: int
    fault_s: float
    gap_s: float
    #: healthy virtual time before the first fault (detection needs its look-back)
    warmup_s: float
    #: faults per type in the localization suite (and whether to add both-layer pairs)
    loc_trials: int
    loc_both_layers: bool
    #: seconds of 1 Hz throughput the skeleton is inferred from
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


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        # one fault type per symptom class: a smoke and determinism profile, not an evaluation
        Profile(
            "tiny",
            64,
            10,
            0.5,
            1,
            40.0,
            30.0,
            240.0,
            1,
            False,
            240,
            (512,),
            0.0,
            (
                FailureType.CRC_ERROR,
                FailureType.RNIC_PORT_DOWN,
                FailureType.PCIE_NIC_ERROR,
                FailureType.CONTAINER_CRASH,
            ),
        ),
        Profile(
            "quick", 512, 250, 2.0, 1, 45.0, 35.0, 330.0, 2, False, 240, (512, 1024, 2048), 3.0
        ),
        Profile(
            "full", 4096, 2000, 4.0, 3, 60.0, 45.0, 330.0, 5, True, 240, (512, 1024, 2048), 10.0
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
