import numpy as np
import pytest

from skh.model import Cluster, Fabric, JobShape
from skh.sim.jobs import HostPool, make_job
from skh.sim.scenario import Simulation


@pytest.fixture
def small_sim() -> Simulation:
    """32 hosts in 4 segments under 2 spines; a 16-host PP=2 job and an 8-host DP job, all ready
    at t = 0, probing their skeletons."""
    fabric = Fabric.from_params(hosts=32, hosts_per_segment=8, spines=2)
    cluster = Cluster(fabric)
    pool = HostPool(cluster)
    a = make_job(cluster, "a", JobShape(8, 2, 8), pool=pool, ready_delay_s=np.zeros(16), seed=1)
    b = make_job(cluster, "b", JobShape(8, 1, 8), pool=pool, ready_delay_s=np.zeros(8), seed=2)
    return Simulation(cluster, [a, b], seed=7)
