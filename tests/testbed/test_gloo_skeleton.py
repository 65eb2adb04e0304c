"""Skeleton inference on a real training framework's traffic: PyTorch's gloo backend running a
pipeline (PP 2) × data parallel (DP 4) job across the namespace testbed, two rails per
container, counters read from the hosts' VF representors at 10 Hz."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from skh.analysis.skeleton import infer_skeleton, pairs_coverage
from skh.model import JobShape
from skh.testbed import JobSpec, Testbed, TestbedSpec
from skh.testbed.gloo_job import SYSTEM_PYTHON, run_gloo_job

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.slow]

#: 8 hosts in 2 segments × 2 rails, one container each: the job's 8 ranks
SPEC = TestbedSpec(
    hosts=8,
    rnics_per_host=2,
    hosts_per_segment=4,
    spines=2,
    containers_per_host=1,
    jobs=(JobSpec("llm", JobShape(tp=2, pp=2, dp=4)),),
)


@pytest.mark.timeout(420)
def test_gloo_job_skeleton_with_ranks_shuffled_against_pods(tbh):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    check = "import torch.distributed as d; print(d.is_gloo_available())"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", check], capture_output=True, text=True)
    assert probe.stdout.strip() == "True", (
        "PyTorch with gloo is missing from the system python: run tools/setup-debian.sh "
        f"(python3-torch). {probe.stderr[-300:]}"
    )
    tb = Testbed(SPEC, prefix=tbh.PREFIX)
    try:
        tb.up()
        names = [c.name for c in tb.cluster().jobs["llm"].containers]
        # the launcher numbered ranks by rendezvous order: no stage is a block of pod ordinals
        order = [5, 0, 6, 3, 1, 7, 2, 4]
        ranks = dict(zip(names, order, strict=True))
        run = run_gloo_job(tb, "llm", duration_s=100.0, ranks=ranks)
    finally:
        tb.down()
    tbh.assert_clean()
    assert run.iterations >= 20, run.iterations
    x = run.tx_bytes + run.rx_bytes
    truth = run.used_pairs
    dp_pairs = 2 * 2 * 4 * 3  # 2 rails × 2 stages × every ordered pair of 4 replicas
    assert truth.shape[0] == dp_pairs + 2 * 4 * 2  # plus 4 partners a rail, both ways

    def infer(hint):
        return infer_skeleton(
            run.ep_id, run.host, run.rail, x, tx_bytes=run.tx_bytes, sample_hz=run.sample_hz,
            container=hint, job="llm",
        )  # fmt: skip

    # the monitor knows pod ordinals, which are not the ranks: the hint is dropped
    by_pod = infer(run.pod)
    assert by_pod.confident and by_pod.n_stages == 2, by_pod.reason
    assert pairs_coverage(truth, by_pod.pairs) == 1.0, by_pod.reason
    assert by_pod.hint == "contradicted", by_pod.reason
    assert by_pod.pairs.shape[0] <= 1.5 * truth.shape[0], by_pod.reason
    # the same job had its pods been numbered by rank: the hint is confirmed
    by_rank = infer(run.rank)
    assert pairs_coverage(truth, by_rank.pairs) == 1.0, by_rank.reason
    assert by_rank.hint in ("confirmed", "partly confirmed"), by_rank.reason
    assert by_rank.pairs.shape[0] <= 1.25 * truth.shape[0], by_rank.reason
    # stages are the true ones: one group per (stage, rail)
    stage_of = run.rank // 4
    for s in range(2):
        for r in range(2):
            members = (stage_of == s) & (run.rail == r)
            assert np.unique(by_pod.group[members]).size == 1
    # no hint at all: the traffic alone keeps every used pair
    alone = infer(None)
    assert pairs_coverage(truth, alone.pairs) == 1.0, alone.reason
