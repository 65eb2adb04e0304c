"""``skh analyzer --ray ADDRESS``: the daemon's round hook with the sharded pipeline behind it."""

from __future__ import annotations

import functools
from typing import Any

from skh.model import Cluster
from skh.orchestrator.config import AnalyzerConfig
from skh.orchestrator.pipeline.config import PipelineConfig
from skh.orchestrator.pipeline.hook import PipelineHook
from skh.orchestrator.pipeline.state_source import AgentStateSource
from skh.orchestrator.security import SecurityConfig
from skh.orchestrator.shard.pipeline import ShardedPipeline, ShardOptions
from skh.orchestrator.shard.runtime import connect

__all__ = ["AgentSources", "sharded_hook"]


class AgentSources:
    """Localization's state sources on the localizer actor: host agents through the controller's
    relay, with the actor's own controller client (made there on first use; only the address
    and the security settings travel)."""

    def __init__(self, cfg: PipelineConfig, security: SecurityConfig) -> None:
        self.cfg, self.security = cfg, security
        self._client: Any = None

    def __getstate__(self) -> tuple[PipelineConfig, SecurityConfig]:
        return self.cfg, self.security

    def __setstate__(self, state: tuple[PipelineConfig, SecurityConfig]) -> None:
        self.cfg, self.security = state
        self._client = None

    def __call__(self, cluster: Cluster) -> AgentStateSource:
        if self._client is None:
            from skh.orchestrator.admin import ControllerClient

            self._client = ControllerClient(
                self.cfg.controller, self.security, retries=0, name="analyzer"
            )
        return AgentStateSource(self._client, cluster, self.cfg)


def sharded_hook(a: AnalyzerConfig, pcfg: PipelineConfig, security: SecurityConfig) -> PipelineHook:
    """The pipeline hook of ``skh analyzer`` with ``analyzer.ray`` set: joins the Ray cluster and
    runs :class:`ShardedPipeline` (shards, localizer and ingest front-ends as actors; the
    front-ends authorize batches as the analyzer does, from the controller's key bindings)."""
    binds = tuple(b.strip() for b in a.ray_ingest.split(",") if b.strip())
    connect(a.ray, min_cpus=a.ray_shards + len(binds) + 1)
    opts = ShardOptions(
        shards=a.ray_shards, checkpoint_rounds=a.ray_checkpoint_rounds, ingest_binds=binds
    )
    make = functools.partial(
        ShardedPipeline,
        options=opts,
        sources=AgentSources(pcfg, security),
        security=security,
        ingest={
            "controller": pcfg.controller,
            "max_round_records": a.max_round_records,
            "max_sender_records": a.max_sender_records,
        },
        max_frame_bytes=a.max_frame_bytes,
    )
    return PipelineHook(pcfg, security, make_pipeline=make)
