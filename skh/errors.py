"""The one exception tree of skh.

Every class also inherits the builtin it means, so callers that know nothing of skh
can still catch ``ValueError`` or ``OSError``::

    SkhError
    ├── ConfigError(SkhError, ValueError)        bad configuration or arguments
    │   └── InvalidProbeSpec                     a probe target or engine option out of range
    ├── ProtocolError(SkhError, ValueError)      a malformed, oversized or unknown message
    ├── CapabilityError(SkhError, OSError)       the machine lacks what was asked (verbs, hw stamps)
    ├── EngineError(SkhError, OSError)           the C engine failed (carries errno)
    ├── TopologyError(SkhError, ValueError)      an inconsistent fabric or cluster model
    ├── TestbedError(SkhError, RuntimeError)     the namespace testbed could not be built or
    │                                            torn down
    ├── RequestTimeout(SkhError, TimeoutError)   a daemon did not answer a request in time
    ├── RequestRefused(SkhError, RuntimeError)   a daemon answered a request with a refusal
    └── Unauthorized(SkhError, PermissionError)  a request its sender may not make
"""

from __future__ import annotations

__all__ = [
    "SkhError",
    "ConfigError",
    "InvalidProbeSpec",
    "ProtocolError",
    "CapabilityError",
    "EngineError",
    "TopologyError",
    "TestbedError",
    "RequestTimeout",
    "RequestRefused",
    "Unauthorized",
]


class SkhError(Exception):
    """Root of every error skh raises on purpose."""


class ConfigError(SkhError, ValueError):
    """A configuration value or argument is invalid."""


class InvalidProbeSpec(ConfigError):
    """A probe target or engine option is out of range."""


class ProtocolError(SkhError, ValueError):
    """A wire message is malformed, oversized, of an unknown version or type."""


class CapabilityError(SkhError, OSError):
    """The machine lacks a capability that was explicitly asked for."""


class EngineError(SkhError, OSError):
    """The probing engine failed; ``errno`` says why."""


class TopologyError(SkhError, ValueError):
    """The fabric or cluster model is inconsistent."""


class TestbedError(SkhError, RuntimeError):
    """The namespace testbed could not be built, changed or torn down."""

    __test__ = False  # not a pytest test class despite the name


class RequestTimeout(SkhError, TimeoutError):
    """A daemon (the controller, the analyzer) did not answer a request within its timeout."""


class RequestRefused(SkhError, RuntimeError):
    """A daemon answered a request with a refusal (an unknown job, a stale skeleton)."""


class Unauthorized(SkhError, PermissionError):
    """A daemon's policy refuses a request to its sender (:mod:`skh.orchestrator.authz`)."""
