"""The analyzer sharded over a Ray cluster (``skh analyzer --ray ADDRESS``).

The single process (:class:`skh.orchestrator.pipeline.Pipeline`) stays the default; this
package runs the same pipeline with its detection half on Ray actors:

* :mod:`.placement` — which shard holds which endpoints (jobs, or rails of big jobs);
* :mod:`.merge` — the shards' events of one round as the single detector tells them;
* :mod:`.actors` — detection shards and the localizer;
* :mod:`.ingest` — ingest front-ends: agents' batches routed by shard off the coordinator;
* :mod:`.pipeline` — :class:`ShardedPipeline`, the coordinator: routing, merging, recovery;
* :mod:`.runtime` — joining (or starting) the Ray cluster;
* :mod:`.daemon` — the hook ``skh analyzer --ray`` runs.

Importing it needs Ray (the ``ray`` extra); ``docs/capacity.md`` sizes a deployment.
"""

from skh.orchestrator.shard.pipeline import ShardedPipeline, ShardOptions
from skh.orchestrator.shard.placement import Placement
from skh.orchestrator.shard.runtime import connect

__all__ = ["ShardedPipeline", "ShardOptions", "Placement", "connect"]
