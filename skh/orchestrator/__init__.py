"""The orchestration layer: controller, agents, analyzer daemon and alert bus over ZeroMQ
(wire format in :mod:`skh.wire`)."""
