"""Joining a Ray cluster for the sharded analyzer."""

from __future__ import annotations

import logging
import os

from skh.errors import ConfigError

__all__ = ["connect"]

log = logging.getLogger(__name__)


def connect(address: str, *, min_cpus: int = 0) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine is part of; ``ray://
    HOST:PORT``: through Ray Client), or start a local one (``local``) declaring at least
    ``min_cpus`` CPUs, so that every actor of a small machine finds a place (they share cores)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "the sharded analyzer needs Ray: install skh with its 'ray' extra "
            "(pip install 'skh[ray]'; make develop does)"
        ) from exc
    if ray.is_initialized():
        return
    kw = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    if address == "local":
        ray.init(num_cpus=max(os.cpu_count() or 1, min_cpus), **kw)
    else:
        ray.init(address=address, **kw)
    log.info("joined Ray at %s: %s", address, ray.cluster_resources())
