"""The pipeline's settings: :class:`PipelineConfig`, checked once where it is read."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from skh.analysis.detect import DetectorConfig
from skh.analysis.fastpath import FastPathConfig
from skh.analysis.health import HealthConfig
from skh.analysis.linkstate import LinkStateConfig
from skh.analysis.longterm import LongTermConfig
from skh.analysis.skeleton import SkeletonParams
from skh.errors import ConfigError
from skh.model import Fabric
from skh.orchestrator.config import AnalyzerConfig

__all__ = ["PipelineConfig", "detector_config"]


def _sub(cls: type, where: str, data: Any) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"The '{where}' setting of the pipeline must be a table. Got {data!r} instead."
        )
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown setting(s) in pipeline '{where}': {', '.join(unknown)}")
    return cls(**data)


def detector_config(data: Mapping[str, Any] | None) -> DetectorConfig:
    """A :class:`DetectorConfig` from a plain mapping (nested ``fast``/``longterm``/``health``/
    ``link``)."""
    data = dict(data or {})
    nested = {
        "fast": _sub(FastPathConfig, "detector.fast", data.pop("fast", None)),
        "longterm": _sub(LongTermConfig, "detector.longterm", data.pop("longterm", None)),
        "health": _sub(HealthConfig, "detector.health", data.pop("health", None)),
        "link": _sub(LinkStateConfig, "detector.link", data.pop("link", None)),
    }
    return (
        _sub(DetectorConfig, "detector", {**data, **nested}) if data or nested else DetectorConfig()
    )


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """What the pipeline knows of the cluster beyond what the controller tells it.

    ``fabric`` is the :meth:`Fabric.to_mapping` form; ``addr_owner`` maps underlay addresses
    (what a traceroute hop answers from) to fabric node names; ``host_agents`` names each host's
    underlay agent (the one that runs traceroutes and dumps there; default ``ul-<host>``,
    the agent's default name and its identity's: ``security.underlay_identity``);
    ``vf_devices`` maps an endpoint name (``job/container/rail``) to the host-side device of
    its VF (representor).

    ``skh analyzer`` builds it with :meth:`from_analyzer` from its ``[analyzer]`` settings.
    """

    fabric: Mapping[str, Any]
    addr_owner: Mapping[str, str] = field(default_factory=dict)
    host_agents: Mapping[str, str] = field(default_factory=dict)
    vf_devices: Mapping[str, str] = field(default_factory=dict)
    controller: str = ""
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    skeleton: SkeletonParams = field(default_factory=SkeletonParams)
    skeleton_every_s: float = 10.0
    #: how long a job's traffic must stop fitting its skeleton before it is inferred again
    skeleton_change_s: float = 120.0
    history_s: float = 300.0
    resolve_after_s: float = 30.0
    #: how long a failure nothing explains is localized again (with what detection finds next)
    #: before it is published as "unexplained": the first round often holds only part of a
    #: fault's pairs (one direction, one agent's batch)
    unexplained_after_s: float = 3.0
    command_timeout_s: float = 10.0
    trace_max_ttl: int = 6
    trace_base_port: int = 33434
    #: traces are pinned to the probe flows' VXLAN outer 5-tuples, which host agents learn by
    #: watching the flows' frames leave: a trace crosses the spine the failing flow crosses (a
    #: fault on some ECMP paths only is placed, not guessed). Host agents watch all the time
    #: (``agent.learn_vxlan_port``), so a round finds the ports learned; this is how long a
    #: trace waits for a flow's frames only while its agent has watched less than that (just
    #: started, or watching on demand). 0: traces not pinned. (Waiting in every round, as host
    #: agents did before they learned ahead of it, made the demo's link-down alert 11.2 s late
    #: instead of 5.0 s, a slow RNIC's 22.5 s instead of 6.0 s: docs/probing.md.)
    trace_learn_s: float = 5.0
    rnic_dump_interval_s: float = 60.0
    max_exoneration_traces: int = 16
    #: the detector pools loss evidence over each ToR's endpoints and learns what pairs crossing
    #: a ToR's uplinks lose (a new job's pairs behind a lossy uplink expect that loss, not their
    #: RNICs' clean history: docs/detection.md). The sharded analyzer then places the jobs that
    #: share a ToR on one shard; off, jobs spread freely and those two tests are not run
    pool_over_tors: bool = True

    def __post_init__(self) -> None:
        for name in (
            "skeleton_every_s",
            "skeleton_change_s",
            "history_s",
            "resolve_after_s",
            "unexplained_after_s",
            "command_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"The '{name}' setting of the pipeline must be > 0."
                    f" Got {getattr(self, name)!r} instead."
                )
        if not 0 <= self.trace_learn_s <= 30:
            raise ConfigError(
                "The 'trace_learn_s' setting of the pipeline must be in [0, 30]."
                f" Got {self.trace_learn_s!r} instead."
            )
        if not isinstance(self.pool_over_tors, bool):
            raise ConfigError(
                "The 'pool_over_tors' setting of the pipeline must be true or false."
                f" Got {self.pool_over_tors!r} instead."
            )
        if not 1 <= self.trace_max_ttl <= 64:
            raise ConfigError(
                "The 'trace_max_ttl' setting of the pipeline must be in [1, 64]."
                f" Got {self.trace_max_ttl!r} instead."
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PipelineConfig:
        data = dict(data)
        if "fabric" not in data:
            raise ConfigError("the pipeline configuration needs 'fabric' (Fabric.to_mapping())")
        det = detector_config(data.pop("detector", None))
        skel = _sub(SkeletonParams, "skeleton", data.pop("skeleton", None))
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown pipeline setting(s): {', '.join(unknown)}")
        return cls(detector=det, skeleton=skel, **data)

    @classmethod
    def from_analyzer(cls, a: AnalyzerConfig) -> PipelineConfig:
        """The pipeline ``skh analyzer`` runs: the settings file ``a.pipeline`` (JSON or TOML; it
        may hold the fabric as a ``fabric`` table instead of ``a.fabric``), the fabric file
        ``a.fabric`` and the controller ``a.controller``."""
        data = _read_settings(a.pipeline) if a.pipeline else {}
        if "controller" in data:
            raise ConfigError(
                f"the pipeline settings file {a.pipeline} sets 'controller':"
                " set analyzer.controller instead"
            )
        if a.fabric:
            if "fabric" in data:
                raise ConfigError(f"the fabric is given twice: analyzer.fabric and in {a.pipeline}")
            data["fabric"] = Fabric.from_toml(a.fabric).to_mapping()
        if "fabric" not in data:
            raise ConfigError(
                "the analyzer's pipeline needs a fabric: set analyzer.fabric (--fabric FILE), "
                "or run detection only (analyzer.detector = 'detect')"
            )
        if not a.controller:
            raise ConfigError(
                "the analyzer's pipeline needs the controller's address (analyzer.controller)"
            )
        return cls.from_mapping({**data, "controller": a.controller})


def _read_settings(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
        data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"cannot read the pipeline settings {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"the pipeline settings {path} must be a table. Got {type(data).__name__} instead."
        )
    return data
